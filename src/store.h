/*-------------------------------------------------------------------------
 *
 * store.h
 *	  Where a call's records are: one interface, three backends.
 *
 * The protocol (protocol.c decides, claim.c, complete.c and admin.c act)
 * reads and writes records through a Store. A store is one backend and
 * what that backend needs for this call:
 *
 *	- the plain table (store_table.c): the extension's own tables on one
 *	  node, with the direct heap paths of heap.c;
 *	- the routed store (store_citus.c): the distributed tables, each
 *	  statement planned and routed by Citus;
 *	- the local shard (store_shard.c): the key's shard, whose only
 *	  placement is on this node, with the plain table's statements renamed
 *	  for the shard and the same heap paths.
 *
 * store.c chooses the backend, once per call, before anything is read
 * (idem_store_choose()); no other file but the backends' own knows which
 * backends exist. Every backend runs the statements of statements.c, keyed
 * by statement set (one node, or routed) x operation x variant (what the
 * caller's capabilities need), and owns the plans it prepared.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEMPOTENCY_STORE_H
#define IDEMPOTENCY_STORE_H

#include "access/attnum.h"
#include "executor/spi.h"
#include "storage/itemptr.h"
#include "utils/timestamp.h"

#include "idempotency.h"

/* The operations a store runs as statements (statements.c) */
typedef enum StoreOp
{
	OP_LOOKUP,					/* the job type and the record, one row */
	OP_LOOKUP_JOB_TYPE,			/* the job type alone (routed store) */
	OP_LOOKUP_RECORD,			/* the record alone (routed store) */
	OP_INSERT,					/* attempt 1 */
	OP_INSERT_BATCH,			/* attempt 1 of many keys */
	OP_LOOKUP_RECORDS,			/* many keys' records (routed store) */
	OP_COMPLETE_MANY,			/* many keys' fenced completions (routed) */
	OP_RELEASE_MANY,			/* many keys' fenced releases (routed) */
	OP_TAKE_OVER,				/* a record as read gets attempt + 1 */
	OP_SKIP,					/* a stale claim as read becomes skipped */
	OP_COMPLETE,				/* the fenced updates */
	OP_RELEASE,
	OP_EXTEND,
	OP_STALE_ALL,				/* stale_claims() */
	OP_STALE_ONE,
	OP_RESOLVE_COMPLETED,		/* resolve_operation() */
	OP_RESOLVE_RETRY,
	OP_AUDIT,
	OP_PURGE_SCAN,				/* purge_operations(): by ctid */
	OP_PURGE_DELETE,
	OP_PURGE_RANGE,				/* purge_block_range() */
	OP_PURGE_CUTOFFS,			/* the purge without ctids (routed store) */
	OP_PURGE_JOB_TYPE,
	OP_COUNT
} StoreOp;

/*
 * Which variant of an operation's statement: what the caller's
 * capabilities need (idem_variant()). A variant an operation does not have
 * falls back to the one before it (DELIVERY -> ROLE -> BASE).
 */
typedef enum StoreVariant
{
	VARIANT_BASE,				/* no worker_role check, no delivery */
	VARIANT_ROLE,				/* the worker_role, against the caller's OID */
	VARIANT_DELIVERY,			/* ... and the delivery digest */
	VARIANT_ROLE_NAME,			/* the worker_role by name, where the
								 * statement runs on another node (no
								 * fallback) */
	VARIANT_COUNT
} StoreVariant;

/* The statements' sets: what is written for one node, and for routing */
typedef enum StatementSet
{
	SET_ONE_NODE,				/* the plain table; the local shard renames */
	SET_ROUTED,					/* only where routing needs other text; the
								 * rest falls back to SET_ONE_NODE */
	SET_COUNT
} StatementSet;

/* A backend's kept plans (NULL until first used) */
typedef struct StorePlans
{
	SPIPlanPtr	plan[OP_COUNT][VARIANT_COUNT];
} StorePlans;

