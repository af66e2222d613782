/*-------------------------------------------------------------------------
 *
 * complete.c
 *	  What the owner of a claim reports: complete_operation(),
 *	  release_operation() and extend_lease().
 *
 * Each is one fenced UPDATE (the attempt is in its WHERE clause). Only when
 * it updates nothing is the record read, to tell the caller exactly why, or
 * to accept a repeated call as a no-op.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/memutils.h"

#include "store.h"

PG_FUNCTION_INFO_V1(complete_operation);
PG_FUNCTION_INFO_V1(release_operation);
PG_FUNCTION_INFO_V1(extend_lease);
PG_FUNCTION_INFO_V1(complete_operation_0_2);
PG_FUNCTION_INFO_V1(release_operation_0_2);
PG_FUNCTION_INFO_V1(extend_lease_0_2);

/*
 * What to do about a record in `status` that refuses the call (ID005): the
 * hint; and, for a released record, what the detail adds. Only statuses
 * the call does not accept reach here, and every call accepts claimed.
 */
static const char *
wrong_state_hint(OperationStatus status, const char **detail_extra)
{
	*detail_extra = "";
	switch (status)
	{
		case OPERATION_COMPLETED:
			return "The operation is done: stop, and acknowledge the message.";
		case OPERATION_RELEASED:
			*detail_extra = " This one was released under this attempt, by release_operation() or by a person's 'retry' resolution; its next claim runs it again with a new attempt.";
			return "Stop, and record nothing for this attempt. If its effect did happen after all, tell a person: the next delivery will do it again.";
		case OPERATION_SKIPPED:
			return "A skipped operation can still be completed or released under this attempt: finish the work, then call complete_operation() or release_operation().";
		case OPERATION_CLAIMED:
			break;
	}
	pg_unreachable();
}

/*
 * Raise a refusal that report_refusal() filled in: the single calls' error.
 */
static void
raise_refusal(const IdemRefusal *r)
{
	ereport(ERROR,
			(errcode(r->sqlstate),
			 errmsg("%s", r->message),
			 errdetail("%s", r->detail),
			 errhint("%s", r->hint)));
}

/*
 * The fenced update of sts->action matched nothing: read the record, let
 * the protocol decide (idem_decide_fenced()) and say why. Returns
 * REFUSAL_REPEAT when the call is a harmless repeat (the record is already
 * in the state this call leaves it in, under this attempt), REFUSAL_RETRY
 * when the record would take the update again (it changed under us: the
 * caller tries once more), and REFUSAL_REFUSED with *r filled in when the
 * record refuses the call: the attempt was superseded (ID003), the record
 * is in the wrong state (ID005) or has gone (ID004). The caller raises that
 * (the single calls) or reports it on the key's row (the batch calls).
 *
 * An attempt below the record's is superseded (ID003): a later claim gave
 * the operation a new attempt, after a takeover or after a release. An
 * attempt above it was never issued for this record (22023, raised here: a
 * bug in the caller, or an attempt of a record that was purged and claimed
 * anew). So are an unknown job type (ID001) and a caller who may not work
 * it (42501).
 */
