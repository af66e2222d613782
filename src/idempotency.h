/*-------------------------------------------------------------------------
 *
 * idempotency.h
 *	  Shared declarations of the idempotency extension.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEMPOTENCY_H
#define IDEMPOTENCY_H

#include "fmgr.h"
#include "access/attnum.h"
#include "executor/spi.h"
#include "utils/timestamp.h"

#include "compat.h"
#include "protocol.h"

/*
 * SQLSTATEs of our own, class "ID". Clients branch on them; the README's
 * SQLSTATE table lists every code the extension raises.
 */
#define ERRCODE_IDEMPOTENCY_UNKNOWN_JOB_TYPE		MAKE_SQLSTATE('I','D','0','0','1')
#define ERRCODE_IDEMPOTENCY_FINGERPRINT_MISMATCH	MAKE_SQLSTATE('I','D','0','0','2')
#define ERRCODE_IDEMPOTENCY_ATTEMPT_SUPERSEDED		MAKE_SQLSTATE('I','D','0','0','3')
#define ERRCODE_IDEMPOTENCY_OPERATION_NOT_FOUND		MAKE_SQLSTATE('I','D','0','0','4')
#define ERRCODE_IDEMPOTENCY_WRONG_STATE				MAKE_SQLSTATE('I','D','0','0','5')

/* Input limits, checked before anything reaches the btree */
#define IDEMPOTENCY_MAX_JOB_TYPE_BYTES	128
#define IDEMPOTENCY_MAX_KEY_BYTES		1024
#define IDEMPOTENCY_MAX_DELIVERY_BYTES	1024
/* The most keys one batch call takes */
#define IDEMPOTENCY_MAX_BATCH			1000

/*
 * How often one call re-reads a record that another session changed under
 * it before giving up with a serialization failure. Every retry needs a
 * concurrent commit on the same key, so this is never reached in practice.
 */
#define IDEMPOTENCY_MAX_TRIES			16

/* NOTIFY channel for claims that turned out stale and are held */
#define IDEMPOTENCY_HELD_CHANNEL		"idempotency_held"

/* The prepared statements, see statements[] in idempotency.c */
typedef enum Statement
{
	ST_LOOKUP,
	ST_LOOKUP_ROLE,
	ST_LOOKUP_DELIVERY,
	ST_LOOKUP_CITUS_JOB_TYPE,
	ST_LOOKUP_CITUS_RECORD,
	ST_INSERT,
	ST_INSERT_ROLE,
	ST_INSERT_DELIVERY,
	ST_INSERT_BATCH,
	ST_INSERT_VALUES,
	ST_INSERT_VALUES_DELIVERY,
	ST_TAKEOVER,
	ST_TAKEOVER_DELIVERY,
	ST_SKIP,
	ST_COMPLETE,
	ST_RELEASE,
	ST_EXTEND,
	ST_COMPLETE_ROLE,
	ST_RELEASE_ROLE,
	ST_EXTEND_ROLE,
	ST_COMPLETE_ROLE_NAME,
	ST_RELEASE_ROLE_NAME,
	ST_EXTEND_ROLE_NAME,
	ST_STALE_ALL,
	ST_STALE_ONE,
	ST_RESOLVE_COMPLETED,
	ST_RESOLVE_RETRY,
	ST_AUDIT,
	ST_PURGE_SCAN,
	ST_PURGE_DELETE,
	ST_PURGE_RANGE,
	ST_PURGE_CUTOFFS,
	ST_PURGE_JOB_TYPE,
	ST_COUNT
} Statement;

/*
 * What ST_LOOKUP read: the job type's configuration and, if it exists, the
 * record. Pointers point into the SPI tuple table of the lookup and are
 * valid until the next statement.
 */
typedef struct OperationState
{
	bool		job_type_found;
	StalePolicy policy;
	int32		max_attempts;	/* 0: no limit */
	Oid			worker_role;	/* InvalidOid: any role with EXECUTE */
	bool		worker_role_missing;	/* names no role here (Citus) */

	bool		found;
	OperationStatus status;
	int32		attempt;
	TimestampTz heartbeat_at;
	TimestampTz expires_at;		/* heartbeat_at + lease */
	text	   *fingerprint;	/* NULL if none */
	Datum		result;
	bool		result_isnull;
	bool		delivery_found;	/* since 0.3: the claim gave a delivery */
	int64		delivery;		/* its digest, see idem_delivery_digest() */
} OperationState;

/*
 * One SQL-callable call: the caller's identity, restored at the end, and
 * whether the job type's worker_role applies to it. It does for the worker
 * functions as version 0.2 defines them; their 0.1 definitions (whose
 * job_types has no worker_role column) call the C entry points without the
 * _0_2 suffix, which do not check it. Since 0.3 claim_operation() also
 * reads and writes the delivery column (deliveries, only through
 * claim_operation_0_3, whose definition has the delivery argument). The
 * README's "Upgrading the extension" says why old definitions keep old
 * entry points.
 */
/*
 * Where one call's records are: the one protocol has three backends. Chosen
 * once per call, by idem_target() (probe.c), before anything is read.
 */
typedef enum TargetKind
{
	TARGET_TABLE,				/* the extension's own tables, one node */
	TARGET_SHARD,				/* Citus: the key's shard, whose one
								 * placement is on this node (shard.c) */
	TARGET_CITUS				/* Citus: the distributed tables, through
								 * Citus's planner */
} TargetKind;

