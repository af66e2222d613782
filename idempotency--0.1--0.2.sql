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
-- Paced purge
--

-- (purge section)
