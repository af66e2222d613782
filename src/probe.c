/*-------------------------------------------------------------------------
 *
 * probe.c
 *	  The two hot paths below SPI: the primary-key probe of
 *	  claim_operation() and the update of complete_operation().
 *
 * Most claims meet either no record (the run path) or a completed one (the
 * duplicate path). Both are decided by one lookup in
 * idempotency.operations_pkey, done here with an index scan under the
 * statement's snapshot (GetTransactionSnapshot(): a new one per call under
 * READ COMMITTED, the transaction's under REPEATABLE READ and SERIALIZABLE,
 * as SPI would take; the heap and index access take the same predicate
 * locks as the executor's). A completed record is final, so its verdict
 * needs nothing else: no SPI connection, no user switch, no plan. No record:
 * the caller inserts at once. Anything else goes the SPI way.
 *
 * complete_operation() finds the record the same way and, when it is
 * claimed or skipped under the caller's attempt, updates it with
 * table_tuple_update(), as the executor's UPDATE would (HOT when it can;
 * otherwise the primary key gets its entry for the new version). Every
 * other outcome goes the SPI way, which re-reads, decides and explains:
 * another attempt or state, a concurrent update (TM_Updated: under READ
 * COMMITTED the SPI statement follows the update chain, under REPEATABLE
 * READ and SERIALIZABLE it raises the serialization failure), and a table
 * the fast path does not cover: one with triggers, rules, CHECK
 * constraints, row level security, stored generated columns or a second
 * index (all of which the executor maintains and this code does not), and a
 * NULL result where a DBA made the column NOT NULL. A table published for
 * UPDATE without a replica identity gets the executor's own error
 * (CheckCmdReplicaIdentity()). The cache records only a schema whose
 * columns have the types this code reads and writes and whose primary keys
 * are the columns it scans; any other (a superuser's ALTER TABLE) leaves
 * every call to SPI, whose statements cast what they read.
 *
 * Since 0.2 both also read the job type's worker_role (one more primary-key
 * lookup, in idempotency.job_types) when the call comes through a 0.2
 * definition; a caller who may not work the job type goes the SPI way,
 * whose lookup raises the error.
 *
 * A table that Citus manages is an empty shell on the node where the call
 * runs (its rows live in shards): then neither path is used, and every
 * call goes through SPI, whose statements Citus routes (citus_managed()).
 *
 * No privilege is checked here, as none is in the SPI path (which runs as
 * the table owner): EXECUTE on the function is the permission. The
 * relations' and attributes' numbers and the enum labels' OIDs are cached
 * per backend and forgotten on any relcache invalidation of the tables or
 * their primary keys (DROP/CREATE/ALTER EXTENSION, ALTER TABLE).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/relation.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/index.h"
#include "catalog/namespace.h"
#include "catalog/pg_am.h"
#include "catalog/pg_class.h"
#include "catalog/pg_enum.h"
#include "catalog/pg_index.h"
#include "catalog/pg_namespace.h"
#include "catalog/pg_type.h"
#include "executor/executor.h"
#include "executor/spi.h"
#include "executor/tuptable.h"
#include "miscadmin.h"
#include "nodes/pg_list.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"

#include "compat.h"
#include "idempotency.h"

typedef struct ProbeCache
{
	bool		valid;
	Oid			ops_relid;		/* idempotency.operations */
	Oid			ops_pkey;
	Oid			jt_relid;		/* idempotency.job_types */
	Oid			jt_pkey;
	AttrNumber	att_status;
	AttrNumber	att_attempt;
	AttrNumber	att_completed_at;
	AttrNumber	att_fingerprint;
	AttrNumber	att_result;
	AttrNumber	att_worker_role;	/* InvalidAttrNumber before 0.2 */
	Oid			claimed;		/* pg_enum OIDs of the statuses */
	Oid			completed;
	Oid			skipped;
	bool		citus;			/* Citus manages a table: no fast path */
	bool		settled;		/* not valid, but for a reason that stays:
								 * Citus; reloaded after an invalidation */
} ProbeCache;

