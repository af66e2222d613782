-- run path without the extension (breakdown a): the two row writes a claim
-- and a completion make, as plain statements on the extension's table: the
-- INSERT of a claimed record, then its UPDATE to completed by the primary
-- key; two autocommit statements, as the run path's two calls. On Citus each
-- statement is routed by the coordinator to the shard of its key.
-- Variables: n (per-client counter, -D n=0), base and stride (keys
-- base + client_id * stride + n, unique per run).
\set n :n + 1
\set k :base + :client_id * :stride + :n
INSERT INTO idempotency.operations (job_type, operation_key, status, attempt, claimed_at, heartbeat_at) VALUES ('send_confirmation', 'SQL-' || :k::text, 'claimed', 1, now(), now());
UPDATE idempotency.operations SET status = 'completed', completed_at = now() WHERE job_type = 'send_confirmation' AND operation_key = 'SQL-' || :k::text AND attempt = 1;
