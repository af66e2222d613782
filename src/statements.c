/*-------------------------------------------------------------------------
 *
 * statements.c
 *	  Every SPI statement of the extension, in one table: statement set x
 *	  operation x variant, each with its parameters named beside it; and
 *	  the runner that prepares them into the plans of the store that uses
 *	  them.
 *
 * Every name is schema-qualified, operators included, so the caller's
 * search_path cannot capture them. Every column the C code reads with
 * SPI_getbinval() is cast to the type it assumes: a no-op for the
 * extension's own tables, a clear error (or a conversion) if a superuser
 * changed a column's type, never a datum of the wrong type. Parameters are
 * of built-in types only (text, integer, oid, name, tid, tid[],
 * timestamptz, jsonb), so when the extension is dropped and created again
 * the plan cache re-analyzes kept plans against the new objects.
 *
 * SET_ONE_NODE is what runs on the extension's tables, and renamed on a
 * local shard. SET_ROUTED holds only the statements that must read
 * otherwise where Citus plans and routes them; every other operation
 * routed runs the one-node text. Why each differs is said beside it.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "lib/stringinfo.h"

#include "store.h"

/* Shorthands for the statement texts */
#define EQ		" OPERATOR(pg_catalog.=) "
#define LE		" OPERATOR(pg_catalog.<=) "
#define PLUS	" OPERATOR(pg_catalog.+) "
#define MINUS	" OPERATOR(pg_catalog.-) "
#define THIS_OPERATION	"o.job_type" EQ "$1 AND o.operation_key" EQ "$2"
/*
 * compare-and-swap: the record is still as the lookup read it ($3 attempt,
 * $4 heartbeat, $5 status). The status read is cast, not the column: a
 * STABLE function (enum_out) over a column in an UPDATE is what Citus
 * cannot route.
 */
#define AS_READ \
	" AND o.attempt" EQ "$3 AND o.heartbeat_at" EQ "$4" \
	" AND o.status" EQ "$5::idempotency.operation_status"

#define LOOKUP_SQL(extra_columns) \
	"SELECT jt.stale_policy::pg_catalog.text, jt.max_attempts::pg_catalog.int4," \
	" o.status::pg_catalog.text, o.attempt::pg_catalog.int4," \
	" o.heartbeat_at::pg_catalog.timestamptz," \
	" (o.heartbeat_at" PLUS "jt.lease)::pg_catalog.timestamptz," \
	" o.fingerprint::pg_catalog.text, o.result::pg_catalog.jsonb" extra_columns \
	" FROM idempotency.job_types jt" \
	" LEFT JOIN idempotency.operations o" \
	" ON o.job_type" EQ "jt.job_type AND o.operation_key" EQ "$2" \
	" WHERE jt.job_type" EQ "$1"
/* the caller ($6) may work the job type */
#define ROLE_MAY_WORK_JT \
	"(jt.worker_role IS NULL OR pg_catalog.pg_has_role($6," \
	" jt.worker_role::pg_catalog.oid, 'USAGE'))"
#define ROLE_MAY_WORK_O \
	" AND EXISTS (SELECT FROM idempotency.job_types jt" \
	" WHERE jt.job_type" EQ "o.job_type AND " ROLE_MAY_WORK_JT ")"
/*
 * The same where Citus routes the statement to the node that holds the key,
 * whose role OIDs differ from the calling node's (Citus propagates roles by
 * name): $6 the caller's name, $7 the job type's worker_role by name, read
 * before from the calling node's job_types placement (a reference table:
 * the same rows on every node). The statement compares them where it runs.
 * It cannot read job_types itself: a statement over tables of two
 * colocation groups is refused inside a call that Citus delegated with
 * force_delegation and runs through its planner (a worker's transaction
 * block, its own key), with 0A000.
 */
#define ROLE_MAY_WORK_BY_NAME \
	" AND pg_catalog.pg_has_role($6, $7, 'USAGE')"

