// lib/common.mjs: what the single and the batch handler share: the claim's
// SQL, the retry of a call whose connection was lost, the claim's bound,
// the release backoff, KnownFailure and the fingerprint.
import { createHash } from 'node:crypto';
import pg from 'pg';

export const CLAIM_SQL = 'SELECT verdict, attempt, result FROM idempotency.claim_operation($1, $2, $3, $4, ' +
                         'delivery => $5, wait => $6)';
export const BUSY = ['55P03', '57014'];   // lock_timeout, statement_timeout: the claim hit its bound

// the sign-off verdict of a claim that threw (the point `judged`,
// docs/signoff-protocol.md): 'busy' for its bound (BUSY), 'error' for an
// error it will not heal from (ID002: the key with another fingerprint;
// class 22: bad input), else null (a lost connection, anything else: not
// reported)
export const judgedVerdictOf = (err) =>
  (BUSY.includes(err?.code) ? 'busy' : err?.code === 'ID002' || /^22/.test(err?.code ?? '') ? 'error' : null);

// an error of the connection (lost, closed, refused), not of the statement:
// no SQLSTATE at all, class 08 (PgBouncer's own errors are 08P01, and it
// closes the connection after them), or 57P01-57P03 (the backend was
// terminated: pg_ctl restart, a failover)
// (pg's DatabaseError, or one of another copy of pg: an app whose pg is not
// deduplicated with this package's throws errors of its own copy's class)
const isDatabaseError = (err) => err instanceof pg.DatabaseError ||
  (err?.constructor?.name === 'DatabaseError' && typeof err.severity === 'string' &&
   /^[0-9A-Z]{5}$/.test(err.code ?? ''));
export const connectionLost = (err) => !isDatabaseError(err) ||
  /^08/.test(err.code ?? '') || ['57P01', '57P02', '57P03'].includes(err.code);

// how long a call whose connection was lost is tried again (same arguments,
// so a claim keeps its delivery token): 0, 0.1, 0.2 ... 2 s apart, for up to
// IDEMPOTENCY_RECONNECT_FOR ms (default 30 s; keep it under half the lease;
// under a sign-off run's lease, at most half of that: see timings()).
// PgBouncer refuses logins for server_login_retry (15 s) after the server
// was down.
const RECONNECT_FOR = Number(process.env.IDEMPOTENCY_RECONNECT_FOR ?? 30000);
const pauseFor = (ms) => new Promise((r) => setTimeout(r, ms));

/**
 * The timings a wrapper derives from its options and the lease:
 * { heartbeatMs, retryAfter, releaseCap, reconnectMs }.
 *  - heartbeatMs: ms between extend_lease calls (opts.heartbeat, default 60000)
 *  - retryAfter: s until an in_progress (or busy) message is seen again
 *    (opts.retryAfter, default 600: about the lease)
 *  - releaseCap: s a released message waits at most (half of retryAfter)
 *  - reconnectMs: ms a call whose connection was lost is tried again
 *    (IDEMPOTENCY_RECONNECT_FOR)
 * `runLease` (s): a sign-off run's lease (IDEMPOTENCY_SIGNOFF_LEASE,
 * docs/signoff-protocol.md), or null. When given, it replaces the lease the
 * options stand for: retryAfter is the run's lease (rounded up to whole
 * seconds, as SQS counts, at least 1), releaseCap and reconnectMs at most
 * half of it, and heartbeatMs at most a quarter of it.
 */
export function timings(opts, runLease = null) {
  const heartbeatMs = opts.heartbeat ?? 60_000;
  const retryAfter = opts.retryAfter ?? 600;
  if (runLease === null) {
    return { heartbeatMs, retryAfter, releaseCap: retryAfter / 2, reconnectMs: RECONNECT_FOR };
  }
  return { heartbeatMs: Math.min(heartbeatMs, runLease * 1000 / 4),
           retryAfter: Math.max(1, Math.ceil(runLease)),
           releaseCap: runLease / 2,
           reconnectMs: Math.min(RECONNECT_FOR, runLease * 1000 / 2) };
}

// run(client) on a client of the pool; again on a new client while the
// connection is lost (onLost(err) first), for up to reconnectMs (default
// IDEMPOTENCY_RECONNECT_FOR). A broken client is discarded.
export async function withRetry(pool, run, onLost, reconnectMs = RECONNECT_FOR) {
  const deadline = Date.now() + reconnectMs;
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
export async function claimOn(c, sql, params, claimWait) {
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
// attempt, at most `backoffMax`, jittered, within `releaseCap` (half the
// lease: timings()), so that the sweeper (a released record nobody claimed
// for a lease) does not re-enqueue it too. SQS counts in whole seconds: at
// least 1.
export function releaseDelay(attempt, { backoff, backoffMax, releaseCap }) {
  const d = Math.min(backoffMax, backoff * 2 ** Math.min(attempt - 1, 32));
  return Math.max(1, Math.min(Math.floor(releaseCap),
                              Math.round(d / 2 + Math.random() * d / 2)));
}

/** Throw from a handler when the effect certainly did not happen. */
export class KnownFailure extends Error {}

// resolves after ms, or at once when signal aborts
export const sleep = (ms, signal) => new Promise((resolve) => {
  const t = setTimeout(resolve, ms);
  signal?.addEventListener('abort', () => { clearTimeout(t); resolve(); }, { once: true });
});

export function fingerprintOf(body) {
  return 'sha256:' + createHash('sha256').update(body).digest('hex');
}
