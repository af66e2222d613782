--
-- Upgrade: a database on version 0.1, with workers, operators and records
-- in every state, runs ALTER EXTENSION idempotency UPDATE. Records,
-- configuration, audit, grants and comments come through unchanged; the
-- protocol goes on from where 0.1 left it; 0.2's per-job-type roles apply.
--
\set SHOW_CONTEXT never
CREATE EXTENSION idempotency VERSION '0.1';
SELECT extversion FROM pg_extension WHERE extname = 'idempotency';
-- 0.1's functions call 0.1's entry points of the library
SELECT p.proname, p.prosrc FROM pg_proc p
WHERE p.pronamespace = 'idempotency'::regnamespace AND p.prolang = (SELECT oid FROM pg_language WHERE lanname = 'c')
ORDER BY 1;

CREATE ROLE regress_idem_up_worker;
CREATE ROLE regress_idem_up_other;
CREATE ROLE regress_idem_up_operator;
GRANT USAGE ON SCHEMA idempotency TO regress_idem_up_worker, regress_idem_up_other, regress_idem_up_operator;
GRANT EXECUTE ON FUNCTION
    idempotency.claim_operation(text, text, text, text),
    idempotency.complete_operation(text, text, integer, jsonb),
    idempotency.release_operation(text, text, integer),
    idempotency.extend_lease(text, text, integer)
TO regress_idem_up_worker, regress_idem_up_other;
GRANT EXECUTE ON FUNCTION
    idempotency.stale_claims(text),
    idempotency.resolve_operation(text, text, text, text),
    idempotency.purge_operations(integer)
TO regress_idem_up_operator;
GRANT SELECT ON idempotency.job_type_stats TO regress_idem_up_operator;

INSERT INTO idempotency.job_types (job_type, lease, stale_policy, max_attempts, retention) VALUES
    ('send_confirmation', '1 minute', 'hold', NULL, NULL),
    ('charge', '1 minute', 'retry', 3, '30 days'),
    ('digest', '1 minute', 'skip', NULL, NULL),
    ('refund', '1 minute', 'lookup', NULL, NULL);

-- records in every state, made through the 0.1 functions by the worker
SET ROLE regress_idem_up_worker;
SELECT verdict, attempt FROM idempotency.claim_operation('send_confirmation', 'ORD-1', 'fp-1', 'w1');
SELECT idempotency.complete_operation('send_confirmation', 'ORD-1', 1, '{"message_id": "m-1"}');
SELECT verdict, attempt FROM idempotency.claim_operation('send_confirmation', 'ORD-2', 'fp-2', 'w1');
SELECT verdict, attempt FROM idempotency.claim_operation('send_confirmation', 'ORD-3', NULL, 'w1');
SELECT verdict, attempt FROM idempotency.claim_operation('charge', 'CH-1', NULL, 'w1');
SELECT idempotency.release_operation('charge', 'CH-1', 1);
SELECT verdict, attempt FROM idempotency.claim_operation('charge', 'CH-2', NULL, 'w1');
SELECT verdict, attempt FROM idempotency.claim_operation('charge', 'CH-3', NULL, 'w1');
SELECT idempotency.complete_operation('charge', 'CH-3', 1);
SELECT verdict, attempt FROM idempotency.claim_operation('digest', 'DG-1', NULL, 'w1');
SELECT verdict, attempt FROM idempotency.claim_operation('refund', 'RF-1', NULL, 'w1');
RESET ROLE;
-- ORD-3's worker died: its claim is stale (held); CH-2's too (retry), DG-1's
-- (skip) and RF-1's (lookup); an operator decides ORD-3 and CH-3 is old
-- enough to be purged; a redelivery of DG-1 gives it up (skipped)
UPDATE idempotency.operations SET heartbeat_at = heartbeat_at - interval '2 minutes',
    claimed_at = claimed_at - interval '2 minutes'
WHERE operation_key IN ('ORD-3', 'CH-2', 'DG-1', 'RF-1');
SET ROLE regress_idem_up_worker;
SELECT verdict, attempt FROM idempotency.claim_operation('digest', 'DG-1', NULL, 'w2');
RESET ROLE;
UPDATE idempotency.operations SET completed_at = completed_at - interval '31 days'
WHERE operation_key = 'CH-3';
SET ROLE regress_idem_up_operator;
SELECT job_type, operation_key, attempt FROM idempotency.stale_claims() ORDER BY 1, 2;
SELECT idempotency.resolve_operation('send_confirmation', 'ORD-3', 'retry', 'not in the provider log');
RESET ROLE;

