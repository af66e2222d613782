#!/bin/sh
# portable/pgtle.sh VERSION BODY OUT: the pg_tle installer of the portable
# edition (build.sh calls it), one psql script:
#
#     psql -v ON_ERROR_STOP=1 -f idempotency-pgtle.sql
#
# run in the application's database by a role holding pgtle_admin (no
# superuser needed), after someone who may (on RDS the master user) ran
# CREATE EXTENSION pg_tle there. In one transaction it:
#   - installs idempotency VERSION in pg_tle (pgtle.install_extension, the
#     body BODY as its install script) when pg_tle holds no idempotency;
#   - when pg_tle holds older versions: installs VERSION beside them
#     (pgtle.install_extension_version_sql), an update path from each older
#     version to VERSION (pgtle.install_update_path; the body is the update
#     script: it only creates what is missing and replaces functions) and
#     makes VERSION the default (pgtle.set_default_version);
#   - refuses (nothing changed) when pg_tle holds a newer version, or holds
#     VERSION or one of its update paths with another body than BODY (an
#     installer of the same version built from other sources), or when the
#     server has the C edition (pg_tle refuses a name an extension control
#     file on the server has; the C edition is then created directly);
#   - run again, changes nothing.
# Then the database owner (no superuser needed: pg_tle's extensions are
# never superuser-only) runs CREATE EXTENSION idempotency, or ALTER EXTENSION
# idempotency UPDATE over an older one.
#
# pg_tle keeps each script as the body of a function in schema pgtle, quoted
# with $_pgtle_o_$ and $_pgtle_i_$: install_extension refuses a script that
# holds either string. pg_tle runs the script through SPI, not psql: it must
# hold no psql command (a line starting with a backslash). Both are checked
# here, at build time. The body is put into the installer as a dollar-quoted
# string whose tag the body does not contain.
set -eu

[ $# -eq 3 ] || { echo "usage: portable/pgtle.sh VERSION BODY OUT" >&2; exit 2; }
version=$1 body=$2 out=$3
here=$(cd "$(dirname "$0")" && pwd)
[ -f "$body" ] || { echo "portable/pgtle.sh: no body $body" >&2; exit 1; }
case $version in
    *[!0-9.]*|'') echo "portable/pgtle.sh: version '$version' is not of the form 0.5" >&2; exit 1 ;;
esac

# shellcheck disable=SC2016 # the strings themselves
for s in '$_pgtle_o_$' '$_pgtle_i_$'; do
    if grep -qF "$s" "$body"; then
        echo "portable/pgtle.sh: $body holds $s, which pg_tle's install_extension refuses" >&2
        exit 1
    fi
done
# shellcheck disable=SC1003 # a backslash at the start of a line
if grep -n '^[[:space:]]*\\' "$body" >&2; then
    echo "portable/pgtle.sh: $body holds psql commands (above); pg_tle runs the script without psql" >&2
    exit 1
fi

# tag TAG: TAG, lengthened until $TAG$ is not in the body
tag() {
    t=$1
    while grep -qF "\$$t\$" "$body"; do t=${t}_; done
    echo "$t"
}
btag=$(tag idempotency_pgtle_body)
dtag=$(tag idempotency_pgtle_install)
[ "$btag" != "$dtag" ] || { echo "portable/pgtle.sh: no tags" >&2; exit 1; }

# the description: the control file's comment, as a literal
comment=$(sed -n "s/^comment[[:space:]]*=[[:space:]]*'\(.*\)'/\1/p" "$here/../idempotency.control" 2>/dev/null || true)
[ -n "$comment" ] || comment='exactly-once effects for at-least-once queues'
comment="$comment (portable edition)"
comment=$(printf '%s' "$comment" | sed "s/'/''/g")

{
    cat <<EOF
/*
 * idempotency $version, portable edition: the pg_tle installer (made by
 * portable/build.sh; see portable/README.md). Run in the application's
 * database by a role holding pgtle_admin, after CREATE EXTENSION pg_tle:
 *     psql -v ON_ERROR_STOP=1 -f idempotency-pgtle.sql
 * It installs version $version in pg_tle, with the update path from every
 * older version pg_tle holds; run again, it changes nothing. Then the
 * database owner runs CREATE EXTENSION idempotency (or, over an older
 * version, ALTER EXTENSION idempotency UPDATE).
 */
\\set ON_ERROR_STOP on
-- its errors without the CONTEXT line of the DO block below
\\set SHOW_CONTEXT never
BEGIN;
-- two installers at once take turns
SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext('idempotency pg_tle install')) AS locked \\gset
DO \$$dtag\$
DECLARE
    want constant pg_catalog.text := '$version';
    descr constant pg_catalog.text := '$comment';
    body constant pg_catalog.text := \$$btag\$
EOF
    cat "$body"
    cat <<EOF
