/* idempotency--0.5.sql */

-- complain if script is sourced in psql, rather than via CREATE EXTENSION
\echo Use "CREATE EXTENSION idempotency" to load this file. \quit

--
-- Version 0.5 in one script: what CREATE EXTENSION idempotency runs. A
-- database on 0.1, 0.2, 0.3 or 0.4 gets here through the upgrade scripts
-- (from idempotency--0.1.sql: idempotency--0.1--0.2.sql,
-- idempotency--0.2--0.3.sql, idempotency--0.3--0.4.sql,
-- idempotency--0.4--0.5.sql; from idempotency--0.3.sql and
-- idempotency--0.4.sql: the ones from there), and the catalog it ends
-- with is this script's: the same functions (bodies, settings, grants,
-- comments), columns (types, defaults, and their order: a column an upgrade
-- added comes last), constraints, indexes, triggers, view, types and
-- extension members. scripts/test.d/53-catalog.sh (test/catalog/) compares
-- them.
--
-- A released script does not change. A change to the SQL is a new version:
-- its upgrade script (idempotency--0.5--0.6.sql), and its own consolidated
-- script (idempotency--0.6.sql), checked by hook 53 against the upgrades.
--

CREATE SCHEMA idempotency;
COMMENT ON SCHEMA idempotency IS 'idempotency extension: handled operations, their configuration and the claim protocol';

--
-- Types
--

CREATE TYPE idempotency.stale_policy AS ENUM ('hold', 'retry', 'skip', 'lookup');
COMMENT ON TYPE idempotency.stale_policy IS
'What a claim does when it meets a claim older than its lease: hold it for a person, retry (accept a rare duplicate), skip (accept a rare miss), or lookup (take it over with verdict verify, so the worker checks the provider first)';

CREATE TYPE idempotency.operation_status AS ENUM ('claimed', 'completed', 'released', 'skipped');
COMMENT ON TYPE idempotency.operation_status IS
'State of one operation: claimed (a worker owns it), completed (the effect happened), released (it did not; the next claim runs), skipped (a stale claim given up for good by the skip policy)';

--
-- Configuration: one row per job type
--
-- A job type can name the role that works it (worker_role). The worker
-- functions then refuse (SQLSTATE 42501) a caller without that role's
-- privileges before they read or change anything of the job type's
-- operations, so one tenant's workers cannot claim, complete, release,
-- extend or read another tenant's operations. The check is in C (see
-- idem_worker_lookup() in src/idempotency.c).
--

CREATE TABLE idempotency.job_types (
    job_type     text PRIMARY KEY
                 CONSTRAINT job_types_job_type_length
                 CHECK (pg_catalog.octet_length(job_type) BETWEEN 1 AND 128),
    lease        interval NOT NULL DEFAULT '10 minutes'
                 CONSTRAINT job_types_lease_positive CHECK (lease > interval '0')
                 CONSTRAINT job_types_lease_bounded CHECK (lease <= interval '1000 years'),
    stale_policy idempotency.stale_policy NOT NULL DEFAULT 'hold',
    max_attempts integer
                 CONSTRAINT job_types_max_attempts_positive CHECK (max_attempts >= 1),
    retention    interval
                 CONSTRAINT job_types_retention_positive CHECK (retention > interval '0')
                 CONSTRAINT job_types_retention_bounded CHECK (retention <= interval '1000 years'),
    worker_role  regrole
);
COMMENT ON TABLE idempotency.job_types IS
'One row per job type: its lease and what to do with a claim older than the lease (the stale-claim policy). Change it with plain INSERT/UPDATE; claims read it at every call';
COMMENT ON COLUMN idempotency.job_types.job_type IS 'Name of the job type, 1 to 128 bytes';
COMMENT ON COLUMN idempotency.job_types.lease IS 'How long a claim may run before it is stale (a worker may have died); longer than the longest normal run; at most 1000 years';
COMMENT ON COLUMN idempotency.job_types.stale_policy IS 'hold | retry | skip | lookup: the decision taken, in advance, for a stale claim';
COMMENT ON COLUMN idempotency.job_types.max_attempts IS 'Under retry and lookup, a stale claim that has used this many attempts is held instead of taken over; NULL: no limit';
COMMENT ON COLUMN idempotency.job_types.retention IS 'How long completed and skipped records are kept before purge_operations() removes them, at most 1000 years; NULL: forever';
COMMENT ON COLUMN idempotency.job_types.worker_role IS
'The role that works this job type: only it and the roles that have its privileges (members that inherit it, superusers) may claim, complete, release or extend its operations; others get SQLSTATE 42501. NULL: any role with EXECUTE on the worker functions';

