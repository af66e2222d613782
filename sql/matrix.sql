--
-- The seed's replay matrix, driven from SQL: seven ways a message arrives,
-- under each of the four stale-claim policies, with the emails each sends.
--
-- A worker is a procedure that commits after each step, so a "death" after
-- the claim or after the email leaves exactly what a killed process leaves.
-- The mail provider is the table outbox; a sent email is committed on its
-- own, before the completion, so the database cannot take it back. (The
-- process-level runner, idempotency-matrix, does the same with real worker
-- processes, SIGKILL and a provider outside the database.)
--
-- Time passing beyond the lease is simulated by moving the claim's lease
-- start back (pg_temp.age_claim); the isolation and TAP tests use real time.
--
\set SHOW_CONTEXT never
CREATE EXTENSION idempotency;

CREATE TABLE outbox (
    job_type      text NOT NULL,
    operation_key text NOT NULL,
    id            bigint GENERATED ALWAYS AS IDENTITY
);

CREATE FUNCTION pg_temp.age_claim(jt text, k text) RETURNS void
LANGUAGE sql AS $$
    UPDATE idempotency.operations o
    SET claimed_at = claimed_at - j.lease - interval '1 second',
        heartbeat_at = heartbeat_at - j.lease - interval '1 second'
    FROM idempotency.job_types j
    WHERE j.job_type = o.job_type AND o.job_type = jt AND o.operation_key = k
$$;

-- One delivery. dies: NULL (runs to the end), 'after_claim' (killed after
-- the claim committed, before the email), 'after_email' (killed after the
-- email left, before the completion).
CREATE PROCEDURE deliver(jt text, k text, dies text, INOUT verdict text DEFAULT NULL)
LANGUAGE plpgsql AS $$
DECLARE
    c record;
BEGIN
    SELECT * INTO c FROM idempotency.claim_operation(jt, k, 'fp-' || k, 'worker');
    verdict := c.verdict;
    COMMIT;
    IF c.verdict NOT IN ('run', 'verify') THEN
        RETURN;                         -- completed, in_progress, held, skipped: stop
    END IF;
    IF dies = 'after_claim' THEN
        RETURN;
    END IF;
    -- verify: look the operation up at the provider first (lookup policy)
    IF c.verdict = 'verify' AND EXISTS (SELECT 1 FROM outbox o
                                        WHERE o.job_type = jt AND o.operation_key = k) THEN
        PERFORM idempotency.complete_operation(jt, k, c.attempt, '{"found_by_lookup": true}');
        COMMIT;
        RETURN;
    END IF;
    INSERT INTO outbox (job_type, operation_key) VALUES (jt, k);
    COMMIT;                             -- the email has left
    IF dies = 'after_email' THEN
        RETURN;
    END IF;
    PERFORM idempotency.complete_operation(jt, k, c.attempt);
    COMMIT;
END
$$;

CREATE TABLE observed (
    policy   text,
    n        int,
    arrival  text,
    verdicts text,
    emails   text,
    record   text
);

-- Runs the seven cases for one policy and records what happened.
CREATE PROCEDURE run_matrix(policy idempotency.stale_policy)
LANGUAGE plpgsql AS $$
DECLARE
    jt text := 'send_confirmation_' || policy;
    v1 text;
    v2 text;
