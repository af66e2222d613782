// pg-idempotency (index.mjs): wrap an sqs-consumer handler in the claim protocol of the
// PostgreSQL extension `idempotency`.
//
//   import { idempotent, idempotentBatch, KnownFailure } from 'pg-idempotency';
//   handleMessage: idempotent(handler, { pool, sqs, queueUrl, jobType, key })
//
// For every delivery: claim_operation(job type, key, fingerprint, worker,
// delivery, wait) (extension 0.3 or later);
//   run / verify  -> handler(payload, ctx) with a lease heartbeat
//                    (extend_lease), then complete_operation -> delete (ack)
//   completed, skipped -> delete (ack): the work is done or given up
//   in_progress   -> keep the message, visible again after `retryAfter`
//                    seconds (another worker holds a young claim); so is a
//                    claim that hit its bound (55P03, 57014)
//   held          -> delete (ack): a person decides (resolve_operation)
// A handler that throws KnownFailure (the effect certainly did not happen)
// releases the claim and the message is redelivered after a backoff (its
// visibility: `backoff` seconds doubling with the attempt, at most
// `backoffMax` and half of `retryAfter`); one that throws PermanentFailure
// (the provider refused for good) completes the operation with
// { permanent_failure: reason } as its result and leaves the message
// undeleted, to the queue's redrive policy (a later receive meets that
// result and is left again without the handler; `permanentFailure:
// 'delete'` deletes it instead); any other error leaves the claim to
// its lease and the message to its visibility timeout. A database error of
// the claim throws too: the message is not deleted and comes back after its
// visibility timeout (then to the dead-letter queue after maxReceiveCount).
//
// The delivery token: a uuid made when the handler starts (one per receive
// of the message). A claim whose connection was lost (the reply may be lost
// after the server committed the claim) is sent once more on a new
// connection with the same token, and the server gives the claim back: the
// same verdict and attempt, not in_progress for a whole lease.
// complete_operation and release_operation are sent once more too after a
// lost connection (no-ops when repeated).
//
// The bound: the claim does not wait for another transaction's uncommitted
// claim of the key (a worker stuck or idle in a transaction, the
// transactional mode): `claimWait` 0 (the default) claims with wait => false
// and is answered in_progress at once; `claimWait` N > 0 waits up to N
// seconds (wait => true under SET LOCAL lock_timeout), and a claim that timed
// out (55P03, or 57014 from a statement_timeout) is postponed like
// in_progress. No handler is held by someone else's transaction.
//
// Batches: idempotentBatch(handler, opts), the same handler and options, for
// sqs-consumer's handleMessageBatch: one claim_operations, one
// complete_operations (and one release_operations) per receive, each message
// handled as above (see lib/batch.mjs).
//
// Sign-off (docs/signoff-protocol.md, version 1): both wrappers map the job
// type of every call by IDEMPOTENCY_SIGNOFF_JOB_TYPES (yours=run's,...) and
// take their timings from the run's lease IDEMPOTENCY_SIGNOFF_LEASE (s:
// retryAfter, the release cap, the reconnect bound; the heartbeat at most a
// quarter of it), whether or not IDEMPOTENCY_SIGNOFF is set. Started by the
// sign-off runner with IDEMPOTENCY_SIGNOFF (a Unix socket), they also stop
// at the points `claimed` (after a run/verify claim, heartbeat running,
// before the handler; 'fail' = KnownFailure) and `handled` (handler
// returned, heartbeat stopped, before the completion) until the runner
// answers or kills the process, and report every other answer of the claim
// at `judged` (its verdict; busy for 55P03/57014, error with its SQLSTATE and
// message for any other error of the claim) before the message is
// acknowledged, postponed or failed; with IDEMPOTENCY_SIGNOFF_HELLO=1 (a
// runner that answers it) the process's first point is `hello` (the helper,
// Node.js, sqs-consumer and the pool's database), once. Unset: no
// connection. signoff(), signoffPoint(), parseJobTypes() and parseLease()
// are the same for a hand-written worker.
//
// Modules: lib/common.mjs (withReconnect and the reconnect bound, the
// claim's bound, the backoff), lib/plain.mjs (the plain functions: claim,
// complete, release, extendLease, Heartbeat, claimBatch, completeBatch,
// releaseBatch), lib/single.mjs (idempotent), lib/batch.mjs
// (idempotentBatch), lib/signoff.mjs (the sign-off points, the mapping and
// the lease), lib/portable.mjs (the portable edition's plain script:
// portableSql, installPortable). The names: docs/helpers.md.
export { KnownFailure, PermanentFailure, claimErrorHeals, connectionLost, fingerprintOf, isBusy, permanentFailureOf,
         permanentFailureResult, withReconnect, workerId } from './lib/common.mjs';
export { claim, claimBatch, complete, completeBatch, extendLease, failPermanently, Heartbeat, release,
         releaseBatch } from './lib/plain.mjs';
export { signoff, signoffAnswer, signoffEndedMessage, signoffHelloMessage, signoffMessage, signoffPoint, parseJobTypes,
         parseLease, SignoffError, SIGNOFF_VERSION } from './lib/signoff.mjs';
export { idempotent } from './lib/single.mjs';
export { installPortable, portableSql } from './lib/portable.mjs';
export { idempotentBatch } from './lib/batch.mjs';