\$$btag\$;
    held pg_catalog.text[];
    dflt pg_catalog.text;
    v pg_catalog.text;
    fn pg_catalog.text;
    stored pg_catalog.text;
    done_ pg_catalog.text[] := '{}';
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname OPERATOR(pg_catalog.=) 'pg_tle') THEN
        RAISE EXCEPTION 'pg_tle is not created in database %', pg_catalog.current_database()
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'A superuser (on RDS and Aurora the master user) runs CREATE EXTENSION pg_tle; and GRANT pgtle_admin TO the role that runs this script; the server needs shared_preload_libraries = ''pg_tle''.';
    END IF;
    IF EXISTS (SELECT FROM pg_catalog.pg_available_extensions WHERE name OPERATOR(pg_catalog.=) 'idempotency') THEN
        RAISE EXCEPTION 'this server has the idempotency extension installed (the C edition): pg_tle cannot install an extension of the same name'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Use the C edition: CREATE EXTENSION idempotency; or ALTER EXTENSION idempotency UPDATE;';
    END IF;
    IF NOT pg_catalog.pg_has_role('pgtle_admin', 'USAGE') THEN
        RAISE EXCEPTION 'role % may not install pg_tle extensions', current_user
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Run this script as a role granted pgtle_admin: GRANT pgtle_admin TO ' || pg_catalog.quote_ident(current_user) || ';';
    END IF;

    SELECT pg_catalog.array_agg(e.version ORDER BY pg_catalog.string_to_array(e.version, '.')::pg_catalog.int4[])
    INTO held
    FROM pgtle.available_extension_versions() e WHERE e.name OPERATOR(pg_catalog.=) 'idempotency';

    IF held IS NULL THEN
        PERFORM pgtle.install_extension('idempotency', want, descr, body, '{}'::pg_catalog.text[]);
        RAISE NOTICE 'idempotency % installed in pg_tle', want;
        RAISE NOTICE 'next, as the database owner: CREATE EXTENSION idempotency;';
        RETURN;
    END IF;

    -- a newer version: refused before anything changes
    FOREACH v IN ARRAY held LOOP
        IF pg_catalog.string_to_array(v, '.')::pg_catalog.int4[]
           OPERATOR(pg_catalog.>) pg_catalog.string_to_array(want, '.')::pg_catalog.int4[] THEN
            RAISE EXCEPTION 'pg_tle holds idempotency %, newer than this installer''s %', v, want
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      DETAIL = 'Nothing changed.',
                      HINT = 'Run the installer of version ' || v || ' or newer.';
        END IF;
    END LOOP;

    -- VERSION itself: installed beside the older ones, or the same body
    fn := 'idempotency--' || want || '.sql';
    IF want OPERATOR(pg_catalog.=) ANY (held) THEN
        EXECUTE pg_catalog.format('SELECT pgtle.%I()', fn) INTO stored;
        IF stored IS DISTINCT FROM body THEN
            RAISE EXCEPTION 'pg_tle holds an idempotency % whose script differs from this installer''s', want
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      DETAIL = 'Nothing changed. Two builds of one version differ: one was not made from the released sources.',
                      HINT = 'To replace it (no database may have it created): SELECT pgtle.uninstall_extension(''idempotency'', ''' || want || ''');';
        END IF;
    ELSE
        PERFORM pgtle.install_extension_version_sql('idempotency', want, body);
        done_ := done_ || ('version ' || want);
    END IF;

    -- the update path from each older version: the body is the update script
    FOREACH v IN ARRAY held LOOP
        CONTINUE WHEN v OPERATOR(pg_catalog.=) want;
        fn := 'idempotency--' || v || '--' || want || '.sql';
        IF pg_catalog.to_regprocedure(pg_catalog.format('pgtle.%I()', fn)) IS NULL THEN
            PERFORM pgtle.install_update_path('idempotency', v, want, body);
            done_ := done_ || ('update path ' || v || ' -> ' || want);
        ELSE
            EXECUTE pg_catalog.format('SELECT pgtle.%I()', fn) INTO stored;
            IF stored IS DISTINCT FROM body THEN
                RAISE EXCEPTION 'pg_tle holds an update path of idempotency from % to % whose script differs from this installer''s', v, want
                    USING ERRCODE = 'object_not_in_prerequisite_state',
                          DETAIL = 'Nothing changed.',
                          HINT = 'To replace it: SELECT pgtle.uninstall_update_path(''idempotency'', ''' || v || ''', ''' || want || ''');';
            END IF;
        END IF;
    END LOOP;

    SELECT e.default_version INTO dflt FROM pgtle.available_extensions() e
    WHERE e.name OPERATOR(pg_catalog.=) 'idempotency';
    IF dflt IS DISTINCT FROM want THEN
        PERFORM pgtle.set_default_version('idempotency', want);
        done_ := done_ || ('default version ' || want);
    END IF;

    IF pg_catalog.cardinality(done_) OPERATOR(pg_catalog.=) 0 THEN
        RAISE NOTICE 'idempotency % is already installed in pg_tle: nothing changed', want;
    ELSE
        RAISE NOTICE 'pg_tle: idempotency %', pg_catalog.array_to_string(done_, ', ');
        RAISE NOTICE 'next, as the database owner: CREATE EXTENSION idempotency; (or, where an older version is created: ALTER EXTENSION idempotency UPDATE;)';
    END IF;
END
\$$dtag\$;
COMMIT;
EOF
} > "$out.tmp"
mv "$out.tmp" "$out"
