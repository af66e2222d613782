--
-- resolve_operation(): a person's decision on a held claim or a skipped
-- record, kept in idempotency.resolutions.
--
\set SHOW_CONTEXT never
CREATE EXTENSION idempotency;

CREATE FUNCTION pg_temp.age_claim(k text) RETURNS void
LANGUAGE sql AS $$
    UPDATE idempotency.operations o
    SET claimed_at = claimed_at - j.lease - interval '1 second',
        heartbeat_at = heartbeat_at - j.lease - interval '1 second'
    FROM idempotency.job_types j
    WHERE j.job_type = o.job_type AND o.operation_key = k
$$;

INSERT INTO idempotency.job_types (job_type, stale_policy) VALUES ('send_confirmation', 'hold'), ('newsletter', 'skip');

-- two held claims: the person finds one email in the provider's log, not the other
SELECT verdict FROM idempotency.claim_operation('send_confirmation', 'ORD-1005', NULL, 'w1');
SELECT verdict FROM idempotency.claim_operation('send_confirmation', 'ORD-1006', NULL, 'w1');
SELECT pg_temp.age_claim('ORD-1005');
SELECT pg_temp.age_claim('ORD-1006');
SELECT verdict, attempt FROM idempotency.claim_operation('send_confirmation', 'ORD-1005');
SELECT verdict, attempt FROM idempotency.claim_operation('send_confirmation', 'ORD-1006');

SELECT idempotency.resolve_operation('send_confirmation', 'ORD-1006', 'completed', 'found in the mail log');
SELECT idempotency.resolve_operation('send_confirmation', 'ORD-1005', 'retry', 'not in the mail log');
SELECT operation_key, status, attempt, completed_at IS NOT NULL AS finished
FROM idempotency.operations ORDER BY 1;
SELECT count(*) AS still_stale FROM idempotency.stale_claims();

-- the next delivery: completed for the one, run (attempt 2) for the other
SELECT verdict, attempt FROM idempotency.claim_operation('send_confirmation', 'ORD-1006');
SELECT verdict, attempt FROM idempotency.claim_operation('send_confirmation', 'ORD-1005');

-- the old worker of ORD-1006 comes back: its completion agrees and is a no-op
SELECT idempotency.complete_operation('send_confirmation', 'ORD-1006', 1);
-- the old worker of ORD-1005 comes back after the retry: fenced
SELECT idempotency.complete_operation('send_confirmation', 'ORD-1005', 1);
\echo :LAST_ERROR_SQLSTATE

-- a skipped record can be resolved too
SELECT verdict FROM idempotency.claim_operation('newsletter', 'N-1');
SELECT pg_temp.age_claim('N-1');
SELECT verdict FROM idempotency.claim_operation('newsletter', 'N-1');
SELECT idempotency.resolve_operation('newsletter', 'N-1', 'retry');
SELECT verdict, attempt FROM idempotency.claim_operation('newsletter', 'N-1');

-- ... also as completed: the effect did happen after all
SELECT verdict FROM idempotency.claim_operation('newsletter', 'N-2');
SELECT pg_temp.age_claim('N-2');
SELECT verdict FROM idempotency.claim_operation('newsletter', 'N-2');
SELECT idempotency.resolve_operation('newsletter', 'N-2', 'completed', 'sent after all');
SELECT status, attempt, completed_at IS NOT NULL AS finished
FROM idempotency.operations WHERE operation_key = 'N-2';
SELECT verdict, attempt FROM idempotency.claim_operation('newsletter', 'N-2');
-- its slow worker's own completion agrees: a no-op
SELECT idempotency.complete_operation('newsletter', 'N-2', 1);

-- after a 'retry' resolution, a slow worker that did do the work cannot
-- record it (ID005): the record is released and the next delivery runs
SELECT verdict FROM idempotency.claim_operation('send_confirmation', 'ORD-1007', NULL, 'slow');
SELECT pg_temp.age_claim('ORD-1007');
SELECT idempotency.resolve_operation('send_confirmation', 'ORD-1007', 'retry', 'not in the mail log yet');
SELECT idempotency.complete_operation('send_confirmation', 'ORD-1007', 1);
\echo :LAST_ERROR_SQLSTATE
SELECT verdict, attempt FROM idempotency.claim_operation('send_confirmation', 'ORD-1007');

-- not waiting for a decision: a young claim, a completed or released record (ID005)
SELECT idempotency.resolve_operation('newsletter', 'N-1', 'completed');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.resolve_operation('send_confirmation', 'ORD-1006', 'retry');
\echo :LAST_ERROR_SQLSTATE

-- the audit trail: who, when, what, why
SELECT job_type, operation_key, attempt, previous_status, resolution,
       resolved_by = current_user AS by_me, resolved_at <= clock_timestamp() AS dated, note
FROM idempotency.resolutions ORDER BY id;

DROP EXTENSION idempotency;
