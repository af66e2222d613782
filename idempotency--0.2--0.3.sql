/* idempotency--0.2--0.3.sql */

-- complain if script is sourced in psql, rather than via CREATE EXTENSION
\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.3'" to load this file. \quit

--
-- Faults between a worker and the database
--
-- A reply that is lost after the server committed a claim (a dropped
-- connection, a pooler restart, a client timeout) used to cost a lease: the
-- worker's retry found its own claim and was told in_progress. A claim now
-- takes a delivery token, a string the caller makes unique to one delivery
-- and reuses only when it retries the same call; a claim whose young record
-- was made by the same delivery gets its own claim back. The record keeps a
-- 64-bit digest of the token and of the verdict it got (run or verify), not
-- the token (SQS's receipt handles run to a kilobyte).
--
-- And a claim that meets another transaction's uncommitted claim of the
-- same key used to wait for that transaction without bound; with
-- wait => false it answers in_progress at once.
--
-- Adding a nullable column without a default rewrites nothing.
--

ALTER TABLE idempotency.operations ADD COLUMN delivery bigint;
COMMENT ON COLUMN idempotency.operations.delivery IS
'Digest (64 bits) of the delivery token given with the claim that holds the current attempt, and of the verdict it got; a retry of that call inside the lease gets the same verdict and attempt. NULL: that claim gave no token';

--
-- claim_operation() gains two parameters. The parameters of a function
-- cannot change in place (CREATE OR REPLACE keeps them), and a second
-- function beside the old one would make every call that leaves the new
-- parameters out ambiguous. So it is dropped and created anew, and what the
-- old one had is carried over: its owner and every grant on it (made again
-- by the owner). The grants are the users' own, not the extension's: they
-- are taken out of pg_init_privs again, so that pg_dump keeps dumping them.
-- An object of the user's that depends on the old function (a view, a
-- function with a SQL-standard body) makes the update fail, and changes
-- nothing.
--

DO $update$
DECLARE
    old_oid   pg_catalog.oid := 'idempotency.claim_operation(text, text, text, text)'::pg_catalog.regprocedure;
    new_oid   pg_catalog.oid;
    old_owner pg_catalog.oid;
    old_acl   pg_catalog.aclitem[];
    init_acl  pg_catalog.aclitem[];
    g         record;
BEGIN
    SELECT p.proowner, p.proacl INTO old_owner, old_acl
      FROM pg_catalog.pg_proc p WHERE p.oid OPERATOR(pg_catalog.=) old_oid;

    DROP FUNCTION idempotency.claim_operation(text, text, text, text);
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
    REVOKE ALL ON FUNCTION idempotency.claim_operation(text, text, text, text, text, boolean) FROM PUBLIC;
    EXECUTE pg_catalog.format('ALTER FUNCTION idempotency.claim_operation(text, text, text, text, text, boolean) OWNER TO %I',
                              pg_catalog.pg_get_userbyid(old_owner));
    new_oid := 'idempotency.claim_operation(text, text, text, text, text, boolean)'::pg_catalog.regprocedure;
    SELECT p.proacl INTO init_acl
      FROM pg_catalog.pg_proc p WHERE p.oid OPERATOR(pg_catalog.=) new_oid;

    FOR g IN
        SELECT a.grantee, a.is_grantable
          FROM pg_catalog.aclexplode(old_acl) a
         WHERE a.privilege_type OPERATOR(pg_catalog.=) 'EXECUTE'
           AND a.grantee OPERATOR(pg_catalog.<>) old_owner
    LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION idempotency.claim_operation(text, text, text, text, text, boolean) TO %s%s',
                                  CASE WHEN g.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                                       ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(g.grantee)) END,
                                  CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;

    -- what the extension itself grants: owner only, as 0.1 made it
    UPDATE pg_catalog.pg_init_privs
       SET initprivs = init_acl
     WHERE objoid OPERATOR(pg_catalog.=) new_oid
       AND classoid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
       AND objsubid OPERATOR(pg_catalog.=) 0;
END
$update$;

COMMENT ON FUNCTION idempotency.claim_operation(text, text, text, text, text, boolean) IS
'Claim an operation before doing its work. Exactly one row: verdict run | verify (do the work, then complete_operation with the returned attempt) or completed | in_progress | held | skipped (stop). delivery: a token unique to this delivery, reused only to retry this call (a retry after a lost reply gets its own claim back). wait => false: in_progress at once instead of waiting for another transaction''s uncommitted claim of the key. A caller without the job type''s worker_role is refused (42501)';

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

REVOKE ALL ON FUNCTION idempotency.claim_operations(text, text[], text[], text, text[], boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.complete_operations(text, text[], integer[], jsonb[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.release_operations(text, text[], integer[]) FROM PUBLIC;

-- Citus (issue 11, not supported yet): where Citus manages the tables, the
-- local relation is an empty shell. purge_block_range() then takes block 0
-- for the whole table, and purge() always makes at least one batch
-- (GREATEST(..., 1), a construct, not a function the search_path could
-- capture). The rest of the procedure is 0.2's, line for line (errors'
-- CONTEXT lines stay the same). CREATE OR REPLACE keeps its grants.
CREATE OR REPLACE PROCEDURE idempotency.purge(
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

COMMENT ON FUNCTION idempotency.purge_block_range(bigint, integer) IS
'Delete the completed and skipped records older than their job type''s retention whose tuples lie in heap blocks first_block .. first_block + blocks - 1 of idempotency.operations (one DELETE, a TID range scan); returns how many. The unit of idempotency.purge(). Where Citus manages the tables, a range from block 0 purges every shard and any other range nothing';

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
REVOKE ALL ON FUNCTION idempotency.delegated_functions() FROM PUBLIC;

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
REVOKE ALL ON FUNCTION idempotency.object_grants() FROM PUBLIC;

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
REVOKE ALL ON FUNCTION idempotency.distribute_grants() FROM PUBLIC;

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
REVOKE ALL ON FUNCTION idempotency.grants_on_workers() FROM PUBLIC;

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
REVOKE ALL ON FUNCTION idempotency.grants_propagated() FROM PUBLIC;

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
REVOKE ALL ON FUNCTION idempotency.grant_propagated(pg_catalog.regclass, pg_catalog.oid) FROM PUBLIC;

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
REVOKE ALL ON FUNCTION idempotency.distribute() FROM PUBLIC;
