--
-- Rights: nothing is granted to PUBLIC; the README's GRANTs for a worker
-- role and an operator role give each exactly its calls.
--
\set SHOW_CONTEXT never
CREATE EXTENSION idempotency;
INSERT INTO idempotency.job_types (job_type, lease, stale_policy) VALUES ('send_confirmation', '1 minute', 'hold');

-- no object of the extension carries a grant to PUBLIC
SELECT count(*) AS public_grants FROM (
    SELECT (aclexplode(proacl)).grantee FROM pg_proc
    WHERE pronamespace = 'idempotency'::regnamespace
    UNION ALL
    SELECT (aclexplode(relacl)).grantee FROM pg_class
    WHERE relnamespace = 'idempotency'::regnamespace
    UNION ALL
    SELECT (aclexplode(nspacl)).grantee FROM pg_namespace
    WHERE nspname = 'idempotency') g
WHERE grantee = 0;
-- and every function has an explicit ACL (NULL would mean the default, EXECUTE for PUBLIC)
SELECT proname FROM pg_proc
WHERE pronamespace = 'idempotency'::regnamespace AND proacl IS NULL;

CREATE ROLE regress_idem_nobody;
CREATE ROLE regress_idem_worker;
CREATE ROLE regress_idem_operator;

-- the README's grants
GRANT USAGE ON SCHEMA idempotency TO regress_idem_worker, regress_idem_operator;
GRANT EXECUTE ON FUNCTION
    idempotency.claim_operation(text, text, text, text, text, boolean),
    idempotency.complete_operation(text, text, integer, jsonb),
    idempotency.release_operation(text, text, integer),
    idempotency.extend_lease(text, text, integer),
    idempotency.edition()
    TO regress_idem_worker;
GRANT EXECUTE ON FUNCTION
    idempotency.stale_claims(text),
    idempotency.resolve_operation(text, text, text, text),
    idempotency.purge_operations(integer),
    idempotency.purge_block_range(bigint, integer),
    idempotency.purge_refuse_transaction_block()
    TO regress_idem_operator;
GRANT EXECUTE ON PROCEDURE idempotency.purge(integer, interval, bigint) TO regress_idem_operator;
GRANT SELECT ON idempotency.job_type_stats, idempotency.operations, idempotency.resolutions
    TO regress_idem_operator;
GRANT SELECT, INSERT, UPDATE, DELETE ON idempotency.job_types TO regress_idem_operator;

-- a role with no grant can do nothing
SET ROLE regress_idem_nobody;
SELECT * FROM idempotency.claim_operation('send_confirmation', 'ORD-1001');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.operations;
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.edition();
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;

-- a worker asks which edition answers (both editions run this test:
-- upgrade_0_5 and test/portable check the names), claims, completes, releases, extends ...
SET ROLE regress_idem_worker;
SELECT edition IN ('c', 'portable') AS named, version ~ '^[0-9]+\.[0-9]+$' AS versioned FROM idempotency.edition();
SELECT * FROM idempotency.claim_operation('send_confirmation', 'ORD-1001', NULL, 'w');
SELECT idempotency.extend_lease('send_confirmation', 'ORD-1001', 1) IS NOT NULL AS extended;
SELECT idempotency.complete_operation('send_confirmation', 'ORD-1001', 1);
SELECT * FROM idempotency.claim_operation('send_confirmation', 'ORD-1002', NULL, 'w');
SELECT idempotency.release_operation('send_confirmation', 'ORD-1002', 1);
SELECT * FROM idempotency.claim_operation('send_confirmation', 'ORD-1003', NULL, 'w');
-- ... and stays itself: the owner's rights end with each call, also after a caught error
SELECT current_user;
DO $$
BEGIN
    PERFORM idempotency.complete_operation('send_confirmation', 'ORD-1001', 7);
EXCEPTION WHEN SQLSTATE '22023' THEN
    RAISE NOTICE 'caught %', SQLSTATE;
END
$$;
SELECT current_user;
-- but cannot touch the records or the configuration directly
UPDATE idempotency.operations SET status = 'completed';
\echo :LAST_ERROR_SQLSTATE
DELETE FROM idempotency.operations;
\echo :LAST_ERROR_SQLSTATE
INSERT INTO idempotency.operations (job_type, operation_key, status, attempt, claimed_at, heartbeat_at)
VALUES ('send_confirmation', 'forged', 'completed', 1, now(), now());
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) FROM idempotency.operations;
\echo :LAST_ERROR_SQLSTATE
UPDATE idempotency.job_types SET stale_policy = 'retry';
\echo :LAST_ERROR_SQLSTATE
-- nor take an operator's decisions
SELECT * FROM idempotency.stale_claims();
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.resolve_operation('send_confirmation', 'ORD-1003', 'completed');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.purge_operations();
\echo :LAST_ERROR_SQLSTATE
CALL idempotency.purge();
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.purge_block_range(0, 10);
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;

-- the operator reads, decides and configures, but does not claim
UPDATE idempotency.operations SET heartbeat_at = heartbeat_at - interval '2 minutes'
WHERE operation_key = 'ORD-1003';
SET ROLE regress_idem_operator;
SELECT operation_key, claimed_by FROM idempotency.stale_claims();
SELECT job_type, claimed, completed, released, stale FROM idempotency.job_type_stats;
SELECT idempotency.resolve_operation('send_confirmation', 'ORD-1003', 'completed', 'seen in the provider log');
SELECT operation_key, resolution, resolved_by FROM idempotency.resolutions;
UPDATE idempotency.job_types SET retention = '30 days';
SELECT idempotency.purge_operations();
CALL idempotency.purge();
SELECT * FROM idempotency.claim_operation('send_confirmation', 'ORD-1004');
\echo :LAST_ERROR_SQLSTATE
UPDATE idempotency.operations SET status = 'released';
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;

SELECT operation_key, status, attempt, claimed_by FROM idempotency.operations ORDER BY 1;

DROP EXTENSION idempotency;
DROP ROLE regress_idem_nobody, regress_idem_worker, regress_idem_operator;