static ProbeCache cache;
static bool callback_registered = false;

/* bumped by every relcache invalidation; see probe_load() */
static uint64 invalidations = 0;

static void
probe_invalidate(Datum arg pg_attribute_unused(), Oid relid)
{
	invalidations++;
	if (relid == InvalidOid ||
		relid == cache.ops_relid || relid == cache.ops_pkey ||
		relid == cache.jt_relid || relid == cache.jt_pkey)
		cache.valid = cache.settled = false;
}

static Oid
enum_label(Oid type, const char *label)
{
	HeapTuple	tuple = SearchSysCache2(ENUMTYPOIDNAME, ObjectIdGetDatum(type),
										CStringGetDatum(label));
	Oid			oid = InvalidOid;

	if (HeapTupleIsValid(tuple))
	{
		oid = ((Form_pg_enum) GETSTRUCT(tuple))->oid;
		ReleaseSysCache(tuple);
	}
	return oid;
}

/* The number of column `name` of `relid` if it has type `type`, else 0 */
static AttrNumber
column(Oid relid, const char *name, Oid type)
{
	AttrNumber	attnum = get_attnum(relid, name);

	if (attnum == InvalidAttrNumber || get_atttype(relid, attnum) != type)
		return InvalidAttrNumber;
	return attnum;
}

/* Is `indexid` a valid unique btree index on exactly these columns? */
static bool
unique_index_on(Oid indexid, AttrNumber first, AttrNumber second)
{
	HeapTuple	tuple = SearchSysCache1(INDEXRELID, ObjectIdGetDatum(indexid));
	Form_pg_index index;
	bool		ok;

	if (!HeapTupleIsValid(tuple))
		return false;
	index = (Form_pg_index) GETSTRUCT(tuple);
	ok = index->indisunique && index->indisvalid && index->indisready &&
		index->indnkeyatts == (second ? 2 : 1) &&
		index->indkey.values[0] == first &&
		(second == InvalidAttrNumber || index->indkey.values[1] == second) &&
		heap_attisnull(tuple, Anum_pg_index_indexprs, NULL) &&
		heap_attisnull(tuple, Anum_pg_index_indpred, NULL);
	ReleaseSysCache(tuple);
	if (!ok)
		return false;

	tuple = SearchSysCache1(RELOID, ObjectIdGetDatum(indexid));
	if (!HeapTupleIsValid(tuple))
		return false;
	ok = ((Form_pg_class) GETSTRUCT(tuple))->relam == BTREE_AM_OID;
	ReleaseSysCache(tuple);
	return ok;
}

/*
 * Does Citus manage `relid` (a row in pg_dist_partition, whatever its
 * distribution method)? False where Citus is not installed. Citus sends a
 * relcache invalidation of a table when it changes the table's metadata,
 * so the cache is rebuilt after distribution (probe_invalidate()).
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
 * Fill the cache; false if the schema is not what this code expects (then
 * every call goes the SPI way, which works with whatever a superuser made
 * of the tables, or says why not). The catalogs are read without locks:
 * the fast paths lock the table before they use the cache, which processes
 * every invalidation that arrived meanwhile. One that arrives while the
 * cache is being filled is caught by the counter.
 */
