-- bench/sql/purge_throttled.sql: what was tried against the run-path p99
-- during purge_operations(): the same deletes (the same conditions as the
-- extension's ST_PURGE_DELETE), but walked through the table in ranges of
-- pages, each range in its own transaction, with a pause after each range
-- that deleted something. The WAL of the purge (mostly full-page images of
-- the heap pages it touches first after a checkpoint) is spread out instead
-- of being written in one burst that every commit has to wait behind.
-- A bench-only procedure; bench/run.sh compares it with purge_operations().
CREATE PROCEDURE bench_c.purge_throttled(pages_per_batch integer, pause_ms integer,
                                         INOUT deleted bigint DEFAULT 0)
LANGUAGE plpgsql
AS $$
DECLARE
    npages bigint := pg_relation_size('idempotency.operations') / current_setting('block_size')::integer;
    p      bigint := 0;
    n      bigint;
    now_ts timestamptz := clock_timestamp();
BEGIN
    deleted := 0;
    WHILE p <= npages LOOP
        DELETE FROM idempotency.operations o USING idempotency.job_types jt
         WHERE o.ctid >= format('(%s,0)', p)::tid
           AND o.ctid < format('(%s,0)', p + pages_per_batch)::tid
           AND jt.job_type = o.job_type AND jt.retention IS NOT NULL
           AND (o.status = 'completed' OR o.status = 'skipped')
           AND o.completed_at <= now_ts - jt.retention;
        GET DIAGNOSTICS n = ROW_COUNT;
        deleted := deleted + n;
        COMMIT;
        IF n > 0 THEN
            PERFORM pg_sleep(pause_ms / 1000.0);
        END IF;
        p := p + pages_per_batch;
    END LOOP;
END
$$;
