/*
 * portable/admin.sql: what people and sweepers call: stale_claims(),
 * resolve_operation(), purge_operations() and the paced purge,
 * purge_block_range(), purge_refuse_transaction_block() and the procedure
 * purge(): the C edition's src/admin.c, its statements (STALE_CLAIMS_SQL,
 * PURGEABLE, OP_RESOLVE_*, OP_AUDIT, OP_PURGE_*, src/statements.c) and
 * idem_decide_resolve() (src/protocol.c), in PL/pgSQL.
 *
 * The functions are SECURITY DEFINER: their statements run with the rights
 * of the tables' owner, as the C edition's do, and EXECUTE is the
 * permission. Time is clock_timestamp() at the call (the C edition's
 * GetCurrentTimestamp()). What differs from the C edition is said above
 * each function it concerns.
 */

--
-- stale_claims(): every claimed record whose lease ran out, ordered by
-- when it ran out. Reads only, so it works on a hot standby and in a
-- read-only transaction. A typo in the job type is an error (ID001), not
-- an empty list. No worker_role check: operators see every job type.
--
-- PL/pgSQL refuses a function whose argument and result column share a
-- name (job_type), so the work is idempotency.stale_claims_of()'s and
-- stale_claims() is its SQL wrapper.
--
CREATE OR REPLACE FUNCTION idempotency.stale_claims_of(job_type pg_catalog.text)
RETURNS TABLE (
    s_job_type pg_catalog.text,
    s_operation_key pg_catalog.text,
    s_attempt pg_catalog.int4,
    s_claimed_at pg_catalog.timestamptz,
    s_claimed_by pg_catalog.text,
    s_stale_policy idempotency.stale_policy,
    s_lease_expired_at pg_catalog.timestamptz,
    s_stale_for pg_catalog.interval)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    now_ts  pg_catalog.timestamptz := pg_catalog.clock_timestamp();
BEGIN
    IF stale_claims_of.job_type IS NULL THEN
        RETURN QUERY
        SELECT o.job_type, o.operation_key, o.attempt, o.claimed_at, o.claimed_by, jt.stale_policy,
               o.heartbeat_at + jt.lease, now_ts - (o.heartbeat_at + jt.lease)
        FROM idempotency.operations o
        JOIN idempotency.job_types jt ON jt.job_type = o.job_type
        WHERE o.status = 'claimed' AND (o.heartbeat_at + jt.lease) <= now_ts
        ORDER BY 7, 1, 2;
        RETURN;
    END IF;

    IF pg_catalog.octet_length(stale_claims_of.job_type) NOT BETWEEN 1 AND 128 THEN
        PERFORM idempotency.bad_argument('job_type', stale_claims_of.job_type);
    END IF;
    PERFORM FROM idempotency.job_types jt WHERE jt.job_type = stale_claims_of.job_type;
    IF NOT FOUND THEN
        PERFORM idempotency.unknown_job_type(stale_claims_of.job_type);
    END IF;
    RETURN QUERY
    SELECT o.job_type, o.operation_key, o.attempt, o.claimed_at, o.claimed_by, jt.stale_policy,
           o.heartbeat_at + jt.lease, now_ts - (o.heartbeat_at + jt.lease)
    FROM idempotency.operations o
    JOIN idempotency.job_types jt ON jt.job_type = o.job_type
    WHERE o.status = 'claimed' AND (o.heartbeat_at + jt.lease) <= now_ts
      AND o.job_type = stale_claims_of.job_type
    ORDER BY 7, 1, 2;
END
$$;
COMMENT ON FUNCTION idempotency.stale_claims_of(pg_catalog.text) IS
'Portable edition, internal: the rows of stale_claims() (of one job type, or of all for NULL)';

CREATE OR REPLACE FUNCTION idempotency.stale_claims(job_type text DEFAULT NULL)
RETURNS TABLE (
    job_type text,
    operation_key text,
    attempt integer,
    claimed_at timestamptz,
    claimed_by text,
    stale_policy idempotency.stale_policy,
    lease_expired_at timestamptz,
    stale_for interval)
