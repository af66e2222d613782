/*
 * portable/common.sql: what the worker and operator functions share: their
 * refusals (each the C edition's message, SQLSTATE, detail and hint, from
 * src/util.c) and who the caller is.
 *
 * The refusals are functions of their own so that the hot paths stay short:
 * a worker function tests its arguments with plain comparisons and calls
 * one of these only when a test fails. None is granted to anyone: only the
 * extension's SECURITY DEFINER functions call them.
 */

--
-- Who called. The worker functions are SECURITY DEFINER (they run their
-- statements with the rights of the owner of idempotency.operations, as the
-- C edition's do), so current_user inside them is that owner. The caller is
-- the role the session acts as: the one SET ROLE chose, else the session's
-- user. (A SECURITY DEFINER function of the application that calls a worker
-- function is, to the C edition, its owner; to this one, the session's
-- role. docs/portable.md lists this difference.)
--
CREATE OR REPLACE FUNCTION idempotency.caller()
RETURNS pg_catalog.name
LANGUAGE sql STABLE
AS $$
SELECT COALESCE(NULLIF(pg_catalog.current_setting('role'), 'none'),
                SESSION_USER::pg_catalog.text)::pg_catalog.name
$$;
COMMENT ON FUNCTION idempotency.caller() IS
'Portable edition, internal: the role a worker function was called by (the role SET ROLE chose, else the session''s user), which its job type''s worker_role is checked against';

--
-- A bad argument: NULL is 22004, empty 22023, too long 22001, each with
-- its own message (src/util.c, arg_name() and the checks after it). `what`
-- names the argument; `val` is its value, as text.
--
CREATE OR REPLACE FUNCTION idempotency.bad_argument(what pg_catalog.text, val pg_catalog.text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    hint    pg_catalog.text;
    maxlen  pg_catalog.int4;
BEGIN
    IF what IN ('job_type', 'operation_key') THEN
        IF what = 'job_type' THEN
            hint := 'Pass the name of a job type registered in idempotency.job_types.';
            maxlen := 128;
        ELSE
            hint := 'Pass the key that names the effect, for example the order number (not the queue''s message id).';
            maxlen := 1024;
        END IF;
        IF val IS NULL THEN
            RAISE EXCEPTION '% must not be null', what USING ERRCODE = 'null_value_not_allowed',
                DETAIL = 'An operation is named by its job type and its operation key; neither may be NULL.',
                HINT = hint;
        END IF;
        IF pg_catalog.octet_length(val) = 0 THEN
            RAISE EXCEPTION '% must not be empty', what USING ERRCODE = 'invalid_parameter_value',
                DETAIL = 'An operation is named by its job type and its operation key; neither may be an empty string.',
                HINT = hint;
        END IF;
        RAISE EXCEPTION '% is too long', what USING ERRCODE = 'string_data_right_truncation',
            DETAIL = pg_catalog.format('It is %s bytes long; the limit is %s bytes.', pg_catalog.octet_length(val), maxlen),
            HINT = 'Use a shorter identifier, or a hash of the long one (for example sha256).';
    END IF;
    IF what = 'delivery' THEN
        IF pg_catalog.octet_length(val) = 0 THEN
            RAISE EXCEPTION 'delivery must not be empty' USING ERRCODE = 'invalid_parameter_value',
                DETAIL = 'A delivery token names one delivery of a job, so that a retry of the same call gets its own claim back.',
                HINT = 'Pass a token made once per delivery (for example a UUID made when the handler starts, or SQS''s receipt handle), or NULL for none.';
        END IF;
        RAISE EXCEPTION 'delivery is too long' USING ERRCODE = 'string_data_right_truncation',
            DETAIL = pg_catalog.format('It is %s bytes long; the limit is %s bytes.', pg_catalog.octet_length(val), 1024),
            HINT = 'Use a shorter token, for example a UUID made once per delivery.';
    END IF;
    IF what = 'attempt' THEN
        IF val IS NULL THEN
            RAISE EXCEPTION 'attempt must not be null' USING ERRCODE = 'null_value_not_allowed',
                DETAIL = 'The attempt is the fencing token that shows the caller still owns the claim.',
                HINT = 'Pass the attempt that claim_operation() returned.';
        END IF;
        RAISE EXCEPTION 'attempt must be positive, not %', val USING ERRCODE = 'invalid_parameter_value',
            DETAIL = pg_catalog.format('Attempts are numbered from 1; claim_operation() never returns %s.', val),
            HINT = 'Pass the attempt that claim_operation() returned.';
    END IF;
    IF what = 'wait' THEN
        RAISE EXCEPTION 'wait must not be null' USING ERRCODE = 'null_value_not_allowed',
            DETAIL = 'wait => true waits for another transaction''s uncommitted claim of the key (bounded by lock_timeout and statement_timeout); wait => false answers in_progress at once.',
            HINT = 'Pass true or false, or leave wait out (true).';
    END IF;
    RAISE EXCEPTION 'idempotency: no refusal for argument %', what USING ERRCODE = 'internal_error';
END
$$;
COMMENT ON FUNCTION idempotency.bad_argument(pg_catalog.text, pg_catalog.text) IS
'Portable edition, internal: raises the error for a bad argument of a worker function (22004 NULL, 22023 empty or out of range, 22001 too long), with the C edition''s message';

--
-- The checks every worker function makes of its job type, in the C
-- edition's order (require_worker(), src/store.c): registered (ID001),
-- then the caller may work it (42501). Called only when one fails.
--
CREATE OR REPLACE FUNCTION idempotency.unknown_job_type(job_type pg_catalog.text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION 'job type "%" is not registered', job_type
        USING ERRCODE = 'ID001',
              DETAIL = 'A job type needs a lease and a stale-claim policy before its operations can be claimed.',
              HINT = pg_catalog.format('Register it: INSERT INTO idempotency.job_types (job_type, lease, stale_policy) VALUES (''%s'', ''10 minutes'', ''hold'');', job_type);
END
$$;
COMMENT ON FUNCTION idempotency.unknown_job_type(pg_catalog.text) IS
'Portable edition, internal: raises ID001 (the job type is not registered)';

CREATE OR REPLACE FUNCTION idempotency.deny_job_type(job_type pg_catalog.text, worker_role pg_catalog.oid)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    role    pg_catalog.name;
BEGIN
    SELECT r.rolname INTO role FROM pg_catalog.pg_roles r WHERE r.oid = worker_role;
    IF role IS NOT NULL THEN
        RAISE EXCEPTION 'permission denied for job type "%"', job_type
            USING ERRCODE = 'insufficient_privilege',
                  DETAIL = pg_catalog.format('Only role "%s" and the roles that inherit its privileges may work this job type.', role),
                  HINT = pg_catalog.format('Work it as a member of "%s" (GRANT "%s" TO "%s"), or change idempotency.job_types.worker_role.',
                                           role, role, idempotency.caller());
    END IF;
    RAISE EXCEPTION 'permission denied for job type "%"', job_type
        USING ERRCODE = 'insufficient_privilege',
              DETAIL = 'Its worker_role names a role that no longer exists, so no role but a superuser may work it.',
              HINT = 'Set idempotency.job_types.worker_role to an existing role.';
END
$$;
COMMENT ON FUNCTION idempotency.deny_job_type(pg_catalog.text, pg_catalog.oid) IS
'Portable edition, internal: raises 42501 (the caller may not work the job type, whose worker_role is given)';

-- May the caller work a job type whose worker_role is `worker_role`? (NULL:
-- any caller.) pg_has_role() of a role that no longer exists answers true
-- for a superuser only, the C edition's rule. caller() and this have no
-- SET clause and no subquery, so that a statement that calls them inlines
-- them; every name is qualified instead.
CREATE OR REPLACE FUNCTION idempotency.may_work(worker_role pg_catalog.oid)
RETURNS boolean
LANGUAGE sql STABLE
AS $$
SELECT worker_role IS NULL OR pg_catalog.pg_has_role(idempotency.caller(), worker_role, 'USAGE')
$$;
COMMENT ON FUNCTION idempotency.may_work(pg_catalog.oid) IS
'Portable edition, internal: may the caller work a job type whose worker_role is this role (NULL: any role; a role that no longer exists: only a superuser)?';

CREATE OR REPLACE FUNCTION idempotency.no_record(job_type pg_catalog.text, operation_key pg_catalog.text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION 'operation "%" of job type "%" has no record', operation_key, job_type
        USING ERRCODE = 'ID004',
              DETAIL = 'It was never claimed, or its record was purged after its job type''s retention.',
              HINT = 'Call idempotency.claim_operation() first and use the attempt it returns.';
END
$$;
COMMENT ON FUNCTION idempotency.no_record(pg_catalog.text, pg_catalog.text) IS
'Portable edition, internal: raises ID004 (the operation has no record)';

-- The record changed under every one of 16 reads: a serialization failure,
-- which clients retry anyway (src/util.c, idem_too_many_tries()).
CREATE OR REPLACE FUNCTION idempotency.too_many_tries(action pg_catalog.text, job_type pg_catalog.text,
                                                      operation_key pg_catalog.text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION 'could not % operation "%" of job type "%"', action, operation_key, job_type
        USING ERRCODE = 'serialization_failure',
              DETAIL = 'The record changed under 16 consecutive attempts to read it.',
              HINT = 'Retry the call.';
END
$$;
COMMENT ON FUNCTION idempotency.too_many_tries(pg_catalog.text, pg_catalog.text, pg_catalog.text) IS
'Portable edition, internal: raises 40001 when the record changed under every one of 16 reads';

-- A worker function may not run on a standby or in a read-only transaction
-- (25006, as PreventCommandDuringRecovery() and PreventCommandIfReadOnly()
-- say it); `fname` as "claim_operation()".
CREATE OR REPLACE FUNCTION idempotency.refuse_read_only(fname pg_catalog.text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF pg_catalog.pg_is_in_recovery() THEN
        RAISE EXCEPTION 'cannot execute % during recovery', fname
            USING ERRCODE = 'read_only_sql_transaction';
    END IF;
    RAISE EXCEPTION 'cannot execute % in a read-only transaction', fname
        USING ERRCODE = 'read_only_sql_transaction';
END
$$;
COMMENT ON FUNCTION idempotency.refuse_read_only(pg_catalog.text) IS
'Portable edition, internal: raises 25006 for a worker function called on a standby or in a read-only transaction';

--
-- The arrays of a batch (src/batch.c, array_arg(), same_length() and
-- text_element()): each refusal with the C edition's message.
--
CREATE OR REPLACE FUNCTION idempotency.check_batch_array(name pg_catalog.text, arr anyarray, required boolean)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF arr IS NULL THEN
        IF required THEN
            RAISE EXCEPTION '% must not be null', name USING ERRCODE = 'null_value_not_allowed',
                HINT = 'Pass an array, one element per key; an empty array for none.';
        END IF;
        RETURN;
    END IF;
    IF pg_catalog.array_ndims(arr) > 1 THEN
        RAISE EXCEPTION '% must be a one-dimensional array', name USING ERRCODE = 'invalid_parameter_value',
            DETAIL = pg_catalog.format('It has %s dimensions.', pg_catalog.array_ndims(arr));
    END IF;
    IF pg_catalog.cardinality(arr) > 1000 THEN
        RAISE EXCEPTION '% has % elements; a batch has at most %', name, pg_catalog.cardinality(arr), 1000
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Split the batch: one transaction per 1000 keys at most keeps its locks and its WAL short.';
    END IF;
END
$$;
COMMENT ON FUNCTION idempotency.check_batch_array(pg_catalog.text, anyarray, boolean) IS
'Portable edition, internal: refuses a batch''s array argument that is NULL where required (22004), not one-dimensional or longer than 1000 elements (22023)';

CREATE OR REPLACE FUNCTION idempotency.check_batch_length(name pg_catalog.text, arr anyarray, nkeys pg_catalog.int4)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF pg_catalog.cardinality(arr) <> nkeys THEN
        RAISE EXCEPTION '% has % elements and operation_keys has %', name, pg_catalog.cardinality(arr), nkeys
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'The arrays of a batch are parallel: element i of each belongs to operation_keys[i].',
                  HINT = 'Pass one element per key (NULL for none), or NULL for the whole array.';
    END IF;
END
$$;
COMMENT ON FUNCTION idempotency.check_batch_length(pg_catalog.text, anyarray, pg_catalog.int4) IS
'Portable edition, internal: refuses (22023) an optional array of a batch that has not one element per key';

-- Each element of a text array of a batch: NULL (if required), empty or
-- longer than maxbytes is refused, numbered from 1.
CREATE OR REPLACE FUNCTION idempotency.check_batch_texts(name pg_catalog.text, arr pg_catalog.text[],
                                                         maxbytes pg_catalog.int4, required boolean)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    e   pg_catalog.text;
    i   pg_catalog.int4 := 0;
BEGIN
    IF arr IS NULL THEN
        RETURN;
    END IF;
    FOREACH e IN ARRAY arr LOOP
        i := i + 1;
        IF e IS NULL THEN
            IF required THEN
                RAISE EXCEPTION '%[%] must not be null', name, i USING ERRCODE = 'null_value_not_allowed',
                    DETAIL = 'An operation is named by its job type and its operation key; neither may be NULL.';
            END IF;
            CONTINUE;
        END IF;
        IF pg_catalog.octet_length(e) = 0 THEN
            RAISE EXCEPTION '%[%] must not be empty', name, i USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF pg_catalog.octet_length(e) > maxbytes THEN
            RAISE EXCEPTION '%[%] is too long', name, i USING ERRCODE = 'string_data_right_truncation',
                DETAIL = pg_catalog.format('It is %s bytes long; the limit is %s bytes.', pg_catalog.octet_length(e), maxbytes);
        END IF;
    END LOOP;
END
$$;
COMMENT ON FUNCTION idempotency.check_batch_texts(pg_catalog.text, pg_catalog.text[], pg_catalog.int4, boolean) IS
'Portable edition, internal: refuses an element of a batch''s text array that is NULL where required (22004), empty (22023) or too long (22001), numbered from 1';

-- An array as the C edition reads it: its elements numbered from 1,
-- whatever its lower bound. (Not inlined: the batches call it only for an
-- array whose lower bound is not 1.)
CREATE OR REPLACE FUNCTION idempotency.from_one(arr anyarray)
RETURNS anyarray
LANGUAGE sql IMMUTABLE
AS $$
SELECT CASE WHEN arr IS NULL OR pg_catalog.array_lower(arr, 1) OPERATOR(pg_catalog.=) 1 THEN arr
            ELSE ARRAY(SELECT pg_catalog.unnest(arr)) END
$$;
COMMENT ON FUNCTION idempotency.from_one(anyarray) IS
'Portable edition, internal: an array''s elements numbered from 1, whatever its lower bound';
