--
-- Per-job-type roles (0.2): a job type names the role that works it; the
-- worker functions refuse every other caller with 42501, before they read
-- or change anything of the job type's operations.
--
\set SHOW_CONTEXT never
CREATE EXTENSION idempotency;

CREATE ROLE regress_idem_tenant_a NOLOGIN;
CREATE ROLE regress_idem_tenant_b NOLOGIN;
-- a worker login of tenant a: inherits its privileges
CREATE ROLE regress_idem_worker_a IN ROLE regress_idem_tenant_a;
-- a member that does not inherit: may SET ROLE, has no privileges until then
CREATE ROLE regress_idem_noinherit NOINHERIT IN ROLE regress_idem_tenant_a;
CREATE ROLE regress_idem_operator;

-- the README's worker grants, to both tenants; operator grants
GRANT USAGE ON SCHEMA idempotency TO regress_idem_tenant_a, regress_idem_tenant_b,
    regress_idem_noinherit, regress_idem_operator;
GRANT EXECUTE ON FUNCTION
    idempotency.claim_operation(text, text, text, text, text, boolean),
    idempotency.complete_operation(text, text, integer, jsonb),
    idempotency.release_operation(text, text, integer),
    idempotency.extend_lease(text, text, integer)
TO regress_idem_tenant_a, regress_idem_tenant_b, regress_idem_noinherit;
GRANT EXECUTE ON FUNCTION
    idempotency.stale_claims(text),
    idempotency.resolve_operation(text, text, text, text)
TO regress_idem_operator;
GRANT SELECT ON idempotency.job_type_stats TO regress_idem_operator;

-- worker_role is a regrole: a role that does not exist is refused at once
INSERT INTO idempotency.job_types (job_type, lease, worker_role)
VALUES ('typo', '1 minute', 'regress_idem_no_such_role');
\echo :LAST_ERROR_SQLSTATE

INSERT INTO idempotency.job_types (job_type, lease, stale_policy, worker_role) VALUES
    ('a_invoice', '1 minute', 'hold', 'regress_idem_tenant_a'),
    ('b_invoice', '1 minute', 'hold', 'regress_idem_tenant_b'),
    ('shared', '1 minute', 'hold', NULL);
SELECT job_type, worker_role FROM idempotency.job_types ORDER BY 1;

-- tenant a works its own job type, through its worker login
SET ROLE regress_idem_worker_a;
SELECT * FROM idempotency.claim_operation('a_invoice', 'INV-1');
SELECT * FROM idempotency.claim_operation('a_invoice', 'INV-2');
SELECT * FROM idempotency.claim_operation('a_invoice', 'INV-3');
SELECT idempotency.extend_lease('a_invoice', 'INV-1', 1) > now() AS extended;
SELECT idempotency.complete_operation('a_invoice', 'INV-1', 1, '{"invoice": "A-1"}');
-- and the shared job type (no worker_role) is open to every caller with EXECUTE
SELECT * FROM idempotency.claim_operation('shared', 'S-1');
-- but not tenant b's job type
SELECT * FROM idempotency.claim_operation('b_invoice', 'INV-1');
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;

-- tenant b cannot claim, complete, release or extend tenant a's operations,
-- nor read them: not the result of a completed one, not whether a key exists
SET ROLE regress_idem_tenant_b;
SELECT * FROM idempotency.claim_operation('a_invoice', 'INV-1');
SELECT * FROM idempotency.claim_operation('a_invoice', 'INV-404');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.complete_operation('a_invoice', 'INV-2', 1, '{"invoice": "forged"}');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.release_operation('a_invoice', 'INV-2', 1);
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.extend_lease('a_invoice', 'INV-3', 1);
\echo :LAST_ERROR_SQLSTATE
-- a wrong attempt or a never-claimed key is refused the same way: nothing is told
SELECT idempotency.complete_operation('a_invoice', 'INV-2', 7);
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.complete_operation('a_invoice', 'INV-404', 1);
\echo :LAST_ERROR_SQLSTATE
-- its own job type works
SELECT * FROM idempotency.claim_operation('b_invoice', 'INV-1');
SELECT idempotency.complete_operation('b_invoice', 'INV-1', 1);
RESET ROLE;

-- nothing of tenant a's was changed by the refused calls
SELECT job_type, operation_key, status, attempt, result
FROM idempotency.operations ORDER BY 1, 2;

-- a member that does not inherit the role's privileges is refused ...
SET ROLE regress_idem_noinherit;
SELECT * FROM idempotency.claim_operation('a_invoice', 'INV-4');
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
-- ... until it acts as the role
SET ROLE regress_idem_noinherit;
SET ROLE regress_idem_tenant_a;
SELECT * FROM idempotency.claim_operation('a_invoice', 'INV-4');
RESET ROLE;

-- the check reads the configuration at every call: handing a job type to
-- another tenant applies at once, also to claims already made
UPDATE idempotency.job_types SET worker_role = 'regress_idem_tenant_b' WHERE job_type = 'a_invoice';
SET ROLE regress_idem_worker_a;
SELECT idempotency.complete_operation('a_invoice', 'INV-2', 1);
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
SET ROLE regress_idem_tenant_b;
SELECT idempotency.complete_operation('a_invoice', 'INV-2', 1);
RESET ROLE;
UPDATE idempotency.job_types SET worker_role = 'regress_idem_tenant_a' WHERE job_type = 'a_invoice';

-- a superuser may work every job type
SELECT * FROM idempotency.claim_operation('a_invoice', 'INV-1');

-- operators see every tenant's stale claims, whatever the worker_role
UPDATE idempotency.operations SET heartbeat_at = heartbeat_at - interval '1 hour'
WHERE status = 'claimed';
SET ROLE regress_idem_operator;
SELECT job_type, operation_key, attempt FROM idempotency.stale_claims() ORDER BY 1, 2;
SELECT job_type, claimed, completed, stale FROM idempotency.job_type_stats ORDER BY 1;
RESET ROLE;

-- a worker_role whose role was dropped leaves the job type to superusers
CREATE ROLE regress_idem_gone;
INSERT INTO idempotency.job_types (job_type, lease, worker_role) VALUES ('orphan', '1 minute', 'regress_idem_gone');
DROP ROLE regress_idem_gone;
SET ROLE regress_idem_tenant_a;
SELECT * FROM idempotency.claim_operation('orphan', 'O-1');
RESET ROLE;
SELECT count(*) AS orphan_records FROM idempotency.operations WHERE job_type = 'orphan';
SELECT verdict, attempt FROM idempotency.claim_operation('orphan', 'O-1');

DROP EXTENSION idempotency;
DROP ROLE regress_idem_worker_a, regress_idem_noinherit, regress_idem_operator,
    regress_idem_tenant_a, regress_idem_tenant_b;
