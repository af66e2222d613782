/*
 * portable/edition.sql: idempotency.edition(), the one way a client tells
 * the editions apart, and what only the C edition has (docs/portable.md,
 * "What only the C edition has"): Citus's distribute() and its
 * companions, and the *_in_place names. Here each of those is defined with
 * the C edition's arguments and return type, and a call raises one clear
 * error (0A000) naming the edition, never "function does not exist".
 * use_in_place() is a question, not an action: it answers false, as it
 * does on one node, so a helper that asks it works here. Each keeps the C
 * declaration's volatility and ROWS (sql/api.sql compares them).
 */

CREATE OR REPLACE FUNCTION idempotency.edition(OUT edition text, OUT version text)
RETURNS record
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT 'portable'::pg_catalog.text, '@VERSION@'::pg_catalog.text $$;
COMMENT ON FUNCTION idempotency.edition() IS
'Which edition of idempotency answers in this database and its version: edition c (the C extension) or portable (SQL and PL/pgSQL, installed with pg_tle or as a plain script); the one way a client tells them apart';

CREATE OR REPLACE FUNCTION idempotency.c_only(fname pg_catalog.text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION 'idempotency.% is not in the portable edition', fname
        USING ERRCODE = 'feature_not_supported',
              DETAIL = 'The portable edition (SQL and PL/pgSQL, installed with pg_tle or as a plain script) has no Citus support and no *_in_place functions; only the C extension has them.',
              HINT = CASE WHEN fname LIKE '%\_in\_place(%'
                          THEN 'Call the function without _in_place: on one node it is the same function.'
                          ELSE 'Distributing the records needs the C extension on a server of your own (docs/portable.md, "Moving between editions").' END;
END
$$;
COMMENT ON FUNCTION idempotency.c_only(pg_catalog.text) IS
'Portable edition, internal: raises 0A000 for a function only the C edition has';

CREATE OR REPLACE FUNCTION idempotency.claim_operation_in_place(job_type text, operation_key text, fingerprint text DEFAULT NULL, worker text DEFAULT NULL, delivery text DEFAULT NULL, wait boolean DEFAULT true)
RETURNS TABLE (verdict text, attempt integer, result jsonb)
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE ROWS 1
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM idempotency.c_only('claim_operation_in_place()');
END
$$;
COMMENT ON FUNCTION idempotency.claim_operation_in_place(text, text, text, text, text, boolean) IS
'C edition only. claim_operation(), run where it is called: never delegated by Citus, so a statement calling it gets a generic plan. For a worker connected to a Citus worker node: a key whose shard is on that node is claimed there directly, any other through Citus. Same verdicts, arguments and SQLSTATEs as claim_operation()';

CREATE OR REPLACE FUNCTION idempotency.complete_operation_in_place(job_type text, operation_key text, attempt integer, result jsonb DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM idempotency.c_only('complete_operation_in_place()');
END
$$;
COMMENT ON FUNCTION idempotency.complete_operation_in_place(text, text, integer, jsonb) IS
'C edition only. complete_operation(), run where it is called (never delegated by Citus; see claim_operation_in_place()). Same fencing and SQLSTATEs (ID003 superseded, ID004 no record, ID005 wrong state, 42501)';

CREATE OR REPLACE FUNCTION idempotency.release_operation_in_place(job_type text, operation_key text, attempt integer)
RETURNS void
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM idempotency.c_only('release_operation_in_place()');
END
$$;
COMMENT ON FUNCTION idempotency.release_operation_in_place(text, text, integer) IS
'C edition only. release_operation(), run where it is called (never delegated by Citus; see claim_operation_in_place()). Same fencing and SQLSTATEs';

CREATE OR REPLACE FUNCTION idempotency.extend_lease_in_place(job_type text, operation_key text, attempt integer)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM idempotency.c_only('extend_lease_in_place()');
END
$$;
COMMENT ON FUNCTION idempotency.extend_lease_in_place(text, text, integer) IS
'C edition only. extend_lease(), run where it is called (never delegated by Citus; see claim_operation_in_place()). Same fencing and SQLSTATEs';

CREATE OR REPLACE FUNCTION idempotency.distribute()
RETURNS void
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM idempotency.c_only('distribute()');
END
$$;
COMMENT ON FUNCTION idempotency.distribute() IS
'C edition only. Citus: on the coordinator, make job_types and resolutions reference tables and distribute operations by operation_key (the records moved into the shards, the job-type guards replaced by a foreign key), delegate the four worker functions to the node holding the key, and make the grants on every node (distribute_grants()). Once; 55000 without Citus, off the coordinator, when already distributed or when Citus refuses a step; 25001 in a transaction that already ran a parallel query on a distributed table; nothing changed by a refusal';

CREATE OR REPLACE FUNCTION idempotency.distribute_grants()
RETURNS void
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM idempotency.c_only('distribute_grants()');
END
$$;
COMMENT ON FUNCTION idempotency.distribute_grants() IS
'C edition only. Citus: on the coordinator of a distributed install, make every worker grant exactly what the coordinator grants on the extension''s schema, tables and functions (Citus propagates only those on the tables and the delegated functions). Run after GRANT or REVOKE on them, as a transaction of its own; safe to run again; 55000 without Citus, off the coordinator, before distribute(), or when a worker refuses';

CREATE OR REPLACE FUNCTION idempotency.grants_on_workers()
RETURNS void
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM idempotency.c_only('grants_on_workers()');
END
$$;
COMMENT ON FUNCTION idempotency.grants_on_workers() IS
'C edition only. Citus, internal to distribute() and distribute_grants(): on each worker, in one transaction, the grants on the extension''s objects whose grants Citus does not propagate made equal to the coordinator''s';

CREATE OR REPLACE FUNCTION idempotency.grants_propagated()
RETURNS void
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM idempotency.c_only('grants_propagated()');
END
$$;
COMMENT ON FUNCTION idempotency.grants_propagated() IS
'C edition only. Citus, internal to distribute() and distribute_grants(): the grants on the Citus tables and the delegated functions made again on the coordinator, which Citus propagates to the workers';

CREATE OR REPLACE FUNCTION idempotency.grant_propagated(classid pg_catalog.regclass, objid pg_catalog.oid)
RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM idempotency.c_only('grant_propagated()');
END
$$;
COMMENT ON FUNCTION idempotency.grant_propagated(pg_catalog.regclass, pg_catalog.oid) IS
'C edition only. Citus, internal to distribute_grants(): does Citus propagate GRANT and REVOKE on this object itself (a Citus table, or a distributed function)?';

CREATE OR REPLACE FUNCTION idempotency.use_in_place()
RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT false $$;
COMMENT ON FUNCTION idempotency.use_in_place() IS
'Should a worker connected here call the *_in_place functions instead of the delegated ones? True on a Citus worker that holds the distributed install''s metadata, when the caller may execute all four; false on one node and on the coordinator';

CREATE OR REPLACE FUNCTION idempotency.delegated_functions()
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

CREATE OR REPLACE FUNCTION idempotency.object_grants()
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
