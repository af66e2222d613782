-- stale takeover (implementations 2 and 3): claim a claim older than its
-- lease under policy retry (verdict run, attempt 2), then complete it.
-- The pool STALE-<cell>-<client * 1000000 + n> is made by bench/run.sh.
\set n :n + 1
\set k :client_id * 1000000 + :n
SELECT verdict IN ('run', 'verify') AS go, attempt FROM @S@.claim_operation('stale_retry', 'STALE-' || :cell::text || '-' || :k::text) \gset
\if :go
SELECT @S@.complete_operation('stale_retry', 'STALE-' || :cell::text || '-' || :k::text, :attempt);
\endif
