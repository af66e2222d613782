/*
 * portable/complete.sql: what the owner of a claim reports,
 * complete_operation(), release_operation() and extend_lease(), and the
 * batches complete_operations() and release_operations(): the C edition's
 * src/complete.c, src/batch.c and the fenced decision of src/protocol.c
 * (idem_decide_fenced()), in PL/pgSQL.
 *
 * Each call is one fenced UPDATE (the attempt is in its WHERE clause), the
 * C edition's statement (COMPLETE_SQL, RELEASE_SQL, EXTEND_SQL with
 * ROLE_MAY_WORK_O, src/statements.c). Only when it updates nothing is the
 * record read, to tell the caller exactly why, or to accept a repeated call
 * as a no-op (idempotency.fenced_refusal()); a record that would take the
 * update after all changed under the call, which updates again, at most 16
 * times in all.
 *
 * What differs, and why:
 *  - The C edition completes a claimed record below SPI (src/heap.c) and
 *    falls back to the statement; here the statement is the only way. Its
 *    outcomes are the same under every isolation level: under READ
 *    COMMITTED the UPDATE follows a concurrent update of the record, under
 *    REPEATABLE READ and SERIALIZABLE it raises the serialization failure,
 *    as the C edition's statement does where its fast path gives way.
 *  - The caller whose worker_role is checked is idempotency.caller() (the
 *    session's role), not current_user, which is the tables' owner inside
 *    these SECURITY DEFINER functions (portable/common.sql says more).
 *  - A batch checks the job type and the caller's right once, before its
 *    first key, and then updates each key without the role check: what
 *    the C edition's batch does on its direct path (one check per batch,
 *    src/heap.c, HeapBatch). A key whose update matches nothing is read
 *    and checked again, as in the C edition.
 */

