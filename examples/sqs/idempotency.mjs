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
// releases the claim and the message is redelivered at once; any other error
// leaves the claim to its lease and the message to its visibility timeout.
import { createHash } from 'node:crypto';
import { hostname } from 'node:os';
import { ChangeMessageVisibilityCommand } from '@aws-sdk/client-sqs';

/** Throw from a handler when the effect certainly did not happen. */
export class KnownFailure extends Error {}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

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
 * @param opts.onVerdict  optional (event) => void, for logs and metrics
 */
export function idempotent(handler, opts) {
  const { pool, sqs, queueUrl, jobType, key } = opts;
  const heartbeatMs = opts.heartbeat ?? 60_000;
  const retryAfter = opts.retryAfter ?? 600;
  const worker = opts.worker ?? `${hostname()}/pid-${process.pid}`;
  const notify = opts.onVerdict ?? (() => {});

  return async (message) => {
    const payload = JSON.parse(message.Body);
    const opKey = key(payload, message);
    const { rows: [claim] } = await pool.query(
      'SELECT verdict, attempt, result FROM idempotency.claim_operation($1, $2, $3, $4)',
      [jobType, opKey, fingerprintOf(message.Body), worker]);
    const event = { key: opKey, verdict: claim.verdict, attempt: claim.attempt,
                    messageId: message.MessageId,
                    receiveCount: message.Attributes?.ApproximateReceiveCount };

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
    // heartbeat: keep the claim young while the handler runs
    let beating = true;
    const beat = (async () => {
      while (beating) {
        await sleep(heartbeatMs);
        if (!beating) break;
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
      beating = false;
      if (err instanceof KnownFailure) {
        await pool.query('SELECT idempotency.release_operation($1, $2, $3)',
                         [jobType, opKey, claim.attempt]);
        await sqs.send(new ChangeMessageVisibilityCommand({
          QueueUrl: queueUrl, ReceiptHandle: message.ReceiptHandle, VisibilityTimeout: 0 }));
        notify({ ...event, action: 'released' });
        return undefined;
      }
      throw err;   // uncertain: the lease and the policy decide
    } finally {
      beating = false;
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
