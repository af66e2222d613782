/*-------------------------------------------------------------------------
 *
 * compat.h
 *	  Differences between PostgreSQL major versions, in one place.
 *
 * The extension is built and tested on PostgreSQL 15, 17 and 18 (the
 * supported majors are listed in scripts/versions.sh). Code for a particular
 * major goes here, behind PG_VERSION_NUM, never in the .c files: they call
 * the idem_* wrappers below instead of the PostgreSQL functions whose
 * signature changed.
 *
 * 16 is not tested here (no package of it is reachable); its branches are
 * those of 17, whose headers agree with 16's on everything below.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEMPOTENCY_COMPAT_H
#define IDEMPOTENCY_COMPAT_H

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/tableam.h"
#include "access/tupdesc.h"
#include "utils/regproc.h"

/*
 * InitMaterializedSRF() (claim_operation(), stale_claims()) appeared in
 * PostgreSQL 15; older majors are not supported.
 */
#if PG_VERSION_NUM < 150000
#error "idempotency requires PostgreSQL 15 or later"
#endif

/*
 * pg_noreturn, written before a declaration, replaced the trailing
 * pg_attribute_noreturn() in PostgreSQL 18, which removed the latter.
 */
#ifndef pg_noreturn
#define pg_noreturn pg_attribute_noreturn()
#endif

/*
 * table_tuple_update(): its last argument, whether the indexes need entries
 * for the new version, is a bool up to PostgreSQL 15 and a TU_UpdateIndexes
 * since 16 (TU_None: a HOT update; TU_Summarizing: only summarizing indexes
 * such as BRIN; TU_All: every index). *update_indexes is set to true when
 * the btree indexes need an entry for the new version, as the executor
 * decides.
 */
static inline TM_Result
idem_table_tuple_update(Relation rel, ItemPointer otid, TupleTableSlot *slot,
						CommandId cid, Snapshot snapshot, Snapshot crosscheck,
						bool wait, TM_FailureData *tmfd,
						LockTupleMode *lockmode, bool *update_indexes)
{
#if PG_VERSION_NUM >= 160000
	TU_UpdateIndexes tu = TU_None;
	TM_Result	result = table_tuple_update(rel, otid, slot, cid, snapshot,
											crosscheck, wait, tmfd, lockmode,
											&tu);

	*update_indexes = (tu == TU_All);
	return result;
#else
	return table_tuple_update(rel, otid, slot, cid, snapshot, crosscheck,
							  wait, tmfd, lockmode, update_indexes);
#endif
}

/*
 * index_beginscan(): PostgreSQL 18 added an IndexScanInstrumentation
 * argument (NULL: none, as for a scan outside EXPLAIN).
 */
static inline IndexScanDesc
idem_index_beginscan(Relation heap, Relation index, Snapshot snapshot,
					 int nkeys, int norderbys)
{
#if PG_VERSION_NUM >= 180000
	return index_beginscan(heap, index, snapshot, NULL, nkeys, norderbys);
#else
	return index_beginscan(heap, index, snapshot, nkeys, norderbys);
#endif
}

/*
 * Virtual generated columns appeared in PostgreSQL 18 (stored ones are
 * older): a table with one is not one the fast update covers.
 */
static inline bool
idem_has_generated_virtual(const TupleConstr *constr)
{
#if PG_VERSION_NUM >= 180000
	return constr != NULL && constr->has_generated_virtual;
#else
	(void) constr;
	return false;
#endif
}

/*
 * stringToQualifiedNameList() takes an error-saving context since 16 (NULL:
 * errors are raised, as before).
 */
static inline List *
idem_string_to_names(const char *string)
{
#if PG_VERSION_NUM >= 160000
	return stringToQualifiedNameList(string, NULL);
#else
	return stringToQualifiedNameList(string);
#endif
}

/*
 * Column `attnum` of a catalog tuple (Citus's catalogs, read by the local
 * shard store). Not heap_getattr(): since 15.20 (and the matching minors of
 * later majors) that inline calls a function older minor releases do not
 * export, so a library built against newer headers would not load into an
 * older server of the same major. heap_deform_tuple() is exported by every
 * minor.
 */
static inline Datum
idem_catalog_getattr(HeapTuple tuple, AttrNumber attnum, TupleDesc desc, bool *isnull)
{
	Datum	   *values = palloc(desc->natts * sizeof(Datum));
	bool	   *nulls = palloc(desc->natts * sizeof(bool));
	Datum		d;

	heap_deform_tuple(tuple, desc, values, nulls);
	*isnull = nulls[attnum - 1];
	d = values[attnum - 1];
	pfree(values);
	pfree(nulls);
	return d;
}

#endif							/* IDEMPOTENCY_COMPAT_H */
