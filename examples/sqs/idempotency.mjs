// idempotency.mjs: wrap an sqs-consumer handler in the claim protocol of the
// PostgreSQL extension `idempotency`.
//
//   handleMessage: idempotent(handler, { pool, sqs, queueUrl, jobType, key })
//
// For every delivery: claim_operation(job type, key, fingerprint, worker);
//   run / verify  -> handler(payload, ctx) with a lease heartbeat
//                    (extend_lease), then complete_operation -> delete (ack)
//   completed, skipped -> delete (ack): the work is done or given up
//   in_progress   -> keep the message, visible again after `retryAfter`
//                    seconds (another worker holds a young claim)
//   held          -> delete (ack): a person decides (resolve_operation)
// A handler that throws KnownFailure (the effect certainly did not happen)
// releases the claim and the message is redelivered after a backoff (its
// visibility: `backoff` seconds doubling with the attempt, at most
// `backoffMax` and half of `retryAfter`); any other error leaves the claim to
// its lease and the message to its visibility timeout. A database error of
// the claim throws too: the message is not deleted and comes back after its
// visibility timeout (then to the dead-letter queue after maxReceiveCount).
import { createHash } from 'node:crypto';
import { hostname } from 'node:os';
import { ChangeMessageVisibilityCommand } from '@aws-sdk/client-sqs';

/** Throw from a handler when the effect certainly did not happen. */
export class KnownFailure extends Error {}

// resolves after ms, or at once when signal aborts
const sleep = (ms, signal) => new Promise((resolve) => {
  const t = setTimeout(resolve, ms);
  signal?.addEventListener('abort', () => { clearTimeout(t); resolve(); }, { once: true });
});

export function fingerprintOf(body) {
  return 'sha256:' + createHash('sha256').update(body).digest('hex');
}

/**
 * @param handler  async (payload, ctx) => result (stored as jsonb);
 *                 ctx = { key, attempt, verify, message }; under verdict
 *                 verify the handler must look the key up at the provider first
 * @param opts.pool       pg.Pool
 * @param opts.sqs        SQSClient (to postpone a message that is in progress)
 * @param opts.queueUrl
 * @param opts.jobType    registered in idempotency.job_types
 * @param opts.key        (payload, message) => operation key (names the effect)
 * @param opts.heartbeat  ms between extend_lease calls (less than the lease)
 * @param opts.retryAfter s until an in_progress message is seen again (about the lease)
 * @param opts.backoff    s before a released message is seen again (first attempt; default 1)
 * @param opts.backoffMax s at most (default 60; never more than retryAfter / 2)
 * @param opts.onVerdict  optional (event) => void, for logs and metrics
 */
export function idempotent(handler, opts) {
  const { pool, sqs, queueUrl, jobType, key } = opts;
  const heartbeatMs = opts.heartbeat ?? 60_000;
  const retryAfter = opts.retryAfter ?? 600;
  const backoff = opts.backoff ?? 1;
  const backoffMax = opts.backoffMax ?? 60;
  const worker = opts.worker ?? `${hostname()}/pid-${process.pid}`;
  const notify = opts.onVerdict ?? (() => {});

  return async (message) => {
    const payload = JSON.parse(message.Body);
    const opKey = key(payload, message);
    const seen = { key: opKey, messageId: message.MessageId,
                   receiveCount: message.Attributes?.ApproximateReceiveCount };
    let claim;
    try {
      ({ rows: [claim] } = await pool.query(
        'SELECT verdict, attempt, result FROM idempotency.claim_operation($1, $2, $3, $4)',
        [jobType, opKey, fingerprintOf(message.Body), worker]));
    } catch (err) {
      // not deleted: back after its visibility timeout, to the dead-letter
      // queue after maxReceiveCount (ID002, other data under the key, ends
      // there; a lost connection heals)
      notify({ ...seen, verdict: 'claim error', attempt: null, sqlstate: err.code ?? 'connection',
               action: 'raise' });
      throw err;
    }
    const event = { ...seen, verdict: claim.verdict, attempt: claim.attempt };

    switch (claim.verdict) {
      case 'completed':
      case 'skipped':
      case 'held':             // a person decides; redelivering would not help
        notify({ ...event, action: 'ack' });
        return message;         // sqs-consumer deletes it
      case 'in_progress':      // someone else's claim is young: look again later
        await sqs.send(new ChangeMessageVisibilityCommand({
          QueueUrl: queueUrl, ReceiptHandle: message.ReceiptHandle,
          VisibilityTimeout: retryAfter }));
        notify({ ...event, action: 'retry' });
        return undefined;       // not deleted
      case 'run':
      case 'verify':
        break;
      default:
        throw new Error(`unknown verdict ${claim.verdict}`);
    }

    notify({ ...event, action: 'work' });
    // heartbeat: keep the claim young while the handler runs; stopped (the
    // sleep cancelled) before complete or release, so that no late beat
    // meets a completed record
    const stop = new AbortController();
    const beat = (async () => {
      while (!stop.signal.aborted) {
        await sleep(heartbeatMs, stop.signal);
        if (stop.signal.aborted) break;
        try {
          await pool.query('SELECT idempotency.extend_lease($1, $2, $3)',
                           [jobType, opKey, claim.attempt]);
        } catch (err) {
          if (err.code === 'ID003') break;   // taken over: stop beating
          console.error('extend_lease:', err.message);
        }
      }
    })();

    let result;
    try {
      result = await handler(payload, { key: opKey, attempt: claim.attempt,
                                        verify: claim.verdict === 'verify', message });
    } catch (err) {
      stop.abort();
      await beat;
      if (err instanceof KnownFailure) {
        await pool.query('SELECT idempotency.release_operation($1, $2, $3)',
                         [jobType, opKey, claim.attempt]);
        // a later receive claims attempt + 1; within half the lease, so that
        // the sweeper (a released record nobody claimed for a lease) does
        // not re-enqueue it too. SQS counts in whole seconds.
        const d = Math.min(backoffMax, backoff * 2 ** Math.min(claim.attempt - 1, 32));
        const delay = Math.max(1, Math.min(Math.floor(retryAfter / 2),
                                           Math.round(d / 2 + Math.random() * d / 2)));
        await sqs.send(new ChangeMessageVisibilityCommand({
          QueueUrl: queueUrl, ReceiptHandle: message.ReceiptHandle, VisibilityTimeout: delay }));
        notify({ ...event, action: 'released', retry_in: delay });
        return undefined;
      }
      notify({ ...event, action: 'failed' });
      throw err;   // uncertain: the lease and the policy decide
    } finally {
      stop.abort();
      await beat;
    }
    try {
      await pool.query('SELECT idempotency.complete_operation($1, $2, $3, $4)',
                       [jobType, opKey, claim.attempt, JSON.stringify(result ?? null)]);
    } catch (err) {
      // ID003: our claim was taken over after its lease ran out; the new
      // owner records the outcome. Nothing to redo here.
      if (err.code !== 'ID003') throw err;
      notify({ ...event, action: 'superseded' });
      return message;
    }
    notify({ ...event, action: 'completed' });
    return message;
  };
}
