--
-- The hot paths below SPI (src/probe.c): a duplicate claim answered by the
-- primary-key probe, and complete_operation() updating the record with
-- table_tuple_update(). They must leave the table exactly as the SPI path
-- would: index entries for a non-HOT update, and every trigger, CHECK
-- constraint and index a DBA adds to the table honoured (the fast update
-- then steps aside for the executor).
--
\set SHOW_CONTEXT never
CREATE EXTENSION idempotency;
CREATE EXTENSION amcheck;
INSERT INTO idempotency.job_types (job_type, lease) VALUES ('send_confirmation', '1 minute');

-- fill one heap page with claims, so that completing one of them with a
-- large result cannot stay on its page: a non-HOT update, which needs a new
-- primary-key entry
SELECT count(*) FROM generate_series(1, 200) k,
    LATERAL idempotency.claim_operation('send_confirmation', 'ORD-' || (1000 + k)) c
WHERE c.verdict = 'run';
CREATE TEMP TABLE before_completion AS
SELECT operation_key, (ctid::text::point)[0] AS block FROM idempotency.operations;
SELECT idempotency.complete_operation('send_confirmation', 'ORD-1001', 1,
    jsonb_build_object('body', repeat('x', 1800)));
SELECT idempotency.complete_operation('send_confirmation', 'ORD-1002', 1, '{"small": true}');
-- ORD-1001's new version left its full page (non-HOT); ORD-1002's stayed
SELECT b.operation_key, b.block AS block_before, (o.ctid::text::point)[0] = b.block AS same_page
FROM before_completion b JOIN idempotency.operations o USING (operation_key)
WHERE operation_key IN ('ORD-1001', 'ORD-1002') ORDER BY 1;
-- every heap tuple has its index entry, and the index finds both records
SELECT bt_index_parent_check('idempotency.operations_pkey', heapallindexed => true);
SET enable_seqscan = off;
SELECT operation_key, status, length(result::text) AS result_length
FROM idempotency.operations WHERE job_type = 'send_confirmation' AND operation_key IN ('ORD-1001', 'ORD-1002')
ORDER BY 1;
RESET enable_seqscan;
-- and duplicates are answered from the probe, with the stored result
SELECT verdict, attempt, length(result::text) AS result_length
FROM idempotency.claim_operation('send_confirmation', 'ORD-1001');
SELECT * FROM idempotency.claim_operation('send_confirmation', 'ORD-1002');

-- in one transaction the probe sees the transaction's own earlier claim and
-- completion (the transactional mode)
BEGIN;
SELECT verdict, attempt FROM idempotency.claim_operation('send_confirmation', 'ORD-2001');
SELECT idempotency.complete_operation('send_confirmation', 'ORD-2001', 1, '{"in": "tx"}');
SELECT * FROM idempotency.claim_operation('send_confirmation', 'ORD-2001');
SELECT idempotency.complete_operation('send_confirmation', 'ORD-2001', 1);  -- a repeat: no-op
ROLLBACK;
SELECT count(*) AS after_rollback FROM idempotency.operations WHERE operation_key = 'ORD-2001';

-- a second index on the table (here: for a dashboard by status): every
-- completion must add its entry, so the fast update steps aside
CREATE INDEX operations_status ON idempotency.operations (status, completed_at);
SELECT idempotency.complete_operation('send_confirmation', 'ORD-1003', 1, jsonb_build_object('body', repeat('y', 1800)));
SELECT idempotency.complete_operation('send_confirmation', 'ORD-1004', 1);
SELECT bt_index_parent_check('idempotency.operations_status', heapallindexed => true);
SET enable_seqscan = off;
SELECT operation_key FROM idempotency.operations WHERE status = 'completed' ORDER BY 1;
RESET enable_seqscan;
DROP INDEX idempotency.operations_status;

-- a CHECK constraint added by the DBA is enforced on completion
ALTER TABLE idempotency.operations ADD CONSTRAINT result_is_object
    CHECK (result IS NULL OR jsonb_typeof(result) = 'object');
\set VERBOSITY terse
SELECT idempotency.complete_operation('send_confirmation', 'ORD-1005', 1, '[1, 2, 3]');
\echo :LAST_ERROR_SQLSTATE
\set VERBOSITY default
SELECT status, result FROM idempotency.operations WHERE operation_key = 'ORD-1005';
SELECT idempotency.complete_operation('send_confirmation', 'ORD-1005', 1, '{"ok": 1}');
ALTER TABLE idempotency.operations DROP CONSTRAINT result_is_object;

-- row level security forced on a table owner who is not a superuser (who
-- would bypass it) is enforced on completion: the statements run as the owner
CREATE ROLE regress_idem_owner;
GRANT USAGE ON SCHEMA idempotency TO regress_idem_owner;
GRANT SELECT ON idempotency.job_types TO regress_idem_owner;
ALTER TABLE idempotency.operations OWNER TO regress_idem_owner;
ALTER TABLE idempotency.operations ENABLE ROW LEVEL SECURITY;
ALTER TABLE idempotency.operations FORCE ROW LEVEL SECURITY;
CREATE POLICY no_completion ON idempotency.operations
    USING (true) WITH CHECK (status <> 'completed');
