/*-------------------------------------------------------------------------
 *
 * store_shard.c
 *	  The local shard store: where Citus manages the tables, the call on
 *	  the node that holds the key's shard works on that shard directly.
 *
 * On a distributed install (idempotency.distribute()) a call that reaches
 * the node holding its key's only placement (a client connected to that
 * worker, or the coordinator's delegated call) would otherwise plan every
 * statement twice: Citus's distributed planner routes it to the shard, and
 * its local execution deparses and plans the shard query again. Instead,
 * the call here works on the shard itself, idempotency.operations_<shardid>,
 * and on the node's placement of job_types, with the plain table store's
 * statements (their table names rewritten: shard_statement_text()), its
 * lookup, role check and purge (store_table.c), and the same direct heap
 * paths (heap.c).
 *
 * Safety, as Citus's own routed writes have it:
 *
 *	- Which shard, and where: read below SPI from Citus's catalogs
 *	  (pg_dist_partition, pg_dist_shard, pg_dist_placement,
 *	  pg_dist_local_group), the key hashed as Citus hashes a text
 *	  distribution column (its type's hash function under its collation),
 *	  the shard found by its hash range. Kept per backend, forgotten on any
 *	  relcache invalidation of the distributed table (Citus sends one
 *	  whenever a shard or a placement of it changes) or of a shard in use.
 *	- The placement cannot move while the call works: before the shard is
 *	  touched, the call takes the shard-metadata lock that Citus's routed
 *	  writes take (ShareLock) and that shard moves, splits and the
 *	  rebalancer take in ExclusiveLock on every node with metadata until
 *	  their metadata change commits. Then the invalidations that arrived are
 *	  processed and the choice is checked again: the key still maps to the
 *	  same shard and its only placement is still here. Otherwise the call
 *	  takes the Citus path. The lock is held until the transaction ends, as
 *	  Citus holds it.
 *	- Citus's transaction bookkeeping: Citus's local execution marks a
 *	  transaction that wrote a local shard (two-phase commit if it also
 *	  writes on another node; later statements on local shards executed
 *	  locally). Those marks are not reachable from another extension (Citus
 *	  built for PostgreSQL 16 and later exports no such symbol), so the
 *	  direct path is taken only where it provably needs none of them: the
 *	  call is the coordinator's delegated call (a Citus internal backend:
 *	  the coordinator coordinates that transaction, this node is one
 *	  participant of it), or the statement is its own transaction and
 *	  nothing but this one call (no transaction block; no other relation,
 *	  subquery or function that is not built in: statement_is_one_call()),
 *	  so nothing else in it writes anywhere. (Inside the call, Citus itself
 *	  refuses a write to another colocation group: the functions are
 *	  delegated with force_delegation.) A call inside a client's
 *	  transaction block on a worker, or in a larger statement, takes the
 *	  Citus path, whose local execution keeps that bookkeeping.
 *
 * The lock tag is Citus's own (SET_LOCKTAG_COLOCATED_SHARDS_METADATA_RESOURCE
 * of Citus 13 and 14: the shard's index among the table's shards sorted by
 * their hash ranges, and the colocation id); test/citus/repro.py checks
 * that a lock Citus's lock_shard_metadata() takes holds this path back.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/transam.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_namespace.h"
#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "executor/spi.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "nodes/nodeFuncs.h"
#include "nodes/plannodes.h"
#include "nodes/primnodes.h"
#include "nodes/value.h"
#include "storage/lmgr.h"
#include "storage/lock.h"
#include "tcop/pquery.h"
#include "parser/parse_func.h"
#include "utils/builtins.h"
#include "funcapi.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"

#include "compat.h"
#include "store.h"

/* Citus's advisory lock class of a colocated shard's metadata (13, 14) */
#define CITUS_LOCKTAG_COLOCATED_SHARDS_METADATA 8
/* ... and of a shard of a table without a colocation group */
#define CITUS_LOCKTAG_SHARD_METADATA 4
/* application_name of the backends that serve another node's connections */
#define CITUS_INTERNAL_PREFIX "citus_internal gpid="

