/*-------------------------------------------------------------------------
 *
 * store_citus.c
 *	  The routed store: where Citus manages the tables (their rows are in
 *	  shards), every statement goes through Citus's planner, which routes it
 *	  to the key's shard; and the test of whether Citus manages them, by
 *	  which store.c chooses this store or the local shard
 *	  (store_shard.c).
 *
 * What differs from one node, and why (the statements themselves are in
 * statements.c, SET_ROUTED):
 *
 *	- The lookup is two statements, the job type and then the record
 *	  (a statement that joins the distributed table with another is refused
 *	  inside a delegated call); the expiry is computed here from the lease.
 *	- The worker_role is compared by name: the statement may run on another
 *	  node, whose role OIDs differ.
 *	- The insert is one row of VALUES, which Citus routes and counts.
 *	- The purge goes by job type, not by ctid (ctids are per shard).
 *	- Plans are custom at every execution (see routed_backend below).
 *	- A batch's keys go by shard: one statement reads the records of one
 *	  shard's keys, one inserts them, one completes them (the batch
 *	  statements below), where a key alone would cost three routed
 *	  statements to claim and two to complete.
 *	- No direct heap path: the tables here are empty shells.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "catalog/pg_type.h"
#include "catalog/pg_namespace.h"
#include "executor/spi.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/json.h"
#include "utils/jsonb.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"

#include "store.h"

/* Whether Citus manages the extension's tables, kept until they change */
typedef struct RoutedCache
{
	bool		settled;		/* Citus manages them: kept until an
								 * invalidation of either table */
	Oid			ops_relid;
	Oid			jt_relid;
} RoutedCache;

static RoutedCache cache;
static bool callback_registered = false;
static uint64 invalidations = 0;

static StorePlans routed_plans;

static void routed_lookup(const Store *s, StoreVariant v, text *job_type, text *key,
						  OperationState *state);
static StoreVariant routed_fenced_role(const Store *s, const IdemCall *call, text *job_type,
									   Datum *caller, Datum *role, NameData *names);
static int64 routed_purge(const Store *s, Datum now, int32 batch_size);
static int64 routed_purge_range(const Store *s, Datum now, ItemPointer first,
								ItemPointer end, int64 first_block);
static int64 routed_group_of(const Store *s, text *key);
static void routed_lookup_many(const Store *s, text *job_type, int n, text *const *keys,
							   OperationState *states, BatchJobType *jt);
static void routed_insert_many(const Store *s, const InsertRows *rows, bool *inserted);
static void routed_carry_lock_timeout(const Store *s, bool on);
static void routed_fenced_many(const Store *s, StoreOp op, StoreVariant v, Datum caller,
							   Datum role, FencedRows *rows);

/*
 * Plans are custom at every execution (CURSOR_OPT_CUSTOM_PLAN), never the
 * plan cache's generic plan. A generic plan of a statement on a distributed
 * table leaves the choice of the shard to execution time ("deferred
 * pruning"); on the node that holds the shard, Citus's local execution then
 * plans the shard query and keeps that plan in the generic plan's memory.
 * Citus 13.2.1 and later (upstream #8371, also in 14.0) never find it again
 * for such plans, so every execution added one more to memory that is kept
 * as long as the backend: about 37 kB per call on the worker holding the
 * key, without bound (test/citus/memory.sh measures it per backend). A
 * custom plan knows the key, so Citus prunes to the shard while planning
 * and caches nothing; the planning it repeats is about what the generic
 * plan's execution did anyway (see the README, "Citus").
 */
static const StoreBackend routed_backend = {
	.name = "routed",
	.set = SET_ROUTED,
	.cursor_options = CURSOR_OPT_CUSTOM_PLAN,
	.statement_text = NULL,
	.lookup = routed_lookup,
	.fenced_role = routed_fenced_role,
	.purge = routed_purge,
	.purge_range = routed_purge_range,
	.group_of = routed_group_of,
	.lookup_many = routed_lookup_many,
	.insert_many = routed_insert_many,
	.fenced_many = routed_fenced_many,
	.carry_lock_timeout = routed_carry_lock_timeout,
};

