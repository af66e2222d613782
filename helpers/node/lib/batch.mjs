// lib/batch.mjs: idempotentBatch(), the handler for sqs-consumer's
// handleMessageBatch (one claim_operations per receive). See index.mjs.
import { randomUUID } from 'node:crypto';
import { hostname } from 'node:os';
import { ChangeMessageVisibilityBatchCommand } from '@aws-sdk/client-sqs';
import { BUSY, CLAIM_SQL, CLAIMS_SQL, COMPLETE_SQL, RELEASE_SQL, KnownFailure, PermanentFailure, claimOn,
         connectionLost, errorMessage, fingerprintOf, judgedVerdictOf, permanentDelivery, permanentFailureOf,
         permanentFailureResult, releaseDelay, sqlstateOf, sleep, timings, withReconnect } from './common.mjs';
import { signoff } from './signoff.mjs';

const MAX_KEYS = 1000;        // claim_operations' limit per call
const SQS_BATCH_MAX = 10;     // entries per ChangeMessageVisibilityBatch

/**
 * The batch form of idempotent(), for sqs-consumer's handleMessageBatch:
 *
 *   handleMessageBatch: idempotentBatch(handler, opts), batchSize: 10
 *
 * The same handler and options as idempotent(); per receive (up to 10
 * messages; split above claim_operations' 1000 keys) ONE claim_operations
 * call, ONE complete_operations call for the handlers that returned, ONE
 * release_operations call for those that threw KnownFailure, and one
 * ChangeMessageVisibilityBatch for the messages postponed. Every message gets
 * the single path's treatment of its verdict; resolves to the messages to
 * delete (sqs-consumer deletes them). A message's failure (its handler threw,
 * its completion was refused) leaves that message to its visibility timeout
 * and never holds back the others.
 *
 *  - the delivery tokens: one uuid per message of the receive; the batch
 *    claim sent once more after a lost connection presents the same tokens,
 *    and the server gives each key its claim back (same verdicts, attempts)
 *  - a claim the server refused as a whole (ID002: one message's key was
 *    claimed with another body; 55P03/57014: one key's lock; any SQLSTATE)
 *    recorded nothing: the receive falls back to one claim_operation per
 *    message (the same tokens), so one bad message does not block the others
 *  - the handlers of run/verify messages run concurrently; one heartbeat
 *    calls extend_lease (a single call per key) for every claim of the
 *    receive until the last handler is done, so that a key whose handler
 *    finished early stays young while it waits for the batch's completion
 *  - postponements (in_progress, 55P03/57014, released) are sent at the end
 *    of the handler: sqs-consumer's batch heartbeat (heartbeatInterval)
 *    resets the visibility of every message of the receive while it runs
 *
 * Events (onVerdict) are the single path's, with `batch`: the receive's size.
 *
 * Sign-off (docs/signoff-protocol.md): as idempotent()'s (the map and the
 * run's lease whether or not IDEMPOTENCY_SIGNOFF is set), per key of the
 * receive: `judged` for every key the claim did not answer run or verify
 * (its verdict, or busy / error for a key whose claim threw in the fallback),
 * the exchanges at the same time, with the heartbeat of the run/verify keys
 * running, before any message is acknowledged or postponed; per run/verify
 * key `claimed` before its handler (the heartbeat running; the exchanges of
 * the receive at the same time), `handled` after the last handler returned
 * and the heartbeat stopped, before complete_operations.
 */
