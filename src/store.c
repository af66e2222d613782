/*-------------------------------------------------------------------------
 *
 * store.c
 *	  Which store a call's records are in, chosen once per call; and the
 *	  frame of a call: its rights, its SPI connection, its lookups.
 *
 * This is the one file that decides which backend a call uses
 * (idem_store_choose()); claim.c, complete.c, batch.c and admin.c work on
 * whatever store they are given, through store.h.
 *
 * Rights: the statements run with the rights of the owner of
 * idempotency.operations (SECURITY_LOCAL_USERID_CHANGE, as PostgreSQL's own
 * RI triggers do), so EXECUTE on a function is the permission and workers
 * need no privilege on the tables. Unlike SECURITY DEFINER this keeps the
 * caller known (resolve_operation records current_user).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/lsyscache.h"
#include "utils/syscache.h"

#include "store.h"

/*
 * The store of a call:
 *
 *	- the plain table, its cache current: one test, the common case on one
 *	  node;
 *	- where Citus manages the tables, the local shard when the call has one
 *	  key, whose shard has its only placement here, and store_shard.c says
 *	  the call may work on it directly (it then holds the shard's metadata
 *	  lock);
 *	- else there, the routed store;
 *	- else the plain table, with the heap paths if they know its shape.
 *
 * `key`: the call's one operation key; NULL for a call that reads or
 * writes many (stale_claims(), purges, batches), which never goes to one
 * shard.
 */
void
idem_store_choose(text *key, Store *s)
{
	Oid			ops_relid;
	Oid			jt_relid;

	memset(s, 0, sizeof(*s));
	if (idem_table_store_cached(s))
		return;
	if (idem_routed_applies(&ops_relid, &jt_relid))
	{
		if (key == NULL || !idem_shard_store(ops_relid, jt_relid, key, s))
			idem_routed_store(s);
		return;
	}
	idem_table_store(s);
}

/* The extension's settings: the stores' */
void
idem_define_settings(void)
{
	idem_shard_define_settings();
}

/*
 * The statements' variant for a caller's capabilities: the delivery digest
 * (which comes with worker roles), the worker_role check, or neither.
 */
StoreVariant
idem_variant(const IdemCaps *caps)
{
	if (caps->deliveries)
		return VARIANT_DELIVERY;
	if (caps->worker_roles)
		return VARIANT_ROLE;
	return VARIANT_BASE;
}

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
 * table owner's rights and connect to SPI. `store`: the one the caller
 * chose (for its key), or NULL for the store of a call on many keys. The
 * call has no capabilities (the operator functions); see
 * idem_begin_worker().
 */
void
idem_begin(IdemCall *call, const char *fname, bool writes, const Store *store)
{
	Oid			owner;

	if (writes)
	{
		PreventCommandDuringRecovery(fname);
		PreventCommandIfReadOnly(fname);
	}

	owner = operations_owner();
	GetUserIdAndSecContext(&call->caller, &call->save_sec_context);
	call->caps = idem_caps(IDEM_API_0_1);
	call->variant = idem_variant(&call->caps);
	if (store != NULL)
		call->store = *store;
	else
		idem_store_choose(NULL, &call->store);
	SetUserIdAndSecContext(owner,
						   call->save_sec_context | SECURITY_LOCAL_USERID_CHANGE);

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
}

/*
 * Start a call of a worker function (claim, complete, release, extend)
 * with the capabilities of the definition that called.
 */
void
idem_begin_worker(IdemCall *call, const char *fname, const IdemCaps *caps,
				  const Store *store)
{
	idem_begin(call, fname, true, store);
	call->caps = *caps;
	call->variant = idem_variant(caps);
}

/*
 * A call with wait => false: the session's lock_timeout (claim.c sets the
 * call's bound) holds where the call's statements run, from on = true until
 * on = false; on error, transaction abort undoes it. Nothing for a call
 * that waits, or a store whose statements run in this backend.
 */
void
idem_carry_lock_timeout(const IdemCall *call, bool wait, bool on)
{
	if (!wait && call->store.backend->carry_lock_timeout != NULL)
		call->store.backend->carry_lock_timeout(&call->store, on);
}