static bool
probe_load(void)
{
	uint64		start = invalidations;
	Oid			nspid;
	Oid			status_type;
	AttrNumber	att_job_type;
	AttrNumber	att_key;
	AttrNumber	att_jt_job_type;

	if (!callback_registered)
	{
		CacheRegisterRelcacheCallback(probe_invalidate, (Datum) 0);
		callback_registered = true;
	}
	memset(&cache, 0, sizeof(cache));
	nspid = get_namespace_oid("idempotency", true);
	if (!OidIsValid(nspid))
		return false;
	cache.ops_relid = get_relname_relid("operations", nspid);
	cache.ops_pkey = get_relname_relid("operations_pkey", nspid);
	cache.jt_relid = get_relname_relid("job_types", nspid);
	cache.jt_pkey = get_relname_relid("job_types_pkey", nspid);
	if (!OidIsValid(cache.ops_relid) || !OidIsValid(cache.ops_pkey) ||
		!OidIsValid(cache.jt_relid) || !OidIsValid(cache.jt_pkey))
		return false;

	/*
	 * A table that Citus manages (distributed, reference or Citus local) is
	 * an empty shell here: its records are in shards, which SPI's
	 * statements reach and these scans would not.
	 */
	cache.citus = citus_managed(cache.ops_relid) || citus_managed(cache.jt_relid);
	if (cache.citus)
	{
		/*
		 * Kept until the tables change (Citus sends their relcache
		 * invalidation when it changes their metadata): every call on a
		 * distributed install would otherwise load the cache again.
		 */
		cache.settled = (invalidations == start);
		return false;
	}

	/* the columns the fast paths read or write, with the types they assume */
	att_job_type = column(cache.ops_relid, "job_type", TEXTOID);
	att_key = column(cache.ops_relid, "operation_key", TEXTOID);
	cache.att_status = get_attnum(cache.ops_relid, "status");
	cache.att_attempt = column(cache.ops_relid, "attempt", INT4OID);
	cache.att_completed_at = column(cache.ops_relid, "completed_at", TIMESTAMPTZOID);
	cache.att_fingerprint = column(cache.ops_relid, "fingerprint", TEXTOID);
	cache.att_result = column(cache.ops_relid, "result", JSONBOID);
	att_jt_job_type = column(cache.jt_relid, "job_type", TEXTOID);
	if (att_job_type == InvalidAttrNumber || att_key == InvalidAttrNumber ||
		cache.att_status == InvalidAttrNumber || cache.att_attempt == InvalidAttrNumber ||
		cache.att_completed_at == InvalidAttrNumber ||
		cache.att_fingerprint == InvalidAttrNumber || cache.att_result == InvalidAttrNumber ||
		att_jt_job_type == InvalidAttrNumber)
		return false;
	/* absent before 0.2; of another type, the fast paths leave roles to SPI */
	cache.att_worker_role = get_attnum(cache.jt_relid, "worker_role");
	if (cache.att_worker_role != InvalidAttrNumber &&
		get_atttype(cache.jt_relid, cache.att_worker_role) != REGROLEOID)
		return false;

	/* the scans' keys are the primary keys' columns, in this order */
	if (!unique_index_on(cache.ops_pkey, att_job_type, att_key) ||
		!unique_index_on(cache.jt_pkey, att_jt_job_type, InvalidAttrNumber))
		return false;

	status_type = get_atttype(cache.ops_relid, cache.att_status);
	if (get_typtype(status_type) != TYPTYPE_ENUM)
		return false;
	cache.claimed = enum_label(status_type, "claimed");
	cache.completed = enum_label(status_type, "completed");
	cache.skipped = enum_label(status_type, "skipped");
	if (!OidIsValid(cache.claimed) || !OidIsValid(cache.completed) ||
		!OidIsValid(cache.skipped))
		return false;

	cache.valid = (invalidations == start);
	return cache.valid;
}

/*
 * Are the fast paths usable? Loads the cache unless it is current (valid,
 * or settled on "no").
 */
static bool
probe_ready(void)
{
	if (!cache.valid && !cache.settled)
		probe_load();
	return cache.valid;
}

/*
 * An index scan of one primary key (text columns) for one key; the caller
 * fetches with index_getnext_slot() and ends with end_lookup().
 */
typedef struct Lookup
{
	Relation	idx;
	IndexScanDesc scan;
	TupleTableSlot *slot;
} Lookup;

