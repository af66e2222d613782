/*-------------------------------------------------------------------------
 *
 * protocol.c
 *	  The claim protocol's decisions, as pure functions (see protocol.h).
 *
 * A claim, in the order its questions are asked:
 *   no record                 -> insert attempt 1: run
 *   another fingerprint       -> ID002, whatever the status
 *   completed                 -> completed, with the stored result
 *   skipped                   -> skipped
 *   released                  -> take over: run, attempt + 1
 *   claimed, inside its lease -> this very delivery's retry: the verdict it
 *                                got (run or verify); else in_progress
 *   claimed, stale            -> the job type's policy:
 *       skip                  -> the record becomes skipped
 *       retry, lookup         -> take over: run (retry) or verify (lookup),
 *                                attempt + 1, unless max_attempts are used up
 *       hold, or out of attempts -> held, and a NOTIFY for a person
 * Every write is conditional on the record being as read, so a concurrent
 * change makes it write nothing, and the caller decides again on what it
 * reads then.
 *
 * A fenced call (complete, release, extend_lease) names its attempt. Its
 * UPDATE applies to the record under that attempt in an accepted state;
 * otherwise the record says why not: no record (ID004), a later attempt
 * (ID003), an attempt never issued (22023), already done by this attempt
 * (a no-op), or the wrong state (ID005).
 *
 * This file includes no PostgreSQL header: it is compiled into the module
 * and, alone, into the unit test (test/unit).
 *
 *-------------------------------------------------------------------------
 */
#include "protocol.h"

/* An answer that writes nothing */
static ClaimAction
answer(ClaimStep step, ClaimVerdict verdict, int32_t attempt)
{
	ClaimAction a = {0};

	a.step = step;
	a.verdict = verdict;
	a.attempt = attempt;
	return a;
}

/*
 * A write. It must not wait for another transaction's claim of the key
 * when the call said wait => false, nor when it is a batch's key met late
 * (a transaction changing that record may wait for a later key of the
 * batch, which this one already holds).
 */
static ClaimAction
write_step(ClaimStep step, ClaimVerdict verdict, int32_t attempt, const ClaimRequest *req)
{
	ClaimAction a = answer(step, verdict, attempt);

	a.check_busy = !req->wait || req->late;
	return a;
}

/*
 * The claim's decision: see the table at the top of this file.
 */
ClaimAction
idem_decide_claim(const ClaimRecord *rec, const ClaimRequest *req)
{
	ClaimAction a;

	if (!rec->found)
		return write_step(CLAIM_INSERT, VERDICT_RUN, 1, req);

	/* never answer completed for other data under the same key */
	if (rec->fingerprint_differs)
		return answer(CLAIM_MISMATCH, VERDICT_IN_PROGRESS, rec->attempt);

	switch (rec->status)
	{
		case OPERATION_COMPLETED:
			a = answer(CLAIM_ANSWER, VERDICT_COMPLETED, rec->attempt);
			a.with_result = true;
			return a;
		case OPERATION_SKIPPED:
			return answer(CLAIM_ANSWER, VERDICT_SKIPPED, rec->attempt);
		case OPERATION_RELEASED:
			return write_step(CLAIM_TAKE_OVER, VERDICT_RUN, rec->attempt + 1, req);
		case OPERATION_CLAIMED:
			break;
	}

	/* a claim inside its lease */
	if (rec->now < rec->expires_at)
	{
		/*
		 * Made by this very delivery (a retry after its reply was lost):
		 * the verdict it got, nothing changed.
		 */
		if (req->has_delivery && rec->delivery_found)
		{
			if (rec->delivery == req->run_digest)
				return answer(CLAIM_ANSWER, VERDICT_RUN, rec->attempt);
			if (rec->delivery == req->verify_digest)
				return answer(CLAIM_ANSWER, VERDICT_VERIFY, rec->attempt);
		}
		return answer(CLAIM_ANSWER, VERDICT_IN_PROGRESS, rec->attempt);
	}

	/* stale: the job type's policy decides */
	switch (rec->policy)
	{
		case STALE_SKIP:
			return write_step(CLAIM_SKIP, VERDICT_SKIPPED, rec->attempt, req);
		case STALE_RETRY:
		case STALE_LOOKUP:
			if (rec->max_attempts == 0 || rec->attempt < rec->max_attempts)
			{
				bool		lookup = rec->policy == STALE_LOOKUP;

				a = write_step(CLAIM_TAKE_OVER, lookup ? VERDICT_VERIFY : VERDICT_RUN,
							   rec->attempt + 1, req);
				a.verify = lookup;
				return a;
			}
			/* out of attempts: a poison job waits for a person */
			break;
		case STALE_HOLD:
			break;
	}
	return answer(CLAIM_HOLD, VERDICT_HELD, rec->attempt);
}

