/*-------------------------------------------------------------------------
 *
 * admin.c
 *	  What people and sweepers call: stale_claims(), resolve_operation(),
 *	  purge_operations() and the pieces of the paced purge,
 *	  purge_block_range() and purge_refuse_transaction_block().
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/block.h"
#include "storage/itemptr.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/tuplestore.h"

#include "compat.h"
#include "store.h"

PG_FUNCTION_INFO_V1(stale_claims);
PG_FUNCTION_INFO_V1(resolve_operation);
PG_FUNCTION_INFO_V1(purge_operations);
PG_FUNCTION_INFO_V1(purge_block_range);
PG_FUNCTION_INFO_V1(purge_refuse_transaction_block);

#define STALE_CLAIMS_COLUMNS	8

/*
 * stale_claims(job_type text DEFAULT NULL) RETURNS TABLE (...)
 *
 * Every claimed record whose lease ran out, ordered by when it ran out.
 * Reads only, so it works on a hot standby. It scans the table: no index
 * covers status, on purpose (README, "Performance").
 */
Datum
stale_claims(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	IdemCall	call;
	Datum		args[2];
	uint64		i;

	InitMaterializedSRF(fcinfo, 0);
	args[0] = TimestampTzGetDatum(GetCurrentTimestamp());

	idem_begin(&call, "stale_claims()", false, NULL);
	if (PG_ARGISNULL(0))
		idem_execute(&call.store, OP_STALE_ALL, VARIANT_BASE, args, NULL, 0);
	else
	{
		text	   *job_type = idem_arg_job_type(fcinfo, 0);
		text	   *no_key = cstring_to_text("");
		OperationState state;

		/* a typo in the job type is an error, not an empty list */
		idem_lookup(&call, job_type, no_key, &state);
		idem_require_job_type(&state, job_type);

		args[1] = PointerGetDatum(job_type);
		idem_execute(&call.store, OP_STALE_ONE, VARIANT_BASE, args, NULL, 0);
	}

	for (i = 0; i < SPI_processed; i++)
	{
		Datum		values[STALE_CLAIMS_COLUMNS];
		bool		nulls[STALE_CLAIMS_COLUMNS];
		int			col;

		for (col = 0; col < STALE_CLAIMS_COLUMNS; col++)
			values[col] = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc,
										col + 1, &nulls[col]);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	idem_end(&call);

	return (Datum) 0;
}

/*
 * resolve_operation(job_type text, operation_key text, resolution text,
 *					 note text DEFAULT NULL) RETURNS void
 *
 * A person's decision on a record that waits for one: a claim whose lease
 * ran out (held, or stale under any policy), or a skipped record.
 * 'completed': the effect did happen. 'retry': it did not; the record
 * becomes released and the next delivery runs. Audited with current_user.
 */
Datum
resolve_operation(PG_FUNCTION_ARGS)
{
	text	   *job_type = idem_arg_job_type(fcinfo, 0);
	text	   *key = idem_arg_key(fcinfo, 1);
	char	   *resolution;
	StoreOp		op;
	IdemCall	call;
	int			tries;

	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("resolution must not be null"),
				 errdetail("A resolution records a person's decision on a stale claim or a skipped operation."),
				 errhint("Use 'completed' (the effect happened) or 'retry' (it did not).")));
	resolution = text_to_cstring(PG_GETARG_TEXT_PP(2));
	if (strcmp(resolution, "completed") == 0)
		op = OP_RESOLVE_COMPLETED;
	else if (strcmp(resolution, "retry") == 0)
		op = OP_RESOLVE_RETRY;
	else
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("unknown resolution \"%s\"", resolution),
				 errdetail("A resolution is 'completed' or 'retry'."),
				 errhint("Use 'completed' (the effect happened) or 'retry' (it did not).")));

	idem_begin(&call, "resolve_operation()", true, NULL);
	for (tries = 0;; tries++)
	{
		TimestampTz now = GetCurrentTimestamp();
		OperationState state;
		ClaimRecord rec = {0};
		ResolveOutcome outcome;
		Datum		values[8];
		char		nulls[8];

		memset(nulls, ' ', sizeof(nulls));
		if (tries >= IDEMPOTENCY_MAX_TRIES)
			idem_too_many_tries("resolve", job_type, key);

		idem_lookup(&call, job_type, key, &state);
		idem_require_job_type(&state, job_type);
		rec.found = state.found;
		rec.status = state.status;
		rec.now = now;
		rec.expires_at = state.expires_at;
		outcome = idem_decide_resolve(&rec);
		if (outcome == RESOLVE_NOT_FOUND)
			idem_require_record(&state, job_type, key);
		if (outcome == RESOLVE_NOT_WAITING)
			ereport(ERROR,
					(errcode(ERRCODE_IDEMPOTENCY_WRONG_STATE),
					 errmsg("operation \"%s\" of job type \"%s\" is not waiting for a decision",
							idem_text(key), idem_text(job_type)),
					 errdetail("It is %s%s.", idem_status_name(state.status),
							   state.status == OPERATION_CLAIMED ? " and its lease has not run out" : ""),
					 errhint("Only a stale claim or a skipped operation can be resolved.")));

		values[0] = PointerGetDatum(job_type);
		values[1] = PointerGetDatum(key);
		values[2] = Int32GetDatum(state.attempt);
		values[3] = TimestampTzGetDatum(state.heartbeat_at);
		values[4] = CStringGetTextDatum(idem_status_name(state.status));
		values[5] = TimestampTzGetDatum(now);
		if (idem_execute(&call.store, op, VARIANT_BASE, values, nulls, 0) == 0)
			continue;			/* it changed under us: decide again */

		/*
		 * The audit row reuses the update's parameters: $1 job type, $2 key
		 * and $3 attempt stay; $4 becomes the status read, then the
		 * resolution, who, when and the note.
		 */
		values[3] = values[4];
		values[4] = CStringGetTextDatum(resolution);
		values[5] = CStringGetTextDatum(GetUserNameFromId(call.caller, false));
		values[6] = TimestampTzGetDatum(now);
		if (PG_ARGISNULL(3))
			nulls[7] = 'n';
		else
			values[7] = PG_GETARG_DATUM(3);
		idem_execute(&call.store, OP_AUDIT, VARIANT_BASE, values, nulls, 0);
		break;
	}
	idem_end(&call);

	PG_RETURN_VOID();
}

