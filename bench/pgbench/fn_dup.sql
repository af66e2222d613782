-- duplicate path (implementations 2 and 3): claim a key that is completed.
-- Variables: dupn (size of the pool DUP-1 .. DUP-dupn).
\set d random(1, :dupn)
SELECT verdict IN ('run', 'verify') AS go, attempt FROM @S@.claim_operation('send_confirmation', 'DUP-' || :d::text) \gset
\if :go
SELECT @S@.complete_operation('send_confirmation', 'DUP-' || :d::text, :attempt);
\endif