#define INSERT_COLUMNS \
	"INSERT INTO idempotency.operations AS o" \
	" (job_type, operation_key, status, attempt, claimed_at, heartbeat_at," \
	" claimed_by, fingerprint"
#define INSERT_SQL(delivery_column, delivery_value, where) \
	INSERT_COLUMNS delivery_column ")" \
	" SELECT jt.job_type, $2, 'claimed', 1, $3, $3, $4, $5" delivery_value \
	" FROM idempotency.job_types jt WHERE jt.job_type" EQ "$1" where \
	" ON CONFLICT ON CONSTRAINT operations_pkey DO NOTHING RETURNING 1"
#define TAKEOVER_SQL(extra_set) \
	"UPDATE idempotency.operations o" \
	" SET status = 'claimed', attempt = o.attempt" PLUS "1," \
	" claimed_at = $6, heartbeat_at = $6, completed_at = NULL," \
	" claimed_by = $7, fingerprint = COALESCE(o.fingerprint, $8), result = NULL" \
	extra_set " WHERE " THIS_OPERATION AS_READ
#define COMPLETE_SQL(extra) \
	"UPDATE idempotency.operations o" \
	" SET status = 'completed', completed_at = $4, result = $5" \
	" WHERE " THIS_OPERATION " AND o.attempt" EQ "$3" \
	" AND (o.status" EQ "'claimed' OR o.status" EQ "'skipped')" extra
#define RELEASE_SQL(extra) \
	"UPDATE idempotency.operations o" \
	" SET status = 'released', completed_at = NULL, result = NULL" \
	" WHERE " THIS_OPERATION " AND o.attempt" EQ "$3" \
	" AND (o.status" EQ "'claimed' OR o.status" EQ "'skipped')" extra
#define EXTEND_SQL(extra) \
	"UPDATE idempotency.operations o SET heartbeat_at = $4" \
	" WHERE " THIS_OPERATION \
	" AND o.attempt" EQ "$3 AND o.status" EQ "'claimed'" extra
#define STALE_CLAIMS_SQL \
	"SELECT o.job_type::pg_catalog.text, o.operation_key::pg_catalog.text," \
	" o.attempt::pg_catalog.int4, o.claimed_at::pg_catalog.timestamptz," \
	" o.claimed_by::pg_catalog.text, jt.stale_policy::idempotency.stale_policy," \
	" (o.heartbeat_at" PLUS "jt.lease)::pg_catalog.timestamptz," \
	" ($1" MINUS "(o.heartbeat_at" PLUS "jt.lease))::pg_catalog.interval" \
	" FROM idempotency.operations o" \
	" JOIN idempotency.job_types jt ON jt.job_type" EQ "o.job_type" \
	" WHERE o.status" EQ "'claimed'" \
	" AND (o.heartbeat_at" PLUS "jt.lease)" LE "$1"
#define PURGEABLE \
	" jt.job_type" EQ "o.job_type AND jt.retention IS NOT NULL" \
	" AND (o.status" EQ "'completed' OR o.status" EQ "'skipped')" \
	" AND o.completed_at" LE "($1" MINUS "jt.retention)"

/* A parameter: its name (for the reader) and type */
typedef struct StatementParam
{
	const char *name;
	Oid			type;
} StatementParam;

#define MAX_PARAMS	9

typedef struct StatementDef
{
	const char *sql;
	int			nparams;
	StatementParam		params[MAX_PARAMS];
} StatementDef;

/* The parameters that recur */
#define P_JOB_TYPE		{"job_type", TEXTOID}
#define P_KEY			{"operation_key", TEXTOID}
#define P_NOW			{"now", TIMESTAMPTZOID}
#define P_WORKER		{"worker", TEXTOID}
#define P_FINGERPRINT	{"fingerprint", TEXTOID}
#define P_CALLER		{"caller", OIDOID}
#define P_DIGEST		{"delivery_digest", INT8OID}
#define P_ATTEMPT		{"attempt", INT4OID}
#define P_READ_ATTEMPT	{"attempt_read", INT4OID}
#define P_READ_HEARTBEAT {"heartbeat_read", TIMESTAMPTZOID}
#define P_READ_STATUS	{"status_read", TEXTOID}
#define P_RESULT		{"result", JSONBOID}
#define P_UNUSED(t)		{"(unused)", t}

