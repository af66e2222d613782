--
-- idempotency.job_types: the policy is table configuration, checked on the
-- way in.
--
\set SHOW_CONTEXT never
CREATE EXTENSION idempotency;

-- defaults: a 10-minute lease, hold, no attempt limit, kept forever
INSERT INTO idempotency.job_types (job_type) VALUES ('send_confirmation');
SELECT * FROM idempotency.job_types;

-- every policy and a one-second lease are legal
INSERT INTO idempotency.job_types (job_type, lease, stale_policy, max_attempts, retention)
VALUES ('a', '1 second', 'retry', 1, '30 days'),
       ('b', '2 hours', 'skip', NULL, NULL),
       ('c', '90 seconds', 'lookup', 5, '1 hour');
SELECT job_type, lease, stale_policy, max_attempts, retention FROM idempotency.job_types ORDER BY 1;

-- rejected: an unknown policy, a lease that is not positive, a lease or a
-- retention over 1000 years (its expiry would leave timestamptz's range), a
-- NULL lease, max_attempts below 1, a retention that is not positive, a bad name
INSERT INTO idempotency.job_types (job_type, stale_policy) VALUES ('x', 'never');
\echo :LAST_ERROR_SQLSTATE
INSERT INTO idempotency.job_types (job_type, lease) VALUES ('x', '0 seconds');
\echo :LAST_ERROR_SQLSTATE
INSERT INTO idempotency.job_types (job_type, lease) VALUES ('x', '-5 minutes');
\echo :LAST_ERROR_SQLSTATE
INSERT INTO idempotency.job_types (job_type, lease) VALUES ('x', '1001 years');
\echo :LAST_ERROR_SQLSTATE
INSERT INTO idempotency.job_types (job_type, retention) VALUES ('x', '1001 years');
\echo :LAST_ERROR_SQLSTATE
INSERT INTO idempotency.job_types (job_type, lease) VALUES ('x', NULL);
\echo :LAST_ERROR_SQLSTATE
INSERT INTO idempotency.job_types (job_type, max_attempts) VALUES ('x', 0);
\echo :LAST_ERROR_SQLSTATE
INSERT INTO idempotency.job_types (job_type, retention) VALUES ('x', '0 days');
\echo :LAST_ERROR_SQLSTATE
INSERT INTO idempotency.job_types (job_type) VALUES ('');
\echo :LAST_ERROR_SQLSTATE
INSERT INTO idempotency.job_types (job_type) VALUES (repeat('j', 129));
\echo :LAST_ERROR_SQLSTATE
INSERT INTO idempotency.job_types (job_type) VALUES ('send_confirmation');
\echo :LAST_ERROR_SQLSTATE
UPDATE idempotency.job_types SET stale_policy = 'sometimes' WHERE job_type = 'a';
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) FROM idempotency.job_types;

-- a job type with records cannot be removed or renamed (23503) ...
SELECT verdict FROM idempotency.claim_operation('a', 'K');
DELETE FROM idempotency.job_types WHERE job_type = 'a';
\echo :LAST_ERROR_SQLSTATE
UPDATE idempotency.job_types SET job_type = 'a2' WHERE job_type = 'a';
\echo :LAST_ERROR_SQLSTATE
TRUNCATE idempotency.job_types;
\echo :LAST_ERROR_SQLSTATE
-- ... but its settings can change, and one without records can go
UPDATE idempotency.job_types SET lease = '5 minutes', stale_policy = 'hold' WHERE job_type = 'a';
DELETE FROM idempotency.job_types WHERE job_type = 'b';
UPDATE idempotency.job_types SET job_type = 'c2' WHERE job_type = 'c';
SELECT job_type, lease, stale_policy FROM idempotency.job_types ORDER BY 1;
-- TRUNCATE too, once the records are gone
DELETE FROM idempotency.operations;
TRUNCATE idempotency.job_types;
SELECT count(*) AS job_types_after_truncate FROM idempotency.job_types;

DROP EXTENSION idempotency;
