// lib/plain.mjs: the plain functions (docs/helpers.md), the same as the
// Python helper's, for a worker that does not use sqs-consumer: claim,
// complete, release, extendLease, Heartbeat, and the batch calls claimBatch,
// completeBatch, releaseBatch, on a pg.Pool.
//
//   const c = await claim(pool, 'send_confirmation', order, { fingerprint: fingerprintOf(body) });
//   if (c.runs) {                                   // run or verify (c.verdict === 'verify': look first)
//     const beat = new Heartbeat(pool, 'send_confirmation', order, c.attempt, 150).start();   // s
//     try { value = await send(order); } finally { await beat.stop(); }
//     await complete(pool, 'send_confirmation', order, c.attempt, value);
//   }                                               // else completed, in_progress, held, skipped
//
// Every call maps its job type by IDEMPOTENCY_SIGNOFF_JOB_TYPES (read once per
// process, as IDEMPOTENCY_SIGNOFF_LEASE and IDEMPOTENCY_SIGNOFF: see
// lib/signoff.mjs); claim and claimBatch report the sign-off point `judged`
// for every answer that runs nothing, before they resolve or reject. A call
// whose connection was lost is sent again (the claim with its delivery
// token) for up to `reconnectFor` seconds (withReconnect).
import { randomUUID } from 'node:crypto';
import { CLAIM_SQL, CLAIMS_SQL, COMPLETE_SQL, RELEASE_SQL, claimErrorHeals, claimOn, errorMessage, isBusy, permanentFailureResult,
         judgedVerdictOf, sleep, sqlstateOf, withReconnect, workerId } from './common.mjs';
import { signoff } from './signoff.mjs';

let processSignoff = null;

/** the sign-off settings of this process (signoff(process.env), read at the first call) */
export function processSignoffSettings() {
  processSignoff ??= signoff();
  return processSignoff;
}

/** forget them: the next call reads the environment again (for tests) */
export function forgetSignoffSettings() {
  processSignoff = null;
}

const claimOf = (row, delivery) => ({
  verdict: row.verdict, attempt: row.attempt, result: row.result, delivery,
  runs: row.verdict === 'run' || row.verdict === 'verify',
});

// the sign-off point `judged` of a claim that runs nothing (or threw: busy,
// or error with its SQLSTATE and message)
async function judged(so, jobType, key, claimed, err) {
  if (!so.armed) return;
  if (claimed) {
    await so.point('judged', { job_type: jobType, key, attempt: claimed.attempt, verdict: claimed.verdict,
                               heartbeat: false });
    return;
  }
  await so.point('judged', { job_type: jobType, key, attempt: null, verdict: judgedVerdictOf(err),
                             sqlstate: sqlstateOf(err), message: errorMessage(err), heartbeat: false });
}

/**
 * idempotency.claim_operation(jobType, key, fingerprint, worker, delivery =>
 * token, wait => wait > 0). Resolves { verdict, attempt, result, delivery, runs }
 * (runs: run or verify). A token is made (crypto.randomUUID()) unless given:
 * one per handler invocation. wait: seconds to wait for another
 * transaction's uncommitted claim of the key (0: in_progress at once; N > 0:
 * under lock_timeout, 55P03 after N s). Rejects with pg's error: ID002 and
 * class 22 are the caller's bugs (claimErrorHeals(err) is false); isBusy(err):
 * as in_progress; anything else may heal. Armed, every answer that runs
 * nothing and every error (with its SQLSTATE and message) is reported at
 * `judged`, after the process's point hello (once, with the pool's database).
 */
export async function claim(pool, jobType, key, { fingerprint = null, worker = workerId(), delivery = randomUUID(),
                                                  wait = 0, reconnectFor, onLost } = {}) {
  const so = processSignoffSettings();
  const runs = so.jobType(jobType);   // throws before anything is sent
  const params = [runs, String(key), fingerprint, worker, delivery, wait > 0];
  let row;
  try {
    ({ rows: [row] } = await withReconnect(pool, (c) => claimOn(c, CLAIM_SQL, params, wait), { reconnectFor, onLost }));
  } catch (err) {
    if (so.armed) await so.hello(pool);
    await judged(so, runs, String(key), null, err);
    throw err;
  }
  if (so.armed) await so.hello(pool);
  const claimed = claimOf(row, delivery);
  if (!claimed.runs) await judged(so, runs, String(key), claimed);
  return claimed;
}

async function write(pool, sql, params, { reconnectFor, onLost } = {}) {
  onLost ??= (err) => console.error(`${sql.slice(0, 48)}...: ${err.message}; once more on a new connection`);
  return withReconnect(pool, (c) => c.query(sql, params), { reconnectFor, onLost });
}

/**
 * idempotency.complete_operation(jobType, key, attempt, result as JSON);
 * sent again while the connection is lost (a repeated completion is a
 * no-op). Rejects with ID003 when another worker took the claim over.
 */
export async function complete(pool, jobType, key, attempt, result = null, opts = {}) {
  const runs = processSignoffSettings().jobType(jobType);
  await write(pool, 'SELECT idempotency.complete_operation($1, $2, $3, $4)',
              [runs, String(key), attempt, JSON.stringify(result ?? null)], opts);
}

/**
 * End the operation of a permanent refusal (PermanentFailure): the sign-off
 * point ended (nothing unless a runner that answers it started the worker),
 * then complete() with permanentFailureResult(reason) as the result. The
 * caller then fails the message the way its queue fails a job, without a
 * retry (and, meeting that result in a later completed verdict, fails it
 * again without running): opts.delivery says how, for the sign-off report.
 * ID003 as complete().
 */
