--
-- Upgrade to 0.3: a database on 0.2, with grants and records in every
-- state, runs ALTER EXTENSION idempotency UPDATE. claim_operation() gains
-- delivery and wait and so is a new function: its owner and grants are
-- carried over, and they stay the users' grants (pg_dump dumps them).
-- Records, configuration and audit come through unchanged; the protocol
-- goes on; delivery tokens work on the records of 0.2.
--
\set SHOW_CONTEXT never
CREATE EXTENSION idempotency VERSION '0.2';

CREATE ROLE regress_idem_u3_worker;
CREATE ROLE regress_idem_u3_lead;
CREATE ROLE regress_idem_u3_nobody;
GRANT USAGE ON SCHEMA idempotency TO regress_idem_u3_worker, regress_idem_u3_lead, regress_idem_u3_nobody;
GRANT EXECUTE ON FUNCTION
    idempotency.claim_operation(text, text, text, text),
    idempotency.complete_operation(text, text, integer, jsonb),
    idempotency.release_operation(text, text, integer),
    idempotency.extend_lease(text, text, integer)
TO regress_idem_u3_worker;
GRANT EXECUTE ON FUNCTION idempotency.claim_operation(text, text, text, text)
TO regress_idem_u3_lead WITH GRANT OPTION;

INSERT INTO idempotency.job_types (job_type, lease, stale_policy, max_attempts, retention, worker_role) VALUES
    ('send', '1 minute', 'hold', NULL, NULL, NULL),
    ('charge', '1 minute', 'retry', 3, '30 days', 'regress_idem_u3_worker'),
    ('digest', '1 minute', 'skip', NULL, NULL, NULL),
    ('refund', '1 minute', 'lookup', NULL, NULL, NULL);

SET ROLE regress_idem_u3_worker;
SELECT verdict, attempt FROM idempotency.claim_operation('send', 'S-1', 'fp-1', 'w1');
SELECT idempotency.complete_operation('send', 'S-1', 1, '{"message_id": "m-1"}');
SELECT verdict, attempt FROM idempotency.claim_operation('send', 'S-2', NULL, 'w1');
SELECT verdict, attempt FROM idempotency.claim_operation('send', 'S-3', NULL, 'w1');
SELECT verdict, attempt FROM idempotency.claim_operation('charge', 'C-1', NULL, 'w1');
SELECT idempotency.release_operation('charge', 'C-1', 1);
SELECT verdict, attempt FROM idempotency.claim_operation('charge', 'C-2', NULL, 'w1');
SELECT verdict, attempt FROM idempotency.claim_operation('digest', 'D-1', NULL, 'w1');
SELECT verdict, attempt FROM idempotency.claim_operation('refund', 'R-1', NULL, 'w1');
RESET ROLE;
-- S-3, C-2, D-1 and R-1's workers died: stale
UPDATE idempotency.operations SET heartbeat_at = heartbeat_at - interval '2 minutes',
    claimed_at = claimed_at - interval '2 minutes'
WHERE operation_key IN ('S-3', 'C-2', 'D-1', 'R-1');
SELECT verdict, attempt FROM idempotency.claim_operation('digest', 'D-1', NULL, 'w2');
SELECT idempotency.resolve_operation('send', 'S-3', 'completed', 'seen in the provider log');

CREATE TABLE before_operations AS SELECT * FROM idempotency.operations;
CREATE TABLE before_job_types AS SELECT * FROM idempotency.job_types;
CREATE TABLE before_resolutions AS SELECT * FROM idempotency.resolutions;
CREATE TABLE before_acl AS
SELECT oid, proname, proacl::text AS acl FROM pg_proc
WHERE pronamespace = 'idempotency'::regnamespace AND proname <> 'claim_operation'
UNION ALL
SELECT oid, relname, relacl::text FROM pg_class WHERE relnamespace = 'idempotency'::regnamespace
UNION ALL
SELECT oid, nspname, nspacl::text FROM pg_namespace WHERE nspname = 'idempotency';

