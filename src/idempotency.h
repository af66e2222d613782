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

/*
 * What a lookup read (record.c decodes it, whatever the backend): the job
 * type's configuration and, if it exists, the record. Pointers point into
 * the SPI tuple table of the lookup and are valid until the next statement.
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
 * What the SQL definition that called can do. Each worker function's C
 * entry point is named for the API version of its definition (no suffix:
 * 0.1, _0_2, _0_3), as pg_stat_statements names its entry points; the
 * entry point turns that version into these capabilities once, with
 * idem_caps(), and every later decision asks a capability, never a version.
 * Old definitions keep old entry points: the README's "Upgrading the
 * extension" says why.
 */
typedef struct IdemCaps
{
	bool		worker_roles;	/* job_types has worker_role, and it applies */
	bool		deliveries;		/* operations has delivery; claims take a
								 * delivery token and wait */
} IdemCaps;

/* The API versions of the entry points, and the newest (the batch calls) */
#define IDEM_API_0_1	1
#define IDEM_API_0_2	2
#define IDEM_API_0_3	3
#define IDEM_API_LATEST	IDEM_API_0_3

extern IdemCaps idem_caps(int api_version);

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

extern void idem_claim_one(const ClaimArgs *a, const IdemCaps *caps, Verdict *v);
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

extern bool idem_complete_one(const IdemCaps *caps, text *job_type, text *key,
							  int32 attempt, Datum result, bool result_isnull,
							  IdemRefusal *r);
typedef struct CompleteBatch CompleteBatch;
extern CompleteBatch *idem_complete_batch_begin(const IdemCaps *caps);
extern bool idem_complete_batch_key(CompleteBatch *cb, text *job_type, text *key,
									int32 attempt, Datum result, bool result_isnull,
									IdemRefusal *r);
extern bool idem_batch_statements(void);
extern void idem_fenced_batch_many(const IdemCaps *caps, bool complete, text *job_type,
								   int n, text *const *keys, const int32 *attempts,
								   const Datum *results, const bool *result_nulls,
								   bool *done);
extern void idem_complete_batch_end(CompleteBatch *cb);
extern bool idem_release_one(const IdemCaps *caps, bool single, text *job_type, text *key,
							 int32 attempt, IdemRefusal *r);

/* util.c: argument checks, errors and texts, shared by every file */
extern bool idem_role_may_work(Oid caller, Oid role);
pg_noreturn extern void idem_deny_job_type(Oid caller, text *job_type, Oid role_oid);
extern void idem_require_job_type(const OperationState *state, text *job_type);
extern void idem_require_record(const OperationState *state, text *job_type, text *key);
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
