-- lk_dup.sql through the calls in place (0.4; see ip_run.sql), for the
-- clients on w1 (target w1ip): completed keys of public.cb_dup_keys, all on
-- w1. Needs -M prepared or extended.
-- Variables: ldupn (rows in public.cb_dup_keys).
\set i random(1, :ldupn)
SELECT k FROM public.cb_dup_keys WHERE i = :i \gset
SELECT verdict IN ('run', 'verify') AS go, attempt FROM idempotency.claim_operation_in_place('send_confirmation', :k) \gset
\if :go
SELECT idempotency.complete_operation_in_place('send_confirmation', :k, :attempt);
\endif
