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
#include "catalog/pg_type.h"
#include "funcapi.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "storage/proc.h"
#include "utils/guc.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/json.h"
#include "utils/tuplestore.h"

#include "compat.h"
#include "store.h"

PG_FUNCTION_INFO_V1(claim_operation);
PG_FUNCTION_INFO_V1(claim_operation_0_2);
PG_FUNCTION_INFO_V1(claim_operation_0_3);



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

/* ID002: the record was claimed with another fingerprint */
pg_noreturn static void
fingerprint_mismatch(const ClaimArgs *a, const OperationState *state)
{
	ereport(ERROR,
			(errcode(ERRCODE_IDEMPOTENCY_FINGERPRINT_MISMATCH),
			 errmsg("operation \"%s\" of job type \"%s\" was claimed with a different fingerprint",
					idem_text(a->key), idem_text(a->job_type)),
			 errdetail("The record has fingerprint \"%s\"; this claim gives \"%s\".",
					   idem_text(state->fingerprint), idem_text(a->fingerprint)),
			 errhint("The same operation key was used for different data: derive the key from everything that makes the job distinct.")));
}

/*
 * What one claim asks, for the protocol's decision (protocol.h): its
 * delivery token's digests, made once per call, and whether it may wait.
 */
static void
claim_request(const ClaimArgs *a, bool late, ClaimRequest *req)
{
	memset(req, 0, sizeof(*req));
	req->has_delivery = a->delivery != NULL;
	if (req->has_delivery)
	{
		req->run_digest = idem_delivery_digest(a->delivery, false);
		req->verify_digest = idem_delivery_digest(a->delivery, true);
	}
	req->wait = a->wait;
	req->late = late;
}

/* The record as the protocol's decision sees it, at `now` */
static void
claim_record(const ClaimArgs *a, const OperationState *state, TimestampTz now,
			 ClaimRecord *rec)
{
	memset(rec, 0, sizeof(*rec));
	rec->found = state->found;
	if (!state->found)
		return;
	rec->status = state->status;
	rec->attempt = state->attempt;
	rec->now = now;
	rec->expires_at = state->expires_at;
	rec->fingerprint_differs = a->fingerprint != NULL && state->fingerprint != NULL &&
		!idem_same_text(a->fingerprint, state->fingerprint);
	rec->delivery_found = state->delivery_found;
	rec->delivery = state->delivery;
	rec->policy = state->policy;
	rec->max_attempts = state->max_attempts;
}

/*
 * Before a write that must not wait (act->check_busy: wait => false, or a
 * batch's key met late): is another transaction's uncommitted claim of the
 * key (an insert, a takeover or any change of the record) in the way? Then
 * the verdict is in_progress at once, where the write would wait for that
 * transaction to end.
 */
static bool
busy(const IdemCall *call, const ClaimArgs *a, const ClaimAction *act, Verdict *v)
{
	int32		attempt = 1;

	if (!act->check_busy ||
		!idem_key_busy(call->store.rels, a->job_type, a->key, &attempt))
		return false;
	set_verdict(v, "in_progress", attempt);
	return true;
}

/*
 * Insert attempt 1. The INSERT selects the job type (and checks the
 * caller's role); it waits for a concurrent uncommitted claim of the same
 * key and does nothing if that one committed. False when it inserted
 * nothing: the caller reads the record again, and that lookup says why.
 */
static bool
insert(const IdemCall *call, const ClaimArgs *a, const ClaimRequest *req, TimestampTz now)
{
	Datum		values[7];
	char		nulls[7];

	memset(nulls, ' ', sizeof(nulls));
	values[0] = PointerGetDatum(a->job_type);
	values[1] = PointerGetDatum(a->key);
	values[2] = TimestampTzGetDatum(now);
	values[3] = PointerGetDatum(a->worker);
	values[4] = PointerGetDatum(a->fingerprint);
	if (a->worker == NULL)
		nulls[3] = 'n';
	if (a->fingerprint == NULL)
		nulls[4] = 'n';
	values[5] = ObjectIdGetDatum(call->caller);
	values[6] = req->has_delivery ? Int64GetDatum(req->run_digest) : (Datum) 0;
	if (!req->has_delivery)
		nulls[6] = 'n';
	return idem_execute(&call->store, OP_INSERT, call->variant, values, nulls, 0) == 1;
}

