/*-------------------------------------------------------------------------
 *
 * store_table.c
 *	  The plain table store: the extension's own tables on one node, read
 *	  and written by the one-node statements and, where heap.c covers them,
 *	  by the direct heap paths.
 *
 * The local shard store (store_shard.c) runs the same statements renamed
 * for its shard, so it shares this file's lookup, role check and purge.
 *
 * The relations' and attributes' numbers are cached per backend and
 * forgotten on any relcache invalidation of the tables or their primary
 * keys (DROP/CREATE/ALTER EXTENSION, ALTER TABLE); a schema the heap paths
 * do not know (a superuser's ALTER TABLE) leaves every call to SPI, whose
 * statements cast what they read.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"

#include "store.h"

typedef struct TableCache
{
	bool		valid;			/* rels loaded and checked, nothing changed */
	TargetRels	rels;
} TableCache;

static TableCache cache;
static bool callback_registered = false;

/* bumped by every relcache invalidation; see table_load() */
static uint64 invalidations = 0;

/* The plans of the plain table store */
static StorePlans table_plans;

static const StoreBackend table_backend = {
	.name = "table",
	.set = SET_ONE_NODE,
	.cursor_options = 0,		/* the plan cache chooses */
	.statement_text = NULL,
	.lookup = idem_one_node_lookup,
	.fenced_role = idem_one_node_fenced_role,
	.purge = idem_one_node_purge,
	.purge_range = idem_one_node_purge_range,
};

static void
table_invalidate(Datum arg pg_attribute_unused(), Oid relid)
{
	invalidations++;
	if (relid == InvalidOid ||
		relid == cache.rels.ops_relid || relid == cache.rels.ops_pkey ||
		relid == cache.rels.jt_relid || relid == cache.rels.jt_pkey)
		cache.valid = cache.rels.valid = false;
}

/*
 * idempotency.operations and job_types, by name; false if either is not
 * there (the extension is not installed, or being dropped).
 */
bool
idem_tables(Oid *ops_relid, Oid *jt_relid)
{
	Oid			nspid = get_namespace_oid("idempotency", true);

	*ops_relid = *jt_relid = InvalidOid;
	if (!OidIsValid(nspid))
		return false;
	*ops_relid = get_relname_relid("operations", nspid);
	*jt_relid = get_relname_relid("job_types", nspid);
	return OidIsValid(*ops_relid) && OidIsValid(*jt_relid);
}

/*
 * The plain table store, with the heap paths if its cache is current: the
 * common case of every call on one node, one test. False: the caller
 * chooses (store.c).
 */
bool
idem_table_store_cached(Store *s)
{
	if (!cache.valid)
		return false;
	s->backend = &table_backend;
	s->plans = &table_plans;
	s->rels = &cache.rels;
	return true;
}

/*
 * The plain table store, its cache filled: with the heap paths if they
 * know the tables' shape (idem_rels_load()), else without. One
 * invalidation that arrives while the cache is being filled is caught by
 * the counter.
 */
void
idem_table_store(Store *s)
{
	uint64		start = invalidations;
	Oid			ops_relid;
	Oid			jt_relid;
	Oid			nspid;

	if (!callback_registered)
	{
		CacheRegisterRelcacheCallback(table_invalidate, (Datum) 0);
		callback_registered = true;
	}
	memset(&cache, 0, sizeof(cache));
	s->backend = &table_backend;
	s->plans = &table_plans;
	s->rels = NULL;
	if (!idem_tables(&ops_relid, &jt_relid))
		return;
	nspid = get_rel_namespace(ops_relid);
	if (!idem_rels_load(&cache.rels, ops_relid,
						get_relname_relid("operations_pkey", nspid), jt_relid,
						get_relname_relid("job_types_pkey", nspid)))
		return;
	cache.valid = cache.rels.valid = (invalidations == start);
	if (cache.valid)
		s->rels = &cache.rels;
}

/*
 * Where the one-node lookup's columns are, by variant: one row, the job
 * type's and the record's columns (see OP_LOOKUP in statements.c).
 */
