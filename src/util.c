/*-------------------------------------------------------------------------
 *
 * util.c
 *	  What every file shares and nothing in it calls back: the capabilities
 *	  of an entry point's API version, argument checks, the errors of a
 *	  lookup, and text helpers.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "common/hashfn.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/builtins.h"

#include "idempotency.h"

/*
 * The capabilities of an entry point's API version (see IdemCaps): the one
 * place a version is compared. 0.2 added job_types.worker_role, 0.3
 * operations.delivery and claim_operation()'s delivery and wait arguments.
 */
IdemCaps
idem_caps(int api_version)
{
	IdemCaps	caps;

	caps.worker_roles = api_version >= IDEM_API_0_2;
	caps.deliveries = api_version >= IDEM_API_0_3;
	return caps;
}

const char *
idem_status_name(OperationStatus status)
{
	switch (status)
	{
		case OPERATION_CLAIMED:
			return "claimed";
		case OPERATION_COMPLETED:
			return "completed";
		case OPERATION_RELEASED:
			return "released";
		case OPERATION_SKIPPED:
			return "skipped";
	}
	pg_unreachable();
}

/*
 * May `caller` work a job type whose worker_role is `role` (InvalidOid:
 * none)? The one rule, for the SPI lookup and the direct heap paths of
 * heap.c; the fenced updates say the same in SQL (ROLE_MAY_WORK_JT in
 * statements.c: pg_has_role with 'USAGE', which is has_privs_of_role()).
 */
bool
idem_role_may_work(Oid caller, Oid role)
{
	return !OidIsValid(role) || has_privs_of_role(caller, role);
}

/* 42501: `caller` may not work the job type, whose worker_role is `role` */
void
idem_deny_job_type(Oid caller, text *job_type, Oid role_oid)
{
	const char *role = GetUserNameFromId(role_oid, true);

	ereport(ERROR,
			(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
			 errmsg("permission denied for job type \"%s\"", idem_text(job_type)),
			 role ?
			 errdetail("Only role \"%s\" and the roles that inherit its privileges may work this job type.",
					   role) :
			 errdetail("Its worker_role names a role that no longer exists, so no role but a superuser may work it."),
			 role ?
			 errhint("Work it as a member of \"%s\" (GRANT \"%s\" TO \"%s\"), or change idempotency.job_types.worker_role.",
					 role, role, GetUserNameFromId(caller, false)) :
			 errhint("Set idempotency.job_types.worker_role to an existing role.")));
}

void
idem_require_job_type(const OperationState *state, text *job_type)
{
	if (!state->job_type_found)
		ereport(ERROR,
				(errcode(ERRCODE_IDEMPOTENCY_UNKNOWN_JOB_TYPE),
				 errmsg("job type \"%s\" is not registered", idem_text(job_type)),
				 errdetail("A job type needs a lease and a stale-claim policy before its operations can be claimed."),
				 errhint("Register it: INSERT INTO idempotency.job_types (job_type, lease, stale_policy) VALUES ('%s', '10 minutes', 'hold');",
						 idem_text(job_type))));
}

void
idem_require_record(const OperationState *state, text *job_type, text *key)
{
	idem_require_job_type(state, job_type);
	if (!state->found)
		ereport(ERROR,
				(errcode(ERRCODE_IDEMPOTENCY_OPERATION_NOT_FOUND),
				 errmsg("operation \"%s\" of job type \"%s\" has no record",
						idem_text(key), idem_text(job_type)),
				 errdetail("It was never claimed, or its record was purged after its job type's retention."),
				 errhint("Call idempotency.claim_operation() first and use the attempt it returns.")));
}

/*
 * The record changed under every one of IDEMPOTENCY_MAX_TRIES reads: give
 * up with a serialization failure, which clients retry anyway.
 */
void
idem_too_many_tries(const char *action, text *job_type, text *key)
{
	ereport(ERROR,
			(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
			 errmsg("could not %s operation \"%s\" of job type \"%s\"",
					action, idem_text(key), idem_text(job_type)),
			 errdetail("The record changed under %d consecutive attempts to read it.",
					   IDEMPOTENCY_MAX_TRIES),
			 errhint("Retry the call.")));
}

/* Byte-wise equality of two texts (fingerprints) */
bool
idem_same_text(text *a, text *b)
{
	return VARSIZE_ANY_EXHDR(a) == VARSIZE_ANY_EXHDR(b) &&
		memcmp(VARDATA_ANY(a), VARDATA_ANY(b), VARSIZE_ANY_EXHDR(a)) == 0;
}

/* Byte order, a prefix first: the order a batch takes its keys in */
int
idem_text_cmp(text *a, text *b)
{
	int			la = VARSIZE_ANY_EXHDR(a);
	int			lb = VARSIZE_ANY_EXHDR(b);
	int			c = memcmp(VARDATA_ANY(a), VARDATA_ANY(b), Min(la, lb));

	if (c != 0)
		return c;
	return la < lb ? -1 : la > lb ? 1 : 0;
}