/*
 * Take over a released record or a stale claim: attempt + 1, a new lease;
 * with deliveries, the digest of the delivery and of the verdict it gets.
 * False if the record changed since it was read.
 */
static bool
take_over(const IdemCall *call, const ClaimArgs *a, const ClaimRequest *req,
		  const OperationState *state, TimestampTz now, bool verify)
{
	Datum		values[9];
	char		nulls[9];

	memset(nulls, ' ', sizeof(nulls));
	values[0] = PointerGetDatum(a->job_type);
	values[1] = PointerGetDatum(a->key);
	values[2] = Int32GetDatum(state->attempt);
	values[3] = TimestampTzGetDatum(state->heartbeat_at);
	values[4] = CStringGetTextDatum(idem_status_name(state->status));
	values[5] = TimestampTzGetDatum(now);
	values[6] = PointerGetDatum(a->worker);
	values[7] = PointerGetDatum(a->fingerprint);
	values[8] = req->has_delivery ?
		Int64GetDatum(verify ? req->verify_digest : req->run_digest) : (Datum) 0;
	if (a->worker == NULL)
		nulls[6] = 'n';
	if (a->fingerprint == NULL)
		nulls[7] = 'n';
	if (!req->has_delivery)
		nulls[8] = 'n';
	return idem_execute(&call->store, OP_TAKE_OVER, call->variant, values, nulls, 0) == 1;
}

/* Skip a stale claim as read; false if the record changed since */
static bool
skip(const IdemCall *call, const ClaimArgs *a, const OperationState *state, TimestampTz now)
{
	Datum		values[5];

	values[0] = PointerGetDatum(a->job_type);
	values[1] = PointerGetDatum(a->key);
	values[2] = Int32GetDatum(state->attempt);
	values[3] = TimestampTzGetDatum(state->heartbeat_at);
	values[4] = TimestampTzGetDatum(now);
	return idem_execute(&call->store, OP_SKIP, VARIANT_BASE, values, NULL, 0) == 1;
}

/*
 * Apply the protocol's decision about one claim: the one place where a
 * claim answers, writes or refuses. True when *v holds the verdict; false
 * when a write found the record changed since it was read (the caller
 * reads it again and decides again).
 */
static bool
apply_claim(const IdemCall *call, const ClaimArgs *a, const ClaimRequest *req,
			const OperationState *state, const ClaimAction *act, TimestampTz now,
			Verdict *v)
{
	bool		wrote = false;

	if (busy(call, a, act, v))
		return true;
	switch (act->step)
	{
		case CLAIM_MISMATCH:
			fingerprint_mismatch(a, state);
		case CLAIM_HOLD:
			notify_held(a->job_type, a->key, act->attempt);
			/* FALLTHROUGH */
		case CLAIM_ANSWER:
			set_verdict(v, idem_verdict_name(act->verdict), act->attempt);
			if (act->with_result && !state->result_isnull)
			{
				v->result = SPI_datumTransfer(state->result, false, -1);
				v->result_isnull = false;
			}
			return true;
		case CLAIM_INSERT:
			wrote = insert(call, a, req, now);
			break;
		case CLAIM_TAKE_OVER:
			wrote = take_over(call, a, req, state, now, act->verify);
			break;
		case CLAIM_SKIP:
			wrote = skip(call, a, state, now);
			break;
	}
	if (wrote)
		set_verdict(v, idem_verdict_name(act->verdict), act->attempt);
	return wrote;
}

/* The record as a probe that found none gives it */
static const OperationState no_record;

/*
 * The verdict for one claim: read the record, let the protocol decide
 * (idem_decide_claim(), the README's "Verdicts" table), apply; again while
 * a write finds the record changed under it. Runs inside an SPI
 * connection. `first`: the record as read already (a probe that saw none:
 * no_record; a batch's lookup), or NULL; `late`: see flush_inserts().
 */
