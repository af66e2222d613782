// lib/single.mjs: idempotent(), the handler for sqs-consumer's handleMessage
// (one message per call). See index.mjs for the protocol.
import { randomUUID } from 'node:crypto';
import { hostname } from 'node:os';
import { ChangeMessageVisibilityCommand } from '@aws-sdk/client-sqs';
import { BUSY, CLAIM_SQL, KnownFailure, PermanentFailure, claimOn, errorMessage, fingerprintOf, judgedVerdictOf,
         permanentDelivery, permanentFailureOf, permanentFailureResult, releaseDelay, sleep, sqlstateOf, timings,
         withReconnect } from './common.mjs';
import { signoff } from './signoff.mjs';


/**
 * @param handler  async (payload, ctx) => result (stored as jsonb);
 *                 ctx = { key, attempt, verify, message }; under verdict
 *                 verify the handler must look the key up at the provider first
 * @param opts.pool       pg.Pool
 * @param opts.sqs        SQSClient (to postpone a message that is in progress)
 * @param opts.queueUrl
 * @param opts.jobType    registered in idempotency.job_types
 * @param opts.key        (payload, message) => operation key (names the effect)
 * @param opts.heartbeat  ms between extend_lease calls (less than the lease; default 60000)
 * @param opts.retryAfter s until an in_progress message is seen again (about the lease; default 600)
 * @param opts.backoff    s before a released message is seen again (first attempt; default 1)
 * @param opts.backoffMax s at most (default 60; never more than retryAfter / 2)
 * @param opts.claimWait  s a claim may wait for another transaction's uncommitted
 *                        claim of the key (default 0: not at all, in_progress at once)
 * @param opts.reconnectFor s a call whose connection was lost is tried again (the
 *                        reconnect bound; default 30, or the deprecated
 *                        IDEMPOTENCY_RECONNECT_FOR in ms)
 * @param opts.onVerdict  optional (event) => void, for logs and metrics
 * @param opts.permanentFailure 'leave' (default) or 'delete': the message of a
 *                        handler that threw PermanentFailure (the operation
 *                        completed with the refusal as its result) is not
 *                        deleted, left to the queue's redrive policy (a later
 *                        receive meets the result and leaves it again, without
 *                        the handler), or deleted
 *
 * Sign-off (docs/signoff-protocol.md): the environment is read here, once.
 * IDEMPOTENCY_SIGNOFF_JOB_TYPES maps the job type of every call;
 * IDEMPOTENCY_SIGNOFF_LEASE (s) replaces the lease in the timings (see
 * timings() in common.mjs: retryAfter, the release cap, the reconnect bound;
 * the heartbeat at most a quarter of it); both whether or not
 * IDEMPOTENCY_SIGNOFF is set. When it is, the points `claimed` and `handled`
 * (run / verify) or `judged` (any other answer of the claim) are exchanged
 * with the runner.
 */
