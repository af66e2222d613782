--
-- test/upgrade/records-0.1.sql: run on the OLD major (15) in database
-- "legacy": the extension still at the first released version, 0.1, with a
-- completed record, a held claim, a young claim, a skipped record, stale
-- claims under retry and lookup, and a resolution. After the
-- major-version upgrade, scenario.sh runs ALTER EXTENSION idempotency UPDATE
-- on the new major and checks that they come through.
--
\set ON_ERROR_STOP 1
CREATE EXTENSION idempotency VERSION '0.1';
GRANT USAGE ON SCHEMA idempotency TO upg_worker, upg_operator;
GRANT EXECUTE ON FUNCTION
    idempotency.claim_operation(text, text, text, text),
    idempotency.complete_operation(text, text, integer, jsonb),
    idempotency.release_operation(text, text, integer),
    idempotency.extend_lease(text, text, integer)
  TO upg_worker;
GRANT EXECUTE ON FUNCTION
    idempotency.stale_claims(text),
    idempotency.resolve_operation(text, text, text, text)
  TO upg_operator;

INSERT INTO idempotency.job_types (job_type, lease, stale_policy, max_attempts) VALUES
    ('send_confirmation', '1 second', 'hold', NULL),
    ('charge', '1 second', 'retry', 3),
    ('post_slack', '1 second', 'skip', NULL),
    ('charge_lookup', '1 second', 'lookup', 3),
    ('nightly_report', '1 hour', 'hold', NULL);

SET ROLE upg_worker;
SELECT verdict, attempt FROM idempotency.claim_operation('send_confirmation', 'L-1', 'fp-l-1', 'old-host/pid-1');
SELECT idempotency.complete_operation('send_confirmation', 'L-1', 1, '{"message_id": "m-legacy"}');
SELECT verdict, attempt FROM idempotency.claim_operation('send_confirmation', 'L-2', NULL, 'old-host/pid-2');
SELECT verdict, attempt FROM idempotency.claim_operation('send_confirmation', 'L-3', NULL, 'old-host/pid-3');
SELECT verdict, attempt FROM idempotency.claim_operation('charge', 'L-4', NULL, 'old-host/pid-4');
SELECT verdict, attempt FROM idempotency.claim_operation('nightly_report', 'L-5', NULL, 'old-host/pid-5');
SELECT verdict, attempt FROM idempotency.claim_operation('post_slack', 'L-6', NULL, 'old-host/pid-6');
SELECT verdict, attempt FROM idempotency.claim_operation('charge_lookup', 'L-7', NULL, 'old-host/pid-7');
RESET ROLE;
SELECT pg_sleep(1.2);
SET ROLE upg_worker;
SELECT verdict, attempt FROM idempotency.claim_operation('send_confirmation', 'L-2');
SELECT verdict, attempt FROM idempotency.claim_operation('post_slack', 'L-6');
RESET ROLE;
SET ROLE upg_operator;
SELECT idempotency.resolve_operation('send_confirmation', 'L-3', 'retry', 'not sent');
RESET ROLE;

SELECT extversion FROM pg_extension WHERE extname = 'idempotency';
SELECT job_type, operation_key, status, attempt FROM idempotency.operations ORDER BY 1, 2;
