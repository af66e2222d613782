-- duplicate path, the seed's recipe: the INSERT conflicts (and consumes a
-- value of the identity sequence), then the record is read.
\set d random(1, :dupn)
WITH ins AS (INSERT INTO bench_raw.handled_operations (job_type, operation_key, status, claimed_at) VALUES ('send_confirmation', 'DUP-' || :d::text, 'claimed', now()) ON CONFLICT DO NOTHING RETURNING id) SELECT count(*) > 0 AS claimed, max(id) AS id FROM ins \gset
\if :claimed
UPDATE bench_raw.handled_operations SET status = 'completed' WHERE id = :id;
\else
SELECT status, claimed_at FROM bench_raw.handled_operations WHERE job_type = 'send_confirmation' AND operation_key = 'DUP-' || :d::text;
\endif