static RefusalKind
explain_refusal(const IdemCall *call, FencedCall fc, const char *action,
				text *job_type, text *key, int32 attempt, IdemRefusal *r)
{
	OperationState state;
	FencedRecord rec;
	const char *detail_extra;

	idem_worker_lookup(call, job_type, key, &state);
	rec.found = state.found;
	rec.status = state.status;
	rec.attempt = state.attempt;
	switch (idem_decide_fenced(fc, &rec, attempt))
	{
		case FENCE_UPDATE:
			return REFUSAL_RETRY;
		case FENCE_REPEAT:
			return REFUSAL_REPEAT;
		case FENCE_NOT_FOUND:
			r->sqlstate = ERRCODE_IDEMPOTENCY_OPERATION_NOT_FOUND;
			r->message = psprintf("operation \"%s\" of job type \"%s\" has no record",
								  idem_text(key), idem_text(job_type));
			r->detail = "It was never claimed, or its record was purged after its job type's retention.";
			r->hint = "Call idempotency.claim_operation() first and use the attempt it returns.";
			return REFUSAL_REFUSED;
		case FENCE_SUPERSEDED:
			r->sqlstate = ERRCODE_IDEMPOTENCY_ATTEMPT_SUPERSEDED;
			r->message = psprintf("attempt %d of operation \"%s\" of job type \"%s\" was superseded",
								  attempt, idem_text(key), idem_text(job_type));
			r->detail = psprintf("A later claim started attempt %d, and the record is %s now: the operation was taken over after a lease ran out, or claimed again after it was released by its worker or by a person's 'retry' resolution.",
								 state.attempt, idem_status_name(state.status));
			r->hint = "Another worker owns this operation now: stop, and record nothing for this attempt.";
			return REFUSAL_REFUSED;
		case FENCE_NEVER_ISSUED:
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("attempt %d of operation \"%s\" of job type \"%s\" was never issued",
							attempt, idem_text(key), idem_text(job_type)),
					 errdetail("The record's current attempt is %d, and no claim of it returned a higher one. The attempt belongs to another operation, or to a record that was purged after its retention and claimed anew.",
							   state.attempt),
					 errhint("Pass the attempt that claim_operation() returned for this job type and operation key.")));
			break;
		case FENCE_WRONG_STATE:
			break;
	}

	r->hint = wrong_state_hint(state.status, &detail_extra);
	r->sqlstate = ERRCODE_IDEMPOTENCY_WRONG_STATE;
	r->message = psprintf("cannot %s operation \"%s\" of job type \"%s\": it is %s",
						  action, idem_text(key), idem_text(job_type),
						  idem_status_name(state.status));
	r->detail = psprintf("Only a %s operation can be given this call.%s",
						 idem_fenced_accepts_skipped(fc) ? "claimed or skipped" : "claimed",
						 detail_extra);
	return REFUSAL_REFUSED;
}

/* A fenced call: the protocol's name for it, its message and operation */
typedef struct FencedStatements
{
	FencedCall	call;			/* which call, for the protocol's decision */
	const char *action;			/* "cannot <action> operation ..." */
	StoreOp		op;
} FencedStatements;

static const FencedStatements complete_statements =
{FENCED_COMPLETE, "complete", OP_COMPLETE};
static const FencedStatements release_statements =
{FENCED_RELEASE, "release", OP_RELEASE};
static const FencedStatements extend_statements =
{FENCED_EXTEND, "extend the lease of", OP_EXTEND};

/*
 * Run the fenced UPDATE of `sts` (its parameters: OP_COMPLETE in
 * statements.c; the store's fenced_role says which variant checks the
 * caller's role, and how) until
 * it updates the record (returns REFUSAL_NONE; SPI_tuptable holds the
 * RETURNING row, if any), or until explain_refusal() says that the call
 * repeats one already done (REFUSAL_REPEAT) or that the record refuses it
 * (REFUSAL_REFUSED, *r filled in; 42501 raised for a caller who may not
 * work the job type). The role is compared by the statement, where it
 * runs.
 */
static RefusalKind
fenced_update(const IdemCall *call, const FencedStatements *sts,
			  text *job_type, text *key,
			  int32 attempt, Datum result, bool result_isnull,
			  IdemRefusal *r)
{
	Datum		caller;
	Datum		role;
	NameData	names[2];
	StoreVariant v;
	int			tries;

	v = call->store.backend->fenced_role(&call->store, call, job_type, &caller, &role, names);
	for (tries = 0; tries < IDEMPOTENCY_MAX_TRIES; tries++)
	{
		Datum		values[7];
		char		nulls[7] = "      ";
		RefusalKind kind;

		values[0] = PointerGetDatum(job_type);
		values[1] = PointerGetDatum(key);
		values[2] = Int32GetDatum(attempt);
		values[3] = TimestampTzGetDatum(GetCurrentTimestamp());
		values[4] = result;
		nulls[4] = result_isnull ? 'n' : ' ';
		values[5] = caller;
		values[6] = role;

		if (idem_execute(&call->store, sts->op, v, values, nulls, 0) == 1)
			return REFUSAL_NONE;
		kind = explain_refusal(call, sts->call, sts->action, job_type, key, attempt, r);
		if (kind != REFUSAL_RETRY)
			return kind;
	}
	idem_too_many_tries(sts->action, job_type, key);
}

