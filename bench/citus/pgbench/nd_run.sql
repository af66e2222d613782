-- run path, the calls not delegated (breakdown b): the same two autocommit
-- calls as fn_run.sql with "WHERE now() IS NOT NULL" added, which Citus does
-- not push down (it delegates only SELECT f(...) and SELECT ... FROM f(...)
-- without a WHERE clause; a constant "WHERE true" is folded away before it
-- looks, and is delegated): the function runs on the node the client is
-- connected to and Citus routes each of its SPI statements to the shard of
-- the key. On a single node the clause changes nothing.
-- Variables: as fn_run.sql (n, base, stride).
\set n :n + 1
\set k :base + :client_id * :stride + :n
SELECT verdict IN ('run', 'verify') AS go, attempt FROM idempotency.claim_operation('send_confirmation', 'ORD-' || :k::text) WHERE now() IS NOT NULL \gset
\if :go
SELECT idempotency.complete_operation('send_confirmation', 'ORD-' || :k::text, :attempt) WHERE now() IS NOT NULL;
\endif