LANGUAGE sql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
SELECT * FROM idempotency.stale_claims_of($1)
$$;
COMMENT ON FUNCTION idempotency.stale_claims(text) IS
'Every claimed operation whose lease has run out (of one job type, or all), oldest first: what a person or a sweeper reads. stale_for is the time since the lease ran out';

--
-- resolve_operation(): a person's decision on a record that waits for one:
-- a claim whose lease ran out (held, or stale under any policy), or a
-- skipped record. 'completed': the effect did happen. 'retry': it did not;
-- the record becomes released and the next delivery runs. The update names
-- the record as it was read (attempt, heartbeat, status); when it updates
-- nothing the record is read and decided on again, at most 16 times. The
-- audit row's resolved_by is idempotency.caller(), the role the session
-- acts as: current_user here is the tables' owner (SECURITY DEFINER), where
-- the C edition records the caller's current_user (portable/common.sql).
--
CREATE OR REPLACE FUNCTION idempotency.resolve_operation(
    job_type text,
    operation_key text,
    resolution text,
    note text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    completed   boolean;
    now_ts      pg_catalog.timestamptz;
    jt_found    boolean;
    r_status    idempotency.operation_status;
    r_attempt   pg_catalog.int4;
    r_heartbeat pg_catalog.timestamptz;
    r_expires   pg_catalog.timestamptz;
BEGIN
    IF resolve_operation.job_type IS NULL
       OR pg_catalog.octet_length(resolve_operation.job_type) NOT BETWEEN 1 AND 128 THEN
        PERFORM idempotency.bad_argument('job_type', resolve_operation.job_type);
    END IF;
    IF resolve_operation.operation_key IS NULL
       OR pg_catalog.octet_length(resolve_operation.operation_key) NOT BETWEEN 1 AND 1024 THEN
        PERFORM idempotency.bad_argument('operation_key', resolve_operation.operation_key);
    END IF;
    IF resolve_operation.resolution IS NULL THEN
        RAISE EXCEPTION 'resolution must not be null' USING ERRCODE = 'null_value_not_allowed',
            DETAIL = 'A resolution records a person''s decision on a stale claim or a skipped operation.',
            HINT = 'Use ''completed'' (the effect happened) or ''retry'' (it did not).';
    END IF;
    -- byte for byte, as the C edition's strcmp(), whatever the argument's collation
    IF resolve_operation.resolution COLLATE "C" = 'completed' THEN
        completed := true;
    ELSIF resolve_operation.resolution COLLATE "C" = 'retry' THEN
        completed := false;
    ELSE
        RAISE EXCEPTION 'unknown resolution "%"', resolve_operation.resolution
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'A resolution is ''completed'' or ''retry''.',
                  HINT = 'Use ''completed'' (the effect happened) or ''retry'' (it did not).';
    END IF;
    IF pg_catalog.current_setting('transaction_read_only')::boolean THEN
        PERFORM idempotency.refuse_read_only('resolve_operation()');
    END IF;

    FOR tries IN 1 .. 17 LOOP
        IF tries > 16 THEN
            PERFORM idempotency.too_many_tries('resolve', resolve_operation.job_type,
                                               resolve_operation.operation_key);
        END IF;
        now_ts := pg_catalog.clock_timestamp();
        jt_found := false;
        SELECT true, o.status, o.attempt, o.heartbeat_at, o.heartbeat_at + jt.lease
        INTO jt_found, r_status, r_attempt, r_heartbeat, r_expires
        FROM idempotency.job_types jt
        LEFT JOIN idempotency.operations o
               ON o.job_type = jt.job_type AND o.operation_key = resolve_operation.operation_key
        WHERE jt.job_type = resolve_operation.job_type;
        IF NOT FOUND THEN
            PERFORM idempotency.unknown_job_type(resolve_operation.job_type);
        END IF;
        IF r_status IS NULL THEN
            PERFORM idempotency.no_record(resolve_operation.job_type, resolve_operation.operation_key);
        END IF;
        IF NOT (r_status = 'skipped' OR (r_status = 'claimed' AND now_ts >= r_expires)) THEN
            RAISE EXCEPTION 'operation "%" of job type "%" is not waiting for a decision',
                resolve_operation.operation_key, resolve_operation.job_type
                USING ERRCODE = 'ID005',
                      DETAIL = pg_catalog.format('It is %s%s.', r_status,
                                                 CASE WHEN r_status = 'claimed'
                                                      THEN ' and its lease has not run out' ELSE '' END),
                      HINT = 'Only a stale claim or a skipped operation can be resolved.';
        END IF;

        IF completed THEN
            UPDATE idempotency.operations o
            SET status = 'completed', completed_at = now_ts
            WHERE o.job_type = resolve_operation.job_type AND o.operation_key = resolve_operation.operation_key
              AND o.attempt = r_attempt AND o.heartbeat_at = r_heartbeat AND o.status = r_status;
        ELSE
            UPDATE idempotency.operations o
            SET status = 'released', completed_at = NULL, result = NULL
            WHERE o.job_type = resolve_operation.job_type AND o.operation_key = resolve_operation.operation_key
              AND o.attempt = r_attempt AND o.heartbeat_at = r_heartbeat AND o.status = r_status;
        END IF;
        IF NOT FOUND THEN
            CONTINUE;           -- it changed under us: decide again
        END IF;

        INSERT INTO idempotency.resolutions
            (job_type, operation_key, attempt, previous_status, resolution, resolved_by, resolved_at, note)
        VALUES (resolve_operation.job_type, resolve_operation.operation_key, r_attempt, r_status,
                resolve_operation.resolution, idempotency.caller(), now_ts, resolve_operation.note);
        RETURN;
    END LOOP;
END
$$;
COMMENT ON FUNCTION idempotency.resolve_operation(text, text, text, text) IS
'A person''s decision on a stale (held) claim or a skipped record: completed (the effect did happen) or retry (it did not; the record becomes released). Audited in idempotency.resolutions';

--
-- purge_operations(): deletes completed and skipped records older than
-- their job type's retention. One pass over the table through a cursor;
-- each batch of batch_size rows is one DELETE by ctid that checks every
-- condition again, so a record that changed since the scan is left alone.
-- Claims of the records being deleted do not wait for it: they only read.
--
CREATE OR REPLACE FUNCTION idempotency.purge_operations(batch_size integer DEFAULT 10000)
RETURNS bigint
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    now_ts      pg_catalog.timestamptz;
    tids        pg_catalog.tid[] := '{}';
    t           pg_catalog.tid;
    n           pg_catalog.int8;
    deleted     pg_catalog.int8 := 0;
BEGIN
    IF batch_size IS NULL THEN
        RAISE EXCEPTION 'batch_size must not be null' USING ERRCODE = 'null_value_not_allowed',
            DETAIL = 'purge_operations() deletes the expired records in batches of batch_size rows, one DELETE each.',
            HINT = 'Pass a positive batch size, or leave it out for the default of 10000.';
    END IF;
    IF batch_size < 1 THEN
        RAISE EXCEPTION 'batch_size must be positive, not %', batch_size USING ERRCODE = 'invalid_parameter_value',
            DETAIL = 'purge_operations() deletes the expired records in batches of batch_size rows, one DELETE each.',
            HINT = 'Pass a positive batch size, or leave it out for the default of 10000.';
    END IF;
    now_ts := pg_catalog.clock_timestamp();
    IF pg_catalog.current_setting('transaction_read_only')::boolean THEN
        PERFORM idempotency.refuse_read_only('purge_operations()');
    END IF;

    FOR t IN
        SELECT o.ctid FROM idempotency.operations o, idempotency.job_types jt
        WHERE jt.job_type = o.job_type AND jt.retention IS NOT NULL
          AND (o.status = 'completed' OR o.status = 'skipped')
          AND o.completed_at <= (now_ts - jt.retention)
    LOOP
        tids := tids || t;
        IF pg_catalog.cardinality(tids) >= batch_size THEN
            DELETE FROM idempotency.operations o USING idempotency.job_types jt
            WHERE o.ctid = ANY (tids)
              AND jt.job_type = o.job_type AND jt.retention IS NOT NULL
              AND (o.status = 'completed' OR o.status = 'skipped')
              AND o.completed_at <= (now_ts - jt.retention);
            GET DIAGNOSTICS n = ROW_COUNT;
            deleted := deleted + n;
            tids := '{}';
        END IF;
    END LOOP;
    IF pg_catalog.cardinality(tids) > 0 THEN
        DELETE FROM idempotency.operations o USING idempotency.job_types jt
        WHERE o.ctid = ANY (tids)
          AND jt.job_type = o.job_type AND jt.retention IS NOT NULL
          AND (o.status = 'completed' OR o.status = 'skipped')
          AND o.completed_at <= (now_ts - jt.retention);
        GET DIAGNOSTICS n = ROW_COUNT;
        deleted := deleted + n;
    END IF;
    RETURN deleted;
END
$$;
COMMENT ON FUNCTION idempotency.purge_operations(integer) IS
'Delete completed and skipped records older than their job type''s retention, batch_size rows per statement; returns how many were deleted';

--
-- Paced purge
--
-- purge_operations() deletes everything expired in one transaction; its
-- burst of WAL (a full-page image of every heap page it touches first after
-- a checkpoint) makes every concurrent commit wait. The procedure
-- idempotency.purge() does the same deletes by ranges of heap pages (TID
-- range scans), commits after each range and pauses after a range that
-- deleted something, so the WAL comes in small pieces (bench/analysis.md).
--

--
-- purge_block_range(): the unit of the paced purge: deletes the records
-- purge_operations() would delete, but only those whose tuples lie in the
-- heap blocks [first_block, first_block + blocks) of idempotency.operations.
-- One DELETE with a TID range scan, so it reads only those blocks and,
-- called in its own transaction, writes a small, bounded amount of WAL.
-- The range is [(first_block,0), (end_block,0)): offset 0 comes before
-- every tuple of its block; an end past the last block number is clamped
-- to 4294967295, where no tuple lives. A range past the end of the table
-- deletes nothing.
--
CREATE OR REPLACE FUNCTION idempotency.purge_block_range(first_block bigint, blocks integer)
RETURNS bigint
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    first_tid   pg_catalog.tid;
    end_tid     pg_catalog.tid;
    now_ts      pg_catalog.timestamptz;
    n           pg_catalog.int8;
BEGIN
    IF first_block IS NULL THEN
        RAISE EXCEPTION 'first_block must not be null' USING ERRCODE = 'null_value_not_allowed',
            DETAIL = 'purge_block_range() purges the heap blocks first_block to first_block + blocks - 1 of idempotency.operations.',
            HINT = 'Pass a block number from 0 up, as idempotency.purge() does.';
    END IF;
    IF first_block < 0 OR first_block > 4294967294 THEN
        RAISE EXCEPTION 'first_block must be between 0 and 4294967294, not %', first_block
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'Heap block numbers run from 0 to 4294967294.',
                  HINT = 'Pass a block number from 0 up; a range past the end of the table deletes nothing.';
    END IF;
    IF blocks IS NULL THEN
        RAISE EXCEPTION 'blocks must not be null' USING ERRCODE = 'null_value_not_allowed',
            DETAIL = 'blocks is the number of heap blocks, from first_block on, that purge_block_range() purges.',
            HINT = 'Pass a positive number of blocks, for example 20 as idempotency.purge() does by default.';
    END IF;
    IF blocks < 1 THEN
        RAISE EXCEPTION 'blocks must be positive, not %', blocks USING ERRCODE = 'invalid_parameter_value',
            DETAIL = 'blocks is the number of heap blocks, from first_block on, that purge_block_range() purges.',
            HINT = 'Pass a positive number of blocks, for example 20 as idempotency.purge() does by default.';
    END IF;
    first_tid := pg_catalog.format('(%s,0)', first_block)::pg_catalog.tid;
    end_tid := pg_catalog.format('(%s,0)', LEAST(first_block + blocks, 4294967295))::pg_catalog.tid;

    now_ts := pg_catalog.clock_timestamp();
    IF pg_catalog.current_setting('transaction_read_only')::boolean THEN
        PERFORM idempotency.refuse_read_only('purge_block_range()');
    END IF;
    DELETE FROM idempotency.operations o USING idempotency.job_types jt
    WHERE o.ctid >= first_tid AND o.ctid < end_tid
      AND jt.job_type = o.job_type AND jt.retention IS NOT NULL
      AND (o.status = 'completed' OR o.status = 'skipped')
      AND o.completed_at <= (now_ts - jt.retention);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;
COMMENT ON FUNCTION idempotency.purge_block_range(bigint, integer) IS
'Delete the completed and skipped records older than their job type''s retention whose tuples lie in heap blocks first_block .. first_block + blocks - 1 of idempotency.operations (one DELETE, a TID range scan); returns how many. The unit of idempotency.purge(). Where Citus manages the tables, a range from block 0 purges every shard and any other range nothing';

--
-- purge_refuse_transaction_block(): the first step of idempotency.purge(),
-- which commits after every batch: where it cannot commit, it is refused
-- before anything is deleted, with the error VACUUM gives in the same
-- place (25001), rather than PostgreSQL's "invalid transaction
-- termination" (2D000) at the procedure's first COMMIT.
--
-- What differs: the C edition asks IsTransactionBlock(); no SQL or
-- PL/pgSQL function can ask that, and no clock tells either (under the
-- extended query protocol every transaction begins before its statement,
-- at Parse or Bind, so comparing transaction_timestamp() with
-- statement_timestamp() would refuse JDBC's or asyncpg's CALL in
-- autocommit; a block begun in the same query string starts with its
-- statement). Only the procedure can find out, by trying to commit, which
-- it does before it calls this function (see purge() below), and it tells
-- this function what it found in the transaction's setting
-- idempotency_portable.purge_cannot_commit. So this function refuses exactly where
-- purge() cannot commit: a transaction block (BEGIN, or several statements
-- in one query string, as in the C edition) and also a CALL from a
-- function or from a procedure with a SET clause or SECURITY DEFINER,
-- which the C edition refuses only at its first COMMIT (2D000), after its
-- first batch (rolled back). Called directly (not by purge()), it raises
-- nothing: only purge() can tell.
--
CREATE OR REPLACE FUNCTION idempotency.purge_refuse_transaction_block()
RETURNS void
LANGUAGE plpgsql VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF pg_catalog.current_setting('idempotency_portable.purge_cannot_commit', true) = 'on' THEN
        RAISE EXCEPTION 'idempotency.purge() cannot run inside a transaction block'
            USING ERRCODE = 'active_sql_transaction',
                  DETAIL = 'It commits after every batch of pages.',
                  HINT = 'CALL it alone in autocommit mode, as pg_cron does: not after BEGIN, not with other statements in one query string. Inside a transaction, use SELECT idempotency.purge_operations().';
    END IF;
END
$$;
COMMENT ON FUNCTION idempotency.purge_refuse_transaction_block() IS
'Raises SQLSTATE 25001 inside a transaction block, where idempotency.purge() could not commit; called by idempotency.purge() before it deletes anything';

--
-- purge(): the C edition's procedure (idempotency--0.4.sql), with one
-- addition before its first step: it finds out whether it can commit at
-- all, which PL/pgSQL can only learn by trying. A COMMIT inside a block
-- with an exception handler never commits (the block is a subtransaction);
-- where the procedure may commit it fails with "cannot commit while a
-- subtransaction is active", where it may not (a transaction block, a call
-- from a function) with "invalid transaction termination", both 2D000.
-- The latter sets idempotency_portable.purge_cannot_commit for the transaction, and
-- purge_refuse_transaction_block() refuses with 25001. Messages in another
-- language than English are not recognised: then the plain COMMIT that
-- follows refuses instead (2D000), still before anything is deleted; where
-- the procedure may commit, that COMMIT commits nothing (the C edition's
-- first batch commits whatever the caller's transaction held before, this
-- commit does so a batch earlier).
--
-- It is SECURITY INVOKER and has no SET clause, because a procedure with
-- either cannot COMMIT; so every name and operator in it is
-- schema-qualified, and the caller's search_path cannot capture them
-- (test/t/004_hostile_search_path.pl). The deletes themselves run, like
-- every function's, with the table owner's rights (purge_block_range()).
-- It always makes at least one batch (GREATEST(..., 1), a construct, not
-- a function the search_path could capture), as the C edition's does for
-- Citus, whose local relation is an empty shell; here that changes
-- nothing.
--
CREATE OR REPLACE PROCEDURE idempotency.purge(
    pages_per_batch integer DEFAULT 20,
    pause interval DEFAULT '20 milliseconds',
    INOUT purged bigint DEFAULT NULL)