\set VERBOSITY terse
SELECT idempotency.complete_operation('send_confirmation', 'ORD-1011', 1);
\echo :LAST_ERROR_SQLSTATE
\set VERBOSITY default
SELECT status FROM idempotency.operations WHERE operation_key = 'ORD-1011';
DROP POLICY no_completion ON idempotency.operations;
ALTER TABLE idempotency.operations NO FORCE ROW LEVEL SECURITY;
ALTER TABLE idempotency.operations DISABLE ROW LEVEL SECURITY;
ALTER TABLE idempotency.operations OWNER TO CURRENT_USER;
REVOKE ALL ON idempotency.job_types FROM regress_idem_owner;
REVOKE ALL ON SCHEMA idempotency FROM regress_idem_owner;
DROP ROLE regress_idem_owner;

-- a trigger added by the DBA fires on completion
CREATE TABLE completions_seen (operation_key text, status text);
CREATE FUNCTION see_completion() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO completions_seen VALUES (NEW.operation_key, NEW.status);
    RETURN NEW;
END $$;
CREATE TRIGGER see_completion AFTER UPDATE ON idempotency.operations
    FOR EACH ROW EXECUTE FUNCTION see_completion();
SELECT idempotency.complete_operation('send_confirmation', 'ORD-1006', 1);
SELECT * FROM completions_seen;
DROP TRIGGER see_completion ON idempotency.operations;

-- the foreign key distribute() adds on Citus (here by hand): its check
-- triggers are the only ones the fast update may leave out, since it never
-- changes job_type; completion and duplicate as before
ALTER TABLE idempotency.operations ADD CONSTRAINT operations_job_type_fkey
    FOREIGN KEY (job_type) REFERENCES idempotency.job_types (job_type);
SELECT idempotency.complete_operation('send_confirmation', 'ORD-1050', 1, '{"fk": true}');
SELECT * FROM idempotency.claim_operation('send_confirmation', 'ORD-1050');
-- a deferrable one is left to the executor; so is a foreign key from
-- another table to the records, whose triggers sit on them
ALTER TABLE idempotency.operations ALTER CONSTRAINT operations_job_type_fkey
    DEFERRABLE INITIALLY DEFERRED;
BEGIN;
SELECT idempotency.complete_operation('send_confirmation', 'ORD-1051', 1);
COMMIT;
ALTER TABLE idempotency.operations DROP CONSTRAINT operations_job_type_fkey;
CREATE TABLE receipts (job_type text, operation_key text,
    FOREIGN KEY (job_type, operation_key) REFERENCES idempotency.operations ON UPDATE CASCADE);
INSERT INTO receipts VALUES ('send_confirmation', 'ORD-1052');
SELECT idempotency.complete_operation('send_confirmation', 'ORD-1052', 1);
SELECT r.operation_key, o.status FROM receipts r JOIN idempotency.operations o USING (job_type, operation_key);
DROP TABLE receipts;

-- a stored generated column is computed on completion
ALTER TABLE idempotency.operations ADD COLUMN done boolean
    GENERATED ALWAYS AS (status = 'completed') STORED;
SELECT idempotency.complete_operation('send_confirmation', 'ORD-1007', 1);
SELECT operation_key, status, done FROM idempotency.operations WHERE operation_key = 'ORD-1007';
ALTER TABLE idempotency.operations DROP COLUMN done;

-- a NOT NULL result column (with a default) refuses a NULL result with
-- 23502, as the executor does, and the claim stays as it was; a result is
-- stored
UPDATE idempotency.operations SET result = '{}' WHERE result IS NULL;
ALTER TABLE idempotency.operations ALTER COLUMN result SET DEFAULT '{}',
    ALTER COLUMN result SET NOT NULL;
\set VERBOSITY terse
SELECT idempotency.complete_operation('send_confirmation', 'ORD-1008', 1, NULL);
\set VERBOSITY default
\echo :LAST_ERROR_SQLSTATE
SELECT status, result FROM idempotency.operations WHERE operation_key = 'ORD-1008';
SELECT idempotency.complete_operation('send_confirmation', 'ORD-1008', 1, '{"sent": true}');
SELECT status, result FROM idempotency.operations WHERE operation_key = 'ORD-1008';
ALTER TABLE idempotency.operations ALTER COLUMN result DROP NOT NULL,
    ALTER COLUMN result DROP DEFAULT;
UPDATE idempotency.operations SET result = NULL WHERE result = '{}';

-- a rule on UPDATE is applied on completion, as the executor would
CREATE TABLE completions_ruled (operation_key text, status text);
CREATE RULE see_completion AS ON UPDATE TO idempotency.operations
    DO ALSO INSERT INTO completions_ruled VALUES (NEW.operation_key, NEW.status::text);
SELECT idempotency.complete_operation('send_confirmation', 'ORD-1012', 1);
SELECT * FROM completions_ruled;
DROP RULE see_completion ON idempotency.operations;
DROP TABLE completions_ruled;

