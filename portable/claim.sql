/*
 * portable/claim.sql: claim_operation() and claim_operations(), the verdict
 * for each delivery of a job: the C edition's src/claim.c, src/batch.c and
 * the decisions of src/protocol.c, in PL/pgSQL.
 *
 * The same statements as the C edition's (src/statements.c), run the same
 * way (the same snapshots under every isolation level), so the same
 * concurrency argument holds (src/idempotency.c, "The claim protocol"):
 * INSERT ... ON CONFLICT DO NOTHING waits for another transaction's
 * uncommitted claim of the key; every other write names the record as it
 * was read (attempt, heartbeat, status), and when it writes nothing the
 * claim reads the record again and decides again, at most 16 times.
 *
 * What differs, and why:
 *  - The C edition answers the two hot paths (a new key, a completed key)
 *    below SPI; here the lookup is one SELECT and the insert one INSERT.
 *    claim_operation() does those two paths itself and hands every other
 *    case to idempotency.claim_key(), which is the whole protocol.
 *  - wait => false: the C edition reads the primary key with a dirty
 *    snapshot before a write to see another transaction's uncommitted
 *    change of the key. SQL has no dirty read, so an existing record is
 *    locked with SKIP LOCKED first (a record another transaction is
 *    changing is skipped: in_progress), and a new key is marked: every
 *    insert of a key takes, just before it, a transaction-level advisory
 *    lock on (1768187245, hashtext(job_type || E'\n' || key)), shared,
 *    held until the transaction ends, as its uncommitted row is. A claim
 *    that must not wait tries the same lock exclusively instead, which
 *    fails at once while another transaction has inserted the key and not
 *    ended: in_progress, without waiting (what isolationtester checks). The
 *    lock's first number is the letters "idem"; an application's two-number
 *    advisory locks with that first number would share the space. A batch
 *    holds one such lock per new key until it commits (docs/portable.md:
 *    max_locks_per_transaction). The insert itself then runs under the
 *    call's 1 s bound, as the C edition's does.
 */

--
-- The whole protocol for one key: read the record, decide, write; again
-- while a write finds the record changed. `late`: a batch's key that
-- another transaction claimed after the batch read it, whose writes must
-- not wait whatever `wait` says (see claim_operations()). Arguments are
-- checked by the callers.
--
CREATE OR REPLACE FUNCTION idempotency.claim_key(
    job_type pg_catalog.text,
    operation_key pg_catalog.text,
    fingerprint pg_catalog.text,
    worker pg_catalog.text,
    delivery pg_catalog.text,
    wait boolean,
    late boolean,
    OUT verdict pg_catalog.text,
    OUT attempt pg_catalog.int4,
    OUT result pg_catalog.jsonb)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    check_busy      boolean := NOT claim_key.wait OR claim_key.late;
    run_digest      pg_catalog.int8;
    verify_digest   pg_catalog.int8;
    now_ts          pg_catalog.timestamptz;
    jt_policy       idempotency.stale_policy;
    jt_max          pg_catalog.int4;
    jt_role         pg_catalog.oid;
    r_status        idempotency.operation_status;
    r_attempt       pg_catalog.int4;
    r_heartbeat     pg_catalog.timestamptz;
    r_expires       pg_catalog.timestamptz;
    r_fingerprint   pg_catalog.text;
    r_result        pg_catalog.jsonb;
    r_delivery      pg_catalog.int8;
    take_verify     boolean;
    n               pg_catalog.int8;