/*
 * The states a fenced call's UPDATE accepts: a skipped record can still be
 * completed or released by the attempt that was skipped (its worker was
 * alive after all); only a claim has a lease to extend.
 */
bool
idem_fenced_accepts(FencedCall call, OperationStatus status)
{
	return status == OPERATION_CLAIMED ||
		(status == OPERATION_SKIPPED && idem_fenced_accepts_skipped(call));
}

bool
idem_fenced_accepts_skipped(FencedCall call)
{
	return call == FENCED_COMPLETE || call == FENCED_RELEASE;
}

/*
 * The state a fenced call leaves the record in, so that a repeat of it is
 * a no-op; false for extend_lease, which has none (it either updates or is
 * refused).
 */
static bool
done_state(FencedCall call, OperationStatus *status)
{
	switch (call)
	{
		case FENCED_COMPLETE:
			*status = OPERATION_COMPLETED;
			return true;
		case FENCED_RELEASE:
			*status = OPERATION_RELEASED;
			return true;
		case FENCED_EXTEND:
			break;
	}
	return false;
}

/*
 * A fenced call with `attempt` on the record as read. The caller runs the
 * UPDATE first and asks only when it updated nothing: then FENCE_UPDATE
 * means the record changed back under it, and it tries again.
 */
FencedOutcome
idem_decide_fenced(FencedCall call, const FencedRecord *rec, int32_t attempt)
{
	OperationStatus done;

	if (!rec->found)
		return FENCE_NOT_FOUND;
	if (attempt < rec->attempt)
		return FENCE_SUPERSEDED;
	if (attempt > rec->attempt)
		return FENCE_NEVER_ISSUED;
	if (done_state(call, &done) && rec->status == done)
		return FENCE_REPEAT;
	if (idem_fenced_accepts(call, rec->status))
		return FENCE_UPDATE;
	return FENCE_WRONG_STATE;
}

/*
 * resolve_operation() decides on a record that waits for a person: a claim
 * whose lease ran out (held, or stale under any policy), or a skipped one.
 */
ResolveOutcome
idem_decide_resolve(const ClaimRecord *rec)
{
	if (!rec->found)
		return RESOLVE_NOT_FOUND;
	if (rec->status == OPERATION_SKIPPED ||
		(rec->status == OPERATION_CLAIMED && rec->now >= rec->expires_at))
		return RESOLVE_UPDATE;
	return RESOLVE_NOT_WAITING;
}

/* The verdict as claim_operation() returns it */
const char *
idem_verdict_name(ClaimVerdict verdict)
{
	switch (verdict)
	{
		case VERDICT_RUN:
			return "run";
		case VERDICT_VERIFY:
			return "verify";
		case VERDICT_COMPLETED:
			return "completed";
		case VERDICT_IN_PROGRESS:
			return "in_progress";
		case VERDICT_HELD:
			return "held";
		case VERDICT_SKIPPED:
			return "skipped";
	}
	return "?";
}