/*
 * The relations the fast paths of probe.c read and write, checked to be of
 * the shape they assume: the extension's tables, or one shard of each.
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

typedef struct Target
{
	TargetKind	kind;
	int64		shardid;		/* TARGET_SHARD: the key's shard */
	int64		jt_shardid;		/* TARGET_SHARD: job_types' shard */
	const TargetRels *rels;		/* NULL: no fast path (TARGET_CITUS, or a
								 * schema the fast paths do not know) */
} Target;

typedef struct IdemCall
{
	Oid			caller;
	int			save_sec_context;
	bool		worker_roles;
	bool		deliveries;		/* 0.3: operations has a delivery column */
	Target		target;			/* where the records are */
} IdemCall;

/* claim.c: what one claim asks for, and its answer */
typedef struct ClaimArgs
{
	text	   *job_type;
	text	   *key;
	text	   *fingerprint;	/* NULL: none */
	text	   *worker;			/* NULL: none */
	text	   *delivery;		/* NULL: none (and always before 0.3) */
	bool		wait;			/* false: in_progress instead of waiting */
} ClaimArgs;

typedef struct Verdict
{
	const char *verdict;
	int32		attempt;
	Datum		result;
	bool		result_isnull;
} Verdict;

extern void idem_claim_one(const ClaimArgs *a, int version, Verdict *v);
extern void idem_claim_batch(int n, const ClaimArgs *a, const bool *repeat, Verdict **v);
extern int	idem_nowait_begin(bool wait);
extern void idem_nowait_end(int level);
extern bool idem_arg_wait(FunctionCallInfo fcinfo, int argno);

/* complete.c: why a record refused a completion or a release */
typedef enum RefusalKind
{
	REFUSAL_NONE,				/* not refused: done now */
	REFUSAL_REPEAT,				/* done before, by this attempt: a no-op */
	REFUSAL_RETRY,				/* the record changed: read it again */
	REFUSAL_REFUSED				/* ID003, ID004 or ID005, see IdemRefusal */
} RefusalKind;

typedef struct IdemRefusal
{
	int			sqlstate;
	const char *message;
	const char *detail;
	const char *hint;
} IdemRefusal;

extern bool idem_complete_one(bool worker_roles, bool single, text *job_type, text *key,
							  int32 attempt, Datum result, bool result_isnull,
							  IdemRefusal *r);
extern bool idem_release_one(bool worker_roles, bool single, text *job_type, text *key,
							 int32 attempt, IdemRefusal *r);

/* probe.c: the hot paths below SPI */
typedef enum ProbeResult
{
	PROBE_ABSENT,				/* no record */
	PROBE_COMPLETED,			/* completed, the same fingerprint (or none) */
	PROBE_OTHER					/* anything else: the SPI path decides */
} ProbeResult;

extern void idem_target(text *key, Target *t);
extern ProbeResult idem_probe(const Target *t, Oid caller, bool worker_roles, text *job_type,
							  text *key, text *fingerprint, int32 *attempt,
							  Datum *result, bool *result_isnull);
extern bool idem_key_busy(const Target *t, text *job_type, text *key, int32 *attempt);
extern bool idem_fast_complete(const Target *t, Oid caller, bool worker_roles, text *job_type,
							   text *key, int32 attempt, Datum result, bool result_isnull);
extern bool idem_rels_load(TargetRels *r, Oid ops_relid, Oid ops_pkey, Oid jt_relid,
						   Oid jt_pkey);
extern bool idem_citus_managed(Oid relid);

/* shard.c: the key's shard, where Citus manages the tables */
extern bool idem_shard_target(Oid ops_relid, Oid jt_relid, text *key, Target *t);
extern SPIPlanPtr *idem_shard_plans(int64 shardid);
extern char *idem_shard_sql(const char *sql, int64 shardid, int64 jt_shardid);
extern void idem_define_settings(void);

/* idempotency.c */
extern void idem_begin(IdemCall *call, const char *fname, bool writes, const Target *target);
extern void idem_begin_worker(IdemCall *call, const char *fname, bool worker_roles,
							  const Target *target);
extern void idem_end(IdemCall *call);
extern uint64 idem_execute(Statement st, Datum *values, const char *nulls, long count);
extern Portal idem_cursor(Statement st, Datum *values, const char *nulls);
extern void idem_lookup(text *job_type, text *key, OperationState *state);
extern void idem_require_job_type(const OperationState *state, text *job_type);
extern void idem_require_record(const OperationState *state, text *job_type, text *key);
extern bool idem_role_may_work(Oid caller, Oid role);
extern void idem_worker_lookup(const IdemCall *call, text *job_type, text *key,
							   OperationState *state);
extern const char *idem_citus_worker_role(const IdemCall *call, text *job_type);
extern text *idem_arg_job_type(FunctionCallInfo fcinfo, int argno);
extern text *idem_arg_key(FunctionCallInfo fcinfo, int argno);
extern text *idem_arg_delivery(FunctionCallInfo fcinfo, int argno);
extern int64 idem_delivery_digest(text *delivery, bool verify);
extern int32 idem_arg_attempt(FunctionCallInfo fcinfo, int argno);
extern int32 idem_arg_positive_int32(FunctionCallInfo fcinfo, int argno, const char *name,
									 const char *detail, const char *hint);
extern const char *idem_status_name(OperationStatus status);
pg_noreturn extern void idem_too_many_tries(const char *action, text *job_type, text *key);
extern char *idem_text(text *t);
extern bool idem_same_text(text *a, text *b);
extern int	idem_text_cmp(text *a, text *b);

#endif							/* IDEMPOTENCY_H */
