-- lk_run.sql through the calls in place (0.4: claim_operation_in_place,
-- complete_operation_in_place, which Citus does not delegate and so plans as
-- plain function calls: generic plans with -M prepared), for the clients on
-- w1 (target w1ip). The keys of public.cb_run_keys all hash to shards on w1.
-- Variables: n (-D n=0), lbase and lstride (row i = lbase + client_id *
-- lstride + n, unique per run).
\set n :n + 1
\set i :lbase + :client_id * :lstride + :n
SELECT k FROM public.cb_run_keys WHERE i = :i \gset
SELECT verdict IN ('run', 'verify') AS go, attempt FROM idempotency.claim_operation_in_place('send_confirmation', :k) \gset
\if :go
SELECT idempotency.complete_operation_in_place('send_confirmation', :k, :attempt);
\endif