char *
idem_text(text *t)
{
	return text_to_cstring(t);
}

/*
 * Argument checks. Each bad input gets its own message; NULL is 22004,
 * empty is 22023, too long is 22001. `hint` says what to pass instead.
 */
static text *
arg_name(FunctionCallInfo fcinfo, int argno, const char *what, int maxbytes,
		 const char *hint)
{
	text	   *t;
	int			len;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", what),
				 errdetail("An operation is named by its job type and its operation key; neither may be NULL."),
				 errhint("%s", hint)));
	t = PG_GETARG_TEXT_PP(argno);
	len = VARSIZE_ANY_EXHDR(t);
	if (len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must not be empty", what),
				 errdetail("An operation is named by its job type and its operation key; neither may be an empty string."),
				 errhint("%s", hint)));
	if (len > maxbytes)
		ereport(ERROR,
				(errcode(ERRCODE_STRING_DATA_RIGHT_TRUNCATION),
				 errmsg("%s is too long", what),
				 errdetail("It is %d bytes long; the limit is %d bytes.", len, maxbytes),
				 errhint("Use a shorter identifier, or a hash of the long one (for example sha256).")));
	return t;
}

text *
idem_arg_job_type(FunctionCallInfo fcinfo, int argno)
{
	return arg_name(fcinfo, argno, "job_type", IDEMPOTENCY_MAX_JOB_TYPE_BYTES,
					"Pass the name of a job type registered in idempotency.job_types.");
}

text *
idem_arg_key(FunctionCallInfo fcinfo, int argno)
{
	return arg_name(fcinfo, argno, "operation_key", IDEMPOTENCY_MAX_KEY_BYTES,
					"Pass the key that names the effect, for example the order number (not the queue's message id).");
}

/*
 * Argument argno, a positive integer called `name`: NULL is 22004 and below
 * 1 is 22023, both with the caller's detail and hint.
 */
int32
idem_arg_positive_int32(FunctionCallInfo fcinfo, int argno, const char *name,
						const char *detail, const char *hint)
{
	int32		value;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", name),
				 errdetail("%s", detail),
				 errhint("%s", hint)));
	value = PG_GETARG_INT32(argno);
	if (value < 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be positive, not %d", name, value),
				 errdetail("%s", detail),
				 errhint("%s", hint)));
	return value;
}

/*
 * claim_operation()'s delivery argument: NULL (none), or 1 to
 * IDEMPOTENCY_MAX_DELIVERY_BYTES bytes.
 */
text *
idem_arg_delivery(FunctionCallInfo fcinfo, int argno)
{
	text	   *t;
	int			len;

	if (PG_ARGISNULL(argno))
		return NULL;
	t = PG_GETARG_TEXT_PP(argno);
	len = VARSIZE_ANY_EXHDR(t);
	if (len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("delivery must not be empty"),
				 errdetail("A delivery token names one delivery of a job, so that a retry of the same call gets its own claim back."),
				 errhint("Pass a token made once per delivery (for example a UUID made when the handler starts, or SQS's receipt handle), or NULL for none.")));
	if (len > IDEMPOTENCY_MAX_DELIVERY_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_STRING_DATA_RIGHT_TRUNCATION),
				 errmsg("delivery is too long"),
				 errdetail("It is %d bytes long; the limit is %d bytes.",
						   len, IDEMPOTENCY_MAX_DELIVERY_BYTES),
				 errhint("Use a shorter token, for example a UUID made once per delivery.")));
	return t;
}

/*
 * What a claim stores of its delivery token: a 64-bit digest of the token
 * and of the verdict it gave (run or verify), so that a retry of the same
 * call is recognised and given the same verdict, at 8 bytes per record
 * whatever the token's length. Two deliveries of one key are told apart
 * unless their digests collide (a chance of 2^-64 per pair).
 * hash_bytes_extended() is what hash partitioning uses: the same on every
 * server of one architecture and across pg_upgrade.
 */
int64
idem_delivery_digest(text *delivery, bool verify)
{
	return (int64) hash_bytes_extended((const unsigned char *) VARDATA_ANY(delivery),
									   VARSIZE_ANY_EXHDR(delivery),
									   verify ? 1 : 0);
}

int32
idem_arg_attempt(FunctionCallInfo fcinfo, int argno)
{
	int32		attempt;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("attempt must not be null"),
				 errdetail("The attempt is the fencing token that shows the caller still owns the claim."),
				 errhint("Pass the attempt that claim_operation() returned.")));
	attempt = PG_GETARG_INT32(argno);
	if (attempt < 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("attempt must be positive, not %d", attempt),
				 errdetail("Attempts are numbered from 1; claim_operation() never returns %d.", attempt),
				 errhint("Pass the attempt that claim_operation() returned.")));
	return attempt;
}
