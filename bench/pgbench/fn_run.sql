-- run path (implementations 2 and 3): claim a new key, then complete it;
-- two transactions, as for a job with an external effect.
-- Variables: n (per-client counter, -D n=0), base and stride (keys
-- base + client_id * stride + n, unique per cell).
\set n :n + 1
\set k :base + :client_id * :stride + :n
SELECT verdict IN ('run', 'verify') AS go, attempt FROM @S@.claim_operation('send_confirmation', 'ORD-' || :k::text) \gset
\if :go
SELECT @S@.complete_operation('send_confirmation', 'ORD-' || :k::text, :attempt);
\endif
