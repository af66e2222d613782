/*-------------------------------------------------------------------------
 *
 * claim.c
 *	  claim_operation(): the verdict for one delivery of one job.
 *
 * See idempotency.c for the protocol and its concurrency argument.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "commands/async.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/json.h"
#include "utils/tuplestore.h"

#include "compat.h"
#include "idempotency.h"

PG_FUNCTION_INFO_V1(claim_operation);
PG_FUNCTION_INFO_V1(claim_operation_0_2);

typedef struct Verdict
{
	const char *verdict;
	int32		attempt;
	Datum		result;
	bool		result_isnull;
} Verdict;

/*
 * Tell listeners on IDEMPOTENCY_HELD_CHANNEL that a stale claim is held for
 * a person. Delivered at commit, like every NOTIFY; sent at each claim that
 * gets the verdict held, so a listener may see one key more than once.
 */
static void
notify_held(text *job_type, text *key, int32 attempt)
{
	StringInfoData payload;

	initStringInfo(&payload);
	appendStringInfoString(&payload, "{\"job_type\": ");
	escape_json(&payload, idem_text(job_type));
	appendStringInfoString(&payload, ", \"operation_key\": ");
	escape_json(&payload, idem_text(key));
	appendStringInfo(&payload, ", \"attempt\": %d}", attempt);
	Async_Notify(IDEMPOTENCY_HELD_CHANNEL, payload.data);
	pfree(payload.data);
}

static void
set_verdict(Verdict *v, const char *verdict, int32 attempt)
{
	v->verdict = verdict;
	v->attempt = attempt;
	v->result = (Datum) 0;
	v->result_isnull = true;
}

/*
 * Take over a released record or a stale claim: attempt + 1, a new lease.
 * False if the record changed since it was read (the caller re-reads).
 */
static bool
take_over(text *job_type, text *key, const OperationState *state,
		  TimestampTz now, text *worker, text *fingerprint)
{
	Datum		values[8];
	char		nulls[8];

	memset(nulls, ' ', sizeof(nulls));
	values[0] = PointerGetDatum(job_type);
	values[1] = PointerGetDatum(key);
	values[2] = Int32GetDatum(state->attempt);
	values[3] = TimestampTzGetDatum(state->heartbeat_at);
	values[4] = CStringGetTextDatum(idem_status_name(state->status));
	values[5] = TimestampTzGetDatum(now);
	values[6] = PointerGetDatum(worker);
	values[7] = PointerGetDatum(fingerprint);
	if (worker == NULL)
		nulls[6] = 'n';
	if (fingerprint == NULL)
		nulls[7] = 'n';
	return idem_execute(ST_TAKEOVER, values, nulls, 0) == 1;
}

/*
 * Decide the verdict for one claim; the state machine of the README's
 * "Verdicts" table. Runs inside an SPI connection.
 */
