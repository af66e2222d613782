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
 *	- No direct heap path: the tables here are empty shells.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "catalog/pg_namespace.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
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
