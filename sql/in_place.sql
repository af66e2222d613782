--
-- The calls in place (0.4): claim_operation_in_place, complete_operation_in_place,
-- release_operation_in_place and extend_lease_in_place are the worker
-- functions under names that idempotency.distribute() does not delegate to
-- Citus. On one node they are the same functions: the same C entry points,
-- arguments, defaults and attributes, and the same verdicts, fencing and
-- SQLSTATEs, step by step, as the delegated names give (a scenario run once
-- with each set of names, on keys of its own). use_in_place() is false here.
--
\set SHOW_CONTEXT never
CREATE EXTENSION idempotency;

-- the same entry point and attributes as the delegated function
SELECT d.proname AS delegated, p.proname AS in_place,
       (d.prosrc, d.probin, d.proargtypes, d.proallargtypes, d.proargmodes, d.proargnames,
        pg_get_expr(d.proargdefaults, 0), d.prorettype, d.proretset, d.provolatile,
        d.proisstrict, d.proparallel, d.prorows, d.prosecdef, d.proconfig, d.prolang)
       IS NOT DISTINCT FROM
       (p.prosrc, p.probin, p.proargtypes, p.proallargtypes, p.proargmodes, p.proargnames,
        pg_get_expr(p.proargdefaults, 0), p.prorettype, p.proretset, p.provolatile,
        p.proisstrict, p.proparallel, p.prorows, p.prosecdef, p.proconfig, p.prolang) AS same,
       p.prosrc
FROM unnest(idempotency.delegated_functions()) f(d_oid)
JOIN pg_proc d ON d.oid = f.d_oid
LEFT JOIN pg_proc p ON p.pronamespace = d.pronamespace AND p.proname = d.proname || '_in_place'
ORDER BY 1;

-- nothing granted to PUBLIC
SELECT p.oid::regprocedure, p.proacl IS NOT NULL AND NOT EXISTS (
           SELECT FROM aclexplode(p.proacl) a WHERE a.grantee = 0) AS not_public
FROM pg_proc p
WHERE p.pronamespace = 'idempotency'::regnamespace
  AND (p.proname LIKE '%\_in\_place' OR p.proname = 'use_in_place')
ORDER BY 1;

-- no Citus: the delegated names are the ones to use
SELECT idempotency.use_in_place();

CREATE ROLE regress_idem_ip_worker;
CREATE ROLE regress_idem_ip_other;
GRANT USAGE ON SCHEMA idempotency TO regress_idem_ip_worker;
GRANT EXECUTE ON FUNCTION
    idempotency.claim_operation(text, text, text, text, text, boolean),
    idempotency.complete_operation(text, text, integer, jsonb),
    idempotency.release_operation(text, text, integer),
    idempotency.extend_lease(text, text, integer),
    idempotency.claim_operation_in_place(text, text, text, text, text, boolean),
    idempotency.complete_operation_in_place(text, text, integer, jsonb),
    idempotency.release_operation_in_place(text, text, integer),
    idempotency.extend_lease_in_place(text, text, integer),
    idempotency.use_in_place()
TO regress_idem_ip_worker;

INSERT INTO idempotency.job_types (job_type, lease, stale_policy, max_attempts, worker_role) VALUES
    ('send', '1 minute', 'hold', NULL, NULL),
    ('charge', '1 minute', 'retry', 2, NULL),
    ('digest', '1 minute', 'skip', NULL, NULL),
    ('refund', '1 minute', 'lookup', NULL, NULL),
    ('payout', '1 minute', 'hold', NULL, 'regress_idem_ip_other');

-- One scenario, the function names' suffix ('' or '_in_place') and the
-- keys' prefix given: one row per step, the call's answer or its SQLSTATE.
-- A step that makes claims stale ages the prefix's records.
CREATE FUNCTION pg_temp.scenario(suffix text, prefix text)
RETURNS TABLE (step integer, call text, outcome text)
LANGUAGE plpgsql AS $$
DECLARE
    calls text[] := ARRAY[
        'claim_operation%s(''send'', ''%sA'', ''fp-1'', ''w1'')',
        'claim_operation%s(''send'', ''%sA'', ''fp-1'', ''w2'')',
        'claim_operation%s(''send'', ''%sA'', ''fp-2'', ''w2'')',
        'complete_operation%s(''send'', ''%sA'', 2)',
        'complete_operation%s(''send'', ''%sA'', 1, ''{"id": 1}'')',
        'complete_operation%s(''send'', ''%sA'', 1, ''{"id": 1}'')',
        'claim_operation%s(''send'', ''%sA'', ''fp-1'')',
        'release_operation%s(''send'', ''%sA'', 1)',
        'complete_operation%s(''send'', ''%sNONE'', 1)',
        'claim_operation%s(''charge'', ''%sB'', NULL, ''w1'')',
        'release_operation%s(''charge'', ''%sB'', 1)',
        'release_operation%s(''charge'', ''%sB'', 1)',
        'claim_operation%s(''charge'', ''%sB'', NULL, ''w1'')',
        'extend_lease%s(''charge'', ''%sB'', 2) > now() - interval ''1 second''',
        'extend_lease%s(''charge'', ''%sB'', 1)',
        'claim_operation%s(''send'', ''%sC'', NULL, ''w1'', delivery => ''d-1'')',
        'claim_operation%s(''send'', ''%sC'', NULL, ''w1'', delivery => ''d-1'')',
        'claim_operation%s(''send'', ''%sC'', NULL, ''w1'', delivery => ''d-2'', wait => false)',
        'claim_operation%s(''digest'', ''%sD'', NULL, ''w1'')',
        'claim_operation%s(''refund'', ''%sE'', NULL, ''w1'')',
        'claim_operation%s(''payout'', ''%sF'', NULL, ''w1'')',
        'claim_operation%s(''nope'', ''%sG'', NULL, ''w1'')',
        'claim_operation%s(NULL, ''%sG'')',
        'stale',
        'claim_operation%s(''send'', ''%sC'', NULL, ''w2'')',
        'claim_operation%s(''charge'', ''%sB'', NULL, ''w2'')',
        'claim_operation%s(''digest'', ''%sD'', NULL, ''w2'')',
        'claim_operation%s(''refund'', ''%sE'', NULL, ''w2'')',
        'complete_operation%s(''refund'', ''%sE'', 1)',
        'complete_operation%s(''refund'', ''%sE'', 2)',
        'claim_operation%s(''refund'', ''%sE'')'];
    i integer;
    r record;