static void
claim(const IdemCall *call, Verdict *v, const ClaimArgs *a, const OperationState *first,
	  bool late)
{
	ClaimRequest req;
	bool		done = false;
	int			tries;

	claim_request(a, late, &req);
	for (tries = 0; !done; tries++)
	{
		TimestampTz now = GetCurrentTimestamp();
		OperationState state;
		ClaimRecord rec;
		ClaimAction act;

		if (tries >= IDEMPOTENCY_MAX_TRIES)
			idem_too_many_tries("claim", a->job_type, a->key);

		/*
		 * The record as read already: decide on it at once (a probe saw no
		 * record: insert). When the write finds it changed, the lookup of
		 * the next round reads it again.
		 */
		if (tries == 0 && first != NULL)
			state = *first;
		else
			idem_worker_lookup(call, a->job_type, a->key, &state);

		claim_record(a, &state, now, &rec);
		act = idem_decide_claim(&rec, &req);
		done = apply_claim(call, a, &req, &state, &act, now, v);
	}
}

/*
 * claim_operation(job_type text, operation_key text, fingerprint text,
 *				   worker text [, delivery text, wait boolean])
 *				   RETURNS TABLE (verdict text, attempt integer, result jsonb)
 *
 * Exactly one row. Writes (and takes a transaction id) only when the
 * verdict is run, verify or a new skipped. `api_version`: that of the
 * definition that called (see IdemCaps); only a definition with deliveries
 * has the delivery and wait arguments.
 *
 * wait => false: never waits for another transaction's claim of the key.
 * Another transaction's uncommitted claim of the key answers in_progress
 * (busy()). The write after that check runs with lock_timeout at
 * NOWAIT_LOCK_TIMEOUT_MS, restored when it returns or fails: the short
 * waits every insert may meet (another backend extending the table or an
 * index) are waited out, and a lock held longer (a DDL on the tables,
 * another transaction's claim that appeared in the microseconds between
 * the check and the write and is not committed within the bound) raises
 * 55P03. Where the store's statements run on other nodes (Citus), the
 * store carries the bound there (idem_carry_lock_timeout()); it has no
 * check before the write, so another transaction's claim raises 55P03
 * after the bound.
 */
/*
 * The bound of a wait => false call's write. Until 0.4 it was 1 ms, and a
 * claim of a new key raised 55P03 whenever another backend was extending
 * the table at that moment: 2 to 7 of 8 clients claiming new keys at once
 * in an empty table (test/t/001_crash_and_load.pl), and more under load. Those
 * waits last a millisecond or two, tens under load; the bound is far above
 * them and still ends a wait for a DDL or a stuck transaction.
 */
#define NOWAIT_LOCK_TIMEOUT_MS 1000

/*
 * With wait => false, start the call's lock_timeout (see above; a shorter
 * one of the caller's stays); returns the GUC nest level for
 * idem_nowait_end(), or -1 if nothing was set. On error, transaction or
 * subtransaction abort restores it.
 */
int
idem_nowait_begin(bool wait)
{
	int			level;

	if (wait || (LockTimeout > 0 && LockTimeout <= NOWAIT_LOCK_TIMEOUT_MS))
		return -1;
	level = NewGUCNestLevel();
	(void) set_config_option("lock_timeout", CppAsString2(NOWAIT_LOCK_TIMEOUT_MS),
							 PGC_USERSET, PGC_S_SESSION,
							 GUC_ACTION_SAVE, true, 0, false);
	return level;
}

void
idem_nowait_end(int level)
{
	if (level >= 0)
		AtEOXact_GUC(true, level);
}

/*
 * The verdict for one key: the probe, and the SPI way if it does not
 * decide. v->result, if any, is allocated in the caller's memory context.
 */
void
idem_claim_one(const ClaimArgs *a, const IdemCaps *caps, Verdict *v)
{
	IdemCall	call;
	ProbeResult probe;
	Store		store;

	/* a duplicate of a completed key is answered by the probe alone */
	set_verdict(v, "completed", 0);
	idem_store_choose(a->key, &store);
	probe = idem_probe(store.rels, GetUserId(), caps, a->job_type, a->key,
					   a->fingerprint, &v->attempt, &v->result, &v->result_isnull);
	if (probe != PROBE_COMPLETED)
	{
		idem_begin_worker(&call, "claim_operation()", caps, &store);
		idem_carry_lock_timeout(&call, a->wait, true);
		claim(&call, v, a, probe == PROBE_ABSENT ? &no_record : NULL, false);
		idem_carry_lock_timeout(&call, a->wait, false);
		idem_end(&call);
	}
}