static void
routed_invalidate(Datum arg pg_attribute_unused(), Oid relid)
{
	invalidations++;
	if (relid == InvalidOid || relid == cache.ops_relid || relid == cache.jt_relid)
		cache.settled = false;
}

/*
 * Does Citus manage `relid` (a row in pg_dist_partition, whatever its
 * distribution method)? False where Citus is not installed. Citus sends a
 * relcache invalidation of a table when it changes the table's metadata,
 * so the answer is read again after distribution (routed_invalidate()).
 */
static bool
citus_managed(Oid relid)
{
	Oid			dist = get_relname_relid("pg_dist_partition", PG_CATALOG_NAMESPACE);
	Relation	rel;
	SysScanDesc scan;
	ScanKeyData key;
	bool		found;

	if (!OidIsValid(dist))
		return false;
	rel = table_open(dist, AccessShareLock);
	/* logicalrelid, its first column; a small table, scanned whole */
	ScanKeyInit(&key, 1, BTEqualStrategyNumber, F_OIDEQ, ObjectIdGetDatum(relid));
	scan = systable_beginscan(rel, InvalidOid, false, NULL, 1, &key);
	found = HeapTupleIsValid(systable_getnext(scan));
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return found;
}

/*
 * Does Citus manage the extension's tables (distributed, reference or
 * Citus local: here they are empty shells, their records in shards)? If
 * so, sets *ops_relid and *jt_relid to them.
 */
bool
idem_routed_applies(Oid *ops_relid, Oid *jt_relid)
{
	if (!cache.settled)
	{
		uint64		start = invalidations;

		if (!callback_registered)
		{
			CacheRegisterRelcacheCallback(routed_invalidate, (Datum) 0);
			callback_registered = true;
		}
		memset(&cache, 0, sizeof(cache));
		if (!idem_tables(&cache.ops_relid, &cache.jt_relid) ||
			!(citus_managed(cache.ops_relid) || citus_managed(cache.jt_relid)))
			return false;

		/*
		 * Kept until the tables change (Citus sends their relcache
		 * invalidation when it changes their metadata): every call on a
		 * distributed install would otherwise read pg_dist_partition again.
		 */
		cache.settled = (invalidations == start);
	}
	*ops_relid = cache.ops_relid;
	*jt_relid = cache.jt_relid;
	return true;
}

/* The routed store: no direct heap path (the tables here are shells) */
void
idem_routed_store(Store *s)
{
	s->backend = &routed_backend;
	s->plans = &routed_plans;
	s->rels = NULL;
}

/* Where the two statements' columns are: the job type's row, the record's */
static const LookupColumns routed_roles = {1, 2, 3, 0, 4, 1, 2, 3, 0, 4, 5, 6};
static const LookupColumns routed_no_roles = {1, 2, 3, 0, 0, 1, 2, 3, 0, 4, 5, 6};

/* The lookup in two statements: the job type, then the record alone */
static void
routed_lookup(const Store *s, StoreVariant v, text *job_type, text *key,
			  OperationState *state)
{
	const LookupColumns *c = v != VARIANT_BASE ? &routed_roles : &routed_no_roles;
	Datum		values[2] = {PointerGetDatum(job_type), PointerGetDatum(key)};
	Interval	lease;

	idem_state_init(state);
	if (idem_execute(s, OP_LOOKUP_JOB_TYPE, VARIANT_BASE, values, NULL, 1) == 0)
		return;
	idem_decode_job_type(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, c, state, &lease);
	if (idem_execute(s, OP_LOOKUP_RECORD, VARIANT_BASE, values, NULL, 1) == 0)
		return;					/* no record */
	(void) idem_decode_record(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, c, state, &lease);
}