#define INSERT_PARAMS \
	P_JOB_TYPE, P_KEY, P_NOW, P_WORKER, P_FINGERPRINT
#define TAKEOVER_PARAMS \
	P_JOB_TYPE, P_KEY, P_READ_ATTEMPT, P_READ_HEARTBEAT, P_READ_STATUS, \
	P_NOW, P_WORKER, P_FINGERPRINT
/* release and extend take the parameters of complete (unused: 5, and 4) */
#define FENCED_PARAMS \
	P_JOB_TYPE, P_KEY, P_ATTEMPT, P_NOW, P_RESULT

static const StatementDef statements[SET_COUNT][OP_COUNT][VARIANT_COUNT] = {
	[SET_ONE_NODE] = {
		/* one row: the job type, and the record if any (LEFT JOIN) */
		[OP_LOOKUP] = {
			[VARIANT_BASE] = {LOOKUP_SQL(""), 2, {P_JOB_TYPE, P_KEY}},
			/* the job type's worker_role as a ninth column */
			[VARIANT_ROLE] = {
				LOOKUP_SQL(", jt.worker_role::pg_catalog.regrole::pg_catalog.oid"),
				2, {P_JOB_TYPE, P_KEY}
			},
			/* and the record's delivery digest as a tenth */
			[VARIANT_DELIVERY] = {
				LOOKUP_SQL(", jt.worker_role::pg_catalog.regrole::pg_catalog.oid,"
						   " o.delivery::pg_catalog.int8"),
				2, {P_JOB_TYPE, P_KEY}
			},
		},

		/*
		 * Inserts nothing if the job type was removed since the lookup: the
		 * statement's snapshot is taken after its table lock, which waits
		 * for the removal (job_types_guard()). With the role check it also
		 * inserts nothing if the caller may not work the job type; the
		 * lookup that follows says why.
		 */
		[OP_INSERT] = {
			[VARIANT_BASE] = {INSERT_SQL("", "", ""), 5, {INSERT_PARAMS}},
			[VARIANT_ROLE] = {
				INSERT_SQL("", "", " AND " ROLE_MAY_WORK_JT),
				6, {INSERT_PARAMS, P_CALLER}
			},
			[VARIANT_DELIVERY] = {
				INSERT_SQL(", delivery", ", $7", " AND " ROLE_MAY_WORK_JT),
				7, {INSERT_PARAMS, P_CALLER, P_DIGEST}
			},
		},

		/*
		 * claim_operations(): the keys, fingerprints and delivery digests
		 * as parallel arrays, inserted in the arrays' order; returns the
		 * keys it inserted. The batch calls have every capability.
		 */
		[OP_INSERT_BATCH] = {
			[VARIANT_DELIVERY] = {
				INSERT_COLUMNS ", delivery)"
				" SELECT jt.job_type, k.key, 'claimed', 1, $3, $3, $4, k.fp, k.delivery"
				" FROM idempotency.job_types jt,"
				" ROWS FROM (pg_catalog.unnest($2), pg_catalog.unnest($5), pg_catalog.unnest($7))"
				" WITH ORDINALITY AS k(key, fp, delivery, n)"
				" WHERE jt.job_type" EQ "$1 AND " ROLE_MAY_WORK_JT
				" ORDER BY k.n"
				" ON CONFLICT ON CONSTRAINT operations_pkey DO NOTHING"
				" RETURNING o.operation_key::pg_catalog.text",
				7, {P_JOB_TYPE, {"operation_keys", TEXTARRAYOID}, P_NOW, P_WORKER,
					{"fingerprints", TEXTARRAYOID}, P_CALLER,
					{"delivery_digests", INT8ARRAYOID}}
			},
		},

		[OP_TAKE_OVER] = {
			[VARIANT_BASE] = {TAKEOVER_SQL(""), 8, {TAKEOVER_PARAMS}},
			[VARIANT_DELIVERY] = {
				TAKEOVER_SQL(", delivery = $9"), 9, {TAKEOVER_PARAMS, P_DIGEST}
			},
		},

		[OP_SKIP] = {
			[VARIANT_BASE] = {
				"UPDATE idempotency.operations o"
				" SET status = 'skipped', completed_at = $5"
				" WHERE " THIS_OPERATION " AND o.attempt" EQ "$3"
				" AND o.heartbeat_at" EQ "$4 AND o.status" EQ "'claimed'",
				5, {P_JOB_TYPE, P_KEY, P_READ_ATTEMPT, P_READ_HEARTBEAT, P_NOW}
			},
		},

		/*
		 * No expression over a column calls a STABLE function (extend's
		 * new expiry is read by a lookup after the update; pg_has_role()
		 * sits in a subquery), which is what Citus refuses in an UPDATE.
		 */
		[OP_COMPLETE] = {
			[VARIANT_BASE] = {COMPLETE_SQL(""), 5, {FENCED_PARAMS}},
			[VARIANT_ROLE] = {COMPLETE_SQL(ROLE_MAY_WORK_O), 6, {FENCED_PARAMS, P_CALLER}},
		},
		[OP_RELEASE] = {
			[VARIANT_BASE] = {RELEASE_SQL(""), 5, {FENCED_PARAMS}},
			[VARIANT_ROLE] = {RELEASE_SQL(ROLE_MAY_WORK_O), 6, {FENCED_PARAMS, P_CALLER}},
		},
		[OP_EXTEND] = {
			[VARIANT_BASE] = {EXTEND_SQL(""), 5, {FENCED_PARAMS}},
			[VARIANT_ROLE] = {EXTEND_SQL(ROLE_MAY_WORK_O), 6, {FENCED_PARAMS, P_CALLER}},
		},

		/* the columns of stale_claims() */
		[OP_STALE_ALL] = {
			[VARIANT_BASE] = {STALE_CLAIMS_SQL " ORDER BY 7, 1, 2", 1, {P_NOW}},
		},
		[OP_STALE_ONE] = {
			[VARIANT_BASE] = {
				STALE_CLAIMS_SQL " AND o.job_type" EQ "$2 ORDER BY 7, 1, 2",
				2, {P_NOW, P_JOB_TYPE}
			},
		},

		[OP_RESOLVE_COMPLETED] = {
			[VARIANT_BASE] = {
				"UPDATE idempotency.operations o"
				" SET status = 'completed', completed_at = $6"
				" WHERE " THIS_OPERATION AS_READ,
				6, {P_JOB_TYPE, P_KEY, P_READ_ATTEMPT, P_READ_HEARTBEAT, P_READ_STATUS, P_NOW}
			},
		},
		[OP_RESOLVE_RETRY] = {
			[VARIANT_BASE] = {
				"UPDATE idempotency.operations o"
				" SET status = 'released', completed_at = NULL, result = NULL"
				" WHERE " THIS_OPERATION AS_READ,
				5, {P_JOB_TYPE, P_KEY, P_READ_ATTEMPT, P_READ_HEARTBEAT, P_READ_STATUS}
			},
		},
		[OP_AUDIT] = {
			[VARIANT_BASE] = {
				"INSERT INTO idempotency.resolutions"
				" (job_type, operation_key, attempt, previous_status, resolution,"
				" resolved_by, resolved_at, note)"
				" VALUES ($1, $2, $3, $4::idempotency.operation_status, $5,"
				" $6::pg_catalog.name, $7, $8)",
				8, {P_JOB_TYPE, P_KEY, P_ATTEMPT, {"previous_status", TEXTOID},
					{"resolution", TEXTOID}, {"resolved_by", TEXTOID}, P_NOW,
					{"note", TEXTOID}}
			},
		},

		[OP_PURGE_SCAN] = {
			[VARIANT_BASE] = {
				"SELECT o.ctid FROM idempotency.operations o, idempotency.job_types jt"
				" WHERE" PURGEABLE,
				1, {P_NOW}
			},
		},
		/* one batch of the scan's ctids; every condition is checked again */
		[OP_PURGE_DELETE] = {
			[VARIANT_BASE] = {
				"DELETE FROM idempotency.operations o USING idempotency.job_types jt"
				" WHERE o.ctid" EQ "ANY ($2) AND" PURGEABLE,
				2, {P_NOW, {"ctids", TIDARRAYOID}}
			},
		},
		[OP_PURGE_RANGE] = {
			[VARIANT_BASE] = {
				"DELETE FROM idempotency.operations o USING idempotency.job_types jt"
				" WHERE o.ctid OPERATOR(pg_catalog.>=) $2 AND o.ctid OPERATOR(pg_catalog.<) $3"
				" AND" PURGEABLE,
				3, {P_NOW, {"first_tid", TIDOID}, {"end_tid", TIDOID}}
			},
		},
	},

	[SET_ROUTED] = {
		/*
		 * The lookup is two statements: the job type from the reference
		 * table, then the record by its key, alone. Inside a function Citus
		 * delegates with force_delegation (a call in a transaction block
		 * runs on the worker that holds the key, in the caller's
		 * connection, so the caller's own writes to colocated tables join
		 * the same transaction there), a statement that joins the
		 * distributed table with another is refused. The worker_role by
		 * name: the statement may run on another node than the call, whose
		 * role OIDs differ (a numeric OID if that node has no such role);
		 * record.c resolves it here.
		 */
		[OP_LOOKUP_JOB_TYPE] = {
			[VARIANT_BASE] = {
				"SELECT jt.stale_policy::pg_catalog.text, jt.max_attempts::pg_catalog.int4,"
				" jt.lease::pg_catalog.interval,"
				" jt.worker_role::pg_catalog.regrole::pg_catalog.text"
				" FROM idempotency.job_types jt WHERE jt.job_type" EQ "$1",
				1, {P_JOB_TYPE}
			},
		},
		[OP_LOOKUP_RECORD] = {
			[VARIANT_BASE] = {
				"SELECT o.status::pg_catalog.text, o.attempt::pg_catalog.int4,"
				" o.heartbeat_at::pg_catalog.timestamptz, o.fingerprint::pg_catalog.text,"
				" o.result::pg_catalog.jsonb, o.delivery::pg_catalog.int8"
				" FROM idempotency.operations o WHERE " THIS_OPERATION,
				2, {P_JOB_TYPE, P_KEY}
			},
		},

		/*
		 * The records of many keys of one shard (a batch's group, see
		 * StoreBackend's lookup_many), the key first; Citus prunes "=
		 * ANY" of the bound array to the shards of its keys.
		 */
		[OP_LOOKUP_RECORDS] = {
			[VARIANT_BASE] = {
				"SELECT o.operation_key::pg_catalog.text,"
				" o.status::pg_catalog.text, o.attempt::pg_catalog.int4,"
				" o.heartbeat_at::pg_catalog.timestamptz, o.fingerprint::pg_catalog.text,"
				" o.result::pg_catalog.jsonb, o.delivery::pg_catalog.int8"
				" FROM idempotency.operations o WHERE o.job_type" EQ "$1"
				" AND o.operation_key" EQ "ANY ($2)",
				2, {P_JOB_TYPE, {"operation_keys", TEXTARRAYOID}}
			},
		},

		/*
		 * The insert as one row of VALUES, which Citus routes to the key's
		 * shard and counts (INSERT ... SELECT from the reference table is
		 * collected on the coordinator, whose count SPI cannot reconcile
		 * with RETURNING). The lookup before it checked the job type and
		 * the caller's role; the foreign key that distribute() adds keeps
		 * the job type from going away meanwhile. Same parameters as one
		 * node's, the caller unused.
		 */
		[OP_INSERT] = {
			[VARIANT_BASE] = {
				INSERT_COLUMNS ")"
				" VALUES ($1, $2, 'claimed', 1, $3, $3, $4, $5)"
				" ON CONFLICT ON CONSTRAINT operations_pkey DO NOTHING",
				5, {INSERT_PARAMS}
			},
			[VARIANT_DELIVERY] = {
				INSERT_COLUMNS ", delivery)"
				" VALUES ($1, $2, 'claimed', 1, $3, $3, $4, $5, $7)"
				" ON CONFLICT ON CONSTRAINT operations_pkey DO NOTHING",
				7, {INSERT_PARAMS, P_UNUSED(OIDOID), P_DIGEST}
			},
		},

		/* the fenced updates' role check by name (ROLE_MAY_WORK_BY_NAME) */
#define ROUTED_FENCED_PARAMS \
	FENCED_PARAMS, {"caller_name", NAMEOID}, {"worker_role_name", NAMEOID}
		[OP_COMPLETE] = {
			[VARIANT_ROLE_NAME] = {
				COMPLETE_SQL(ROLE_MAY_WORK_BY_NAME), 7, {ROUTED_FENCED_PARAMS}
			},
		},
		/*
		 * complete_operation()'s update of many keys of one shard (a
		 * batch's group, distinct keys); $3 maps each key to
		 * [attempt, result] ([attempt] for no result): an array parameter
		 * subscripted in SET crashes Citus 13.2's deparser. Returns the
		 * keys it completed.
		 */
#define COMPLETE_MANY_OF	" OPERATOR(pg_catalog.->) o.operation_key::pg_catalog.text"
#define COMPLETE_MANY_SQL(extra) \
	"UPDATE idempotency.operations o" \
	" SET status = 'completed', completed_at = $4," \
	" result = $3" COMPLETE_MANY_OF " OPERATOR(pg_catalog.->) 1" \
	" WHERE o.job_type" EQ "$1 AND o.operation_key" EQ "ANY ($2)" \
	" AND o.attempt" EQ "(($3" COMPLETE_MANY_OF ") OPERATOR(pg_catalog.->>) 0)::pg_catalog.int4" \
	" AND (o.status" EQ "'claimed' OR o.status" EQ "'skipped')" extra \
	" RETURNING o.operation_key::pg_catalog.text"
#define COMPLETE_MANY_PARAMS \
	P_JOB_TYPE, {"operation_keys", TEXTARRAYOID}, {"attempts_results", JSONBOID}, P_NOW, \
	P_UNUSED(JSONBOID)
		[OP_COMPLETE_MANY] = {
			[VARIANT_BASE] = {COMPLETE_MANY_SQL(""), 5, {COMPLETE_MANY_PARAMS}},
			[VARIANT_ROLE_NAME] = {
				COMPLETE_MANY_SQL(ROLE_MAY_WORK_BY_NAME), 7,
				{COMPLETE_MANY_PARAMS, {"caller_name", NAMEOID}, {"worker_role_name", NAMEOID}}
			},
		},
		/* ... and release_operation()'s ($3: [attempt] per key) */
#define RELEASE_MANY_SQL(extra) \
	"UPDATE idempotency.operations o" \
	" SET status = 'released', completed_at = NULL, result = NULL" \
	" WHERE o.job_type" EQ "$1 AND o.operation_key" EQ "ANY ($2)" \
	" AND o.attempt" EQ "(($3" COMPLETE_MANY_OF ") OPERATOR(pg_catalog.->>) 0)::pg_catalog.int4" \
	" AND (o.status" EQ "'claimed' OR o.status" EQ "'skipped')" extra \
	" RETURNING o.operation_key::pg_catalog.text"
		[OP_RELEASE_MANY] = {
			[VARIANT_BASE] = {RELEASE_MANY_SQL(""), 5, {COMPLETE_MANY_PARAMS}},
			[VARIANT_ROLE_NAME] = {
				RELEASE_MANY_SQL(ROLE_MAY_WORK_BY_NAME), 7,
				{COMPLETE_MANY_PARAMS, {"caller_name", NAMEOID}, {"worker_role_name", NAMEOID}}
			},
		},
		[OP_RELEASE] = {
			[VARIANT_ROLE_NAME] = {
				RELEASE_SQL(ROLE_MAY_WORK_BY_NAME), 7, {ROUTED_FENCED_PARAMS}
			},
		},
		[OP_EXTEND] = {
			[VARIANT_ROLE_NAME] = {
				EXTEND_SQL(ROLE_MAY_WORK_BY_NAME), 7, {ROUTED_FENCED_PARAMS}
			},
		},

		/*
		 * The purge without ctids (they are per shard, and Citus cannot
		 * route a STABLE expression over a column in a DELETE): the cutoff
		 * of each job type first, from the reference table ...
		 */
		[OP_PURGE_CUTOFFS] = {
			[VARIANT_BASE] = {
				"SELECT jt.job_type::pg_catalog.text,"
				" ($1" MINUS "jt.retention)::pg_catalog.timestamptz"
				" FROM idempotency.job_types jt WHERE jt.retention IS NOT NULL"
				" ORDER BY 1",
				1, {P_NOW}
			},
		},
		/* ... then one DELETE per job type, on every shard */
		[OP_PURGE_JOB_TYPE] = {
			[VARIANT_BASE] = {
				"DELETE FROM idempotency.operations o"
				" WHERE o.job_type" EQ "$1"
				" AND (o.status" EQ "'completed' OR o.status" EQ "'skipped')"
				" AND o.completed_at" LE "$2",
				2, {P_JOB_TYPE, {"cutoff", TIMESTAMPTZOID}}
			},
		},
	},
};

