-- bench/sql/plpgsql.sql: implementation (2), this project's contract in
-- PL/pgSQL: the baseline a careful user could write in an afternoon.
--
-- Same tables as the extension (idempotency--0.1.sql), same algorithm as the
-- C code (src/claim.c, src/complete.c): a lookup that joins the job type's
-- configuration, then INSERT ... ON CONFLICT DO NOTHING for a new key, or a
-- compare-and-swap UPDATE for a takeover; the attempt is the fencing token;
-- time is clock_timestamp(); the same verdicts, the same SQLSTATEs, the same
-- NOTIFY on held. Like the C functions (which switch to the table owner's
-- rights) the functions are SECURITY DEFINER, and so they pin search_path
-- (the PostgreSQL documentation's advice for SECURITY DEFINER functions).
--
-- Covered: claim_operation, complete_operation, release_operation,
-- extend_lease, stale_claims. Not covered (off the hot paths, not
-- benchmarked): resolve_operation, purge_operations, the job_type_stats view
-- and the job-type guard trigger.
--
-- bench/run.sh checks that this and the extension give the same verdicts and
-- SQLSTATEs for one scripted sequence (bench/sql/verdicts.sql).

CREATE SCHEMA bench_plpgsql;

CREATE TYPE bench_plpgsql.stale_policy AS ENUM ('hold', 'retry', 'skip', 'lookup');
CREATE TYPE bench_plpgsql.operation_status AS ENUM ('claimed', 'completed', 'released', 'skipped');

CREATE TABLE bench_plpgsql.job_types (
    job_type     text PRIMARY KEY
                 CHECK (octet_length(job_type) BETWEEN 1 AND 128),
    lease        interval NOT NULL DEFAULT '10 minutes' CHECK (lease > interval '0'),
    stale_policy bench_plpgsql.stale_policy NOT NULL DEFAULT 'hold',
    max_attempts integer CHECK (max_attempts >= 1),
    retention    interval CHECK (retention > interval '0')
);

CREATE TABLE bench_plpgsql.operations (
    job_type      text NOT NULL,
    operation_key text NOT NULL,
    status        bench_plpgsql.operation_status NOT NULL,
    attempt       integer NOT NULL,
    claimed_at    timestamptz NOT NULL,
    heartbeat_at  timestamptz NOT NULL,
    completed_at  timestamptz,
    claimed_by    text,
    fingerprint   text,
    result        jsonb,
    CONSTRAINT operations_pkey PRIMARY KEY (job_type, operation_key)
);

-- the side-effect row of the transactional path
CREATE TABLE bench_plpgsql.side_effects (
    job_type      text NOT NULL,
    operation_key text NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now()
);

-- argument checks shared by every function: 22004 null, 22023 empty,
-- 22001 too long (128 bytes for a job type, 1024 for a key)
CREATE FUNCTION bench_plpgsql.check_name(what text, val text, maxbytes integer)
RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF val IS NULL THEN
        RAISE EXCEPTION '% must not be null', what USING ERRCODE = '22004';
    ELSIF val = '' THEN
        RAISE EXCEPTION '% must not be empty', what USING ERRCODE = '22023';
    ELSIF octet_length(val) > maxbytes THEN
        RAISE EXCEPTION '% is too long', what USING ERRCODE = '22001',
            DETAIL = format('It is %s bytes long; the limit is %s bytes.', octet_length(val), maxbytes);
    END IF;
END
$$;

CREATE FUNCTION bench_plpgsql.check_attempt(val integer)
RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF val IS NULL THEN
        RAISE EXCEPTION 'attempt must not be null' USING ERRCODE = '22004';
    ELSIF val < 1 THEN
        RAISE EXCEPTION 'attempt must be positive, not %', val USING ERRCODE = '22023';
    END IF;
END
$$;

CREATE FUNCTION bench_plpgsql.claim_operation(
    job_type text,
    operation_key text,
    fingerprint text DEFAULT NULL,
    worker text DEFAULT NULL)
RETURNS TABLE (verdict text, attempt integer, result jsonb)
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE ROWS 1
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    k_job_type text := $1;
    k_key      text := $2;
    k_fp       text := $3;
    k_worker   text := $4;
    r          record;
    now_ts     timestamptz;
    tries      integer := 0;
BEGIN
    -- one test on the fast path; the helpers only to raise the error
    IF k_job_type IS NULL OR k_key IS NULL OR k_job_type = '' OR k_key = ''
       OR octet_length(k_job_type) > 128 OR octet_length(k_key) > 1024 THEN
        PERFORM bench_plpgsql.check_name('job_type', k_job_type, 128);
        PERFORM bench_plpgsql.check_name('operation_key', k_key, 1024);
    END IF;

    LOOP
        tries := tries + 1;
        IF tries > 16 THEN
            RAISE EXCEPTION 'could not claim operation "%" of job type "%"', k_key, k_job_type
                USING ERRCODE = '40001', HINT = 'Retry the call.';
        END IF;
        now_ts := clock_timestamp();

        SELECT jt.stale_policy, jt.max_attempts, o.status, o.attempt AS o_attempt,
               o.heartbeat_at, o.heartbeat_at + jt.lease AS expires_at,
               o.fingerprint AS o_fingerprint, o.result AS o_result
          INTO r
          FROM bench_plpgsql.job_types jt
          LEFT JOIN bench_plpgsql.operations o
            ON o.job_type = jt.job_type AND o.operation_key = k_key
         WHERE jt.job_type = k_job_type;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'job type "%" is not registered', k_job_type
                USING ERRCODE = 'ID001',
                      HINT = format('Register it: INSERT INTO bench_plpgsql.job_types (job_type, lease, stale_policy) VALUES (%L, ''10 minutes'', ''hold'');', k_job_type);
        END IF;

        IF r.status IS NULL THEN
            -- waits for a concurrent uncommitted claim of the same key
            INSERT INTO bench_plpgsql.operations AS o
                   (job_type, operation_key, status, attempt, claimed_at, heartbeat_at,
                    claimed_by, fingerprint)
            VALUES (k_job_type, k_key, 'claimed', 1, now_ts, now_ts, k_worker, k_fp)
            ON CONFLICT ON CONSTRAINT operations_pkey DO NOTHING;
            IF FOUND THEN
                verdict := 'run'; attempt := 1; result := NULL;
                RETURN NEXT;
                RETURN;
            END IF;
            CONTINUE;               -- it was committed meanwhile: read it
        END IF;

        IF k_fp IS NOT NULL AND r.o_fingerprint IS NOT NULL AND k_fp <> r.o_fingerprint THEN
            RAISE EXCEPTION 'operation "%" of job type "%" was claimed with a different fingerprint', k_key, k_job_type
                USING ERRCODE = 'ID002';
        END IF;

        IF r.status = 'completed' THEN
            verdict := 'completed'; attempt := r.o_attempt; result := r.o_result;
            RETURN NEXT;
            RETURN;
        ELSIF r.status = 'skipped' THEN
            verdict := 'skipped'; attempt := r.o_attempt; result := NULL;
            RETURN NEXT;
            RETURN;
        ELSIF r.status = 'claimed' AND now_ts < r.expires_at THEN
            verdict := 'in_progress'; attempt := r.o_attempt; result := NULL;
            RETURN NEXT;
            RETURN;
        ELSIF r.status = 'claimed' AND r.stale_policy = 'skip' THEN
            UPDATE bench_plpgsql.operations o
               SET status = 'skipped', completed_at = now_ts
             WHERE o.job_type = k_job_type AND o.operation_key = k_key
               AND o.attempt = r.o_attempt AND o.heartbeat_at = r.heartbeat_at
               AND o.status = 'claimed';
            IF FOUND THEN
                verdict := 'skipped'; attempt := r.o_attempt; result := NULL;
                RETURN NEXT;
                RETURN;
            END IF;
            CONTINUE;
        ELSIF r.status = 'released'
              OR (r.stale_policy IN ('retry', 'lookup')
                  AND (r.max_attempts IS NULL OR r.o_attempt < r.max_attempts)) THEN
            -- take over: attempt + 1, a new lease (compare-and-swap)
            UPDATE bench_plpgsql.operations o
               SET status = 'claimed', attempt = o.attempt + 1,
                   claimed_at = now_ts, heartbeat_at = now_ts, completed_at = NULL,
                   claimed_by = k_worker, fingerprint = COALESCE(o.fingerprint, k_fp),
                   result = NULL
             WHERE o.job_type = k_job_type AND o.operation_key = k_key
               AND o.attempt = r.o_attempt AND o.heartbeat_at = r.heartbeat_at
               AND o.status = r.status;
            IF FOUND THEN
                verdict := CASE WHEN r.status = 'claimed' AND r.stale_policy = 'lookup'
                                THEN 'verify' ELSE 'run' END;
                attempt := r.o_attempt + 1; result := NULL;
                RETURN NEXT;
                RETURN;
            END IF;
            CONTINUE;
        ELSE
            -- hold (or out of attempts): a person decides
            PERFORM pg_notify('idempotency_held',
                              json_build_object('job_type', k_job_type,
                                                'operation_key', k_key,
                                                'attempt', r.o_attempt)::text);
            verdict := 'held'; attempt := r.o_attempt; result := NULL;
            RETURN NEXT;
            RETURN;
        END IF;
    END LOOP;
END
$$;

-- The fenced update found nothing: raise the error that says why. Returns
-- true for a harmless repeat (already `done` under this attempt), false when
-- the record is in an allowed state again (the caller tries once more).
CREATE FUNCTION bench_plpgsql.explain_refusal(
    k_job_type text, k_key text, k_attempt integer, action text,
    allowed bench_plpgsql.operation_status[], done bench_plpgsql.operation_status)
RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    r record;
BEGIN
    SELECT o.status, o.attempt
      INTO r
      FROM bench_plpgsql.job_types jt
      LEFT JOIN bench_plpgsql.operations o
        ON o.job_type = jt.job_type AND o.operation_key = k_key
     WHERE jt.job_type = k_job_type;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'job type "%" is not registered', k_job_type USING ERRCODE = 'ID001';
    ELSIF r.status IS NULL THEN
        RAISE EXCEPTION 'operation "%" of job type "%" has no record', k_key, k_job_type
            USING ERRCODE = 'ID004';
    ELSIF k_attempt < r.attempt THEN
        RAISE EXCEPTION 'attempt % of operation "%" of job type "%" was superseded', k_attempt, k_key, k_job_type
            USING ERRCODE = 'ID003';
    ELSIF k_attempt > r.attempt THEN
        RAISE EXCEPTION 'attempt % of operation "%" of job type "%" was never issued', k_attempt, k_key, k_job_type
            USING ERRCODE = '22023';
    ELSIF r.status = done THEN
        RETURN true;
    ELSIF r.status = ANY (allowed) THEN
        RETURN false;
    END IF;
    RAISE EXCEPTION 'cannot % operation "%" of job type "%": it is %', action, k_key, k_job_type, r.status
        USING ERRCODE = 'ID005';
END
$$;

CREATE FUNCTION bench_plpgsql.complete_operation(
    job_type text,
    operation_key text,
    attempt integer,
    result jsonb DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    k_job_type text := $1;
    k_key      text := $2;
    k_attempt  integer := $3;
    k_result   jsonb := $4;
BEGIN
    IF k_job_type IS NULL OR k_key IS NULL OR k_job_type = '' OR k_key = ''
       OR octet_length(k_job_type) > 128 OR octet_length(k_key) > 1024
       OR k_attempt IS NULL OR k_attempt < 1 THEN
        PERFORM bench_plpgsql.check_name('job_type', k_job_type, 128);
        PERFORM bench_plpgsql.check_name('operation_key', k_key, 1024);
        PERFORM bench_plpgsql.check_attempt(k_attempt);
    END IF;
    FOR tries IN 1..16 LOOP
        UPDATE bench_plpgsql.operations o
           SET status = 'completed', completed_at = clock_timestamp(), result = k_result
         WHERE o.job_type = k_job_type AND o.operation_key = k_key
           AND o.attempt = k_attempt AND (o.status = 'claimed' OR o.status = 'skipped');
        IF FOUND OR bench_plpgsql.explain_refusal(k_job_type, k_key, k_attempt, 'complete',
                                                  '{claimed,skipped}', 'completed') THEN
            RETURN;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'could not complete operation "%" of job type "%"', k_key, k_job_type
        USING ERRCODE = '40001';
END
$$;

CREATE FUNCTION bench_plpgsql.release_operation(
    job_type text,
    operation_key text,
    attempt integer)
RETURNS void
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    k_job_type text := $1;
    k_key      text := $2;
    k_attempt  integer := $3;
BEGIN
    IF k_job_type IS NULL OR k_key IS NULL OR k_job_type = '' OR k_key = ''
       OR octet_length(k_job_type) > 128 OR octet_length(k_key) > 1024
       OR k_attempt IS NULL OR k_attempt < 1 THEN
        PERFORM bench_plpgsql.check_name('job_type', k_job_type, 128);
        PERFORM bench_plpgsql.check_name('operation_key', k_key, 1024);
        PERFORM bench_plpgsql.check_attempt(k_attempt);
    END IF;
    FOR tries IN 1..16 LOOP
        UPDATE bench_plpgsql.operations o
           SET status = 'released', completed_at = NULL, result = NULL
         WHERE o.job_type = k_job_type AND o.operation_key = k_key
           AND o.attempt = k_attempt AND (o.status = 'claimed' OR o.status = 'skipped');
        IF FOUND OR bench_plpgsql.explain_refusal(k_job_type, k_key, k_attempt, 'release',
                                                  '{claimed,skipped}', 'released') THEN
            RETURN;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'could not release operation "%" of job type "%"', k_key, k_job_type
        USING ERRCODE = '40001';
END
$$;

CREATE FUNCTION bench_plpgsql.extend_lease(
    job_type text,
    operation_key text,
    attempt integer)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    k_job_type text := $1;
    k_key      text := $2;
    k_attempt  integer := $3;
    expires    timestamptz;
BEGIN
    IF k_job_type IS NULL OR k_key IS NULL OR k_job_type = '' OR k_key = ''
       OR octet_length(k_job_type) > 128 OR octet_length(k_key) > 1024
       OR k_attempt IS NULL OR k_attempt < 1 THEN
        PERFORM bench_plpgsql.check_name('job_type', k_job_type, 128);
        PERFORM bench_plpgsql.check_name('operation_key', k_key, 1024);
        PERFORM bench_plpgsql.check_attempt(k_attempt);
    END IF;
    FOR tries IN 1..16 LOOP
        UPDATE bench_plpgsql.operations o SET heartbeat_at = clock_timestamp()
          FROM bench_plpgsql.job_types jt
         WHERE o.job_type = k_job_type AND o.operation_key = k_key
           AND jt.job_type = o.job_type AND o.attempt = k_attempt AND o.status = 'claimed'
        RETURNING o.heartbeat_at + jt.lease INTO expires;
        IF FOUND THEN
            RETURN expires;
        END IF;
        PERFORM bench_plpgsql.explain_refusal(k_job_type, k_key, k_attempt, 'extend the lease of',
                                              '{claimed}', NULL);
    END LOOP;
    RAISE EXCEPTION 'could not extend the lease of operation "%" of job type "%"', k_key, k_job_type
        USING ERRCODE = '40001';
END
$$;

-- (PL/pgSQL cannot have an argument named like an output column, so the
-- argument is for_job_type here; the extension's is job_type.)
CREATE FUNCTION bench_plpgsql.stale_claims(for_job_type text DEFAULT NULL)
RETURNS TABLE (
    job_type text,
    operation_key text,
    attempt integer,
    claimed_at timestamptz,
    claimed_by text,
    stale_policy bench_plpgsql.stale_policy,
    lease_expired_at timestamptz,
    stale_for interval)
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    k_job_type text := $1;
    now_ts     timestamptz := clock_timestamp();
BEGIN
    IF k_job_type IS NOT NULL THEN
        PERFORM bench_plpgsql.check_name('job_type', k_job_type, 128);
        IF NOT EXISTS (SELECT 1 FROM bench_plpgsql.job_types jt WHERE jt.job_type = k_job_type) THEN
            RAISE EXCEPTION 'job type "%" is not registered', k_job_type USING ERRCODE = 'ID001';
        END IF;
    END IF;
    RETURN QUERY
        SELECT o.job_type, o.operation_key, o.attempt, o.claimed_at, o.claimed_by,
               jt.stale_policy, o.heartbeat_at + jt.lease, now_ts - (o.heartbeat_at + jt.lease)
          FROM bench_plpgsql.operations o
          JOIN bench_plpgsql.job_types jt ON jt.job_type = o.job_type
         WHERE o.status = 'claimed' AND o.heartbeat_at + jt.lease <= now_ts
           AND (k_job_type IS NULL OR o.job_type = k_job_type)
         ORDER BY 7, 1, 2;
END
$$;

REVOKE ALL ON SCHEMA bench_plpgsql FROM PUBLIC;
REVOKE ALL ON FUNCTION bench_plpgsql.claim_operation(text, text, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION bench_plpgsql.complete_operation(text, text, integer, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION bench_plpgsql.release_operation(text, text, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION bench_plpgsql.extend_lease(text, text, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION bench_plpgsql.stale_claims(text) FROM PUBLIC;