-- what 0.1 holds, kept to compare
CREATE TABLE before_operations AS SELECT * FROM idempotency.operations;
CREATE TABLE before_job_types AS SELECT * FROM idempotency.job_types;
CREATE TABLE before_resolutions AS SELECT * FROM idempotency.resolutions;
CREATE TABLE before_objects AS
SELECT classid, objid, objsubid, pg_describe_object(classid, objid, objsubid) AS object,
       obj_description(objid, classid::regclass::name) AS comment
FROM pg_depend WHERE refclassid = 'pg_extension'::regclass
  AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idempotency') AND deptype = 'e';
CREATE TABLE before_acl AS
SELECT oid, proname, proacl::text AS acl FROM pg_proc WHERE pronamespace = 'idempotency'::regnamespace
UNION ALL
SELECT oid, relname, relacl::text FROM pg_class WHERE relnamespace = 'idempotency'::regnamespace
UNION ALL
SELECT oid, nspname, nspacl::text FROM pg_namespace WHERE nspname = 'idempotency';

ALTER EXTENSION idempotency UPDATE TO '0.2';
SELECT extversion FROM pg_extension WHERE extname = 'idempotency';
-- the worker functions now call 0.2's entry points
SELECT p.proname, p.prosrc FROM pg_proc p
WHERE p.pronamespace = 'idempotency'::regnamespace AND p.prolang = (SELECT oid FROM pg_language WHERE lanname = 'c')
ORDER BY 1;

-- records, configuration and audit are unchanged (both differences empty)
SELECT 'lost' AS diff, * FROM (TABLE before_operations EXCEPT TABLE idempotency.operations) d
UNION ALL
SELECT 'new or changed', * FROM (TABLE idempotency.operations EXCEPT TABLE before_operations) d;
SELECT 'lost' AS diff, * FROM (TABLE before_job_types
    EXCEPT SELECT job_type, lease, stale_policy, max_attempts, retention FROM idempotency.job_types) d
UNION ALL
SELECT 'new or changed', * FROM (SELECT job_type, lease, stale_policy, max_attempts, retention FROM idempotency.job_types
    EXCEPT TABLE before_job_types) d;
SELECT count(*) AS job_types_with_a_worker_role FROM idempotency.job_types WHERE worker_role IS NOT NULL;
SELECT 'lost' AS diff, * FROM (TABLE before_resolutions EXCEPT TABLE idempotency.resolutions) d
UNION ALL
SELECT 'new or changed', * FROM (TABLE idempotency.resolutions EXCEPT TABLE before_resolutions) d;

