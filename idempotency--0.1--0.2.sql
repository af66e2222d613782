/* idempotency--0.1--0.2.sql */

-- complain if script is sourced in psql, rather than via CREATE EXTENSION
\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.2'" to load this file. \quit

--
-- Per-job-type roles
--
-- A job type can name the role that works it. The four worker functions
-- then refuse (SQLSTATE 42501) a caller without that role's privileges
-- before they read or change anything of the job type's operations, so one
-- tenant's workers cannot claim, complete, release, extend or read another
-- tenant's operations. The check is in C (see idem_worker_lookup() in
-- src/idempotency.c); the 0.1 definitions call entry points that do not
-- check, because their job_types has no worker_role column. CREATE OR
-- REPLACE keeps each function's OID, owner, grants and comment.
--

ALTER TABLE idempotency.job_types ADD COLUMN worker_role regrole;
COMMENT ON COLUMN idempotency.job_types.worker_role IS
'The role that works this job type: only it and the roles that have its privileges (members that inherit it, superusers) may claim, complete, release or extend its operations; others get SQLSTATE 42501. NULL: any role with EXECUTE on the worker functions';

CREATE OR REPLACE FUNCTION idempotency.claim_operation(
    job_type text,
    operation_key text,
    fingerprint text DEFAULT NULL,
    worker text DEFAULT NULL)
RETURNS TABLE (verdict text, attempt integer, result jsonb)
AS 'MODULE_PATHNAME', 'claim_operation_0_2'
LANGUAGE c VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE ROWS 1;
COMMENT ON FUNCTION idempotency.claim_operation(text, text, text, text) IS
'Claim an operation before doing its work. Exactly one row: verdict run | verify (do the work, then complete_operation with the returned attempt) or completed | in_progress | held | skipped (stop). A caller without the job type''s worker_role is refused (42501)';

