--
-- Upgrade to 0.5: a database on 0.4 with records and grants on the worker
-- functions runs ALTER EXTENSION idempotency UPDATE. edition() is new: it
-- answers ('c', the version), and it takes over the EXECUTE grants of
-- claim_operation() as the users' own grants (pg_init_privs holds the
-- owner's only). Records and the protocol go on. A fresh install answers
-- the same.
--
\set SHOW_CONTEXT never
CREATE EXTENSION idempotency VERSION '0.4';
SELECT to_regprocedure('idempotency.edition()') IS NULL AS no_edition_at_0_4;

CREATE ROLE regress_idem_u5_worker;
CREATE ROLE regress_idem_u5_lead;
CREATE ROLE regress_idem_u5_nobody;
GRANT USAGE ON SCHEMA idempotency TO regress_idem_u5_worker, regress_idem_u5_lead, regress_idem_u5_nobody;
GRANT EXECUTE ON FUNCTION
    idempotency.claim_operation(text, text, text, text, text, boolean),
    idempotency.complete_operation(text, text, integer, jsonb),
    idempotency.release_operation(text, text, integer)
TO regress_idem_u5_worker;
GRANT EXECUTE ON FUNCTION idempotency.claim_operation(text, text, text, text, text, boolean)
TO regress_idem_u5_lead WITH GRANT OPTION;

INSERT INTO idempotency.job_types (job_type) VALUES ('send');
SET ROLE regress_idem_u5_worker;
SELECT verdict, attempt FROM idempotency.claim_operation('send', 'S-1', NULL, 'w1');
SELECT verdict, attempt FROM idempotency.claim_operation('send', 'S-2', NULL, 'w1');
SELECT idempotency.complete_operation('send', 'S-2', 1, '{"id": 2}');
-- what a client asked before 0.5: there is no edition() (undefined_function)
SELECT * FROM idempotency.edition();
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
CREATE TABLE before_operations AS
SELECT job_type, operation_key, status, attempt, claimed_at, heartbeat_at, completed_at, claimed_by, result
FROM idempotency.operations;

ALTER EXTENSION idempotency UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'idempotency';
SELECT * FROM idempotency.edition();
SELECT e.version = x.extversion AS edition_is_extversion
FROM idempotency.edition() e, pg_extension x WHERE x.extname = 'idempotency';

-- the records, unchanged
SELECT count(*) AS changed_records FROM (
    (SELECT * FROM before_operations
     EXCEPT
     SELECT job_type, operation_key, status, attempt, claimed_at, heartbeat_at, completed_at, claimed_by, result
     FROM idempotency.operations)
    UNION ALL
    (SELECT job_type, operation_key, status, attempt, claimed_at, heartbeat_at, completed_at, claimed_by, result
     FROM idempotency.operations
     EXCEPT
     SELECT * FROM before_operations)) d;

-- the grants of claim_operation, carried over; nothing for PUBLIC
SELECT a.grantee::regrole AS grantee, a.is_grantable
FROM pg_proc p, aclexplode(p.proacl) a
WHERE p.oid = 'idempotency.edition()'::regprocedure AND a.grantee <> p.proowner
ORDER BY 1;
-- the extension's own (initial) privileges: the owner's only
SELECT array_length(i.initprivs, 1) AS initial_grants
FROM pg_init_privs i
WHERE i.objoid = 'idempotency.edition()'::regprocedure AND i.classoid = 'pg_proc'::regclass;

-- a worker asks, and the protocol goes on
SET ROLE regress_idem_u5_worker;
SELECT edition, version FROM idempotency.edition();
SELECT idempotency.complete_operation('send', 'S-1', 1, '{"id": 1}');
SELECT verdict, attempt, result FROM idempotency.claim_operation('send', 'S-1');
SELECT verdict, attempt, result FROM idempotency.claim_operation('send', 'S-2');
RESET ROLE;
-- a role without the grant cannot
SET ROLE regress_idem_u5_nobody;
SELECT * FROM idempotency.edition();
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;

DROP TABLE before_operations;
DROP EXTENSION idempotency;

-- a fresh install answers the same
CREATE EXTENSION idempotency;
SELECT e.edition, e.version, e.version = x.extversion AS edition_is_extversion
FROM idempotency.edition() e, pg_extension x WHERE x.extname = 'idempotency';
DROP EXTENSION idempotency;

DROP ROLE regress_idem_u5_worker, regress_idem_u5_lead, regress_idem_u5_nobody;