-- an object of the user's that depends on the old function stops the
-- update, which changes nothing
-- (terse: PostgreSQL 18 adds the extension script's lines to the context)
CREATE VIEW claim_view AS SELECT * FROM idempotency.claim_operation('send', 'V-1');
\set VERBOSITY terse
ALTER EXTENSION idempotency UPDATE;
\set VERBOSITY default
\echo :LAST_ERROR_SQLSTATE
SELECT extversion FROM pg_extension WHERE extname = 'idempotency';
SELECT pg_get_function_identity_arguments(oid) FROM pg_proc WHERE proname = 'claim_operation';
DROP VIEW claim_view;

ALTER EXTENSION idempotency UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'idempotency';
SELECT p.proname, p.prosrc, pg_get_function_identity_arguments(p.oid) AS arguments,
       p.proowner::regrole AS owner
FROM pg_proc p WHERE p.pronamespace = 'idempotency'::regnamespace
  AND p.prolang = (SELECT oid FROM pg_language WHERE lanname = 'c')
  AND p.proname = 'claim_operation';

-- the grants on claim_operation are carried over, grant option included ...
SELECT r.rolname, has_function_privilege(r.rolname,
           'idempotency.claim_operation(text, text, text, text, text, boolean)', 'EXECUTE') AS execute,
       has_function_privilege(r.rolname,
           'idempotency.claim_operation(text, text, text, text, text, boolean)', 'EXECUTE WITH GRANT OPTION') AS grant_option
FROM pg_roles r WHERE r.rolname LIKE 'regress_idem_u3_%' ORDER BY 1;
SELECT count(*) AS granted_to_public FROM pg_proc p, aclexplode(p.proacl) a
WHERE p.pronamespace = 'idempotency'::regnamespace AND a.grantee = 0;
-- ... and are not the extension's own: pg_init_privs has the owner's only,
-- as for the other functions, so pg_dump dumps the users' grants
SELECT p.proname, array_length(i.initprivs, 1) AS init_entries,
       (SELECT count(*) FROM aclexplode(i.initprivs) a WHERE a.grantee <> p.proowner) AS init_grants_to_others
FROM pg_init_privs i JOIN pg_proc p ON p.oid = i.objoid AND i.classoid = 'pg_proc'::regclass
WHERE p.proname IN ('claim_operation', 'complete_operation') ORDER BY 1;
-- every other grant is as it was
SELECT b.proname, b.acl AS before, a.acl AS after
FROM before_acl b
LEFT JOIN (SELECT oid, proacl::text AS acl FROM pg_proc
           UNION ALL SELECT oid, relacl::text FROM pg_class
           UNION ALL SELECT oid, nspacl::text FROM pg_namespace) a USING (oid)
WHERE a.acl IS DISTINCT FROM b.acl;
-- every object of the extension has a comment
SELECT pg_describe_object(classid, objid, objsubid) AS uncommented
FROM pg_depend WHERE refclassid = 'pg_extension'::regclass
  AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idempotency') AND deptype = 'e'
  AND obj_description(objid, classid::regclass::name) IS NULL
  AND classid <> 'pg_type'::regclass;
SELECT col_description('idempotency.operations'::regclass,
                       (SELECT attnum FROM pg_attribute WHERE attrelid = 'idempotency.operations'::regclass
                        AND attname = 'delivery')) IS NOT NULL AS delivery_commented;

-- records, configuration and audit are unchanged; no record has a delivery
SELECT 'lost' AS diff, * FROM (TABLE before_operations
    EXCEPT SELECT job_type, operation_key, status, attempt, claimed_at, heartbeat_at, completed_at,
                  claimed_by, fingerprint, result FROM idempotency.operations) d
UNION ALL
SELECT 'new or changed', * FROM (SELECT job_type, operation_key, status, attempt, claimed_at, heartbeat_at,
                                        completed_at, claimed_by, fingerprint, result FROM idempotency.operations
    EXCEPT TABLE before_operations) d;
SELECT count(*) AS with_delivery FROM idempotency.operations WHERE delivery IS NOT NULL;
SELECT 'lost' AS diff, * FROM (TABLE before_job_types EXCEPT TABLE idempotency.job_types) d
UNION ALL
SELECT 'new or changed', * FROM (TABLE idempotency.job_types EXCEPT TABLE before_job_types) d;
SELECT 'lost' AS diff, * FROM (TABLE before_resolutions EXCEPT TABLE idempotency.resolutions) d
UNION ALL
SELECT 'new or changed', * FROM (TABLE idempotency.resolutions EXCEPT TABLE before_resolutions) d;

-- the protocol goes on, through the grants carried over
SET ROLE regress_idem_u3_worker;
SELECT * FROM idempotency.claim_operation('send', 'S-1', 'fp-1');                  -- completed, with its result
SELECT verdict, attempt FROM idempotency.claim_operation('send', 'S-2', NULL, NULL, 'd-1');  -- 0.2's young claim: in_progress
SELECT idempotency.complete_operation('send', 'S-2', 1);                          -- 0.2's claim completed by 0.3
SELECT verdict, attempt FROM idempotency.claim_operation('send', 'S-3');          -- resolved completed
SELECT verdict, attempt FROM idempotency.claim_operation('charge', 'C-1', delivery => 'd-2');  -- released: runs
SELECT verdict, attempt FROM idempotency.claim_operation('charge', 'C-1', delivery => 'd-2');  -- its retry
SELECT verdict, attempt FROM idempotency.claim_operation('charge', 'C-2', delivery => 'd-3');  -- stale under retry
SELECT idempotency.complete_operation('charge', 'C-2', 1);                        -- the dead worker is fenced off
\echo :LAST_ERROR_SQLSTATE
SELECT verdict, attempt FROM idempotency.claim_operation('digest', 'D-1');        -- skipped stays skipped
SELECT verdict, attempt FROM idempotency.claim_operation('refund', 'R-1', delivery => 'd-4');  -- stale under lookup
SELECT verdict, attempt FROM idempotency.claim_operation('refund', 'R-1', delivery => 'd-4');  -- its retry
SELECT verdict, attempt FROM idempotency.claim_operation('send', 'S-9', wait => false);        -- a new key
RESET ROLE;
SET ROLE regress_idem_u3_lead;
SELECT verdict, attempt FROM idempotency.claim_operation('send', 'S-10');
SELECT verdict FROM idempotency.claim_operation('charge', 'C-1');                 -- not charge's worker_role
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
SET ROLE regress_idem_u3_nobody;
SELECT verdict FROM idempotency.claim_operation('send', 'S-11');
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
SELECT job_type, operation_key, status, attempt, claimed_by, delivery IS NOT NULL AS has_delivery, result
FROM idempotency.operations ORDER BY 1, 2;

DROP TABLE before_operations, before_job_types, before_resolutions, before_acl;
DROP EXTENSION idempotency;

-- 0.1 goes to 0.3 in one ALTER EXTENSION, through 0.2
CREATE EXTENSION idempotency VERSION '0.1';
ALTER EXTENSION idempotency UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'idempotency';
SELECT p.proname, p.prosrc FROM pg_proc p
WHERE p.pronamespace = 'idempotency'::regnamespace AND p.prolang = (SELECT oid FROM pg_language WHERE lanname = 'c')
ORDER BY 1;
DROP EXTENSION idempotency;

DROP ROLE regress_idem_u3_worker, regress_idem_u3_lead, regress_idem_u3_nobody;
