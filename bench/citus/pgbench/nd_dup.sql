-- duplicate path, the claim not delegated (breakdown b): fn_dup.sql with
-- "WHERE now() IS NOT NULL" (see nd_run.sql).
-- Variables: dupn (size of the pool DUP-1 .. DUP-dupn).
\set d random(1, :dupn)
SELECT verdict IN ('run', 'verify') AS go, attempt FROM idempotency.claim_operation('send_confirmation', 'DUP-' || :d::text) WHERE now() IS NOT NULL \gset
\if :go
SELECT idempotency.complete_operation('send_confirmation', 'DUP-' || :d::text, :attempt) WHERE now() IS NOT NULL;
\endif