static void
begin_lookup(Lookup *l, Relation rel, Oid indexid, LOCKMODE lockmode,
			 Snapshot snapshot, text *key1, text *key2)
{
	ScanKeyData skey[2];
	int			nkeys = key2 ? 2 : 1;

	l->idx = index_open(indexid, lockmode);
	ScanKeyEntryInitialize(&skey[0], 0, 1, BTEqualStrategyNumber, InvalidOid,
						   l->idx->rd_indcollation[0], F_TEXTEQ,
						   PointerGetDatum(key1));
	if (key2)
		ScanKeyEntryInitialize(&skey[1], 0, 2, BTEqualStrategyNumber, InvalidOid,
							   l->idx->rd_indcollation[1], F_TEXTEQ,
							   PointerGetDatum(key2));
	l->scan = idem_index_beginscan(rel, l->idx, snapshot, nkeys, 0);
	index_rescan(l->scan, skey, nkeys, NULL, 0);
	l->slot = table_slot_create(rel, NULL);
}

static void
end_lookup(Lookup *l)
{
	ExecDropSingleTupleTableSlot(l->slot);
	index_endscan(l->scan);
	index_close(l->idx, NoLock);
}

/*
 * May `caller` (the user who called the function, not the table owner
 * whose rights an SPI connection runs with) work this job type? True when
 * the call does not check worker roles, when the schema has no worker_role
 * (0.1), when it is NULL, and when the caller has the role's privileges.
 * False also when the job type is not there: the SPI path raises the error
 * in every false case.
 */
static bool
may_work(Oid caller, bool worker_roles, text *job_type, Snapshot snapshot)
{
	Relation	rel;
	Lookup		l;
	bool		ok = false;

	if (!worker_roles || cache.att_worker_role == InvalidAttrNumber)
		return true;

	/* gone (a concurrent DROP EXTENSION) or changed: the SPI way says why */
	rel = try_relation_open(cache.jt_relid, AccessShareLock);
	if (rel == NULL)
		return false;
	if (!cache.valid)
	{
		relation_close(rel, AccessShareLock);
		return false;
	}
	begin_lookup(&l, rel, cache.jt_pkey, AccessShareLock, snapshot, job_type, NULL);
	if (index_getnext_slot(l.scan, ForwardScanDirection, l.slot))
	{
		bool		isnull;
		Datum		role = slot_getattr(l.slot, cache.att_worker_role, &isnull);

		ok = idem_role_may_work(caller, isnull ? InvalidOid : DatumGetObjectId(role));
	}
	end_lookup(&l);
	table_close(rel, NoLock);
	return ok;
}

/*
 * Does the fast update cover this table? Not when the executor would do
 * more than update the heap and the primary key.
 */
static bool
plain_table(Relation rel)
{
	TupleConstr *constr = rel->rd_att->constr;
	List	   *indexes;
	bool		plain;

	if (rel->trigdesc != NULL || rel->rd_rel->relrowsecurity || rel->rd_rules != NULL ||
		(constr != NULL && (constr->num_check > 0 || constr->has_generated_stored)))
		return false;
	indexes = RelationGetIndexList(rel);
	plain = list_length(indexes) == 1 && linitial_oid(indexes) == cache.ops_pkey;
	list_free(indexes);
	return plain;
}

/*
 * Open idempotency.operations for a probe (AccessShareLock) or for the fast
 * update (RowExclusiveLock, and only if plain_table() says the fast update
 * covers it). NULL when the SPI path must do the work instead.
 */
static Relation
open_operations(LOCKMODE lockmode, bool for_update)
{
	Relation	rel;

	if (!probe_ready())
		return NULL;
	/* gone (a concurrent DROP EXTENSION): the SPI way says why */
	rel = try_relation_open(cache.ops_relid, lockmode);
	if (rel == NULL)
		return NULL;
	/* changed while we waited for the lock, or not plain enough */
	if (!cache.valid || (for_update && !plain_table(rel)))
	{
		relation_close(rel, lockmode);
		return NULL;
	}
	/* published without a replica identity: the executor's error */
	if (for_update)
		CheckCmdReplicaIdentity(rel, CMD_UPDATE);
	return rel;
}