BEGIN
    IF claim_key.delivery IS NOT NULL THEN
        -- the C edition's digest (hash_bytes_extended() of the token's
        -- bytes, seeded 0 for run and 1 for verify): what hashtextextended()
        -- computes under a deterministic collation
        run_digest := pg_catalog.hashtextextended(claim_key.delivery COLLATE "C", 0);
        verify_digest := pg_catalog.hashtextextended(claim_key.delivery COLLATE "C", 1);
    END IF;

    FOR tries IN 1 .. 17 LOOP
        IF tries > 16 THEN
            PERFORM idempotency.too_many_tries('claim', claim_key.job_type, claim_key.operation_key);
        END IF;
        now_ts := pg_catalog.clock_timestamp();
        SELECT jt.stale_policy, jt.max_attempts, jt.worker_role::pg_catalog.oid,
               o.status, o.attempt, o.heartbeat_at, o.heartbeat_at + jt.lease,
               o.fingerprint, o.result, o.delivery
        INTO jt_policy, jt_max, jt_role, r_status, r_attempt, r_heartbeat, r_expires,
             r_fingerprint, r_result, r_delivery
        FROM idempotency.job_types jt
        LEFT JOIN idempotency.operations o
               ON o.job_type = jt.job_type AND o.operation_key = claim_key.operation_key
        WHERE jt.job_type = claim_key.job_type;
        IF NOT FOUND THEN
            PERFORM idempotency.unknown_job_type(claim_key.job_type);
        END IF;
        IF jt_role IS NOT NULL AND NOT idempotency.may_work(jt_role) THEN
            PERFORM idempotency.deny_job_type(claim_key.job_type, jt_role);
        END IF;

        -- no record: insert attempt 1
        IF r_status IS NULL THEN
            -- the key's mark (see above): another transaction inserting
            -- this key holds it until it ends
            IF check_busy THEN
                IF NOT pg_catalog.pg_try_advisory_xact_lock(1768187245,
                        pg_catalog.hashtext(claim_key.job_type || E'\n' || claim_key.operation_key COLLATE "C")) THEN
                    verdict := 'in_progress';
                    attempt := 1;
                    RETURN;
                END IF;
            ELSE
                PERFORM pg_catalog.pg_advisory_xact_lock_shared(1768187245,
                    pg_catalog.hashtext(claim_key.job_type || E'\n' || claim_key.operation_key COLLATE "C"));
            END IF;
            INSERT INTO idempotency.operations AS o
                (job_type, operation_key, status, attempt, claimed_at, heartbeat_at,
                 claimed_by, fingerprint, delivery)
            SELECT jt.job_type, claim_key.operation_key, 'claimed', 1, now_ts, now_ts,
                   claim_key.worker, claim_key.fingerprint, run_digest
            FROM idempotency.job_types jt
            WHERE jt.job_type = claim_key.job_type AND (jt.worker_role IS NULL OR idempotency.may_work(jt.worker_role))
            ON CONFLICT ON CONSTRAINT operations_pkey DO NOTHING;
            GET DIAGNOSTICS n = ROW_COUNT;
            IF n = 1 THEN
                verdict := 'run';
                attempt := 1;
                RETURN;
            END IF;
            CONTINUE;
        END IF;

        -- never answer completed for other data under the same key
        IF claim_key.fingerprint IS NOT NULL AND r_fingerprint IS NOT NULL
           AND r_fingerprint COLLATE "C" <> claim_key.fingerprint COLLATE "C" THEN
            RAISE EXCEPTION 'operation "%" of job type "%" was claimed with a different fingerprint',
                claim_key.operation_key, claim_key.job_type
                USING ERRCODE = 'ID002',
                      DETAIL = pg_catalog.format('The record has fingerprint "%s"; this claim gives "%s".',
                                                 r_fingerprint, claim_key.fingerprint),
                      HINT = 'The same operation key was used for different data: derive the key from everything that makes the job distinct.';
        END IF;

        IF r_status = 'completed' THEN
            verdict := 'completed';
            attempt := r_attempt;
            result := r_result;
            RETURN;
        END IF;
        IF r_status = 'skipped' THEN
            verdict := 'skipped';
            attempt := r_attempt;
            RETURN;
        END IF;

        take_verify := NULL;
        IF r_status = 'released' THEN
            take_verify := false;
        ELSIF now_ts < r_expires THEN
            -- a claim inside its lease: this very delivery's retry gets the
            -- verdict it got, nothing changed; any other in_progress
            attempt := r_attempt;
            IF run_digest IS NOT NULL AND r_delivery IS NOT NULL THEN
                IF r_delivery = run_digest THEN
                    verdict := 'run';
                    RETURN;
                END IF;
                IF r_delivery = verify_digest THEN
                    verdict := 'verify';
                    RETURN;
                END IF;
            END IF;
            verdict := 'in_progress';
            RETURN;
        ELSIF jt_policy = 'skip' THEN
            -- stale, skip: the record becomes skipped
            IF check_busy AND NOT idempotency.lock_record(claim_key.job_type, claim_key.operation_key) THEN
                verdict := 'in_progress';
                attempt := r_attempt;
                RETURN;
            END IF;
            UPDATE idempotency.operations o
            SET status = 'skipped', completed_at = now_ts
            WHERE o.job_type = claim_key.job_type AND o.operation_key = claim_key.operation_key
              AND o.attempt = r_attempt AND o.heartbeat_at = r_heartbeat AND o.status = 'claimed';
            GET DIAGNOSTICS n = ROW_COUNT;
            IF n = 1 THEN
                verdict := 'skipped';
                attempt := r_attempt;
                RETURN;
            END IF;
            CONTINUE;
        ELSIF jt_policy IN ('retry', 'lookup') AND (jt_max IS NULL OR r_attempt < jt_max) THEN
            take_verify := jt_policy = 'lookup';
        END IF;

        IF take_verify IS NULL THEN
            -- hold (or out of attempts: a poison job waits for a person)
            PERFORM pg_catalog.pg_notify('idempotency_held',
                '{"job_type": ' || pg_catalog.to_json(claim_key.job_type)::pg_catalog.text
                || ', "operation_key": ' || pg_catalog.to_json(claim_key.operation_key)::pg_catalog.text
                || ', "attempt": ' || r_attempt || '}');
            verdict := 'held';
            attempt := r_attempt;
            RETURN;
        END IF;

        -- take over: attempt + 1, a new lease
        IF check_busy AND NOT idempotency.lock_record(claim_key.job_type, claim_key.operation_key) THEN
            verdict := 'in_progress';
            attempt := r_attempt;
            RETURN;
        END IF;
        UPDATE idempotency.operations o
        SET status = 'claimed', attempt = o.attempt + 1,
            claimed_at = now_ts, heartbeat_at = now_ts, completed_at = NULL,
            claimed_by = claim_key.worker, fingerprint = COALESCE(o.fingerprint, claim_key.fingerprint),
            result = NULL,
            delivery = CASE WHEN take_verify THEN verify_digest ELSE run_digest END
        WHERE o.job_type = claim_key.job_type AND o.operation_key = claim_key.operation_key
          AND o.attempt = r_attempt AND o.heartbeat_at = r_heartbeat AND o.status = r_status;
        GET DIAGNOSTICS n = ROW_COUNT;
        IF n = 1 THEN
            verdict := CASE WHEN take_verify THEN 'verify' ELSE 'run' END;
            attempt := r_attempt + 1;
            RETURN;
        END IF;
    END LOOP;
