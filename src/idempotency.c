/*-------------------------------------------------------------------------
 *
 * idempotency.c
 *	  Exactly-once effects for at-least-once queues: the shared machinery.
 *
 * The claim protocol
 * ------------------
 * idempotency.operations holds one row per (job_type, operation_key); its
 * primary key is its only index. A worker claims the key before the work
 * (claim_operation) and completes it after (complete_operation). Every
 * function is a short sequence of prepared SPI statements on that one row
 * (the two hot paths in probe.c do the same lookup and update below SPI);
 * they take no explicit locks (only the job_types guards, on the rare
 * removal of job types, do). Correctness rests on two PostgreSQL
 * guarantees:
 *
 * 1. INSERT ... ON CONFLICT DO NOTHING on the primary key. A claim that
 *	  meets another session's uncommitted insert of the same key waits for
 *	  that transaction. If it commits, the insert does nothing and the claim
 *	  re-reads the record (a new snapshot under READ COMMITTED) and answers
 *	  from what was committed; if it aborts, the insert goes ahead. This is
 *	  what makes the transactional mode exactly-once: claim, side-effect row
 *	  and completion in one transaction are seen all together or not at all.
 *	  Under REPEATABLE READ and SERIALIZABLE a conflict with a row the
 *	  snapshot cannot see raises a serialization failure instead.
 *
 * 2. Compare-and-swap updates. A takeover, a skip and a resolution name, in
 *	  their WHERE clause, the attempt, the heartbeat and the status they read
 *	  (AS_READ); complete, release and extend name the caller's attempt and
 *	  the statuses they accept.
 *	  Under READ COMMITTED an UPDATE that meets a concurrently updated row
 *	  waits, then re-evaluates its WHERE clause on the newest version; if
 *	  the record changed, nothing is updated and the caller re-reads it and
 *	  decides again (at most IDEMPOTENCY_MAX_TRIES times). So of two
 *	  redeliveries that take over one stale claim at the same moment, one
 *	  updates it and the other re-reads a young claim: in_progress. Under
 *	  REPEATABLE READ and SERIALIZABLE the second one gets a serialization
 *	  failure, never a wrong verdict.
 *
 * Two claim arguments of 0.3 change none of this. A delivery token is
 * compared only with the record a claim has read (a young claim whose
 * stored digest is the token's: the same verdict and attempt, nothing
 * written), so it adds no path that writes. wait => false reads the primary
 * key once more with a dirty snapshot before a write that could wait
 * (idem_key_busy()): another transaction's uncommitted insert or update of
 * the record answers in_progress instead; the write itself then runs with
 * lock_timeout at 1 ms, so the rare lock that appears after that check
 * raises 55P03 instead of a wait. Neither makes a verdict that guarantee 1
 * or 2 would not.
 *
 * Decide, then act. What a call does with the record it read is decided in
 * one place, protocol.c, by pure functions (no PostgreSQL header, no I/O)
 * that return an action: claim (insert, answer, take over, skip, hold,
 * refuse another fingerprint), the fenced calls (update, a repeat's no-op,
 * ID003, ID004, ID005, 22023) and resolve. claim.c, complete.c, admin.c and
 * the fast paths of probe.c read the record, ask, and apply the action;
 * when a conditional write finds the record changed, they read it again
 * and ask again. test/unit runs every combination without a server.
 *
 * The attempt number is a fencing token: complete, release and extend name
 * the attempt their claim returned and match it in the same WHERE clause,
 * so a worker whose claim was taken over cannot record anything over the
 * new owner's work.
 *
 * Time is the database clock at the moment of the call
 * (GetCurrentTimestamp), not the transaction start, so a claim made inside a
 * long transaction is not born old. A claim is stale when its heartbeat
 * (the claim, or the last extend_lease) plus its job type's lease, read from
 * idempotency.job_types at every call, is not in the future.
 *
 * The two hot paths skip SPI (probe.c): a claim first probes the primary
 * key itself, so a claim of a completed key is that one lookup (it writes no
 * WAL and takes no transaction id) and a claim of a new key goes straight to
 * ST_INSERT; complete_operation() updates a claimed record with
 * table_tuple_update(). Every other case, and every table the fast update
 * does not cover, goes through the statements below, which decide, follow
 * concurrent updates and explain refusals.
 *
 * Rights
 * ------
 * The statements run with the rights of the owner of
 * idempotency.operations (SECURITY_LOCAL_USERID_CHANGE, as PostgreSQL's own
 * RI triggers do), so EXECUTE on a function is the permission and workers
 * need no privilege on the tables. Unlike SECURITY DEFINER this keeps the
 * caller known (resolve_operation records current_user). Every name in the
 * statements is schema-qualified, operators included, so the caller's
 * search_path cannot capture them.
 *
 * Plans are prepared once per backend and kept (SPI_keepplan). They are
 * written against parameters of built-in types only (text, integer, oid,
 * tid, tid[], timestamptz, jsonb), so when the extension is dropped and
 * created again the plan cache re-analyzes them against the new objects.
 * Where Citus manages the tables, a second set is kept, planned afresh at
 * every execution (see get_plan()), and a third, the one-node statements
 * with the names of a shard, for each shard a call worked on directly.
 *
 * Three backends, one protocol
 * ----------------------------
 * Each call first chooses where its records are (idem_target(), probe.c):
 * the extension's own tables on one node (TARGET_TABLE); where Citus
 * manages them, the key's shard when its only placement is on this node
 * and the call may work on it directly (TARGET_SHARD, shard.c); else the
 * distributed tables through Citus's planner (TARGET_CITUS). The claim's
 * state machine, the fencing and the refusals are the same for all three;
 * only the statements differ (one-node statements on the tables or on the
 * shard; on Citus the lookup in two statements and INSERT ... VALUES), and
 * lookup() decodes what either returns in one place. The fast paths of
 * probe.c run on the tables and on the shard.
 *
 * Copyright (c) 2026, the idempotency authors
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/xlog.h"
#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/syscache.h"

#include "compat.h"
#include "idempotency.h"

PG_MODULE_MAGIC;

void		_PG_init(void);

void
_PG_init(void)
{
	idem_define_settings();
}

/* Shorthands for the statement texts */
#define EQ		" OPERATOR(pg_catalog.=) "
#define LE		" OPERATOR(pg_catalog.<=) "
#define PLUS	" OPERATOR(pg_catalog.+) "
#define MINUS	" OPERATOR(pg_catalog.-) "
#define THIS_OPERATION	"o.job_type" EQ "$1 AND o.operation_key" EQ "$2"
/*
 * compare-and-swap: the record is still as ST_LOOKUP read it. The status
 * read ($5, text) is cast, not the column: a STABLE function (enum_out)
 * over a column in an UPDATE is what Citus cannot route.
 */
