--
-- The paced purge: CALL idempotency.purge() deletes what
-- purge_operations() deletes (finished records past their job type's
-- retention; everything else stays), by ranges of heap pages, one
-- transaction per range; purge_block_range() is one range.
--
\set SHOW_CONTEXT never
CREATE EXTENSION idempotency;

CREATE FUNCTION pg_temp.age_record(k text, by interval) RETURNS void
LANGUAGE sql AS $$
    UPDATE idempotency.operations
    SET claimed_at = claimed_at - by, heartbeat_at = heartbeat_at - by,
        completed_at = completed_at - by
    WHERE operation_key = k
$$;
-- the heap block of a record
CREATE FUNCTION pg_temp.block(t tid) RETURNS bigint
LANGUAGE sql AS $$ SELECT (t::text::point)[0]::bigint $$;
-- what a purge may delete now
CREATE VIEW pg_temp.expired AS
SELECT o.*, pg_temp.block(o.ctid) AS block
FROM idempotency.operations o JOIN idempotency.job_types jt USING (job_type)
WHERE o.status IN ('completed', 'skipped') AND o.completed_at <= now() - jt.retention;

INSERT INTO idempotency.job_types (job_type, lease, stale_policy, retention) VALUES
    ('kept_an_hour', '1 minute', 'skip', '1 hour'),
    ('kept_forever', '1 minute', 'skip', NULL);

-- in each job type: completed, skipped, released, claimed (stale) records,
-- two hours old, and one completed a minute ago
SELECT jt, k, (SELECT verdict FROM idempotency.claim_operation(jt, k)) AS claimed
FROM unnest(ARRAY['kept_an_hour', 'kept_forever']) jt,
     unnest(ARRAY['completed', 'skipped', 'released', 'claimed', 'completed-recently']) k;
SELECT idempotency.complete_operation(jt, k, 1)
FROM unnest(ARRAY['kept_an_hour', 'kept_forever']) jt, unnest(ARRAY['completed', 'completed-recently']) k;
SELECT idempotency.release_operation(jt, 'released', 1)
FROM unnest(ARRAY['kept_an_hour', 'kept_forever']) jt;
SELECT pg_temp.age_record('skipped', '2 minutes');
SELECT jt, (SELECT verdict FROM idempotency.claim_operation(jt, 'skipped')) AS redelivery
FROM unnest(ARRAY['kept_an_hour', 'kept_forever']) jt;
SELECT pg_temp.age_record(k, '2 hours')
FROM unnest(ARRAY['completed', 'skipped', 'released', 'claimed']) k;
SELECT pg_temp.age_record('completed-recently', '1 minute');

-- and 1200 finished records of each job type, in turn, so that the table
-- spans many pages with expired records in each; of kept_an_hour's, 1000
-- are two hours old, 200 (every sixth) ten minutes
INSERT INTO idempotency.operations (job_type, operation_key, status, attempt,
                                    claimed_at, heartbeat_at, completed_at)
SELECT jt, 'bulk-' || lpad(g::text, 4, '0'), (CASE WHEN g % 4 = 0 THEN 'skipped' ELSE 'completed' END)::idempotency.operation_status, 1,
       now() - a, now() - a, now() - a
FROM generate_series(1, 1200) g,
     unnest(ARRAY['kept_an_hour', 'kept_forever']) jt,
     LATERAL (SELECT CASE WHEN g % 6 = 0 THEN interval '10 minutes' ELSE interval '2 hours' END) AS age(a)
ORDER BY g, jt;

SELECT job_type, status, count(*) FROM idempotency.operations GROUP BY 1, 2 ORDER BY 1, 2;
SELECT count(*) AS expired, count(DISTINCT block) > 10 AS in_many_pages FROM pg_temp.expired;

-- one range: exactly the expired records of block 1 go, the others stay
CREATE TEMP TABLE in_block_1 AS SELECT job_type, operation_key FROM pg_temp.expired WHERE block = 1;
SELECT idempotency.purge_block_range(1, 1) = (SELECT count(*) FROM in_block_1) AS deleted_block_1;
SELECT count(*) AS left_in_block_1 FROM pg_temp.expired WHERE block = 1;
SELECT count(*) AS records_of_block_1_left FROM in_block_1 JOIN idempotency.operations USING (job_type, operation_key);
SELECT count(*) FILTER (WHERE block = 0) > 0 AS block_0_untouched,
       count(*) FILTER (WHERE block = 2) > 0 AS block_2_untouched
FROM pg_temp.expired;
-- again: nothing left there
SELECT idempotency.purge_block_range(1, 1);
-- past the end of the table, and up to the last possible block: nothing
SELECT idempotency.purge_block_range(100000, 20);
SELECT idempotency.purge_block_range(4294967294, 2147483647);