export function idempotentBatch(handler, opts) {
  const { pool, sqs, queueUrl, key } = opts;
  const so = signoff();
  const backoff = opts.backoff ?? 1;
  const backoffMax = opts.backoffMax ?? 60;
  const worker = opts.worker ?? `${hostname()}/pid-${process.pid}`;
  const notify = opts.onVerdict ?? (() => {});
  const claimWait = opts.claimWait ?? 0;
  // a permanent failure's message: 'leave' (not deleted: the redrive policy) or 'delete'
  const permanentMode = opts.permanentFailure ?? 'leave';
  const lostOnce = (what) => (err) =>
    console.error(`${what}: ${err.message}; once more on a new connection`);
  const write = (sql, params, reconnectFor) => withReconnect(pool, (c) => c.query(sql, params),
                                                            { onLost: lostOnce(sql.slice(0, 48) + '...'), reconnectFor });

  // the line of a sign-off point (lib/signoff.mjs)
  const signoffFields = (it, jobType) => ({ job_type: jobType, key: it.key, attempt: it.claim.attempt,
                                            verdict: it.claim.verdict, heartbeat: true });
  // the line of the point `judged` of a key that is not worked on: its
  // verdict, or busy / error (with the SQLSTATE and message) for its claim's error
  const judgedFields = (it, jobType) => {
    if (!it.error) {
      return { job_type: jobType, key: it.key, attempt: it.claim.attempt, verdict: it.claim.verdict,
               heartbeat: false };
    }
    return { job_type: jobType, key: it.key, attempt: null, verdict: judgedVerdictOf(it.error),
             sqlstate: sqlstateOf(it.error), message: errorMessage(it.error), heartbeat: false };
  };

  // one claim_operation per message (the fallback); it.claim or it.error
  async function claimEach(items, jobType, reconnectFor) {
    for (const it of items) {
      const params = [jobType, it.key, it.fingerprint, worker, it.delivery, claimWait > 0];
      try {
        ({ rows: [it.claim] } = await withReconnect(pool, (c) => claimOn(c, CLAIM_SQL, params, claimWait), {
          onLost: (err) => {
            console.error(`claim_operation ${it.key}: ${err.message}; once more on a new connection`);
            notify({ ...it.seen, verdict: 'claim error', attempt: null, sqlstate: 'connection', action: 'again' });
          },
          reconnectFor }));
      } catch (err) {
        it.error = err;
      }
    }
  }

  async function receive(messages, jobType, { heartbeatMs, retryAfter, releaseCap, reconnectFor }) {
    const n = messages.length;
    const acks = [];          // messages sqs-consumer deletes
    const postponed = [];     // [message, VisibilityTimeout]
    const items = [];
    for (const message of messages) {
      let payload, opKey;
      try {
        payload = JSON.parse(message.Body);
        opKey = key(payload, message);
      } catch (err) {         // as the single path's throw: left to its visibility timeout
        console.error(`message ${message.MessageId}: ${err.message}; not claimed`);
        continue;
      }
      items.push({
        message, payload, key: opKey,
        fingerprint: fingerprintOf(message.Body),
        // one token per message of this receive: only the claim repeated
        // after a lost connection presents them again
        delivery: randomUUID(),
        seen: { key: opKey, messageId: message.MessageId,
                receiveCount: message.Attributes?.ApproximateReceiveCount, batch: n },
      });
    }
    if (items.length === 0) return acks;

    // ---- the claim: one call for the receive
    const params = [jobType, items.map((it) => it.key), items.map((it) => it.fingerprint), worker,
                    items.map((it) => it.delivery), claimWait > 0];
    try {
      const { rows } = await withReconnect(pool, (c) => claimOn(c, CLAIMS_SQL, params, claimWait), {
        onLost: (err) => {
          console.error(`claim_operations (${items.length} keys): ${err.message}; once more on a new connection`);
          for (const it of items) {
            notify({ ...it.seen, verdict: 'claim error', attempt: null, sqlstate: 'connection', action: 'again' });
          }
        },
        reconnectFor });
      if (rows.length !== items.length) {
        throw new Error(`claim_operations returned ${rows.length} rows for ${items.length} keys`);
      }
      rows.forEach((r, i) => { items[i].claim = r; });
    } catch (err) {
      if (connectionLost(err)) {
        // the connection, for longer than the reconnect bound: nothing is
        // known; every message comes back after its visibility timeout
        // (each key judged error first, when armed)
        if (so.armed) {
          await so.hello(pool, 'sqs-consumer', 'idempotentBatch');
          await Promise.all(items.map((it) => so.point('judged', judgedFields({ ...it, error: err }, jobType))));
        }
        for (const it of items) {
          notify({ ...it.seen, verdict: 'claim error', attempt: null, sqlstate: err.code ?? 'connection',
                   action: 'raise' });
        }
        throw err;
      }
      // refused as a whole, nothing recorded: single claims for this receive
      console.error(`claim_operations (${items.length} keys): ${err.code} ${err.message}; ` +
                    'one claim_operation per message');
      await claimEach(items, jobType, reconnectFor);
    }
    if (so.armed) await so.hello(pool, 'sqs-consumer', 'idempotentBatch');   // the process's first point: who it is (once)

    // ---- the keys to work on: run / verify; one heartbeat for all their
    // claims, from here until the last handler returned (it keeps them young
    // also while the runner answers the judged exchanges)
    const work = items.filter((it) => !it.error && ['run', 'verify'].includes(it.claim.verdict));
    const stop = new AbortController();
    const beat = work.length === 0 ? Promise.resolve() : (async () => {
      while (!stop.signal.aborted) {
        await sleep(heartbeatMs, stop.signal);
        for (const it of work) {
          if (stop.signal.aborted) break;
          if (it.superseded) continue;
          try {
            await pool.query('SELECT idempotency.extend_lease($1, $2, $3)',
                             [jobType, it.key, it.claim.attempt]);
          } catch (err) {
            if (err.code === 'ID003') it.superseded = true;   // taken over: stop beating it
            else console.error(`extend_lease ${it.key}:`, err.message);
          }
        }
      }
    })();
    try {
      if (so.armed) {
        // sign-off point `judged` of every other key (its verdict; busy or
        // error for a claim that threw), the exchanges at the same time,
        // before its message is acknowledged or postponed; a failed
        // exchange fails its message as a handler's error would
        await Promise.all(items.filter((it) => !work.includes(it)).map(async (it) => {
          const fields = judgedFields(it, jobType);
          if (!fields) return;
          try {
            await so.point('judged', fields);
          } catch (err) {
            it.judgedFailure = err;
          }
        }));
      }

      // ---- the verdicts, in the order of the receive
      for (const it of items) {
        if (it.judgedFailure) {   // left to its visibility timeout
          console.error(`claim ${it.key}: ${it.judgedFailure.message}`);
          notify(it.error
            ? { ...it.seen, verdict: 'claim error', attempt: null, sqlstate: it.error.code ?? 'connection',
                action: 'failed' }
            : { ...it.seen, verdict: it.claim.verdict, attempt: it.claim.attempt, action: 'failed' });
          continue;
        }
        if (it.error) {
          const busy = BUSY.includes(it.error.code);
          if (busy) postponed.push([it.message, retryAfter]);
          else console.error(`claim_operation ${it.key}: ${it.error.code ?? ''} ${it.error.message}`);
          notify({ ...it.seen, verdict: 'claim error', attempt: null,
                   sqlstate: it.error.code ?? 'connection', action: busy ? 'retry' : 'raise' });
          continue;
        }
        it.event = { ...it.seen, verdict: it.claim.verdict, attempt: it.claim.attempt };
        if (it.claim.verdict === 'completed' && permanentFailureOf(it.claim.result) !== null) {
          // the operation ended in a permanent failure: this message ends as that one did
          if (permanentMode === 'delete') acks.push(it.message);
          notify({ ...it.event, action: 'failed permanently' });
          continue;
        }
        switch (it.claim.verdict) {
          case 'completed':
          case 'skipped':
          case 'held':
            acks.push(it.message);
            notify({ ...it.event, action: 'ack' });
            break;
          case 'in_progress':
            postponed.push([it.message, retryAfter]);
            notify({ ...it.event, action: 'retry' });
            break;
          case 'run':
          case 'verify':
            notify({ ...it.event, action: 'work' });   // in `work`
            break;
          default:
            console.error(`claim_operations ${it.key}: unknown verdict ${it.claim.verdict}`);
            notify({ ...it.event, action: 'failed' });
        }
      }

      // ---- the work: concurrently
      await Promise.all(work.map(async (it) => {
        try {
          // sign-off point `claimed` of this key: inside the heartbeat,
          // before its handler; 'fail' is handled as its KnownFailure
          if (so.armed && await so.point('claimed', signoffFields(it, jobType)) === 'fail') {
            throw new KnownFailure('sign-off runner: fail at claimed');
          }
          it.result = await handler(it.payload, { key: it.key, attempt: it.claim.attempt,
                                                  verify: it.claim.verdict === 'verify',
                                                  message: it.message });
          it.ok = true;
        } catch (err) {
          it.failure = err;
        }
      }));
    } finally {
      stop.abort();
      await beat;
    }
    if (so.armed && work.length) {
      // sign-off point `handled` of every key whose handler returned: the
      // heartbeat stopped, the completion not sent; a failed exchange
      // leaves its key to its lease, as a handler's throw
      await Promise.all(work.filter((it) => it.ok).map(async (it) => {
        try {
          await so.point('handled', signoffFields(it, jobType));
        } catch (err) {
          it.ok = false;
          it.failure = err;
        }
      }));
    }

    // ---- one completion (the refusals for good with it), one release
    const permanent = work.filter((it) => it.failure instanceof PermanentFailure);
    if (so.endedArmed && permanent.length) {
      // sign-off point `ended` of every key refused for good, before its completion;
      // a failed exchange leaves its key to its lease, as a handler's throw
      await Promise.all(permanent.map(async (it) => {
        try {
          await so.ended({ job_type: jobType, key: it.key, attempt: it.claim.attempt, reason: it.failure.message,
                           delivery: permanentDelivery(permanentMode) });
        } catch (err) {
          it.failure = err;
        }
      }));
    }
    for (const it of work) {
      if (it.failure instanceof PermanentFailure) {
        it.ok = true;
        it.permanent = true;
        it.result = permanentFailureResult(it.failure.message);
      }
    }
    const done = work.filter((it) => it.ok);
    const known = work.filter((it) => it.failure instanceof KnownFailure);
    for (const it of work) {
      if (!it.ok && !(it.failure instanceof KnownFailure)) {
        // uncertain: the lease and the policy decide
        console.error(`handler ${it.key}: ${it.failure?.message ?? it.failure}`);
        notify({ ...it.event, action: 'failed' });
      }
    }
    const outcome = async (sql, list, extra, each) => {
      if (!list.length) return;
      let rows;
      try {
        ({ rows } = await write(sql, [jobType, list.map((it) => it.key), list.map((it) => it.claim.attempt),
                                      ...extra(list)], reconnectFor));
      } catch (err) {   // the call as a whole: left to the visibility timeout
        console.error(`${sql.slice(0, 48)}...: ${err.code ?? ''} ${err.message}`);
        for (const it of list) notify({ ...it.event, action: 'failed', sqlstate: err.code ?? 'connection' });
        return;
      }
      rows.forEach((r, i) => each(list[i], r));
    };
    await outcome(COMPLETE_SQL, done, (list) => [list.map((it) => JSON.stringify(it.result ?? null))],
      (it, r) => {
        if (r.done && it.permanent) {
          // refused for good: left to the redrive policy (or deleted)
          if (permanentMode === 'delete') acks.push(it.message);
          notify({ ...it.event, action: 'failed permanently' });
        } else if (r.done) {
          acks.push(it.message);
          notify({ ...it.event, action: 'completed' });
        } else if (r.sqlstate === 'ID003') {
          // taken over after its lease ran out; the new owner records the
          // outcome. Nothing to redo here.
          acks.push(it.message);
          notify({ ...it.event, action: 'superseded' });
        } else {   // ID004, ID005: as the single path's throw, left to its visibility timeout
          console.error(`complete_operations ${it.key}: ${r.sqlstate} ${r.message}`);
          notify({ ...it.event, action: 'failed', sqlstate: r.sqlstate });
        }
      });
    await outcome(RELEASE_SQL, known, () => [], (it, r) => {
      if (r.done) {
        const delay = releaseDelay(it.claim.attempt, { backoff, backoffMax, releaseCap });
        postponed.push([it.message, delay]);
        notify({ ...it.event, action: 'released', retry_in: delay });
      } else {
        console.error(`release_operations ${it.key}: ${r.sqlstate} ${r.message}`);
        notify({ ...it.event, action: 'failed', sqlstate: r.sqlstate });
      }
    });

    // ---- the postponements: one ChangeMessageVisibilityBatch (per 10)
    for (let i = 0; i < postponed.length; i += SQS_BATCH_MAX) {
      const entries = postponed.slice(i, i + SQS_BATCH_MAX).map(([m, timeout], j) => ({
        Id: `m${i + j}`, ReceiptHandle: m.ReceiptHandle, VisibilityTimeout: timeout }));
      try {
        const out = await sqs.send(new ChangeMessageVisibilityBatchCommand({ QueueUrl: queueUrl, Entries: entries }));
        for (const f of out?.Failed ?? []) console.error(`ChangeMessageVisibilityBatch ${f.Id}: ${f.Code} ${f.Message}`);
      } catch (err) {   // back after the visibility timeout instead
        console.error(`ChangeMessageVisibilityBatch: ${err.message}`);
      }
    }
    return acks;
  }

  return async (messages) => {
    // both throw (a malformed map, a lease that is not a positive number)
    // before any call
    const jobType = so.jobType(opts.jobType);
    const times = timings(opts, so.lease());
    const acks = [];
    for (let i = 0; i < messages.length; i += MAX_KEYS) {
      acks.push(...await receive(messages.slice(i, i + MAX_KEYS), jobType, times));
    }
    return acks;
  };
}