#define AS_READ \
	" AND o.attempt" EQ "$3 AND o.heartbeat_at" EQ "$4" \
	" AND o.status" EQ "$5::idempotency.operation_status"

/*
 * Every column the C code reads with SPI_getbinval() is cast to the type it
 * assumes: a no-op for the extension's own tables, a clear error (or a
 * conversion) if a superuser changed a column's type, never a datum of the
 * wrong type.
 */
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
/* since 0.2: $6, the caller, may work the job type (see idem_begin_worker) */
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
 * the same rows on every node; see idem_citus_worker_role()). The statement
 * compares them where it runs. It cannot read job_types itself: a statement
 * over tables of two colocation groups is refused inside a call that Citus
 * delegated with force_delegation and runs through its planner (a worker's
 * transaction block, its own key), with 0A000.
 */
#define ROLE_MAY_WORK_BY_NAME \
	" AND pg_catalog.pg_has_role($6, $7, 'USAGE')"
#define INSERT_SQL(extra) \
	"INSERT INTO idempotency.operations AS o" \
	" (job_type, operation_key, status, attempt, claimed_at, heartbeat_at," \
	" claimed_by, fingerprint)" \
	" SELECT jt.job_type, $2, 'claimed', 1, $3, $3, $4, $5" \
	" FROM idempotency.job_types jt WHERE jt.job_type" EQ "$1" extra \
	" ON CONFLICT ON CONSTRAINT operations_pkey DO NOTHING RETURNING 1"
