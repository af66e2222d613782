--
-- Batches (0.3): claim_operations, complete_operations, release_operations.
-- Each key gets the single call's answer; rows come back in the order given;
-- a record that refuses a completion or a release is reported on its row;
-- caller bugs raise the single calls' SQLSTATEs and record nothing.
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

INSERT INTO idempotency.job_types (job_type, lease, stale_policy, max_attempts) VALUES
    ('send', '1 minute', 'hold', NULL),
    ('charge', '1 minute', 'retry', NULL),
    ('refund', '1 minute', 'lookup', NULL),
    ('digest', '1 minute', 'skip', NULL);

-- new keys: run, in the order given (not sorted)
SELECT * FROM idempotency.claim_operations('send', ARRAY['K3', 'K1', 'K2'], worker => 'w1');
-- again: in_progress for each; a key given twice: run, then in_progress
SELECT * FROM idempotency.claim_operations('send', ARRAY['K2', 'K4', 'K4', 'K1']);
-- complete some, with results; a result array may hold NULLs
SELECT * FROM idempotency.complete_operations('send', ARRAY['K1', 'K2', 'K4'], ARRAY[1, 1, 1],
                                              ARRAY['{"message_id": "m-1"}', NULL, '{"message_id": "m-4"}']::jsonb[]);
-- completed keys answer completed with their result, the others as before
SELECT * FROM idempotency.claim_operations('send', ARRAY['K1', 'K2', 'K3', 'K4', 'K5']);
SELECT operation_key, status, attempt, claimed_by, result FROM idempotency.operations
WHERE job_type = 'send' ORDER BY 1;

-- the verdicts of every state, against single calls on twin keys
SELECT verdict FROM idempotency.claim_operation('charge', 'C-stale');
SELECT verdict FROM idempotency.claim_operation('charge', 'C-stale-single');
SELECT verdict FROM idempotency.claim_operation('refund', 'R-stale');
SELECT verdict FROM idempotency.claim_operation('refund', 'R-stale-single');
SELECT verdict FROM idempotency.claim_operation('digest', 'D-stale');
SELECT verdict FROM idempotency.claim_operation('digest', 'D-stale-single');
SELECT verdict FROM idempotency.claim_operation('send', 'H-stale');
SELECT verdict FROM idempotency.claim_operation('send', 'H-stale-single');
SELECT pg_temp.age_claim(k) FROM unnest(ARRAY['C-stale', 'C-stale-single', 'R-stale', 'R-stale-single',
                                              'D-stale', 'D-stale-single', 'H-stale', 'H-stale-single']) k;
SELECT verdict FROM idempotency.claim_operation('charge', 'C-rel');
SELECT verdict FROM idempotency.claim_operation('charge', 'C-rel-single');
SELECT done FROM idempotency.release_operations('charge', ARRAY['C-rel', 'C-rel-single'], ARRAY[1, 1]);
SELECT 'batch' AS how, b.* FROM (
    SELECT * FROM idempotency.claim_operations('charge', ARRAY['C-stale', 'C-rel'])
    UNION ALL SELECT * FROM idempotency.claim_operations('refund', ARRAY['R-stale'])
    UNION ALL SELECT * FROM idempotency.claim_operations('digest', ARRAY['D-stale'])
    UNION ALL SELECT * FROM idempotency.claim_operations('send', ARRAY['H-stale'])) b
UNION ALL
SELECT 'single', s.* FROM (
    SELECT 'C-stale-single', * FROM idempotency.claim_operation('charge', 'C-stale-single')
    UNION ALL SELECT 'C-rel-single', * FROM idempotency.claim_operation('charge', 'C-rel-single')
    UNION ALL SELECT 'R-stale-single', * FROM idempotency.claim_operation('refund', 'R-stale-single')
    UNION ALL SELECT 'D-stale-single', * FROM idempotency.claim_operation('digest', 'D-stale-single')
    UNION ALL SELECT 'H-stale-single', * FROM idempotency.claim_operation('send', 'H-stale-single')) s
ORDER BY 2, 1;

-- fenced keys are reported on their rows; the others are done
SELECT * FROM idempotency.complete_operations('charge', ARRAY['C-stale', 'C-stale', 'C-rel', 'C-none'],
                                              ARRAY[1, 2, 2, 1]);
SELECT operation_key, status, attempt FROM idempotency.operations
WHERE operation_key IN ('C-stale', 'C-rel') ORDER BY 1;
-- a completion repeated is done again, the first result kept
SELECT * FROM idempotency.complete_operations('send', ARRAY['K1'], ARRAY[1], ARRAY['{"message_id": "other"}'::jsonb]);
SELECT result FROM idempotency.operations WHERE operation_key = 'K1';
-- releases: done, repeated done, refused on the row
SELECT verdict FROM idempotency.claim_operation('send', 'K6');
SELECT * FROM idempotency.release_operations('send', ARRAY['K6', 'K3', 'K1', 'K6'], ARRAY[1, 1, 1, 1]);
SELECT * FROM idempotency.claim_operations('send', ARRAY['K6', 'K3']);

-- delivery tokens: a retry of the batch gets its own claims back; a key
-- given twice with the same token is still two deliveries
SELECT * FROM idempotency.claim_operations('send', ARRAY['T1', 'T2', 'T1'],
                                           deliveries => ARRAY['d-a', 'd-b', 'd-a']);
SELECT * FROM idempotency.claim_operations('send', ARRAY['T1', 'T2', 'T1'],
                                           deliveries => ARRAY['d-a', 'd-b', 'd-a']);