/*
 * The fenced updates' role check where Citus routes them: the job type's
 * worker_role, by name, read from this node's job_types placement (one
 * local read, not the record's lookup), for the statement to compare with
 * the caller's name where it runs. No check (VARIANT_BASE) when the caller's
 * capabilities have no worker roles, the job type names no worker_role, or
 * is not registered (then the update finds no record, and the refusal's
 * lookup says why), or names a role that does not exist here and the
 * caller is a superuser; anyone else gets 42501 for such a job type, as on
 * one node. names[0], names[1]: where the two names are kept.
 */
static StoreVariant
routed_fenced_role(const Store *s, const IdemCall *call, text *job_type,
				   Datum *caller, Datum *role, NameData *names)
{
	Datum		values[1] = {PointerGetDatum(job_type)};
	OperationState state;
	Interval	lease;

	*caller = ObjectIdGetDatum(call->caller);
	*role = (Datum) 0;
	if (!call->caps.worker_roles)
		return VARIANT_BASE;
	idem_state_init(&state);
	if (idem_execute(s, OP_LOOKUP_JOB_TYPE, VARIANT_BASE, values, NULL, 1) == 0)
		return VARIANT_BASE;
	idem_decode_job_type(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, &routed_roles,
						 &state, &lease);
	if (state.worker_role_missing)
	{
		if (!superuser_arg(call->caller))
			idem_deny_job_type(call->caller, job_type, InvalidOid);
		return VARIANT_BASE;
	}
	if (!OidIsValid(state.worker_role))
		return VARIANT_BASE;
	namestrcpy(&names[0], GetUserNameFromId(call->caller, false));
	namestrcpy(&names[1], GetUserNameFromId(state.worker_role, false));
	*caller = NameGetDatum(&names[0]);
	*role = NameGetDatum(&names[1]);
	return VARIANT_ROLE_NAME;
}

/*
 * The purge without ctids: each job type's cutoff, then one DELETE per job
 * type, which Citus runs on every shard. No batches: ctids are per shard.
 */
static int64
routed_purge(const Store *s, Datum now, int32 batch_size pg_attribute_unused())
{
	SPITupleTable *cutoffs;
	uint64		n;
	uint64		i;
	int64		deleted = 0;

	idem_execute(s, OP_PURGE_CUTOFFS, VARIANT_BASE, &now, NULL, 0);
	cutoffs = SPI_tuptable;
	n = SPI_processed;
	for (i = 0; i < n; i++)
	{
		Datum		args[2];
		bool		isnull;

		CHECK_FOR_INTERRUPTS();
		args[0] = SPI_getbinval(cutoffs->vals[i], cutoffs->tupdesc, 1, &isnull);
		args[1] = SPI_getbinval(cutoffs->vals[i], cutoffs->tupdesc, 2, &isnull);
		deleted += idem_execute(s, OP_PURGE_JOB_TYPE, VARIANT_BASE, args, NULL, 0);
	}
	return deleted;
}

/*
 * purge_block_range() where the local relation is an empty shell: no heap
 * blocks to walk here, so a range from block 0 stands for the whole table
 * (every shard), any other range deletes nothing.
 */
static int64
routed_purge_range(const Store *s, Datum now, ItemPointer first pg_attribute_unused(),
				   ItemPointer end pg_attribute_unused(), int64 first_block)
{
	return first_block == 0 ? routed_purge(s, now, 0) : 0;
}

/*
 * The batch statements (StoreBackend's batch members): a claim or
 * complete batch's keys, grouped by shard (idem_batch_groups()), each
 * group read with one statement, inserted and completed with one.
 */

/* A batch's group: the shard's place (store_shard.c's map), or -1 */
static int64
routed_group_of(const Store *s pg_attribute_unused(), text *key)
{
	return idem_shard_of(cache.ops_relid, cache.jt_relid, key);
}

/* A text[] of n keys */
static Datum
key_array(int n, const Datum *keys)
{
	return PointerGetDatum(construct_array(unconstify(Datum *, keys), n, TEXTOID, -1, false,
										   TYPALIGN_INT));
}

/* The columns of OP_LOOKUP_RECORDS: the record's, after the key */
static const LookupColumns routed_many_columns = {1, 2, 3, 0, 4, 2, 3, 4, 0, 5, 6, 7};

