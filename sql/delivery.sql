--
-- Delivery tokens (0.3): a retry of the same claim, after its reply was
-- lost, gets its own claim back; anything else answers as before. And the
-- retries of complete, release and extend are no-ops that succeed.
--
\set SHOW_CONTEXT never
CREATE EXTENSION idempotency;

CREATE FUNCTION pg_temp.age_claim(k text) RETURNS void
LANGUAGE sql AS $$
    UPDATE idempotency.operations o
    SET claimed_at = claimed_at - j.lease - interval '1 second',
        heartbeat_at = heartbeat_at - j.lease - interval '1 second'
    FROM idempotency.job_types j
    WHERE j.job_type = o.job_type AND o.operation_key = k
$$;
-- the record of one key, without its timestamps
CREATE FUNCTION pg_temp.rec(k text)
RETURNS TABLE (job_type text, status idempotency.operation_status, attempt integer,
               claimed_by text, has_delivery boolean, heartbeat_at timestamptz)
LANGUAGE sql AS $$
    SELECT job_type, status, attempt, claimed_by, delivery IS NOT NULL, heartbeat_at
    FROM idempotency.operations WHERE operation_key = k ORDER BY job_type
$$;

INSERT INTO idempotency.job_types (job_type, lease, stale_policy) VALUES
    ('send', '1 minute', 'hold'),
    ('charge', '1 minute', 'retry'),
    ('refund', '1 minute', 'lookup');

-- the retry of a run gets run again, with the same attempt; nothing changes
SELECT * FROM idempotency.claim_operation('send', 'K1', NULL, 'w1', 'delivery-1');
CREATE TEMP TABLE k1 AS SELECT * FROM pg_temp.rec('K1');
SELECT * FROM idempotency.claim_operation('send', 'K1', NULL, 'w1', 'delivery-1');
SELECT * FROM idempotency.claim_operation('send', 'K1', delivery => 'delivery-1');
SELECT (SELECT count(*) FROM (TABLE k1 EXCEPT SELECT * FROM pg_temp.rec('K1')) d) AS changed;
-- another delivery, or none, is a duplicate: in_progress
SELECT * FROM idempotency.claim_operation('send', 'K1', NULL, 'w1', 'delivery-2');
SELECT * FROM idempotency.claim_operation('send', 'K1', NULL, 'w1');
-- a worker id is not a token: two threads of one worker are two deliveries
SELECT * FROM idempotency.claim_operation('send', 'K1', NULL, 'w1', NULL);
-- tokens are exact: case and trailing blanks count
SELECT verdict FROM idempotency.claim_operation('send', 'K1', delivery => 'Delivery-1');
SELECT verdict FROM idempotency.claim_operation('send', 'K1', delivery => 'delivery-1 ');
-- and belong to one key and one job type
SELECT verdict, attempt FROM idempotency.claim_operation('send', 'K2', delivery => 'delivery-1');
SELECT verdict, attempt FROM idempotency.claim_operation('charge', 'K1', delivery => 'delivery-1');

-- the retry of a completion is a no-op that succeeds, and keeps the first result
SELECT idempotency.complete_operation('send', 'K1', 1, '{"message_id": "m-1"}');
SELECT idempotency.complete_operation('send', 'K1', 1, '{"message_id": "m-2"}');
-- a completed record answers completed, to the same delivery too
SELECT * FROM idempotency.claim_operation('send', 'K1', NULL, 'w1', 'delivery-1');

-- the retry of a release is a no-op that succeeds; the next claim runs
SELECT idempotency.release_operation('send', 'K2', 1);
SELECT idempotency.release_operation('send', 'K2', 1);
SELECT status, attempt FROM pg_temp.rec('K2') WHERE job_type = 'send';
-- a released record taken over: run, attempt 2; its retry: the same
SELECT * FROM idempotency.claim_operation('send', 'K2', delivery => 'delivery-3');
SELECT * FROM idempotency.claim_operation('send', 'K2', delivery => 'delivery-3');
-- the old delivery's retry is a duplicate now
SELECT * FROM idempotency.claim_operation('send', 'K2', delivery => 'delivery-1');

-- the retry of an extension extends again and succeeds
SELECT idempotency.extend_lease('send', 'K2', 2) IS NOT NULL AS extended;
SELECT idempotency.extend_lease('send', 'K2', 2) IS NOT NULL AS extended;

-- a stale claim taken over under retry: run, attempt 2, for the new delivery
SELECT * FROM idempotency.claim_operation('charge', 'C1', delivery => 'd-old');
SELECT pg_temp.age_claim('C1');
SELECT * FROM idempotency.claim_operation('charge', 'C1', delivery => 'd-new');
SELECT * FROM idempotency.claim_operation('charge', 'C1', delivery => 'd-new');
-- the dead worker's delivery, retried, is a duplicate, not its old claim back
SELECT * FROM idempotency.claim_operation('charge', 'C1', delivery => 'd-old');
-- and its attempt is fenced off as before
SELECT idempotency.complete_operation('charge', 'C1', 1);
\echo :LAST_ERROR_SQLSTATE