/*
 * Attempt 1 of many keys with one INSERT over arrays (OP_INSERT_BATCH),
 * which also checks the job type and the caller's role; inserted[i] for
 * each key it inserted (RETURNING lists them).
 */
static void
insert_rows(const IdemCall *call, const InsertRows *rows, bool *inserted)
{
	Datum		values[7];
	char		nulls[7];
	int			dims[1] = {rows->n};
	int			lbs[1] = {1};

	memset(nulls, ' ', sizeof(nulls));
	values[0] = PointerGetDatum(rows->job_type);
	values[1] = PointerGetDatum(construct_md_array(rows->keys, NULL, 1, dims, lbs,
												   TEXTOID, -1, false, TYPALIGN_INT));
	values[2] = TimestampTzGetDatum(rows->now);
	values[3] = PointerGetDatum(rows->worker);
	if (rows->worker == NULL)
		nulls[3] = 'n';
	values[4] = PointerGetDatum(construct_md_array(rows->fingerprints, rows->fingerprint_nulls,
												   1, dims, lbs, TEXTOID, -1, false,
												   TYPALIGN_INT));
	values[5] = ObjectIdGetDatum(rows->caller);
	values[6] = PointerGetDatum(construct_md_array(rows->digests, rows->digest_nulls, 1, dims,
												   lbs, INT8OID, 8, FLOAT8PASSBYVAL,
												   TYPALIGN_DOUBLE));
	(void) idem_execute(&call->store, OP_INSERT_BATCH, call->variant, values, nulls, 0);
	idem_mark_returned(rows->n, rows->keys, inserted);
}

/*
 * Insert the pending keys of a batch (positions into a[] and v[], in the
 * batch's order), whose probes saw no record, with one INSERT. The keys it
 * inserted get run, attempt 1. A key it did not insert was claimed by
 * another transaction that committed after its probe; it goes the single
 * call's way, after keys later in the order were inserted, so any write it
 * then needs (a takeover, a skip) must not wait for a lock: a transaction
 * that changes that record might wait for one of those later keys. So the
 * dirty check of wait => false applies to it whatever `wait` says: such a
 * record is in_progress.
 */
static void
flush_inserts(const IdemCall *call, const ClaimArgs *a, Verdict **v,
			  int *pending, int *npending)
{
	int			n = 0;
	int			i;
	bool	   *was_inserted;
	InsertRows	rows;

	if (*npending == 0)
		return;

	/*
	 * Each key's decision on no record: an insert; with wait => false, a
	 * key another transaction is inserting is in_progress.
	 */
	for (i = 0; i < *npending; i++)
	{
		int			p = pending[i];
		ClaimRecord absent = {0};
		ClaimRequest req;
		ClaimAction act;

		claim_request(&a[p], false, &req);
		act = idem_decide_claim(&absent, &req);
		Assert(act.step == CLAIM_INSERT);
		if (!busy(call, &a[p], &act, v[p]))
			pending[n++] = p;
	}
	*npending = 0;
	if (n == 0)
		return;

	rows.n = n;
	rows.job_type = a[pending[0]].job_type;
	rows.now = GetCurrentTimestamp();
	rows.worker = a[pending[0]].worker;
	rows.caller = call->caller;
	rows.keys = palloc(sizeof(Datum) * n);
	rows.fingerprints = palloc(sizeof(Datum) * n);
	rows.fingerprint_nulls = palloc(sizeof(bool) * n);
	rows.digests = palloc(sizeof(Datum) * n);
	rows.digest_nulls = palloc(sizeof(bool) * n);
	for (i = 0; i < n; i++)
	{
		const ClaimArgs *k = &a[pending[i]];

		rows.keys[i] = PointerGetDatum(k->key);
		rows.fingerprint_nulls[i] = k->fingerprint == NULL;
		rows.fingerprints[i] = rows.fingerprint_nulls[i] ? (Datum) 0 :
			PointerGetDatum(k->fingerprint);
		rows.digest_nulls[i] = k->delivery == NULL;
		rows.digests[i] = rows.digest_nulls[i] ? (Datum) 0 :
			Int64GetDatum(idem_delivery_digest(k->delivery, false));
	}

	/* waits, key by key in this order, for uncommitted claims of the keys */
	was_inserted = palloc0(sizeof(bool) * n);
	if (call->store.backend->insert_many != NULL)
		call->store.backend->insert_many(&call->store, &rows, was_inserted);
	else
		insert_rows(call, &rows, was_inserted);
	for (i = 0; i < n; i++)
	{
		int			p = pending[i];

		if (was_inserted[i])
			set_verdict(v[p], "run", 1);
		else
			pending[(*npending)++] = p;
	}

	/* not inserted: claimed meanwhile by a transaction that committed */
	n = *npending;
	*npending = 0;
	for (i = 0; i < n; i++)
		claim(call, v[pending[i]], &a[pending[i]], NULL, true);
}