BEGIN
    FOR i IN 1 .. array_length(calls, 1) LOOP
        step := i;
        IF calls[i] = 'stale' THEN
            call := 'the claims made stale';
            RESET ROLE;
            UPDATE idempotency.operations SET heartbeat_at = heartbeat_at - interval '2 minutes',
                claimed_at = claimed_at - interval '2 minutes'
            WHERE operation_key LIKE prefix || '%' AND status = 'claimed';
            SET ROLE regress_idem_ip_worker;
            outcome := 'done';
            RETURN NEXT;
            CONTINUE;
        END IF;
        call := format(calls[i], '', '');
        BEGIN
            IF call LIKE 'claim%' THEN
                EXECUTE format('SELECT verdict || '' '' || attempt || coalesce('' '' || result::text, '''') FROM idempotency.'
                               || calls[i], suffix, prefix) INTO outcome;
            ELSE
                EXECUTE format('SELECT coalesce((idempotency.' || calls[i] || ')::text, ''ok'')', suffix, prefix)
                INTO outcome;
            END IF;
        EXCEPTION WHEN OTHERS THEN
            outcome := 'error ' || SQLSTATE;
        END;
        RETURN NEXT;
    END LOOP;
END
$$;

SET ROLE regress_idem_ip_worker;
CREATE TEMP TABLE delegated AS SELECT * FROM pg_temp.scenario('', 'd-');
CREATE TEMP TABLE in_place AS SELECT * FROM pg_temp.scenario('_in_place', 'p-');
RESET ROLE;

-- what the calls in place answered, step by step
SELECT step, call, outcome FROM in_place ORDER BY step;

-- and every step as the delegated names answered it
SELECT step, d.call, d.outcome AS delegated, p.outcome AS in_place
FROM delegated d FULL JOIN in_place p USING (step)
WHERE d.outcome IS DISTINCT FROM p.outcome OR d.call IS DISTINCT FROM p.call;

-- the records each left, alike but for their keys' prefix
SELECT substr(operation_key, 3) AS key, job_type, status, attempt, claimed_by, fingerprint, result,
       count(*) AS records
FROM idempotency.operations
GROUP BY 1, 2, 3, 4, 5, 6, 7
ORDER BY 1;

-- inside a transaction block, and as a prepared statement past its fifth
-- execution (a generic plan), the same
BEGIN;
SET LOCAL ROLE regress_idem_ip_worker;
SELECT * FROM idempotency.claim_operation_in_place('send', 'p-TX', NULL, 'w1');
SELECT idempotency.complete_operation_in_place('send', 'p-TX', 1);
SELECT * FROM idempotency.claim_operation_in_place('send', 'p-TX');
COMMIT;
SET ROLE regress_idem_ip_worker;
PREPARE c(text) AS SELECT verdict, attempt FROM idempotency.claim_operation_in_place('send', $1, NULL, 'w1');
PREPARE d(text) AS SELECT idempotency.complete_operation_in_place('send', $1, 1);
EXECUTE c('p-P1'); EXECUTE c('p-P2'); EXECUTE c('p-P3'); EXECUTE c('p-P4'); EXECUTE c('p-P5');
EXECUTE c('p-P6'); EXECUTE c('p-P6');
EXECUTE d('p-P6'); EXECUTE d('p-P6');
EXECUTE c('p-P6');
DEALLOCATE c; DEALLOCATE d;

-- the caller's rights: use_in_place() still false here; a role without
-- EXECUTE is refused as for the delegated names
SELECT idempotency.use_in_place();
RESET ROLE;
SET ROLE regress_idem_ip_other;
SELECT * FROM idempotency.claim_operation_in_place('send', 'p-X');
RESET ROLE;

DROP TABLE delegated, in_place;
DROP EXTENSION idempotency;
DROP ROLE regress_idem_ip_worker, regress_idem_ip_other;