END
$$;
COMMENT ON FUNCTION idempotency.claim_key(pg_catalog.text, pg_catalog.text, pg_catalog.text, pg_catalog.text,
                                          pg_catalog.text, boolean, boolean) IS
'Portable edition, internal: the claim protocol for one key (read, decide, write; again while a write finds the record changed), called by claim_operation() and claim_operations() with checked arguments';

--
-- Before a write that must not wait: lock the record unless another
-- transaction is changing it (then false: in_progress). A record that is
-- gone meanwhile is not busy either: the write finds it changed and the
-- claim reads again.
--
CREATE OR REPLACE FUNCTION idempotency.lock_record(job_type pg_catalog.text, operation_key pg_catalog.text)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    PERFORM FROM idempotency.operations o
    WHERE o.job_type = lock_record.job_type AND o.operation_key = lock_record.operation_key
    FOR NO KEY UPDATE SKIP LOCKED;
    IF FOUND THEN
        RETURN true;
    END IF;
    RETURN NOT EXISTS (SELECT FROM idempotency.operations o
                       WHERE o.job_type = lock_record.job_type
                         AND o.operation_key = lock_record.operation_key);
END
$$;
COMMENT ON FUNCTION idempotency.lock_record(pg_catalog.text, pg_catalog.text) IS
'Portable edition, internal: before a claim''s write that must not wait, lock the record unless another transaction is changing it (false: that claim answers in_progress)';

