/*
 * portable/to-c.sql: move a database from the portable edition installed as
 * a plain script to the C extension, in one transaction, every job type,
 * record (claims in flight too: a worker completes its claim afterwards
 * with the attempt it holds) and audit row kept, and the grants made again
 * on the new objects of the same names.
 *
 *     psql -v ON_ERROR_STOP=1 -d DB -f portable/to-c.sql
 *
 * Run by a superuser (the C extension needs one to be created) on a server
 * where the C extension is installed (make install, or the .deb) at the
 * portable install's version or newer. Workers may keep running: their
 * writes wait for this transaction; a call that waited fails once (its
 * function was replaced) and its job is retried by the queue, and nothing
 * it did is lost, because the call did nothing. docs/portable.md, "Moving
 * between editions"; test/portable/editions.sh runs it.
 */
\set ON_ERROR_STOP on
BEGIN;

DO $check$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname OPERATOR(pg_catalog.=) 'idempotency') THEN
        RAISE EXCEPTION 'idempotency is an extension in this database (the C edition, or the portable edition through pg_tle)'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'This script moves a plain-script install. From pg_tle: pg_dump the database and restore it where the C extension is installed (docs/portable.md).';
    END IF;
    IF pg_catalog.to_regprocedure('idempotency.edition()') IS NULL THEN
        RAISE EXCEPTION 'no portable edition of idempotency in this database'
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
END
$check$;

-- claims in flight finish first; new ones wait for this transaction
LOCK TABLE idempotency.job_types, idempotency.operations, idempotency.resolutions IN EXCLUSIVE MODE;

CREATE TEMPORARY TABLE idempotency_grants ON COMMIT DROP AS
SELECT g.object, g.privilege, g.grantee, g.grantable FROM idempotency.object_grants() g;

ALTER SCHEMA idempotency RENAME TO idempotency_moving;
CREATE EXTENSION idempotency;

INSERT INTO idempotency.job_types (job_type, lease, stale_policy, max_attempts, retention, worker_role)
SELECT job_type, lease, stale_policy::text::idempotency.stale_policy, max_attempts, retention, worker_role
FROM idempotency_moving.job_types;
INSERT INTO idempotency.operations (job_type, operation_key, status, attempt, claimed_at, heartbeat_at,
                                    completed_at, claimed_by, fingerprint, result, delivery)
SELECT job_type, operation_key, status::text::idempotency.operation_status, attempt, claimed_at, heartbeat_at,
       completed_at, claimed_by, fingerprint, result, delivery
FROM idempotency_moving.operations;
INSERT INTO idempotency.resolutions (id, job_type, operation_key, attempt, previous_status, resolution,
                                     resolved_by, resolved_at, note)
OVERRIDING SYSTEM VALUE
SELECT id, job_type, operation_key, attempt, previous_status::text::idempotency.operation_status, resolution,
       resolved_by, resolved_at, note
FROM idempotency_moving.resolutions;
SELECT pg_catalog.setval('idempotency.resolutions_id_seq', s.last_value, s.is_called)
FROM idempotency_moving.resolutions_id_seq s;

-- the grants again, on the objects of the same names that this edition has
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

\ir moving-drop.sql
COMMIT;