/*
 * purge_operations(batch_size integer DEFAULT 10000) RETURNS bigint
 *
 * Deletes completed and skipped records older than their job type's
 * retention. One pass over the table through a cursor; each batch of
 * batch_size rows is one DELETE by ctid that checks every condition again,
 * so a record that changed since the scan is left alone. Claims of the
 * records being deleted do not wait for it: they only read.
 */
Datum
purge_operations(PG_FUNCTION_ARGS)
{
	int32		batch_size;
	IdemCall	call;
	Datum		now;
	int64		deleted;

	batch_size = idem_arg_positive_int32(fcinfo, 0, "batch_size",
										 "purge_operations() deletes the expired records in batches of batch_size rows, one DELETE each.",
										 "Pass a positive batch size, or leave it out for the default of 10000.");

	now = TimestampTzGetDatum(GetCurrentTimestamp());
	idem_begin(&call, "purge_operations()", true, NULL);
	deleted = call.store.backend->purge(&call.store, now, batch_size);
	idem_end(&call);

	PG_RETURN_INT64(deleted);
}

/*
 * purge_block_range(first_block bigint, blocks integer) RETURNS bigint
 *
 * The unit of the paced purge (the procedure idempotency.purge()): deletes
 * the records purge_operations() would delete, but only those whose tuples
 * lie in the heap blocks [first_block, first_block + blocks) of
 * idempotency.operations. One DELETE with a TID range scan, so it reads
 * only those blocks and, called in its own transaction, writes a small,
 * bounded amount of WAL. Returns how many records it deleted.
 *
 * A range past the end of the table deletes nothing. Records that a
 * concurrent update moves to another block during the walk are left for
 * the next purge. Where Citus manages the tables, the local relation is an
 * empty shell: a range from block 0 deletes what purge_operations() would
 * (every shard), any other range nothing.
 */
Datum
purge_block_range(PG_FUNCTION_ARGS)
{
	int64		first_block;
	int32		blocks;
	int64		end_block;
	ItemPointerData first_tid;
	ItemPointerData end_tid;
	IdemCall	call;
	Datum		now;
	int64		deleted;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("first_block must not be null"),
				 errdetail("purge_block_range() purges the heap blocks first_block to first_block + blocks - 1 of idempotency.operations."),
				 errhint("Pass a block number from 0 up, as idempotency.purge() does.")));
	first_block = PG_GETARG_INT64(0);
	if (first_block < 0 || first_block > (int64) MaxBlockNumber)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("first_block must be between 0 and %u, not %lld",
						MaxBlockNumber, (long long) first_block),
				 errdetail("Heap block numbers run from 0 to %u.", MaxBlockNumber),
				 errhint("Pass a block number from 0 up; a range past the end of the table deletes nothing.")));
	blocks = idem_arg_positive_int32(fcinfo, 1, "blocks",
									 "blocks is the number of heap blocks, from first_block on, that purge_block_range() purges.",
									 "Pass a positive number of blocks, for example 20 as idempotency.purge() does by default.");

	/*
	 * The range is [(first_block,0), (end_block,0)): offset 0 comes before
	 * every tuple of its block. No tuple lives in block InvalidBlockNumber,
	 * so an end past it is clamped there and still covers every block.
	 */
	end_block = Min(first_block + blocks, (int64) InvalidBlockNumber);
	ItemPointerSet(&first_tid, (BlockNumber) first_block, 0);
	ItemPointerSet(&end_tid, (BlockNumber) end_block, 0);

	now = TimestampTzGetDatum(GetCurrentTimestamp());
	idem_begin(&call, "purge_block_range()", true, NULL);
	deleted = call.store.backend->purge_range(&call.store, now, &first_tid, &end_tid,
											  first_block);
	idem_end(&call);

	PG_RETURN_INT64(deleted);
}

/*
 * purge_refuse_transaction_block() RETURNS void
 *
 * The first step of idempotency.purge(), which commits after every batch:
 * a CALL inside a transaction block (BEGIN, or several statements sent as
 * one query string) cannot commit, so it is refused here, before anything
 * is deleted, with the error VACUUM gives in the same place (25001) rather
 * than PostgreSQL's "invalid transaction termination" at the procedure's
 * first COMMIT. (A CALL from inside a function, or from a procedure with a
 * SET clause or SECURITY DEFINER, cannot commit either; that still gets
 * the latter, 2D000, and its first batch is rolled back.)
 */
Datum
purge_refuse_transaction_block(PG_FUNCTION_ARGS)
{
	if (IsTransactionBlock())
		ereport(ERROR,
				(errcode(ERRCODE_ACTIVE_SQL_TRANSACTION),
				 errmsg("idempotency.purge() cannot run inside a transaction block"),
				 errdetail("It commits after every batch of pages."),
				 errhint("CALL it alone in autocommit mode, as pg_cron does: not after BEGIN, not with other statements in one query string. Inside a transaction, use SELECT idempotency.purge_operations().")));
	PG_RETURN_VOID();
}
