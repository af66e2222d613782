// lib/common.mjs: what the plain functions, the single and the batch
// handler share: the claims' SQL, the call again after a lost connection
// (withReconnect, the reconnect bound), the claim's bound, the release
// backoff, KnownFailure, the error classification and the fingerprint.
import { createHash } from 'node:crypto';
import { hostname } from 'node:os';
import pg from 'pg';

export const CLAIM_SQL = 'SELECT verdict, attempt, result FROM idempotency.claim_operation($1, $2, $3, $4, ' +
                         'delivery => $5, wait => $6)';
export const CLAIMS_SQL = 'SELECT operation_key, verdict, attempt, result FROM idempotency.claim_operations(' +
                          '$1, $2::text[], $3::text[], $4, deliveries => $5::text[], wait => $6)';
export const COMPLETE_SQL = 'SELECT operation_key, attempt, done, sqlstate, message ' +
                            'FROM idempotency.complete_operations($1, $2::text[], $3::int[], $4::jsonb[])';
export const RELEASE_SQL = 'SELECT operation_key, attempt, done, sqlstate, message ' +
                           'FROM idempotency.release_operations($1, $2::text[], $3::int[])';
export const BUSY = ['55P03', '57014'];   // lock_timeout, statement_timeout: the claim hit its bound

/** the claim hit its bound (55P03, 57014): treat it as in_progress */
export const isBusy = (err) => BUSY.includes(err?.code);

/**
 * Can the same claim succeed later? No for the caller's bugs: ID002 (the key
 * was claimed with another fingerprint) and class 22 (bad input); yes for
 * everything else, first of all a lost connection.
 */
export const claimErrorHeals = (err) => !(err?.code === 'ID002' || /^22/.test(err?.code ?? ''));

/** the claim's worker column: HOST/pid-PID */
export const workerId = () => `${hostname()}/pid-${process.pid}`;

// the sign-off verdict of a claim that threw (the point `judged`,
// docs/signoff-protocol.md): 'busy' for its bound (BUSY), 'error' for any
// other error (ID002, class 22, 42501, ID001, a connection lost for longer
// than the reconnect bound, ...)
export const judgedVerdictOf = (err) => (BUSY.includes(err?.code) ? 'busy' : 'error');

// the error's message, one line (the point `judged`'s message)
export const errorMessage = (err) => {
  const text = String(err?.message ?? err ?? '').trim();
  return text ? text.split('\n')[0].trim() : (err?.constructor?.name ?? 'Error');
};

// an error of the connection (lost, closed, refused), not of the statement:
// no SQLSTATE at all, class 08 (PgBouncer's own errors are 08P01, and it
// closes the connection after them), or 57P01-57P03 (the backend was
// terminated: pg_ctl restart, a failover)
// (pg's DatabaseError, or one of another copy of pg: an app whose pg is not
// deduplicated with this package's throws errors of its own copy's class)
const isDatabaseError = (err) => err instanceof pg.DatabaseError ||
  (err?.constructor?.name === 'DatabaseError' && typeof err.severity === 'string' &&
   /^[0-9A-Z]{5}$/.test(err.code ?? ''));
// the error's SQLSTATE, or null when it is not the server's (ENOENT,
// ECONNREFUSED, a closed connection: their `code` is no SQLSTATE)
export const sqlstateOf = (err) => (isDatabaseError(err) ? err.code : null);
export const connectionLost = (err) => !isDatabaseError(err) ||
  /^08/.test(err.code ?? '') || ['57P01', '57P02', '57P03'].includes(err.code);

// The reconnect bound (docs/helpers.md): how long, in seconds, a call whose
// connection was lost is tried again (same arguments, so a claim keeps its
// delivery token), 0, 0.1, 0.2, 0.4 ... 2 s apart, from the first error:
// the option reconnectFor, default 30 (keep it under half the lease; under a
// sign-off run's lease, at most half of that: see timings()). PgBouncer
// refuses logins for server_login_retry (15 s) after the server was down.
export const RECONNECT_FOR = 30;
const pauseFor = (ms) => new Promise((r) => setTimeout(r, ms));
let reconnectEnvWarned = false;

