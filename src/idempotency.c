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
 * (the two hot paths in heap.c do the same lookup and update below SPI);
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
 * (idem_key_busy(), heap.c): another transaction's uncommitted insert or update of
 * the record answers in_progress instead; the write itself then runs with
 * lock_timeout at 1 s, so the short waits any insert may meet (a table's
 * extension) are waited out and a lock held longer raises 55P03. Neither
 * makes a verdict that guarantee 1 or 2 would not.
 *
 * Decide, then act. What a call does with the record it read is decided in
 * one place, protocol.c, by pure functions (no PostgreSQL header, no I/O)
 * that return an action: claim (insert, answer, take over, skip, hold,
 * refuse another fingerprint), the fenced calls (update, a repeat's no-op,
 * ID003, ID004, ID005, 22023) and resolve. claim.c, complete.c, admin.c and
 * the direct heap paths of heap.c read the record, ask, and apply the action;
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
 * The two hot paths skip SPI (heap.c): a claim first probes the primary
 * key itself, so a claim of a completed key is that one lookup (it writes no
 * WAL and takes no transaction id) and a claim of a new key goes straight to
 * its insert; complete_operation() updates a claimed record with
 * table_tuple_update(). Every other case, and every table the fast update
 * does not cover, goes through the SPI statements (statements.c), which
 * decide, follow concurrent updates and explain refusals.
 *
 * Rights, stores and statements
 * -----------------------------
 * The statements run with the rights of the owner of
 * idempotency.operations, so EXECUTE on a function is the permission
 * (store.c). Each call first chooses where its records are, once, before
 * anything is read (idem_store_choose(), store.c): the extension's own
 * tables on one node (store_table.c); where Citus manages them, the key's
 * shard when its only placement is on this node and the call may work on
 * it directly (store_shard.c), else the distributed tables through Citus's
 * planner (store_citus.c). The claim's state machine, the fencing and the
 * refusals are the same for all three: each backend supplies its
 * statements (statements.c: set x operation x variant), its lookup (decoded
 * by record.c, whatever the backend), its role check and its purge, and
 * owns the plans it prepared (prepared once per backend and kept). The
 * direct heap paths run on the tables and on a local shard.
 *
 * Versions: each worker function's C entry point is named for the API
 * version of its SQL definition, and turns it into capabilities once
 * (idem_caps(), util.c); the code asks the capabilities.
 *
 * Files: no two call each other, not even through others (make
 * check-layout). From the top: the entry points (claim.c, complete.c,
 * batch.c, admin.c), store.c, the stores (store_citus.c, store_shard.c,
 * store_table.c), then statements.c, record.c, heap.c, protocol.c and
 * util.c, which call nothing of ours above them.
 *
 * Copyright (c) 2026, the idempotency authors
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"

#include "store.h"

PG_MODULE_MAGIC;

void		_PG_init(void);

void
_PG_init(void)
{
	idem_define_settings();
}