/*
 * Move a refusal out of the SPI connection's memory, which idem_end()
 * frees, into `cxt`.
 */
static void
keep_refusal(IdemRefusal *r, MemoryContext cxt)
{
	r->message = MemoryContextStrdup(cxt, r->message);
	r->detail = MemoryContextStrdup(cxt, r->detail);
	r->hint = MemoryContextStrdup(cxt, r->hint);
}

/*
 * The fenced update of one key the fast path did not complete, in `store`;
 * false with *r filled in when the record refuses.
 */
static bool
complete_spi(const IdemCaps *caps, Store *store, text *job_type, text *key,
			 int32 attempt, Datum result, bool result_isnull, IdemRefusal *r)
{
	MemoryContext cxt = CurrentMemoryContext;
	IdemCall	call;
	RefusalKind kind;

	idem_begin_worker(&call, "complete_operation()", caps, store);
	kind = fenced_update(&call, &complete_statements,
						 job_type, key, attempt, result, result_isnull, r);
	if (kind == REFUSAL_REFUSED)
		keep_refusal(r, cxt);
	idem_end(&call);
	return kind != REFUSAL_REFUSED;
}

/*
 * Complete one key (the single call): the fast path, else the fenced
 * update. False with *r filled in when the record refuses (see
 * explain_refusal()). The call is for this key alone, so its store may be
 * the key's own (store.c); a batch's keys go idem_complete_batch_key()'s
 * way.
 */
bool
idem_complete_one(const IdemCaps *caps, text *job_type, text *key,
				  int32 attempt, Datum result, bool result_isnull, IdemRefusal *r)
{
	Store		store;

	/* the common case, below SPI; anything else the SPI way */
	idem_store_choose(key, &store);
	if (idem_fast_complete(store.rels, GetUserId(), caps, job_type, key, attempt,
						   result, result_isnull))
		return true;
	return complete_spi(caps, &store, job_type, key, attempt, result, result_isnull, r);
}

/*
 * complete_operations(): its keys, one after the other, each as
 * idem_complete_one() would do it, the fast path of every key sharing one
 * opening of the table, one scan of its primary key and one check of the
 * caller's right to work the job type (HeapBatch, heap.c).
 */
struct CompleteBatch
{
	IdemCaps	caps;
	HeapBatch	heap;
};

CompleteBatch *
idem_complete_batch_begin(const IdemCaps *caps)
{
	CompleteBatch *cb = palloc0(sizeof(CompleteBatch));
	Store		store;

	cb->caps = *caps;
	idem_store_choose(NULL, &store);
	idem_heap_batch_begin(&cb->heap, store.rels, true);
	return cb;
}

bool
idem_complete_batch_key(CompleteBatch *cb, text *job_type, text *key, int32 attempt,
						Datum result, bool result_isnull, IdemRefusal *r)
{
	Store		store;

	/*
	 * The store as a single call of a batch's key would choose it; the
	 * shared opening serves it only while it is the same table (an SPI
	 * statement of an earlier key may have invalidated the cache).
	 */
	idem_store_choose(NULL, &store);
	if (store.rels != NULL && store.rels == cb->heap.tr &&
		idem_fast_complete_in(&cb->heap, GetUserId(), &cb->caps, job_type, key, attempt,
							  result, result_isnull))
		return true;
	return complete_spi(&cb->caps, &store, job_type, key, attempt, result, result_isnull, r);
}

