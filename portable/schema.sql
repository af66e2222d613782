/*
 * portable/schema.sql: the portable edition's schema, tables, types,
 * triggers and view: the C edition's (idempotency--0.5.sql), written so that
 * running it again changes nothing (IF NOT EXISTS, CREATE OR REPLACE), which
 * is what lets one body serve as pg_tle's install and update script and as
 * the plain script (portable/README.md).
 *
 * A later version adds what it adds in the same way (ADD COLUMN IF NOT
 * EXISTS, ...), never by dropping: a plain-script upgrade is this body run
 * over the older install, in one transaction.
 */

CREATE SCHEMA IF NOT EXISTS idempotency;
COMMENT ON SCHEMA idempotency IS 'idempotency extension: handled operations, their configuration and the claim protocol';

--
-- Types
--

DO $types$
BEGIN
    IF pg_catalog.to_regtype('idempotency.stale_policy') IS NULL THEN
        CREATE TYPE idempotency.stale_policy AS ENUM ('hold', 'retry', 'skip', 'lookup');
    END IF;
    IF pg_catalog.to_regtype('idempotency.operation_status') IS NULL THEN
        CREATE TYPE idempotency.operation_status AS ENUM ('claimed', 'completed', 'released', 'skipped');
    END IF;
END
$types$;
COMMENT ON TYPE idempotency.stale_policy IS
'What a claim does when it meets a claim older than its lease: hold it for a person, retry (accept a rare duplicate), skip (accept a rare miss), or lookup (take it over with verdict verify, so the worker checks the provider first)';

COMMENT ON TYPE idempotency.operation_status IS
'State of one operation: claimed (a worker owns it), completed (the effect happened), released (it did not; the next claim runs), skipped (a stale claim given up for good by the skip policy)';

--
-- Configuration: one row per job type
--
-- A job type can name the role that works it (worker_role). The worker
-- functions then refuse (SQLSTATE 42501) a caller without that role's
-- privileges before they read or change anything of the job type's
-- operations, so one tenant's workers cannot claim, complete, release,
-- extend or read another tenant's operations. The check is in each worker
-- function (portable/claim.sql, portable/complete.sql).
--

CREATE TABLE IF NOT EXISTS idempotency.job_types (
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

CREATE TABLE IF NOT EXISTS idempotency.operations (
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

CREATE TABLE IF NOT EXISTS idempotency.resolutions (
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

-- pg_dump keeps configuration, records and the audit trail. Only inside
-- CREATE EXTENSION (pg_tle) are the tables extension members, whose data
-- pg_dump leaves out unless told; a plain-script install's tables are
-- ordinary tables, which pg_dump dumps anyway.
DO $dump$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_depend d
               WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
                 AND d.objid OPERATOR(pg_catalog.=) 'idempotency.operations'::pg_catalog.regclass
                 AND d.deptype OPERATOR(pg_catalog.=) 'e') THEN
        PERFORM pg_catalog.pg_extension_config_dump('idempotency.job_types', '');
        PERFORM pg_catalog.pg_extension_config_dump('idempotency.operations', '');
        PERFORM pg_catalog.pg_extension_config_dump('idempotency.resolutions', '');
        PERFORM pg_catalog.pg_extension_config_dump('idempotency.resolutions_id_seq', '');
    END IF;
END
$dump$;

--
-- A job type that still has records cannot be removed or renamed: its
-- records would lose their lease and policy. (A foreign key would do the
-- same but would lock the job type's row on every claim.) The SHARE lock
-- waits for claims in flight and holds new ones back until the removal
-- commits; a claim's INSERT re-checks that its job type exists with a
-- snapshot taken after that wait (the INSERT in portable/claim.sql).
--

CREATE OR REPLACE FUNCTION idempotency.job_types_guard() RETURNS trigger
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

CREATE OR REPLACE TRIGGER job_types_guard
    BEFORE DELETE OR UPDATE OF job_type ON idempotency.job_types
    FOR EACH ROW EXECUTE FUNCTION idempotency.job_types_guard();
COMMENT ON TRIGGER job_types_guard ON idempotency.job_types IS
'Keeps job types that still have operations';

-- TRUNCATE does not fire a row trigger: without this one, job types with
-- records could all go at once. The same refusal, for the statement.

CREATE OR REPLACE FUNCTION idempotency.job_types_truncate_guard() RETURNS trigger
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

CREATE OR REPLACE TRIGGER job_types_truncate_guard
    BEFORE TRUNCATE ON idempotency.job_types
    FOR EACH STATEMENT EXECUTE FUNCTION idempotency.job_types_truncate_guard();
COMMENT ON TRIGGER job_types_truncate_guard ON idempotency.job_types IS
'Keeps job types while operations has records (TRUNCATE)';


--
-- Monitoring
--

CREATE OR REPLACE VIEW idempotency.job_type_stats AS
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