#define INSERT_ARGS		{TEXTOID, TEXTOID, TIMESTAMPTZOID, TEXTOID, TEXTOID, OIDOID, INT8OID}
/* since 0.3: $7, the digest of the claim's delivery (NULL: none) */
#define INSERT_DELIVERY_SQL \
	"INSERT INTO idempotency.operations AS o" \
	" (job_type, operation_key, status, attempt, claimed_at, heartbeat_at," \
	" claimed_by, fingerprint, delivery)" \
	" SELECT jt.job_type, $2, 'claimed', 1, $3, $3, $4, $5, $7" \
	" FROM idempotency.job_types jt WHERE jt.job_type" EQ "$1" \
	" AND " ROLE_MAY_WORK_JT \
	" ON CONFLICT ON CONSTRAINT operations_pkey DO NOTHING RETURNING 1"
#define TAKEOVER_SQL(extra_set) \
	"UPDATE idempotency.operations o" \
	" SET status = 'claimed', attempt = o.attempt" PLUS "1," \
	" claimed_at = $6, heartbeat_at = $6, completed_at = NULL," \
	" claimed_by = $7, fingerprint = COALESCE(o.fingerprint, $8), result = NULL" \
	extra_set " WHERE " THIS_OPERATION AS_READ
#define TAKEOVER_ARGS	{TEXTOID, TEXTOID, INT4OID, TIMESTAMPTZOID, TEXTOID, \
						 TIMESTAMPTZOID, TEXTOID, TEXTOID, INT8OID}
/* $1 job type, $2 key, $3 attempt, $4 now, $5 result; $6 caller (_ROLE) */
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
#define FENCED_ARGS		{TEXTOID, TEXTOID, INT4OID, TIMESTAMPTZOID, JSONBOID, OIDOID}
#define FENCED_NAME_ARGS	{TEXTOID, TEXTOID, INT4OID, TIMESTAMPTZOID, JSONBOID, NAMEOID, NAMEOID}

typedef struct StatementDef
{
	const char *sql;
	int			nargs;
	Oid			argtypes[9];
} StatementDef;