--
-- wait => false: the call's writes wait at most 1 s for a lock (a shorter
-- lock_timeout of the caller's stays), as the C edition's do
-- (NOWAIT_LOCK_TIMEOUT_MS, src/claim.c). Set for the transaction: the
-- caller sets the caller's value back when it returns (a function's exit
-- restores only the settings of its own SET clause), and an error rolls it
-- back with the rest. No SET clause here, which would restore the setting
-- when this one returns (so every name is qualified, operators too).
--
CREATE OR REPLACE FUNCTION idempotency.nowait_bound()
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    ms  pg_catalog.int4;
BEGIN
    SELECT s.setting::pg_catalog.int4 INTO ms FROM pg_catalog.pg_settings s
    WHERE s.name OPERATOR(pg_catalog.=) 'lock_timeout';
    IF ms OPERATOR(pg_catalog.=) 0 OR ms OPERATOR(pg_catalog.>) 1000 THEN
        PERFORM pg_catalog.set_config('lock_timeout', '1000', true);
    END IF;
END
$$;
COMMENT ON FUNCTION idempotency.nowait_bound() IS
'Portable edition, internal: with wait => false, bound the call''s lock waits to 1 s (a shorter lock_timeout of the caller''s stays)';

CREATE OR REPLACE FUNCTION idempotency.claim_operation(
    job_type text,
    operation_key text,
    fingerprint text DEFAULT NULL,
    worker text DEFAULT NULL,
    delivery text DEFAULT NULL,
    wait boolean DEFAULT true)
RETURNS TABLE (verdict text, attempt integer, result jsonb)
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE ROWS 1
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    now_ts      pg_catalog.timestamptz;
    jt_role     pg_catalog.oid;
    r_status    idempotency.operation_status;
    r_attempt   pg_catalog.int4;
    r_fp        pg_catalog.text;
    r_result    pg_catalog.jsonb;
    n           pg_catalog.int8;
    prev_timeout pg_catalog.text;