/*
 * The records of n distinct keys of one group, in the batch's order, with
 * one statement; the job type once per batch (the batch calls have every
 * capability: the worker_role by name). The records' fingerprints and
 * results point into this statement's tuple table, kept until the batch's
 * SPI connection ends.
 */
static void
routed_lookup_many(const Store *s, text *job_type, int n, text *const *keys,
				   OperationState *states, BatchJobType *jt)
{
	Datum		values[2];
	Datum	   *k;
	int			i;

	values[0] = PointerGetDatum(job_type);
	if (!jt->read)
	{
		idem_state_init(&jt->state);
		if (idem_execute(s, OP_LOOKUP_JOB_TYPE, VARIANT_BASE, values, NULL, 1) == 1)
			idem_decode_job_type(SPI_tuptable->vals[0], SPI_tuptable->tupdesc,
								 &routed_many_columns, &jt->state, &jt->lease);
		jt->read = true;
	}
	for (i = 0; i < n; i++)
		states[i] = jt->state;
	if (!jt->state.job_type_found || n == 0)
		return;

	k = palloc(sizeof(Datum) * n);
	for (i = 0; i < n; i++)
		k[i] = PointerGetDatum(keys[i]);
	values[1] = key_array(n, k);
	(void) idem_execute(s, OP_LOOKUP_RECORDS, VARIANT_BASE, values, NULL, 0);

	/* each row to its key, among the keys in the batch's order */
	for (uint64 r = 0; r < SPI_processed; r++)
	{
		int			at = idem_returned_key(r, n, k);

		if (at >= 0)
			(void) idem_decode_record(SPI_tuptable->vals[r], SPI_tuptable->tupdesc,
									  &routed_many_columns, &states[at], &jt->lease);
	}
	pfree(k);
}

/*
 * The insert's kept plans by number of rows (idem_insert_rows_sql()); a
 * group of more keys goes in statements of at most this many.
 */
#define ROUTED_INSERT_ROWS	16
static SPIPlanPtr insert_plans[ROUTED_INSERT_ROWS + 1];

static SPIPlanPtr
insert_plan(int rows)
{
	if (insert_plans[rows] == NULL)
	{
		Oid			types[3 + 3 * ROUTED_INSERT_ROWS];
		char	   *sql = idem_insert_rows_sql(rows, types);

		insert_plans[rows] = idem_prepare_kept(sql, 3 + 3 * rows, types,
											   routed_backend.cursor_options);
		pfree(sql);
	}
	return insert_plans[rows];
}

/* Attempt 1 of a group's keys, ROUTED_INSERT_ROWS keys a statement */
static void
routed_insert_many(const Store *s pg_attribute_unused(), const InsertRows *rows,
				   bool *inserted)
{
	Datum		values[3 + 3 * ROUTED_INSERT_ROWS];
	char		nulls[3 + 3 * ROUTED_INSERT_ROWS];

	for (int first = 0; first < rows->n; first += ROUTED_INSERT_ROWS)
	{
		int			m = Min(rows->n - first, ROUTED_INSERT_ROWS);
		int			rc;

		memset(nulls, ' ', sizeof(nulls));
		values[0] = PointerGetDatum(rows->job_type);
		values[1] = TimestampTzGetDatum(rows->now);
		values[2] = PointerGetDatum(rows->worker);
		if (rows->worker == NULL)
			nulls[2] = 'n';
		for (int i = 0; i < m; i++)
		{
			int			p = 3 + 3 * i;

			values[p] = rows->keys[first + i];
			values[p + 1] = rows->fingerprints[first + i];
			nulls[p + 1] = rows->fingerprint_nulls[first + i] ? 'n' : ' ';
			values[p + 2] = rows->digests[first + i];
			nulls[p + 2] = rows->digest_nulls[first + i] ? 'n' : ' ';
		}
		rc = SPI_execute_plan(insert_plan(m), values, nulls, false, 0);
		if (rc < 0)
			elog(ERROR, "SPI_execute_plan failed for the routed insert of %d rows: %s",
				 m, SPI_result_code_string(rc));
		idem_mark_returned(m, rows->keys + first, inserted + first);
	}
}

