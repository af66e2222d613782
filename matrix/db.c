/*
 * db.c
 *		What both runs read and write in the database, on the runner's own
 *		(control) connection: the run's job types, a record's text, and
 *		stale_claims() polled until a lease ran out.
 *
 * Waiting for a lease to run out is done by polling stale_claims() until it
 * lists the key, never by sleeping a guessed time.
 */
#include "postgres_fe.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "matrix.h"

#define POLL_MS 10				/* database polling interval */

PGresult *
db_exec(matrix_ctx *ctx, const char *sql, int nparams, const char *const *params)
{
	return PQexecParams(ctx->conn, sql, nparams, NULL, params, NULL, NULL, 0);
}

/* "SQLSTATE: primary message" of a failed query, on one line */
const char *
case_sql_error(PGresult *res, matrix_ctx *ctx)
{
	static char buf[512];
	const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
	const char *msg = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);
	char	   *p;

	if (msg == NULL)
		msg = PQerrorMessage(ctx->conn);
	snprintf(buf, sizeof(buf), "%s%s%s", state ? state : "", state ? ": " : "", msg);
	for (p = buf; *p; p++)
		if (*p == '\n' || *p == '\t')
			*p = ' ';
	while (p > buf && p[-1] == ' ')
		*--p = '\0';
	return buf;
}


/*
 * A job type of the run's: the run's lease and the policy, no max_attempts,
 * no retention; false with the error in err
 */
bool
job_type_register(matrix_ctx *ctx, const char *job_type, policy_t policy,
				  char *err, size_t esz)
{
	const char *params[3];
	PGresult   *res;
	bool		ok;

	params[0] = job_type;
	params[1] = ctx->lease_sql;
	params[2] = policy_names[policy];
	res = db_exec(ctx,
				  "INSERT INTO idempotency.job_types "
				  "(job_type, lease, stale_policy, max_attempts, retention) "
				  "VALUES ($1, $2::interval, $3::idempotency.stale_policy, NULL, NULL)",
				  3, params);
	ok = PQresultStatus(res) == PGRES_COMMAND_OK;
	if (!ok)
		snprintf(err, esz, "cannot register job type %s: %s", job_type, case_sql_error(res, ctx));
	PQclear(res);
	return ok;
}

PGresult *
record_query(matrix_ctx *ctx, const char *job_type, const char *key)
{
	const char *params[2];

	params[0] = job_type;
	params[1] = key;
	return db_exec(ctx,
				   "SELECT o.status::text, o.attempt, o.result::text "
				   "FROM idempotency.operations o "
				   "WHERE o.job_type OPERATOR(pg_catalog.=) $1 "
				   "  AND o.operation_key OPERATOR(pg_catalog.=) $2",
				   2, params);
}

/*
 * stale_claims()'s row of (job_type, key): attempt, claimed_by, policy,
 * stale_for, and whether its lease has run out (zero or one row)
 */
PGresult *
stale_claim_query(matrix_ctx *ctx, const char *job_type, const char *key)
{
	const char *params[2];

	params[0] = job_type;
	params[1] = key;
	return db_exec(ctx,
				   "SELECT attempt, claimed_by, stale_policy::text, stale_for::text, "
				   "       lease_expired_at OPERATOR(pg_catalog.<=) pg_catalog.clock_timestamp() "
				   "FROM idempotency.stale_claims($1) "
				   "WHERE operation_key OPERATOR(pg_catalog.=) $2",
				   2, params);
}

/*
 * "completed #1", "claimed #1 (stale)", "none", or "?" (a failure noted in
 * cr) for the record of (job_type, key); result gets its stored result.
 */
void
record_text_of(matrix_ctx *ctx, case_result *cr, const char *job_type,
			   const char *key, char *buf, size_t sz, char *result, size_t rsz)
{
	/*
	 * The record, then (for a claim) stale_claims() in a statement of its
	 * own: on Citus a query of one key runs on the shard's node, where a
	 * function that reads the distributed table cannot run inside it.
	 */
	PGresult   *res = record_query(ctx, job_type, key);

	if (result)
		copy_str(result, rsz, "");
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		case_fail(cr, "cannot read the record of %s: %s", key, case_sql_error(res, ctx));
		copy_str(buf, sz, "?");
	}
	else if (PQntuples(res) == 0)
		copy_str(buf, sz, "none");
	else
	{
		const char *status = PQgetvalue(res, 0, 0);

		if (strcmp(status, "claimed") == 0)
		{
			int			stale = stale_listed(ctx, cr, job_type, key);

			snprintf(buf, sz, "claimed #%s (%s)", PQgetvalue(res, 0, 1),
					 stale < 0 ? "?" : stale ? "stale" : "young");
		}
		else
			snprintf(buf, sz, "%s #%s", status, PQgetvalue(res, 0, 1));
		if (result)
			copy_str(result, rsz, PQgetvalue(res, 0, 2));
	}
	PQclear(res);
}

/* is the key listed by stale_claims()? 1 yes, 0 no, -1 error (noted in cr) */
int
stale_listed(matrix_ctx *ctx, case_result *cr, const char *job_type,
			 const char *key)
{
	const char *params[2];
	PGresult   *res;
	int			r;

	params[0] = job_type;
	params[1] = key;
	res = db_exec(ctx,
				  "SELECT 1 FROM idempotency.stale_claims($1) s "
				  "WHERE s.operation_key OPERATOR(pg_catalog.=) $2",
				  2, params);
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		case_fail(cr, "stale_claims() failed: %s", case_sql_error(res, ctx));
		r = -1;
	}
	else
		r = PQntuples(res) > 0 ? 1 : 0;
	PQclear(res);
	return r;
}

/*
 * Wait until the claim's lease ran out, by asking the database: poll
 * stale_claims() until it lists the key. No guessed sleep. policy_name is
 * for the progress line. Between two polls idle(idle_arg, ms) runs (the
 * sign-off run serves its socket there); NULL: sleep.
 */
bool
stale_wait(matrix_ctx *ctx, case_result *cr, const char *job_type,
		   const char *key, const char *policy_name,
		   void (*idle) (void *arg, int ms), void *idle_arg)
{
	double		t0 = now_seconds();
	double		limit = ctx->lease_s + ctx->timeout_s;

	progress(ctx, "%s case %s: waiting for the lease (%s) to run out",
			 policy_name, cr->id, ctx->lease_sql);
	for (;;)
	{
		int			r = stale_listed(ctx, cr, job_type, key);

		if (r < 0)
			return false;
		if (r == 1)
		{
			case_note(cr, "The lease ran out %.2f s later: stale_claims() lists the claim.",
					  now_seconds() - t0);
			return true;
		}
		if (matrix_interrupted)
		{
			case_fail(cr, "interrupted");
			return false;
		}
		if (now_seconds() - t0 > limit)
		{
			case_fail(cr, "stale_claims() did not list %s within %.0f s", key, limit);
			return false;
		}
		if (idle)
			idle(idle_arg, POLL_MS);
		else
			sleep_ms(POLL_MS);
	}
}
