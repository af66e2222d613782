-- duplicate path with keys read from a lookup table first (breakdown c): the
-- completed keys of public.cb_dup_keys (a part of the DUP- pool) all hash to
-- shards on worker w1; see lk_run.sql. Needs -M prepared or extended.
-- Variables: ldupn (rows in public.cb_dup_keys).
\set i random(1, :ldupn)
SELECT k FROM public.cb_dup_keys WHERE i = :i \gset
SELECT verdict IN ('run', 'verify') AS go, attempt FROM idempotency.claim_operation('send_confirmation', :k) \gset
\if :go
SELECT idempotency.complete_operation('send_confirmation', :k, :attempt);
\endif
