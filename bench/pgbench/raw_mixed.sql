-- mixed stream, the seed's recipe: 90 % new keys, 10 % duplicates.
\set r random(1, 100)
\if :r <= 90
\set n :n + 1
\set k :base + :client_id * :stride + :n
WITH ins AS (INSERT INTO bench_raw.handled_operations (job_type, operation_key, status, claimed_at) VALUES ('send_confirmation', 'ORD-' || :k::text, 'claimed', now()) ON CONFLICT DO NOTHING RETURNING id) SELECT count(*) > 0 AS claimed, max(id) AS id FROM ins \gset
\if :claimed
UPDATE bench_raw.handled_operations SET status = 'completed' WHERE id = :id;
\else
SELECT status, claimed_at FROM bench_raw.handled_operations WHERE job_type = 'send_confirmation' AND operation_key = 'ORD-' || :k::text;
\endif
\else
\set d random(1, :dupn)
WITH ins AS (INSERT INTO bench_raw.handled_operations (job_type, operation_key, status, claimed_at) VALUES ('send_confirmation', 'DUP-' || :d::text, 'claimed', now()) ON CONFLICT DO NOTHING RETURNING id) SELECT count(*) > 0 AS claimed, max(id) AS id FROM ins \gset
\if :claimed
UPDATE bench_raw.handled_operations SET status = 'completed' WHERE id = :id;
\else
SELECT status, claimed_at FROM bench_raw.handled_operations WHERE job_type = 'send_confirmation' AND operation_key = 'DUP-' || :d::text;
\endif
\endif