export function idempotent(handler, opts) {
  const { pool, sqs, queueUrl, key } = opts;
  const so = signoff();
  const backoff = opts.backoff ?? 1;
  const backoffMax = opts.backoffMax ?? 60;
  const worker = opts.worker ?? `${hostname()}/pid-${process.pid}`;
  const notify = opts.onVerdict ?? (() => {});
  const claimWait = opts.claimWait ?? 0;
  const permanentMode = opts.permanentFailure ?? 'leave';
  if (!['leave', 'delete'].includes(permanentMode)) {
    throw new TypeError(`idempotent: permanentFailure ${JSON.stringify(permanentMode)} is not 'leave' or 'delete'`);
  }

  return async (message) => {
    // both throw (a malformed map, a lease that is not a positive number)
    // before any call
    const jobType = so.jobType(opts.jobType);
    const { heartbeatMs, retryAfter, releaseCap, reconnectFor } = timings(opts, so.lease());
    const write = (sql, params) => withReconnect(pool, (c) => c.query(sql, params), {
      onLost: (err) => console.error(`${sql.slice(0, 40)}...: ${err.message}; once more on a new connection`),
      reconnectFor });
    // sign-off point `judged` (any answer of the claim but run / verify),
    // before the message is acknowledged, postponed or failed; a failed
    // exchange fails the message as a handler's error would
    const judged = async (event, fields) => {
      if (!so.armed) return;
      try {
        await so.point('judged', { job_type: jobType, key: event.key, heartbeat: false, ...fields });
      } catch (err) {
        notify({ ...event, action: 'failed' });
        throw err;
      }
    };
    const payload = JSON.parse(message.Body);
    const opKey = key(payload, message);
    const seen = { key: opKey, messageId: message.MessageId,
                   receiveCount: message.Attributes?.ApproximateReceiveCount };
    // one token per receive: only the claim repeated after a lost
    // connection below presents it again
    const delivery = randomUUID();
    const params = [jobType, opKey, fingerprintOf(message.Body), worker, delivery, claimWait > 0];
    let claim;
    try {
      ({ rows: [claim] } = await withReconnect(pool, (c) => claimOn(c, CLAIM_SQL, params, claimWait), {
        onLost: (err) => {
          console.error(`claim_operation ${opKey}: ${err.message}; once more on a new connection`);
          notify({ ...seen, verdict: 'claim error', attempt: null, sqlstate: 'connection', action: 'again' });
        },
        reconnectFor }));
    } catch (err) {
      if (so.armed) await so.hello(pool, 'sqs-consumer', 'idempotent');
      await judged({ ...seen, verdict: 'claim error', attempt: null, sqlstate: err.code },
                   { attempt: null, verdict: judgedVerdictOf(err), sqlstate: sqlstateOf(err),
                     message: errorMessage(err) });
      if (BUSY.includes(err.code)) {
        // the claim hit its bound (claimWait's lock_timeout, or with wait =>
        // false a lock met between its check and its write): as in_progress
        await sqs.send(new ChangeMessageVisibilityCommand({
          QueueUrl: queueUrl, ReceiptHandle: message.ReceiptHandle, VisibilityTimeout: retryAfter }));
        notify({ ...seen, verdict: 'claim error', attempt: null, sqlstate: err.code, action: 'retry' });
        return undefined;
      }
      // not deleted: back after its visibility timeout, to the dead-letter
      // queue after maxReceiveCount (ID002, other data under the key, ends
      // there; a lost connection heals)
      notify({ ...seen, verdict: 'claim error', attempt: null, sqlstate: err.code ?? 'connection',
               action: 'raise' });
      throw err;
    }
    if (so.armed) await so.hello(pool, 'sqs-consumer', 'idempotent');   // the process's first point: who it is (once)
    const event = { ...seen, verdict: claim.verdict, attempt: claim.attempt };

    if (claim.verdict !== 'run' && claim.verdict !== 'verify') {
      await judged(event, { attempt: claim.attempt, verdict: claim.verdict });
    }
    if (claim.verdict === 'completed' && permanentFailureOf(claim.result) !== null) {
      // the operation ended in a permanent failure: this receive ends as that one did
      notify({ ...event, action: 'failed permanently' });
      if (permanentMode === 'delete') return message;
      throw new PermanentFailure(permanentFailureOf(claim.result));   // not deleted: the redrive policy
    }
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

    const point = { job_type: jobType, key: opKey, attempt: claim.attempt, verdict: claim.verdict,
                    heartbeat: true };
    let result;
    try {
      // sign-off point `claimed`: inside the heartbeat, before the handler;
      // 'fail' is handled as the handler's KnownFailure
      if (so.armed && await so.point('claimed', point) === 'fail') {
        throw new KnownFailure('sign-off runner: fail at claimed');
      }
      result = await handler(payload, { key: opKey, attempt: claim.attempt,
                                        verify: claim.verdict === 'verify', message });
    } catch (err) {
      stop.abort();
      await beat;
      if (err instanceof KnownFailure) {
        await write('SELECT idempotency.release_operation($1, $2, $3)',
                    [jobType, opKey, claim.attempt]);
        // a later receive claims attempt + 1; within half the lease
        const delay = releaseDelay(claim.attempt, { backoff, backoffMax, releaseCap });
        await sqs.send(new ChangeMessageVisibilityCommand({
          QueueUrl: queueUrl, ReceiptHandle: message.ReceiptHandle, VisibilityTimeout: delay }));
        notify({ ...event, action: 'released', retry_in: delay });
        return undefined;
      }
      if (err instanceof PermanentFailure) {
        // refused for good: the operation ends (completed, the refusal its
        // result); the message is not deleted (sqs-consumer sees the throw):
        // the redrive policy takes it to the dead-letter queue (or deleted)
        if (so.endedArmed) {
          await so.ended({ job_type: jobType, key: opKey, attempt: claim.attempt, reason: err.message,
                           delivery: permanentDelivery(permanentMode) });
        }
        try {
          await write('SELECT idempotency.complete_operation($1, $2, $3, $4)',
                      [jobType, opKey, claim.attempt, JSON.stringify(permanentFailureResult(err.message))]);
        } catch (e) {
          if (e.code !== 'ID003') throw e;   // left to its lease, as an unknown outcome
          notify({ ...event, action: 'superseded' });
          return message;
        }
        notify({ ...event, action: 'failed permanently' });
        if (permanentMode === 'delete') return message;
        throw err;
      }
      notify({ ...event, action: 'failed' });
      throw err;   // uncertain: the lease and the policy decide
    } finally {
      stop.abort();
      await beat;
    }
    if (so.armed) {
      // sign-off point `handled`: the heartbeat stopped, the completion not sent
      try {
        await so.point('handled', point);
      } catch (err) {
        notify({ ...event, action: 'failed' });
        throw err;   // the effect may have happened: the lease and the policy decide
      }
    }
    try {
      await write('SELECT idempotency.complete_operation($1, $2, $3, $4)',
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
