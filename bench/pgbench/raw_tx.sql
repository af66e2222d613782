-- transactional path, the seed's recipe: claim, side-effect row and the
-- status change in one transaction.
\set n :n + 1
\set k :base + :client_id * :stride + :n
BEGIN;
WITH ins AS (INSERT INTO bench_raw.handled_operations (job_type, operation_key, status, claimed_at) VALUES ('send_confirmation', 'ORD-' || :k::text, 'claimed', now()) ON CONFLICT DO NOTHING RETURNING id) SELECT count(*) > 0 AS claimed, max(id) AS id FROM ins \gset
\if :claimed
INSERT INTO bench_raw.side_effects (job_type, operation_key) VALUES ('send_confirmation', 'ORD-' || :k::text);
UPDATE bench_raw.handled_operations SET status = 'completed' WHERE id = :id;
\else
SELECT status, claimed_at FROM bench_raw.handled_operations WHERE job_type = 'send_confirmation' AND operation_key = 'ORD-' || :k::text;
\endif
COMMIT;