/*
 * The fenced completions or releases of a group's distinct keys, with one
 * statement: each key's attempt and result in one jsonb object
 * (OP_COMPLETE_MANY, OP_RELEASE_MANY).
 */
static void
routed_fenced_many(const Store *s, StoreOp op, StoreVariant v, Datum caller, Datum role,
				   FencedRows *rows)
{
	Datum		values[7];
	char		nulls[7];
	StringInfoData json;

	initStringInfo(&json);
	appendStringInfoChar(&json, '{');
	for (int i = 0; i < rows->n; i++)
	{
		if (i > 0)
			appendStringInfoString(&json, ", ");
		escape_json(&json, idem_text(DatumGetTextPP(rows->keys[i])));
		appendStringInfo(&json, ": [%d", DatumGetInt32(rows->attempts[i]));
		if (rows->results != NULL && !rows->result_nulls[i])
		{
			Jsonb	   *r = DatumGetJsonbP(rows->results[i]);

			appendStringInfoString(&json, ", ");
			(void) JsonbToCString(&json, &r->root, VARSIZE(r));
		}
		appendStringInfoChar(&json, ']');
	}
	appendStringInfoChar(&json, '}');

	memset(nulls, ' ', sizeof(nulls));
	values[0] = PointerGetDatum(rows->job_type);
	values[1] = key_array(rows->n, rows->keys);
	values[2] = DirectFunctionCall1(jsonb_in, CStringGetDatum(json.data));
	values[3] = TimestampTzGetDatum(rows->now);
	values[4] = (Datum) 0;		/* unused */
	nulls[4] = 'n';
	values[5] = caller;
	values[6] = role;
	(void) idem_execute(s, op, v, values, nulls, 0);
	idem_mark_returned(rows->n, rows->keys, rows->done);
	pfree(json.data);
}

/*
 * wait => false's bound where the statements run. lock_timeout set in this
 * backend does not reach the nodes Citus sends the statements to, so there
 * a write would wait for another transaction's uncommitted claim of the key
 * until that transaction ends. Citus carries one kind of setting: a SET
 * LOCAL, when citus.propagate_set_commands is local and the transaction is
 * one of several statements (a DO block's is); it sends it to the
 * connections the transaction has, and with the BEGIN of those it opens
 * later. So on = true sends SET LOCAL lock_timeout = (this session's), and
 * on = false SET LOCAL lock_timeout TO DEFAULT (each node's own setting,
 * which is what Citus's connections have unless a SET LOCAL of the
 * caller's was carried before). Here, both run at a GUC nest level of
 * their own that saves lock_timeout and citus.propagate_set_commands, so
 * this session's settings are as they were. The DO block needs PL/pgSQL,
 * which every database has unless it was dropped.
 */
static void
routed_carry_lock_timeout(const Store *s pg_attribute_unused(), bool on)
{
	char	   *now = pstrdup(GetConfigOption("lock_timeout", false, false));
	int			level = NewGUCNestLevel();
	char		sql[160];

	(void) set_config_option("lock_timeout", now, PGC_USERSET, PGC_S_SESSION,
							 GUC_ACTION_SAVE, true, ERROR, false);
	(void) set_config_option("citus.propagate_set_commands", "local", PGC_USERSET, PGC_S_SESSION,
							 GUC_ACTION_SAVE, true, ERROR, false);
	if (on)
		snprintf(sql, sizeof(sql), "DO $idem$BEGIN SET LOCAL lock_timeout = %s; END$idem$",
				 quote_literal_cstr(now));
	else
		snprintf(sql, sizeof(sql), "DO $idem$BEGIN SET LOCAL lock_timeout TO DEFAULT; END$idem$");
	if (SPI_execute(sql, false, 0) != SPI_OK_UTILITY)
		elog(ERROR, "could not carry lock_timeout to the nodes");
	AtEOXact_GUC(true, level);
}
