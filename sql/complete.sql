--
-- complete_operation(), release_operation(), extend_lease(): fencing by
-- attempt, repeats, and the state each may be called in.
--
\set SHOW_CONTEXT never
CREATE EXTENSION idempotency;
INSERT INTO idempotency.job_types (job_type, lease, stale_policy)
VALUES ('send_confirmation', '10 minutes', 'retry');

-- Test helper: move a claim's lease start into the past, as if time passed.
CREATE FUNCTION pg_temp.age_claim(k text, by interval) RETURNS void
LANGUAGE sql AS $$
    UPDATE idempotency.operations
    SET claimed_at = claimed_at - by, heartbeat_at = heartbeat_at - by
    WHERE operation_key = k
$$;

SELECT * FROM idempotency.claim_operation('send_confirmation', 'A');
SELECT idempotency.complete_operation('send_confirmation', 'A', 1, '{"n": 1}');
-- a repeated completion (say, after a lost reply) is a no-op; the first result stays
SELECT idempotency.complete_operation('send_confirmation', 'A', 1, '{"n": 2}');
SELECT status, attempt, result FROM idempotency.operations WHERE operation_key = 'A';

-- completing a completed record is not a way to change its attempt: an
-- attempt no claim returned is a caller bug (22023), not a superseded one
SELECT idempotency.complete_operation('send_confirmation', 'A', 2);
\echo :LAST_ERROR_SQLSTATE

-- fencing: a slow worker whose claim was taken over cannot complete
SELECT * FROM idempotency.claim_operation('send_confirmation', 'B', NULL, 'slow');
SELECT pg_temp.age_claim('B', '11 minutes');
SELECT * FROM idempotency.claim_operation('send_confirmation', 'B', NULL, 'fast');
SELECT idempotency.complete_operation('send_confirmation', 'B', 1, '{"by": "slow"}');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.release_operation('send_confirmation', 'B', 1);
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.extend_lease('send_confirmation', 'B', 1);
\echo :LAST_ERROR_SQLSTATE
-- nothing the zombie tried changed the record
SELECT status, attempt, claimed_by, result FROM idempotency.operations WHERE operation_key = 'B';
SELECT idempotency.complete_operation('send_confirmation', 'B', 2, '{"by": "fast"}');
SELECT status, attempt, claimed_by, result FROM idempotency.operations WHERE operation_key = 'B';

-- release: the effect did not happen; repeating it is a no-op
SELECT * FROM idempotency.claim_operation('send_confirmation', 'C');
SELECT idempotency.release_operation('send_confirmation', 'C', 1);
SELECT idempotency.release_operation('send_confirmation', 'C', 1);
SELECT status, attempt, completed_at IS NULL AS no_completed_at FROM idempotency.operations WHERE operation_key = 'C';
-- a released record cannot be completed or extended by the attempt that released it
SELECT idempotency.complete_operation('send_confirmation', 'C', 1);
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.extend_lease('send_confirmation', 'C', 1);
\echo :LAST_ERROR_SQLSTATE
-- a completed record cannot be released or extended
SELECT idempotency.release_operation('send_confirmation', 'A', 1);
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.extend_lease('send_confirmation', 'A', 1);
\echo :LAST_ERROR_SQLSTATE

-- extend_lease: the lease restarts now; returns the new expiry
SELECT * FROM idempotency.claim_operation('send_confirmation', 'D');
SELECT pg_temp.age_claim('D', '9 minutes');
SELECT idempotency.extend_lease('send_confirmation', 'D', 1)
       BETWEEN clock_timestamp() + interval '9 minutes' AND clock_timestamp() + interval '10 minutes'
       AS expires_in_ten_minutes;
