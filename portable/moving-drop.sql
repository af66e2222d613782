/*
 * portable/moving-drop.sql: the last step of to-c.sql: drop the old
 * edition's objects, now in schema idempotency_moving, one by one and
 * without CASCADE. An object of the application that depends on one of
 * them (a view over the records, a column of one of the types) stops the
 * drop with PostgreSQL's own list (2BP01), and the whole move is undone.
 */
DROP VIEW idempotency_moving.job_type_stats;
DROP TABLE idempotency_moving.operations, idempotency_moving.resolutions, idempotency_moving.job_types;
DO $drop$
DECLARE
    f   pg_catalog.regprocedure;
    k   "char";
BEGIN
    FOR f, k IN SELECT p.oid::pg_catalog.regprocedure, p.prokind FROM pg_catalog.pg_proc p
                WHERE p.pronamespace OPERATOR(pg_catalog.=) 'idempotency_moving'::pg_catalog.regnamespace LOOP
        EXECUTE pg_catalog.format('DROP %s %s', CASE WHEN k OPERATOR(pg_catalog.=) 'p' THEN 'PROCEDURE' ELSE 'FUNCTION' END, f);
    END LOOP;
END
$drop$;
DROP TYPE idempotency_moving.stale_policy, idempotency_moving.operation_status;
DROP SCHEMA idempotency_moving;