/*
 * The relations the direct heap paths (heap.c) read and write, checked to
 * be of the shape they assume: the extension's tables, or one shard of each.
 */
typedef struct TargetRels
{
	bool		valid;
	Oid			ops_relid;		/* idempotency.operations (or its shard) */
	Oid			ops_pkey;
	Oid			jt_relid;		/* idempotency.job_types (or its shard) */
	Oid			jt_pkey;
	AttrNumber	att_status;
	AttrNumber	att_attempt;
	AttrNumber	att_completed_at;
	AttrNumber	att_fingerprint;
	AttrNumber	att_result;
	AttrNumber	att_job_type;
	AttrNumber	att_worker_role;	/* InvalidAttrNumber before 0.2 */
	Oid			claimed;		/* pg_enum OIDs of the statuses */
	Oid			completed;
	Oid			skipped;
} TargetRels;

typedef struct Store Store;
typedef struct IdemCall IdemCall;

/*
 * The job type of a batch as the batch statements read it: once per batch,
 * at the first group (read false until then).
 */
typedef struct BatchJobType
{
	bool		read;
	OperationState state;		/* the job type's fields; no record */
	Interval	lease;
} BatchJobType;

/* Attempt 1 of many keys of one job type (claim_operations()) */
typedef struct InsertRows
{
	int			n;
	text	   *job_type;
	TimestampTz now;
	text	   *worker;			/* NULL: none */
	Oid			caller;
	Datum	   *keys;			/* text, distinct, in the batch's order */
	Datum	   *fingerprints;	/* text */
	bool	   *fingerprint_nulls;
	Datum	   *digests;		/* int8: the delivery digests */
	bool	   *digest_nulls;
} InsertRows;

/*
 * The fenced completions or releases of many keys of one job type, and what
 * they did
 */
typedef struct FencedRows
{
	int			n;
	text	   *job_type;
	TimestampTz now;
	Datum	   *keys;			/* text, in the batch's order */
	Datum	   *attempts;		/* int4 */
	Datum	   *results;		/* jsonb (complete) */
	bool	   *result_nulls;
	bool	   *done;			/* out: done by this statement */
} FencedRows;

/*
 * A backend: its statements and what it does differently. Every function
 * runs inside the call's SPI connection.
 */
typedef struct StoreBackend
{
	const char *name;
	StatementSet set;			/* its statements */
	int			cursor_options; /* SPI_prepare_cursor()'s, for its plans */
	/* the text of a statement for this store (NULL: as written) */
	char	   *(*statement_text) (const Store *s, const char *sql);
	/* read the job type and the record into *state (see OperationState) */
	void		(*lookup) (const Store *s, StoreVariant v, text *job_type, text *key,
						   OperationState *state);
	/*
	 * A fenced update's role check: the variant to run, and its $6 and $7
	 * (the caller, the job type's worker_role as the statement needs them)
	 */
	StoreVariant (*fenced_role) (const Store *s, const IdemCall *call, text *job_type,
								 Datum *caller, Datum *role, NameData *names);
	/* purge_operations(), and purge_block_range() */
	int64		(*purge) (const Store *s, Datum now, int32 batch_size);
	int64		(*purge_range) (const Store *s, Datum now, ItemPointer first,
								ItemPointer end, int64 first_block);

	/*
	 * Optional: the batches' statements over many keys at once, for a
	 * store that plans and routes every statement (NULL: a batch's keys go
	 * one by one, each the single call's way, or the heap paths'). A batch
	 * forms groups of keys that one statement can read and write together
	 * (the routed store: one shard's keys) and takes them group by group:
	 *
	 * group_of: the group of a key (a hint: keys of two groups given to
	 * one statement are still right, only slower);
	 * lookup_many: the records of n distinct keys of one group into
	 * states[i], each with the job type's fields, *jt read at the first
	 * call of a batch and reused; the caller checks the job type and the
	 * caller's right (idem_worker_lookup_many());
	 * insert_many: attempt 1 of a group's keys, as OP_INSERT_BATCH does
	 * (without its job type and role check: lookup_many's); sets
	 * inserted[i] for each key it inserted;
	 * fenced_many: the fenced completion (op OP_COMPLETE_MANY) or release
	 * (OP_RELEASE_MANY) of a group's distinct keys, as OP_COMPLETE or
	 * OP_RELEASE would do each, with the fenced_role() variant v and its
	 * $6, $7; sets done[i] for each key it updated.
	 */
	int64		(*group_of) (const Store *s, text *key);
	void		(*lookup_many) (const Store *s, text *job_type, int n, text *const *keys,
								OperationState *states, BatchJobType *jt);
	void		(*insert_many) (const Store *s, const InsertRows *rows, bool *inserted);
	void		(*fenced_many) (const Store *s, StoreOp op, StoreVariant v, Datum caller,
								Datum role, FencedRows *rows);

	/*
	 * Optional, for a store whose statements may run on other nodes: make
	 * the session's lock_timeout (wait => false's bound) hold there too,
	 * from on = true until on = false (NULL: they run in this backend,
	 * which has it already).
	 */
	void		(*carry_lock_timeout) (const Store *s, bool on);
} StoreBackend;

