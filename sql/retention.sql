--
-- purge_operations(): finished records past their job type's retention go;
-- everything else stays.
--
\set SHOW_CONTEXT never
CREATE EXTENSION idempotency;

CREATE FUNCTION pg_temp.age_record(k text, by interval) RETURNS void
LANGUAGE sql AS $$
    UPDATE idempotency.operations
    SET claimed_at = claimed_at - by, heartbeat_at = heartbeat_at - by,
        completed_at = completed_at - by
    WHERE operation_key = k
$$;

INSERT INTO idempotency.job_types (job_type, lease, stale_policy, retention) VALUES
    ('kept_a_week', '1 minute', 'skip', '7 days'),
    ('kept_forever', '1 minute', 'skip', NULL);

-- in each job type: completed, skipped, released, claimed (stale) records, 8 days old
SELECT jt, k, (SELECT verdict FROM idempotency.claim_operation(jt, k)) AS claimed
FROM unnest(ARRAY['kept_a_week', 'kept_forever']) jt,
     unnest(ARRAY['completed', 'skipped', 'released', 'claimed', 'completed-recently']) k;
SELECT idempotency.complete_operation(jt, k, 1)
FROM unnest(ARRAY['kept_a_week', 'kept_forever']) jt, unnest(ARRAY['completed', 'completed-recently']) k;
SELECT idempotency.release_operation(jt, 'released', 1)
FROM unnest(ARRAY['kept_a_week', 'kept_forever']) jt;
SELECT pg_temp.age_record('skipped', '2 minutes');
SELECT jt, (SELECT verdict FROM idempotency.claim_operation(jt, 'skipped')) AS redelivery
FROM unnest(ARRAY['kept_a_week', 'kept_forever']) jt;
SELECT pg_temp.age_record(k, '8 days')
FROM unnest(ARRAY['completed', 'skipped', 'released', 'claimed']) k;

SELECT job_type, operation_key, status FROM idempotency.operations ORDER BY 1, 2;

-- only kept_a_week's completed and skipped records past 7 days go
SELECT idempotency.purge_operations();
SELECT job_type, operation_key, status FROM idempotency.operations ORDER BY 1, 2;
-- nothing left to purge
SELECT idempotency.purge_operations();

-- a purged key is new again: the next delivery runs
SELECT verdict, attempt FROM idempotency.claim_operation('kept_a_week', 'completed');

-- batches smaller than the work: all of it goes, one DELETE per batch
SELECT count(*) FROM (
    SELECT idempotency.claim_operation('kept_a_week', 'bulk-' || i) FROM generate_series(1, 25) i) c;
SELECT count(*) FROM (
    SELECT idempotency.complete_operation('kept_a_week', 'bulk-' || i, 1) FROM generate_series(1, 25) i) c;
UPDATE idempotency.operations SET completed_at = completed_at - interval '8 days'
WHERE operation_key LIKE 'bulk-%';
SELECT idempotency.purge_operations(4);
SELECT count(*) FROM idempotency.operations WHERE operation_key LIKE 'bulk-%';

-- retention can change at any time; a shorter one applies at the next purge
UPDATE idempotency.job_types SET retention = '1 hour' WHERE job_type = 'kept_a_week';
SELECT pg_temp.age_record('completed-recently', '2 hours');
SELECT idempotency.purge_operations();
SELECT job_type, operation_key, status FROM idempotency.operations ORDER BY 1, 2;

DROP EXTENSION idempotency;