static const LookupColumns one_node_columns[] = {
	[VARIANT_BASE] = {1, 2, 0, 0, 0, 3, 4, 5, 6, 7, 8, 0},
	[VARIANT_ROLE] = {1, 2, 0, 9, 0, 3, 4, 5, 6, 7, 8, 0},
	[VARIANT_DELIVERY] = {1, 2, 0, 9, 0, 3, 4, 5, 6, 7, 8, 10},
};

/*
 * Read a job type's configuration and the record of one key in one
 * statement (the variant: with the worker_role, and the delivery digest).
 */
void
idem_one_node_lookup(const Store *s, StoreVariant v, text *job_type, text *key,
					 OperationState *state)
{
	Datum		values[2] = {PointerGetDatum(job_type), PointerGetDatum(key)};
	const LookupColumns *c;

	Assert(v <= VARIANT_DELIVERY);
	c = &one_node_columns[v];
	idem_state_init(state);
	if (idem_execute(s, OP_LOOKUP, v, values, NULL, 1) == 0)
		return;
	idem_decode_job_type(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, c, state, NULL);
	(void) idem_decode_record(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, c, state, NULL);
}

/*
 * A fenced update on this node: the statement compares the caller's OID
 * with the job type's worker_role where it runs, when the caller's
 * capabilities include worker roles.
 */
StoreVariant
idem_one_node_fenced_role(const Store *s pg_attribute_unused(), const IdemCall *call,
						  text *job_type pg_attribute_unused(), Datum *caller,
						  Datum *role, NameData *names pg_attribute_unused())
{
	*caller = ObjectIdGetDatum(call->caller);
	*role = (Datum) 0;
	return call->caps.worker_roles ? VARIANT_ROLE : VARIANT_BASE;
}

/*
 * purge_operations() on one node: one pass over the table through a
 * cursor; each batch of batch_size rows is one DELETE by ctid that checks
 * every condition again, so a record that changed since the scan is left
 * alone.
 */
int64
idem_one_node_purge(const Store *s, Datum now, int32 batch_size)
{
	MemoryContext batch_cxt = AllocSetContextCreate(CurrentMemoryContext,
													"idempotency purge batch",
													ALLOCSET_DEFAULT_SIZES);
	Portal		portal = idem_cursor(s, OP_PURGE_SCAN, VARIANT_BASE, &now, NULL);
	int64		deleted = 0;

	for (;;)
	{
		MemoryContext old;
		Datum	   *tids;
		Datum		args[2];
		uint64		n,
					i;

		CHECK_FOR_INTERRUPTS();
		SPI_cursor_fetch(portal, true, batch_size);
		n = SPI_processed;
		if (n == 0)
			break;

		old = MemoryContextSwitchTo(batch_cxt);
		tids = palloc(sizeof(Datum) * n);
		for (i = 0; i < n; i++)
		{
			bool		isnull;
			ItemPointer tid = (ItemPointer) DatumGetPointer(SPI_getbinval(SPI_tuptable->vals[i],
																		  SPI_tuptable->tupdesc,
																		  1, &isnull));
			ItemPointer copy = palloc(sizeof(ItemPointerData));

			ItemPointerCopy(tid, copy);
			tids[i] = PointerGetDatum(copy);
		}
		args[0] = now;
		args[1] = PointerGetDatum(construct_array(tids, (int) n, TIDOID,
												  sizeof(ItemPointerData), false,
												  TYPALIGN_SHORT));
		MemoryContextSwitchTo(old);
		SPI_freetuptable(SPI_tuptable);

		deleted += idem_execute(s, OP_PURGE_DELETE, VARIANT_BASE, args, NULL, 0);
		MemoryContextReset(batch_cxt);
	}
	SPI_cursor_close(portal);
	MemoryContextDelete(batch_cxt);
	return deleted;
}

/* purge_block_range() on one node: one DELETE with a TID range scan */
int64
idem_one_node_purge_range(const Store *s, Datum now, ItemPointer first, ItemPointer end,
						  int64 first_block pg_attribute_unused())
{
	Datum		args[3];

	args[0] = now;
	args[1] = PointerGetDatum(first);
	args[2] = PointerGetDatum(end);
	return idem_execute(s, OP_PURGE_RANGE, VARIANT_BASE, args, NULL, 0);
}