struct Store
{
	const StoreBackend *backend;
	StorePlans *plans;			/* the backend's, for this store */
	const TargetRels *rels;		/* the heap paths' relations; NULL: none */
	int64		shardid;		/* the local shard backend: its shards */
	int64		jt_shardid;
};

/*
 * One SQL-callable call: the caller's identity, restored at the end, its
 * capabilities and the store its records are in.
 */
struct IdemCall
{
	Oid			caller;
	int			save_sec_context;
	IdemCaps	caps;
	StoreVariant variant;		/* idem_variant(&caps) */
	Store		store;
};

/* store.c: the choice of a backend, and a call's frame */
extern void idem_store_choose(text *key, Store *s);
extern void idem_begin(IdemCall *call, const char *fname, bool writes, const Store *store);
extern void idem_begin_worker(IdemCall *call, const char *fname, const IdemCaps *caps,
							  const Store *store);
extern void idem_end(IdemCall *call);
extern StoreVariant idem_variant(const IdemCaps *caps);
extern void idem_lookup(const IdemCall *call, text *job_type, text *key,
						OperationState *state);
extern void idem_worker_lookup(const IdemCall *call, text *job_type, text *key,
							   OperationState *state);
extern int	idem_batch_groups(const Store *s, int n, text *const *keys, int *perm,
							  int *starts);
extern void idem_worker_lookup_many(const IdemCall *call, text *job_type, int n,
									text *const *keys, OperationState *states,
									BatchJobType *jt);
extern void idem_define_settings(void);
extern void idem_carry_lock_timeout(const IdemCall *call, bool wait, bool on);

/* statements.c: the statement table and its runner */
extern uint64 idem_execute(const Store *s, StoreOp op, StoreVariant v, Datum *values,
						   const char *nulls, long count);
extern char *idem_insert_rows_sql(int rows, Oid *types);
extern SPIPlanPtr idem_prepare_kept(const char *sql, int nargs, Oid *types,
									int cursor_options);
extern void idem_mark_returned(int n, const Datum *keys, bool *marks);
extern int	idem_returned_key(uint64 r, int n, const Datum *keys);
extern Portal idem_cursor(const Store *s, StoreOp op, StoreVariant v, Datum *values,
						  const char *nulls);

/* record.c: the one decoder of a lookup's rows */
typedef struct LookupColumns
{
	/* the job type's row (1-based; 0: not in this statement) */
	int			policy;
	int			max_attempts;
	int			lease;			/* where the expiry is not read: computed */
	int			role_oid;		/* the worker_role as this node's OID */
	int			role_name;		/* ... or by name (another node's OIDs) */
	/* the record's row */
	int			status;
	int			attempt;
	int			heartbeat_at;
	int			expires_at;
	int			fingerprint;
	int			result;
	int			delivery;
} LookupColumns;