BEGIN
    IF claim_operation.job_type IS NULL OR pg_catalog.octet_length(claim_operation.job_type) NOT BETWEEN 1 AND 128 THEN
        PERFORM idempotency.bad_argument('job_type', claim_operation.job_type);
    END IF;
    IF claim_operation.operation_key IS NULL
       OR pg_catalog.octet_length(claim_operation.operation_key) NOT BETWEEN 1 AND 1024 THEN
        PERFORM idempotency.bad_argument('operation_key', claim_operation.operation_key);
    END IF;
    IF claim_operation.delivery IS NOT NULL
       AND pg_catalog.octet_length(claim_operation.delivery) NOT BETWEEN 1 AND 1024 THEN
        PERFORM idempotency.bad_argument('delivery', claim_operation.delivery);
    END IF;
    IF claim_operation.wait IS NULL THEN
        PERFORM idempotency.bad_argument('wait', NULL);
    END IF;
    IF pg_catalog.current_setting('transaction_read_only')::boolean THEN
        PERFORM idempotency.refuse_read_only('claim_operation()');
    END IF;

    IF claim_operation.wait THEN
        -- the two hot paths: a completed key's duplicate, and a new key
        SELECT jt.worker_role::pg_catalog.oid, o.status, o.attempt, o.fingerprint, o.result
        INTO jt_role, r_status, r_attempt, r_fp, r_result
        FROM idempotency.job_types jt
        LEFT JOIN idempotency.operations o
               ON o.job_type = jt.job_type AND o.operation_key = claim_operation.operation_key
        WHERE jt.job_type = claim_operation.job_type;
        IF FOUND AND (jt_role IS NULL OR idempotency.may_work(jt_role)) THEN
            IF r_status = 'completed'
               AND (claim_operation.fingerprint IS NULL OR r_fp IS NULL
                    OR r_fp COLLATE "C" = claim_operation.fingerprint COLLATE "C") THEN
                verdict := 'completed';
                attempt := r_attempt;
                result := r_result;
                RETURN NEXT;
                RETURN;
            END IF;
            IF r_status IS NULL THEN
                now_ts := pg_catalog.clock_timestamp();
                PERFORM pg_catalog.pg_advisory_xact_lock_shared(1768187245,
                    pg_catalog.hashtext(claim_operation.job_type || E'\n' || claim_operation.operation_key COLLATE "C"));
                INSERT INTO idempotency.operations AS o
                    (job_type, operation_key, status, attempt, claimed_at, heartbeat_at,
                     claimed_by, fingerprint, delivery)
                SELECT jt.job_type, claim_operation.operation_key, 'claimed', 1, now_ts, now_ts,
                       claim_operation.worker, claim_operation.fingerprint,
                       pg_catalog.hashtextextended(claim_operation.delivery COLLATE "C", 0)
                FROM idempotency.job_types jt
                WHERE jt.job_type = claim_operation.job_type AND (jt.worker_role IS NULL OR idempotency.may_work(jt.worker_role))
                ON CONFLICT ON CONSTRAINT operations_pkey DO NOTHING;
                GET DIAGNOSTICS n = ROW_COUNT;
                IF n = 1 THEN
                    verdict := 'run';
                    attempt := 1;
                    RETURN NEXT;
                    RETURN;
                END IF;
            END IF;
        END IF;
    ELSE
        prev_timeout := pg_catalog.current_setting('lock_timeout');
        PERFORM idempotency.nowait_bound();
    END IF;

    -- every other case, and every refusal: the whole protocol
    SELECT c.verdict, c.attempt, c.result INTO verdict, attempt, result
    FROM idempotency.claim_key(claim_operation.job_type, claim_operation.operation_key,
                               claim_operation.fingerprint, claim_operation.worker,
                               claim_operation.delivery, claim_operation.wait, false) c;
    IF prev_timeout IS NOT NULL THEN
        -- the bound was set for the transaction (set_config(..., true)); an
        -- error rolls it back with the rest
        PERFORM pg_catalog.set_config('lock_timeout', prev_timeout, true);
    END IF;
    RETURN NEXT;
END
$$;
COMMENT ON FUNCTION idempotency.claim_operation(text, text, text, text, text, boolean) IS
'Claim an operation before doing its work. Exactly one row: verdict run | verify (do the work, then complete_operation with the returned attempt) or completed | in_progress | held | skipped (stop). delivery: a token unique to this delivery, reused only to retry this call (a retry after a lost reply gets its own claim back). wait => false: in_progress at once instead of waiting for another transaction''s uncommitted claim of the key. A caller without the job type''s worker_role is refused (42501)';

--
-- claim_operations(): the keys in one order (by their bytes, whatever order
-- they come in: two batches that share keys lock them in the same order,
-- so neither deadlocks), answered in the caller's order (src/batch.c).
-- Each key is read once; a completed one is answered from what was read; a
-- run of keys without a record is inserted by one INSERT before any later
-- key is written; every other key goes the single call's way
-- (claim_key()). A key the INSERT found claimed meanwhile by a transaction
-- that committed goes the single call's way without waiting (`late`): that
-- transaction may be waiting for a later key of this batch. A repeated key
-- is another delivery: it comes after its first occurrence, without a
-- delivery token. With wait => false each new key is inserted on its own
-- (claim_key()), so that a key another transaction is inserting answers
-- in_progress without failing the others.
--
CREATE OR REPLACE FUNCTION idempotency.claim_operations(
    job_type text,
    operation_keys text[],
    fingerprints text[] DEFAULT NULL,
    worker text DEFAULT NULL,
    deliveries text[] DEFAULT NULL,
    wait boolean DEFAULT true)