/**
 * The reconnect bound when no reconnectFor option is given: 30 s, or the
 * deprecated IDEMPOTENCY_RECONNECT_FOR in its old unit, milliseconds (read at
 * each call; a DeprecationWarning once per process; removed in 0.6.0). A value
 * that is not a number of milliseconds is ignored (30 s).
 */
export function defaultReconnectFor(env = process.env) {
  const ms = env.IDEMPOTENCY_RECONNECT_FOR;
  if (ms === undefined || ms === '') return RECONNECT_FOR;
  if (!reconnectEnvWarned) {
    reconnectEnvWarned = true;
    process.emitWarning('IDEMPOTENCY_RECONNECT_FOR (milliseconds) is deprecated: use the option reconnectFor ' +
                        '(seconds); removed in 0.6.0', { type: 'DeprecationWarning', code: 'PG_IDEMPOTENCY_DEP1' });
  }
  const seconds = Number(ms) / 1000;
  return Number.isFinite(seconds) && seconds >= 0 ? seconds : RECONNECT_FOR;
}

/**
 * The timings a wrapper derives from its options and the lease:
 * { heartbeatMs, retryAfter, releaseCap, reconnectFor }.
 *  - heartbeatMs: ms between extend_lease calls (opts.heartbeat, default 60000)
 *  - retryAfter: s until an in_progress (or busy) message is seen again
 *    (opts.retryAfter, default 600: about the lease)
 *  - releaseCap: s a released message waits at most (half of retryAfter)
 *  - reconnectFor: s a call whose connection was lost is tried again
 *    (opts.reconnectFor; default defaultReconnectFor())
 * `runLease` (s): a sign-off run's lease (IDEMPOTENCY_SIGNOFF_LEASE,
 * docs/signoff-protocol.md), or null. When given, it replaces the lease the
 * options stand for: retryAfter is the run's lease (rounded up to whole
 * seconds, as SQS counts, at least 1), releaseCap and reconnectFor at most
 * half of it, and heartbeatMs at most a quarter of it.
 */
export function timings(opts, runLease = null) {
  const heartbeatMs = opts.heartbeat ?? 60_000;
  const retryAfter = opts.retryAfter ?? 600;
  const reconnectFor = opts.reconnectFor ?? defaultReconnectFor();
  if (runLease === null) {
    return { heartbeatMs, retryAfter, releaseCap: retryAfter / 2, reconnectFor };
  }
  return { heartbeatMs: Math.min(heartbeatMs, runLease * 1000 / 4),
           retryAfter: Math.max(1, Math.ceil(runLease)),
           releaseCap: runLease / 2,
           reconnectFor: Math.min(reconnectFor, runLease / 2) };
}

/**
 * run(client) on a client of the pool; again on a new client while the
 * connection is lost (connectionLost; onLost(err) first), 0, 0.1, 0.2, 0.4
 * ... 2 s apart, until reconnectFor seconds (default defaultReconnectFor())
 * have passed since the first error (at least once more); then that error
 * is thrown. Other errors are thrown at once. A broken client is discarded.
 */
export async function withReconnect(pool, run, { reconnectFor = defaultReconnectFor(), onLost } = {}) {
  let deadline = null;
  let pause = 0;   // s
  const again = async (err) => {   // throws err once the bound has passed
    const now = Date.now();
    if (deadline === null) deadline = now + Math.max(0, reconnectFor) * 1000;
    else if (now + pause * 1000 > deadline) throw err;
    onLost?.(err);
    await pauseFor(pause * 1000);
    pause = Math.min(2, Math.max(0.1, pause * 2));
  };
  for (;;) {
    let client;
    let use;
    try {
      use = await inPlace(pool);   // before the client is taken: it asks on a client of its own
    } catch (err) {
      if (!connectionLost(err)) throw err;
      await again(err);
      continue;
    }
    try {
      client = await pool.connect();
    } catch (err) {
      await again(err);
      continue;
    }
    // a checked-out client that loses its connection also emits 'error'
    // (the query rejects as well): without a listener that would end the process
    const ignore = () => {};
    client.on('error', ignore);
    try {
      const out = await run(inPlaceClient(client, use));
      client.removeListener('error', ignore);
      client.release();
      return out;
    } catch (err) {
      const lost = connectionLost(err);
      client.removeListener('error', ignore);
      client.release(lost ? err : undefined);   // an error: the pool drops that client
      if (!lost) throw err;
      await again(err);
    }
  }
}

