/*
 * portable/grants.sql: nothing is granted to PUBLIC, not even USAGE on the
 * schema (README "Roles and grants"), as in the C edition. Every function
 * and procedure of the schema loses PUBLIC's default EXECUTE, the internal
 * ones too (only the extension's SECURITY DEFINER functions call those).
 * Grants made to other roles stay: a plain-script upgrade runs this again.
 */
REVOKE ALL ON SCHEMA idempotency FROM PUBLIC;

DO $grants$
DECLARE
    f   pg_catalog.regprocedure;
    k   "char";
BEGIN
    FOR f, k IN SELECT p.oid::pg_catalog.regprocedure, p.prokind FROM pg_catalog.pg_proc p
                WHERE p.pronamespace OPERATOR(pg_catalog.=) 'idempotency'::pg_catalog.regnamespace LOOP
        EXECUTE pg_catalog.format('REVOKE ALL ON %s %s FROM PUBLIC',
                                  CASE WHEN k OPERATOR(pg_catalog.=) 'p' THEN 'PROCEDURE' ELSE 'FUNCTION' END, f);
    END LOOP;
END
$grants$;