/*
 * Look up one record under a new statement snapshot, after making this
 * transaction's own earlier changes visible, as SPI would. Returns the
 * snapshot; end_record_lookup() releases it, the scan and the table.
 */
static Snapshot
begin_record_lookup(Lookup *l, Relation rel, LOCKMODE lockmode, text *job_type, text *key)
{
	Snapshot	snapshot;

	CommandCounterIncrement();
	snapshot = RegisterSnapshot(GetTransactionSnapshot());
	begin_lookup(l, rel, cache.ops_pkey, lockmode, snapshot, job_type, key);
	return snapshot;
}

static void
end_record_lookup(Lookup *l, Snapshot snapshot, Relation rel)
{
	end_lookup(l);
	UnregisterSnapshot(snapshot);
	table_close(rel, NoLock);
}

/*
 * claim_operation()'s probe. PROBE_COMPLETED fills *attempt and *result (a
 * detoasted copy in the caller's memory context); PROBE_ABSENT: no record
 * is visible; PROBE_OTHER: anything else (another status, a different
 * fingerprint, a caller who may not work the job type, a schema this code
 * does not know), for the SPI path to decide and explain.
 */
ProbeResult
idem_probe(Oid caller, bool worker_roles, text *job_type, text *key, text *fingerprint,
		   int32 *attempt, Datum *result, bool *result_isnull)
{
	Relation	rel;
	Lookup		l;
	Snapshot	snapshot;
	ProbeResult r = PROBE_ABSENT;

	rel = open_operations(AccessShareLock, false);
	if (rel == NULL)
		return PROBE_OTHER;
	snapshot = begin_record_lookup(&l, rel, AccessShareLock, job_type, key);

	if (index_getnext_slot(l.scan, ForwardScanDirection, l.slot))
	{
		bool		isnull;
		Datum		status = slot_getattr(l.slot, cache.att_status, &isnull);
		Datum		fp = slot_getattr(l.slot, cache.att_fingerprint, &isnull);

		r = PROBE_OTHER;
		if (DatumGetObjectId(status) == cache.completed &&
			(fingerprint == NULL || isnull || idem_same_text(fingerprint, DatumGetTextPP(fp))) &&
			may_work(caller, worker_roles, job_type, snapshot))
		{
			Datum		res;

			*attempt = DatumGetInt32(slot_getattr(l.slot, cache.att_attempt, &isnull));
			res = slot_getattr(l.slot, cache.att_result, result_isnull);
			if (!*result_isnull)
				*result = PointerGetDatum(PG_DETOAST_DATUM_COPY(res));
			r = PROBE_COMPLETED;
		}
	}

	end_record_lookup(&l, snapshot, rel);
	return r;
}

/*
 * Does Citus manage the extension's tables? Then the claim inserts with
 * INSERT ... VALUES, which Citus routes to one shard (see claim.c).
 */
bool
idem_citus(void)
{
	probe_ready();
	return cache.citus;
}

/*
 * claim_operation(wait => false): does another transaction have an
 * uncommitted change of this key's record (its insert, an update, a
 * delete), which a write of the record would wait for? Read with a dirty
 * snapshot, as the executor's own check of a unique index does; sets
 * *attempt to that version's attempt. False also when the fast paths do not
 * cover the schema: the write then raises 55P03 instead of waiting (see
 * claim_operation_common()).
 */
bool
idem_key_busy(text *job_type, text *key, int32 *attempt)
{
	Relation	rel;
	Lookup		l;
	SnapshotData dirty;
	bool		busy = false;

	rel = open_operations(AccessShareLock, false);
	if (rel == NULL)
		return false;
	InitDirtySnapshot(dirty);
	begin_lookup(&l, rel, cache.ops_pkey, AccessShareLock, &dirty, job_type, key);
	while (index_getnext_slot(l.scan, ForwardScanDirection, l.slot))
	{
		/* set by the visibility check of the version just returned */
		if (TransactionIdIsValid(dirty.xmin) || TransactionIdIsValid(dirty.xmax))
		{
			bool		isnull;

			*attempt = DatumGetInt32(slot_getattr(l.slot, cache.att_attempt, &isnull));
			busy = true;
			break;
		}
	}
	end_lookup(&l);
	table_close(rel, NoLock);
	return busy;
}