-- a table published for UPDATE without a replica identity refuses the
-- completion as the executor would
ALTER TABLE idempotency.operations REPLICA IDENTITY NOTHING;
SET client_min_messages = error;  -- not the wal_level warning
CREATE PUBLICATION idempotency_pub FOR TABLE idempotency.operations;
RESET client_min_messages;
SELECT idempotency.complete_operation('send_confirmation', 'ORD-1009', 1);
\echo :LAST_ERROR_SQLSTATE
DROP PUBLICATION idempotency_pub;
ALTER TABLE idempotency.operations REPLICA IDENTITY DEFAULT;
SELECT status FROM idempotency.operations WHERE operation_key = 'ORD-1009';

-- a column whose type a superuser changed is converted, never misread
ALTER TABLE idempotency.operations ALTER COLUMN result TYPE json USING result::json;
SELECT idempotency.complete_operation('send_confirmation', 'ORD-1010', 1, '{"after": "alter"}');
SELECT * FROM idempotency.claim_operation('send_confirmation', 'ORD-1010');
SELECT * FROM idempotency.claim_operation('send_confirmation', 'ORD-1002');
SELECT operation_key, result::text FROM idempotency.operations
WHERE operation_key IN ('ORD-1002', 'ORD-1010') ORDER BY 1;
ALTER TABLE idempotency.operations ALTER COLUMN result TYPE jsonb USING result::jsonb;
SELECT * FROM idempotency.claim_operation('send_confirmation', 'ORD-1010');

-- after all that, the table and its index still agree
SELECT bt_index_parent_check('idempotency.operations_pkey', heapallindexed => true);
SELECT status, count(*) FROM idempotency.operations GROUP BY 1 ORDER BY 1;

DROP TABLE completions_seen;
DROP FUNCTION see_completion();

-- The cheap duplicate path: a claim that only answers (completed,
-- in_progress, held, an already skipped record) writes nothing, so it takes
-- no transaction id. Only a claim that writes (run, verify, a new skipped)
-- takes one. (A held verdict queues a NOTIFY; PostgreSQL assigns a
-- transaction id for it at commit, as for every NOTIFY, not during the call.)
INSERT INTO idempotency.job_types (job_type, lease, stale_policy) VALUES
    ('xid_hold', '10 minutes', 'hold'), ('xid_skip', '10 minutes', 'skip');
SELECT verdict FROM idempotency.claim_operation('xid_hold', 'done');
SELECT idempotency.complete_operation('xid_hold', 'done', 1, '{"sent": true}');
SELECT verdict FROM idempotency.claim_operation('xid_hold', 'busy');
SELECT verdict FROM idempotency.claim_operation('xid_hold', 'stuck');
SELECT verdict FROM idempotency.claim_operation('xid_skip', 'given_up');
UPDATE idempotency.operations
SET claimed_at = claimed_at - interval '1 hour', heartbeat_at = heartbeat_at - interval '1 hour'
WHERE operation_key IN ('stuck', 'given_up');
SELECT verdict FROM idempotency.claim_operation('xid_skip', 'given_up');
BEGIN;
SELECT verdict, attempt, result FROM idempotency.claim_operation('xid_hold', 'done');
SELECT pg_current_xact_id_if_assigned() IS NULL AS no_xid_after_completed;
SELECT verdict, attempt FROM idempotency.claim_operation('xid_hold', 'busy');
SELECT pg_current_xact_id_if_assigned() IS NULL AS no_xid_after_in_progress;
SELECT verdict, attempt FROM idempotency.claim_operation('xid_hold', 'stuck');
SELECT pg_current_xact_id_if_assigned() IS NULL AS no_xid_after_held;
SELECT verdict, attempt FROM idempotency.claim_operation('xid_skip', 'given_up');
SELECT pg_current_xact_id_if_assigned() IS NULL AS no_xid_after_skipped;
ROLLBACK;
-- the same check sees the transaction id of a claim that writes
BEGIN;
SELECT verdict, attempt FROM idempotency.claim_operation('xid_hold', 'new');
SELECT pg_current_xact_id_if_assigned() IS NOT NULL AS xid_after_run;
ROLLBACK;
DELETE FROM idempotency.operations WHERE job_type IN ('xid_hold', 'xid_skip');
DELETE FROM idempotency.job_types WHERE job_type IN ('xid_hold', 'xid_skip');

-- idempotency.direct_shard_path: where Citus manages the tables, off sends
-- every call through Citus (test/citus/repro.py); on one node it changes
-- nothing. A boolean, settable by any role.
SHOW idempotency.direct_shard_path;
SET idempotency.direct_shard_path = off;
SELECT verdict, attempt FROM idempotency.claim_operation('send_confirmation', 'ORD-9001');
SELECT verdict, attempt FROM idempotency.claim_operation('send_confirmation', 'ORD-1001');
SET idempotency.direct_shard_path = 'sometimes';
RESET idempotency.direct_shard_path;
SHOW idempotency.direct_shard_path;

DROP EXTENSION amcheck;
DROP EXTENSION idempotency;