/* End a call begun with idem_begin. (On error, transaction abort does both.) */
void
idem_end(IdemCall *call)
{
	if (SPI_finish() != SPI_OK_FINISH)
		elog(ERROR, "SPI_finish failed");
	SetUserIdAndSecContext(call->caller, call->save_sec_context);
}

/*
 * The lookup of the operator functions and of extend_lease()'s new expiry:
 * no worker_role, no delivery.
 */
void
idem_lookup(const IdemCall *call, text *job_type, text *key, OperationState *state)
{
	call->store.backend->lookup(&call->store, VARIANT_BASE, job_type, key, state);
}

/*
 * The lookup of the worker functions: the job type must exist and, if it
 * names a worker_role, the caller must have that role's privileges (be it,
 * or a member that inherits it; superusers have every role's). Raises 42501
 * otherwise, before anything about the record is told or changed.
 */
static void
require_worker(const IdemCall *call, text *job_type, const OperationState *state)
{
	idem_require_job_type(state, job_type);

	if (state->worker_role_missing ? !superuser_arg(call->caller) :
		!idem_role_may_work(call->caller, state->worker_role))
		idem_deny_job_type(call->caller, job_type, state->worker_role);
}

void
idem_worker_lookup(const IdemCall *call, text *job_type, text *key,
				   OperationState *state)
{
	call->store.backend->lookup(&call->store, call->variant, job_type, key, state);
	require_worker(call, job_type, state);
}

/*
 * The same for n distinct keys of one group of a batch (StoreBackend's
 * lookup_many): the job type read, and checked, once per batch (*jt).
 */
void
idem_worker_lookup_many(const IdemCall *call, text *job_type, int n, text *const *keys,
						OperationState *states, BatchJobType *jt)
{
	bool		first = !jt->read;

	call->store.backend->lookup_many(&call->store, job_type, n, keys, states, jt);
	if (first)
		require_worker(call, job_type, &jt->state);
}

/*
 * Does a call on many keys get a store with batch statements (the routed
 * store)? One node's batches need not arrange their keys for them.
 */
bool
idem_batch_statements(void)
{
	Store		s;

	idem_store_choose(NULL, &s);
	return s.backend->fenced_many != NULL;
}

/* A batch's key, its group, and its place in the batch's order */
typedef struct GroupedKey
{
	int64		group;
	int			pos;
} GroupedKey;

static int
grouped_key_cmp(const void *a, const void *b)
{
	const GroupedKey *x = (const GroupedKey *) a;
	const GroupedKey *y = (const GroupedKey *) b;

	if (x->group != y->group)
		return x->group < y->group ? -1 : 1;
	return x->pos - y->pos;
}

/*
 * The groups of a batch's n keys (keys[], in the batch's order) on a store
 * with batch statements (StoreBackend's group_of): perm[] lists the keys'
 * positions group by group, each group's keys in the batch's order (so a
 * repeated key stays right after its first occurrence), the groups in the
 * order of their numbers (a shard's place among the table's shards); group
 * g is perm[starts[g]] .. perm[starts[g + 1] - 1]. A key group_of() cannot
 * place (-1) is a group of its own. Returns the number of groups.
 *
 * Every batch on the store takes its keys in this one order, so two batches
 * that share keys still lock them in the same order (see batch.c).
 */
int
idem_batch_groups(const Store *s, int n, text *const *keys, int *perm, int *starts)
{
	GroupedKey *g = palloc(sizeof(GroupedKey) * Max(n, 1));
	int			ngroups = 0;
	int			i;

	for (i = 0; i < n; i++)
	{
		g[i].group = s->backend->group_of(s, keys[i]);
		g[i].pos = i;
	}
	qsort(g, n, sizeof(GroupedKey), grouped_key_cmp);
	for (i = 0; i < n; i++)
	{
		perm[i] = g[i].pos;
		if (i == 0 || g[i].group < 0 || g[i].group != g[i - 1].group)
			starts[ngroups++] = i;
	}
	starts[ngroups] = n;
	pfree(g);
	return ngroups;
}
