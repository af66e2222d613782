-- run path, the seed's recipe: INSERT ... ON CONFLICT DO NOTHING RETURNING id;
-- a row: ours, then UPDATE status = 'completed'; no row: read the record.
-- (The CTE only counts the returned rows for pgbench's \if.)
\set n :n + 1
\set k :base + :client_id * :stride + :n
WITH ins AS (INSERT INTO bench_raw.handled_operations (job_type, operation_key, status, claimed_at) VALUES ('send_confirmation', 'ORD-' || :k::text, 'claimed', now()) ON CONFLICT DO NOTHING RETURNING id) SELECT count(*) > 0 AS claimed, max(id) AS id FROM ins \gset
\if :claimed
UPDATE bench_raw.handled_operations SET status = 'completed' WHERE id = :id;
\else
SELECT status, claimed_at FROM bench_raw.handled_operations WHERE job_type = 'send_confirmation' AND operation_key = 'ORD-' || :k::text;
\endif
