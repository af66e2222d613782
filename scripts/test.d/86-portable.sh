#!/usr/bin/env bash
# The portable edition (portable/: SQL and PL/pgSQL only, for managed
# PostgreSQL), tested as RDS, Aurora and Supabase run it, through pg_tle,
# and as Cloud SQL, Azure and Neon run it, as a plain psql script:
# test/portable/run.sh (see its header). pg_tle 1.5.2 is built from the
# vendored tarball (scripts/pgtle, cached under /var/cache/idempotency/pgtle:
# about 10 s cold, under 1 s cached) and loaded into a cluster of its own,
# run from a private installation view of this PostgreSQL that shows pg_tle
# and not the C edition this run installed. On it: the installers (the pg_tle
# one: a fresh install, run again, an update from an older version, a newer
# one refused; the plain script: twice on a fresh database, and over
# records), then the regress suite (sql/, expected/ unchanged) and the
# isolation specs against the portable edition, but what test/portable/skip
# names. Does not use the hooks' cluster. About 10 s.
# pg_tle 1.5.2 stops at PostgreSQL 17: on 18 this says so and passes. As
# another user than root, it runs when pg_tle can be built without apt into
# a writable PGTLE_CACHE, or is cached already; else it says so and passes.
set -euo pipefail

srcdir=${TEST_SRCDIR:-$(pwd)}
# shellcheck source=scripts/versions.sh
source "$srcdir/scripts/versions.sh"
versions_resolve
case $PG_MAJOR in
    12|13|14|15|16|17) ;;
    *) echo "86-portable: NOT RUN: pg_tle 1.5.2 supports PostgreSQL 12-17, not $PG_MAJOR"; exit 0 ;;
esac
vendor=${PGTLE_VENDOR:-$(cd "$srcdir/.." 2>/dev/null && pwd)/shared/vendor}
if ! "$srcdir/scripts/pgtle" check >/dev/null 2>&1; then
    if [[ ! -f $vendor/pg_tle-1.5.2.tar.gz ]]; then
        echo "86-portable: NOT RUN: pg_tle is not cached and its vendored source ($vendor/pg_tle-1.5.2.tar.gz) is missing (set PGTLE_VENDOR)"
        exit 0
    fi
    if ((EUID != 0)) && ! { mkdir -p "${PGTLE_CACHE:-/var/cache/idempotency/pgtle}" && test -w "${PGTLE_CACHE:-/var/cache/idempotency/pgtle}"; } 2>/dev/null; then
        echo "86-portable: skipped (building pg_tle into ${PGTLE_CACHE:-/var/cache/idempotency/pgtle} needs root, or set PGTLE_CACHE)"
        exit 0
    fi
    export PGTLE_VENDOR=$vendor
fi
exec "$srcdir/test/portable/run.sh"