RETURNS TABLE (operation_key text, verdict text, attempt integer, result jsonb)
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE ROWS 10
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    nkeys       pg_catalog.int4;
    jt_role     pg_catalog.oid;
    v_verdict   pg_catalog.text[];
    v_attempt   pg_catalog.int4[];
    v_result    pg_catalog.jsonb[];
    pending     pg_catalog.int4[] := '{}';
    r           record;
    c           record;
    prev_timeout pg_catalog.text;
BEGIN
    IF claim_operations.job_type IS NULL OR pg_catalog.octet_length(claim_operations.job_type) NOT BETWEEN 1 AND 128 THEN
        PERFORM idempotency.bad_argument('job_type', claim_operations.job_type);
    END IF;
    IF claim_operations.wait IS NULL THEN
        PERFORM idempotency.bad_argument('wait', NULL);
    END IF;
    -- plain tests, and the refusal's function only where one fails
    IF claim_operations.operation_keys IS NULL OR pg_catalog.array_ndims(claim_operations.operation_keys) > 1
       OR pg_catalog.cardinality(claim_operations.operation_keys) > 1000 THEN
        PERFORM idempotency.check_batch_array('operation_keys', claim_operations.operation_keys, true);
    END IF;
    IF pg_catalog.array_ndims(claim_operations.fingerprints) > 1
       OR pg_catalog.cardinality(claim_operations.fingerprints) > 1000 THEN
        PERFORM idempotency.check_batch_array('fingerprints', claim_operations.fingerprints, false);
    END IF;
    IF pg_catalog.array_ndims(claim_operations.deliveries) > 1
       OR pg_catalog.cardinality(claim_operations.deliveries) > 1000 THEN
        PERFORM idempotency.check_batch_array('deliveries', claim_operations.deliveries, false);
    END IF;
    nkeys := pg_catalog.cardinality(claim_operations.operation_keys);
    IF pg_catalog.cardinality(claim_operations.fingerprints) <> nkeys THEN
        PERFORM idempotency.check_batch_length('fingerprints', claim_operations.fingerprints, nkeys);
    END IF;
    IF claim_operations.deliveries IS NOT NULL THEN
        IF pg_catalog.cardinality(claim_operations.deliveries) <> nkeys THEN
            PERFORM idempotency.check_batch_length('deliveries', claim_operations.deliveries, nkeys);
        END IF;
        IF EXISTS (SELECT FROM pg_catalog.unnest(claim_operations.deliveries) e
                   WHERE pg_catalog.octet_length(e) NOT BETWEEN 1 AND 1024) THEN
            PERFORM idempotency.check_batch_texts('deliveries', claim_operations.deliveries, 1024, false);
        END IF;
    END IF;
    IF EXISTS (SELECT FROM pg_catalog.unnest(claim_operations.operation_keys) e
               WHERE e IS NULL OR pg_catalog.octet_length(e) NOT BETWEEN 1 AND 1024) THEN
        PERFORM idempotency.check_batch_texts('operation_keys', claim_operations.operation_keys, 1024, true);
    END IF;
    IF nkeys = 0 THEN
        RETURN;
    END IF;
    -- element i of each array belongs to key i, counted from 1 whatever
    -- the arrays' lower bounds (as the C edition reads them)
    IF pg_catalog.array_lower(claim_operations.operation_keys, 1) <> 1 THEN
        operation_keys := idempotency.from_one(claim_operations.operation_keys);
    END IF;
    IF pg_catalog.array_lower(claim_operations.fingerprints, 1) <> 1 THEN
        fingerprints := idempotency.from_one(claim_operations.fingerprints);
    END IF;
    IF pg_catalog.array_lower(claim_operations.deliveries, 1) <> 1 THEN
        deliveries := idempotency.from_one(claim_operations.deliveries);
    END IF;
    IF pg_catalog.current_setting('transaction_read_only')::boolean THEN
        PERFORM idempotency.refuse_read_only('claim_operations()');
    END IF;
    IF NOT claim_operations.wait THEN
        prev_timeout := pg_catalog.current_setting('lock_timeout');
        PERFORM idempotency.nowait_bound();
    END IF;

    -- the job type and the caller's right to work it, once
    SELECT jt.worker_role::pg_catalog.oid INTO jt_role
    FROM idempotency.job_types jt WHERE jt.job_type = claim_operations.job_type;
    IF NOT FOUND THEN
        PERFORM idempotency.unknown_job_type(claim_operations.job_type);
    END IF;
    IF jt_role IS NOT NULL AND NOT idempotency.may_work(jt_role) THEN
        PERFORM idempotency.deny_job_type(claim_operations.job_type, jt_role);
    END IF;

    v_verdict := pg_catalog.array_fill(NULL::pg_catalog.text, ARRAY[nkeys]);
    v_attempt := pg_catalog.array_fill(NULL::pg_catalog.int4, ARRAY[nkeys]);
    v_result := pg_catalog.array_fill(NULL::pg_catalog.jsonb, ARRAY[nkeys]);

    -- every key in the order taken, with its record as read now
    FOR r IN
        SELECT k.i, k.key, COALESCE(k.key COLLATE "C" = k.prev_key COLLATE "C", false) AS repeat,
               o.status, o.attempt, o.fingerprint, o.result
        FROM (SELECT s.i, s.key, pg_catalog.lag(s.key) OVER (ORDER BY s.key COLLATE "C", s.i) AS prev_key,
                     pg_catalog.row_number() OVER (ORDER BY s.key COLLATE "C", s.i) AS pos
              FROM pg_catalog.unnest(claim_operations.operation_keys) WITH ORDINALITY AS s(key, i)) k
        LEFT JOIN idempotency.operations o
               ON o.job_type = claim_operations.job_type AND o.operation_key = k.key
        ORDER BY k.pos
    LOOP
        IF NOT r.repeat AND r.status IS NULL AND claim_operations.wait THEN
            pending := pending || r.i::pg_catalog.int4;
            CONTINUE;
        END IF;
        IF NOT r.repeat AND r.status = 'completed'
           AND (claim_operations.fingerprints[r.i] IS NULL OR r.fingerprint IS NULL
                OR r.fingerprint COLLATE "C" = claim_operations.fingerprints[r.i] COLLATE "C") THEN
            v_verdict[r.i] := 'completed';
            v_attempt[r.i] := r.attempt;
            v_result[r.i] := r.result;
            CONTINUE;
        END IF;
        -- a write may follow: the keys before it first
        IF pg_catalog.cardinality(pending) > 0 THEN
            SELECT * INTO v_verdict, v_attempt, v_result
            FROM idempotency.claim_pending(claim_operations.job_type, claim_operations.operation_keys,
                                           claim_operations.fingerprints, claim_operations.worker,
                                           claim_operations.deliveries, pending,
                                           v_verdict, v_attempt, v_result);
            pending := '{}';
        END IF;
        SELECT * INTO c
        FROM idempotency.claim_key(claim_operations.job_type, r.key, claim_operations.fingerprints[r.i],
                                   claim_operations.worker,
                                   CASE WHEN r.repeat THEN NULL ELSE claim_operations.deliveries[r.i] END,
                                   claim_operations.wait, false);
        v_verdict[r.i] := c.verdict;
        v_attempt[r.i] := c.attempt;
        v_result[r.i] := c.result;
    END LOOP;
    IF pg_catalog.cardinality(pending) > 0 THEN
        SELECT * INTO v_verdict, v_attempt, v_result
        FROM idempotency.claim_pending(claim_operations.job_type, claim_operations.operation_keys,
                                       claim_operations.fingerprints, claim_operations.worker,
                                       claim_operations.deliveries, pending,
                                       v_verdict, v_attempt, v_result);
    END IF;

    IF prev_timeout IS NOT NULL THEN
        PERFORM pg_catalog.set_config('lock_timeout', prev_timeout, true);
    END IF;
    RETURN QUERY
    SELECT claim_operations.operation_keys[i], v_verdict[i], v_attempt[i], v_result[i]
    FROM pg_catalog.generate_series(1, nkeys) AS i;
