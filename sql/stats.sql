--
-- Monitoring: stale_claims() and the view job_type_stats.
--
\set SHOW_CONTEXT never
CREATE EXTENSION idempotency;

CREATE FUNCTION pg_temp.age_claim(k text, by interval) RETURNS void
LANGUAGE sql AS $$
    UPDATE idempotency.operations
    SET claimed_at = claimed_at - by, heartbeat_at = heartbeat_at - by
    WHERE operation_key = k
$$;

INSERT INTO idempotency.job_types (job_type, lease, stale_policy) VALUES
    ('emails', '10 minutes', 'hold'),
    ('webhooks', '1 minute', 'retry'),
    ('idle', '1 minute', 'skip');

SELECT count(*) FROM idempotency.stale_claims();
SELECT * FROM idempotency.job_type_stats ORDER BY job_type;

SELECT k, c.verdict FROM unnest(ARRAY['e1', 'e2', 'e3', 'e4', 'e5']) k,
    LATERAL idempotency.claim_operation('emails', k, NULL, 'worker-' || k) c;
SELECT k, c.verdict FROM unnest(ARRAY['w1', 'w2']) k,
    LATERAL idempotency.claim_operation('webhooks', k, NULL, 'worker-' || k) c;
SELECT idempotency.complete_operation('emails', 'e4', 1);
SELECT idempotency.release_operation('emails', 'e5', 1);

-- e1 ran out 50 minutes ago, w1 30 minutes ago, e2 5 minutes ago; e3 and w2 are young
SELECT pg_temp.age_claim('e1', '1 hour');
SELECT pg_temp.age_claim('w1', '31 minutes');
SELECT pg_temp.age_claim('e2', '15 minutes');

-- oldest first, whatever the job type
SELECT job_type, operation_key, attempt, claimed_by, stale_policy,
       date_trunc('minute', stale_for + interval '30 seconds') AS stale_for_minutes,
       lease_expired_at + stale_for BETWEEN clock_timestamp() - interval '1 minute' AND clock_timestamp() AS consistent
FROM idempotency.stale_claims();
SELECT operation_key FROM idempotency.stale_claims('emails');
SELECT operation_key FROM idempotency.stale_claims('idle');

SELECT job_type, stale_policy, lease, claimed, completed, released, skipped, stale,
       date_trunc('minute', clock_timestamp() - oldest_stale_claimed_at + interval '30 seconds') AS oldest_stale_age
FROM idempotency.job_type_stats ORDER BY job_type;

-- a heartbeat takes a claim off the list
SELECT idempotency.extend_lease('emails', 'e2', 1) IS NOT NULL AS extended;
SELECT operation_key FROM idempotency.stale_claims();

-- a takeover too: the new attempt is young
SELECT verdict, attempt FROM idempotency.claim_operation('webhooks', 'w1');
SELECT operation_key FROM idempotency.stale_claims();

DROP EXTENSION idempotency;
