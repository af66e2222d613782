/*-------------------------------------------------------------------------
 *
 * batch.c
 *	  claim_operations(), complete_operations() and release_operations():
 *	  many keys of one job type in one call, so in one commit.
 *
 * Each key gets exactly what the single call would give it: each is
 * probed like a single claim, a run of keys without a record is inserted by
 * one INSERT (the single claim's INSERT, over arrays: see
 * idem_claim_batch()), and every other key goes through the very code of
 * claim_operation(), complete_operation() and release_operation(), one
 * after the other, in one transaction. The probes and the fast updates of
 * complete (heap.c) open the table and its primary key's scan once per
 * batch and check the caller's worker_role once per batch (HeapBatch).
 * Where Citus routes every statement (store_citus.c), a batch instead
 * reads each shard's keys with one statement, inserts them with one and
 * completes or releases them with one (StoreBackend's batch members). What
 * a batch adds:
 *
 * Order. The keys are taken in one deterministic order (by their bytes;
 * where Citus routes the statements, shard by shard and by their bytes
 * within a shard: idem_batch_groups()), whatever order the caller gives
 * them in, and answered in the caller's order. Each key's write locks its record (the primary key's entry for a
 * new record, the row for an update) until the transaction ends, so two
 * batches that share keys lock the shared ones in the same order: one waits
 * for the other and neither waits for the one that waits (no deadlock),
 * the rule PostgreSQL's docs give for avoiding deadlocks.
 *
 * Repeats. A key given twice in one claim batch is answered as two
 * deliveries would be: the second occurrence comes after the first in that
 * order and sees its claim (run, then in_progress), even with the same
 * delivery token, which would otherwise give the first claim back.
 *
 * Refusals. complete_operations() and release_operations() report a record
 * that refuses the call (ID003 superseded, ID004 no record, ID005 wrong
 * state) on the key's row, with the single call's message, so one fenced
 * key does not fail the batch. What is the caller's bug raises, as in the
 * single calls: arrays of different lengths, a NULL or malformed element,
 * an attempt that no claim returned (22023), an unknown job type (ID001), a
 * caller who may not work it (42501), a fingerprint mismatch in a claim
 * (ID002); and the whole transaction's work is then undone.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/tuplestore.h"

#include "idempotency.h"

PG_FUNCTION_INFO_V1(claim_operations);
PG_FUNCTION_INFO_V1(complete_operations);
PG_FUNCTION_INFO_V1(release_operations);

/* One array argument, deconstructed */
typedef struct ArrayArg
{
	const char *name;
	int			n;
	Datum	   *values;
	bool	   *nulls;
} ArrayArg;

/*
 * Argument argno, a one-dimensional array of `elemtype` (or NULL: returns
 * false unless `required`). Up to IDEMPOTENCY_MAX_BATCH elements.
 */
static bool
array_arg(FunctionCallInfo fcinfo, int argno, const char *name, Oid elemtype,
		  bool required, ArrayArg *out)
{
	ArrayType  *arr;
	int16		typlen;
	bool		typbyval;
	char		typalign;

	out->name = name;
	out->n = 0;
	out->values = NULL;
	out->nulls = NULL;
	if (PG_ARGISNULL(argno))
	{
		if (required)
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("%s must not be null", name),
					 errhint("Pass an array, one element per key; an empty array for none.")));
		return false;
	}
	arr = PG_GETARG_ARRAYTYPE_P(argno);
	if (ARR_NDIM(arr) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be a one-dimensional array", name),
				 errdetail("It has %d dimensions.", ARR_NDIM(arr))));
	get_typlenbyvalalign(elemtype, &typlen, &typbyval, &typalign);
	deconstruct_array(arr, elemtype, typlen, typbyval, typalign,
					  &out->values, &out->nulls, &out->n);
	if (out->n > IDEMPOTENCY_MAX_BATCH)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s has %d elements; a batch has at most %d",
						name, out->n, IDEMPOTENCY_MAX_BATCH),
				 errhint("Split the batch: one transaction per %d keys at most keeps its locks and its WAL short.",
						 IDEMPOTENCY_MAX_BATCH)));
	return true;
}

/* An optional array must have one element per key */
static void
same_length(const ArrayArg *keys, const ArrayArg *other)
{
	if (other->n != keys->n)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s has %d elements and %s has %d",
						other->name, other->n, keys->name, keys->n),
				 errdetail("The arrays of a batch are parallel: element i of each belongs to operation_keys[i]."),
				 errhint("Pass one element per key (NULL for none), or NULL for the whole array.")));
}

