// idempotency.mjs: wrap an sqs-consumer handler in the claim protocol of the
// PostgreSQL extension `idempotency`.
//
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
// `backoffMax` and half of `retryAfter`); any other error leaves the claim to
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
// handled as above (see idempotentBatch below).
import { createHash, randomUUID } from 'node:crypto';
import { hostname } from 'node:os';
import { ChangeMessageVisibilityBatchCommand, ChangeMessageVisibilityCommand } from '@aws-sdk/client-sqs';
import pg from 'pg';

const CLAIM_SQL = 'SELECT verdict, attempt, result FROM idempotency.claim_operation($1, $2, $3, $4, ' +
                  'delivery => $5, wait => $6)';
const BUSY = ['55P03', '57014'];   // lock_timeout, statement_timeout: the claim hit its bound

// an error of the connection (lost, closed, refused), not of the statement:
// no SQLSTATE at all, class 08 (PgBouncer's own errors are 08P01, and it
// closes the connection after them), or 57P01-57P03 (the backend was
// terminated: pg_ctl restart, a failover)
const connectionLost = (err) => !(err instanceof pg.DatabaseError) ||
  /^08/.test(err.code ?? '') || ['57P01', '57P02', '57P03'].includes(err.code);

// how long a call whose connection was lost is tried again (same arguments,
// so a claim keeps its delivery token): 0, 0.1, 0.2 ... 2 s apart, for up to
// IDEMPOTENCY_RECONNECT_FOR ms (default 30 s; keep it under half the lease).
// PgBouncer refuses logins for server_login_retry (15 s) after the server
// was down.
const RECONNECT_FOR = Number(process.env.IDEMPOTENCY_RECONNECT_FOR ?? 30000);
const pauseFor = (ms) => new Promise((r) => setTimeout(r, ms));

// run(client) on a client of the pool; again on a new client while the
// connection is lost (onLost(err) first), for up to RECONNECT_FOR ms. A
// broken client is discarded.
async function withRetry(pool, run, onLost) {
  const deadline = Date.now() + RECONNECT_FOR;
  for (let tries = 1; ; tries++) {
    const pause = Math.min(2000, 100 * (tries - 1));
    let client;
    try {
      client = await pool.connect();
    } catch (err) {
      if (Date.now() + pause > deadline) throw err;
      onLost?.(err);
      await pauseFor(pause);
      continue;
    }
    // a checked-out client that loses its connection also emits 'error'
    // (the query rejects as well): without a listener that would end the process
    const ignore = () => {};
    client.on('error', ignore);
    try {
      const out = await run(client);
      client.removeListener('error', ignore);
      client.release();
      return out;
    } catch (err) {
      const lost = connectionLost(err);
      client.removeListener('error', ignore);
      client.release(lost ? err : undefined);   // an error: the pool drops that client
      if (!lost || Date.now() + pause > deadline) throw err;
      onLost?.(err);
      await pauseFor(pause);
    }
  }
}

// the claim (CLAIM_SQL or CLAIMS_SQL) on client c: with claimWait > 0 in a
// transaction of its own under SET LOCAL lock_timeout (the pool's connection
// keeps its own lock_timeout)
async function claimOn(c, sql, params, claimWait) {
  if (!(claimWait > 0)) return c.query(sql, params);
  await c.query('BEGIN');
  try {
    await c.query("SELECT set_config('lock_timeout', $1, true)",
                  [`${Math.max(1, Math.round(claimWait * 1000))}ms`]);
    const r = await c.query(sql, params);
    await c.query('COMMIT');
    return r;
  } catch (err) {
    if (!connectionLost(err)) await c.query('ROLLBACK');
    throw err;
  }
}