--
-- Records: one row per (job type, operation key). The primary key is the
-- only index on purpose: any index that covers status or a timestamp would
-- make the claimed -> completed update non-HOT.
--
-- delivery: a claim takes a delivery token, a string the caller makes
-- unique to one delivery and reuses only when it retries the same call (a
-- reply lost after the server committed the claim: a dropped connection, a
-- pooler restart, a client timeout); a claim whose young record was made by
-- the same delivery gets its own claim back instead of in_progress. The
-- record keeps a 64-bit digest of the token and of the verdict it got (run
-- or verify), not the token (SQS's receipt handles run to a kilobyte).
--

CREATE TABLE idempotency.operations (
    job_type      text NOT NULL,
    operation_key text NOT NULL,
    status        idempotency.operation_status NOT NULL,
    attempt       integer NOT NULL,
    claimed_at    timestamptz NOT NULL,
    heartbeat_at  timestamptz NOT NULL,
    completed_at  timestamptz,
    claimed_by    text,
    fingerprint   text,
    result        jsonb,
    delivery      bigint,
    CONSTRAINT operations_pkey PRIMARY KEY (job_type, operation_key)
);
COMMENT ON TABLE idempotency.operations IS
'Handled operations, unique on (job_type, operation_key). Written only by the idempotency functions';
COMMENT ON COLUMN idempotency.operations.job_type IS 'Job type, registered in idempotency.job_types';
COMMENT ON COLUMN idempotency.operations.operation_key IS 'What names the effect (e.g. the order reference), 1 to 1024 bytes';
COMMENT ON COLUMN idempotency.operations.status IS 'claimed | completed | released | skipped';
COMMENT ON COLUMN idempotency.operations.attempt IS 'Fencing token: 1 for the first claim, +1 at every takeover; complete, release and extend must name the current attempt';
COMMENT ON COLUMN idempotency.operations.claimed_at IS 'When the current attempt claimed the operation (database clock at the call)';
COMMENT ON COLUMN idempotency.operations.heartbeat_at IS 'Start of the current lease: the claim, or the last extend_lease()';
COMMENT ON COLUMN idempotency.operations.completed_at IS 'When the record became completed or skipped';
COMMENT ON COLUMN idempotency.operations.claimed_by IS 'The worker argument of the claim that holds the current attempt';
COMMENT ON COLUMN idempotency.operations.fingerprint IS 'Fingerprint of the payload given with the first claim that had one; a different one later is an error';
COMMENT ON COLUMN idempotency.operations.result IS 'What complete_operation() stored; returned to later claims with verdict completed';
COMMENT ON COLUMN idempotency.operations.delivery IS
'Digest (64 bits) of the delivery token given with the claim that holds the current attempt, and of the verdict it got; a retry of that call inside the lease gets the same verdict and attempt. NULL: that claim gave no token';

--
-- Audit of decisions taken by people
--

CREATE TABLE idempotency.resolutions (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_type        text NOT NULL,
    operation_key   text NOT NULL,
    attempt         integer NOT NULL,
    previous_status idempotency.operation_status NOT NULL,
    resolution      text NOT NULL,
    resolved_by     name NOT NULL,
    resolved_at     timestamptz NOT NULL,
    note            text
);
COMMENT ON TABLE idempotency.resolutions IS
'Audit of resolve_operation(): who decided what about a held or skipped operation, when, and why';
COMMENT ON COLUMN idempotency.resolutions.id IS 'Order of the decisions';
COMMENT ON COLUMN idempotency.resolutions.job_type IS 'Job type of the operation decided on';
COMMENT ON COLUMN idempotency.resolutions.operation_key IS 'Key of the operation decided on';
COMMENT ON COLUMN idempotency.resolutions.attempt IS 'The attempt the record had when it was decided on';
COMMENT ON COLUMN idempotency.resolutions.previous_status IS 'claimed (a stale claim) or skipped';
COMMENT ON COLUMN idempotency.resolutions.resolution IS 'completed (the effect happened) or retry (it did not; the record became released)';
COMMENT ON COLUMN idempotency.resolutions.resolved_by IS 'current_user of the caller of resolve_operation()';
COMMENT ON COLUMN idempotency.resolutions.resolved_at IS 'When the decision was recorded (database clock)';
COMMENT ON COLUMN idempotency.resolutions.note IS 'Why: the note given to resolve_operation()';
COMMENT ON SEQUENCE idempotency.resolutions_id_seq IS 'Numbers idempotency.resolutions';

-- pg_dump keeps configuration, records and the audit trail
SELECT pg_catalog.pg_extension_config_dump('idempotency.job_types', '');
SELECT pg_catalog.pg_extension_config_dump('idempotency.operations', '');
SELECT pg_catalog.pg_extension_config_dump('idempotency.resolutions', '');
SELECT pg_catalog.pg_extension_config_dump('idempotency.resolutions_id_seq', '');

--
-- A job type that still has records cannot be removed or renamed: its
-- records would lose their lease and policy. (A foreign key would do the
-- same but would lock the job type's row on every claim.) The SHARE lock
-- waits for claims in flight and holds new ones back until the removal
-- commits; a claim's INSERT re-checks that its job type exists with a
-- snapshot taken after that wait (see ST_INSERT in src/idempotency.c).
--

CREATE FUNCTION idempotency.job_types_guard() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.job_type OPERATOR(pg_catalog.=) OLD.job_type THEN
        RETURN NEW;
    END IF;
    LOCK TABLE idempotency.operations IN SHARE MODE;
    IF EXISTS (SELECT 1 FROM idempotency.operations o
               WHERE o.job_type OPERATOR(pg_catalog.=) OLD.job_type) THEN
        RAISE EXCEPTION 'job type "%" still has operations', OLD.job_type
            USING ERRCODE = 'foreign_key_violation',
                  DETAIL = 'Removing or renaming a job type would leave its records without a lease and a policy.',
                  HINT = 'Delete its records from idempotency.operations first, or keep the job type.';
    END IF;
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    RETURN NEW;
END
$$;
COMMENT ON FUNCTION idempotency.job_types_guard() IS
'Trigger: refuses to delete or rename a job type that still has operations';

CREATE TRIGGER job_types_guard
    BEFORE DELETE OR UPDATE OF job_type ON idempotency.job_types
    FOR EACH ROW EXECUTE FUNCTION idempotency.job_types_guard();
COMMENT ON TRIGGER job_types_guard ON idempotency.job_types IS
'Keeps job types that still have operations';

-- TRUNCATE does not fire a row trigger: without this one, job types with
-- records could all go at once. The same refusal, for the statement.

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

CREATE TRIGGER job_types_truncate_guard
    BEFORE TRUNCATE ON idempotency.job_types
    FOR EACH STATEMENT EXECUTE FUNCTION idempotency.job_types_truncate_guard();
COMMENT ON TRIGGER job_types_truncate_guard ON idempotency.job_types IS
'Keeps job types while operations has records (TRUNCATE)';

--
-- The protocol (C). Each function runs its statements with the rights of
-- the owner of idempotency.operations; EXECUTE on the function is the
-- permission. Nothing is granted to PUBLIC.
--
-- A C entry point whose behaviour changed in a version carries that
-- version's name (claim_operation_0_3; complete_operation_0_2: the
-- worker_role check); the library keeps the older ones, which the
-- definitions of a database not yet updated still call.
--
-- claim_operation: wait => false answers in_progress at once, instead of
-- waiting without bound for another transaction's uncommitted claim of the
-- same key.
--

CREATE FUNCTION idempotency.claim_operation(
    job_type text,
    operation_key text,
    fingerprint text DEFAULT NULL,
    worker text DEFAULT NULL,
    delivery text DEFAULT NULL,
    wait boolean DEFAULT true)
RETURNS TABLE (verdict text, attempt integer, result jsonb)
AS 'MODULE_PATHNAME', 'claim_operation_0_3'
LANGUAGE c VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE ROWS 1;
COMMENT ON FUNCTION idempotency.claim_operation(text, text, text, text, text, boolean) IS
'Claim an operation before doing its work. Exactly one row: verdict run | verify (do the work, then complete_operation with the returned attempt) or completed | in_progress | held | skipped (stop). delivery: a token unique to this delivery, reused only to retry this call (a retry after a lost reply gets its own claim back). wait => false: in_progress at once instead of waiting for another transaction''s uncommitted claim of the key. A caller without the job type''s worker_role is refused (42501)';

CREATE FUNCTION idempotency.complete_operation(
    job_type text,
    operation_key text,
    attempt integer,
    result jsonb DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'complete_operation_0_2'
LANGUAGE c VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION idempotency.complete_operation(text, text, integer, jsonb) IS
'Record that the effect happened. attempt is the fencing token returned by the claim: an attempt that was taken over is refused (SQLSTATE ID003); repeating a completion is a no-op. A caller without the job type''s worker_role is refused (42501)';

CREATE FUNCTION idempotency.release_operation(
    job_type text,
    operation_key text,
    attempt integer)
RETURNS void
AS 'MODULE_PATHNAME', 'release_operation_0_2'
LANGUAGE c VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION idempotency.release_operation(text, text, integer) IS
'Record that the effect did not happen (a known failure): the record becomes released and the next claim runs with attempt + 1. Fenced like complete_operation; a caller without the job type''s worker_role is refused (42501)';

CREATE FUNCTION idempotency.extend_lease(
    job_type text,
    operation_key text,
    attempt integer)
RETURNS timestamptz
AS 'MODULE_PATHNAME', 'extend_lease_0_2'
LANGUAGE c VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION idempotency.extend_lease(text, text, integer) IS
'Heartbeat for a long job: the claim''s lease restarts now; returns the new expiry. Fenced like complete_operation; a caller without the job type''s worker_role is refused (42501)';

--
-- Calls in place (Citus): the four worker functions under other names,
-- bound to the same C entry points, which distribute() does not delegate.
-- Citus plans a statement that calls a distributed function afresh at
-- every execution, before the call; a statement calling one of these is a
-- plain function call to it, planned as on one node (a generic plan after
-- five executions). Each call decides where its key is, as every call
-- does: on the node that holds the key's only shard placement, a statement
-- that is nothing but the call and is its own transaction works on that
-- shard directly; otherwise the call goes through Citus's planner to the
-- key's shard. Same verdicts, fencing, errors and SQLSTATEs; on one node
-- the same functions. use_in_place() tells a client whether to use them
-- (bench/citus/README.md, docs/citus.md).
--

CREATE FUNCTION idempotency.claim_operation_in_place(
    job_type text,
    operation_key text,
    fingerprint text DEFAULT NULL,
    worker text DEFAULT NULL,
    delivery text DEFAULT NULL,
    wait boolean DEFAULT true)
RETURNS TABLE (verdict text, attempt integer, result jsonb)
AS 'MODULE_PATHNAME', 'claim_operation_0_3'
LANGUAGE c VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE ROWS 1;
COMMENT ON FUNCTION idempotency.claim_operation_in_place(text, text, text, text, text, boolean) IS
'claim_operation(), run where it is called: never delegated by Citus, so a statement calling it gets a generic plan. For a worker connected to a Citus worker node: a key whose shard is on that node is claimed there directly, any other through Citus. Same verdicts, arguments and SQLSTATEs as claim_operation()';

CREATE FUNCTION idempotency.complete_operation_in_place(
    job_type text,
    operation_key text,
    attempt integer,
    result jsonb DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'complete_operation_0_2'
LANGUAGE c VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION idempotency.complete_operation_in_place(text, text, integer, jsonb) IS
'complete_operation(), run where it is called (never delegated by Citus; see claim_operation_in_place()). Same fencing and SQLSTATEs (ID003 superseded, ID004 no record, ID005 wrong state, 42501)';

CREATE FUNCTION idempotency.release_operation_in_place(
    job_type text,
    operation_key text,
    attempt integer)
RETURNS void
AS 'MODULE_PATHNAME', 'release_operation_0_2'
LANGUAGE c VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION idempotency.release_operation_in_place(text, text, integer) IS
'release_operation(), run where it is called (never delegated by Citus; see claim_operation_in_place()). Same fencing and SQLSTATEs';

CREATE FUNCTION idempotency.extend_lease_in_place(
    job_type text,
    operation_key text,
    attempt integer)
RETURNS timestamptz
AS 'MODULE_PATHNAME', 'extend_lease_0_2'
LANGUAGE c VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION idempotency.extend_lease_in_place(text, text, integer) IS
'extend_lease(), run where it is called (never delegated by Citus; see claim_operation_in_place()). Same fencing and SQLSTATEs';

--
-- use_in_place(): plpgsql, so that pg_dist_* are read only when called, on
-- a node that has Citus (as grant_propagated()).
--
CREATE FUNCTION idempotency.use_in_place()
RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname OPERATOR(pg_catalog.=) 'citus') THEN
        RETURN false;
    END IF;
    -- a worker (the coordinator's group is 0) with the distributed
    -- install's metadata
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_dist_local_group
                   WHERE groupid OPERATOR(pg_catalog.>) 0)
       OR NOT EXISTS (SELECT FROM pg_catalog.pg_dist_partition
                      WHERE logicalrelid OPERATOR(pg_catalog.=) 'idempotency.operations'::pg_catalog.regclass) THEN
        RETURN false;
    END IF;
    RETURN pg_catalog.has_function_privilege('idempotency.claim_operation_in_place(text, text, text, text, text, boolean)', 'EXECUTE')
       AND pg_catalog.has_function_privilege('idempotency.complete_operation_in_place(text, text, integer, jsonb)', 'EXECUTE')
       AND pg_catalog.has_function_privilege('idempotency.release_operation_in_place(text, text, integer)', 'EXECUTE')
       AND pg_catalog.has_function_privilege('idempotency.extend_lease_in_place(text, text, integer)', 'EXECUTE');
END
$$;
COMMENT ON FUNCTION idempotency.use_in_place() IS
'Should a worker connected here call the *_in_place functions instead of the delegated ones? True on a Citus worker that holds the distributed install''s metadata, when the caller may execute all four; false on one node and on the coordinator';

--
-- Batches: many keys of one job type in one call, so in one commit. Each
-- key gets exactly the single call's answer; the keys are taken in one
-- order (by their bytes) whatever order they come in, so two batches that
-- share keys never deadlock; a record that refuses a completion or a
-- release is reported on its row. At most 1000 keys per call.
--

CREATE FUNCTION idempotency.claim_operations(
    job_type text,
    operation_keys text[],
    fingerprints text[] DEFAULT NULL,
    worker text DEFAULT NULL,
    deliveries text[] DEFAULT NULL,
    wait boolean DEFAULT true)
RETURNS TABLE (operation_key text, verdict text, attempt integer, result jsonb)
AS 'MODULE_PATHNAME', 'claim_operations'
LANGUAGE c VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE ROWS 10;
COMMENT ON FUNCTION idempotency.claim_operations(text, text[], text[], text, text[], boolean) IS
'Claim many operations of one job type in one call (at most 1000): one row per key, in the order given, each with the verdict claim_operation would give it. fingerprints and deliveries are parallel to operation_keys (NULL: none). A key given twice is answered as two deliveries would be (run, then in_progress)';

CREATE FUNCTION idempotency.complete_operations(
    job_type text,
    operation_keys text[],
    attempts integer[],
    results jsonb[] DEFAULT NULL)
RETURNS TABLE (operation_key text, attempt integer, done boolean, sqlstate text, message text)
AS 'MODULE_PATHNAME', 'complete_operations'
LANGUAGE c VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE ROWS 10;
COMMENT ON FUNCTION idempotency.complete_operations(text, text[], integer[], jsonb[]) IS
'Complete many operations of one job type in one call (at most 1000): one row per key, in the order given: done (now, or already by this attempt), or the SQLSTATE and message of the refusal (ID003 superseded, ID004 no record, ID005 wrong state), which fails only that key';

CREATE FUNCTION idempotency.release_operations(
    job_type text,
    operation_keys text[],
    attempts integer[])
RETURNS TABLE (operation_key text, attempt integer, done boolean, sqlstate text, message text)
AS 'MODULE_PATHNAME', 'release_operations'
LANGUAGE c VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE ROWS 10;
COMMENT ON FUNCTION idempotency.release_operations(text, text[], integer[]) IS
'Release many operations of one job type in one call (at most 1000): one row per key, in the order given: done, or the SQLSTATE and message of the refusal, which fails only that key';

--
-- Operating it: stale claims, decisions, the purge
--

CREATE FUNCTION idempotency.stale_claims(job_type text DEFAULT NULL)
RETURNS TABLE (
    job_type text,
    operation_key text,
    attempt integer,
    claimed_at timestamptz,
    claimed_by text,
    stale_policy idempotency.stale_policy,
    lease_expired_at timestamptz,
    stale_for interval)
AS 'MODULE_PATHNAME', 'stale_claims'
LANGUAGE c VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION idempotency.stale_claims(text) IS
'Every claimed operation whose lease has run out (of one job type, or all), oldest first: what a person or a sweeper reads. stale_for is the time since the lease ran out';

CREATE FUNCTION idempotency.resolve_operation(
    job_type text,
    operation_key text,
    resolution text,
    note text DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'resolve_operation'
LANGUAGE c VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION idempotency.resolve_operation(text, text, text, text) IS
'A person''s decision on a stale (held) claim or a skipped record: completed (the effect did happen) or retry (it did not; the record becomes released). Audited in idempotency.resolutions';

CREATE FUNCTION idempotency.purge_operations(batch_size integer DEFAULT 10000)
RETURNS bigint
AS 'MODULE_PATHNAME', 'purge_operations'
LANGUAGE c VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION idempotency.purge_operations(integer) IS
'Delete completed and skipped records older than their job type''s retention, batch_size rows per statement; returns how many were deleted';

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
-- Citus (issue 11): where Citus manages the tables, the local relation is
-- an empty shell. purge_block_range() then takes block 0 for the whole
-- table, and purge() always makes at least one batch (GREATEST(..., 1), a
-- construct, not a function the search_path could capture).
--

CREATE FUNCTION idempotency.purge_block_range(first_block bigint, blocks integer)
RETURNS bigint
AS 'MODULE_PATHNAME', 'purge_block_range'
LANGUAGE c VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION idempotency.purge_block_range(bigint, integer) IS
'Delete the completed and skipped records older than their job type''s retention whose tuples lie in heap blocks first_block .. first_block + blocks - 1 of idempotency.operations (one DELETE, a TID range scan); returns how many. The unit of idempotency.purge(). Where Citus manages the tables, a range from block 0 purges every shard and any other range nothing';

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
    blocks := GREATEST(pg_catalog.pg_relation_size('idempotency.operations'::pg_catalog.regclass)
              OPERATOR(pg_catalog./) pg_catalog.current_setting('block_size')::pg_catalog.int8, 1);
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

--
-- Monitoring
--

CREATE VIEW idempotency.job_type_stats AS
SELECT jt.job_type,
       jt.stale_policy,
       jt.lease,
       pg_catalog.count(o.status) FILTER (WHERE o.status = 'claimed') AS claimed,
       pg_catalog.count(o.status) FILTER (WHERE o.status = 'completed') AS completed,
       pg_catalog.count(o.status) FILTER (WHERE o.status = 'released') AS released,
       pg_catalog.count(o.status) FILTER (WHERE o.status = 'skipped') AS skipped,
       pg_catalog.count(o.status) FILTER (WHERE o.status = 'claimed'
           AND (o.heartbeat_at OPERATOR(pg_catalog.+) jt.lease)
               OPERATOR(pg_catalog.<=) pg_catalog.clock_timestamp()) AS stale,
       pg_catalog.min(o.claimed_at) FILTER (WHERE o.status = 'claimed'
           AND (o.heartbeat_at OPERATOR(pg_catalog.+) jt.lease)
               OPERATOR(pg_catalog.<=) pg_catalog.clock_timestamp()) AS oldest_stale_claimed_at
FROM idempotency.job_types jt
LEFT JOIN idempotency.operations o ON o.job_type OPERATOR(pg_catalog.=) jt.job_type
GROUP BY jt.job_type, jt.stale_policy, jt.lease;
COMMENT ON VIEW idempotency.job_type_stats IS
'Per job type: records per status, stale claims (claimed, lease run out) and the claim time of the oldest stale claim';
COMMENT ON COLUMN idempotency.job_type_stats.job_type IS 'Job type';
COMMENT ON COLUMN idempotency.job_type_stats.stale_policy IS 'Its stale-claim policy';
COMMENT ON COLUMN idempotency.job_type_stats.lease IS 'Its lease';
COMMENT ON COLUMN idempotency.job_type_stats.claimed IS 'Records claimed (young or stale)';
COMMENT ON COLUMN idempotency.job_type_stats.completed IS 'Records completed';
COMMENT ON COLUMN idempotency.job_type_stats.released IS 'Records released (the next claim runs)';
COMMENT ON COLUMN idempotency.job_type_stats.skipped IS 'Records skipped';
COMMENT ON COLUMN idempotency.job_type_stats.stale IS 'Claims whose lease has run out: held, or waiting for a redelivery';
COMMENT ON COLUMN idempotency.job_type_stats.oldest_stale_claimed_at IS 'Claim time of the oldest stale claim';

--
-- Which edition answers (0.5): idempotency comes in two editions with one
-- SQL API, this one (the C extension) and the portable edition (SQL and
-- PL/pgSQL, for managed services: installed with pg_tle or as a plain
-- script, which leaves no pg_extension row). A client (the helpers, the
-- sign-off runner) asks edition() which one it talks to and its version;
-- the portable edition defines the same function, answering 'portable'.
--
CREATE FUNCTION idempotency.edition(OUT edition text, OUT version text)
RETURNS record LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT 'c'::pg_catalog.text, '0.5'::pg_catalog.text $$;
COMMENT ON FUNCTION idempotency.edition() IS
'Which edition of idempotency answers in this database and its version: edition c (the C extension) or portable (SQL and PL/pgSQL, installed with pg_tle or as a plain script); the one way a client tells them apart';

--
-- Citus (issue 11; see the README, "Citus")
--

--
-- The four worker functions that distribute() delegates to the node holding
-- the key (one list, read by distribute() and distribute_grants()).
--
CREATE FUNCTION idempotency.delegated_functions()
RETURNS pg_catalog.regprocedure[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
SELECT ARRAY[
    'idempotency.claim_operation(text, text, text, text, text, boolean)',
    'idempotency.complete_operation(text, text, integer, jsonb)',
    'idempotency.release_operation(text, text, integer)',
    'idempotency.extend_lease(text, text, integer)']::pg_catalog.regprocedure[]
$$;
COMMENT ON FUNCTION idempotency.delegated_functions() IS
'Citus: the worker functions idempotency.distribute() delegates to the node that holds the key';

--
-- object_grants(): the privileges granted on the extension's schema, tables,
-- sequences, functions and procedures, one row per privilege and grantee
-- (the owner's own left out; an object without an ACL shows its default,
-- e.g. EXECUTE to PUBLIC). What distribute_grants() copies to the workers.
--
CREATE FUNCTION idempotency.object_grants()
RETURNS TABLE (object pg_catalog.text, privilege pg_catalog.text, grantee pg_catalog.text,
               grantable boolean, classid pg_catalog.regclass, objid pg_catalog.oid)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
SELECT 'SCHEMA idempotency', a.privilege_type,
       CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC' ELSE a.grantee::pg_catalog.regrole::pg_catalog.text END,
       a.is_grantable, 'pg_catalog.pg_namespace'::pg_catalog.regclass, n.oid
FROM pg_catalog.pg_namespace n,
     pg_catalog.aclexplode(COALESCE(n.nspacl, pg_catalog.acldefault('n', n.nspowner))) a
WHERE n.nspname OPERATOR(pg_catalog.=) 'idempotency' AND a.grantee OPERATOR(pg_catalog.<>) n.nspowner
UNION ALL
SELECT CASE WHEN c.relkind OPERATOR(pg_catalog.=) 'S' THEN 'SEQUENCE ' ELSE 'TABLE ' END
           || c.oid::pg_catalog.regclass::pg_catalog.text,
       a.privilege_type,
       CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC' ELSE a.grantee::pg_catalog.regrole::pg_catalog.text END,
       a.is_grantable, 'pg_catalog.pg_class'::pg_catalog.regclass, c.oid
FROM pg_catalog.pg_class c,
     pg_catalog.aclexplode(COALESCE(c.relacl, pg_catalog.acldefault(
         CASE WHEN c.relkind OPERATOR(pg_catalog.=) 'S' THEN 's' ELSE 'r' END::"char", c.relowner))) a
WHERE c.relnamespace OPERATOR(pg_catalog.=) 'idempotency'::pg_catalog.regnamespace
  AND c.relkind OPERATOR(pg_catalog.=) ANY ('{r,v,S,p}') AND a.grantee OPERATOR(pg_catalog.<>) c.relowner
UNION ALL
SELECT CASE p.prokind WHEN 'p' THEN 'PROCEDURE ' ELSE 'FUNCTION ' END || p.oid::pg_catalog.regprocedure::pg_catalog.text,
       a.privilege_type,
       CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC' ELSE a.grantee::pg_catalog.regrole::pg_catalog.text END,
       a.is_grantable, 'pg_catalog.pg_proc'::pg_catalog.regclass, p.oid
FROM pg_catalog.pg_proc p,
     pg_catalog.aclexplode(COALESCE(p.proacl, pg_catalog.acldefault('f', p.proowner))) a
WHERE p.pronamespace OPERATOR(pg_catalog.=) 'idempotency'::pg_catalog.regnamespace
  AND a.grantee OPERATOR(pg_catalog.<>) p.proowner
ORDER BY 1, 3, 2
$$;
COMMENT ON FUNCTION idempotency.object_grants() IS
'The privileges granted on the extension''s schema, tables, sequences and functions (one row per privilege and grantee, the owner''s left out, an object without an ACL shown with its default); what idempotency.distribute_grants() copies to the Citus workers';

--
-- distribute_grants(): on a distributed install (after distribute()), make
-- every worker grant exactly what the coordinator grants on the extension's
-- objects. Citus propagates GRANT and REVOKE on the tables and the
-- delegated functions itself (they are Citus tables and distributed
-- objects), but not on the schema, the sequence or the other functions
-- (they belong to the extension). Run after a GRANT
-- or REVOKE on them; safe to run again. On each worker one transaction
-- (a DO block): what it grants that the coordinator does not is revoked,
-- then the coordinator's grants are made. Workers are not one transaction
-- with the coordinator or each other: a failure on one (a role it does not
-- know) leaves it unchanged and is reported with 55000; run again once
-- fixed.
--
CREATE FUNCTION idempotency.distribute_grants()
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname OPERATOR(pg_catalog.=) 'citus') THEN
        RAISE EXCEPTION 'Citus is not installed in this database'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'idempotency.distribute_grants() is for an install that idempotency.distribute() made a Citus one.';
    END IF;
    IF NOT pg_catalog.citus_is_coordinator() THEN
        RAISE EXCEPTION 'idempotency.distribute_grants() runs on the coordinator'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Connect to the coordinator and call it there.';
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_dist_partition
                   WHERE logicalrelid OPERATOR(pg_catalog.=) 'idempotency.operations'::pg_catalog.regclass) THEN
        RAISE EXCEPTION 'the idempotency install is not distributed'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'SELECT idempotency.distribute() first.';
    END IF;

    -- the workers first, in connections of their own (one transaction per
    -- worker), before this transaction changes anything there: a GRANT that
    -- Citus propagates holds its locks on the workers until this
    -- transaction ends, and the workers' transactions would wait for it
    PERFORM idempotency.grants_on_workers();
    PERFORM idempotency.grants_propagated();
END
$$;
COMMENT ON FUNCTION idempotency.distribute_grants() IS
'Citus: on the coordinator of a distributed install, make every worker grant exactly what the coordinator grants on the extension''s schema, tables and functions (Citus propagates only those on the tables and the delegated functions). Run after GRANT or REVOKE on them, as a transaction of its own; safe to run again; 55000 without Citus, off the coordinator, before distribute(), or when a worker refuses';

--
-- The two halves of distribute_grants(), also called by distribute().
-- grants_on_workers(): on each worker, one DO block (one transaction): what
-- the worker grants on the objects whose grants Citus does not propagate is
-- revoked, then the coordinator's grants on them are made. Citus itself
-- propagates GRANT and REVOKE on its tables and on the delegated functions
-- (distributed objects; on a worker they are refused): grants_propagated()
-- makes those again on the coordinator, which Citus sends to the workers in
-- this transaction.
--
CREATE FUNCTION idempotency.grants_on_workers()
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    r       record;
    grants  pg_catalog.text := '';
    cmd     pg_catalog.text;
    failed  pg_catalog.text;
BEGIN
    FOR r IN SELECT g.* FROM idempotency.object_grants() g
             WHERE NOT idempotency.grant_propagated(g.classid, g.objid) LOOP
        grants := grants || pg_catalog.format('EXECUTE %L; ',
            pg_catalog.format('GRANT %s ON %s TO %s%s', r.privilege, r.object, r.grantee,
                              CASE WHEN r.grantable THEN ' WITH GRANT OPTION' ELSE '' END));
    END LOOP;
    cmd := 'DO $grants$ DECLARE r record; BEGIN '
        || 'FOR r IN SELECT g.* FROM idempotency.object_grants() g '
        || 'WHERE NOT idempotency.grant_propagated(g.classid, g.objid) LOOP '
        || 'EXECUTE pg_catalog.format(''REVOKE %s ON %s FROM %s CASCADE'', r.privilege, r.object, r.grantee); '
        || 'END LOOP; ' || grants || 'END $grants$';
    SELECT pg_catalog.string_agg(w.nodename || ':' || w.nodeport || ': ' || w.result, '; ')
    INTO failed
    FROM pg_catalog.run_command_on_workers(cmd) w WHERE NOT w.success;
    IF failed IS NOT NULL THEN
        RAISE EXCEPTION 'idempotency: the grants could not be made on a worker'
            USING ERRCODE = 'object_not_in_prerequisite_state', DETAIL = failed,
                  HINT = 'Nothing changed on that worker; fix the cause (a role it does not know?) and run idempotency.distribute_grants() again.';
    END IF;
END
$$;
COMMENT ON FUNCTION idempotency.grants_on_workers() IS
'Citus, internal to distribute() and distribute_grants(): on each worker, in one transaction, the grants on the extension''s objects whose grants Citus does not propagate made equal to the coordinator''s';

CREATE FUNCTION idempotency.grants_propagated()
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    r       record;
BEGIN
    FOR r IN SELECT g.* FROM idempotency.object_grants() g
             WHERE idempotency.grant_propagated(g.classid, g.objid) LOOP
        EXECUTE pg_catalog.format('GRANT %s ON %s TO %s%s', r.privilege, r.object, r.grantee,
                                  CASE WHEN r.grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
END
$$;
COMMENT ON FUNCTION idempotency.grants_propagated() IS
'Citus, internal to distribute() and distribute_grants(): the grants on the Citus tables and the delegated functions made again on the coordinator, which Citus propagates to the workers';

-- Does Citus propagate GRANT and REVOKE on this object itself (a Citus
-- table, or a delegated function once distributed)? plpgsql: pg_dist_* are
-- read only when called, on a node that has Citus.
CREATE FUNCTION idempotency.grant_propagated(classid pg_catalog.regclass, objid pg_catalog.oid)
RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass THEN
        RETURN EXISTS (SELECT FROM pg_catalog.pg_dist_partition p
                       WHERE p.logicalrelid OPERATOR(pg_catalog.=) objid);
    END IF;
    IF classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass THEN
        RETURN EXISTS (SELECT FROM pg_catalog.pg_dist_object d
                       WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
                         AND d.objid OPERATOR(pg_catalog.=) grant_propagated.objid);
    END IF;
    RETURN false;
END
$$;
COMMENT ON FUNCTION idempotency.grant_propagated(pg_catalog.regclass, pg_catalog.oid) IS
'Citus, internal to distribute_grants(): does Citus propagate GRANT and REVOKE on this object itself (a Citus table, or a distributed function)?';

--
-- distribute(): make this install a Citus one (issue 11; see
-- the README, "Citus"). Run once, on the coordinator, by a superuser; one
-- transaction, so an error anywhere leaves the install as it was, but for
-- the workers' grants: they are made equal to the coordinator's first, in
-- a transaction of each worker's own (grants_on_workers()).
--
--  * job_types and resolutions become reference tables, operations a table
--    distributed by operation_key in a colocation group of its own (which
--    an application's side-effect tables join with colocate_with);
--  * the job-type guard triggers give way to a foreign key from operations
--    to job_types (Citus cannot run a trigger that queries a distributed
--    table on a shard); deleting or renaming a job type that has records
--    still fails with 23503;
--  * the records are copied into the shards and the local copies emptied
--    (truncate_local_data_after_distributing_table);
--  * each job type's worker_role is written again by name, so that every
--    node stores its own role OID (a copy carries the coordinator's);
--  * claim_operation, complete_operation, release_operation and
--    extend_lease are delegated to the node that holds the key
--    (create_distributed_function, by operation_key), also inside a
--    transaction block (force_delegation): there the call runs on that
--    worker in the caller's own connection, so the caller's writes to a
--    colocated table are in the same transaction on the same node (not
--    delegated, the call ran on the coordinator and sent its statements as
--    the tables' owner over a connection of its own, and Citus refused the
--    caller's write to the same shard group with 25001);
--  * the grants on the schema, the tables and the functions are made on
--    every worker too (distribute_grants(): the workers' part first).
--
CREATE FUNCTION idempotency.distribute()
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    f         pg_catalog.regprocedure;
    r         record;
    msg       pg_catalog.text;
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname OPERATOR(pg_catalog.=) 'citus') THEN
        RAISE EXCEPTION 'Citus is not installed in this database'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = 'idempotency.distribute() makes the extension''s tables Citus tables.',
                  HINT = 'CREATE EXTENSION citus, add the worker nodes (citus_add_node), then call it again on the coordinator.';
    END IF;
    IF NOT pg_catalog.citus_is_coordinator() THEN
        RAISE EXCEPTION 'idempotency.distribute() runs on the coordinator'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Connect to the coordinator and call it there.';
    END IF;
    IF EXISTS (SELECT FROM pg_catalog.pg_dist_partition
               WHERE logicalrelid OPERATOR(pg_catalog.=) 'idempotency.operations'::pg_catalog.regclass
                  OR logicalrelid OPERATOR(pg_catalog.=) 'idempotency.job_types'::pg_catalog.regclass
                  OR logicalrelid OPERATOR(pg_catalog.=) 'idempotency.resolutions'::pg_catalog.regclass) THEN
        RAISE EXCEPTION 'the idempotency install is already distributed'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = 'Citus already manages idempotency.operations, job_types or resolutions (pg_dist_partition).';
    END IF;

    -- the grants on the workers first: see distribute_grants()
    PERFORM idempotency.grants_on_workers();

    -- Citus raises XX000 for what it cannot do here; the block (a
    -- subtransaction, which Citus supports) turns that into a clear error
    BEGIN
        -- the foreign key after the distribution, in the same transaction
        PERFORM pg_catalog.set_config('citus.multi_shard_modify_mode', 'sequential', true);

        DROP TRIGGER IF EXISTS job_types_guard ON idempotency.job_types;
        DROP TRIGGER IF EXISTS job_types_truncate_guard ON idempotency.job_types;
        PERFORM pg_catalog.create_reference_table('idempotency.job_types');
        PERFORM pg_catalog.create_reference_table('idempotency.resolutions');
        PERFORM pg_catalog.create_distributed_table('idempotency.operations', 'operation_key',
                                                    colocate_with => 'none');
        ALTER TABLE idempotency.operations ADD CONSTRAINT operations_job_type_fkey
            FOREIGN KEY (job_type) REFERENCES idempotency.job_types (job_type);
        PERFORM pg_catalog.truncate_local_data_after_distributing_table('idempotency.operations');
        PERFORM pg_catalog.truncate_local_data_after_distributing_table('idempotency.resolutions');
        PERFORM pg_catalog.truncate_local_data_after_distributing_table('idempotency.job_types');

        -- by name: each node resolves the literal to its own OID
        FOR r IN SELECT jt.job_type, jt.worker_role::pg_catalog.text AS role
                 FROM idempotency.job_types jt WHERE jt.worker_role IS NOT NULL LOOP
            EXECUTE pg_catalog.format(
                'UPDATE idempotency.job_types SET worker_role = %L::pg_catalog.regrole'
                ' WHERE job_type OPERATOR(pg_catalog.=) %L', r.role, r.job_type);
        END LOOP;

        FOREACH f IN ARRAY idempotency.delegated_functions() LOOP
            PERFORM pg_catalog.create_distributed_function(f, 'operation_key',
                                                           colocate_with => 'idempotency.operations',
                                                           force_delegation => true);
        END LOOP;

        -- the grants Citus propagates, now that it manages these objects
        PERFORM idempotency.grants_propagated();
    EXCEPTION WHEN internal_error THEN
        GET STACKED DIAGNOSTICS msg = MESSAGE_TEXT;
        IF pg_catalog.strpos(msg, 'parallel') OPERATOR(pg_catalog.>) 0 THEN
            RAISE EXCEPTION 'idempotency.distribute() cannot run in this transaction'
                USING ERRCODE = 'active_sql_transaction', DETAIL = 'Citus: ' || msg,
                      HINT = 'Nothing changed. Call it as a transaction of its own, or first in its transaction block.';
        END IF;
        RAISE EXCEPTION 'Citus could not distribute the idempotency install'
            USING ERRCODE = 'object_not_in_prerequisite_state', DETAIL = 'Citus: ' || msg,
                  HINT = 'Nothing changed.';
    END;
END
$$;
COMMENT ON FUNCTION idempotency.distribute() IS
'Citus: on the coordinator, make job_types and resolutions reference tables and distribute operations by operation_key (the records moved into the shards, the job-type guards replaced by a foreign key), delegate the four worker functions to the node holding the key, and make the grants on every node (distribute_grants()). Once; 55000 without Citus, off the coordinator, when already distributed or when Citus refuses a step; 25001 in a transaction that already ran a parallel query on a distributed table; nothing changed by a refusal';

--
-- Privileges: nothing is granted to PUBLIC, not even USAGE on the schema;
-- see README "Roles and grants". The extension's own privileges (these,
-- the owner's) are its initial privileges (pg_init_privs): pg_dump dumps
-- only what users grant on top of them.
--

REVOKE ALL ON SCHEMA idempotency FROM PUBLIC;

-- the triggers' functions
REVOKE ALL ON FUNCTION idempotency.job_types_guard() FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.job_types_truncate_guard() FROM PUBLIC;

-- the workers'
REVOKE ALL ON FUNCTION idempotency.claim_operation(text, text, text, text, text, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.complete_operation(text, text, integer, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.release_operation(text, text, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.extend_lease(text, text, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.claim_operations(text, text[], text[], text, text[], boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.complete_operations(text, text[], integer[], jsonb[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.release_operations(text, text[], integer[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.claim_operation_in_place(text, text, text, text, text, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.complete_operation_in_place(text, text, integer, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.release_operation_in_place(text, text, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.extend_lease_in_place(text, text, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.use_in_place() FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.edition() FROM PUBLIC;

-- the operators'
REVOKE ALL ON FUNCTION idempotency.stale_claims(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.resolve_operation(text, text, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.purge_operations(integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.purge_block_range(bigint, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.purge_refuse_transaction_block() FROM PUBLIC;
REVOKE ALL ON PROCEDURE idempotency.purge(integer, interval, bigint) FROM PUBLIC;

-- Citus's (a superuser's)
REVOKE ALL ON FUNCTION idempotency.delegated_functions() FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.object_grants() FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.distribute_grants() FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.grants_on_workers() FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.grants_propagated() FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.grant_propagated(pg_catalog.regclass, pg_catalog.oid) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.distribute() FROM PUBLIC;
