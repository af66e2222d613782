/*-------------------------------------------------------------------------
 *
 * heap.c
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
 * the fast path does not cover: one with triggers (but the check of the
 * foreign key distribute() adds), rules, CHECK constraints, row level
 * security, generated columns or a second index (all of which the executor
 * maintains and this code does not), and a NULL result where a DBA made the
 * column NOT NULL; fast_update_covers() lists them all. A table published
 * for UPDATE without a replica identity gets the executor's own error
 * (CheckCmdReplicaIdentity()). The cache records only a schema whose
 * columns have the types this code reads and writes and whose primary keys
 * are the columns it scans; any other (a superuser's ALTER TABLE) leaves
 * every call to SPI, whose statements cast what they read.
 *
 * When the caller's capabilities include worker roles, both also read the
 * job type's worker_role (one more primary-key lookup, in job_types); a
 * caller who may not work the job type goes the SPI way, whose lookup
 * raises the error. The keys of a batch share the table's opening, one
 * scan of its primary key and that lookup (HeapBatch,
 * idem_heap_batch_begin()).
 *
 * Both work on the relations a store gives them (store.h): the extension's
 * own tables, or one shard of each where the local shard store holds the
 * key. A store without them (NULL) has no direct path: every call goes the
 * SPI way.
 *
 * No privilege is checked here, as none is in the SPI path (which runs as
 * the table owner): EXECUTE on the function is the permission. The
 * relations' and attributes' numbers and the enum labels' OIDs are cached
 * per backend by the stores and forgotten on any relcache invalidation of
 * the tables or their primary keys (DROP/CREATE/ALTER EXTENSION, ALTER
 * TABLE).
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
#include "catalog/pg_constraint.h"
#include "catalog/pg_enum.h"
#include "catalog/pg_index.h"
#include "catalog/pg_namespace.h"
#include "catalog/pg_type.h"
#include "executor/executor.h"
#include "executor/spi.h"
#include "executor/tuptable.h"
#include "miscadmin.h"
#include "nodes/pg_list.h"
#include "utils/array.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"

#include "compat.h"
#include "store.h"

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
 * Check that a pair of relations (idempotency.operations and job_types, or
 * a shard of each) has the shape the fast paths assume, and note their
 * numbers in *r: the columns they read or write with the types they assume,
 * primary keys on exactly the columns they scan, the status enum's labels.
 * False if not (then every call goes the SPI way, which works with
 * whatever a superuser made of the tables, or says why not). The catalogs
 * are read without locks: the fast paths lock a table before they use
 * these numbers, which processes every invalidation that arrived
 * meanwhile; the callers catch one that arrives while this runs.
 */