LANGUAGE plpgsql
AS $$
DECLARE
    blocks        pg_catalog.int8;  -- the table's size when the walk starts
    next_block    pg_catalog.int8 := 0;
    deleted       pg_catalog.int8;
    pause_seconds pg_catalog.float8;
    probe         pg_catalog.text;  -- portable edition: why a COMMIT failed
BEGIN
    IF pages_per_batch IS NULL THEN
        RAISE EXCEPTION 'pages_per_batch must not be null'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF pages_per_batch OPERATOR(pg_catalog.<) 1 THEN
        RAISE EXCEPTION 'pages_per_batch must be positive, not %', pages_per_batch
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'The default, 20 pages per transaction, keeps the purge''s WAL from slowing concurrent commits.';
    END IF;
    IF pause IS NULL THEN
        RAISE EXCEPTION 'pause must not be null'
            USING ERRCODE = 'null_value_not_allowed',
                  HINT = 'Pass interval ''0'' for no pause.';
    END IF;
    IF pause OPERATOR(pg_catalog.<) '0'::pg_catalog.interval THEN
        RAISE EXCEPTION 'pause must not be negative, not %', pause
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- portable edition: may this procedure commit? (see above)
    BEGIN
        COMMIT;
    EXCEPTION WHEN invalid_transaction_termination THEN
        GET STACKED DIAGNOSTICS probe = MESSAGE_TEXT;
    END;
    PERFORM pg_catalog.set_config('idempotency_portable.purge_cannot_commit',
        CASE WHEN probe OPERATOR(pg_catalog.=) 'invalid transaction termination' THEN 'on' ELSE 'off' END, true);
    PERFORM idempotency.purge_refuse_transaction_block();
    COMMIT;                         -- portable edition: nothing is done yet (see above)
    pause_seconds := pg_catalog.date_part('epoch', pause);
    blocks := GREATEST(pg_catalog.pg_relation_size('idempotency.operations'::pg_catalog.regclass)
              OPERATOR(pg_catalog./) pg_catalog.current_setting('block_size')::pg_catalog.int8, 1);
    purged := 0;
    WHILE next_block OPERATOR(pg_catalog.<) blocks LOOP
        deleted := idempotency.purge_block_range(next_block, pages_per_batch);
        COMMIT;
        purged := purged OPERATOR(pg_catalog.+) deleted;
        next_block := next_block OPERATOR(pg_catalog.+) pages_per_batch;
        -- a batch that deleted nothing wrote (next to) no WAL: no pause
        IF deleted OPERATOR(pg_catalog.>) 0 AND pause_seconds OPERATOR(pg_catalog.>) 0::pg_catalog.float8
           AND next_block OPERATOR(pg_catalog.<) blocks THEN
            PERFORM pg_catalog.pg_sleep(pause_seconds);
        END IF;
    END LOOP;
END
$$;
COMMENT ON PROCEDURE idempotency.purge(integer, interval, bigint) IS
'CALL it (outside a transaction block, e.g. from pg_cron) to delete what purge_operations() deletes without slowing concurrent commits: pages_per_batch heap pages per transaction, a pause after each batch that deleted something; returns purged, how many records were deleted';
