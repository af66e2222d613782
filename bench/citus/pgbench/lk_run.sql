-- run path with keys read from a lookup table first (breakdown c): the keys
-- of public.cb_run_keys all hash to shards on worker w1, so a client
-- connected to w1 only calls for keys that w1 holds (Citus runs the call
-- there, no hop); a single node runs the same script on a copy of the
-- table. Needs -M prepared or extended (:k is a parameter).
-- Variables: n (-D n=0), lbase and lstride (row i = lbase + client_id *
-- lstride + n, unique per run).
\set n :n + 1
\set i :lbase + :client_id * :lstride + :n
SELECT k FROM public.cb_run_keys WHERE i = :i \gset
SELECT verdict IN ('run', 'verify') AS go, attempt FROM idempotency.claim_operation('send_confirmation', :k) \gset
\if :go
SELECT idempotency.complete_operation('send_confirmation', :k, :attempt);
\endif
