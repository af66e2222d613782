--
-- Bad input: each gets a clear error with its own SQLSTATE (printed after
-- it), and nothing recorded changes.
--
\set SHOW_CONTEXT never
CREATE EXTENSION idempotency;
INSERT INTO idempotency.job_types (job_type) VALUES ('send_confirmation');
SELECT verdict FROM idempotency.claim_operation('send_confirmation', 'ORD-1001', 'fp');
SELECT idempotency.complete_operation('send_confirmation', 'ORD-1001', 1, '{"ok": true}');
SELECT verdict FROM idempotency.claim_operation('send_confirmation', 'ORD-1002');

CREATE TEMP TABLE before AS SELECT * FROM idempotency.operations;

-- NULL or empty job type or key: 22004, 22023
SELECT * FROM idempotency.claim_operation(NULL, 'ORD-1001');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.claim_operation('send_confirmation', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.claim_operation('', 'ORD-1001');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.claim_operation('send_confirmation', '');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.complete_operation(NULL, 'ORD-1002', 1);
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.release_operation('send_confirmation', '', 1);
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.extend_lease('send_confirmation', NULL, 1);
\echo :LAST_ERROR_SQLSTATE

-- an unregistered job type: ID001, with a hint on how to register it
SELECT * FROM idempotency.claim_operation('send_invoice', 'INV-1');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.complete_operation('send_invoice', 'INV-1', 1);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.stale_claims('send_invoice');
\echo :LAST_ERROR_SQLSTATE

-- too long: a key over 1024 bytes, a job type over 128 bytes: 22001
SELECT * FROM idempotency.claim_operation('send_confirmation', repeat('k', 1025));
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.claim_operation('send_confirmation', repeat('é', 513));
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idempotency.claim_operation(repeat('j', 129), 'ORD-1001');
\echo :LAST_ERROR_SQLSTATE

-- same key, different data: ID002
SELECT * FROM idempotency.claim_operation('send_confirmation', 'ORD-1001', 'other-fp');
\echo :LAST_ERROR_SQLSTATE

-- attempts: NULL 22004, zero or negative 22023, one no claim returned 22023
-- (a superseded attempt is ID003: complete.sql)
SELECT idempotency.complete_operation('send_confirmation', 'ORD-1002', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.complete_operation('send_confirmation', 'ORD-1002', 0);
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.release_operation('send_confirmation', 'ORD-1002', -1);
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.extend_lease('send_confirmation', 'ORD-1002', 2);
\echo :LAST_ERROR_SQLSTATE

-- a key that was never claimed: ID004
SELECT idempotency.complete_operation('send_confirmation', 'ORD-9999', 1);
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.resolve_operation('send_confirmation', 'ORD-9999', 'completed');
\echo :LAST_ERROR_SQLSTATE

-- resolutions: NULL 22004, unknown 22023, a record not waiting for a decision ID005
SELECT idempotency.resolve_operation('send_confirmation', 'ORD-1002', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.resolve_operation('send_confirmation', 'ORD-1002', 'done');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.resolve_operation('send_confirmation', 'ORD-1002', 'completed');
\echo :LAST_ERROR_SQLSTATE

-- purge: batch_size NULL 22004, not positive 22023
SELECT idempotency.purge_operations(NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.purge_operations(0);
\echo :LAST_ERROR_SQLSTATE

-- a read-only transaction: 25006, before anything is read
BEGIN READ ONLY;
SELECT * FROM idempotency.claim_operation('send_confirmation', 'ORD-1001');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN READ ONLY;
SELECT count(*) FROM idempotency.stale_claims();
ROLLBACK;

-- an error inside a transaction that the caller catches leaves the
-- transaction usable and the records unchanged
DO $$
BEGIN
    PERFORM idempotency.claim_operation('send_confirmation', 'ORD-1001', 'other-fp');
EXCEPTION WHEN SQLSTATE 'ID002' THEN
    RAISE NOTICE 'caught %: %', SQLSTATE, SQLERRM;
END
$$;

-- nothing recorded changed
SELECT count(*) AS changed_rows FROM (
    (SELECT * FROM idempotency.operations EXCEPT SELECT * FROM before)
    UNION ALL
    (SELECT * FROM before EXCEPT SELECT * FROM idempotency.operations)) d;
SELECT count(*) AS records FROM idempotency.operations;

DROP TABLE before;
DROP EXTENSION idempotency;
