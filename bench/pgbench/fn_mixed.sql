-- mixed stream (implementations 2 and 3): 90 % new keys (run path),
-- 10 % duplicates of completed keys.
\set r random(1, 100)
\if :r <= 90
\set n :n + 1
\set k :base + :client_id * :stride + :n
SELECT verdict IN ('run', 'verify') AS go, attempt FROM @S@.claim_operation('send_confirmation', 'ORD-' || :k::text) \gset
\if :go
SELECT @S@.complete_operation('send_confirmation', 'ORD-' || :k::text, :attempt);
\endif
\else
\set d random(1, :dupn)
SELECT verdict IN ('run', 'verify') AS go, attempt FROM @S@.claim_operation('send_confirmation', 'DUP-' || :d::text) \gset
\if :go
SELECT @S@.complete_operation('send_confirmation', 'DUP-' || :d::text, :attempt);
\endif
\endif
