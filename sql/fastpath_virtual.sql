--
-- PostgreSQL 18's virtual generated columns and the fast update
-- (src/probe.c, fast_update_covers()): a virtual column is computed on
-- read, but a NOT NULL on it is checked by the executor on every write,
-- which a direct table_tuple_update() would skip. So the fast update steps
-- aside for any table with a virtual generated column, and the executor's
-- UPDATE refuses a completion that makes the column NULL (23502), the
-- record left as it was. Before 18 there are no virtual generated columns:
-- the test says so and does nothing (expected/fastpath_virtual_1.out).
--
\set SHOW_CONTEXT never
SELECT current_setting('server_version_num')::int >= 180000 AS pg18 \gset
\if :pg18
CREATE EXTENSION idempotency;
INSERT INTO idempotency.job_types (job_type, lease) VALUES ('send_confirmation', '1 minute');
SELECT verdict, attempt FROM idempotency.claim_operation('send_confirmation', 'ORD-1001');
SELECT verdict, attempt FROM idempotency.claim_operation('send_confirmation', 'ORD-1002');
-- NULL for a completed record without a result: not allowed (a virtual
-- column's expression may not use the status, an enum: 18 refuses
-- user-defined types there)
ALTER TABLE idempotency.operations ADD COLUMN has_result boolean
    GENERATED ALWAYS AS (CASE WHEN completed_at IS NULL OR result IS NOT NULL THEN true END) VIRTUAL NOT NULL;
DO $$
BEGIN
    PERFORM idempotency.complete_operation('send_confirmation', 'ORD-1001', 1, NULL);
    RAISE NOTICE 'completed';
EXCEPTION WHEN OTHERS THEN
    RAISE NOTICE 'refused: %', SQLSTATE;
END
$$;
SELECT operation_key, status, result, has_result FROM idempotency.operations ORDER BY 1;
SELECT idempotency.complete_operation('send_confirmation', 'ORD-1001', 1, '{"sent": true}');
-- a virtual column without NOT NULL: computed on read after the completion
ALTER TABLE idempotency.operations DROP COLUMN has_result;
ALTER TABLE idempotency.operations ADD COLUMN done boolean
    GENERATED ALWAYS AS (completed_at IS NOT NULL) VIRTUAL;
SELECT idempotency.complete_operation('send_confirmation', 'ORD-1002', 1);
SELECT operation_key, status, result, done FROM idempotency.operations ORDER BY 1;
ALTER TABLE idempotency.operations DROP COLUMN done;
-- and without the column, the same completion repeated is answered as done
SELECT idempotency.complete_operation('send_confirmation', 'ORD-1002', 1);
DROP EXTENSION idempotency;
\else
\echo 'PostgreSQL before 18: no virtual generated columns'
\endif
