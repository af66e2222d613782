-- run path with each call in a transaction block of its own (breakdown b):
-- BEGIN; claim; COMMIT; BEGIN; complete; COMMIT. On Citus a call in a
-- transaction block is delegated only if its function was distributed with
-- force_delegation (distribute() does so since commit f997175): then the
-- coordinator sends BEGIN, the call and COMMIT to the worker holding the
-- key; without it the call runs on the coordinator and its SPI statements
-- are routed one by one (the verify step says which happened).
-- Variables: as fn_run.sql (n, base, stride).
\set n :n + 1
\set k :base + :client_id * :stride + :n
BEGIN;
SELECT verdict IN ('run', 'verify') AS go, attempt FROM idempotency.claim_operation('send_confirmation', 'ORD-' || :k::text) \gset
COMMIT;
\if :go
BEGIN;
SELECT idempotency.complete_operation('send_confirmation', 'ORD-' || :k::text, :attempt);
COMMIT;
\endif
