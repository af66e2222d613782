--
-- test/upgrade/records.sql: run on the OLD major (15) in database "app",
-- extension at the default version: roles and grants as the README gives
-- them, and a record of every kind, made through the functions (stale claims
-- are made stale by time, not by writing to the table).
--
-- After the upgrade, test/upgrade/scenario.sh expects exactly these records.
--
\set ON_ERROR_STOP 1
CREATE EXTENSION idempotency;

CREATE ROLE upg_worker;
CREATE ROLE upg_operator;
CREATE ROLE upg_tenant_a NOLOGIN;
CREATE ROLE upg_tenant_a_worker IN ROLE upg_tenant_a;
CREATE ROLE upg_tenant_b_worker;
GRANT USAGE ON SCHEMA idempotency TO upg_worker, upg_operator, upg_tenant_a, upg_tenant_b_worker;
GRANT EXECUTE ON FUNCTION
    idempotency.claim_operation(text, text, text, text, text, boolean),
    idempotency.complete_operation(text, text, integer, jsonb),
    idempotency.release_operation(text, text, integer),
    idempotency.extend_lease(text, text, integer)
  TO upg_worker, upg_tenant_a, upg_tenant_b_worker;
GRANT EXECUTE ON FUNCTION
    idempotency.stale_claims(text),
    idempotency.resolve_operation(text, text, text, text),
    idempotency.purge_operations(integer),
    idempotency.purge_block_range(bigint, integer),
    idempotency.purge_refuse_transaction_block()
  TO upg_operator;
GRANT EXECUTE ON PROCEDURE idempotency.purge(integer, interval, bigint) TO upg_operator;
GRANT SELECT ON idempotency.job_type_stats, idempotency.operations, idempotency.resolutions TO upg_operator;
GRANT SELECT, INSERT, UPDATE, DELETE ON idempotency.job_types TO upg_operator;

-- short leases (1 second) for the claims that must be stale, an hour for young ones
INSERT INTO idempotency.job_types (job_type, lease, stale_policy, max_attempts, retention, worker_role) VALUES
    ('send_confirmation', '1 second', 'hold',   NULL, NULL,      NULL),
    ('charge',            '1 second', 'retry',  3,    '30 days', NULL),
    ('post_slack',        '1 second', 'skip',   NULL, '1 day',   NULL),
    ('charge_lookup',     '1 second', 'lookup', 3,    NULL,      NULL),
    ('nightly_report',    '1 hour',   'hold',   NULL, NULL,      NULL),
    ('a_invoice',         '1 hour',   'retry',  5,    NULL,      'upg_tenant_a');

SET ROLE upg_worker;
-- completed with a result
SELECT verdict, attempt FROM idempotency.claim_operation('send_confirmation', 'ORD-1001', 'fp-1001', 'host-1/pid-11');
SELECT idempotency.complete_operation('send_confirmation', 'ORD-1001', 1, '{"message_id": "m-8812"}');
-- claims whose workers "die": stale after their 1-second lease
SELECT verdict, attempt FROM idempotency.claim_operation('send_confirmation', 'ORD-1002', 'fp-1002', 'host-1/pid-12');
SELECT verdict, attempt FROM idempotency.claim_operation('send_confirmation', 'ORD-1004', NULL, 'host-1/pid-14');
SELECT verdict, attempt FROM idempotency.claim_operation('send_confirmation', 'ORD-1005', NULL, 'host-1/pid-15');
SELECT verdict, attempt FROM idempotency.claim_operation('charge', 'CH-1', 'fp-ch-1', 'host-2/pid-21');
SELECT verdict, attempt FROM idempotency.claim_operation('charge', 'CH-2', NULL, 'host-2/pid-22');
SELECT verdict, attempt FROM idempotency.claim_operation('post_slack', 'SL-1', NULL, 'host-3/pid-31');
SELECT verdict, attempt FROM idempotency.claim_operation('charge_lookup', 'LK-1', NULL, 'host-4/pid-41');
-- released: the worker knew the effect did not happen
SELECT verdict, attempt FROM idempotency.claim_operation('send_confirmation', 'ORD-1003', NULL, 'host-1/pid-13');
SELECT idempotency.release_operation('send_confirmation', 'ORD-1003', 1);
-- a young claim (lease 1 hour), with a heartbeat
SELECT verdict, attempt FROM idempotency.claim_operation('nightly_report', 'NR-1', 'fp-nr-1', 'host-5/pid-51');
SELECT idempotency.extend_lease('nightly_report', 'NR-1', 1) > now() AS extended;
RESET ROLE;

-- the tenant's job type: its own worker only
SET ROLE upg_tenant_a_worker;
SELECT verdict, attempt FROM idempotency.claim_operation('a_invoice', 'AI-1', NULL, 'tenant-a/pid-1');
SELECT idempotency.complete_operation('a_invoice', 'AI-1', 1, '{"invoice": "INV-7"}');
SELECT verdict, attempt FROM idempotency.claim_operation('a_invoice', 'AI-2', NULL, 'tenant-a/pid-2');
RESET ROLE;

SELECT pg_sleep(1.2);

SET ROLE upg_worker;
-- redeliveries after the lease: held (hold), taken over and completed (retry), skipped (skip)
SELECT verdict, attempt FROM idempotency.claim_operation('send_confirmation', 'ORD-1002', 'fp-1002');
SELECT verdict, attempt FROM idempotency.claim_operation('send_confirmation', 'ORD-1004');
SELECT verdict, attempt FROM idempotency.claim_operation('charge', 'CH-2', NULL, 'host-2/pid-23');
SELECT idempotency.complete_operation('charge', 'CH-2', 2, '{"charge_id": "ch_2", "amount": 4200}');
SELECT verdict, attempt FROM idempotency.claim_operation('post_slack', 'SL-1');
RESET ROLE;

-- a person decides two held claims (the audit gets ids 1 and 2)
SET ROLE upg_operator;
SELECT idempotency.resolve_operation('send_confirmation', 'ORD-1004', 'completed', 'found in the provider log');
SELECT idempotency.resolve_operation('send_confirmation', 'ORD-1005', 'retry', 'not in the provider log');
RESET ROLE;

-- what the old cluster holds
SELECT job_type, operation_key, status, attempt FROM idempotency.operations ORDER BY 1, 2;
