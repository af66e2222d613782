-- idempotency.distribute() without Citus: a clear refusal, nothing changed
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
-- not granted to PUBLIC
SELECT has_function_privilege('public', 'idempotency.distribute()', 'EXECUTE') AS public_may;
DROP EXTENSION idempotency;