/*
 * On a store with batch statements (the routed store), complete (or
 * release) the keys of a batch group by group, one statement a group,
 * before they go one by one: keys[0..n) in the batch's order, done[i] set
 * for each key done here. A key the statement did not update (a repeat, a
 * record that refuses, one already done by this attempt) is left to the
 * single call's way, whose lookup says why. The caller's right is checked
 * once, as the fenced updates check it (fenced_role()). `results`: NULL
 * for a release. Does nothing on a store without them.
 */
void
idem_fenced_batch_many(const IdemCaps *caps, bool complete, text *job_type, int n,
					   text *const *keys, const int32 *attempts, const Datum *results,
					   const bool *result_nulls, bool *done)
{
	IdemCall	call;
	Datum		caller;
	Datum		role;
	NameData	names[2];
	StoreVariant v;
	int		   *perm;
	int		   *starts;
	int		   *pos;
	int			ngroups;
	FencedRows	rows;
	Store		store;

	idem_store_choose(NULL, &store);
	if (store.backend->fenced_many == NULL || n == 0)
		return;
	idem_begin_worker(&call, complete ? "complete_operations()" : "release_operations()",
					  caps, &store);
	v = call.store.backend->fenced_role(&call.store, &call, job_type, &caller, &role, names);
	perm = palloc(sizeof(int) * n);
	starts = palloc(sizeof(int) * (n + 1));
	pos = palloc(sizeof(int) * n);
	ngroups = idem_batch_groups(&call.store, n, keys, perm, starts);
	rows.job_type = job_type;
	rows.keys = palloc(sizeof(Datum) * n);
	rows.attempts = palloc(sizeof(Datum) * n);
	rows.results = complete ? palloc(sizeof(Datum) * n) : NULL;
	rows.result_nulls = complete ? palloc(sizeof(bool) * n) : NULL;
	rows.done = palloc(sizeof(bool) * n);
	for (int g = 0; g < ngroups; g++)
	{
		int			m = 0;

		/* the group's distinct keys: a repeat follows its first */
		for (int i = starts[g]; i < starts[g + 1]; i++)
		{
			int			k = perm[i];

			if (i > starts[g] && idem_same_text(keys[k], keys[perm[i - 1]]))
				continue;
			pos[m] = k;
			rows.keys[m] = PointerGetDatum(keys[k]);
			rows.attempts[m] = Int32GetDatum(attempts[k]);
			if (complete)
			{
				rows.results[m] = results[k];
				rows.result_nulls[m] = result_nulls[k];
			}
			rows.done[m] = false;
			m++;
		}
		rows.n = m;
		rows.now = GetCurrentTimestamp();
		CHECK_FOR_INTERRUPTS();
		call.store.backend->fenced_many(&call.store,
										complete ? OP_COMPLETE_MANY : OP_RELEASE_MANY,
										v, caller, role, &rows);

		/* done: the first occurrence of each key the statement updated */
		for (int i = 0; i < m; i++)
			done[pos[i]] = rows.done[i];
	}
	idem_end(&call);
}

void
idem_complete_batch_end(CompleteBatch *cb)
{
	idem_heap_batch_end(&cb->heap);
	pfree(cb);
}

/* Release one key; false with *r filled in when the record refuses */
bool
idem_release_one(const IdemCaps *caps, bool single, text *job_type, text *key,
				 int32 attempt, IdemRefusal *r)
{
	MemoryContext cxt = CurrentMemoryContext;
	IdemCall	call;
	RefusalKind kind;
	Store		store;

	idem_store_choose(single ? key : NULL, &store);
	idem_begin_worker(&call, "release_operation()", caps, &store);
	kind = fenced_update(&call, &release_statements,
						 job_type, key, attempt, (Datum) 0, true, r);
	if (kind == REFUSAL_REFUSED)
		keep_refusal(r, cxt);
	idem_end(&call);
	return kind != REFUSAL_REFUSED;
}

/*
 * complete_operation(job_type text, operation_key text, attempt integer,
 *					  result jsonb) RETURNS void
 *
 * claimed or skipped (with no takeover since) -> completed. Completing an
 * already completed record with the same attempt is a no-op; the result
 * stored first is kept.
 */