/*
 * The routed store's insert of `rows` keys of one job type (a batch's group,
 * StoreBackend's insert_many) as rows of VALUES, which Citus routes to their
 * shard (an INSERT ... SELECT would be collected on the coordinator): the
 * single routed insert's row once per key. Parameters: $1 job_type, $2
 * now, $3 worker, then for row i (from 0) $(4+3i) operation_key,
 * $(5+3i) fingerprint, $(6+3i) delivery_digest; returns the keys it
 * inserted. Palloc'd.
 */
char *
idem_insert_rows_sql(int rows, Oid *types)
{
	StringInfoData sql;

	initStringInfo(&sql);
	appendStringInfoString(&sql, INSERT_COLUMNS ", delivery) VALUES ");
	types[0] = TEXTOID;
	types[1] = TIMESTAMPTZOID;
	types[2] = TEXTOID;
	for (int i = 0; i < rows; i++)
	{
		int			p = 4 + 3 * i;

		appendStringInfo(&sql, "%s($1, $%d, 'claimed', 1, $2, $2, $3, $%d, $%d)",
						 i > 0 ? ", " : "", p, p + 1, p + 2);
		types[p - 1] = TEXTOID;
		types[p] = TEXTOID;
		types[p + 1] = INT8OID;
	}
	appendStringInfoString(&sql, " ON CONFLICT ON CONSTRAINT operations_pkey DO NOTHING"
						   " RETURNING o.operation_key::pg_catalog.text");
	return sql.data;
}