SELECT claimed_at < heartbeat_at - interval '8 minutes' AS claimed_at_kept
FROM idempotency.operations WHERE operation_key = 'D';
-- 9 more minutes: without the heartbeat it would be stale; with it, it is not
SELECT pg_temp.age_claim('D', '9 minutes');
SELECT count(*) AS stale FROM idempotency.stale_claims();
SELECT * FROM idempotency.claim_operation('send_confirmation', 'D');
-- a claim whose lease ran out but that nobody took over can still be
-- extended: its worker is evidently alive
SELECT pg_temp.age_claim('D', '11 minutes');
SELECT operation_key FROM idempotency.stale_claims();
SELECT idempotency.extend_lease('send_confirmation', 'D', 1) > clock_timestamp() AS extended;
SELECT count(*) AS stale FROM idempotency.stale_claims();

-- a skipped record can still be completed by its attempt (the worker was
-- slow, not dead, and records the truth) or released
UPDATE idempotency.job_types SET stale_policy = 'skip';
SELECT * FROM idempotency.claim_operation('send_confirmation', 'E');
SELECT * FROM idempotency.claim_operation('send_confirmation', 'F');
SELECT pg_temp.age_claim('E', '11 minutes');
SELECT pg_temp.age_claim('F', '11 minutes');
SELECT verdict, attempt FROM idempotency.claim_operation('send_confirmation', 'E');
SELECT verdict, attempt FROM idempotency.claim_operation('send_confirmation', 'F');
SELECT idempotency.complete_operation('send_confirmation', 'E', 1, '{"late": true}');
SELECT idempotency.release_operation('send_confirmation', 'F', 1);
SELECT operation_key, status, attempt, result FROM idempotency.operations
WHERE operation_key IN ('E', 'F') ORDER BY 1;
SELECT verdict, attempt, result FROM idempotency.claim_operation('send_confirmation', 'E');
SELECT verdict, attempt FROM idempotency.claim_operation('send_confirmation', 'F');

-- a held claim (stale under hold; the redelivery got held and changed
-- nothing) can still be completed or released by its own attempt: its
-- worker was slow, not dead. There is no takeover: the attempt stays 1.
UPDATE idempotency.job_types SET stale_policy = 'hold';
SELECT * FROM idempotency.claim_operation('send_confirmation', 'H1', NULL, 'slow');
SELECT * FROM idempotency.claim_operation('send_confirmation', 'H2', NULL, 'slow');
SELECT pg_temp.age_claim('H1', '11 minutes');
SELECT pg_temp.age_claim('H2', '11 minutes');
SELECT verdict, attempt FROM idempotency.claim_operation('send_confirmation', 'H1', NULL, 'redelivery');
SELECT verdict, attempt FROM idempotency.claim_operation('send_confirmation', 'H2', NULL, 'redelivery');
SELECT operation_key, attempt FROM idempotency.stale_claims() WHERE operation_key IN ('H1', 'H2') ORDER BY 1;
SELECT idempotency.complete_operation('send_confirmation', 'H1', 1, '{"late": true}');
SELECT idempotency.release_operation('send_confirmation', 'H2', 1);
SELECT operation_key, status, attempt, claimed_by, result FROM idempotency.operations
WHERE operation_key IN ('H1', 'H2') ORDER BY 1;
SELECT count(*) AS stale FROM idempotency.stale_claims() WHERE operation_key IN ('H1', 'H2');
-- the next deliveries: completed with the late result; run as attempt 2
SELECT verdict, attempt, result FROM idempotency.claim_operation('send_confirmation', 'H1');
SELECT verdict, attempt FROM idempotency.claim_operation('send_confirmation', 'H2');

-- all three work inside the claim's transaction (the transactional mode)
BEGIN;
SELECT verdict, attempt FROM idempotency.claim_operation('send_confirmation', 'G');
SELECT idempotency.extend_lease('send_confirmation', 'G', 1) > clock_timestamp() AS extended;
SELECT idempotency.complete_operation('send_confirmation', 'G', 1);
COMMIT;
SELECT status FROM idempotency.operations WHERE operation_key = 'G';

DROP EXTENSION idempotency;