/* Element i (0-based) of a text array, checked like the single argument */
static text *
text_element(const ArrayArg *a, int i, int maxbytes, bool required)
{
	text	   *t;
	int			len;

	if (a->nulls[i])
	{
		if (required)
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("%s[%d] must not be null", a->name, i + 1),
					 errdetail("An operation is named by its job type and its operation key; neither may be NULL.")));
		return NULL;
	}
	t = DatumGetTextPP(a->values[i]);
	len = VARSIZE_ANY_EXHDR(t);
	if (maxbytes > 0 && len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s[%d] must not be empty", a->name, i + 1)));
	if (maxbytes > 0 && len > maxbytes)
		ereport(ERROR,
				(errcode(ERRCODE_STRING_DATA_RIGHT_TRUNCATION),
				 errmsg("%s[%d] is too long", a->name, i + 1),
				 errdetail("It is %d bytes long; the limit is %d bytes.", len, maxbytes)));
	return t;
}

/* The keys of a batch, and the order in which they are taken */
typedef struct BatchKey
{
	text	   *key;
	int			index;			/* in the caller's arrays */
} BatchKey;

static int
batch_key_cmp(const void *a, const void *b)
{
	const BatchKey *x = (const BatchKey *) a;
	const BatchKey *y = (const BatchKey *) b;
	int			c = idem_text_cmp(x->key, y->key);

	if (c != 0)
		return c;
	return x->index - y->index;
}

/* Check every key and sort them; returns the array of n keys */
static BatchKey *
batch_keys(const ArrayArg *keys)
{
	BatchKey   *order = palloc(sizeof(BatchKey) * Max(keys->n, 1));
	int			i;

	for (i = 0; i < keys->n; i++)
	{
		order[i].key = text_element(keys, i, IDEMPOTENCY_MAX_KEY_BYTES, true);
		order[i].index = i;
	}
	qsort(order, keys->n, sizeof(BatchKey), batch_key_cmp);
	return order;
}

static bool
same_key(const BatchKey *a, const BatchKey *b)
{
	return idem_same_text(a->key, b->key);
}

/*
 * claim_operations(job_type text, operation_keys text[], fingerprints text[],
 *					worker text, deliveries text[], wait boolean)
 * RETURNS TABLE (operation_key text, verdict text, attempt integer,
 *				  result jsonb)
 *
 * One row per key, in the caller's order, each with the verdict
 * claim_operation() would give it.
 */