/*
 * complete_operation()'s common case: the record is claimed or skipped
 * under this attempt; make it completed. True when done; false when the
 * SPI path must decide (see the top of this file).
 */
bool
idem_fast_complete(Oid caller, bool worker_roles, text *job_type, text *key, int32 attempt,
				   Datum result, bool result_isnull)
{
	Relation	rel;
	Lookup		l;
	Snapshot	snapshot;
	bool		done = false;

	rel = open_operations(RowExclusiveLock, true);
	if (rel == NULL)
		return false;
	snapshot = begin_record_lookup(&l, rel, RowExclusiveLock, job_type, key);

	if (index_getnext_slot(l.scan, ForwardScanDirection, l.slot))
	{
		bool		isnull;
		Oid			status = DatumGetObjectId(slot_getattr(l.slot, cache.att_status, &isnull));
		int32		current = DatumGetInt32(slot_getattr(l.slot, cache.att_attempt, &isnull));

		/*
		 * A NULL result into a column a DBA made NOT NULL: the executor's
		 * check (23502) is the SPI path's. (completed_at is never NULL
		 * here; the columns not written keep what the record has.)
		 */
		if (current == attempt &&
			(status == cache.claimed || status == cache.skipped) &&
			!(result_isnull && TupleDescAttr(RelationGetDescr(rel), cache.att_result - 1)->attnotnull) &&
			may_work(caller, worker_roles, job_type, snapshot))
		{
			TupleDesc	desc = RelationGetDescr(rel);
			TupleTableSlot *newslot = MakeSingleTupleTableSlot(desc, &TTSOpsVirtual);
			ItemPointerData tid = l.slot->tts_tid;
			TM_FailureData tmfd;
			LockTupleMode lockmode;
			bool		update_indexes;

			/* the record as it is, with status, completed_at and result set */
			slot_getallattrs(l.slot);
			ExecClearTuple(newslot);
			memcpy(newslot->tts_values, l.slot->tts_values, desc->natts * sizeof(Datum));
			memcpy(newslot->tts_isnull, l.slot->tts_isnull, desc->natts * sizeof(bool));
			newslot->tts_values[cache.att_status - 1] = ObjectIdGetDatum(cache.completed);
			newslot->tts_values[cache.att_completed_at - 1] =
				TimestampTzGetDatum(GetCurrentTimestamp());
			newslot->tts_isnull[cache.att_completed_at - 1] = false;
			newslot->tts_values[cache.att_result - 1] = result;
			newslot->tts_isnull[cache.att_result - 1] = result_isnull;
			ExecStoreVirtualTuple(newslot);

			/* waits for a concurrent updater; TM_Updated etc.: the SPI way */
			if (idem_table_tuple_update(rel, &tid, newslot, GetCurrentCommandId(true),
										snapshot, InvalidSnapshot, true,
										&tmfd, &lockmode, &update_indexes) == TM_Ok)
			{
				if (update_indexes)
				{
					/* not HOT: the new version needs its primary-key entry */
					IndexInfo  *ii = BuildIndexInfo(l.idx);
					Datum		ivalues[INDEX_MAX_KEYS];
					bool		inulls[INDEX_MAX_KEYS];

					FormIndexDatum(ii, newslot, NULL, ivalues, inulls);
					index_insert(l.idx, ivalues, inulls, &newslot->tts_tid, rel,
								 UNIQUE_CHECK_YES, true, ii);
				}
				done = true;
			}
			ExecDropSingleTupleTableSlot(newslot);
		}
	}

	end_record_lookup(&l, snapshot, rel);
	return done;
}