static const StatementDef statements[ST_COUNT] = {
	[ST_LOOKUP] = {
		LOOKUP_SQL(""),
		2, {TEXTOID, TEXTOID}
	},
	/* since 0.2: the job type's worker_role as a ninth column */
	[ST_LOOKUP_ROLE] = {
		LOOKUP_SQL(", jt.worker_role::pg_catalog.regrole::pg_catalog.oid"),
		2, {TEXTOID, TEXTOID}
	},
	/* since 0.3: and the record's delivery digest as a tenth */
	/*
	 * Where Citus manages the tables, the lookup is two statements: the job
	 * type from the reference table, then the record by its key, alone.
	 * Inside a function Citus delegates with force_delegation (a call in a
	 * transaction block runs on the worker that holds the key, in the
	 * caller's connection, so the caller's own writes to colocated tables
	 * join the same transaction there), a statement that joins the
	 * distributed table with another is refused. The worker_role by name:
	 * the statement may run on another node than the call, whose role OIDs
	 * differ (a numeric OID if that node has no such role), resolved here.
	 */
	[ST_LOOKUP_CITUS_JOB_TYPE] = {
		"SELECT jt.stale_policy::pg_catalog.text, jt.max_attempts::pg_catalog.int4,"
		" jt.lease::pg_catalog.interval, jt.worker_role::pg_catalog.regrole::pg_catalog.text"
		" FROM idempotency.job_types jt WHERE jt.job_type" EQ "$1",
		1, {TEXTOID}
	},
	[ST_LOOKUP_CITUS_RECORD] = {
		"SELECT o.status::pg_catalog.text, o.attempt::pg_catalog.int4,"
		" o.heartbeat_at::pg_catalog.timestamptz, o.fingerprint::pg_catalog.text,"
		" o.result::pg_catalog.jsonb, o.delivery::pg_catalog.int8"
		" FROM idempotency.operations o WHERE " THIS_OPERATION,
		2, {TEXTOID, TEXTOID}
	},
	[ST_LOOKUP_DELIVERY] = {
		LOOKUP_SQL(", jt.worker_role::pg_catalog.regrole::pg_catalog.oid,"
				   " o.delivery::pg_catalog.int8"),
		2, {TEXTOID, TEXTOID}
	},
	/*
	 * $3 now, $4 worker, $5 fingerprint. Inserts nothing if the job type
	 * was removed since the lookup: the statement's snapshot is taken after
	 * its table lock, which waits for the removal (job_types_guard()). The
	 * _ROLE variant ($6 the caller) also inserts nothing if the caller may
	 * not work the job type; the lookup that follows says why.
	 */
	[ST_INSERT] = {INSERT_SQL(""), 5, INSERT_ARGS},
	[ST_INSERT_ROLE] = {INSERT_SQL(" AND " ROLE_MAY_WORK_JT), 6, INSERT_ARGS},
	[ST_INSERT_DELIVERY] = {INSERT_DELIVERY_SQL, 7, INSERT_ARGS},
	/*
	 * claim_operations(): $2 the keys, $5 their fingerprints, $7 their
	 * delivery digests (parallel arrays), inserted in the arrays' order;
	 * returns the keys it inserted.
	 */
	[ST_INSERT_BATCH] = {
		"INSERT INTO idempotency.operations AS o"
		" (job_type, operation_key, status, attempt, claimed_at, heartbeat_at,"
		" claimed_by, fingerprint, delivery)"
		" SELECT jt.job_type, k.key, 'claimed', 1, $3, $3, $4, k.fp, k.delivery"
		" FROM idempotency.job_types jt,"
		" ROWS FROM (pg_catalog.unnest($2), pg_catalog.unnest($5), pg_catalog.unnest($7))"
		" WITH ORDINALITY AS k(key, fp, delivery, n)"
		" WHERE jt.job_type" EQ "$1 AND " ROLE_MAY_WORK_JT
		" ORDER BY k.n"
		" ON CONFLICT ON CONSTRAINT operations_pkey DO NOTHING"
		" RETURNING o.operation_key::pg_catalog.text",
		7, {TEXTOID, TEXTARRAYOID, TIMESTAMPTZOID, TEXTOID, TEXTARRAYOID, OIDOID, INT8ARRAYOID}
	},
	/*
	 * Where Citus manages the tables: the same insert as one row of VALUES,
	 * which Citus routes to the key's shard and counts (INSERT ... SELECT
	 * from the reference table is collected on the coordinator, whose count
	 * SPI cannot reconcile with RETURNING). The lookup before it checked
	 * the job type and the caller's role; the foreign key that distribute()
	 * adds keeps the job type from going away meanwhile.
	 */
	[ST_INSERT_VALUES] = {
		"INSERT INTO idempotency.operations AS o"
		" (job_type, operation_key, status, attempt, claimed_at, heartbeat_at,"
		" claimed_by, fingerprint)"
		" VALUES ($1, $2, 'claimed', 1, $3, $3, $4, $5)"
		" ON CONFLICT ON CONSTRAINT operations_pkey DO NOTHING",
		5, INSERT_ARGS
	},
	[ST_INSERT_VALUES_DELIVERY] = {
		"INSERT INTO idempotency.operations AS o"
		" (job_type, operation_key, status, attempt, claimed_at, heartbeat_at,"
		" claimed_by, fingerprint, delivery)"
		" VALUES ($1, $2, 'claimed', 1, $3, $3, $4, $5, $7)"
		" ON CONFLICT ON CONSTRAINT operations_pkey DO NOTHING",
		7, INSERT_ARGS
	},
	/*
	 * $3 attempt, $4 heartbeat, $5 status read; $6 now, $7 worker,
	 * $8 fingerprint; since 0.3 $9 the delivery digest
	 */
	[ST_TAKEOVER] = {TAKEOVER_SQL(""), 8, TAKEOVER_ARGS},
	[ST_TAKEOVER_DELIVERY] = {TAKEOVER_SQL(", delivery = $9"), 9, TAKEOVER_ARGS},
	/* $3 attempt, $4 heartbeat read; $5 now */
	[ST_SKIP] = {
		"UPDATE idempotency.operations o"
		" SET status = 'skipped', completed_at = $5"
		" WHERE " THIS_OPERATION " AND o.attempt" EQ "$3"
		" AND o.heartbeat_at" EQ "$4 AND o.status" EQ "'claimed'",
		5, {TEXTOID, TEXTOID, INT4OID, TIMESTAMPTZOID, TIMESTAMPTZOID}
	},
	/*
	 * $4 and $5 unused by release, $5 by extend. No expression over a
	 * column calls a STABLE function (extend's new expiry is read by a
	 * lookup after the update; pg_has_role() sits in a subquery), which is
	 * what Citus refuses in an UPDATE.
	 */
	[ST_COMPLETE] = {COMPLETE_SQL(""), 5, FENCED_ARGS},
	[ST_RELEASE] = {RELEASE_SQL(""), 5, FENCED_ARGS},
	[ST_EXTEND] = {EXTEND_SQL(""), 5, FENCED_ARGS},
	[ST_COMPLETE_ROLE] = {COMPLETE_SQL(ROLE_MAY_WORK_O), 6, FENCED_ARGS},
	[ST_RELEASE_ROLE] = {RELEASE_SQL(ROLE_MAY_WORK_O), 6, FENCED_ARGS},
	[ST_EXTEND_ROLE] = {EXTEND_SQL(ROLE_MAY_WORK_O), 6, FENCED_ARGS},
	[ST_COMPLETE_ROLE_NAME] = {COMPLETE_SQL(ROLE_MAY_WORK_BY_NAME), 7, FENCED_NAME_ARGS},
	[ST_RELEASE_ROLE_NAME] = {RELEASE_SQL(ROLE_MAY_WORK_BY_NAME), 7, FENCED_NAME_ARGS},
	[ST_EXTEND_ROLE_NAME] = {EXTEND_SQL(ROLE_MAY_WORK_BY_NAME), 7, FENCED_NAME_ARGS},
	/* $1 now; columns as in stale_claims() */
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
	[ST_STALE_ALL] = {
		STALE_CLAIMS_SQL " ORDER BY 7, 1, 2",
		1, {TIMESTAMPTZOID}
	},
	/* $2 job type */
	[ST_STALE_ONE] = {
		STALE_CLAIMS_SQL " AND o.job_type" EQ "$2 ORDER BY 7, 1, 2",
		2, {TIMESTAMPTZOID, TEXTOID}
	},
	/* $3 attempt, $4 heartbeat, $5 status read; $6 now */
	[ST_RESOLVE_COMPLETED] = {
		"UPDATE idempotency.operations o"
		" SET status = 'completed', completed_at = $6"
		" WHERE " THIS_OPERATION AS_READ,
		6, {TEXTOID, TEXTOID, INT4OID, TIMESTAMPTZOID, TEXTOID, TIMESTAMPTZOID}
	},
	[ST_RESOLVE_RETRY] = {
		"UPDATE idempotency.operations o"
		" SET status = 'released', completed_at = NULL, result = NULL"
		" WHERE " THIS_OPERATION AS_READ,
		5, {TEXTOID, TEXTOID, INT4OID, TIMESTAMPTZOID, TEXTOID}
	},
	/* $3 attempt, $4 previous status, $5 resolution, $6 who, $7 now, $8 note */
	[ST_AUDIT] = {
		"INSERT INTO idempotency.resolutions"
		" (job_type, operation_key, attempt, previous_status, resolution,"
		" resolved_by, resolved_at, note)"
		" VALUES ($1, $2, $3, $4::idempotency.operation_status, $5,"
		" $6::pg_catalog.name, $7, $8)",
		8, {TEXTOID, TEXTOID, INT4OID, TEXTOID, TEXTOID, TEXTOID,
			TIMESTAMPTZOID, TEXTOID}
	},
	/* $1 now */
#define PURGEABLE \
		" jt.job_type" EQ "o.job_type AND jt.retention IS NOT NULL" \
		" AND (o.status" EQ "'completed' OR o.status" EQ "'skipped')" \
		" AND o.completed_at" LE "($1" MINUS "jt.retention)"
	[ST_PURGE_SCAN] = {
		"SELECT o.ctid FROM idempotency.operations o, idempotency.job_types jt"
		" WHERE" PURGEABLE,
		1, {TIMESTAMPTZOID}
	},
	/* $2 the ctids of one batch; every condition is checked again */
	[ST_PURGE_DELETE] = {
		"DELETE FROM idempotency.operations o USING idempotency.job_types jt"
		" WHERE o.ctid" EQ "ANY ($2) AND" PURGEABLE,
		2, {TIMESTAMPTZOID, TIDARRAYOID}
	},
	/*
	 * Where Citus manages the tables (ctids are per shard, and Citus cannot
	 * route a STABLE expression over a column in a DELETE): the cutoff of
	 * each job type first, from the reference table ...
	 */
	[ST_PURGE_CUTOFFS] = {
		"SELECT jt.job_type::pg_catalog.text,"
		" ($1" MINUS "jt.retention)::pg_catalog.timestamptz"
		" FROM idempotency.job_types jt WHERE jt.retention IS NOT NULL"
		" ORDER BY 1",
		1, {TIMESTAMPTZOID}
	},
	/* ... then one DELETE per job type ($1), on every shard ($2 its cutoff) */
	[ST_PURGE_JOB_TYPE] = {
		"DELETE FROM idempotency.operations o"
		" WHERE o.job_type" EQ "$1"
		" AND (o.status" EQ "'completed' OR o.status" EQ "'skipped')"
		" AND o.completed_at" LE "$2",
		2, {TEXTOID, TIMESTAMPTZOID}
	},
	/* $2, $3: the first tid of the range and the first one after it */
	[ST_PURGE_RANGE] = {
		"DELETE FROM idempotency.operations o USING idempotency.job_types jt"
		" WHERE o.ctid OPERATOR(pg_catalog.>=) $2 AND o.ctid OPERATOR(pg_catalog.<) $3"
		" AND" PURGEABLE,
		3, {TIMESTAMPTZOID, TIDOID, TIDOID}
	},
};