BEGIN
    INSERT INTO idempotency.job_types (job_type, lease, stale_policy)
    VALUES (jt, '10 minutes', policy);
    COMMIT;

    -- 1 first delivery
    CALL deliver(jt, 'ORD-1001', NULL, v1);
    INSERT INTO observed SELECT policy, 1, 'first delivery', v1,
        (SELECT count(*) FROM outbox WHERE job_type = jt AND operation_key = 'ORD-1001'),
        (SELECT status FROM idempotency.operations WHERE job_type = jt AND operation_key = 'ORD-1001');

    -- 2 same message again after success
    CALL deliver(jt, 'ORD-1001', NULL, v1);
    INSERT INTO observed SELECT policy, 2, 'same message again after success', v1,
        (SELECT count(*) FROM outbox WHERE job_type = jt AND operation_key = 'ORD-1001'),
        (SELECT status FROM idempotency.operations WHERE job_type = jt AND operation_key = 'ORD-1001');

    -- 3 same message to two workers at once: worker A holds the claim while
    -- worker B's delivery arrives (true simultaneity: isolation spec claim-race)
    SELECT verdict INTO v1 FROM idempotency.claim_operation(jt, 'ORD-1003', 'fp-ORD-1003', 'A');
    COMMIT;
    CALL deliver(jt, 'ORD-1003', NULL, v2);
    INSERT INTO outbox (job_type, operation_key) VALUES (jt, 'ORD-1003');
    PERFORM idempotency.complete_operation(jt, 'ORD-1003', 1);
    COMMIT;
    INSERT INTO observed SELECT policy, 3, 'same message to two workers at once', v1 || ' + ' || v2,
        (SELECT count(*) FROM outbox WHERE job_type = jt AND operation_key = 'ORD-1003'),
        (SELECT status FROM idempotency.operations WHERE job_type = jt AND operation_key = 'ORD-1003');

    -- 4 different order, similar data
    CALL deliver(jt, 'ORD-1002', NULL, v1);
    INSERT INTO observed SELECT policy, 4, 'different order ORD-1002, similar data', v1,
        (SELECT count(*) FROM outbox WHERE job_type = jt AND operation_key IN ('ORD-1001', 'ORD-1002')),
        (SELECT string_agg(status::text, ', ' ORDER BY operation_key) FROM idempotency.operations
         WHERE job_type = jt AND operation_key IN ('ORD-1001', 'ORD-1002'));

    -- 5 worker dies after the claim, before the email; redelivered after the lease
    CALL deliver(jt, 'ORD-1005', 'after_claim', v1);
    PERFORM pg_temp.age_claim(jt, 'ORD-1005');
    COMMIT;
    CALL deliver(jt, 'ORD-1005', NULL, v2);
    INSERT INTO observed SELECT policy, 5, 'worker dies after the claim, before the email', v1 || ' + ' || v2,
        (SELECT count(*) FROM outbox WHERE job_type = jt AND operation_key = 'ORD-1005'),
        (SELECT status FROM idempotency.operations WHERE job_type = jt AND operation_key = 'ORD-1005');

    -- 6 worker dies after the email, before completed; redelivered after the lease
    CALL deliver(jt, 'ORD-1006', 'after_email', v1);
    PERFORM pg_temp.age_claim(jt, 'ORD-1006');
    COMMIT;
    CALL deliver(jt, 'ORD-1006', NULL, v2);
    INSERT INTO observed SELECT policy, 6, 'worker dies after the email, before completed', v1 || ' + ' || v2,
        (SELECT count(*) FROM outbox WHERE job_type = jt AND operation_key = 'ORD-1006'),
        (SELECT status FROM idempotency.operations WHERE job_type = jt AND operation_key = 'ORD-1006');

    -- 7 redelivery of case 5 (and of case 6) inside the lease
    CALL deliver(jt, 'ORD-1007', 'after_claim', v1);
    CALL deliver(jt, 'ORD-1007', NULL, v2);
    CALL deliver(jt, 'ORD-1008', 'after_email', v1);
    CALL deliver(jt, 'ORD-1008', NULL, v1);
    INSERT INTO observed SELECT policy, 7, 'redelivery of case 5 or 6 inside the lease', v2 || ' / ' || v1,
        (SELECT count(*) FROM outbox WHERE job_type = jt AND operation_key = 'ORD-1007')::text
        || ' / ' || (SELECT count(*) FROM outbox WHERE job_type = jt AND operation_key = 'ORD-1008')::text,
        (SELECT string_agg(status::text || CASE WHEN heartbeat_at + interval '10 minutes' > clock_timestamp()
                                               THEN ' (young)' ELSE ' (stale)' END, ' / ' ORDER BY operation_key)
         FROM idempotency.operations WHERE job_type = jt AND operation_key IN ('ORD-1007', 'ORD-1008'));
    COMMIT;
END
$$;

CALL run_matrix('hold');
CALL run_matrix('retry');
CALL run_matrix('skip');
CALL run_matrix('lookup');

-- What the seed requires. Case 7's emails are those of a case 5 / a case 6
-- before the redelivery: 0 / 1, unchanged by it.
CREATE TABLE expected (policy text, n int, verdicts text, emails text, record text);
INSERT INTO expected
SELECT p, c.*
FROM unnest(ARRAY['hold', 'retry', 'skip', 'lookup']) p,
     (VALUES (1, 'run', '1', 'completed'),
             (2, 'completed', '1', 'completed'),
             (3, 'run + in_progress', '1', 'completed'),
             (4, 'run', '2', 'completed, completed'),
             (7, 'in_progress / in_progress', '0 / 1', 'claimed (young) / claimed (young)'))
     c(n, verdicts, emails, record)
UNION ALL VALUES
    ('hold',   5, 'run + held',    '0', 'claimed'),
    ('hold',   6, 'run + held',    '1', 'claimed'),
    ('retry',  5, 'run + run',     '1', 'completed'),
    ('retry',  6, 'run + run',     '2', 'completed'),
    ('skip',   5, 'run + skipped', '0', 'skipped'),
    ('skip',   6, 'run + skipped', '1', 'skipped'),
    ('lookup', 5, 'run + verify',  '1', 'completed'),
    ('lookup', 6, 'run + verify',  '1', 'completed');

SELECT o.policy, o.n AS "case", o.arrival, o.verdicts, o.emails, o.record,
       CASE WHEN (o.verdicts, o.emails, o.record) = (e.verdicts, e.emails, e.record)
            THEN 'pass' ELSE 'FAIL' END AS check
FROM observed o JOIN expected e USING (policy, n)
ORDER BY array_position(ARRAY['hold', 'retry', 'skip', 'lookup'], o.policy), o.n;

-- the seed's policy summary: emails sent in cases 5 and 6
SELECT policy,
       max(emails) FILTER (WHERE n = 5) AS case_5_emails,
       max(emails) FILTER (WHERE n = 6) AS case_6_emails
FROM observed GROUP BY policy
ORDER BY array_position(ARRAY['hold', 'retry', 'skip', 'lookup'], policy);

-- under hold, the two uncertain claims wait for a person
SELECT job_type, operation_key, attempt, stale_policy
FROM idempotency.stale_claims() ORDER BY job_type, operation_key;

DROP TABLE observed, expected, outbox;
DROP PROCEDURE run_matrix, deliver;
DROP EXTENSION idempotency;
