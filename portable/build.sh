#!/bin/sh
# portable/build.sh [OUTDIR]: the portable edition's files, made from
# portable/*.sql with nothing but sh, sed and cat (a user's machine has no
# compiler; make portable runs this).
#
#   OUTDIR/idempotency--VERSION.sql  the body: every file of FILES below in
#                                    order, @VERSION@ replaced. pg_tle's
#                                    install script and, from every earlier
#                                    portable version, its update script: the
#                                    body only creates what is missing and
#                                    replaces functions, so running it over
#                                    an older install is the upgrade.
#   OUTDIR/idempotency-portable.sql  the plain script for psql -f (managed
#                                    services without pg_tle): the body in
#                                    one transaction, after a guard that
#                                    refuses the C extension's database and
#                                    a newer install.
#   OUTDIR/idempotency-pgtle.sql     the pg_tle installer for psql -f, run by
#                                    a role holding pgtle_admin
#                                    (portable/pgtle.sh writes it).
#
# OUTDIR defaults to portable/build. VERSION is idempotency.control's
# default_version: both editions carry one version.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/build}
mkdir -p "$out"
version=$(sed -n "s/^default_version[[:space:]]*=[[:space:]]*'\(.*\)'/\1/p" "$here/../idempotency.control")
[ -n "$version" ] || { echo "portable/build.sh: no default_version in idempotency.control" >&2; exit 1; }

# the order matters: types and tables before the functions that use them
FILES="schema.sql common.sql claim.sql complete.sql admin.sql edition.sql grants.sql"

body=$out/idempotency--$version.sql
{
    printf '%s\n' "/* idempotency $version, portable edition (SQL and PL/pgSQL): made by portable/build.sh from the .sql files of portable/; edit those */"
    for f in $FILES; do
        printf '\n/* ---- portable/%s ---- */\n\n' "$f"
        sed "s/@VERSION@/$version/g" "$here/$f"
    done
} > "$body.tmp"
mv "$body.tmp" "$body"

plain=$out/idempotency-portable.sql
{
    printf '%s\n' "/*" \
        " * idempotency $version, portable edition, as a plain script:" \
        " *     psql -v ON_ERROR_STOP=1 -f idempotency-portable.sql" \
        " * run by the database's owner (no superuser needed). One transaction:" \
        " * a fresh install, or the upgrade of an older portable install in place" \
        " * (every record, job type and audit row kept); run again, it changes" \
        " * nothing. Made by portable/build.sh; see portable/README.md." \
        " * Plain SQL, no psql meta-command: a migration tool can run it as it is." \
        " */" \
        'BEGIN;' \
        'SET LOCAL client_min_messages = warning;'
    sed "s/@VERSION@/$version/g" "$here/plain-guard.sql"
    sed 1d "$body"
    printf '%s\n' 'COMMIT;'
} > "$plain.tmp"
mv "$plain.tmp" "$plain"

if [ -f "$here/pgtle.sh" ]; then
    sh "$here/pgtle.sh" "$version" "$body" "$out/idempotency-pgtle.sql"
fi
echo "portable/build.sh: $body, $plain${version:+ (version $version)}"