/*
 * The kept plans: [TARGET_TABLE] for the extension's own tables,
 * [TARGET_CITUS] where Citus manages them; those of each shard a call
 * worked on directly are kept by shard.c (idem_shard_plans()).
 */
static SPIPlanPtr plans[TARGET_CITUS + 1][ST_COUNT];

/* The target of the call between idem_begin() and idem_end() */
static const Target *current;

/*
 * The owner of idempotency.operations, whose rights the statements run
 * with. Looked up at every call: three syscache probes, and always right
 * after the extension was dropped, created again or handed to a new owner.
 */
static Oid
operations_owner(void)
{
	Oid			nspid = get_namespace_oid("idempotency", true);
	Oid			relid = InvalidOid;
	HeapTuple	tuple;
	Oid			owner;

	if (OidIsValid(nspid))
		relid = get_relname_relid("operations", nspid);
	if (!OidIsValid(relid))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("table idempotency.operations does not exist"),
				 errdetail("The idempotency library was called in a database where the extension is not installed, or the extension was dropped while the call ran."),
				 errhint("Run CREATE EXTENSION idempotency in this database.")));

	tuple = SearchSysCache1(RELOID, ObjectIdGetDatum(relid));
	if (!HeapTupleIsValid(tuple))
		elog(ERROR, "cache lookup failed for relation %u", relid);
	owner = ((Form_pg_class) GETSTRUCT(tuple))->relowner;
	ReleaseSysCache(tuple);
	return owner;
}