export async function failPermanently(pool, jobType, key, attempt, reason, opts = {}) {
  const so = processSignoffSettings();
  await so.ended({ job_type: so.jobType(jobType), key: String(key), attempt, reason: String(reason),
                   delivery: opts.delivery ?? 'left to the caller' });
  await complete(pool, jobType, key, attempt, permanentFailureResult(reason), opts);
}

/** idempotency.release_operation(jobType, key, attempt): the next claim runs attempt + 1 */
export async function release(pool, jobType, key, attempt, opts = {}) {
  const runs = processSignoffSettings().jobType(jobType);
  await write(pool, 'SELECT idempotency.release_operation($1, $2, $3)', [runs, String(key), attempt], opts);
}

/** idempotency.extend_lease(jobType, key, attempt), once: resolves the new expiry (a Date) */
export async function extendLease(pool, jobType, key, attempt) {
  const runs = processSignoffSettings().jobType(jobType);
  const { rows: [row] } = await pool.query('SELECT idempotency.extend_lease($1, $2, $3) AS expiry',
                                           [runs, String(key), attempt]);
  return row.expiry;
}

/**
 * extendLease every `every` seconds (a quarter of the lease is usual) from
 * start() until stop() (which resolves once no beat is running); a failed
 * beat is logged and tried again at the next; ID003 (taken over) ends it.
 */
export class Heartbeat {
  #stop = new AbortController();
  #done = Promise.resolve();

  constructor(pool, jobType, key, attempt, every) {
    Object.assign(this, { pool, jobType, key, attempt, every });
  }

  start() {
    const { signal } = this.#stop;
    this.#done = (async () => {
      while (!signal.aborted) {
        await sleep(this.every * 1000, signal);
        if (signal.aborted) break;
        try {
          await extendLease(this.pool, this.jobType, this.key, this.attempt);
        } catch (err) {
          if (err.code === 'ID003') break;   // taken over: stop beating
          console.error(`extend_lease ${this.key}: ${err.message}`);
        }
      }
    })();
    return this;
  }

  async stop() {
    this.#stop.abort();
    await this.#done;
  }
}

function parallel(what, keys, ...lists) {
  if (lists.some((l) => l && l.length !== keys.length)) {
    throw new TypeError(`${what}: the lists must be parallel to keys`);
  }
}

/**
 * idempotency.claim_operations(jobType, keys, fingerprints, worker,
 * deliveries => tokens, wait => wait > 0): many keys of one job type in one
 * call and one commit (at most 1000). Resolves one claim per key, in the order
 * of keys, each with the verdict claim() would give it (a key given twice is
 * two deliveries: run, then in_progress). A token per key is made unless
 * given. The server answers or refuses the call as a whole: ID002, class 22 or
 * the bound (55P03, 57014) reject and record nothing (claim those keys one by
 * one to find the bad one, as idempotentBatch does). Every key answered
 * anything but run or verify is reported at `judged`; so is every key, with
 * the verdict error, when the call fails otherwise (42501, ID001, a lost
 * connection).
 */
export async function claimBatch(pool, jobType, keys, { fingerprints = null, worker = workerId(), deliveries = null,
                                                        wait = 0, reconnectFor, onLost } = {}) {
  keys = keys.map(String);
  deliveries ??= keys.map(() => randomUUID());
  parallel('claimBatch', keys, fingerprints, deliveries);
  const so = processSignoffSettings();
  const runs = so.jobType(jobType);
  const params = [runs, keys, fingerprints, worker, deliveries, wait > 0];
  let rows;
  try {
    ({ rows } = await withReconnect(pool, (c) => claimOn(c, CLAIMS_SQL, params, wait), { reconnectFor, onLost }));
  } catch (err) {
    if (so.armed) await so.hello(pool, null, 'plain_batch');
    if (!isBusy(err) && claimErrorHeals(err)) {
      // an error no key alone causes (a grant, a job type, the connection): every key's
      for (const k of keys) await judged(so, runs, k, null, err);
    }
    throw err;
  }
  if (so.armed) await so.hello(pool, null, 'plain_batch');
  if (rows.length !== keys.length || rows.some((r, i) => r.operation_key !== keys[i])) {
    throw new Error(`claim_operations answered ${rows.length} rows for ${keys.length} keys, ` +
                    'not one per key in their order');
  }
  const claims = rows.map((r, i) => claimOf(r, deliveries[i]));
  for (const [i, c] of claims.entries()) {
    if (!c.runs) await judged(so, runs, keys[i], c);
  }
  return claims;
}

const outcomeOf = (r) => ({ key: r.operation_key, attempt: r.attempt, done: r.done, sqlstate: r.sqlstate,
                            message: r.message });

/**
 * idempotency.complete_operations(jobType, keys, attempts, results as JSON):
 * one { key, attempt, done, sqlstate, message } per key, in their order:
 * done, or the refusal of that key alone (ID003 taken over, ID004, ID005).
 */
export async function completeBatch(pool, jobType, keys, attempts, results = null, opts = {}) {
  keys = keys.map(String);
  results ??= keys.map(() => null);
  parallel('completeBatch', keys, attempts, results);
  const runs = processSignoffSettings().jobType(jobType);
  const { rows } = await write(pool, COMPLETE_SQL,
                               [runs, keys, attempts, results.map((r) => JSON.stringify(r ?? null))], opts);
  return rows.map(outcomeOf);
}

/** idempotency.release_operations(jobType, keys, attempts): one outcome per key, as completeBatch */
export async function releaseBatch(pool, jobType, keys, attempts, opts = {}) {
  keys = keys.map(String);
  parallel('releaseBatch', keys, attempts);
  const runs = processSignoffSettings().jobType(jobType);
  const { rows } = await write(pool, RELEASE_SQL, [runs, keys, attempts], opts);
  return rows.map(outcomeOf);
}
