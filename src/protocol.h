/*-------------------------------------------------------------------------
 *
 * protocol.h
 *	  The claim protocol's decisions: what to do, given what was read.
 *
 * Plain C on purpose: no PostgreSQL header, no palloc, no ereport. Every
 * function here decides from a record (what a lookup read, reduced to
 * plain values) and a request (what the call asks), and returns an action;
 * it reads nothing, writes nothing and raises nothing. The callers in
 * claim.c, complete.c, admin.c and heap.c read the record, apply the
 * action and, when a write finds the record changed under it, read it
 * again and ask again. So the protocol is written once, and
 * test/unit/test_protocol.c checks every combination without a server.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEMPOTENCY_PROTOCOL_H
#define IDEMPOTENCY_PROTOCOL_H

#include <stdbool.h>
#include <stdint.h>

/* idempotency.operation_status */
typedef enum OperationStatus
{
	OPERATION_CLAIMED,
	OPERATION_COMPLETED,
	OPERATION_RELEASED,
	OPERATION_SKIPPED
} OperationStatus;

#define OPERATION_STATUS_COUNT	4

/* idempotency.stale_policy */
typedef enum StalePolicy
{
	STALE_HOLD,
	STALE_RETRY,
	STALE_SKIP,
	STALE_LOOKUP
} StalePolicy;

#define STALE_POLICY_COUNT		4

/* What claim_operation() answers (the README's "Verdicts") */
typedef enum ClaimVerdict
{
	VERDICT_RUN,
	VERDICT_VERIFY,
	VERDICT_COMPLETED,
	VERDICT_IN_PROGRESS,
	VERDICT_HELD,
	VERDICT_SKIPPED
} ClaimVerdict;

/*
 * A claim's record as the lookup read it. Times are on one clock, in
 * microseconds (a TimestampTz): the call's now, and the claim's heartbeat
 * plus its job type's lease.
 */
typedef struct ClaimRecord
{
	bool		found;			/* false: no record; nothing below is set */
	OperationStatus status;
	int32_t		attempt;
	int64_t		now;
	int64_t		expires_at;
	bool		fingerprint_differs;	/* both the record and the call have
										 * one, and they differ */
	bool		delivery_found; /* the record stores a delivery digest */
	int64_t		delivery;		/* ... this one */
	/* the job type's configuration, read with the record */
	StalePolicy policy;
	int32_t		max_attempts;	/* 0: no limit */
} ClaimRecord;

/* What one claim asks */
typedef struct ClaimRequest
{
	bool		has_delivery;	/* the call gave a delivery token */
	int64_t		run_digest;		/* its digest with the verdict run */
	int64_t		verify_digest;	/* ... and with the verdict verify */
	bool		wait;			/* false: in_progress rather than a wait */
	bool		late;			/* a batch's key claimed by another
								 * transaction after its probe: its writes
								 * must not wait whatever `wait` says */
} ClaimRequest;

/* The step a claim takes */
typedef enum ClaimStep
{
	CLAIM_ANSWER,				/* answer, write nothing */
	CLAIM_HOLD,					/* answer held and tell the listeners */
	CLAIM_INSERT,				/* insert attempt 1 */
	CLAIM_TAKE_OVER,			/* the record as read gets attempt + 1 */
	CLAIM_SKIP,					/* the stale claim as read becomes skipped */
	CLAIM_MISMATCH				/* refuse: another fingerprint (ID002) */
} ClaimStep;

/*
 * What a claim does. A write (insert, take over, skip) is conditional on
 * the record being as read; when it writes nothing the caller reads the
 * record again and asks again. Before a write with check_busy, another
 * transaction's uncommitted change of the key answers in_progress instead.
 */
typedef struct ClaimAction
{
	ClaimStep	step;
	ClaimVerdict verdict;		/* the answer (for a write: once it wrote) */
	int32_t		attempt;		/* ... and its attempt */
	bool		with_result;	/* completed: the stored result goes too */
	bool		check_busy;		/* a write that must not wait */
	bool		verify;			/* a take over stores the verify digest */
} ClaimAction;

extern ClaimAction idem_decide_claim(const ClaimRecord *rec, const ClaimRequest *req);

/* The calls of a claim's owner: one fenced update each */
typedef enum FencedCall
{
	FENCED_COMPLETE,
	FENCED_RELEASE,
	FENCED_EXTEND
} FencedCall;

#define FENCED_CALL_COUNT		3

/* A fenced call's record as read (found false: no record) */
typedef struct FencedRecord
{
	bool		found;
	OperationStatus status;
	int32_t		attempt;
} FencedRecord;

/* What a fenced call does with the record */
typedef enum FencedOutcome
{
	FENCE_UPDATE,				/* the update applies: write (again) */
	FENCE_REPEAT,				/* done before by this attempt: a no-op */
	FENCE_NOT_FOUND,			/* ID004 */
	FENCE_SUPERSEDED,			/* ID003: a later claim's attempt */
	FENCE_NEVER_ISSUED,			/* 22023: an attempt no claim returned */
	FENCE_WRONG_STATE			/* ID005 */
} FencedOutcome;

extern FencedOutcome idem_decide_fenced(FencedCall call, const FencedRecord *rec,
										int32_t attempt);
extern bool idem_fenced_accepts(FencedCall call, OperationStatus status);
extern bool idem_fenced_accepts_skipped(FencedCall call);

/* resolve_operation(): is the record waiting for a person's decision? */
typedef enum ResolveOutcome
{
	RESOLVE_UPDATE,				/* a stale claim or a skipped record */
	RESOLVE_NOT_FOUND,			/* ID004 */
	RESOLVE_NOT_WAITING			/* ID005 */
} ResolveOutcome;

extern ResolveOutcome idem_decide_resolve(const ClaimRecord *rec);

extern const char *idem_verdict_name(ClaimVerdict verdict);

#endif							/* IDEMPOTENCY_PROTOCOL_H */