/*
 * Start a call: refuse to write where writing is impossible (with a clear
 * 25006 instead of whatever the first write would say), switch to the
 * table owner's rights and connect to SPI.
 */
void
idem_begin(IdemCall *call, const char *fname, bool writes, const Target *target)
{
	Oid			owner;

	if (writes)
	{
		PreventCommandDuringRecovery(fname);
		PreventCommandIfReadOnly(fname);
	}

	owner = operations_owner();
	GetUserIdAndSecContext(&call->caller, &call->save_sec_context);
	call->worker_roles = false;
	call->deliveries = false;
	if (target != NULL)
		call->target = *target;
	else
		idem_target(NULL, &call->target);
	current = &call->target;
	SetUserIdAndSecContext(owner,
						   call->save_sec_context | SECURITY_LOCAL_USERID_CHANGE);

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
}

/*
 * Start a call of a worker function (claim, complete, release, extend).
 * worker_roles: the call comes through the function's 0.2 definition, so
 * job_types has a worker_role column and it applies.
 */
void
idem_begin_worker(IdemCall *call, const char *fname, bool worker_roles, const Target *target)
{
	idem_begin(call, fname, true, target);
	call->worker_roles = worker_roles;
}

/* End a call begun with idem_begin. (On error, transaction abort does both.) */
void
idem_end(IdemCall *call)
{
	if (SPI_finish() != SPI_OK_FINISH)
		elog(ERROR, "SPI_finish failed");
	SetUserIdAndSecContext(call->caller, call->save_sec_context);
	current = NULL;
}

