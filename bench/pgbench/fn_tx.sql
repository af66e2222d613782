-- transactional path (implementations 2 and 3): claim, side-effect row and
-- completion in one transaction.
\set n :n + 1
\set k :base + :client_id * :stride + :n
BEGIN;
SELECT verdict IN ('run', 'verify') AS go, attempt FROM @S@.claim_operation('send_confirmation', 'ORD-' || :k::text) \gset
\if :go
INSERT INTO @SIDE@ (job_type, operation_key) VALUES ('send_confirmation', 'ORD-' || :k::text);
SELECT @S@.complete_operation('send_confirmation', 'ORD-' || :k::text, :attempt);
\endif
COMMIT;
