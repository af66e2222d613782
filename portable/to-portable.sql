/*
 * portable/to-portable.sql: move a database from the C extension to the
 * portable edition as a plain script (a server without the C library, or
 * before a move to a managed service), in one transaction, every job
 * type, record (claims in flight too) and audit row kept, and the grants
 * made again on the objects of the same names.
 *
 *     sh portable/build.sh /tmp/idem        # writes the body, idempotency--VERSION.sql
 *     psql -v ON_ERROR_STOP=1 -d DB -v body=/tmp/idem/idempotency--VERSION.sql \
 *          -f portable/to-portable.sql
 *
 * Run by a superuser or the extension's owner; the new objects belong to
 * the role that runs it (ALTER ... OWNER TO the database's owner after, if
 * that is another role). The portable edition must be at the C extension's
 * version or newer. A Citus install (distribute()) cannot move. Workers may
 * keep running, as with to-c.sql. docs/portable.md, "Moving between
 * editions"; test/portable/editions.sh runs it.
 */
\set ON_ERROR_STOP on
BEGIN;

DO $check$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname OPERATOR(pg_catalog.=) 'idempotency') THEN
        RAISE EXCEPTION 'the idempotency extension is not installed in this database'
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    -- nested: pg_dist_partition is read only where Citus is
    IF EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname OPERATOR(pg_catalog.=) 'citus') THEN
        IF EXISTS (SELECT FROM pg_catalog.pg_dist_partition
                   WHERE logicalrelid OPERATOR(pg_catalog.=) 'idempotency.operations'::pg_catalog.regclass) THEN
            RAISE EXCEPTION 'the idempotency install is distributed with Citus'
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      DETAIL = 'The portable edition has no Citus support.';
        END IF;
    END IF;
END
$check$;

LOCK TABLE idempotency.job_types, idempotency.operations, idempotency.resolutions IN EXCLUSIVE MODE;

CREATE TEMPORARY TABLE idempotency_grants ON COMMIT DROP AS
SELECT g.object, g.privilege, g.grantee, g.grantable FROM idempotency.object_grants() g;
CREATE TEMPORARY TABLE idempotency_job_types ON COMMIT DROP AS
SELECT job_type, lease, stale_policy::text AS stale_policy, max_attempts, retention, worker_role
FROM idempotency.job_types;
CREATE TEMPORARY TABLE idempotency_operations ON COMMIT DROP AS
SELECT job_type, operation_key, status::text AS status, attempt, claimed_at, heartbeat_at,
       completed_at, claimed_by, fingerprint, result, delivery
FROM idempotency.operations;
CREATE TEMPORARY TABLE idempotency_resolutions ON COMMIT DROP AS
SELECT id, job_type, operation_key, attempt, previous_status::text AS previous_status, resolution,
       resolved_by, resolved_at, note
FROM idempotency.resolutions;
CREATE TEMPORARY TABLE idempotency_seq ON COMMIT DROP AS
SELECT last_value, is_called FROM idempotency.resolutions_id_seq;

-- without CASCADE: an application's object that depends on the extension
-- stops the move here (2BP01), and nothing changes
DROP EXTENSION idempotency;

\i :body

INSERT INTO idempotency.job_types (job_type, lease, stale_policy, max_attempts, retention, worker_role)
SELECT job_type, lease, stale_policy::idempotency.stale_policy, max_attempts, retention, worker_role
FROM idempotency_job_types;
INSERT INTO idempotency.operations (job_type, operation_key, status, attempt, claimed_at, heartbeat_at,
                                    completed_at, claimed_by, fingerprint, result, delivery)
SELECT job_type, operation_key, status::idempotency.operation_status, attempt, claimed_at, heartbeat_at,
       completed_at, claimed_by, fingerprint, result, delivery
FROM idempotency_operations;
INSERT INTO idempotency.resolutions (id, job_type, operation_key, attempt, previous_status, resolution,
                                     resolved_by, resolved_at, note)
OVERRIDING SYSTEM VALUE
SELECT id, job_type, operation_key, attempt, previous_status::idempotency.operation_status, resolution,
       resolved_by, resolved_at, note
FROM idempotency_resolutions;
SELECT pg_catalog.setval('idempotency.resolutions_id_seq', s.last_value, s.is_called) FROM idempotency_seq s;

DO $grants$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT * FROM idempotency_grants LOOP
        IF (r.object LIKE 'FUNCTION %' AND pg_catalog.to_regprocedure(pg_catalog.substr(r.object, 10)) IS NULL)
           OR (r.object LIKE 'PROCEDURE %' AND pg_catalog.to_regprocedure(pg_catalog.substr(r.object, 11)) IS NULL) THEN
            CONTINUE;
        END IF;
        EXECUTE pg_catalog.format('GRANT %s ON %s TO %s%s', r.privilege, r.object, r.grantee,
                                  CASE WHEN r.grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
END
$grants$;
COMMIT;