/*
 * The kept plan of a statement, prepared at its first use in this backend.
 *
 * Where Citus manages the tables, the plan is a custom one at every
 * execution (CURSOR_OPT_CUSTOM_PLAN), never the plan cache's generic plan.
 * A generic plan of a statement on a distributed table leaves the choice of
 * the shard to execution time ("deferred pruning"); on the node that holds
 * the shard, Citus's local execution then plans the shard query and keeps
 * that plan in the generic plan's memory. Citus 13.2.1 and later (upstream
 * #8371, also in 14.0) never find it again for such plans, so every
 * execution added one more to memory that is kept as long as the backend:
 * about 37 kB per call on the worker holding the key, without bound
 * (test/citus/memory.sh measures it per backend). A custom plan knows the key, so Citus
 * prunes to the shard while planning and caches nothing; the planning it
 * repeats is about what the generic plan's execution did anyway (see the
 * README, "Citus"). On one node nothing changes: the plan cache chooses.
 */
static SPIPlanPtr
get_plan(Statement st)
{
	bool		citus = current->kind == TARGET_CITUS;
	SPIPlanPtr *kept;

	Assert(current != NULL);
	if (current->kind == TARGET_SHARD)
		kept = &idem_shard_plans(current->shardid)[st];
	else
		kept = &plans[current->kind][st];

	if (*kept == NULL)
	{
		const StatementDef *def = &statements[st];
		const char *sql = current->kind == TARGET_SHARD ?
			idem_shard_sql(def->sql, current->shardid, current->jt_shardid) : def->sql;
		SPIPlanPtr	plan = SPI_prepare_cursor(sql, def->nargs, (Oid *) def->argtypes,
											  citus ? CURSOR_OPT_CUSTOM_PLAN : 0);

		if (plan == NULL)
			elog(ERROR, "SPI_prepare failed for statement %d: %s",
				 (int) st, SPI_result_code_string(SPI_result));
		if (SPI_keepplan(plan) != 0)
			elog(ERROR, "SPI_keepplan failed");
		*kept = plan;
	}
	return *kept;
}

/* Run one prepared statement; returns SPI_processed */
uint64
idem_execute(Statement st, Datum *values, const char *nulls, long count)
{
	int			rc = SPI_execute_plan(get_plan(st), values, nulls, false, count);

	if (rc < 0)
		elog(ERROR, "SPI_execute_plan failed for statement %d: %s",
			 (int) st, SPI_result_code_string(rc));
	return SPI_processed;
}

