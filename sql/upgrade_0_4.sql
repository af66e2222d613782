--
-- Upgrade to 0.4: a database on 0.3 with grants on the worker functions
-- runs ALTER EXTENSION idempotency UPDATE. The calls in place are new
-- functions; each takes over the EXECUTE grants of its delegated twin (and
-- use_in_place() those of claim_operation()), as the users' own grants:
-- pg_init_privs holds the owner's only, so pg_dump dumps them. Records and
-- the protocol go on.
--
\set SHOW_CONTEXT never
CREATE EXTENSION idempotency VERSION '0.3';

CREATE ROLE regress_idem_u4_worker;
CREATE ROLE regress_idem_u4_lead;
GRANT USAGE ON SCHEMA idempotency TO regress_idem_u4_worker, regress_idem_u4_lead;
GRANT EXECUTE ON FUNCTION
    idempotency.claim_operation(text, text, text, text, text, boolean),
    idempotency.complete_operation(text, text, integer, jsonb),
    idempotency.release_operation(text, text, integer)
TO regress_idem_u4_worker;
GRANT EXECUTE ON FUNCTION idempotency.claim_operation(text, text, text, text, text, boolean)
TO regress_idem_u4_lead WITH GRANT OPTION;

INSERT INTO idempotency.job_types (job_type) VALUES ('send');
SET ROLE regress_idem_u4_worker;
SELECT verdict, attempt FROM idempotency.claim_operation('send', 'S-1', NULL, 'w1');
RESET ROLE;

ALTER EXTENSION idempotency UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'idempotency';

-- the grants, carried over
SELECT p.oid::regprocedure AS function, a.grantee::regrole AS grantee, a.is_grantable
FROM pg_proc p, aclexplode(p.proacl) a
WHERE p.pronamespace = 'idempotency'::regnamespace
  AND (p.proname LIKE '%\_in\_place' OR p.proname = 'use_in_place')
  AND a.grantee <> p.proowner
ORDER BY 1, 2;

-- the extension's own (initial) privileges: the owner's only
SELECT i.objoid::regprocedure AS function, array_length(i.initprivs, 1) AS initial_grants
FROM pg_init_privs i JOIN pg_proc p ON p.oid = i.objoid AND i.classoid = 'pg_proc'::regclass
WHERE p.pronamespace = 'idempotency'::regnamespace
  AND (p.proname LIKE '%\_in\_place' OR p.proname = 'use_in_place')
ORDER BY 1;

-- the protocol goes on, through either name
SET ROLE regress_idem_u4_worker;
SELECT idempotency.complete_operation_in_place('send', 'S-1', 1, '{"id": 1}');
SELECT verdict, attempt, result FROM idempotency.claim_operation('send', 'S-1');
SELECT verdict, attempt FROM idempotency.claim_operation_in_place('send', 'S-2', NULL, 'w1');
SELECT idempotency.release_operation('send', 'S-2', 1);
SELECT idempotency.use_in_place();
SELECT idempotency.extend_lease_in_place('send', 'S-2', 1);   -- not granted before: not granted now
RESET ROLE;

DROP EXTENSION idempotency;
DROP ROLE regress_idem_u4_worker, regress_idem_u4_lead;
