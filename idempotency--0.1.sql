/* idempotency--0.1.sql */

-- complain if script is sourced in psql, rather than via CREATE EXTENSION
\echo Use "CREATE EXTENSION idempotency" to load this file. \quit

CREATE SCHEMA idempotency;
COMMENT ON SCHEMA idempotency IS 'idempotency extension: handled operations, their configuration and the claim protocol';
REVOKE ALL ON SCHEMA idempotency FROM PUBLIC;

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
                 CONSTRAINT job_types_retention_bounded CHECK (retention <= interval '1000 years')
);
COMMENT ON TABLE idempotency.job_types IS
'One row per job type: its lease and what to do with a claim older than the lease (the stale-claim policy). Change it with plain INSERT/UPDATE; claims read it at every call';
COMMENT ON COLUMN idempotency.job_types.job_type IS 'Name of the job type, 1 to 128 bytes';
COMMENT ON COLUMN idempotency.job_types.lease IS 'How long a claim may run before it is stale (a worker may have died); longer than the longest normal run; at most 1000 years';
COMMENT ON COLUMN idempotency.job_types.stale_policy IS 'hold | retry | skip | lookup: the decision taken, in advance, for a stale claim';
COMMENT ON COLUMN idempotency.job_types.max_attempts IS 'Under retry and lookup, a stale claim that has used this many attempts is held instead of taken over; NULL: no limit';
COMMENT ON COLUMN idempotency.job_types.retention IS 'How long completed and skipped records are kept before purge_operations() removes them, at most 1000 years; NULL: forever';

--
-- Records: one row per (job type, operation key). The primary key is the
-- only index on purpose: any index that covers status or a timestamp would
-- make the claimed -> completed update non-HOT.
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
REVOKE ALL ON FUNCTION idempotency.job_types_guard() FROM PUBLIC;

CREATE TRIGGER job_types_guard
    BEFORE DELETE OR UPDATE OF job_type ON idempotency.job_types
    FOR EACH ROW EXECUTE FUNCTION idempotency.job_types_guard();
COMMENT ON TRIGGER job_types_guard ON idempotency.job_types IS
'Keeps job types that still have operations';

--
-- The protocol (C). Each function runs its statements with the rights of
-- the owner of idempotency.operations; EXECUTE on the function is the
-- permission. Nothing is granted to PUBLIC.
--

CREATE FUNCTION idempotency.claim_operation(
    job_type text,
    operation_key text,
    fingerprint text DEFAULT NULL,
    worker text DEFAULT NULL)
RETURNS TABLE (verdict text, attempt integer, result jsonb)
AS 'MODULE_PATHNAME', 'claim_operation'
LANGUAGE c VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE ROWS 1;
COMMENT ON FUNCTION idempotency.claim_operation(text, text, text, text) IS
'Claim an operation before doing its work. Exactly one row: verdict run | verify (do the work, then complete_operation with the returned attempt) or completed | in_progress | held | skipped (stop)';

CREATE FUNCTION idempotency.complete_operation(
    job_type text,
    operation_key text,
    attempt integer,
    result jsonb DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'complete_operation'
LANGUAGE c VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION idempotency.complete_operation(text, text, integer, jsonb) IS
'Record that the effect happened. attempt is the fencing token returned by the claim: an attempt that was taken over is refused (SQLSTATE ID003); repeating a completion is a no-op';

CREATE FUNCTION idempotency.release_operation(
    job_type text,
    operation_key text,
    attempt integer)
RETURNS void
AS 'MODULE_PATHNAME', 'release_operation'
LANGUAGE c VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION idempotency.release_operation(text, text, integer) IS
'Record that the effect did not happen (a known failure): the record becomes released and the next claim runs with attempt + 1. Fenced like complete_operation';

CREATE FUNCTION idempotency.extend_lease(
    job_type text,
    operation_key text,
    attempt integer)
RETURNS timestamptz
AS 'MODULE_PATHNAME', 'extend_lease'
LANGUAGE c VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION idempotency.extend_lease(text, text, integer) IS
'Heartbeat for a long job: the claim''s lease restarts now; returns the new expiry. Fenced like complete_operation';

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
-- Nothing is granted to PUBLIC; see README "Roles and grants".
--

REVOKE ALL ON FUNCTION idempotency.claim_operation(text, text, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.complete_operation(text, text, integer, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.release_operation(text, text, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.extend_lease(text, text, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.stale_claims(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.resolve_operation(text, text, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.purge_operations(integer) FROM PUBLIC;