/* Open a cursor on one prepared statement */
Portal
idem_cursor(Statement st, Datum *values, const char *nulls)
{
	Portal		portal = SPI_cursor_open(NULL, get_plan(st), values, nulls, false);

	if (portal == NULL)
		elog(ERROR, "SPI_cursor_open failed for statement %d: %s",
			 (int) st, SPI_result_code_string(SPI_result));
	return portal;
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
 * Where a lookup's columns are (1-based; 0: not in this statement). One
 * statement on one node (ST_LOOKUP and its variants: the job type and the
 * record in one row), or two through Citus (ST_LOOKUP_CITUS_JOB_TYPE, then
 * ST_LOOKUP_CITUS_RECORD): either way the same decoding, below.
 */
typedef struct LookupColumns
{
	/* the job type's row */
	int			policy;
	int			max_attempts;
	int			lease;			/* through Citus: the expiry is computed */
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

/* Decode the job type's columns of `tuple` into *state; *lease if asked */
static void
decode_job_type(HeapTuple tuple, TupleDesc desc, const LookupColumns *c,
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
static bool
decode_record(HeapTuple tuple, TupleDesc desc, const LookupColumns *c,
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

/* Through Citus: the job type's row, then the record's (see the statements) */
static const LookupColumns citus_roles = {1, 2, 3, 0, 4, 1, 2, 3, 0, 4, 5, 6};
static const LookupColumns citus_no_roles = {1, 2, 3, 0, 0, 1, 2, 3, 0, 4, 5, 6};

/*
 * Read a job type's configuration and the record of one key. `st`: the
 * one-node statement (ST_LOOKUP, _ROLE since 0.2, _DELIVERY since 0.3),
 * run on the extension's tables or on the key's shard; through Citus the
 * two statements that stand for it. Fills *state; see OperationState.
 */
static void
lookup(Statement st, text *job_type, text *key, OperationState *state)
{
	static const LookupColumns one_node[] = {
		[ST_LOOKUP] = {1, 2, 0, 0, 0, 3, 4, 5, 6, 7, 8, 0},
		[ST_LOOKUP_ROLE] = {1, 2, 0, 9, 0, 3, 4, 5, 6, 7, 8, 0},
		[ST_LOOKUP_DELIVERY] = {1, 2, 0, 9, 0, 3, 4, 5, 6, 7, 8, 10},
	};
	Datum		values[2] = {PointerGetDatum(job_type), PointerGetDatum(key)};

	memset(state, 0, sizeof(*state));
	state->worker_role = InvalidOid;
	if (current->kind == TARGET_CITUS)
	{
		const LookupColumns *c = st != ST_LOOKUP ? &citus_roles : &citus_no_roles;
		Interval	lease;

		if (idem_execute(ST_LOOKUP_CITUS_JOB_TYPE, values, NULL, 1) == 0)
			return;
		decode_job_type(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, c, state, &lease);
		if (idem_execute(ST_LOOKUP_CITUS_RECORD, values, NULL, 1) == 0)
			return;				/* no record */
		(void) decode_record(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, c, state, &lease);
		return;
	}
	if (idem_execute(st, values, NULL, 1) == 0)
		return;
	decode_job_type(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, &one_node[st], state, NULL);
	(void) decode_record(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, &one_node[st], state, NULL);
}

/* The lookup of the operator functions: no worker_role */
void
idem_lookup(text *job_type, text *key, OperationState *state)
{
	lookup(ST_LOOKUP, job_type, key, state);
}

/*
 * May `caller` work a job type whose worker_role is `role` (InvalidOid:
 * none)? The one rule, for the SPI lookup and the fast paths of probe.c;
 * the fenced updates say the same in SQL (ROLE_MAY_WORK_JT, pg_has_role
 * with 'USAGE', which is has_privs_of_role()).
 */
bool
idem_role_may_work(Oid caller, Oid role)
{
	return !OidIsValid(role) || has_privs_of_role(caller, role);
}

/* 42501: `caller` may not work the job type, whose worker_role is `role` */
static void
deny_job_type(const IdemCall *call, text *job_type, Oid role_oid)
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
					 role, role, GetUserNameFromId(call->caller, false)) :
			 errhint("Set idempotency.job_types.worker_role to an existing role.")));
}

/*
 * The lookup of the worker functions: the job type must exist and, if it
 * names a worker_role, the caller must have that role's privileges (be it,
 * or a member that inherits it; superusers have every role's). Raises 42501
 * otherwise, before anything about the record is told or changed.
 */
void
idem_worker_lookup(const IdemCall *call, text *job_type, text *key,
				   OperationState *state)
{
	lookup(call->deliveries ? ST_LOOKUP_DELIVERY :
		   call->worker_roles ? ST_LOOKUP_ROLE : ST_LOOKUP,
		   job_type, key, state);
	idem_require_job_type(state, job_type);

	if (state->worker_role_missing ? !superuser_arg(call->caller) :
		!idem_role_may_work(call->caller, state->worker_role))
		deny_job_type(call, job_type, state->worker_role);
}

/*
 * Where Citus routes the fenced updates (TARGET_CITUS): the job type's
 * worker_role, by name, read from this node's job_types placement, for the
 * statement to compare with the caller's name where it runs
 * (ROLE_MAY_WORK_BY_NAME). NULL when the update needs no check: the job
 * type names no worker_role, or is not registered (then the update finds no
 * record, and the refusal's lookup says why), or names a role that does not
 * exist here and the caller is a superuser; anyone else gets 42501 for such
 * a job type, as on one node.
 */
const char *
idem_citus_worker_role(const IdemCall *call, text *job_type)
{
	Datum		values[1] = {PointerGetDatum(job_type)};
	OperationState state;
	Interval	lease;

	memset(&state, 0, sizeof(state));
	state.worker_role = InvalidOid;
	if (idem_execute(ST_LOOKUP_CITUS_JOB_TYPE, values, NULL, 1) == 0)
		return NULL;
	decode_job_type(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, &citus_roles, &state, &lease);
	if (state.worker_role_missing)
	{
		if (!superuser_arg(call->caller))
			deny_job_type(call, job_type, InvalidOid);
		return NULL;
	}
	return OidIsValid(state.worker_role) ? GetUserNameFromId(state.worker_role, false) : NULL;
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