/*
 * The statement of `op` for `set` and variant `v`: the set's own, else
 * one node's; the variant asked for, else the one before it (DELIVERY ->
 * ROLE -> BASE; ROLE_NAME has none before it).
 */
static const StatementDef *
find_statement(StatementSet set, StoreOp op, StoreVariant v)
{
	for (;;)
	{
		for (int w = v; w >= 0; w--)
		{
			if (statements[set][op][w].sql != NULL)
				return &statements[set][op][w];
			if (w == VARIANT_ROLE_NAME || w == VARIANT_BASE)
				break;
		}
		if (set == SET_ONE_NODE)
			break;
		set = SET_ONE_NODE;
	}
	elog(ERROR, "no statement for operation %d, variant %d", (int) op, (int) v);
	pg_unreachable();
}

/* Prepare a statement and keep its plan for the backend's life */
SPIPlanPtr
idem_prepare_kept(const char *sql, int nargs, Oid *types, int cursor_options)
{
	SPIPlanPtr	plan = SPI_prepare_cursor(sql, nargs, types, cursor_options);

	if (plan == NULL)
		elog(ERROR, "SPI_prepare failed for \"%s\": %s", sql, SPI_result_code_string(SPI_result));
	if (SPI_keepplan(plan) != 0)
		elog(ERROR, "SPI_keepplan failed");
	return plan;
}