--
-- The fenced update of `call` ('complete', 'release' or 'extend') matched
-- nothing: read the record and decide (src/complete.c, explain_refusal(),
-- and src/protocol.c, idem_decide_fenced()), and update again while the
-- record would take the update (it changed under the call). The caller ran
-- the first UPDATE; this function runs at most 15 more, then gives up with
-- 40001 (the C edition's 16 tries in all).
--
-- Returns done (updated now, or a repeat of a call already done by this
-- attempt: a no-op) or the refusal that the single calls raise and the
-- batches report on the key's row: ID004 no record, ID003 superseded,
-- ID005 wrong state, each with the C edition's message, detail and hint,
-- computed, not raised. What is the caller's bug raises here, as in the C
-- edition: an unknown job type (ID001), a caller who may not work it
-- (42501), an attempt that no claim returned (22023). expires_at: after an
-- extension, the new expiry.
--
CREATE OR REPLACE FUNCTION idempotency.fenced_refusal(
    call pg_catalog.text,
    job_type pg_catalog.text,
    operation_key pg_catalog.text,
    attempt pg_catalog.int4,
    result pg_catalog.jsonb,
    OUT done boolean,
    OUT sqlstate pg_catalog.text,
    OUT message pg_catalog.text,
    OUT detail pg_catalog.text,
    OUT hint pg_catalog.text,
    OUT expires_at pg_catalog.timestamptz)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    action      pg_catalog.text := CASE fenced_refusal.call WHEN 'extend' THEN 'extend the lease of'
                                        ELSE fenced_refusal.call END;
    jt_found    boolean;
    jt_role     pg_catalog.oid;
    r_status    idempotency.operation_status;
    r_attempt   pg_catalog.int4;
    extra       pg_catalog.text := '';
BEGIN
    done := false;
    FOR tries IN 1 .. 16 LOOP
        -- the worker's lookup: the job type (ID001), the caller's right to
        -- work it (42501), then the record
        jt_found := false;
        SELECT true, jt.worker_role::pg_catalog.oid, o.status, o.attempt
        INTO jt_found, jt_role, r_status, r_attempt
        FROM idempotency.job_types jt
        LEFT JOIN idempotency.operations o
               ON o.job_type = jt.job_type AND o.operation_key = fenced_refusal.operation_key
        WHERE jt.job_type = fenced_refusal.job_type;
        IF NOT FOUND THEN
            PERFORM idempotency.unknown_job_type(fenced_refusal.job_type);
        END IF;
        IF jt_role IS NOT NULL AND NOT idempotency.may_work(jt_role) THEN
            PERFORM idempotency.deny_job_type(fenced_refusal.job_type, jt_role);
        END IF;

        IF r_status IS NULL THEN
            sqlstate := 'ID004';
            message := pg_catalog.format('operation "%s" of job type "%s" has no record',
                                         fenced_refusal.operation_key, fenced_refusal.job_type);
            detail := 'It was never claimed, or its record was purged after its job type''s retention.';
            hint := 'Call idempotency.claim_operation() first and use the attempt it returns.';
            RETURN;
        END IF;
        IF fenced_refusal.attempt < r_attempt THEN
            sqlstate := 'ID003';
            message := pg_catalog.format('attempt %s of operation "%s" of job type "%s" was superseded',
                                         fenced_refusal.attempt, fenced_refusal.operation_key,
                                         fenced_refusal.job_type);
            detail := pg_catalog.format('A later claim started attempt %s, and the record is %s now: the operation was taken over after a lease ran out, or claimed again after it was released by its worker or by a person''s ''retry'' resolution.',
                                        r_attempt, r_status);
            hint := 'Another worker owns this operation now: stop, and record nothing for this attempt.';
            RETURN;
        END IF;
        IF fenced_refusal.attempt > r_attempt THEN
            RAISE EXCEPTION 'attempt % of operation "%" of job type "%" was never issued',
                fenced_refusal.attempt, fenced_refusal.operation_key, fenced_refusal.job_type
                USING ERRCODE = 'invalid_parameter_value',
                      DETAIL = pg_catalog.format('The record''s current attempt is %s, and no claim of it returned a higher one. The attempt belongs to another operation, or to a record that was purged after its retention and claimed anew.',
                                                 r_attempt),
                      HINT = 'Pass the attempt that claim_operation() returned for this job type and operation key.';
        END IF;
        -- done before by this attempt: a no-op (extend_lease has no repeat)
        IF (fenced_refusal.call = 'complete' AND r_status = 'completed')
           OR (fenced_refusal.call = 'release' AND r_status = 'released') THEN
            done := true;
            RETURN;
        END IF;
        -- the states the update accepts: it changed back under the call
        IF NOT (r_status = 'claimed'
                OR (r_status = 'skipped' AND fenced_refusal.call <> 'extend')) THEN
            EXIT;
        END IF;
        IF tries = 16 THEN
            PERFORM idempotency.too_many_tries(action, fenced_refusal.job_type,
                                               fenced_refusal.operation_key);
        END IF;
        IF fenced_refusal.call = 'complete' THEN
            UPDATE idempotency.operations o
            SET status = 'completed', completed_at = pg_catalog.clock_timestamp(),
                result = fenced_refusal.result
            WHERE o.job_type = fenced_refusal.job_type AND o.operation_key = fenced_refusal.operation_key
              AND o.attempt = fenced_refusal.attempt AND (o.status = 'claimed' OR o.status = 'skipped')
              AND EXISTS (SELECT FROM idempotency.job_types jt
                          WHERE jt.job_type = o.job_type
                            AND (jt.worker_role IS NULL OR idempotency.may_work(jt.worker_role)));
        ELSIF fenced_refusal.call = 'release' THEN
            UPDATE idempotency.operations o
            SET status = 'released', completed_at = NULL, result = NULL
            WHERE o.job_type = fenced_refusal.job_type AND o.operation_key = fenced_refusal.operation_key
              AND o.attempt = fenced_refusal.attempt AND (o.status = 'claimed' OR o.status = 'skipped')
              AND EXISTS (SELECT FROM idempotency.job_types jt
                          WHERE jt.job_type = o.job_type
                            AND (jt.worker_role IS NULL OR idempotency.may_work(jt.worker_role)));
        ELSE
            UPDATE idempotency.operations o
            SET heartbeat_at = pg_catalog.clock_timestamp()
            WHERE o.job_type = fenced_refusal.job_type AND o.operation_key = fenced_refusal.operation_key
              AND o.attempt = fenced_refusal.attempt AND o.status = 'claimed'
              AND EXISTS (SELECT FROM idempotency.job_types jt
                          WHERE jt.job_type = o.job_type
                            AND (jt.worker_role IS NULL OR idempotency.may_work(jt.worker_role)))
            RETURNING o.heartbeat_at + (SELECT jt.lease FROM idempotency.job_types jt
                                        WHERE jt.job_type = o.job_type)
            INTO expires_at;
        END IF;
        IF FOUND THEN
            done := true;
            RETURN;
        END IF;
    END LOOP;

    -- the record is in a state that refuses the call (ID005)
    IF r_status = 'released' THEN
        extra := ' This one was released under this attempt, by release_operation() or by a person''s ''retry'' resolution; its next claim runs it again with a new attempt.';
        hint := 'Stop, and record nothing for this attempt. If its effect did happen after all, tell a person: the next delivery will do it again.';
    ELSIF r_status = 'completed' THEN
        hint := 'The operation is done: stop, and acknowledge the message.';
    ELSE
        hint := 'A skipped operation can still be completed or released under this attempt: finish the work, then call complete_operation() or release_operation().';
    END IF;
    sqlstate := 'ID005';
    message := pg_catalog.format('cannot %s operation "%s" of job type "%s": it is %s',
                                 action, fenced_refusal.operation_key, fenced_refusal.job_type, r_status);
    detail := pg_catalog.format('Only a %s operation can be given this call.%s',
                                CASE WHEN fenced_refusal.call = 'extend' THEN 'claimed'
                                     ELSE 'claimed or skipped' END,
                                extra);
END
$$;
COMMENT ON FUNCTION idempotency.fenced_refusal(pg_catalog.text, pg_catalog.text, pg_catalog.text,
                                               pg_catalog.int4, pg_catalog.jsonb) IS
'Portable edition, internal: after a fenced update (complete, release, extend) that matched nothing, reads the record and says why (done as a repeat, or the refusal: ID003, ID004, ID005), updating again while the record changed under the call';

--
-- complete_operation(): claimed or skipped (with no takeover since) ->
-- completed. Completing an already completed record with the same attempt
-- is a no-op; the result stored first is kept.
--
CREATE OR REPLACE FUNCTION idempotency.complete_operation(
    job_type text,
    operation_key text,
    attempt integer,
    result jsonb DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    r   record;
BEGIN
    IF complete_operation.job_type IS NULL
       OR pg_catalog.octet_length(complete_operation.job_type) NOT BETWEEN 1 AND 128 THEN
        PERFORM idempotency.bad_argument('job_type', complete_operation.job_type);
    END IF;
    IF complete_operation.operation_key IS NULL
       OR pg_catalog.octet_length(complete_operation.operation_key) NOT BETWEEN 1 AND 1024 THEN
        PERFORM idempotency.bad_argument('operation_key', complete_operation.operation_key);
    END IF;
    IF complete_operation.attempt IS NULL OR complete_operation.attempt < 1 THEN
        PERFORM idempotency.bad_argument('attempt', complete_operation.attempt::pg_catalog.text);
    END IF;
    IF pg_catalog.current_setting('transaction_read_only')::boolean THEN
        PERFORM idempotency.refuse_read_only('complete_operation()');
    END IF;

    UPDATE idempotency.operations o
    SET status = 'completed', completed_at = pg_catalog.clock_timestamp(),
        result = complete_operation.result
    WHERE o.job_type = complete_operation.job_type AND o.operation_key = complete_operation.operation_key
      AND o.attempt = complete_operation.attempt AND (o.status = 'claimed' OR o.status = 'skipped')
      AND EXISTS (SELECT FROM idempotency.job_types jt
                  WHERE jt.job_type = o.job_type
                    AND (jt.worker_role IS NULL OR idempotency.may_work(jt.worker_role)));
    IF FOUND THEN
        RETURN;
    END IF;

    r := idempotency.fenced_refusal('complete', complete_operation.job_type, complete_operation.operation_key,
                                    complete_operation.attempt, complete_operation.result);
    IF NOT r.done THEN
        RAISE EXCEPTION USING MESSAGE = r.message, ERRCODE = r.sqlstate, DETAIL = r.detail, HINT = r.hint;
    END IF;
END
$$;
COMMENT ON FUNCTION idempotency.complete_operation(text, text, integer, jsonb) IS
'Record that the effect happened. attempt is the fencing token returned by the claim: an attempt that was taken over is refused (SQLSTATE ID003); repeating a completion is a no-op. A caller without the job type''s worker_role is refused (42501)';

--
-- release_operation(): claimed or skipped -> released: the effect did not
-- happen, the next claim runs with attempt + 1. Releasing twice is a no-op.
--
CREATE OR REPLACE FUNCTION idempotency.release_operation(
    job_type text,
    operation_key text,
    attempt integer)
RETURNS void
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    r   record;
BEGIN
    IF release_operation.job_type IS NULL
       OR pg_catalog.octet_length(release_operation.job_type) NOT BETWEEN 1 AND 128 THEN
        PERFORM idempotency.bad_argument('job_type', release_operation.job_type);
    END IF;
    IF release_operation.operation_key IS NULL
       OR pg_catalog.octet_length(release_operation.operation_key) NOT BETWEEN 1 AND 1024 THEN
        PERFORM idempotency.bad_argument('operation_key', release_operation.operation_key);
    END IF;
    IF release_operation.attempt IS NULL OR release_operation.attempt < 1 THEN
        PERFORM idempotency.bad_argument('attempt', release_operation.attempt::pg_catalog.text);
    END IF;
    IF pg_catalog.current_setting('transaction_read_only')::boolean THEN
        PERFORM idempotency.refuse_read_only('release_operation()');
    END IF;

    UPDATE idempotency.operations o
    SET status = 'released', completed_at = NULL, result = NULL
    WHERE o.job_type = release_operation.job_type AND o.operation_key = release_operation.operation_key
      AND o.attempt = release_operation.attempt AND (o.status = 'claimed' OR o.status = 'skipped')
      AND EXISTS (SELECT FROM idempotency.job_types jt
                  WHERE jt.job_type = o.job_type
                    AND (jt.worker_role IS NULL OR idempotency.may_work(jt.worker_role)));
    IF FOUND THEN
        RETURN;
    END IF;

    r := idempotency.fenced_refusal('release', release_operation.job_type, release_operation.operation_key,
                                    release_operation.attempt, NULL);
    IF NOT r.done THEN
        RAISE EXCEPTION USING MESSAGE = r.message, ERRCODE = r.sqlstate, DETAIL = r.detail, HINT = r.hint;
    END IF;
END
$$;
COMMENT ON FUNCTION idempotency.release_operation(text, text, integer) IS
'Record that the effect did not happen (a known failure): the record becomes released and the next claim runs with attempt + 1. Fenced like complete_operation; a caller without the job type''s worker_role is refused (42501)';

--
-- extend_lease(): a heartbeat, the claim's lease restarts now; returns the
-- new expiry. A stale claim that nobody took over yet can still be
-- extended: its worker is evidently alive. There is no repeat of an
-- extension: it either updates or is refused. The C edition reads the new
-- expiry with a lookup after the update; here the update returns it (the
-- new heartbeat plus the job type's lease, as the update's snapshot sees
-- the lease).
--
CREATE OR REPLACE FUNCTION idempotency.extend_lease(
    job_type text,
    operation_key text,
    attempt integer)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    expires     pg_catalog.timestamptz;
    r           record;
BEGIN
    IF extend_lease.job_type IS NULL
       OR pg_catalog.octet_length(extend_lease.job_type) NOT BETWEEN 1 AND 128 THEN
        PERFORM idempotency.bad_argument('job_type', extend_lease.job_type);
    END IF;
    IF extend_lease.operation_key IS NULL
       OR pg_catalog.octet_length(extend_lease.operation_key) NOT BETWEEN 1 AND 1024 THEN
        PERFORM idempotency.bad_argument('operation_key', extend_lease.operation_key);
    END IF;
    IF extend_lease.attempt IS NULL OR extend_lease.attempt < 1 THEN
        PERFORM idempotency.bad_argument('attempt', extend_lease.attempt::pg_catalog.text);
    END IF;
    IF pg_catalog.current_setting('transaction_read_only')::boolean THEN
        PERFORM idempotency.refuse_read_only('extend_lease()');
    END IF;

    UPDATE idempotency.operations o
    SET heartbeat_at = pg_catalog.clock_timestamp()
    WHERE o.job_type = extend_lease.job_type AND o.operation_key = extend_lease.operation_key
      AND o.attempt = extend_lease.attempt AND o.status = 'claimed'
      AND EXISTS (SELECT FROM idempotency.job_types jt
                  WHERE jt.job_type = o.job_type
                    AND (jt.worker_role IS NULL OR idempotency.may_work(jt.worker_role)))
    RETURNING o.heartbeat_at + (SELECT jt.lease FROM idempotency.job_types jt WHERE jt.job_type = o.job_type)
    INTO expires;
    IF FOUND THEN
        RETURN expires;
    END IF;

    r := idempotency.fenced_refusal('extend', extend_lease.job_type, extend_lease.operation_key,
                                    extend_lease.attempt, NULL);
    IF NOT r.done THEN
        RAISE EXCEPTION USING MESSAGE = r.message, ERRCODE = r.sqlstate, DETAIL = r.detail, HINT = r.hint;
    END IF;
    RETURN r.expires_at;
END
$$;
COMMENT ON FUNCTION idempotency.extend_lease(text, text, integer) IS
'Heartbeat for a long job: the claim''s lease restarts now; returns the new expiry. Fenced like complete_operation; a caller without the job type''s worker_role is refused (42501)';

--
-- complete_operations() and release_operations() (src/batch.c,
-- finish_batch()): the arguments checked in the C edition's order, then
-- the keys one after the other, each as the single call would do it, in
-- one order (by their bytes, COLLATE "C", then by their place in the
-- array): two batches that share keys lock them in the same order, so
-- neither waits for one that waits for it. One row per key, in the
-- caller's order: done (now, or already by this attempt), or the refusal's
-- SQLSTATE and message (ID003, ID004, ID005), which fails only that key.
-- Every other refusal raises and fails the batch, as in the C edition.
--
CREATE OR REPLACE FUNCTION idempotency.finish_batch(
    call pg_catalog.text,
    job_type pg_catalog.text,
    operation_keys pg_catalog.text[],
    attempts pg_catalog.int4[],
    results pg_catalog.jsonb[])
RETURNS TABLE (operation_key pg_catalog.text, attempt pg_catalog.int4, done boolean,
               sqlstate pg_catalog.text, message pg_catalog.text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    fname       pg_catalog.text := finish_batch.call || '_operations()';
    nkeys       pg_catalog.int4;
    jt_role     pg_catalog.oid;
    v_done      boolean[];
    v_state     pg_catalog.text[];
    v_message   pg_catalog.text[];
    k           record;
    r           record;
    i           pg_catalog.int4 := 0;
    a           pg_catalog.int4;
    updated     pg_catalog.int4[] := '{}';
BEGIN
    -- the arguments, in the C edition's order: plain tests, and the
    -- refusal's function only where one fails
    IF finish_batch.job_type IS NULL OR pg_catalog.octet_length(finish_batch.job_type) NOT BETWEEN 1 AND 128 THEN
        PERFORM idempotency.bad_argument('job_type', finish_batch.job_type);
    END IF;
    IF finish_batch.operation_keys IS NULL OR pg_catalog.array_ndims(finish_batch.operation_keys) > 1
       OR pg_catalog.cardinality(finish_batch.operation_keys) > 1000 THEN
        PERFORM idempotency.check_batch_array('operation_keys', finish_batch.operation_keys, true);
    END IF;
    IF finish_batch.attempts IS NULL OR pg_catalog.array_ndims(finish_batch.attempts) > 1
       OR pg_catalog.cardinality(finish_batch.attempts) > 1000 THEN
        PERFORM idempotency.check_batch_array('attempts', finish_batch.attempts, true);
    END IF;
    nkeys := pg_catalog.cardinality(finish_batch.operation_keys);
    IF pg_catalog.cardinality(finish_batch.attempts) <> nkeys THEN
        PERFORM idempotency.check_batch_length('attempts', finish_batch.attempts, nkeys);
    END IF;
    IF EXISTS (SELECT FROM pg_catalog.unnest(finish_batch.attempts) e WHERE e IS NULL OR e < 1) THEN
        FOREACH a IN ARRAY finish_batch.attempts LOOP
            i := i + 1;
            IF a IS NULL THEN
                RAISE EXCEPTION 'attempts[%] must not be null', i USING ERRCODE = 'null_value_not_allowed',
                    DETAIL = 'The attempt is the fencing token that shows the caller still owns the claim.',
                    HINT = 'Pass the attempt that claim_operations() returned for each key.';
            END IF;
            IF a < 1 THEN
                RAISE EXCEPTION 'attempts[%] must be positive, not %', i, a USING ERRCODE = 'invalid_parameter_value',
                    HINT = 'Pass the attempt that claim_operations() returned for each key.';
            END IF;
        END LOOP;
    END IF;
    IF finish_batch.call = 'complete' AND finish_batch.results IS NOT NULL THEN
        IF pg_catalog.array_ndims(finish_batch.results) > 1 OR pg_catalog.cardinality(finish_batch.results) > 1000 THEN
            PERFORM idempotency.check_batch_array('results', finish_batch.results, false);
        END IF;
        IF pg_catalog.cardinality(finish_batch.results) <> nkeys THEN
            PERFORM idempotency.check_batch_length('results', finish_batch.results, nkeys);
        END IF;
    END IF;
    IF EXISTS (SELECT FROM pg_catalog.unnest(finish_batch.operation_keys) e
               WHERE e IS NULL OR pg_catalog.octet_length(e) NOT BETWEEN 1 AND 1024) THEN
        PERFORM idempotency.check_batch_texts('operation_keys', finish_batch.operation_keys, 1024, true);
    END IF;
    IF nkeys = 0 THEN
        RETURN;
    END IF;
    -- element i of each array belongs to key i, counted from 1 whatever
    -- the arrays' lower bounds (as the C edition reads them)
    operation_keys := idempotency.from_one(finish_batch.operation_keys);
    attempts := idempotency.from_one(finish_batch.attempts);
    results := idempotency.from_one(finish_batch.results);
    IF pg_catalog.current_setting('transaction_read_only')::boolean THEN
        PERFORM idempotency.refuse_read_only(fname);
    END IF;

    -- the job type and the caller's right to work it, once per batch
    SELECT jt.worker_role::pg_catalog.oid INTO jt_role
    FROM idempotency.job_types jt WHERE jt.job_type = finish_batch.job_type;
    IF NOT FOUND THEN
        PERFORM idempotency.unknown_job_type(finish_batch.job_type);
    END IF;
    IF jt_role IS NOT NULL AND NOT idempotency.may_work(jt_role) THEN
        PERFORM idempotency.deny_job_type(finish_batch.job_type, jt_role);
    END IF;

    -- The records the fence lets through, locked in the order taken (the
    -- rows leave the sort in that order, and each is locked as it leaves),
    -- then updated by one statement. A key given twice is updated by its
    -- first occurrence; the other goes the refusal's way, as a repeat.
    PERFORM FROM idempotency.operations o,
                 ROWS FROM (pg_catalog.unnest(finish_batch.operation_keys), pg_catalog.unnest(finish_batch.attempts)) AS k(key, attempt)
    WHERE o.job_type = finish_batch.job_type AND o.operation_key = k.key AND o.attempt = k.attempt
      AND (o.status = 'claimed' OR o.status = 'skipped')
    ORDER BY o.operation_key COLLATE "C"
    FOR NO KEY UPDATE OF o;
    IF finish_batch.call = 'complete' THEN
        WITH u AS (
            UPDATE idempotency.operations o
            SET status = 'completed', completed_at = pg_catalog.clock_timestamp(), result = k.result
            FROM (SELECT DISTINCT ON (s.key COLLATE "C") s.key, s.attempt, s.result, s.i
                  FROM ROWS FROM (pg_catalog.unnest(finish_batch.operation_keys), pg_catalog.unnest(finish_batch.attempts),
                                 pg_catalog.unnest(finish_batch.results))
                       WITH ORDINALITY AS s(key, attempt, result, i)
                  ORDER BY s.key COLLATE "C", s.i) k
            WHERE o.job_type = finish_batch.job_type AND o.operation_key = k.key AND o.attempt = k.attempt
              AND (o.status = 'claimed' OR o.status = 'skipped')
            RETURNING k.i)
        SELECT pg_catalog.array_agg(u.i::pg_catalog.int4) INTO updated FROM u;
    ELSE
        WITH u AS (
            UPDATE idempotency.operations o
            SET status = 'released', completed_at = NULL, result = NULL
            FROM (SELECT DISTINCT ON (s.key COLLATE "C") s.key, s.attempt, s.i
                  FROM ROWS FROM (pg_catalog.unnest(finish_batch.operation_keys), pg_catalog.unnest(finish_batch.attempts))
                       WITH ORDINALITY AS s(key, attempt, i)
                  ORDER BY s.key COLLATE "C", s.i) k
            WHERE o.job_type = finish_batch.job_type AND o.operation_key = k.key AND o.attempt = k.attempt
              AND (o.status = 'claimed' OR o.status = 'skipped')
            RETURNING k.i)
        SELECT pg_catalog.array_agg(u.i::pg_catalog.int4) INTO updated FROM u;
    END IF;

    v_done := pg_catalog.array_fill(false, ARRAY[nkeys]);
    v_state := pg_catalog.array_fill(NULL::pg_catalog.text, ARRAY[nkeys]);
    v_message := pg_catalog.array_fill(NULL::pg_catalog.text, ARRAY[nkeys]);
    -- every key the update did not take, in the order taken: why not
    FOR k IN
        SELECT s.i::pg_catalog.int4 AS i, s.key
        FROM pg_catalog.unnest(finish_batch.operation_keys) WITH ORDINALITY AS s(key, i)
        ORDER BY s.key COLLATE "C", s.i
    LOOP
        IF k.i = ANY (updated) THEN
            v_done[k.i] := true;
            CONTINUE;
        END IF;
        r := idempotency.fenced_refusal(finish_batch.call, finish_batch.job_type, k.key,
                                        finish_batch.attempts[k.i], finish_batch.results[k.i]);
        v_done[k.i] := r.done;
        v_state[k.i] := r.sqlstate;
        v_message[k.i] := r.message;
    END LOOP;

    RETURN QUERY
    SELECT finish_batch.operation_keys[n], finish_batch.attempts[n], v_done[n], v_state[n], v_message[n]
    FROM pg_catalog.generate_series(1, nkeys) AS n;
END
$$;
COMMENT ON FUNCTION idempotency.finish_batch(pg_catalog.text, pg_catalog.text, pg_catalog.text[],
                                             pg_catalog.int4[], pg_catalog.jsonb[]) IS
'Portable edition, internal: complete_operations() and release_operations() (call: complete or release), one row per key in the caller''s order, the keys taken in the order of their bytes';

CREATE OR REPLACE FUNCTION idempotency.complete_operations(
    job_type text,
    operation_keys text[],
    attempts integer[],
    results jsonb[] DEFAULT NULL)
RETURNS TABLE (operation_key text, attempt integer, done boolean, sqlstate text, message text)
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE ROWS 10
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- PL/pgSQL keeps this statement's plan; a SQL function's is made anew at every call
    RETURN QUERY SELECT * FROM idempotency.finish_batch('complete', complete_operations.job_type, complete_operations.operation_keys, complete_operations.attempts, complete_operations.results);
END
$$;
COMMENT ON FUNCTION idempotency.complete_operations(text, text[], integer[], jsonb[]) IS
'Complete many operations of one job type in one call (at most 1000): one row per key, in the order given: done (now, or already by this attempt), or the SQLSTATE and message of the refusal (ID003 superseded, ID004 no record, ID005 wrong state), which fails only that key';

CREATE OR REPLACE FUNCTION idempotency.release_operations(
    job_type text,
    operation_keys text[],
    attempts integer[])
RETURNS TABLE (operation_key text, attempt integer, done boolean, sqlstate text, message text)
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE ROWS 10
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- PL/pgSQL keeps this statement's plan; a SQL function's is made anew at every call
    RETURN QUERY SELECT * FROM idempotency.finish_batch('release', release_operations.job_type, release_operations.operation_keys, release_operations.attempts, NULL);
END
$$;
COMMENT ON FUNCTION idempotency.release_operations(text, text[], integer[]) IS
'Release many operations of one job type in one call (at most 1000): one row per key, in the order given: done, or the SQLSTATE and message of the refusal, which fails only that key';