-- the procedure, 3 pages per batch, no pause: every expired record goes
-- (the count it returns is how many were expired), everything else stays
SELECT count(*) AS expired_before FROM pg_temp.expired \gset
CALL idempotency.purge(3, '0') \gset
SELECT :purged = :expired_before AS purged_every_expired_record;
SELECT count(*) AS expired FROM pg_temp.expired;
SELECT job_type, status, count(*) FROM idempotency.operations GROUP BY 1, 2 ORDER BY 1, 2;
SELECT job_type, operation_key, status FROM idempotency.operations
WHERE operation_key NOT LIKE 'bulk-%' ORDER BY 1, 2;
-- kept_an_hour keeps exactly its 200 young bulk records
SELECT count(*) AS young_bulk_kept,
       bool_and(completed_at > now() - interval '1 hour') AS all_young
FROM idempotency.operations WHERE job_type = 'kept_an_hour' AND operation_key LIKE 'bulk-%';

-- job_type_stats agrees with the table
SELECT job_type, claimed, completed, released, skipped, stale
FROM idempotency.job_type_stats ORDER BY 1;
SELECT (SELECT count(*) FROM idempotency.operations) =
       (SELECT sum(claimed + completed + released + skipped) FROM idempotency.job_type_stats)
       AS stats_count_every_record;

-- nothing left to purge: 0 (the defaults: 20 pages, 20 ms)
CALL idempotency.purge();
-- a purged key is new again: the next delivery runs
SELECT verdict, attempt FROM idempotency.claim_operation('kept_an_hour', 'completed');

-- the pause comes after each batch that deleted something (but the last):
-- 1 page per batch, expired records in k pages, so at least k - 1 pauses
UPDATE idempotency.operations SET completed_at = completed_at - interval '2 hours'
WHERE job_type = 'kept_an_hour' AND operation_key LIKE 'bulk-%';
SELECT count(*) AS expired, count(DISTINCT block) >= 3 AS in_several_pages FROM pg_temp.expired;
SELECT count(DISTINCT block) AS k, clock_timestamp() AS t0 FROM pg_temp.expired \gset
CALL idempotency.purge(pages_per_batch => 1, pause => '30 milliseconds');
SELECT clock_timestamp() - :'t0'::timestamptz >= (:k - 1) * interval '30 milliseconds' AS paused;
SELECT count(*) AS expired FROM pg_temp.expired;

-- a batch larger than the table: one batch
SELECT pg_temp.age_record('completed-recently', '2 hours');
CALL idempotency.purge(pages_per_batch => 2147483647);

-- bad arguments: 22004 for NULL, 22023 out of range (SQLSTATE after each)
CALL idempotency.purge(NULL);
\echo :LAST_ERROR_SQLSTATE
CALL idempotency.purge(0);
\echo :LAST_ERROR_SQLSTATE
CALL idempotency.purge(-1);
\echo :LAST_ERROR_SQLSTATE
CALL idempotency.purge(20, NULL);
\echo :LAST_ERROR_SQLSTATE
CALL idempotency.purge(20, '-1 millisecond');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.purge_block_range(NULL, 20);
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.purge_block_range(0, NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.purge_block_range(-1, 20);
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.purge_block_range(4294967295, 20);
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.purge_block_range(0, 0);
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.purge_block_range(0, -2147483648);
\echo :LAST_ERROR_SQLSTATE

-- inside a transaction block the procedure cannot commit: refused with
-- 25001 before it deletes anything (purge_operations() works there)
SELECT idempotency.complete_operation('kept_an_hour', 'completed', 1);
SELECT pg_temp.age_record('completed', '2 hours');
SELECT count(*) AS expired FROM pg_temp.expired;
BEGIN;
CALL idempotency.purge();
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
SELECT count(*) AS expired FROM pg_temp.expired;
BEGIN;
SELECT idempotency.purge_operations();
ROLLBACK;
-- in a read-only transaction: 25006 from the first batch
SET default_transaction_read_only = on;
CALL idempotency.purge();
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.purge_block_range(0, 20);
\echo :LAST_ERROR_SQLSTATE
RESET default_transaction_read_only;
SELECT count(*) AS expired FROM pg_temp.expired;

-- rights: EXECUTE on the procedure and on purge_block_range() and
-- purge_refuse_transaction_block() is all a role needs; without them, 42501
CREATE ROLE regress_idem_purger;
GRANT USAGE ON SCHEMA idempotency TO regress_idem_purger;
SET ROLE regress_idem_purger;
CALL idempotency.purge();
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
GRANT EXECUTE ON PROCEDURE idempotency.purge(integer, interval, bigint) TO regress_idem_purger;
SET ROLE regress_idem_purger;
CALL idempotency.purge();
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
GRANT EXECUTE ON FUNCTION idempotency.purge_block_range(bigint, integer),
    idempotency.purge_refuse_transaction_block() TO regress_idem_purger;
SET ROLE regress_idem_purger;
CALL idempotency.purge();
SELECT * FROM idempotency.operations;
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
SELECT count(*) AS expired FROM pg_temp.expired;

DROP VIEW pg_temp.expired;
DROP EXTENSION idempotency;
DROP ROLE regress_idem_purger;