/*
 * The kept plan of a statement in store `s`, prepared at its first use in
 * this backend and owned by the store's backend (s->plans).
 */
static SPIPlanPtr
get_plan(const Store *s, StoreOp op, StoreVariant v)
{
	SPIPlanPtr *kept;

	Assert(s != NULL && s->backend != NULL && s->plans != NULL);
	kept = &s->plans->plan[op][v];
	if (*kept == NULL)
	{
		const StatementDef *def = find_statement(s->backend->set, op, v);
		const char *sql = s->backend->statement_text ?
			s->backend->statement_text(s, def->sql) : def->sql;
		Oid			types[MAX_PARAMS];

		for (int i = 0; i < def->nparams; i++)
			types[i] = def->params[i].type;
		*kept = idem_prepare_kept(sql, def->nparams, types, s->backend->cursor_options);
	}
	return *kept;
}

/* Run one prepared statement; returns SPI_processed */
uint64
idem_execute(const Store *s, StoreOp op, StoreVariant v, Datum *values, const char *nulls,
			 long count)
{
	int			rc = SPI_execute_plan(get_plan(s, op, v), values, nulls, false, count);

	if (rc < 0)
		elog(ERROR, "SPI_execute_plan failed for operation %d of the %s store: %s",
			 (int) op, s->backend->name, SPI_result_code_string(rc));
	return SPI_processed;
}