Datum
claim_operations(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	text	   *job_type = idem_arg_job_type(fcinfo, 0);
	ArrayArg	keys;
	ArrayArg	fingerprints;
	ArrayArg	deliveries;
	bool		have_fingerprints;
	bool		have_deliveries;
	text	   *worker = PG_ARGISNULL(3) ? NULL : PG_GETARG_TEXT_PP(3);
	bool		wait = idem_arg_wait(fcinfo, 5);
	BatchKey   *order;
	Verdict    *verdicts;
	ClaimArgs  *args;
	bool	   *repeat;
	Verdict   **out;
	int			guc_level;
	int			i;

	(void) array_arg(fcinfo, 1, "operation_keys", TEXTOID, true, &keys);
	have_fingerprints = array_arg(fcinfo, 2, "fingerprints", TEXTOID, false, &fingerprints);
	have_deliveries = array_arg(fcinfo, 4, "deliveries", TEXTOID, false, &deliveries);
	if (have_fingerprints)
		same_length(&keys, &fingerprints);
	if (have_deliveries)
	{
		same_length(&keys, &deliveries);
		for (i = 0; i < deliveries.n; i++)
			(void) text_element(&deliveries, i, IDEMPOTENCY_MAX_DELIVERY_BYTES, false);
	}
	order = batch_keys(&keys);
	verdicts = palloc0(sizeof(Verdict) * Max(keys.n, 1));

	InitMaterializedSRF(fcinfo, 0);
	if (keys.n == 0)
		return (Datum) 0;

	PreventCommandDuringRecovery("claim_operations()");
	PreventCommandIfReadOnly("claim_operations()");
	guc_level = idem_nowait_begin(wait);
	args = palloc(sizeof(ClaimArgs) * keys.n);
	repeat = palloc(sizeof(bool) * keys.n);
	out = palloc(sizeof(Verdict *) * keys.n);
	for (i = 0; i < keys.n; i++)
	{
		int			k = order[i].index;
		ClaimArgs  *a = &args[i];

		/* a repeat of a key in this batch is another delivery of it */
		repeat[i] = i > 0 && same_key(&order[i - 1], &order[i]);
		a->job_type = job_type;
		a->key = order[i].key;
		a->fingerprint = have_fingerprints ? text_element(&fingerprints, k, 0, false) : NULL;
		a->worker = worker;
		a->delivery = (have_deliveries && !repeat[i]) ?
			text_element(&deliveries, k, 0, false) : NULL;
		a->wait = wait;
		out[i] = &verdicts[k];
	}
	idem_claim_batch(keys.n, args, repeat, out);
	idem_nowait_end(guc_level);

	for (i = 0; i < keys.n; i++)
	{
		Datum		values[4];
		bool		nulls[4] = {false, false, false, false};

		values[0] = keys.values[i];
		values[1] = CStringGetTextDatum(verdicts[i].verdict);
		values[2] = Int32GetDatum(verdicts[i].attempt);
		values[3] = verdicts[i].result;
		nulls[3] = verdicts[i].result_isnull;
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}

/* What happened to one key of a complete or release batch */
typedef struct Outcome
{
	bool		done;
	IdemRefusal refusal;
} Outcome;

/*
 * complete_operations(job_type text, operation_keys text[],
 *					   attempts integer[], results jsonb[])
 * release_operations(job_type text, operation_keys text[], attempts integer[])
 * RETURNS TABLE (operation_key text, attempt integer, done boolean,
 *				  sqlstate text, message text)
 *
 * One row per key, in the caller's order: done (now, or already by this
 * attempt), or the refusal's SQLSTATE and message.
 */
static Datum
finish_batch(FunctionCallInfo fcinfo, bool complete)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	const char *fname = complete ? "complete_operations()" : "release_operations()";
	text	   *job_type = idem_arg_job_type(fcinfo, 0);
	ArrayArg	keys;
	ArrayArg	attempts;
	ArrayArg	results;
	bool		have_results = false;
	BatchKey   *order;
	Outcome    *outcomes;
	IdemCaps	caps = idem_caps(IDEM_API_LATEST);
	CompleteBatch *cb = NULL;
	bool	   *done;
	int			i;

	(void) array_arg(fcinfo, 1, "operation_keys", TEXTOID, true, &keys);
	(void) array_arg(fcinfo, 2, "attempts", INT4OID, true, &attempts);
	same_length(&keys, &attempts);
	for (i = 0; i < attempts.n; i++)
	{
		if (attempts.nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("attempts[%d] must not be null", i + 1),
					 errdetail("The attempt is the fencing token that shows the caller still owns the claim."),
					 errhint("Pass the attempt that claim_operations() returned for each key.")));
		if (DatumGetInt32(attempts.values[i]) < 1)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("attempts[%d] must be positive, not %d",
							i + 1, DatumGetInt32(attempts.values[i])),
					 errhint("Pass the attempt that claim_operations() returned for each key.")));
	}
	if (complete)
	{
		have_results = array_arg(fcinfo, 3, "results", JSONBOID, false, &results);
		if (have_results)
			same_length(&keys, &results);
	}
	order = batch_keys(&keys);
	outcomes = palloc0(sizeof(Outcome) * Max(keys.n, 1));

	InitMaterializedSRF(fcinfo, 0);
	if (keys.n == 0)
		return (Datum) 0;

	PreventCommandDuringRecovery(fname);
	PreventCommandIfReadOnly(fname);
	done = palloc0(sizeof(bool) * keys.n);
	if (idem_batch_statements())
	{
		text	  **sorted = palloc(sizeof(text *) * keys.n);
		int32	   *sorted_attempts = palloc(sizeof(int32) * keys.n);
		Datum	   *sorted_results = palloc0(sizeof(Datum) * keys.n);
		bool	   *sorted_nulls = palloc(sizeof(bool) * keys.n);

		/* where a store has batch statements, most keys are done here */
		for (i = 0; i < keys.n; i++)
		{
			int			k = order[i].index;

			sorted[i] = order[i].key;
			sorted_attempts[i] = DatumGetInt32(attempts.values[k]);
			sorted_nulls[i] = !have_results || results.nulls[k];
			if (!sorted_nulls[i])
				sorted_results[i] = results.values[k];
		}
		idem_fenced_batch_many(&caps, complete, job_type, keys.n, sorted, sorted_attempts,
							   complete ? sorted_results : NULL, sorted_nulls, done);
	}
	if (complete)
		cb = idem_complete_batch_begin(&caps);
	for (i = 0; i < keys.n; i++)
	{
		int			k = order[i].index;
		int32		attempt = DatumGetInt32(attempts.values[k]);

		CHECK_FOR_INTERRUPTS();
		if (done[i])
			outcomes[k].done = true;
		else if (complete)
		{
			bool		result_isnull = !have_results || results.nulls[k];

			outcomes[k].done = idem_complete_batch_key(cb, job_type, order[i].key, attempt,
													   result_isnull ? (Datum) 0 : results.values[k],
													   result_isnull, &outcomes[k].refusal);
		}
		else
			outcomes[k].done = idem_release_one(&caps, false, job_type, order[i].key, attempt,
												&outcomes[k].refusal);
	}
	if (cb != NULL)
		idem_complete_batch_end(cb);

	for (i = 0; i < keys.n; i++)
	{
		Datum		values[5];
		bool		nulls[5] = {false, false, false, true, true};

		values[0] = keys.values[i];
		values[1] = attempts.values[i];
		values[2] = BoolGetDatum(outcomes[i].done);
		if (!outcomes[i].done)
		{
			values[3] = CStringGetTextDatum(unpack_sql_state(outcomes[i].refusal.sqlstate));
			values[4] = CStringGetTextDatum(outcomes[i].refusal.message);
			nulls[3] = nulls[4] = false;
		}
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}

Datum
complete_operations(PG_FUNCTION_ARGS)
{
	return finish_batch(fcinfo, true);
}

Datum
release_operations(PG_FUNCTION_ARGS)
{
	return finish_batch(fcinfo, false);
}
