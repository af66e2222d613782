/*-------------------------------------------------------------------------
 *
 * record.c
 *	  The one decoder of what a lookup read, whatever the backend: one row
 *	  with the job type and the record (one node), or a row of each (the
 *	  routed store). Each backend names where its columns are
 *	  (LookupColumns); the decoding is the same.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "nodes/value.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "compat.h"
#include "store.h"

/* An empty state: nothing found, no worker_role */
void
idem_state_init(OperationState *state)
{
	memset(state, 0, sizeof(*state));
	state->worker_role = InvalidOid;
}

static OperationStatus
parse_status(const char *s)
{
	if (strcmp(s, "claimed") == 0)
		return OPERATION_CLAIMED;
	if (strcmp(s, "completed") == 0)
		return OPERATION_COMPLETED;
	if (strcmp(s, "released") == 0)
		return OPERATION_RELEASED;
	if (strcmp(s, "skipped") == 0)
		return OPERATION_SKIPPED;
	elog(ERROR, "unexpected operation status \"%s\"", s);
	pg_unreachable();
}

static StalePolicy
parse_policy(const char *s)
{
	if (strcmp(s, "hold") == 0)
		return STALE_HOLD;
	if (strcmp(s, "retry") == 0)
		return STALE_RETRY;
	if (strcmp(s, "skip") == 0)
		return STALE_SKIP;
	if (strcmp(s, "lookup") == 0)
		return STALE_LOOKUP;
	elog(ERROR, "unexpected stale policy \"%s\"", s);
	pg_unreachable();
}

/* Decode the job type's columns of `tuple` into *state; *lease if asked */
void
idem_decode_job_type(HeapTuple tuple, TupleDesc desc, const LookupColumns *c,
				OperationState *state, Interval *lease)
{
	bool		isnull;

	state->job_type_found = true;
	state->policy = parse_policy(SPI_getvalue(tuple, desc, c->policy));
	state->max_attempts = DatumGetInt32(SPI_getbinval(tuple, desc, c->max_attempts, &isnull));
	if (isnull)
		state->max_attempts = 0;
	if (c->lease)
		*lease = *DatumGetIntervalP(SPI_getbinval(tuple, desc, c->lease, &isnull));
	if (c->role_oid)
	{
		Datum		role = SPI_getbinval(tuple, desc, c->role_oid, &isnull);

		state->worker_role = isnull ? InvalidOid : DatumGetObjectId(role);
	}
	if (c->role_name)
	{
		char	   *name = SPI_getvalue(tuple, desc, c->role_name);

		if (name != NULL)
		{
			List	   *names = idem_string_to_names(name);

			if (list_length(names) == 1)
				state->worker_role = get_role_oid(strVal(linitial(names)), true);
			state->worker_role_missing = !OidIsValid(state->worker_role);
		}
	}
}

/*
 * Decode the record's columns of `tuple` into *state; false if the row
 * has no record (the one-node lookup's LEFT JOIN found none). The expiry
 * is read, or computed from `lease`.
 */
bool
idem_decode_record(HeapTuple tuple, TupleDesc desc, const LookupColumns *c,
			  OperationState *state, const Interval *lease)
{
	bool		isnull;
	Datum		d;

	if (c->delivery)
	{
		d = SPI_getbinval(tuple, desc, c->delivery, &isnull);
		state->delivery_found = !isnull;
		state->delivery = isnull ? 0 : DatumGetInt64(d);
	}
	(void) SPI_getbinval(tuple, desc, c->status, &isnull);
	if (isnull)
		return false;
	state->found = true;
	state->status = parse_status(SPI_getvalue(tuple, desc, c->status));
	state->attempt = DatumGetInt32(SPI_getbinval(tuple, desc, c->attempt, &isnull));
	state->heartbeat_at = DatumGetTimestampTz(SPI_getbinval(tuple, desc, c->heartbeat_at, &isnull));
	if (c->expires_at)
		state->expires_at = DatumGetTimestampTz(SPI_getbinval(tuple, desc, c->expires_at, &isnull));
	else
		state->expires_at =
			DatumGetTimestampTz(DirectFunctionCall2(timestamptz_pl_interval,
													TimestampTzGetDatum(state->heartbeat_at),
													IntervalPGetDatum(lease)));
	d = SPI_getbinval(tuple, desc, c->fingerprint, &isnull);
	state->fingerprint = isnull ? NULL : DatumGetTextPP(d);
	state->result = SPI_getbinval(tuple, desc, c->result, &state->result_isnull);
	return true;
}

