--
-- claim_operation(): the verdicts a first claim and its redeliveries get,
-- and what the record holds afterwards.
--
\set SHOW_CONTEXT never
CREATE EXTENSION idempotency;

-- the seed's job type: a 10-minute lease, held for a person when stale
INSERT INTO idempotency.job_types (job_type) VALUES ('send_confirmation');
SELECT job_type, lease, stale_policy, max_attempts, retention FROM idempotency.job_types;

-- first delivery: run, attempt 1
SELECT * FROM idempotency.claim_operation('send_confirmation', 'ORD-1001', 'sha256:aaa', 'worker-1');
SELECT job_type, operation_key, status, attempt, claimed_by, fingerprint, result,
       completed_at IS NULL AS not_completed, claimed_at = heartbeat_at AS fresh_lease
FROM idempotency.operations;

-- a redelivery while the claim is inside its lease: in_progress, nothing written
SELECT * FROM idempotency.claim_operation('send_confirmation', 'ORD-1001', 'sha256:aaa', 'worker-2');
SELECT status, attempt, claimed_by FROM idempotency.operations WHERE operation_key = 'ORD-1001';

-- completion, then a redelivery: completed, with the stored result
SELECT idempotency.complete_operation('send_confirmation', 'ORD-1001', 1, '{"message_id": "m-1"}');
SELECT * FROM idempotency.claim_operation('send_confirmation', 'ORD-1001', 'sha256:aaa');
SELECT status, attempt, result, completed_at >= claimed_at AS completed_after_claim
FROM idempotency.operations WHERE operation_key = 'ORD-1001';

-- a claim without fingerprint or worker is fine; a different key is a different operation
SELECT * FROM idempotency.claim_operation('send_confirmation', 'ORD-1002');
SELECT operation_key, status, attempt, claimed_by, fingerprint
FROM idempotency.operations ORDER BY operation_key;

-- a claim of a completed key with no fingerprint is answered (no check possible)
SELECT * FROM idempotency.claim_operation('send_confirmation', 'ORD-1001');

-- a completed claim without result returns NULL result
SELECT idempotency.complete_operation('send_confirmation', 'ORD-1002', 1);
SELECT * FROM idempotency.claim_operation('send_confirmation', 'ORD-1002');

-- released: the next claim runs with attempt + 1
SELECT * FROM idempotency.claim_operation('send_confirmation', 'ORD-1003', NULL, 'worker-1');
SELECT idempotency.release_operation('send_confirmation', 'ORD-1003', 1);
SELECT status, attempt FROM idempotency.operations WHERE operation_key = 'ORD-1003';
SELECT * FROM idempotency.claim_operation('send_confirmation', 'ORD-1003', 'sha256:ccc', 'worker-2');
SELECT status, attempt, claimed_by, fingerprint FROM idempotency.operations WHERE operation_key = 'ORD-1003';

-- keys are compared byte for byte: case and spaces matter
SELECT * FROM idempotency.claim_operation('send_confirmation', 'ord-1001');
SELECT * FROM idempotency.claim_operation('send_confirmation', 'ORD-1001 ');

-- time is the clock at the call, not the transaction start: a claim made
-- late in a long transaction is not born old
BEGIN;
SELECT pg_sleep(0.2);
SELECT * FROM idempotency.claim_operation('send_confirmation', 'ORD-late');
SELECT claimed_at > now() + interval '0.1 s' AS claimed_at_is_call_time
FROM idempotency.operations WHERE operation_key = 'ORD-late';
COMMIT;

-- the claim and the completion in one transaction: the transactional mode
BEGIN;
SELECT * FROM idempotency.claim_operation('send_confirmation', 'ORD-tx');
SELECT * FROM idempotency.claim_operation('send_confirmation', 'ORD-tx');
SELECT idempotency.complete_operation('send_confirmation', 'ORD-tx', 1);
COMMIT;
SELECT * FROM idempotency.claim_operation('send_confirmation', 'ORD-tx');

-- rolled back with its transaction: no record, the next claim runs
BEGIN;
SELECT * FROM idempotency.claim_operation('send_confirmation', 'ORD-rollback');
ROLLBACK;
SELECT count(*) FROM idempotency.operations WHERE operation_key = 'ORD-rollback';
SELECT * FROM idempotency.claim_operation('send_confirmation', 'ORD-rollback');

-- keys up to the limit (1024 bytes) are accepted, multibyte ones too
SELECT verdict FROM idempotency.claim_operation('send_confirmation', repeat('k', 1024));
SELECT verdict FROM idempotency.claim_operation('send_confirmation', repeat('é', 512));

DROP EXTENSION idempotency;