typedef struct ShardEntry
{
	int64		shardid;
	int32		min;			/* its hash range */
	int32		max;
	bool		local;			/* its only placement is on this node */
	bool		placed_here;	/* it has a placement on this node */
	bool		rels_loaded;	/* rels checked (valid or not) */
	TargetRels	rels;
} ShardEntry;

/* The shards of idempotency.operations, sorted by their hash ranges */
typedef struct ShardMap
{
	bool		valid;			/* read, and nothing changed since */
	bool		usable;			/* the shape the direct path knows */
	Oid			ops_relid;
	Oid			jt_relid;
	Oid			nspid;
	Oid			collation;		/* of operation_key */
	uint32		colocationid;
	int64		jt_shardid;		/* job_types' one shard, placed here */
	int			nshards;
	ShardEntry *shards;			/* in map_cxt */
} ShardMap;

static ShardMap map;
static MemoryContext map_cxt = NULL;
static bool callback_registered = false;
static uint64 map_invalidations = 0;

/* The kept plans of each shard ever chosen here (shardid -> plans) */
typedef struct ShardPlans
{
	int64		shardid;
	StorePlans	plans;
} ShardPlans;

static HTAB *shard_plans = NULL;

/* idempotency.direct_shard_path: off sends every call through Citus */
static bool direct_shard_path = true;

static StorePlans *shard_plans_of(int64 shardid);
static char *shard_statement_text(const Store *s, const char *sql);

/*
 * The local shard store: the plain table store's statements renamed for
 * the shard, and its lookup, role check and purge. (The purges are never
 * chosen here: they read or write many keys, which never go to one shard.)
 */
static const StoreBackend shard_backend = {
	.name = "local shard",
	.set = SET_ONE_NODE,
	.cursor_options = 0,
	.statement_text = shard_statement_text,
	.lookup = idem_one_node_lookup,
	.fenced_role = idem_one_node_fenced_role,
	.purge = idem_one_node_purge,
	.purge_range = idem_one_node_purge_range,
};


static void
map_invalidate(Datum arg pg_attribute_unused(), Oid relid)
{
	map_invalidations++;
	if (relid == InvalidOid || relid == map.ops_relid || relid == map.jt_relid)
	{
		map.valid = false;
		return;
	}
	/* a shard's own relation or index changed: check it again */
	for (int i = 0; i < map.nshards; i++)
	{
		TargetRels *r = &map.shards[i].rels;

		if (map.shards[i].rels_loaded &&
			(relid == r->ops_relid || relid == r->ops_pkey ||
			 relid == r->jt_relid || relid == r->jt_pkey))
			map.shards[i].rels_loaded = r->valid = false;
	}
}

/* The OID of Citus catalog `name` in pg_catalog, or InvalidOid */
static Oid
citus_catalog(const char *name)
{
	return get_relname_relid(name, PG_CATALOG_NAMESPACE);
}

/* Column `name` of `rel`, or an error-free InvalidAttrNumber */
static AttrNumber
catalog_column(Relation rel, const char *name)
{
	return get_attnum(RelationGetRelid(rel), name);
}

/*
 * Read pg_dist_partition's row of `relid`: its method, colocation id and,
 * for a hash-distributed table, the distribution column's Var. False if
 * there is none.
 */