END
$$;
COMMENT ON FUNCTION idempotency.claim_operations(text, text[], text[], text, text[], boolean) IS
'Claim many operations of one job type in one call (at most 1000): one row per key, in the order given, each with the verdict claim_operation would give it. fingerprints and deliveries are parallel to operation_keys (NULL: none). A key given twice is answered as two deliveries would be (run, then in_progress)';

--
-- A batch's pending keys (indexes into the arrays, in the order taken),
-- which had no record when read: one INSERT, in that order. A key it did
-- not insert goes the single call's way, late. Returns the verdict arrays
-- with those keys' answers filled in.
--
CREATE OR REPLACE FUNCTION idempotency.claim_pending(
    job_type pg_catalog.text,
    operation_keys pg_catalog.text[],
    fingerprints pg_catalog.text[],
    worker pg_catalog.text,
    deliveries pg_catalog.text[],
    pending pg_catalog.int4[],
    INOUT v_verdict pg_catalog.text[],
    INOUT v_attempt pg_catalog.int4[],
    INOUT v_result pg_catalog.jsonb[])
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    now_ts      pg_catalog.timestamptz := pg_catalog.clock_timestamp();
    inserted    pg_catalog.text[];
    i           pg_catalog.int4;
    c           record;
BEGIN
    -- the keys' marks, in the batch's order (see the top of this file)
    PERFORM pg_catalog.pg_advisory_xact_lock_shared(1768187245,
                pg_catalog.hashtext(claim_pending.job_type || E'\n' || claim_pending.operation_keys[p.i] COLLATE "C"))
    FROM pg_catalog.unnest(claim_pending.pending) WITH ORDINALITY AS p(i, n)
    ORDER BY p.n;
    WITH ins AS (
        INSERT INTO idempotency.operations AS o
            (job_type, operation_key, status, attempt, claimed_at, heartbeat_at,
             claimed_by, fingerprint, delivery)
        SELECT jt.job_type, claim_pending.operation_keys[p.i], 'claimed', 1, now_ts, now_ts,
               claim_pending.worker, claim_pending.fingerprints[p.i],
               pg_catalog.hashtextextended(claim_pending.deliveries[p.i] COLLATE "C", 0)
        FROM idempotency.job_types jt,
             pg_catalog.unnest(claim_pending.pending) WITH ORDINALITY AS p(i, n)
        WHERE jt.job_type = claim_pending.job_type AND (jt.worker_role IS NULL OR idempotency.may_work(jt.worker_role))
        ORDER BY p.n
        ON CONFLICT ON CONSTRAINT operations_pkey DO NOTHING
        RETURNING o.operation_key)
    SELECT pg_catalog.array_agg(ins.operation_key) INTO inserted FROM ins;

    FOREACH i IN ARRAY claim_pending.pending LOOP
        IF claim_pending.operation_keys[i] = ANY (COALESCE(inserted, '{}')) THEN
            v_verdict[i] := 'run';
            v_attempt[i] := 1;
            CONTINUE;
        END IF;
        -- claimed meanwhile by a transaction that committed
        SELECT * INTO c
        FROM idempotency.claim_key(claim_pending.job_type, claim_pending.operation_keys[i],
                                   claim_pending.fingerprints[i], claim_pending.worker,
                                   claim_pending.deliveries[i], true, true);
        v_verdict[i] := c.verdict;
        v_attempt[i] := c.attempt;
        v_result[i] := c.result;
    END LOOP;
END
$$;
COMMENT ON FUNCTION idempotency.claim_pending(pg_catalog.text, pg_catalog.text[], pg_catalog.text[], pg_catalog.text,
                                              pg_catalog.text[], pg_catalog.int4[], pg_catalog.text[],
                                              pg_catalog.int4[], pg_catalog.jsonb[]) IS
'Portable edition, internal: inserts the keys of a batch that had no record with one INSERT, in the batch''s order; a key claimed meanwhile goes the single call''s way';