extern void idem_decode_job_type(HeapTuple tuple, TupleDesc desc, const LookupColumns *c,
								 OperationState *state, Interval *lease);
extern bool idem_decode_record(HeapTuple tuple, TupleDesc desc, const LookupColumns *c,
							   OperationState *state, const Interval *lease);
extern void idem_state_init(OperationState *state);

/* heap.c: the direct heap paths, on a plain table or a local shard */
typedef enum ProbeResult
{
	PROBE_ABSENT,				/* no record */
	PROBE_COMPLETED,			/* completed, the same fingerprint (or none) */
	PROBE_OTHER					/* anything else: the SPI path decides */
} ProbeResult;

/*
 * The heap paths of many keys of one job type and caller: the relation
 * opened and its primary key's scan begun once, the caller's right asked
 * once (heap.c).
 */
typedef struct HeapBatch
{
	const TargetRels *tr;
	Relation	rel;			/* NULL: declined, every key goes the SPI way */
	bool		for_update;		/* opened for the fast update */
	int			may_work;		/* -1: not asked yet; else 0 or 1 */
	/* the primary key's scan, begun at the first key, rescanned per key */
	Relation	idx;
	IndexScanDesc scan;
	TupleTableSlot *slot;
} HeapBatch;

extern void idem_heap_batch_begin(HeapBatch *b, const TargetRels *tr, bool for_update);
extern void idem_heap_batch_end(HeapBatch *b);
extern ProbeResult idem_probe_in(HeapBatch *b, Oid caller, const IdemCaps *caps,
								 text *job_type, text *key, text *fingerprint, int32 *attempt,
								 Datum *result, bool *result_isnull);
extern bool idem_fast_complete_in(HeapBatch *b, Oid caller, const IdemCaps *caps,
								  text *job_type, text *key, int32 attempt, Datum result,
								  bool result_isnull);
extern ProbeResult idem_probe(const TargetRels *r, Oid caller, const IdemCaps *caps,
							  text *job_type, text *key, text *fingerprint, int32 *attempt,
							  Datum *result, bool *result_isnull);
extern bool idem_key_busy(const TargetRels *r, text *job_type, text *key, int32 *attempt);
extern bool idem_fast_complete(const TargetRels *r, Oid caller, const IdemCaps *caps,
							   text *job_type, text *key, int32 attempt, Datum result,
							   bool result_isnull);
extern bool idem_rels_load(TargetRels *r, Oid ops_relid, Oid ops_pkey, Oid jt_relid,
						   Oid jt_pkey);

/* store_table.c: the plain table, and what the local shard shares of it */
extern bool idem_table_store_cached(Store *s);
extern void idem_table_store(Store *s);
extern bool idem_tables(Oid *ops_relid, Oid *jt_relid);
extern void idem_one_node_lookup(const Store *s, StoreVariant v, text *job_type, text *key,
								 OperationState *state);
extern StoreVariant idem_one_node_fenced_role(const Store *s, const IdemCall *call,
											  text *job_type, Datum *caller, Datum *role,
											  NameData *names);
extern int64 idem_one_node_purge(const Store *s, Datum now, int32 batch_size);
extern int64 idem_one_node_purge_range(const Store *s, Datum now, ItemPointer first,
									   ItemPointer end, int64 first_block);

/* store_citus.c: the routed store */
extern bool idem_routed_applies(Oid *ops_relid, Oid *jt_relid);
extern void idem_routed_store(Store *s);

/* store_shard.c: the local shard */
extern bool idem_shard_store(Oid ops_relid, Oid jt_relid, text *key, Store *s);
extern int64 idem_shard_of(Oid ops_relid, Oid jt_relid, text *key);
extern void idem_shard_define_settings(void);

#endif							/* IDEMPOTENCY_STORE_H */
