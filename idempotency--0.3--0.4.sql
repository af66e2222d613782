/* idempotency--0.3--0.4.sql */

-- complain if script is sourced in psql, rather than via CREATE EXTENSION
\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.4'" to load this file. \quit

--
-- Calls in place (Citus)
--
-- distribute() makes claim_operation, complete_operation, release_operation
-- and extend_lease Citus distributed functions (delegated to the node that
-- holds the key). Citus plans a statement that calls a distributed function
-- afresh at every execution (a distributed function with a parameter never
-- gets a generic plan), before the call is made: on the key's own worker
-- that planning is about a third of the call's cost (bench/citus/README.md).
--
-- The four functions below are the same C entry points under other names,
-- which distribute() does not delegate: to Citus a statement that calls one
-- is a plain function call, planned as on one node (a prepared statement
-- gets its generic plan after five executions). Each call decides where its
-- key is, as every call does: on the node that holds the key's only shard
-- placement, a statement that is nothing but the call and is its own
-- transaction works on that shard directly; otherwise (the key on another
-- node, a transaction block, a larger statement, the coordinator) the call
-- goes through Citus's planner to the key's shard, as an undelegated call
-- always has. Verdicts, fencing, errors and SQLSTATEs are the same as the
-- delegated functions'. On one node they are the same functions too.
--
-- use_in_place() tells a client (the helpers) whether to use them: true on
-- a Citus worker that holds the metadata of the distributed install, when
-- the caller may execute them.
--
-- The grants on the delegated functions are carried over to their in-place
-- twins, as the users' own grants (taken out of pg_init_privs, so that
-- pg_dump dumps them): a worker role that could claim can claim in place.
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

REVOKE ALL ON FUNCTION idempotency.claim_operation_in_place(text, text, text, text, text, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.complete_operation_in_place(text, text, integer, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.release_operation_in_place(text, text, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.extend_lease_in_place(text, text, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.use_in_place() FROM PUBLIC;

-- the grants of the delegated functions, carried over (see above)
DO $update$
DECLARE
    pair      pg_catalog.text[];
    old_oid   pg_catalog.oid;
    new_oid   pg_catalog.oid;
    old_acl   pg_catalog.aclitem[];
    old_owner pg_catalog.oid;
    init_acl  pg_catalog.aclitem[];
    g         record;
BEGIN
    FOREACH pair SLICE 1 IN ARRAY ARRAY[
        ['idempotency.claim_operation(text, text, text, text, text, boolean)',
         'idempotency.claim_operation_in_place(text, text, text, text, text, boolean)'],
        ['idempotency.complete_operation(text, text, integer, jsonb)',
         'idempotency.complete_operation_in_place(text, text, integer, jsonb)'],
        ['idempotency.release_operation(text, text, integer)',
         'idempotency.release_operation_in_place(text, text, integer)'],
        ['idempotency.extend_lease(text, text, integer)',
         'idempotency.extend_lease_in_place(text, text, integer)'],
        ['idempotency.use_in_place()', 'idempotency.use_in_place()']]
    LOOP
        -- use_in_place() takes the grants of claim_operation(): whoever may
        -- claim may ask where
        IF pair[1] OPERATOR(pg_catalog.=) 'idempotency.use_in_place()' THEN
            old_oid := 'idempotency.claim_operation(text, text, text, text, text, boolean)'::pg_catalog.regprocedure;
        ELSE
            old_oid := pair[1]::pg_catalog.regprocedure;
        END IF;
        new_oid := pair[2]::pg_catalog.regprocedure;
        SELECT p.proacl, p.proowner INTO old_acl, old_owner
          FROM pg_catalog.pg_proc p WHERE p.oid OPERATOR(pg_catalog.=) old_oid;
        SELECT p.proacl INTO init_acl
          FROM pg_catalog.pg_proc p WHERE p.oid OPERATOR(pg_catalog.=) new_oid;
        FOR g IN
            SELECT a.grantee, a.is_grantable
              FROM pg_catalog.aclexplode(old_acl) a
             WHERE a.privilege_type OPERATOR(pg_catalog.=) 'EXECUTE'
               AND a.grantee OPERATOR(pg_catalog.<>) old_owner
        LOOP
            EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %s%s', pair[2],
                                      CASE WHEN g.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                                           ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(g.grantee)) END,
                                      CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
        END LOOP;
        -- what the extension itself grants: owner only
        UPDATE pg_catalog.pg_init_privs
           SET initprivs = init_acl
         WHERE objoid OPERATOR(pg_catalog.=) new_oid
           AND classoid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
           AND objsubid OPERATOR(pg_catalog.=) 0;
    END LOOP;
END
$update$;