static Datum
complete_common(FunctionCallInfo fcinfo, int api_version)
{
	IdemCaps	caps = idem_caps(api_version);
	text	   *job_type = idem_arg_job_type(fcinfo, 0);
	text	   *key = idem_arg_key(fcinfo, 1);
	int32		attempt = idem_arg_attempt(fcinfo, 2);
	bool		result_isnull = PG_ARGISNULL(3);
	Datum		result = result_isnull ? (Datum) 0 : PG_GETARG_DATUM(3);
	IdemRefusal r;

	PreventCommandDuringRecovery("complete_operation()");
	PreventCommandIfReadOnly("complete_operation()");
	if (!idem_complete_one(&caps, job_type, key, attempt, result, result_isnull, &r))
		raise_refusal(&r);

	PG_RETURN_VOID();
}

/*
 * release_operation(job_type text, operation_key text, attempt integer)
 * RETURNS void
 *
 * claimed or skipped -> released: the effect did not happen, the next claim
 * runs with attempt + 1. Releasing twice is a no-op.
 */
static Datum
release_common(FunctionCallInfo fcinfo, int api_version)
{
	IdemCaps	caps = idem_caps(api_version);
	text	   *job_type = idem_arg_job_type(fcinfo, 0);
	text	   *key = idem_arg_key(fcinfo, 1);
	int32		attempt = idem_arg_attempt(fcinfo, 2);
	IdemRefusal r;

	PreventCommandDuringRecovery("release_operation()");
	PreventCommandIfReadOnly("release_operation()");
	if (!idem_release_one(&caps, true, job_type, key, attempt, &r))
		raise_refusal(&r);

	PG_RETURN_VOID();
}

/*
 * extend_lease(job_type text, operation_key text, attempt integer)
 * RETURNS timestamptz
 *
 * A heartbeat: the claim's lease restarts now. Returns the new expiry.
 * A stale claim that nobody took over yet can still be extended: its worker
 * is evidently alive.
 */
static Datum
extend_common(FunctionCallInfo fcinfo, int api_version)
{
	IdemCaps	caps = idem_caps(api_version);
	text	   *job_type = idem_arg_job_type(fcinfo, 0);
	text	   *key = idem_arg_key(fcinfo, 1);
	int32		attempt = idem_arg_attempt(fcinfo, 2);
	IdemCall	call;
	IdemRefusal r;
	OperationState state;
	TimestampTz expires_at;
	Store		store;

	idem_store_choose(key, &store);
	idem_begin_worker(&call, "extend_lease()", &caps, &store);
	/* there is no repeat of an extension: it either updates or is refused */
	if (fenced_update(&call, &extend_statements,
					  job_type, key, attempt, (Datum) 0, true, &r) != REFUSAL_NONE)
		raise_refusal(&r);
	/* the new heartbeat plus the lease, as this transaction now sees them */
	idem_lookup(&call, job_type, key, &state);
	expires_at = state.expires_at;
	idem_end(&call);

	PG_RETURN_TIMESTAMPTZ(expires_at);
}

/* The entry points of version 0.1's definitions ... */
Datum
complete_operation(PG_FUNCTION_ARGS)
{
	return complete_common(fcinfo, IDEM_API_0_1);
}

Datum
release_operation(PG_FUNCTION_ARGS)
{
	return release_common(fcinfo, IDEM_API_0_1);
}

Datum
extend_lease(PG_FUNCTION_ARGS)
{
	return extend_common(fcinfo, IDEM_API_0_1);
}

/* ... and of 0.2's: the job type's worker_role applies */
Datum
complete_operation_0_2(PG_FUNCTION_ARGS)
{
	return complete_common(fcinfo, IDEM_API_0_2);
}

Datum
release_operation_0_2(PG_FUNCTION_ARGS)
{
	return release_common(fcinfo, IDEM_API_0_2);
}

Datum
extend_lease_0_2(PG_FUNCTION_ARGS)
{
	return extend_common(fcinfo, IDEM_API_0_2);
}