/*
 * The keys a batch statement returned (SPI_tuptable's first column, text,
 * each at most once), marked among keys[0..n), which are distinct and in
 * the batch's order (idem_text_cmp()), whatever order the rows come in.
 */
void
idem_mark_returned(int n, const Datum *keys, bool *marks)
{
	for (uint64 r = 0; r < SPI_processed; r++)
	{
		int			i = idem_returned_key(r, n, keys);

		Assert(i >= 0);
		if (i >= 0)
			marks[i] = true;
	}
}

/*
 * Where row r of SPI_tuptable's first column (a key) is among keys[0..n),
 * distinct and in the batch's order (idem_text_cmp()); -1: not there.
 */
int
idem_returned_key(uint64 r, int n, const Datum *keys)
{
	bool		isnull;
	text	   *k = DatumGetTextPP(SPI_getbinval(SPI_tuptable->vals[r],
												 SPI_tuptable->tupdesc, 1, &isnull));
	int			lo = 0;
	int			hi = n - 1;

	while (lo <= hi)
	{
		int			mid = lo + (hi - lo) / 2;
		int			c = idem_text_cmp(k, DatumGetTextPP(keys[mid]));

		if (c == 0)
			return mid;
		if (c < 0)
			hi = mid - 1;
		else
			lo = mid + 1;
	}
	return -1;
}

/* Open a cursor on one prepared statement */
Portal
idem_cursor(const Store *s, StoreOp op, StoreVariant v, Datum *values, const char *nulls)
{
	Portal		portal = SPI_cursor_open(NULL, get_plan(s, op, v), values, nulls, false);

	if (portal == NULL)
		elog(ERROR, "SPI_cursor_open failed for operation %d of the %s store: %s",
			 (int) op, s->backend->name, SPI_result_code_string(SPI_result));
	return portal;
}
