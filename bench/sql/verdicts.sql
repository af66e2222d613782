-- bench/sql/verdicts.sql: one scripted sequence of calls, run against each
-- edition (psql variable S: its schema; each in its own database) by
-- bench/run.sh, which requires identical output. It prints verdicts,
-- attempts, results and the SQLSTATE of each refused call (the messages may
-- differ), so the portable edition is shown to implement the same contract
-- as the extension before its speed is compared.
\set ON_ERROR_STOP 0
\set QUIET 1
\pset footer off
\pset tuples_only on
\pset format unaligned

INSERT INTO :S.job_types (job_type, lease, stale_policy, max_attempts) VALUES
    ('eq_hold', '10 minutes', 'hold', NULL),
    ('eq_retry', '10 minutes', 'retry', 3),
    ('eq_skip', '10 minutes', 'skip', NULL),
    ('eq_lookup', '10 minutes', 'lookup', NULL);

\echo new key, repeat inside the lease, completion, duplicate, repeated completion
SELECT verdict, attempt, result FROM :S.claim_operation('eq_hold', 'k1', 'fp1', 'w1');
SELECT verdict, attempt, result FROM :S.claim_operation('eq_hold', 'k1', 'fp1', 'w2');
SELECT :S.complete_operation('eq_hold', 'k1', 1, '{"message_id": 7}');
SELECT verdict, attempt, result FROM :S.claim_operation('eq_hold', 'k1');
SELECT :S.complete_operation('eq_hold', 'k1', 1, '{"message_id": 8}');
SELECT verdict, attempt, result FROM :S.claim_operation('eq_hold', 'k1', 'fp1');
\echo fingerprint mismatch
SELECT verdict FROM :S.claim_operation('eq_hold', 'k1', 'fp2');
\echo :LAST_ERROR_SQLSTATE

\echo stale claims, one per policy, and one out of attempts
INSERT INTO :S.operations (job_type, operation_key, status, attempt, claimed_at, heartbeat_at)
SELECT j, k, 'claimed', a, now() - interval '1 hour', now() - interval '1 hour'
FROM (VALUES ('eq_hold', 's1', 1), ('eq_retry', 's1', 1), ('eq_retry', 's2', 3),
             ('eq_skip', 's1', 1), ('eq_lookup', 's1', 1)) v(j, k, a);
SELECT job_type, operation_key, attempt, stale_policy::text FROM :S.stale_claims() ORDER BY 1, 2;
SELECT operation_key, attempt FROM :S.stale_claims('eq_retry') ORDER BY 1;
SELECT verdict, attempt FROM :S.claim_operation('eq_hold', 's1');
SELECT verdict, attempt FROM :S.claim_operation('eq_retry', 's1');
SELECT verdict, attempt FROM :S.claim_operation('eq_retry', 's1');
SELECT verdict, attempt FROM :S.claim_operation('eq_retry', 's2');
SELECT verdict, attempt FROM :S.claim_operation('eq_skip', 's1');
SELECT verdict, attempt FROM :S.claim_operation('eq_skip', 's1');
SELECT verdict, attempt FROM :S.claim_operation('eq_lookup', 's1');
SELECT count(*) FROM :S.stale_claims();

\echo fencing: the superseded attempt is refused (ID003), one never issued too (22023), the current one completes
SELECT :S.complete_operation('eq_retry', 's1', 1);
\echo :LAST_ERROR_SQLSTATE
SELECT :S.complete_operation('eq_retry', 's1', 3);
\echo :LAST_ERROR_SQLSTATE
SELECT :S.complete_operation('eq_retry', 's1', 2, '"ok"');
SELECT verdict, attempt, result FROM :S.claim_operation('eq_retry', 's1');
\echo a skipped record may still be completed by its slow worker
SELECT :S.complete_operation('eq_skip', 's1', 1);
SELECT verdict, attempt FROM :S.claim_operation('eq_skip', 's1');

\echo release: the next claim runs with attempt + 1; extend
SELECT verdict, attempt FROM :S.claim_operation('eq_hold', 'r1');
SELECT :S.release_operation('eq_hold', 'r1', 1);
SELECT :S.release_operation('eq_hold', 'r1', 1);
SELECT verdict, attempt FROM :S.claim_operation('eq_hold', 'r1');
SELECT :S.extend_lease('eq_hold', 'r1', 2) > now();
SELECT :S.extend_lease('eq_hold', 'r1', 1);
\echo :LAST_ERROR_SQLSTATE
SELECT :S.complete_operation('eq_hold', 'r1', 2);
SELECT :S.release_operation('eq_hold', 'r1', 2);
\echo :LAST_ERROR_SQLSTATE

\echo bad input
SELECT verdict FROM :S.claim_operation(NULL, 'x');
\echo :LAST_ERROR_SQLSTATE
SELECT verdict FROM :S.claim_operation('eq_hold', '');
\echo :LAST_ERROR_SQLSTATE
SELECT verdict FROM :S.claim_operation('eq_hold', repeat('x', 1025));
\echo :LAST_ERROR_SQLSTATE
SELECT verdict FROM :S.claim_operation('nope', 'x');
\echo :LAST_ERROR_SQLSTATE
SELECT :S.complete_operation('eq_hold', 'never', 1);
\echo :LAST_ERROR_SQLSTATE
SELECT :S.complete_operation('eq_hold', 'k1', 0);
\echo :LAST_ERROR_SQLSTATE
SELECT :S.complete_operation('eq_hold', 'k1', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT :S.complete_operation('nope', 'k1', 1);
\echo :LAST_ERROR_SQLSTATE

\echo records
SELECT job_type, operation_key, status::text, attempt, result FROM :S.operations ORDER BY 1, 2;