/*
 * claim_operations() on a store with batch statements (the routed store):
 * the keys group by group (idem_batch_groups()), each group's records read
 * with one statement; a key without a record waits in the pending run,
 * inserted with one statement at the end of the group or before the
 * group's next write; every other key goes the single call's way from the
 * record as read. A repeated key is read again, after what its first
 * occurrence did.
 *
 * Where no dirty check is possible (the routed store has no heap path), a
 * key the group's insert found claimed meanwhile goes the single call's
 * way without it (flush_inserts()): it answers in_progress or completed
 * without writing, unless that claim was also released or expired in the
 * microseconds since; then its takeover may wait, and if the transaction it
 * waits for waits for this batch, PostgreSQL's deadlock detection ends one
 * of the two with 40P01.
 */
static void
claim_groups(const IdemCall *call, int n, const ClaimArgs *a, const bool *repeat,
			 Verdict **v)
{
	text	  **keys = palloc(sizeof(text *) * n);
	int		   *perm = palloc(sizeof(int) * n);
	int		   *starts = palloc(sizeof(int) * (n + 1));
	int		   *pending = palloc(sizeof(int) * n);
	text	  **group_keys = palloc(sizeof(text *) * n);
	OperationState *states = palloc(sizeof(OperationState) * n);
	BatchJobType jt = {0};
	int			npending = 0;
	int			ngroups;
	int			g;
	int			i;

	for (i = 0; i < n; i++)
		keys[i] = a[i].key;
	ngroups = idem_batch_groups(&call->store, n, keys, perm, starts);
	for (g = 0; g < ngroups; g++)
	{
		int			m = 0;
		int			j = 0;

		/* the group's keys but the repeats, read with one statement */
		for (i = starts[g]; i < starts[g + 1]; i++)
			if (!repeat[perm[i]])
				group_keys[m++] = a[perm[i]].key;
		idem_worker_lookup_many(call, a[0].job_type, m, group_keys, states, &jt);

		for (i = starts[g]; i < starts[g + 1]; i++)
		{
			int			k = perm[i];

			CHECK_FOR_INTERRUPTS();
			if (!repeat[k])
			{
				Assert(group_keys[j] == a[k].key);
				if (!states[j].found)
				{
					pending[npending++] = k;
					j++;
					continue;
				}
				flush_inserts(call, a, v, pending, &npending);
				claim(call, v[k], &a[k], &states[j++], false);
				continue;
			}
			flush_inserts(call, a, v, pending, &npending);
			claim(call, v[k], &a[k], NULL, false);
		}
		flush_inserts(call, a, v, pending, &npending);
	}
}

/*
 * claim_operations(): the verdicts of n keys, a[] in the batch's order (by
 * the keys' bytes, see batch.c), into *v[i]. Each key is probed; a run of
 * keys without a record is inserted with one INSERT (flush_inserts()), in
 * order, before any later key is touched; every other key goes the single
 * call's way. repeat[i]: a[i] repeats the key before it, and must see what
 * that one did. One SPI connection for the whole batch, and the probes
 * share one opening of the table and one scan of its primary key
 * (idem_heap_batch_begin()).
 */
