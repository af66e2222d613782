--
-- Stale claims: what each policy answers, max_attempts, and what the
-- record becomes.
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
    ('hold_job',   '1 minute', 'hold',   NULL),
    ('retry_job',  '1 minute', 'retry',  2),
    ('skip_job',   '1 minute', 'skip',   NULL),
    ('lookup_job', '1 minute', 'lookup', 3);

-- one stale claim per policy
SELECT jt, (SELECT verdict FROM idempotency.claim_operation(jt, 'K', NULL, 'first')) AS first_claim
FROM unnest(ARRAY['hold_job', 'retry_job', 'skip_job', 'lookup_job']) jt;
SELECT pg_temp.age_claim('K');
SELECT job_type, operation_key, attempt, claimed_by, stale_policy, stale_for > interval '0' AS past_lease
FROM idempotency.stale_claims() ORDER BY job_type;

-- the redelivery after the lease
SELECT jt, c.* FROM unnest(ARRAY['hold_job', 'retry_job', 'skip_job', 'lookup_job']) jt,
     LATERAL idempotency.claim_operation(jt, 'K', NULL, 'second') c;
SELECT job_type, status, attempt, claimed_by, completed_at IS NOT NULL AS finished
FROM idempotency.operations ORDER BY job_type;

-- hold: every further delivery is held; the record stays claimed
SELECT * FROM idempotency.claim_operation('hold_job', 'K');
SELECT status, attempt FROM idempotency.operations WHERE job_type = 'hold_job';
-- skip: skipped for good
SELECT * FROM idempotency.claim_operation('skip_job', 'K');
-- retry and lookup: the new claim is young: in_progress
SELECT * FROM idempotency.claim_operation('retry_job', 'K');
SELECT * FROM idempotency.claim_operation('lookup_job', 'K');

-- max_attempts: retry_job allows 2 attempts; the second one dies too
SELECT pg_temp.age_claim('K');
SELECT jt, c.* FROM unnest(ARRAY['retry_job', 'lookup_job']) jt,
     LATERAL idempotency.claim_operation(jt, 'K', NULL, 'third') c;
-- lookup_job allows 3: the fourth is held
SELECT pg_temp.age_claim('K');
SELECT jt, c.* FROM unnest(ARRAY['retry_job', 'lookup_job']) jt,
     LATERAL idempotency.claim_operation(jt, 'K', NULL, 'fourth') c;
SELECT job_type, status, attempt, claimed_by FROM idempotency.operations
WHERE job_type IN ('retry_job', 'lookup_job') ORDER BY job_type;
-- raising max_attempts lets the next delivery take over again
UPDATE idempotency.job_types SET max_attempts = 3 WHERE job_type = 'retry_job';
SELECT * FROM idempotency.claim_operation('retry_job', 'K', NULL, 'fifth');

-- the policy is read at every claim: changing it applies to claims already stale
SELECT * FROM idempotency.claim_operation('hold_job', 'L');
SELECT pg_temp.age_claim('L');
SELECT verdict FROM idempotency.claim_operation('hold_job', 'L');
UPDATE idempotency.job_types SET stale_policy = 'retry' WHERE job_type = 'hold_job';
SELECT * FROM idempotency.claim_operation('hold_job', 'L');

-- so is the lease: a longer lease makes a stale claim young again
SELECT * FROM idempotency.claim_operation('skip_job', 'M');
SELECT pg_temp.age_claim('M');
UPDATE idempotency.job_types SET lease = '1 hour' WHERE job_type = 'skip_job';
SELECT * FROM idempotency.claim_operation('skip_job', 'M');
SELECT count(*) FROM idempotency.stale_claims('skip_job');

-- a fingerprint mismatch is an error on a stale claim too, before any takeover
SELECT * FROM idempotency.claim_operation('lookup_job', 'N', 'fp-1');
SELECT pg_temp.age_claim('N');
SELECT * FROM idempotency.claim_operation('lookup_job', 'N', 'fp-2');
\echo :LAST_ERROR_SQLSTATE
SELECT status, attempt, fingerprint FROM idempotency.operations WHERE operation_key = 'N';
SELECT * FROM idempotency.claim_operation('lookup_job', 'N', 'fp-1');

DROP EXTENSION idempotency;