static void
claim(const IdemCall *call, Verdict *v, text *job_type, text *key,
	  text *fingerprint, text *worker, bool absent)
{
	int			tries;

	for (tries = 0;; tries++)
	{
		TimestampTz now = GetCurrentTimestamp();
		OperationState state;

		if (tries >= IDEMPOTENCY_MAX_TRIES)
			idem_too_many_tries("claim", job_type, key);

		/*
		 * The probe saw no record: insert at once. The INSERT selects the
		 * job type (and checks the caller's role), so when it inserts
		 * nothing the lookup of the next round says why.
		 */
		if (tries == 0 && absent)
			state.found = false;
		else
			idem_worker_lookup(call, job_type, key, &state);

		if (!state.found)
		{
			Datum		values[6];
			char		nulls[6];

			memset(nulls, ' ', sizeof(nulls));
			values[0] = PointerGetDatum(job_type);
			values[1] = PointerGetDatum(key);
			values[2] = TimestampTzGetDatum(now);
			values[3] = PointerGetDatum(worker);
			values[4] = PointerGetDatum(fingerprint);
			if (worker == NULL)
				nulls[3] = 'n';
			if (fingerprint == NULL)
				nulls[4] = 'n';
			values[5] = ObjectIdGetDatum(call->caller);

			/*
			 * Waits for a concurrent uncommitted claim of the same key; does
			 * nothing if that one committed, and we read it again.
			 */
			if (idem_execute(call->worker_roles ? ST_INSERT_ROLE : ST_INSERT,
							 values, nulls, 0) == 1)
			{
				set_verdict(v, "run", 1);
				return;
			}
			continue;
		}

		if (fingerprint != NULL && state.fingerprint != NULL &&
			!idem_same_text(fingerprint, state.fingerprint))
			ereport(ERROR,
					(errcode(ERRCODE_IDEMPOTENCY_FINGERPRINT_MISMATCH),
					 errmsg("operation \"%s\" of job type \"%s\" was claimed with a different fingerprint",
							idem_text(key), idem_text(job_type)),
					 errdetail("The record has fingerprint \"%s\"; this claim gives \"%s\".",
							   idem_text(state.fingerprint), idem_text(fingerprint)),
					 errhint("The same operation key was used for different data: derive the key from everything that makes the job distinct.")));

		switch (state.status)
		{
			case OPERATION_COMPLETED:
				set_verdict(v, "completed", state.attempt);
				if (!state.result_isnull)
				{
					v->result = SPI_datumTransfer(state.result, false, -1);
					v->result_isnull = false;
				}
				return;

			case OPERATION_SKIPPED:
				set_verdict(v, "skipped", state.attempt);
				return;

			case OPERATION_RELEASED:
				if (take_over(job_type, key, &state, now, worker, fingerprint))
				{
					set_verdict(v, "run", state.attempt + 1);
					return;
				}
				continue;

			case OPERATION_CLAIMED:
				break;
		}

		/* a claim: still inside its lease? */
		if (now < state.expires_at)
		{
			set_verdict(v, "in_progress", state.attempt);
			return;
		}

		/* stale: the job type's policy decides */
		switch (state.policy)
		{
			case STALE_SKIP:
				{
					Datum		values[5];

					values[0] = PointerGetDatum(job_type);
					values[1] = PointerGetDatum(key);
					values[2] = Int32GetDatum(state.attempt);
					values[3] = TimestampTzGetDatum(state.heartbeat_at);
					values[4] = TimestampTzGetDatum(now);
					if (idem_execute(ST_SKIP, values, NULL, 0) == 1)
					{
						set_verdict(v, "skipped", state.attempt);
						return;
					}
					continue;
				}

			case STALE_RETRY:
			case STALE_LOOKUP:
				if (state.max_attempts == 0 || state.attempt < state.max_attempts)
				{
					if (take_over(job_type, key, &state, now, worker, fingerprint))
					{
						set_verdict(v, state.policy == STALE_RETRY ? "run" : "verify",
									state.attempt + 1);
						return;
					}
					continue;
				}
				/* out of attempts: a poison job waits for a person */
				/* FALLTHROUGH */

			case STALE_HOLD:
				notify_held(job_type, key, state.attempt);
				set_verdict(v, "held", state.attempt);
				return;
		}
	}
}

/*
 * claim_operation(job_type text, operation_key text, fingerprint text,
 *				   worker text) RETURNS TABLE (verdict text, attempt integer,
 *				   result jsonb)
 *
 * Exactly one row. Writes (and takes a transaction id) only when the
 * verdict is run, verify or a new skipped.
 */
static Datum
claim_operation_common(FunctionCallInfo fcinfo, bool worker_roles)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	text	   *job_type = idem_arg_job_type(fcinfo, 0);
	text	   *key = idem_arg_key(fcinfo, 1);
	text	   *fingerprint = PG_ARGISNULL(2) ? NULL : PG_GETARG_TEXT_PP(2);
	text	   *worker = PG_ARGISNULL(3) ? NULL : PG_GETARG_TEXT_PP(3);
	IdemCall	call;
	Verdict		v;
	Datum		values[3];
	bool		nulls[3] = {false, false, false};
	ProbeResult probe;

	InitMaterializedSRF(fcinfo, 0);

	/* a duplicate of a completed key is answered by the probe alone */
	PreventCommandDuringRecovery("claim_operation()");
	PreventCommandIfReadOnly("claim_operation()");
	set_verdict(&v, "completed", 0);
	probe = idem_probe(worker_roles, job_type, key, fingerprint,
					   &v.attempt, &v.result, &v.result_isnull);
	if (probe != PROBE_COMPLETED)
	{
		idem_begin_worker(&call, "claim_operation()", worker_roles);
		claim(&call, &v, job_type, key, fingerprint, worker, probe == PROBE_ABSENT);
		idem_end(&call);
	}

	values[0] = CStringGetTextDatum(v.verdict);
	values[1] = Int32GetDatum(v.attempt);
	values[2] = v.result;
	nulls[2] = v.result_isnull;
	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);

	return (Datum) 0;
}

/* version 0.1's definition */
Datum
claim_operation(PG_FUNCTION_ARGS)
{
	return claim_operation_common(fcinfo, false);
}

/* since 0.2: the job type's worker_role applies */
Datum
claim_operation_0_2(PG_FUNCTION_ARGS)
{
	return claim_operation_common(fcinfo, true);
}