void
idem_claim_batch(int n, const ClaimArgs *a, const bool *repeat, Verdict **v)
{
	MemoryContext outer = CurrentMemoryContext;
	IdemCall	call;
	IdemCaps	caps = idem_caps(IDEM_API_LATEST);
	HeapBatch	heap;
	int		   *pending = palloc(sizeof(int) * Max(n, 1));
	int			npending = 0;
	int			i;

	idem_begin_worker(&call, "claim_operations()", &caps, NULL);
	if (call.store.backend->lookup_many != NULL)
	{
		idem_carry_lock_timeout(&call, a[0].wait, true);
		claim_groups(&call, n, a, repeat, v);
		idem_carry_lock_timeout(&call, a[0].wait, false);
		idem_end(&call);
		return;
	}
	idem_heap_batch_begin(&heap, call.store.rels, false);
	for (i = 0; i < n; i++)
	{
		CHECK_FOR_INTERRUPTS();
		if (!repeat[i])
		{
			MemoryContext spi = MemoryContextSwitchTo(outer);
			ProbeResult probe;

			set_verdict(v[i], "completed", 0);
			probe = idem_probe_in(&heap, call.caller, &call.caps, a[i].job_type, a[i].key,
								  a[i].fingerprint, &v[i]->attempt, &v[i]->result,
								  &v[i]->result_isnull);
			MemoryContextSwitchTo(spi);
			if (probe == PROBE_COMPLETED)
				continue;
			if (probe == PROBE_ABSENT)
			{
				pending[npending++] = i;
				continue;
			}
		}
		flush_inserts(&call, a, v, pending, &npending);
		claim(&call, v[i], &a[i], NULL, false);
	}
	flush_inserts(&call, a, v, pending, &npending);
	idem_heap_batch_end(&heap);
	idem_end(&call);
}

/* wait must not be NULL (argument argno) */
bool
idem_arg_wait(FunctionCallInfo fcinfo, int argno)
{
	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("wait must not be null"),
				 errdetail("wait => true waits for another transaction's uncommitted claim of the key (bounded by lock_timeout and statement_timeout); wait => false answers in_progress at once."),
				 errhint("Pass true or false, or leave wait out (true).")));
	return PG_GETARG_BOOL(argno);
}

static Datum
claim_operation_common(FunctionCallInfo fcinfo, int api_version)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	IdemCaps	caps = idem_caps(api_version);
	ClaimArgs	a;
	Verdict		v;
	Datum		values[3];
	bool		nulls[3] = {false, false, false};
	int			guc_level;

	a.job_type = idem_arg_job_type(fcinfo, 0);
	a.key = idem_arg_key(fcinfo, 1);
	a.fingerprint = PG_ARGISNULL(2) ? NULL : PG_GETARG_TEXT_PP(2);
	a.worker = PG_ARGISNULL(3) ? NULL : PG_GETARG_TEXT_PP(3);
	a.delivery = NULL;
	a.wait = true;
	if (caps.deliveries)
	{
		a.delivery = idem_arg_delivery(fcinfo, 4);
		a.wait = idem_arg_wait(fcinfo, 5);
	}

	InitMaterializedSRF(fcinfo, 0);

	PreventCommandDuringRecovery("claim_operation()");
	PreventCommandIfReadOnly("claim_operation()");
	guc_level = idem_nowait_begin(a.wait);
	idem_claim_one(&a, &caps, &v);
	idem_nowait_end(guc_level);

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
	return claim_operation_common(fcinfo, IDEM_API_0_1);
}

/* since 0.2: the job type's worker_role applies */
Datum
claim_operation_0_2(PG_FUNCTION_ARGS)
{
	return claim_operation_common(fcinfo, IDEM_API_0_2);
}

/* since 0.3: delivery and wait */
Datum
claim_operation_0_3(PG_FUNCTION_ARGS)
{
	return claim_operation_common(fcinfo, IDEM_API_0_3);
}
