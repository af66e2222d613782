-- idempotency.distribute() without Citus: a clear refusal, nothing changed
\set SHOW_CONTEXT never
CREATE EXTENSION idempotency;
\set VERBOSITY terse
INSERT INTO idempotency.job_types (job_type, lease, stale_policy)
VALUES ('dist_email', '10 minutes', 'hold');
SELECT verdict, attempt FROM idempotency.claim_operation('dist_email', 'D-1');
SELECT idempotency.distribute();
\echo :LAST_ERROR_SQLSTATE
-- the guards are still there, and the record
SELECT tgname FROM pg_trigger
WHERE tgrelid = 'idempotency.job_types'::regclass AND NOT tgisinternal ORDER BY 1;
SELECT conname FROM pg_constraint
WHERE conrelid = 'idempotency.operations'::regclass AND contype = 'f';
SELECT job_type, operation_key, status, attempt FROM idempotency.operations
WHERE job_type = 'dist_email';
-- distribute_grants() without Citus: the same refusal
SELECT idempotency.distribute_grants();
\echo :LAST_ERROR_SQLSTATE
-- what it would copy to the workers: the grants on the extension's objects
-- (none to anyone but the owner on a new install), then one made by hand
SELECT count(*) AS grants FROM idempotency.object_grants();
CREATE ROLE regress_idem_dist_worker;
GRANT USAGE ON SCHEMA idempotency TO regress_idem_dist_worker;
GRANT EXECUTE ON FUNCTION idempotency.claim_operation(text, text, text, text, text, boolean)
    TO regress_idem_dist_worker WITH GRANT OPTION;
SELECT object, privilege, grantee, grantable, classid FROM idempotency.object_grants();
REVOKE ALL ON SCHEMA idempotency FROM regress_idem_dist_worker;
REVOKE ALL ON FUNCTION idempotency.claim_operation(text, text, text, text, text, boolean)
    FROM regress_idem_dist_worker CASCADE;
DROP ROLE regress_idem_dist_worker;
SELECT array_length(idempotency.delegated_functions(), 1) AS delegated;
-- not granted to PUBLIC
SELECT has_function_privilege('public', 'idempotency.distribute()', 'EXECUTE') AS public_may,
       has_function_privilege('public', 'idempotency.distribute_grants()', 'EXECUTE') AS public_may_grants,
       has_function_privilege('public', 'idempotency.object_grants()', 'EXECUTE') AS public_may_list;
DROP EXTENSION idempotency;