-- every object of 0.1 is still a member of the extension with its comment
-- (0.2 rewrites the comments of the four worker functions only), and every
-- grant is as it was (no object lost its ACL, none gained PUBLIC)
SELECT b.object, b.comment AS before, obj_description(b.objid, b.classid::regclass::name) AS after
FROM before_objects b
WHERE NOT EXISTS (SELECT 1 FROM pg_depend d
                  WHERE d.classid = b.classid AND d.objid = b.objid AND d.deptype = 'e'
                    AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idempotency'))
   OR b.comment IS DISTINCT FROM obj_description(b.objid, b.classid::regclass::name)
      AND b.object !~ '^function idempotency\.(claim_operation|complete_operation|release_operation|extend_lease)\('
ORDER BY 1;
SELECT b.proname, b.acl AS before, a.acl AS after
FROM before_acl b
LEFT JOIN (SELECT oid, proacl::text AS acl FROM pg_proc
           UNION ALL SELECT oid, relacl::text FROM pg_class
           UNION ALL SELECT oid, nspacl::text FROM pg_namespace) a USING (oid)
WHERE a.acl IS DISTINCT FROM b.acl;
-- every object of the extension, old or new, has a comment and no PUBLIC grant
SELECT pg_describe_object(classid, objid, objsubid) AS uncommented
FROM pg_depend WHERE refclassid = 'pg_extension'::regclass
  AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idempotency') AND deptype = 'e'
  AND obj_description(objid, classid::regclass::name) IS NULL
  AND classid <> 'pg_type'::regclass;
SELECT proname AS granted_to_public FROM pg_proc
WHERE pronamespace = 'idempotency'::regnamespace
  AND (proacl IS NULL OR EXISTS (SELECT 1 FROM aclexplode(proacl) a WHERE a.grantee = 0));

-- the protocol goes on from where 0.1 left it
SET ROLE regress_idem_up_worker;
SELECT * FROM idempotency.claim_operation('send_confirmation', 'ORD-1', 'fp-1');  -- completed, with its result
SELECT verdict, attempt FROM idempotency.claim_operation('send_confirmation', 'ORD-2', 'fp-2');  -- in_progress
SELECT idempotency.complete_operation('send_confirmation', 'ORD-2', 1);  -- 0.1's claim completed by 0.2
SELECT verdict, attempt FROM idempotency.claim_operation('send_confirmation', 'ORD-2', 'fp-other');  -- fingerprint kept
\echo :LAST_ERROR_SQLSTATE
SELECT verdict, attempt FROM idempotency.claim_operation('send_confirmation', 'ORD-3');  -- resolved retry: runs
SELECT verdict, attempt FROM idempotency.claim_operation('charge', 'CH-1');  -- released: runs
SELECT verdict, attempt FROM idempotency.claim_operation('charge', 'CH-2');  -- stale under retry: taken over
SELECT idempotency.complete_operation('charge', 'CH-2', 1);  -- the dead worker's attempt is fenced off
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.extend_lease('charge', 'CH-2', 2) > now() AS extended;
SELECT verdict, attempt FROM idempotency.claim_operation('send_confirmation', 'ORD-9');  -- a new key
SELECT verdict, attempt FROM idempotency.claim_operation('digest', 'DG-1');  -- skipped stays skipped
SELECT verdict, attempt FROM idempotency.claim_operation('refund', 'RF-1');  -- stale under lookup: verify
SELECT idempotency.complete_operation('refund', 'RF-1', 1);  -- the dead worker's attempt is fenced off
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.complete_operation('refund', 'RF-1', 2, '{"found": true}');
RESET ROLE;
SET ROLE regress_idem_up_operator;
SELECT idempotency.purge_operations();  -- CH-3, past its retention
SELECT job_type, claimed, completed, released, skipped, stale FROM idempotency.job_type_stats ORDER BY 1;
RESET ROLE;

-- and 0.2's per-job-type roles apply to the upgraded job types
UPDATE idempotency.job_types SET worker_role = 'regress_idem_up_worker' WHERE job_type = 'charge';
SET ROLE regress_idem_up_other;
SELECT verdict FROM idempotency.claim_operation('charge', 'CH-1');
\echo :LAST_ERROR_SQLSTATE
SELECT verdict FROM idempotency.claim_operation('send_confirmation', 'ORD-1');
RESET ROLE;
SET ROLE regress_idem_up_worker;
SELECT idempotency.complete_operation('charge', 'CH-1', 2);
RESET ROLE;

SELECT job_type, operation_key, status, attempt, claimed_by, result FROM idempotency.operations ORDER BY 1, 2;

DROP TABLE before_operations, before_job_types, before_resolutions, before_objects, before_acl;
DROP EXTENSION idempotency;
DROP ROLE regress_idem_up_worker, regress_idem_up_other, regress_idem_up_operator;

-- an installation of 0.1 updated to 0.2 gets the paced purge too (0.2's
-- CALL idempotency.purge(); sql/purge_paced.sql tests it on a new install)
CREATE EXTENSION idempotency VERSION '0.1';
ALTER EXTENSION idempotency UPDATE TO '0.2';
CREATE FUNCTION pg_temp.age_record(k text, by interval) RETURNS void
LANGUAGE sql AS $$
    UPDATE idempotency.operations
    SET claimed_at = claimed_at - by, heartbeat_at = heartbeat_at - by,
        completed_at = completed_at - by
    WHERE operation_key = k
$$;
INSERT INTO idempotency.job_types (job_type, lease, stale_policy, retention) VALUES
    ('kept_an_hour', '1 minute', 'skip', '1 hour');
SELECT verdict FROM idempotency.claim_operation('kept_an_hour', 'old');
SELECT idempotency.complete_operation('kept_an_hour', 'old', 1);
SELECT pg_temp.age_record('old', '2 hours');
CALL idempotency.purge();
SELECT count(*) FROM idempotency.operations;
DROP EXTENSION idempotency;