static bool
read_partition(Oid relid, char *method, uint32 *colocationid, Var **partkey)
{
	Relation	rel = table_open(citus_catalog("pg_dist_partition"), AccessShareLock);
	AttrNumber	att_method = catalog_column(rel, "partmethod");
	AttrNumber	att_key = catalog_column(rel, "partkey");
	AttrNumber	att_coloc = catalog_column(rel, "colocationid");
	ScanKeyData skey;
	SysScanDesc scan;
	HeapTuple	tuple;
	bool		found = false;

	ScanKeyInit(&skey, catalog_column(rel, "logicalrelid"), BTEqualStrategyNumber, F_OIDEQ,
				ObjectIdGetDatum(relid));
	scan = systable_beginscan(rel, InvalidOid, false, NULL, 1, &skey);
	tuple = systable_getnext(scan);
	if (HeapTupleIsValid(tuple) && att_method && att_key && att_coloc)
	{
		bool		isnull;
		Datum		d;

		found = true;
		*method = DatumGetChar(idem_catalog_getattr(tuple, att_method, RelationGetDescr(rel), &isnull));
		*colocationid = DatumGetUInt32(idem_catalog_getattr(tuple, att_coloc, RelationGetDescr(rel),
													&isnull));
		d = idem_catalog_getattr(tuple, att_key, RelationGetDescr(rel), &isnull);
		*partkey = NULL;
		if (!isnull)
		{
			Node	   *node = stringToNode(TextDatumGetCString(d));

			if (IsA(node, Var))
				*partkey = (Var *) node;
		}
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return found;
}

/* This node's group id (pg_dist_local_group), or -1 */
static int32
local_group(void)
{
	Relation	rel = table_open(citus_catalog("pg_dist_local_group"), AccessShareLock);
	SysScanDesc scan = systable_beginscan(rel, InvalidOid, false, NULL, 0, NULL);
	HeapTuple	tuple = systable_getnext(scan);
	int32		group = -1;

	if (HeapTupleIsValid(tuple))
	{
		bool		isnull;
		Datum		d = idem_catalog_getattr(tuple, catalog_column(rel, "groupid"),
									 RelationGetDescr(rel), &isnull);

		if (!isnull)
			group = DatumGetInt32(d);
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return group;
}

/* The shards of `relid` (pg_dist_shard), with their ranges if `ranges` */
static List *
read_shards(Oid relid, bool ranges)
{
	Relation	rel = table_open(citus_catalog("pg_dist_shard"), AccessShareLock);
	AttrNumber	att_id = catalog_column(rel, "shardid");
	AttrNumber	att_min = catalog_column(rel, "shardminvalue");
	AttrNumber	att_max = catalog_column(rel, "shardmaxvalue");
	ScanKeyData skey;
	SysScanDesc scan;
	HeapTuple	tuple;
	List	   *shards = NIL;

	ScanKeyInit(&skey, catalog_column(rel, "logicalrelid"), BTEqualStrategyNumber, F_OIDEQ,
				ObjectIdGetDatum(relid));
	scan = systable_beginscan(rel, InvalidOid, false, NULL, 1, &skey);
	while (HeapTupleIsValid(tuple = systable_getnext(scan)))
	{
		ShardEntry *e = palloc0(sizeof(ShardEntry));
		bool		isnull;
		bool		min_null;
		bool		max_null;
		Datum		min;
		Datum		max;

		e->shardid = DatumGetInt64(idem_catalog_getattr(tuple, att_id, RelationGetDescr(rel), &isnull));
		if (ranges)
		{
			min = idem_catalog_getattr(tuple, att_min, RelationGetDescr(rel), &min_null);
			max = idem_catalog_getattr(tuple, att_max, RelationGetDescr(rel), &max_null);
			if (min_null || max_null)
			{
				shards = NIL;	/* not a hash range: no direct path */
				break;
			}
			e->min = pg_strtoint32(TextDatumGetCString(min));
			e->max = pg_strtoint32(TextDatumGetCString(max));
		}
		shards = lappend(shards, e);
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return shards;
}

/*
 * Where are the placements of shard `shardid`: *here if one is on group
 * `group`; true if that is the only one. One scan of pg_dist_placement's
 * shardid index (Citus's own).
 */
static bool
only_placement_on(int64 shardid, int32 group, bool *here)
{
	Relation	rel = table_open(citus_catalog("pg_dist_placement"), AccessShareLock);
	AttrNumber	att_group = catalog_column(rel, "groupid");
	ScanKeyData skey;
	SysScanDesc scan;
	HeapTuple	tuple;
	int			n = 0;

	*here = false;
	ScanKeyInit(&skey, catalog_column(rel, "shardid"), BTEqualStrategyNumber, F_INT8EQ,
				Int64GetDatum(shardid));
	scan = systable_beginscan(rel, get_relname_relid("pg_dist_placement_shardid_index",
													 PG_CATALOG_NAMESPACE),
							  true, NULL, 1, &skey);
	while (HeapTupleIsValid(tuple = systable_getnext(scan)))
	{
		bool		isnull;

		n++;
		if (DatumGetInt32(idem_catalog_getattr(tuple, att_group, RelationGetDescr(rel), &isnull)) == group)
			*here = true;
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return n == 1 && *here;
}

/* Is `group` among the placements of shard `shardid`? */
static bool
placed_on(int64 shardid, int32 group)
{
	Relation	rel = table_open(citus_catalog("pg_dist_placement"), AccessShareLock);
	AttrNumber	att_group = catalog_column(rel, "groupid");
	ScanKeyData skey;
	SysScanDesc scan;
	HeapTuple	tuple;
	bool		here = false;

	ScanKeyInit(&skey, catalog_column(rel, "shardid"), BTEqualStrategyNumber, F_INT8EQ,
				Int64GetDatum(shardid));
	scan = systable_beginscan(rel, InvalidOid, false, NULL, 1, &skey);
	while (HeapTupleIsValid(tuple = systable_getnext(scan)))
	{
		bool		isnull;

		if (DatumGetInt32(idem_catalog_getattr(tuple, att_group, RelationGetDescr(rel), &isnull)) == group)
			here = true;
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return here;
}

static int
compare_ranges(const void *a, const void *b)
{
	int32		x = ((const ShardEntry *) a)->min;
	int32		y = ((const ShardEntry *) b)->min;

	return (x > y) - (x < y);
}

/*
 * Read the map: the shards of operations, which of them have their only
 * placement here, and job_types' shard (a reference table placed here).
 * map.usable is false for any shape the direct path does not know (not
 * hash-distributed by operation_key, job_types not a reference table with
 * a placement here, a shard without a range): then every call takes the
 * Citus path.
 */
static void
map_load(Oid ops_relid, Oid jt_relid)
{
	uint64		start = map_invalidations;
	MemoryContext old;
	char		method;
	uint32		colocationid;
	Var		   *partkey;
	int32		group;
	List	   *shards;
	List	   *jt_shards;
	ListCell   *lc;
	ShardEntry *entries;
	int			i;

	elog(DEBUG1, "idempotency: reading the shard map");
	if (!callback_registered)
	{
		CacheRegisterRelcacheCallback(map_invalidate, (Datum) 0);
		callback_registered = true;
	}
	if (map_cxt == NULL)
		map_cxt = AllocSetContextCreate(TopMemoryContext, "idempotency shard map",
										ALLOCSET_SMALL_SIZES);
	MemoryContextReset(map_cxt);
	memset(&map, 0, sizeof(map));
	map.ops_relid = ops_relid;
	map.jt_relid = jt_relid;
	map.nspid = get_rel_namespace(ops_relid);

	if (!OidIsValid(citus_catalog("pg_dist_shard")) ||
		!OidIsValid(citus_catalog("pg_dist_placement")) ||
		!OidIsValid(citus_catalog("pg_dist_local_group")))
		goto done;

	old = MemoryContextSwitchTo(map_cxt);
	group = local_group();
	if (group < 0 ||
		!read_partition(ops_relid, &method, &colocationid, &partkey) ||
		method != 'h' || partkey == NULL ||
		partkey->varattno != get_attnum(ops_relid, "operation_key") ||
		partkey->vartype != TEXTOID)
	{
		MemoryContextSwitchTo(old);
		goto done;
	}
	map.colocationid = colocationid;
	map.collation = partkey->varcollid;
	if (!read_partition(jt_relid, &method, &colocationid, &partkey) || method != 'n')
	{
		MemoryContextSwitchTo(old);
		goto done;
	}

	jt_shards = read_shards(jt_relid, false);
	shards = read_shards(ops_relid, true);
	if (list_length(jt_shards) != 1 || shards == NIL ||
		!placed_on(((ShardEntry *) linitial(jt_shards))->shardid, group))
	{
		MemoryContextSwitchTo(old);
		goto done;
	}
	map.jt_shardid = ((ShardEntry *) linitial(jt_shards))->shardid;
	entries = palloc0(sizeof(ShardEntry) * list_length(shards));
	i = 0;
	foreach(lc, shards)
		entries[i++] = *(ShardEntry *) lfirst(lc);
	qsort(entries, i, sizeof(ShardEntry), compare_ranges);
	for (i = 0; i < list_length(shards); i++)
		entries[i].local = only_placement_on(entries[i].shardid, group,
											 &entries[i].placed_here);
	MemoryContextSwitchTo(old);
	map.shards = entries;
	map.nshards = list_length(shards);
	map.usable = true;

done:
	map.valid = (map_invalidations == start);
}

/* The position of the shard whose range holds `hash`, or -1 */
static int
find_shard(int32 hash)
{
	int			lo = 0;
	int			hi = map.nshards - 1;

	while (lo <= hi)
	{
		int			mid = lo + (hi - lo) / 2;
		ShardEntry *e = &map.shards[mid];

		if (hash < e->min)
			hi = mid - 1;
		else if (hash > e->max)
			lo = mid + 1;
		else
			return mid;
	}
	return -1;
}

/* The position of `key`'s shard, hashed as Citus hashes it, or -1 */
static int
key_shard(text *key)
{
	return find_shard(DatumGetInt32(DirectFunctionCall1Coll(hashtext, map.collation,
															PointerGetDatum(key))));
}

/* Does this backend serve another node's connection (Citus's own)? */
static bool
citus_internal_backend(void)
{
	return application_name != NULL &&
		strncmp(application_name, CITUS_INTERNAL_PREFIX, strlen(CITUS_INTERNAL_PREFIX)) == 0;
}

/*
 * count_calls(): how many calls of functions that are not built in an
 * expression makes, a call of one of the extension's own counting 1 and
 * any other (or a subquery, or an operator that is not built in) many.
 */
static bool
count_calls(Node *node, int *calls)
{
	if (node == NULL)
		return false;
	if (IsA(node, FuncExpr))
	{
		Oid			fn = ((FuncExpr *) node)->funcid;

		if (fn >= FirstNormalObjectId)
			*calls += get_func_namespace(fn) == map.nspid ? 1 : 100;
	}
	else if (IsA(node, OpExpr) || IsA(node, DistinctExpr) || IsA(node, NullIfExpr))
	{
		if (((OpExpr *) node)->opno >= FirstNormalObjectId)
			*calls += 100;
	}
	else if (IsA(node, ScalarArrayOpExpr))
	{
		if (((ScalarArrayOpExpr *) node)->opno >= FirstNormalObjectId)
			*calls += 100;
	}
	else if (IsA(node, SubLink) || IsA(node, SubPlan) || IsA(node, AlternativeSubPlan) ||
			 IsA(node, Aggref) || IsA(node, WindowFunc))
		*calls += 100;
	return expression_tree_walker(node, count_calls, calls);
}

/*
 * Is the statement being executed nothing but one call of one of the
 * extension's functions (SELECT * FROM f(...), SELECT f(...)): no other
 * relation, no subquery, no function or operator that is not built in?
 * Then nothing in its transaction but this call can write, here or on
 * another node.
 */
static bool
statement_is_one_call(void)
{
	PlannedStmt *stmt;
	Plan	   *plan;
	int			calls = 0;

	if (ActivePortal == NULL || list_length(ActivePortal->stmts) != 1)
		return false;
	stmt = (PlannedStmt *) linitial(ActivePortal->stmts);
	if (!IsA(stmt, PlannedStmt) || stmt->commandType != CMD_SELECT ||
		stmt->utilityStmt != NULL || stmt->subplans != NIL || list_length(stmt->rtable) > 1)
		return false;
	plan = stmt->planTree;
	if (plan == NULL || plan->righttree != NULL || plan->initPlan != NIL)
		return false;
	if (IsA(plan, ProjectSet))
	{
		/* SELECT f(...) of a set-returning f: over a Result of nothing */
		(void) count_calls((Node *) plan->targetlist, &calls);
		plan = plan->lefttree;
		if (plan == NULL || !IsA(plan, Result) || plan->initPlan != NIL)
			return false;
	}
	if (plan->lefttree != NULL || plan->righttree != NULL ||
		(!IsA(plan, Result) && !IsA(plan, FunctionScan)))
		return false;
	(void) count_calls((Node *) plan->targetlist, &calls);
	(void) count_calls((Node *) plan->qual, &calls);
	if (IsA(plan, Result))
		(void) count_calls(((Result *) plan)->resconstantqual, &calls);
	else
		(void) count_calls((Node *) ((FunctionScan *) plan)->functions, &calls);
	return calls == 1;
}

/*
 * May this call work on its key's shard directly, as far as Citus's
 * transaction bookkeeping goes (see the top of this file)?
 */
static bool
direct_allowed(void)
{
	return citus_internal_backend() || (!IsTransactionBlock() && statement_is_one_call());
}

/* The relations of shard e (and job_types' shard), checked once */
static const TargetRels *
shard_rels(ShardEntry *e)
{
	if (!e->rels_loaded)
	{
		char		name[NAMEDATALEN * 2];
		Oid			ops;
		Oid			ops_pkey;
		Oid			jt;
		Oid			jt_pkey;

		snprintf(name, sizeof(name), "operations_" INT64_FORMAT, e->shardid);
		ops = get_relname_relid(name, map.nspid);
		snprintf(name, sizeof(name), "operations_pkey_" INT64_FORMAT, e->shardid);
		ops_pkey = get_relname_relid(name, map.nspid);
		snprintf(name, sizeof(name), "job_types_" INT64_FORMAT, map.jt_shardid);
		jt = get_relname_relid(name, map.nspid);
		snprintf(name, sizeof(name), "job_types_pkey_" INT64_FORMAT, map.jt_shardid);
		jt_pkey = get_relname_relid(name, map.nspid);
		(void) idem_rels_load(&e->rels, ops, ops_pkey, jt, jt_pkey);
		e->rels_loaded = true;
	}
	return e->rels.valid ? &e->rels : NULL;
}

/*
 * May this call work on its key's shard directly (see the top of this
 * file)? If so, fills *s with the local shard store and returns true,
 * holding the shard's metadata lock; otherwise leaves *s alone (the
 * caller takes the routed store).
 */
bool
idem_shard_store(Oid ops_relid, Oid jt_relid, text *key, Store *s)
{
	int			tries;

	if (!direct_shard_path)
		return false;

	for (tries = 0; tries < 3; tries++)
	{
		int			i;
		int64		shardid;
		LOCKTAG		tag;

		if (!map.valid || map.ops_relid != ops_relid || map.jt_relid != jt_relid)
			map_load(ops_relid, jt_relid);
		if (!map.usable || (tries == 0 && !direct_allowed()))
			return false;
		i = key_shard(key);
		if (i < 0 || !map.shards[i].local)
		{
			/*
			 * The coordinator sent this call here because this node held
			 * the key's shard; it does no longer (a move, split or
			 * rebalance committed meanwhile), and Citus refuses to route a
			 * statement from inside a delegated call. Say so, retryably,
			 * before anything is read or written.
			 */
			if (citus_internal_backend() && (i < 0 || !map.shards[i].placed_here))
				ereport(ERROR,
						(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
						 errmsg("the shard of operation \"%s\" is no longer on this node",
								idem_text(key)),
						 errdetail("Citus sent the call to the node that held the key's shard, which moved meanwhile (a shard move, split or rebalance committed). Nothing was recorded."),
						 errhint("Retry the call, or the whole transaction: it reaches the shard's new node.")));
			return false;
		}
		shardid = map.shards[i].shardid;

		/* the lock Citus's routed writes take; moves and splits wait */
		if (map.colocationid != 0)
			SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, (uint32) i, map.colocationid,
								 CITUS_LOCKTAG_COLOCATED_SHARDS_METADATA);
		else
			SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, (uint32) (shardid >> 32), (uint32) shardid,
								 CITUS_LOCKTAG_SHARD_METADATA);
		(void) LockAcquire(&tag, ShareLock, false, false);
		AcceptInvalidationMessages();

		/*
		 * Nothing changed while we waited: the placement is here and stays
		 * until this transaction ends. Else read the map again and check.
		 */
		if (map.valid)
		{
			s->backend = &shard_backend;
			s->plans = shard_plans_of(shardid);
			s->shardid = shardid;
			s->jt_shardid = map.jt_shardid;
			s->rels = shard_rels(&map.shards[i]);
			return true;
		}
	}
	return false;
}

/*
 * The place of `key`'s shard among the shards of idempotency.operations
 * (sorted by their hash ranges), or -1 where this node does not know the
 * map (not the shape the direct path knows): how a batch on the routed
 * store groups its keys (store_citus.c). No lock: Citus routes the batch's
 * statements; a group whose keys a split or move has since parted is
 * routed to each of their shards all the same.
 */
int64
idem_shard_of(Oid ops_relid, Oid jt_relid, text *key)
{
	if (!map.valid || map.ops_relid != ops_relid || map.jt_relid != jt_relid)
		map_load(ops_relid, jt_relid);
	if (!map.usable)
		return -1;
	return key_shard(key);
}

/*
 * The kept plans of shard `shardid`'s statements (NULL until prepared).
 * Never freed: a backend has at most one set per shard it ever worked on,
 * and a plan of a shard that moved away is never used again.
 */
static StorePlans *
shard_plans_of(int64 shardid)
{
	ShardPlans *entry;
	bool		found;

	if (shard_plans == NULL)
	{
		HASHCTL		ctl;

		ctl.keysize = sizeof(int64);
		ctl.entrysize = sizeof(ShardPlans);
		shard_plans = hash_create("idempotency shard plans", 64, &ctl,
								  HASH_ELEM | HASH_BLOBS);
	}
	entry = hash_search(shard_plans, &shardid, HASH_ENTER, &found);
	if (!found)
		memset(&entry->plans, 0, sizeof(entry->plans));
	return &entry->plans;
}

/*
 * A statement's text for the store's shard: idempotency.operations and
 * job_types replaced by their shards, the primary key's constraint by the
 * shard's.
 */
static char *
shard_statement_text(const Store *s, const char *sql)
{
	static const char *const names[] = {
		"idempotency.operations", "idempotency.job_types", "ON CONSTRAINT operations_pkey"
	};
	StringInfoData buf;
	const char *p = sql;

	initStringInfo(&buf);
	while (*p)
	{
		int			n;

		for (n = 0; n < (int) lengthof(names); n++)
		{
			size_t		len = strlen(names[n]);

			/* the whole name: not idempotency.operation_status, say */
			if (strncmp(p, names[n], len) == 0 &&
				!(isalnum((unsigned char) p[len]) || p[len] == '_'))
			{
				appendStringInfo(&buf, "%s_" INT64_FORMAT, names[n],
								 n == 1 ? s->jt_shardid : s->shardid);
				p += len;
				break;
			}
		}
		if (n == (int) lengthof(names))
			appendStringInfoChar(&buf, *p++);
	}
	return buf.data;
}

/* The local shard store's setting */
void
idem_shard_define_settings(void)
{
	DefineCustomBoolVariable("idempotency.direct_shard_path",
							 "Where Citus manages the tables, a call on the node holding its key's shard works on the shard directly.",
							 "Off: every call goes through Citus's planner and its local execution, the path of earlier versions.",
							 &direct_shard_path, true, PGC_USERSET, 0, NULL, NULL, NULL);
}
