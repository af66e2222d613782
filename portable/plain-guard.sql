/*
 * portable/plain-guard.sql: the plain script's first statements (build.sh
 * puts them after BEGIN). Two runs at once take turns; the script refuses a
 * database where the C extension or a pg_tle install is (ALTER EXTENSION
 * updates those) and one whose portable install is newer than itself.
 */
DO $guard$
DECLARE
    installed pg_catalog.text;
BEGIN
    PERFORM pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext('idempotency portable install'));
    SELECT e.extversion INTO installed FROM pg_catalog.pg_extension e
    WHERE e.extname OPERATOR(pg_catalog.=) 'idempotency';
    IF FOUND THEN
        RAISE EXCEPTION 'the idempotency extension % is installed in this database', installed
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = 'This plain script installs the portable edition where no extension can be created.',
                  HINT = 'Update the extension instead: ALTER EXTENSION idempotency UPDATE;';
    END IF;
    IF pg_catalog.to_regprocedure('idempotency.edition()') IS NOT NULL THEN
        SELECT e.version INTO installed FROM idempotency.edition() e;
        IF pg_catalog.string_to_array(installed, '.')::pg_catalog.int4[]
           OPERATOR(pg_catalog.>) pg_catalog.string_to_array('@VERSION@', '.')::pg_catalog.int4[] THEN
            RAISE EXCEPTION 'idempotency % is installed in this database; this script is the older %', installed, '@VERSION@'
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      DETAIL = 'Nothing changed.',
                      HINT = 'Run the script of version ' || installed || ' or newer.';
        END IF;
    END IF;
END
$guard$;