// Citus (extension 0.4): on a worker node that holds the metadata, the four
// single-key calls go to their *_in_place names, which Citus does not plan
// as distributed function calls (idempotency.use_in_place() says where, and
// whether this role may call them); everywhere else, and before 0.4, the
// SQL is sent as it is. Decided once per pool (its clients all connect to
// one server); withReconnect hands run() the client through this.
const IN_PLACE = /\bidempotency\.(claim_operation|complete_operation|release_operation|extend_lease)\(/g;
const inPlaceOf = new WeakMap();   // pool -> Promise<boolean>

function inPlace(pool) {
  let p = inPlaceOf.get(pool);
  if (p === undefined) {
    p = (async () => {
      // pool.query where the pool has it (pg.Pool); else on a client of its own
      const c = typeof pool.query === 'function' ? null : await pool.connect();
      const query = (sql) => (c ?? pool).query(sql);
      let failed;
      try {
        const { rows: [may] } = await query(
          "SELECT coalesce(pg_catalog.has_function_privilege(pg_catalog.to_regprocedure('idempotency.use_in_place()'), " +
          "'EXECUTE'), false) AS ok");
        return may.ok && (await query('SELECT idempotency.use_in_place() AS ok')).rows[0].ok === true;
      } catch (err) {
        failed = err;   // the pool drops that client
        throw err;
      } finally {
        c?.release(failed);
      }
    })();
    inPlaceOf.set(pool, p);
    p.catch(() => inPlaceOf.delete(pool));   // asked again at the next call
  }
  return p;
}

function inPlaceClient(client, use) {
  if (!use) return client;
  return new Proxy(client, {
    get(target, prop) {
      if (prop === 'query') {
        return (sql, ...rest) => target.query(typeof sql === 'string'
          ? sql.replace(IN_PLACE, (_, f) => `idempotency.${f}_in_place(`) : sql, ...rest);
      }
      const v = Reflect.get(target, prop, target);
      return typeof v === 'function' ? v.bind(target) : v;
    },
  });
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

/**
 * Throw from a handler when the provider refused for good (HTTP 422, SMTP
 * 550: the effect did not happen, and asking again with the same arguments
 * cannot change that): the operation is ended, completed with
 * permanentFailureResult(reason) as its result (no longer claimed, and the
 * record says why), and the message fails as sqs-consumer fails one,
 * without a retry of the work: not deleted, left to the queue's redrive
 * policy (the dead-letter queue after maxReceiveCount; a later receive meets
 * that result and is left again, without running the handler), or deleted
 * with the option permanentFailure: 'delete'. The plain functions:
 * failPermanently.
 */
export class PermanentFailure extends Error {
  constructor(message) {
    super(message);
    this.name = 'PermanentFailure';
  }
}

// the key of the stored result that marks a permanent failure
export const PERMANENT_FAILURE = 'permanent_failure';

/** the result a permanent failure completes the operation with: { permanent_failure: reason } */
export const permanentFailureResult = (reason) => ({ [PERMANENT_FAILURE]: String(reason) });

/** the reason when a stored result (a completed verdict's) marks a permanent failure, else null */
export function permanentFailureOf(result) {
  if (typeof result === 'string') {
    try { result = JSON.parse(result); } catch { return null; }
  }
  if (result === null || typeof result !== 'object' || Array.isArray(result)) return null;
  const keys = Object.keys(result);
  return keys.length === 1 && keys[0] === PERMANENT_FAILURE && typeof result[PERMANENT_FAILURE] === 'string'
    ? result[PERMANENT_FAILURE] : null;
}

// the sign-off report's words for how a permanent failure ends an SQS delivery
export const permanentDelivery = (mode) => (mode === 'delete'
  ? "the message deleted (permanentFailure: 'delete'), not retried"
  : "the message not deleted: left to the queue's redrive policy (its dead-letter queue), the work not retried");

// resolves after ms, or at once when signal aborts
export const sleep = (ms, signal) => new Promise((resolve) => {
  const t = setTimeout(resolve, ms);
  signal?.addEventListener('abort', () => { clearTimeout(t); resolve(); }, { once: true });
});

export function fingerprintOf(body) {
  return 'sha256:' + createHash('sha256').update(body).digest('hex');
}
