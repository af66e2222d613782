-- stale takeover, the seed's recipe with the "send again after the lease"
-- policy: the INSERT conflicts, the record is read, a claim older than the
-- lease (10 minutes, written into the statement) is taken over with a
-- compare-and-swap on claimed_at, then completed. No attempt, no fencing.
\set n :n + 1
\set k :client_id * 1000000 + :n
WITH ins AS (INSERT INTO bench_raw.handled_operations (job_type, operation_key, status, claimed_at) VALUES ('stale_retry', 'STALE-' || :cell::text || '-' || :k::text, 'claimed', now()) ON CONFLICT DO NOTHING RETURNING id) SELECT count(*) > 0 AS claimed, max(id) AS id FROM ins \gset
\if :claimed
UPDATE bench_raw.handled_operations SET status = 'completed' WHERE id = :id;
\else
SELECT id, status = 'claimed' AND claimed_at < now() - interval '10 minutes' AS stale FROM bench_raw.handled_operations WHERE job_type = 'stale_retry' AND operation_key = 'STALE-' || :cell::text || '-' || :k::text \gset
\if :stale
WITH up AS (UPDATE bench_raw.handled_operations SET claimed_at = now() WHERE id = :id AND status = 'claimed' AND claimed_at < now() - interval '10 minutes' RETURNING 1) SELECT count(*) > 0 AS took FROM up \gset
\if :took
UPDATE bench_raw.handled_operations SET status = 'completed' WHERE id = :id;
\endif
\endif
\endif