// s until a released message is seen again: `backoff` doubling with the
// attempt, at most `backoffMax`, jittered, within half of `retryAfter`, so
// that the sweeper (a released record nobody claimed for a lease) does not
// re-enqueue it too. SQS counts in whole seconds.
function releaseDelay(attempt, { backoff, backoffMax, retryAfter }) {
  const d = Math.min(backoffMax, backoff * 2 ** Math.min(attempt - 1, 32));
  return Math.max(1, Math.min(Math.floor(retryAfter / 2),
                              Math.round(d / 2 + Math.random() * d / 2)));
}

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
 * @param opts.claimWait  s a claim may wait for another transaction's uncommitted
 *                        claim of the key (default 0: not at all, in_progress at once)
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
  const claimWait = opts.claimWait ?? 0;
  const write = (sql, params) => withRetry(pool, (c) => c.query(sql, params),
    (err) => console.error(`${sql.slice(0, 40)}...: ${err.message}; once more on a new connection`));

  return async (message) => {
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
      ({ rows: [claim] } = await withRetry(pool, (c) => claimOn(c, CLAIM_SQL, params, claimWait), (err) => {
        console.error(`claim_operation ${opKey}: ${err.message}; once more on a new connection`);
        notify({ ...seen, verdict: 'claim error', attempt: null, sqlstate: 'connection', action: 'again' });
      }));
    } catch (err) {
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
        await write('SELECT idempotency.release_operation($1, $2, $3)',
                    [jobType, opKey, claim.attempt]);
        // a later receive claims attempt + 1; within half the lease
        const delay = releaseDelay(claim.attempt, { backoff, backoffMax, retryAfter });
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

// ---- batches: sqs-consumer's handleMessageBatch -------------------------

const CLAIMS_SQL = 'SELECT operation_key, verdict, attempt, result FROM idempotency.claim_operations(' +
                   '$1, $2::text[], $3::text[], $4, deliveries => $5::text[], wait => $6)';
const COMPLETE_SQL = 'SELECT operation_key, attempt, done, sqlstate, message ' +
                     'FROM idempotency.complete_operations($1, $2::text[], $3::int[], $4::jsonb[])';
const RELEASE_SQL = 'SELECT operation_key, attempt, done, sqlstate, message ' +
                    'FROM idempotency.release_operations($1, $2::text[], $3::int[])';
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
 */
export function idempotentBatch(handler, opts) {
  const { pool, sqs, queueUrl, jobType, key } = opts;
  const heartbeatMs = opts.heartbeat ?? 60_000;
  const retryAfter = opts.retryAfter ?? 600;
  const backoff = opts.backoff ?? 1;
  const backoffMax = opts.backoffMax ?? 60;
  const worker = opts.worker ?? `${hostname()}/pid-${process.pid}`;
  const notify = opts.onVerdict ?? (() => {});
  const claimWait = opts.claimWait ?? 0;
  const lostOnce = (what) => (err) =>
    console.error(`${what}: ${err.message}; once more on a new connection`);
  const write = (sql, params) => withRetry(pool, (c) => c.query(sql, params),
                                           lostOnce(sql.slice(0, 48) + '...'));

  // one claim_operation per message (the fallback); it.claim or it.error
  async function claimEach(items) {
    for (const it of items) {
      const params = [jobType, it.key, it.fingerprint, worker, it.delivery, claimWait > 0];
      try {
        ({ rows: [it.claim] } = await withRetry(pool, (c) => claimOn(c, CLAIM_SQL, params, claimWait),
          (err) => {
            console.error(`claim_operation ${it.key}: ${err.message}; once more on a new connection`);
            notify({ ...it.seen, verdict: 'claim error', attempt: null, sqlstate: 'connection', action: 'again' });
          }));
      } catch (err) {
        it.error = err;
      }
    }
  }

  async function receive(messages) {
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
      const { rows } = await withRetry(pool, (c) => claimOn(c, CLAIMS_SQL, params, claimWait), (err) => {
        console.error(`claim_operations (${items.length} keys): ${err.message}; once more on a new connection`);
        for (const it of items) {
          notify({ ...it.seen, verdict: 'claim error', attempt: null, sqlstate: 'connection', action: 'again' });
        }
      });
      if (rows.length !== items.length) {
        throw new Error(`claim_operations returned ${rows.length} rows for ${items.length} keys`);
      }
      rows.forEach((r, i) => { items[i].claim = r; });
    } catch (err) {
      if (connectionLost(err)) {
        // the connection, twice: nothing is known; every message comes back
        // after its visibility timeout
        for (const it of items) {
          notify({ ...it.seen, verdict: 'claim error', attempt: null, sqlstate: err.code ?? 'connection',
                   action: 'raise' });
        }
        throw err;
      }
      // refused as a whole, nothing recorded: single claims for this receive
      console.error(`claim_operations (${items.length} keys): ${err.code} ${err.message}; ` +
                    'one claim_operation per message');
      await claimEach(items);
    }

    // ---- the verdicts, in the order of the receive
    const work = [];
    for (const it of items) {
      if (it.error) {
        const busy = BUSY.includes(it.error.code);
        if (busy) postponed.push([it.message, retryAfter]);
        else console.error(`claim_operation ${it.key}: ${it.error.code ?? ''} ${it.error.message}`);
        notify({ ...it.seen, verdict: 'claim error', attempt: null,
                 sqlstate: it.error.code ?? 'connection', action: busy ? 'retry' : 'raise' });
        continue;
      }
      it.event = { ...it.seen, verdict: it.claim.verdict, attempt: it.claim.attempt };
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
          work.push(it);
          notify({ ...it.event, action: 'work' });
          break;
        default:
          console.error(`claim_operations ${it.key}: unknown verdict ${it.claim.verdict}`);
          notify({ ...it.event, action: 'failed' });
      }
    }

    // ---- the work: concurrently; one heartbeat for all the claims
    if (work.length) {
      const stop = new AbortController();
      const beat = (async () => {
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
        await Promise.all(work.map(async (it) => {
          try {
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
    }

    // ---- one completion, one release
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
                                      ...extra(list)]));
      } catch (err) {   // the call as a whole: left to the visibility timeout
        console.error(`${sql.slice(0, 48)}...: ${err.code ?? ''} ${err.message}`);
        for (const it of list) notify({ ...it.event, action: 'failed', sqlstate: err.code ?? 'connection' });
        return;
      }
      rows.forEach((r, i) => each(list[i], r));
    };
    await outcome(COMPLETE_SQL, done, (list) => [list.map((it) => JSON.stringify(it.result ?? null))],
      (it, r) => {
        if (r.done) {
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
        const delay = releaseDelay(it.claim.attempt, { backoff, backoffMax, retryAfter });
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
    const acks = [];
    for (let i = 0; i < messages.length; i += MAX_KEYS) {
      acks.push(...await receive(messages.slice(i, i + MAX_KEYS)));
    }
    return acks;
  };
}