bool
idem_rels_load(TargetRels *r, Oid ops_relid, Oid ops_pkey, Oid jt_relid, Oid jt_pkey)
{
	Oid			status_type;
	AttrNumber	att_key;
	AttrNumber	att_jt_job_type;

	memset(r, 0, sizeof(*r));
	r->ops_relid = ops_relid;
	r->ops_pkey = ops_pkey;
	r->jt_relid = jt_relid;
	r->jt_pkey = jt_pkey;
	if (!OidIsValid(ops_relid) || !OidIsValid(ops_pkey) ||
		!OidIsValid(jt_relid) || !OidIsValid(jt_pkey))
		return false;

	r->att_job_type = column(ops_relid, "job_type", TEXTOID);
	att_key = column(ops_relid, "operation_key", TEXTOID);
	r->att_status = get_attnum(ops_relid, "status");
	r->att_attempt = column(ops_relid, "attempt", INT4OID);
	r->att_completed_at = column(ops_relid, "completed_at", TIMESTAMPTZOID);
	r->att_fingerprint = column(ops_relid, "fingerprint", TEXTOID);
	r->att_result = column(ops_relid, "result", JSONBOID);
	att_jt_job_type = column(jt_relid, "job_type", TEXTOID);
	if (r->att_job_type == InvalidAttrNumber || att_key == InvalidAttrNumber ||
		r->att_status == InvalidAttrNumber || r->att_attempt == InvalidAttrNumber ||
		r->att_completed_at == InvalidAttrNumber ||
		r->att_fingerprint == InvalidAttrNumber || r->att_result == InvalidAttrNumber ||
		att_jt_job_type == InvalidAttrNumber)
		return false;
	/* absent before 0.2; of another type, the fast paths leave roles to SPI */
	r->att_worker_role = get_attnum(jt_relid, "worker_role");
	if (r->att_worker_role != InvalidAttrNumber &&
		get_atttype(jt_relid, r->att_worker_role) != REGROLEOID)
		return false;

	/* the scans' keys are the primary keys' columns, in this order */
	if (!unique_index_on(ops_pkey, r->att_job_type, att_key) ||
		!unique_index_on(jt_pkey, att_jt_job_type, InvalidAttrNumber))
		return false;

	status_type = get_atttype(ops_relid, r->att_status);
	if (get_typtype(status_type) != TYPTYPE_ENUM)
		return false;
	r->claimed = enum_label(status_type, "claimed");
	r->completed = enum_label(status_type, "completed");
	r->skipped = enum_label(status_type, "skipped");
	if (!OidIsValid(r->claimed) || !OidIsValid(r->completed) || !OidIsValid(r->skipped))
		return false;
	r->valid = true;
	return true;
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
 * in every false case. Roles are compared where the job type is read: on
 * this node, whose role OIDs the caller's are.
 */
static bool
may_work(const TargetRels *r, Oid caller, const IdemCaps *caps, text *job_type, Snapshot snapshot)
{
	Relation	rel;
	Lookup		l;
	bool		ok = false;

	if (!caps->worker_roles || r->att_worker_role == InvalidAttrNumber)
		return true;

	/* gone (a concurrent DROP EXTENSION, a moved shard) or changed: SPI */
	rel = try_relation_open(r->jt_relid, AccessShareLock);
	if (rel == NULL)
		return false;
	if (!r->valid)
	{
		relation_close(rel, AccessShareLock);
		return false;
	}
	begin_lookup(&l, rel, r->jt_pkey, AccessShareLock, snapshot, job_type, NULL);
	if (index_getnext_slot(l.scan, ForwardScanDirection, l.slot))
	{
		bool		isnull;
		Datum		role = slot_getattr(l.slot, r->att_worker_role, &isnull);

		ok = idem_role_may_work(caller, isnull ? InvalidOid : DatumGetObjectId(role));
	}
	end_lookup(&l);
	table_close(rel, NoLock);
	return ok;
}

/*
 * Is `trigger` the check of a foreign key from job_type alone to job_types
 * (or their shards), not deferrable? The one trigger the fast update may
 * leave out: it does not change job_type, and the check of a record this
 * transaction inserted ran at the end of the inserting statement, whose
 * key-share lock on the job type still holds. distribute() adds this
 * foreign key (and a distributed install copies it to every shard).
 */
static bool
job_type_check_trigger(const TargetRels *r, const Trigger *trigger)
{
	HeapTuple	tuple;
	Form_pg_constraint con;
	bool		ok;
	Datum		conkey;
	bool		isnull;
	ArrayType  *keys;

	if (!trigger->tgisinternal || trigger->tgdeferrable ||
		(trigger->tgfoid != F_RI_FKEY_CHECK_INS && trigger->tgfoid != F_RI_FKEY_CHECK_UPD))
		return false;
	tuple = SearchSysCache1(CONSTROID, ObjectIdGetDatum(trigger->tgconstraint));
	if (!HeapTupleIsValid(tuple))
		return false;
	con = (Form_pg_constraint) GETSTRUCT(tuple);
	ok = con->contype == CONSTRAINT_FOREIGN && !con->condeferrable &&
		con->conrelid == r->ops_relid && con->confrelid == r->jt_relid;
	if (ok)
	{
		conkey = SysCacheGetAttr(CONSTROID, tuple, Anum_pg_constraint_conkey, &isnull);
		keys = isnull ? NULL : DatumGetArrayTypeP(conkey);
		ok = keys != NULL && ARR_NDIM(keys) == 1 && ARR_DIMS(keys)[0] == 1 &&
			((int16 *) ARR_DATA_PTR(keys))[0] == r->att_job_type;
	}
	ReleaseSysCache(tuple);
	return ok;
}

/*
 * Does the fast update replace the executor's UPDATE on this table? Only
 * when the executor would do nothing more than update the heap and the
 * primary key. Every property of a table that the executor enforces on an
 * UPDATE, and what this guard does with it (sql/fastpath.sql tests each):
 *
 *	- triggers (user triggers, foreign keys that reference the table or
 *	  that it has): declined, but for job_type_check_trigger();
 *	- rules, row level security, CHECK constraints: declined;
 *	- generated columns (stored; virtual since 18): declined;
 *	- a second index (unique, exclusion or plain): declined;
 *	- NOT NULL: the update writes no NULL but the result; a NULL result
 *	  where the column is NOT NULL is declined in idem_fast_complete();
 *	- a column of another type (a domain, say): idem_rels_load() declines
 *	  the whole schema;
 *	- a publication for UPDATE without a replica identity: the executor's
 *	  own error (open_operations());
 *	- a partitioned or foreign table: declined (not a plain relation).
 */
static bool
fast_update_covers(const TargetRels *r, Relation rel)
{
	TupleConstr *constr = rel->rd_att->constr;
	List	   *indexes;
	bool		covers;

	if (rel->rd_rel->relkind != RELKIND_RELATION ||
		rel->rd_rel->relrowsecurity || rel->rd_rules != NULL)
		return false;
	if (constr != NULL && (constr->num_check > 0 || constr->has_generated_stored))
		return false;
	if (idem_has_generated_virtual(constr))
		return false;
	if (rel->trigdesc != NULL)
	{
		for (int i = 0; i < rel->trigdesc->numtriggers; i++)
			if (!job_type_check_trigger(r, &rel->trigdesc->triggers[i]))
				return false;
	}
	indexes = RelationGetIndexList(rel);
	covers = list_length(indexes) == 1 && linitial_oid(indexes) == r->ops_pkey;
	list_free(indexes);
	return covers;
}

/*
 * Open the target's operations relation for a probe (AccessShareLock) or
 * for the fast update (RowExclusiveLock, and only if fast_update_covers()
 * says so). NULL when the SPI path must do the work instead.
 */
static Relation
open_operations(const TargetRels *r, LOCKMODE lockmode, bool for_update)
{
	Relation	rel;

	if (r == NULL || !r->valid)
		return NULL;
	/* gone (a concurrent DROP EXTENSION): the SPI way says why */
	rel = try_relation_open(r->ops_relid, lockmode);
	if (rel == NULL)
		return NULL;
	/* changed while we waited for the lock, or not plain enough */
	if (!r->valid || (for_update && !fast_update_covers(r, rel)))
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
 * Look up one record of a batch under a new statement snapshot, after
 * making this transaction's own earlier changes visible, as SPI would: the
 * batch's one scan of the primary key, begun at its first key and
 * rescanned for each (its snapshot set to the key's, as index_beginscan()
 * would set it). Returns the snapshot; end_record_lookup() releases it.
 */
static Snapshot
begin_record_lookup(HeapBatch *b, Lookup *l, text *job_type, text *key)
{
	Snapshot	snapshot;
	ScanKeyData skey[2];

	CommandCounterIncrement();
	snapshot = RegisterSnapshot(GetTransactionSnapshot());
	if (b->scan == NULL)
	{
		/* the first key: the batch's scan, the lookups' shape */
		begin_lookup(l, b->rel, b->tr->ops_pkey,
					 b->for_update ? RowExclusiveLock : AccessShareLock,
					 snapshot, job_type, key);
		b->idx = l->idx;
		b->scan = l->scan;
		b->slot = l->slot;
		return snapshot;
	}

	/* a later key: the same scan, under this key's snapshot */
	l->idx = b->idx;
	l->scan = b->scan;
	l->slot = b->slot;
	ScanKeyEntryInitialize(&skey[0], 0, 1, BTEqualStrategyNumber, InvalidOid,
						   l->idx->rd_indcollation[0], F_TEXTEQ,
						   PointerGetDatum(job_type));
	ScanKeyEntryInitialize(&skey[1], 0, 2, BTEqualStrategyNumber, InvalidOid,
						   l->idx->rd_indcollation[1], F_TEXTEQ,
						   PointerGetDatum(key));
	l->scan->xs_snapshot = snapshot;
	index_rescan(l->scan, skey, 2, NULL, 0);
	return snapshot;
}

/* The end of one key's lookup: its snapshot; the batch keeps the scan */
static void
end_record_lookup(Lookup *l, Snapshot snapshot)
{
	ExecClearTuple(l->slot);
	UnregisterSnapshot(snapshot);
}

/*
 * A completed record: does the protocol answer the claim completed, with
 * nothing to write? Only when the fingerprints do not differ; asked of
 * idem_decide_claim() so that the probe cannot drift from the SPI path.
 */
static bool
probe_answers_completed(bool fingerprint_differs)
{
	ClaimRecord rec = {0};
	ClaimRequest req = {0};
	ClaimAction act;

	rec.found = true;
	rec.status = OPERATION_COMPLETED;
	rec.fingerprint_differs = fingerprint_differs;
	req.wait = true;
	act = idem_decide_claim(&rec, &req);
	return act.step == CLAIM_ANSWER && act.verdict == VERDICT_COMPLETED;
}

/*
 * The heap paths of a batch: the operations relation opened and its
 * primary key's scan begun once for all its keys (rescanned per key), and
 * the caller's right to work the job type (may_work()) asked once, at the
 * first key that needs it, where a single call does all three for its one
 * key. A batch's keys are all of one job type and one caller, and
 * the relation stays locked until the transaction ends either way (a
 * single call's lock is held as long). Each key still gets its own
 * statement snapshot, after this transaction's earlier changes, as a single
 * call would. The one difference: a change of the job type's worker_role
 * that commits while a batch runs applies from the batch's next call, as
 * one statement sees one snapshot, rather than from its next key (the SPI
 * path, which every refused key takes, checks again). The single calls
 * use the same code with a batch of one key (idem_probe(),
 * idem_fast_complete()).
 */
void
idem_heap_batch_begin(HeapBatch *b, const TargetRels *tr, bool for_update)
{
	b->tr = tr;
	b->for_update = for_update;
	b->may_work = -1;
	b->idx = NULL;
	b->scan = NULL;
	b->slot = NULL;
	b->rel = open_operations(tr, for_update ? RowExclusiveLock : AccessShareLock, for_update);
}

void
idem_heap_batch_end(HeapBatch *b)
{
	if (b->scan != NULL)
	{
		Lookup		l = {b->idx, b->scan, b->slot};

		end_lookup(&l);
		b->scan = NULL;
	}
	if (b->rel != NULL)
		table_close(b->rel, NoLock);
	b->rel = NULL;
}

/*
 * May the batch use its relation for the next key? Not when the relation
 * was declined, nor when the cache was invalidated meanwhile (an SPI
 * statement of an earlier key processed an invalidation): the rest of the
 * batch then goes the SPI way, as single calls would until the cache is
 * filled again.
 */
static bool
heap_batch_usable(const HeapBatch *b)
{
	return b->rel != NULL && b->tr != NULL && b->tr->valid &&
		RelationGetRelid(b->rel) == b->tr->ops_relid;
}

/* may_work() once per batch: the job type and the caller are the batch's */
static bool
heap_batch_may_work(HeapBatch *b, Oid caller, const IdemCaps *caps, text *job_type,
					Snapshot snapshot)
{
	if (b->may_work < 0)
		b->may_work = may_work(b->tr, caller, caps, job_type, snapshot) ? 1 : 0;
	return b->may_work == 1;
}

/*
 * claim_operation()'s probe. PROBE_COMPLETED fills *attempt and *result (a
 * detoasted copy in the caller's memory context); PROBE_ABSENT: no record
 * is visible; PROBE_OTHER: anything else (another status, a different
 * fingerprint, a caller who may not work the job type, a schema this code
 * does not know), for the SPI path to decide and explain.
 */
ProbeResult
idem_probe(const TargetRels *tr, Oid caller, const IdemCaps *caps, text *job_type, text *key,
		   text *fingerprint, int32 *attempt, Datum *result, bool *result_isnull)
{
	HeapBatch	b;
	ProbeResult r;

	idem_heap_batch_begin(&b, tr, false);
	r = idem_probe_in(&b, caller, caps, job_type, key, fingerprint, attempt, result,
					  result_isnull);
	idem_heap_batch_end(&b);
	return r;
}

/* The probe of one key of a batch (or of the single call) */
ProbeResult
idem_probe_in(HeapBatch *b, Oid caller, const IdemCaps *caps, text *job_type, text *key,
			  text *fingerprint, int32 *attempt, Datum *result, bool *result_isnull)
{
	const TargetRels *tr = b->tr;
	Lookup		l;
	Snapshot	snapshot;
	ProbeResult r = PROBE_ABSENT;

	if (!heap_batch_usable(b))
		return PROBE_OTHER;
	snapshot = begin_record_lookup(b, &l, job_type, key);

	if (index_getnext_slot(l.scan, ForwardScanDirection, l.slot))
	{
		bool		isnull;
		Datum		status = slot_getattr(l.slot, tr->att_status, &isnull);
		Datum		fp = slot_getattr(l.slot, tr->att_fingerprint, &isnull);

		r = PROBE_OTHER;
		if (DatumGetObjectId(status) == tr->completed &&
			probe_answers_completed(fingerprint != NULL && !isnull &&
									!idem_same_text(fingerprint, DatumGetTextPP(fp))) &&
			heap_batch_may_work(b, caller, caps, job_type, snapshot))
		{
			Datum		res;

			*attempt = DatumGetInt32(slot_getattr(l.slot, tr->att_attempt, &isnull));
			res = slot_getattr(l.slot, tr->att_result, result_isnull);
			if (!*result_isnull)
				*result = PointerGetDatum(PG_DETOAST_DATUM_COPY(res));
			r = PROBE_COMPLETED;
		}
	}

	end_record_lookup(&l, snapshot);
	return r;
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
idem_key_busy(const TargetRels *r, text *job_type, text *key, int32 *attempt)
{
	Relation	rel;
	Lookup		l;
	SnapshotData dirty;
	bool		busy = false;

	rel = open_operations(r, AccessShareLock, false);
	if (rel == NULL)
		return false;
	InitDirtySnapshot(dirty);
	begin_lookup(&l, rel, r->ops_pkey, AccessShareLock, &dirty, job_type, key);
	while (index_getnext_slot(l.scan, ForwardScanDirection, l.slot))
	{
		/* set by the visibility check of the version just returned */
		if (TransactionIdIsValid(dirty.xmin) || TransactionIdIsValid(dirty.xmax))
		{
			bool		isnull;

			*attempt = DatumGetInt32(slot_getattr(l.slot, r->att_attempt, &isnull));
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
idem_fast_complete(const TargetRels *tr, Oid caller, const IdemCaps *caps, text *job_type,
				   text *key, int32 attempt, Datum result, bool result_isnull)
{
	HeapBatch	b;
	bool		done;

	idem_heap_batch_begin(&b, tr, true);
	done = idem_fast_complete_in(&b, caller, caps, job_type, key, attempt, result,
								 result_isnull);
	idem_heap_batch_end(&b);
	return done;
}

/* The fast update of one key of a batch (or of the single call) */
bool
idem_fast_complete_in(HeapBatch *b, Oid caller, const IdemCaps *caps, text *job_type,
					  text *key, int32 attempt, Datum result, bool result_isnull)
{
	const TargetRels *tr = b->tr;
	Relation	rel = b->rel;
	Lookup		l;
	Snapshot	snapshot;
	bool		done = false;

	if (!b->for_update || !heap_batch_usable(b))
		return false;
	snapshot = begin_record_lookup(b, &l, job_type, key);

	if (index_getnext_slot(l.scan, ForwardScanDirection, l.slot))
	{
		bool		isnull;
		Oid			status = DatumGetObjectId(slot_getattr(l.slot, tr->att_status, &isnull));
		int32		current = DatumGetInt32(slot_getattr(l.slot, tr->att_attempt, &isnull));
		FencedRecord rec;

		/*
		 * The protocol's decision on this record; the fast path knows the
		 * OIDs of the statuses it reads, and any other is released.
		 */
		rec.found = true;
		rec.attempt = current;
		rec.status = status == tr->claimed ? OPERATION_CLAIMED :
			status == tr->skipped ? OPERATION_SKIPPED :
			status == tr->completed ? OPERATION_COMPLETED : OPERATION_RELEASED;

		/*
		 * A NULL result into a column a DBA made NOT NULL: the executor's
		 * check (23502) is the SPI path's. (completed_at is never NULL
		 * here; the columns not written keep what the record has.)
		 */
		if (idem_decide_fenced(FENCED_COMPLETE, &rec, attempt) == FENCE_UPDATE &&
			!(result_isnull && TupleDescAttr(RelationGetDescr(rel), tr->att_result - 1)->attnotnull) &&
			heap_batch_may_work(b, caller, caps, job_type, snapshot))
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
			newslot->tts_values[tr->att_status - 1] = ObjectIdGetDatum(tr->completed);
			newslot->tts_values[tr->att_completed_at - 1] =
				TimestampTzGetDatum(GetCurrentTimestamp());
			newslot->tts_isnull[tr->att_completed_at - 1] = false;
			newslot->tts_values[tr->att_result - 1] = result;
			newslot->tts_isnull[tr->att_result - 1] = result_isnull;
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

	end_record_lookup(&l, snapshot);
	return done;
}