-- under lookup the takeover's verdict is verify, and so is its retry's
SELECT * FROM idempotency.claim_operation('refund', 'R1', delivery => 'd-1');
SELECT pg_temp.age_claim('R1');
SELECT * FROM idempotency.claim_operation('refund', 'R1', delivery => 'd-2');
SELECT * FROM idempotency.claim_operation('refund', 'R1', delivery => 'd-2');
-- a released record is run, not verified, under lookup too; so is its retry
SELECT idempotency.release_operation('refund', 'R1', 2);
SELECT * FROM idempotency.claim_operation('refund', 'R1', delivery => 'd-3');
SELECT * FROM idempotency.claim_operation('refund', 'R1', delivery => 'd-3');

-- a stale claim is not given back to its delivery: the policy decides
SELECT * FROM idempotency.claim_operation('send', 'H1', delivery => 'd-h');
SELECT pg_temp.age_claim('H1');
SELECT * FROM idempotency.claim_operation('send', 'H1', delivery => 'd-h');

-- a fingerprint mismatch is an error for the same delivery too
SELECT * FROM idempotency.claim_operation('send', 'F1', 'fp-1', NULL, 'd-f');
SELECT * FROM idempotency.claim_operation('send', 'F1', 'fp-2', NULL, 'd-f');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.claim_operation('send', 'F1', 'fp-1', NULL, 'd-f');

-- bad input: 22xxx, nothing recorded
CREATE TEMP TABLE before_bad AS SELECT * FROM idempotency.operations;
SELECT * FROM idempotency.claim_operation('send', 'B1', delivery => '');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.claim_operation('send', 'B1', delivery => repeat('x', 1025));
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.claim_operation('send', 'K1', delivery => repeat('x', 1025));
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.claim_operation('send', 'B1', wait => NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.claim_operation('send', 'K1', wait => NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT (SELECT count(*) FROM (TABLE before_bad EXCEPT TABLE idempotency.operations) d) AS lost,
       (SELECT count(*) FROM (TABLE idempotency.operations EXCEPT TABLE before_bad) d) AS new_or_changed;
-- 1024 bytes (in multibyte characters too) is allowed
SELECT verdict FROM idempotency.claim_operation('send', 'B2', delivery => repeat('x', 1024));
SELECT verdict FROM idempotency.claim_operation('send', 'B2', delivery => repeat('x', 1024));
SELECT verdict FROM idempotency.claim_operation('send', 'B3', delivery => repeat('é', 512));
SELECT * FROM idempotency.claim_operation('send', 'B4', delivery => repeat('é', 513));
\echo :LAST_ERROR_SQLSTATE

-- wait => false without contention: the same verdicts; lock_timeout is
-- the caller's again afterwards, after an error too
SET lock_timeout = '5s';
SELECT * FROM idempotency.claim_operation('send', 'W1', wait => false);
SELECT * FROM idempotency.claim_operation('send', 'W1', wait => false);
SELECT * FROM idempotency.claim_operation('send', 'W1', 'fp', wait => false);
SELECT * FROM idempotency.claim_operation('send', 'W1', NULL, NULL, 'd-w', false);
SHOW lock_timeout;
SELECT * FROM idempotency.claim_operation('nope', 'W1', wait => false);
\echo :LAST_ERROR_SQLSTATE
SHOW lock_timeout;
BEGIN;
SELECT * FROM idempotency.claim_operation('send', 'W2', wait => false);
SHOW lock_timeout;
SAVEPOINT s;
SELECT * FROM idempotency.claim_operation('nope', 'W1', wait => false);
ROLLBACK TO SAVEPOINT s;
SHOW lock_timeout;
COMMIT;
RESET lock_timeout;
-- the claim's own transaction, claiming a key twice, never waits for itself
BEGIN;
SELECT * FROM idempotency.claim_operation('send', 'W3', wait => false);
SELECT * FROM idempotency.claim_operation('send', 'W3', wait => false);
SELECT * FROM idempotency.claim_operation('send', 'W3', delivery => 'x', wait => false);
COMMIT;

-- the bound of a wait => false call's write (0.4): lock_timeout 1 s, or the
-- caller's if it is shorter and not 0; wait => true leaves the caller's. A
-- trigger on the table shows the setting while the claim inserts.
CREATE FUNCTION show_lock_timeout() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE NOTICE 'lock_timeout while % is inserted: %', NEW.operation_key, current_setting('lock_timeout');
    RETURN NEW;
END
$$;
CREATE TRIGGER show_lock_timeout BEFORE INSERT ON idempotency.operations
    FOR EACH ROW EXECUTE FUNCTION show_lock_timeout();
SELECT verdict FROM idempotency.claim_operation('send', 'LT1', wait => false);
SET lock_timeout = '200ms';
SELECT verdict FROM idempotency.claim_operation('send', 'LT2', wait => false);
SET lock_timeout = '5s';
SELECT verdict FROM idempotency.claim_operation('send', 'LT3', wait => false);
SELECT verdict FROM idempotency.claim_operation('send', 'LT4');
SHOW lock_timeout;
RESET lock_timeout;
SELECT verdict, attempt FROM idempotency.claim_operations('send', ARRAY['LT5'], wait => false);
DROP TRIGGER show_lock_timeout ON idempotency.operations;
DROP FUNCTION show_lock_timeout();

DROP TABLE k1, before_bad;
DROP FUNCTION pg_temp.rec(text);
DROP EXTENSION idempotency;