CREATE OR REPLACE FUNCTION idempotency.complete_operation(
    job_type text,
    operation_key text,
    attempt integer,
    result jsonb DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'complete_operation_0_2'
LANGUAGE c VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION idempotency.complete_operation(text, text, integer, jsonb) IS
'Record that the effect happened. attempt is the fencing token returned by the claim: an attempt that was taken over is refused (SQLSTATE ID003); repeating a completion is a no-op. A caller without the job type''s worker_role is refused (42501)';

CREATE OR REPLACE FUNCTION idempotency.release_operation(
    job_type text,
    operation_key text,
    attempt integer)
RETURNS void
AS 'MODULE_PATHNAME', 'release_operation_0_2'
LANGUAGE c VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION idempotency.release_operation(text, text, integer) IS
'Record that the effect did not happen (a known failure): the record becomes released and the next claim runs with attempt + 1. Fenced like complete_operation; a caller without the job type''s worker_role is refused (42501)';

CREATE OR REPLACE FUNCTION idempotency.extend_lease(
    job_type text,
    operation_key text,
    attempt integer)
RETURNS timestamptz
AS 'MODULE_PATHNAME', 'extend_lease_0_2'
LANGUAGE c VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION idempotency.extend_lease(text, text, integer) IS
'Heartbeat for a long job: the claim''s lease restarts now; returns the new expiry. Fenced like complete_operation; a caller without the job type''s worker_role is refused (42501)';

--
-- TRUNCATE of job_types: 0.1's guard (job_types_guard()) is a row trigger,
-- which TRUNCATE does not fire; job types with records could all go at
-- once. The same refusal, for the statement.
--

CREATE FUNCTION idempotency.job_types_truncate_guard() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    LOCK TABLE idempotency.operations IN SHARE MODE;
    IF EXISTS (SELECT 1 FROM idempotency.operations) THEN
        RAISE EXCEPTION 'cannot truncate idempotency.job_types: job types still have operations'
            USING ERRCODE = 'foreign_key_violation',
                  DETAIL = 'Removing the job types would leave their records without a lease and a policy.',
                  HINT = 'Empty idempotency.operations first, or delete only the job types without records.';
    END IF;
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION idempotency.job_types_truncate_guard() IS
'Trigger: refuses to truncate idempotency.job_types while idempotency.operations has records';
REVOKE ALL ON FUNCTION idempotency.job_types_truncate_guard() FROM PUBLIC;

CREATE TRIGGER job_types_truncate_guard
    BEFORE TRUNCATE ON idempotency.job_types
    FOR EACH STATEMENT EXECUTE FUNCTION idempotency.job_types_truncate_guard();
COMMENT ON TRIGGER job_types_truncate_guard ON idempotency.job_types IS
'Keeps job types while operations has records (TRUNCATE)';

--
-- Paced purge
--

-- purge_operations() deletes everything expired in one transaction; its
-- burst of WAL (a full-page image of every heap page it touches first after
-- a checkpoint) makes every concurrent commit wait. The procedure
-- idempotency.purge() does the same deletes by ranges of heap pages (TID
-- range scans), commits after each range and pauses after a range that
-- deleted something, so the WAL comes in small pieces (bench/analysis.md).
-- It is SECURITY INVOKER and has no SET clause, because a procedure with
-- either cannot COMMIT; so every name and operator in it is
-- schema-qualified, and the caller's search_path cannot capture them
-- (test/t/004_hostile_search_path.pl). The deletes themselves run, like
-- every function's, with the table owner's rights (purge_block_range()).
--

CREATE FUNCTION idempotency.purge_block_range(first_block bigint, blocks integer)
RETURNS bigint
AS 'MODULE_PATHNAME', 'purge_block_range'
LANGUAGE c VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION idempotency.purge_block_range(bigint, integer) IS
'Delete the completed and skipped records older than their job type''s retention whose tuples lie in heap blocks first_block .. first_block + blocks - 1 of idempotency.operations (one DELETE, a TID range scan); returns how many. The unit of idempotency.purge()';

CREATE FUNCTION idempotency.purge_refuse_transaction_block()
RETURNS void
AS 'MODULE_PATHNAME', 'purge_refuse_transaction_block'
LANGUAGE c VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION idempotency.purge_refuse_transaction_block() IS
'Raises SQLSTATE 25001 inside a transaction block, where idempotency.purge() could not commit; called by idempotency.purge() before it deletes anything';

CREATE PROCEDURE idempotency.purge(
    pages_per_batch integer DEFAULT 20,
    pause interval DEFAULT '20 milliseconds',
    INOUT purged bigint DEFAULT NULL)
LANGUAGE plpgsql
AS $$
DECLARE
    blocks        pg_catalog.int8;  -- the table's size when the walk starts
    next_block    pg_catalog.int8 := 0;
    deleted       pg_catalog.int8;
    pause_seconds pg_catalog.float8;
BEGIN
    IF pages_per_batch IS NULL THEN
        RAISE EXCEPTION 'pages_per_batch must not be null'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF pages_per_batch OPERATOR(pg_catalog.<) 1 THEN
        RAISE EXCEPTION 'pages_per_batch must be positive, not %', pages_per_batch
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'The default, 20 pages per transaction, keeps the purge''s WAL from slowing concurrent commits.';
    END IF;
    IF pause IS NULL THEN
        RAISE EXCEPTION 'pause must not be null'
            USING ERRCODE = 'null_value_not_allowed',
                  HINT = 'Pass interval ''0'' for no pause.';
    END IF;
    IF pause OPERATOR(pg_catalog.<) '0'::pg_catalog.interval THEN
        RAISE EXCEPTION 'pause must not be negative, not %', pause
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM idempotency.purge_refuse_transaction_block();

    pause_seconds := pg_catalog.date_part('epoch', pause);
    blocks := pg_catalog.pg_relation_size('idempotency.operations'::pg_catalog.regclass)
              OPERATOR(pg_catalog./) pg_catalog.current_setting('block_size')::pg_catalog.int8;
    purged := 0;
    WHILE next_block OPERATOR(pg_catalog.<) blocks LOOP
        deleted := idempotency.purge_block_range(next_block, pages_per_batch);
        COMMIT;
        purged := purged OPERATOR(pg_catalog.+) deleted;
        next_block := next_block OPERATOR(pg_catalog.+) pages_per_batch;
        -- a batch that deleted nothing wrote (next to) no WAL: no pause
        IF deleted OPERATOR(pg_catalog.>) 0 AND pause_seconds OPERATOR(pg_catalog.>) 0::pg_catalog.float8
           AND next_block OPERATOR(pg_catalog.<) blocks THEN
            PERFORM pg_catalog.pg_sleep(pause_seconds);
        END IF;
    END LOOP;
END
$$;
COMMENT ON PROCEDURE idempotency.purge(integer, interval, bigint) IS
'CALL it (outside a transaction block, e.g. from pg_cron) to delete what purge_operations() deletes without slowing concurrent commits: pages_per_batch heap pages per transaction, a pause after each batch that deleted something; returns purged, how many records were deleted';

REVOKE ALL ON FUNCTION idempotency.purge_block_range(bigint, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.purge_refuse_transaction_block() FROM PUBLIC;
REVOKE ALL ON PROCEDURE idempotency.purge(integer, interval, bigint) FROM PUBLIC;