SELECT * FROM idempotency.claim_operations('send', ARRAY['T1', 'T2'], deliveries => ARRAY['d-x', NULL]);
-- fingerprints, parallel to the keys
SELECT * FROM idempotency.claim_operations('send', ARRAY['F1', 'F2'], ARRAY['fp-1', NULL]);
SELECT * FROM idempotency.claim_operations('send', ARRAY['F1'], ARRAY['fp-2']);
\echo :LAST_ERROR_SQLSTATE
-- wait => false, without contention, and lock_timeout untouched
SELECT * FROM idempotency.claim_operations('send', ARRAY['W1', 'K1'], wait => false);
SHOW lock_timeout;

-- an empty batch: no rows, no error
SELECT * FROM idempotency.claim_operations('send', ARRAY[]::text[]);
SELECT * FROM idempotency.complete_operations('send', ARRAY[]::text[], ARRAY[]::integer[]);
SELECT * FROM idempotency.release_operations('send', '{}', '{}');

-- bad input: the single calls' SQLSTATEs, nothing recorded
CREATE TEMP TABLE before_bad AS SELECT * FROM idempotency.operations;
SELECT * FROM idempotency.claim_operations('send', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.claim_operations(NULL, ARRAY['B1']);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.claim_operations('nope', ARRAY['B1']);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.claim_operations('send', ARRAY['B1', NULL]);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.claim_operations('send', ARRAY['B1', '']);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.claim_operations('send', ARRAY['B1', repeat('x', 1025)]);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.claim_operations('send', ARRAY[['B1', 'B2'], ['B3', 'B4']]);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.claim_operations('send', ARRAY['B1', 'B2'], ARRAY['fp']);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.claim_operations('send', ARRAY['B1', 'B2'], deliveries => ARRAY['d', '']);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.claim_operations('send', ARRAY['B1'], deliveries => ARRAY[repeat('d', 1025)]);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.claim_operations('send', ARRAY['B1'], wait => NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.claim_operations('send', array_fill('B'::text, ARRAY[1001]));
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) FROM idempotency.claim_operations('send', ARRAY(SELECT 'MAX-' || g FROM generate_series(1, 1000) g));
DELETE FROM idempotency.operations WHERE operation_key LIKE 'MAX-%';
SELECT * FROM idempotency.complete_operations('send', ARRAY['K3'], NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.complete_operations('send', ARRAY['K3', 'K5'], ARRAY[1]);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.complete_operations('send', ARRAY['K3'], ARRAY[NULL]::integer[]);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.complete_operations('send', ARRAY['K3'], ARRAY[0]);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.complete_operations('send', ARRAY['K3'], ARRAY[1], ARRAY['{}', '{}']::jsonb[]);
\echo :LAST_ERROR_SQLSTATE
-- an attempt no claim returned is a caller bug: the whole batch fails,
-- also the keys before it
SELECT * FROM idempotency.complete_operations('send', ARRAY['K3', 'K5'], ARRAY[1, 7]);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.release_operations('send', ARRAY['K3'], ARRAY[1, 1]);
\echo :LAST_ERROR_SQLSTATE
SELECT (SELECT count(*) FROM (TABLE before_bad EXCEPT TABLE idempotency.operations) d) AS lost,
       (SELECT count(*) FROM (TABLE idempotency.operations EXCEPT TABLE before_bad) d) AS new_or_changed;

-- a role without the job type's worker_role: 42501 for the whole batch
CREATE ROLE regress_idem_batch_other;
GRANT USAGE ON SCHEMA idempotency TO regress_idem_batch_other;
GRANT EXECUTE ON FUNCTION idempotency.claim_operations(text, text[], text[], text, text[], boolean),
    idempotency.complete_operations(text, text[], integer[], jsonb[]) TO regress_idem_batch_other;
UPDATE idempotency.job_types SET worker_role = 'pg_monitor' WHERE job_type = 'send';
SET ROLE regress_idem_batch_other;
SELECT * FROM idempotency.claim_operations('send', ARRAY['K1']);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.claim_operations('send', ARRAY['NEW-1', 'NEW-2']);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.claim_operations('send', ARRAY['NEW-1', 'K1']);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.complete_operations('send', ARRAY['K3'], ARRAY[1]);
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
SELECT count(*) AS recorded FROM idempotency.operations WHERE operation_key LIKE 'NEW-%';
UPDATE idempotency.job_types SET worker_role = NULL WHERE job_type = 'send';

-- the transactional mode: claims, effects and completions commit together
CREATE TABLE invoices (order_ref text PRIMARY KEY);
BEGIN;
CREATE TEMP TABLE claimed AS
SELECT * FROM idempotency.claim_operations('send', ARRAY['INV-2', 'INV-1', 'K1']);
INSERT INTO invoices SELECT operation_key FROM claimed WHERE verdict = 'run';
SELECT * FROM idempotency.complete_operations('send',
    ARRAY(SELECT operation_key FROM claimed WHERE verdict = 'run' ORDER BY 1),
    ARRAY(SELECT attempt FROM claimed WHERE verdict = 'run' ORDER BY operation_key));
ROLLBACK;
SELECT count(*) AS invoices, (SELECT count(*) FROM idempotency.operations WHERE operation_key LIKE 'INV-%') AS records
FROM invoices;

DROP TABLE invoices, before_bad;
REVOKE ALL ON SCHEMA idempotency FROM regress_idem_batch_other;
DROP EXTENSION idempotency;
DROP ROLE regress_idem_batch_other;
