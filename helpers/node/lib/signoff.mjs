// lib/signoff.mjs: the sign-off protocol, version 1 (docs/signoff-protocol.md):
// the points `claimed`, `judged` and `handled` (only when the sign-off runner
// started the worker with IDEMPOTENCY_SIGNOFF), the job-type mapping
// (IDEMPOTENCY_SIGNOFF_JOB_TYPES) and the run's lease
// (IDEMPOTENCY_SIGNOFF_LEASE); the three variables are independent.
//
//   const so = signoff();                          // reads the variables once
//   const jobType = so.jobType('send_confirmation'); // the run's type when mapped
//   const lease = so.lease();                      // the run's lease (s), or null
//   ... claim (run or verify), heartbeat started ...
//   if (await so.point('claimed', { job_type: jobType, key, attempt, verdict,
//                                   heartbeat: true }) === 'fail') { release; return; }
//   ... handler returned, heartbeat stopped ...
//   await so.point('handled', { ... });            // then complete
//   ... any other answer of the claim, before ack / postpone / fail:
//   await so.point('judged', { job_type: jobType, key, attempt, verdict });
//   await so.point('judged', { job_type: jobType, key, attempt: null,
//                              verdict: 'busy' | 'error', sqlstate });
//
// Unarmed (IDEMPOTENCY_SIGNOFF unset or empty): point() resolves 'continue'
// and connects nowhere (the wrappers call it only when so.armed); the map
// and the lease apply all the same (as in the Python and Ruby helpers).
import { readFileSync } from 'node:fs';
import { createConnection } from 'node:net';

export const SIGNOFF_VERSION = 1;

/**
 * The sign-off run's variables are wrong, or its runner could not be asked
 * (unreachable, closed without a line, another answer).
 */
export class SignoffError extends Error {
  constructor(message) {
    super(message);
    this.name = 'SignoffError';
  }
}

// the sentences below are the same in the three helpers, tested by
// helpers/conformance/signoff.json (docs/helpers.md)
const MAP_FORM = "yours=run's[,yours2=run's2...]";
const SPACE = /^[ \t\n\r\f\v]+|[ \t\n\r\f\v]+$/g;   // dropped around a side of the map
const LEASE_FORM = /^[ \t\n\r\f\v]*\+?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?[ \t\n\r\f\v]*$/;
const quoted = (text) => JSON.stringify(String(text));

/**
 * IDEMPOTENCY_SIGNOFF_JOB_TYPES's value "yours=run's[,yours2=run's2...]" ->
 * Map(your job type -> the run's); undefined, null or '' (unset) -> an empty
 * Map. Spaces around a side are dropped. Throws SignoffError for an entry
 * without exactly one '=', with an empty side, or naming one of your job
 * types twice.
 */
export function parseJobTypes(text) {
  const map = new Map();
  if (text === undefined || text === null || text === '') return map;
  for (const entry of String(text).split(',')) {
    const sides = entry.split('=').map((s) => s.replace(SPACE, ''));
    if (sides.length !== 2 || !sides[0] || !sides[1]) {
      throw new SignoffError(`IDEMPOTENCY_SIGNOFF_JOB_TYPES: malformed entry ${quoted(entry)} in ${quoted(text)} ` +
                             `(expected ${MAP_FORM}); no job type is used`);
    }
    if (map.has(sides[0])) {
      throw new SignoffError(`IDEMPOTENCY_SIGNOFF_JOB_TYPES: malformed entry ${quoted(entry)} in ${quoted(text)} ` +
                             `(the job type ${quoted(sides[0])} is mapped twice); no job type is used`);
    }
    map.set(sides[0], sides[1]);
  }
  return map;
}

/**
 * IDEMPOTENCY_SIGNOFF_LEASE's value -> the run's lease in seconds (a positive,
 * finite decimal number), or null when unset or empty. Throws SignoffError
 * on anything else ('0', '-1', 'abc', '0x10', 'Infinity', '1e999').
 */
export function parseLease(text) {
  if (text === undefined || text === null || text === '') return null;
  const lease = LEASE_FORM.test(String(text)) ? Number(text) : 0;
  if (!(lease > 0 && Number.isFinite(lease))) {
    throw new SignoffError(`IDEMPOTENCY_SIGNOFF_LEASE: ${quoted(text)} is not a positive number of seconds; ` +
                           'no job is claimed');
  }
  return lease;
}

// the answers each point may get
const ANSWERS = { claimed: ['continue', 'fail'], judged: ['continue'], handled: ['continue'] };
// and the optional points hello's and ended's
const ANY_ANSWERS = { ...ANSWERS, hello: ['continue'], ended: ['continue'] };
const unknownPoint = (point) =>
  new Error(`sign-off: unknown point ${quoted(point)} (expected claimed, judged or handled)`);

/**
 * The line (JSON and '\n') sent to the runner at `point`; job_type as sent
 * (the run's); `sqlstate` only with the verdict 'busy' or 'error'; `message`
 * (the error's) only with the verdict 'error', when given; `pid` this
 * process's unless given. Throws for an unknown point.
 */
export function signoffMessage(point, { job_type, key, attempt = null, verdict = null, heartbeat = false,
                                        sqlstate = null, message = null }, pid = process.pid) {
  if (!Object.hasOwn(ANSWERS, point)) throw unknownPoint(point);
  const fields = { v: SIGNOFF_VERSION, point, job_type, key: String(key), attempt, verdict, pid,
                   heartbeat: Boolean(heartbeat) };
  if (verdict === 'busy' || verdict === 'error') fields.sqlstate = sqlstate ?? null;
  if (verdict === 'error' && message !== null && message !== undefined) fields.message = String(message);
  return JSON.stringify(fields) + '\n';
}

/**
 * The line (JSON and '\n') of the point hello: who this worker is, what runs
 * its claims (wrapper: 'plain', 'plain_batch' or a wrapper's name) and the
 * database its claims go to (null where unknown; a queue library's version
 * only with the library).
 */
export function signoffHelloMessage({ helper, helper_version, runtime, runtime_version, queue_library = null,
                                      queue_library_version = null, database = null, server_port = null,
                                      system_identifier = null, wrapper = null }, pid = process.pid) {
  return JSON.stringify({
    v: SIGNOFF_VERSION, point: 'hello', pid, helper, helper_version, runtime, runtime_version,
    queue_library: queue_library ?? null,
    queue_library_version: queue_library == null ? null : queue_library_version ?? null,
    database: database ?? null, server_port: server_port ?? null, system_identifier: system_identifier ?? null,
    wrapper: wrapper ?? null,
  }) + '\n';
}

/**
 * The line (JSON and '\n') of the point ended: the handler threw
 * PermanentFailure (reason), the heartbeat stopped, the completion with the
 * refusal as its result not sent yet; `delivery`: how the delivery then
 * ends, in the queue library's words.
 */
export function signoffEndedMessage({ job_type, key, attempt = null, reason = '', delivery }, pid = process.pid) {
  const text = String(reason ?? '').trim();
  return JSON.stringify({ v: SIGNOFF_VERSION, point: 'ended', job_type, key: String(key), attempt, pid,
                          ending: 'PermanentFailure', delivery: String(delivery),
                          message: text ? text.split('\n')[0].trim() : '' }) + '\n';
}

/**
 * The runner's answer at `point` from what was read (up to the first
 * newline, or all it sent before it closed the connection): 'continue', or
 * 'fail' at 'claimed'. Throws SignoffError otherwise; its message starts
 * with `where` when given.
 */
export function signoffAnswer(point, received, where = null) {
  const lead = where ? `${where}: ` : '';
  const nl = received.indexOf('\n');
  if (nl < 0) throw new SignoffError(`${lead}the runner closed the connection without an answer line`);
  const line = received.slice(0, nl);
  if (!ANY_ANSWERS[point].includes(line)) {
    throw new SignoffError(`${lead}unexpected answer ${quoted(line)} (expected ${ANY_ANSWERS[point].join(' or ')})`);
  }
  return line;
}

/**
 * One exchange with the runner at `point` ('claimed', 'judged' or
 * 'handled'): a new connection to the Unix socket `socket`, one JSON line
 * (signoffMessage) written, one line read, no timeout. Resolves the answer
 * ('continue', or 'fail' at 'claimed'); rejects with a SignoffError when the
 * socket cannot be reached, when the runner closes the connection without a
 * line, or answers anything else. The runner may instead kill the process
 * while it waits: that is the point. `fields.job_type` is sent as given (the
 * run's: map it first).
 */
export function signoffPoint(socket, point, fields) {
  if (!Object.hasOwn(ANSWERS, point)) return Promise.reject(unknownPoint(point));
  const line = signoffMessage(point, fields);
  return exchange(socket, point, line, `sign-off runner at ${socket}, point ${point} of ${fields.job_type}/${fields.key}`);
}

// one exchange: connect, write the line, read the answer line
function exchange(socket, point, line, at) {
  return new Promise((resolve, reject) => {
    let received = '';
    let settled = false;
    const conn = createConnection({ path: socket });
    const settle = (answer) => {
      if (settled) return;
      settled = true;
      conn.destroy();
      try {
        resolve(signoffAnswer(point, answer, at));
      } catch (err) {
        reject(err);
      }
    };
    conn.setEncoding('utf8');
    conn.on('connect', () => conn.write(line));
    conn.on('data', (chunk) => {
      received += chunk;
      if (received.includes('\n')) settle(received);
    });
    conn.on('error', (err) => {
      if (settled) return;
      settled = true;
      conn.destroy();
      reject(new SignoffError(`${at}: ${err.message}`));
    });
    conn.on('close', () => settle(received));
  });
}

/**
 * The sign-off settings of the environment `env` (read once, here):
 * { armed, socket, helloArmed, jobType(t), lease(), hello(db, queueLibrary, wrapper),
 * point(point, fields) }. hello(db) is the point hello, once per process
 * (db: the pool or client whose database is reported; null: unknown;
 * wrapper: what makes the claims, 'plain' unless given: the wrappers say
 * 'idempotent' and 'idempotentBatch', claimBatch 'plain_batch'), when
 * helloArmed (IDEMPOTENCY_SIGNOFF and the runner's IDEMPOTENCY_SIGNOFF_HELLO=1);
 * point() says hello first if the process has not.
 * IDEMPOTENCY_SIGNOFF arms the points; IDEMPOTENCY_SIGNOFF_JOB_TYPES and
 * IDEMPOTENCY_SIGNOFF_LEASE apply whether or not it is set. A malformed map
 * makes jobType() throw, a lease that is not a positive number makes lease()
 * throw (at every call), so that a wrapper refuses the message before any
 * database call instead of using the user's job type or lease.
 */
export function signoff(env = process.env) {
  const socket = env.IDEMPOTENCY_SIGNOFF || null;
  const settle = (parse, text, none) => {
    try {
      return { value: parse(text), error: null };
    } catch (err) {
      return { value: none, error: err.message };
    }
  };
  const map = settle(parseJobTypes, env.IDEMPOTENCY_SIGNOFF_JOB_TYPES, new Map());
  const lease = settle(parseLease, env.IDEMPOTENCY_SIGNOFF_LEASE, null);
  const helloArmed = Boolean(socket) && env.IDEMPOTENCY_SIGNOFF_HELLO === '1';
  // the runner answers the point ended (an older one refused it)
  const endedArmed = Boolean(socket) && env.IDEMPOTENCY_SIGNOFF_ENDED === '1';
  const hello = (db, queueLibrary = null, wrapper = 'plain') =>
    (helloArmed ? sayHello(socket, db, queueLibrary, wrapper) : Promise.resolve());
  return Object.freeze({
    armed: Boolean(socket),
    socket,
    helloArmed,
    hello,
    jobType(t) {
      if (map.error) throw new SignoffError(map.error);
      return map.value.get(t) ?? t;
    },
    lease() {
      if (lease.error) throw new SignoffError(lease.error);
      return lease.value;
    },
    point: socket ? async (point, fields) => {
      if (!Object.hasOwn(ANSWERS, point)) throw unknownPoint(point);
      await hello(null);
      return signoffPoint(socket, point, fields);
    } : async () => 'continue',
    endedArmed,
    // the point ended (fields: job_type as sent, key, attempt, reason,
    // delivery), before a permanent failure's completion; nothing unless
    // endedArmed
    ended: endedArmed ? async (fields) => {
      await hello(null);
      return exchange(socket, 'ended', signoffEndedMessage(fields),
                      `sign-off runner at ${socket}, point ended of ${fields.job_type}/${fields.key}`);
    } : async () => undefined,
  });
}

// -- the point hello (docs/signoff-protocol.md) --------------------------------
export const DATABASE_SQL = 'SELECT pg_catalog.current_database() AS database, ' +
  'pg_catalog.inet_server_port() AS server_port, ' +
  '(SELECT system_identifier::text FROM pg_catalog.pg_control_system()) AS system_identifier';
const VERSION = JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')).version;
let helloPid = null;   // the process that said hello

/** forget that this process said hello (for tests) */
export function forgetHello() {
  helloPid = null;
}

// the database of db (a pg.Pool or Client): { database, server_port,
// system_identifier }, or nulls when there is none or it cannot answer
async function databaseOf(db) {
  if (!db) return {};
  try {
    const { rows: [r] } = await db.query(DATABASE_SQL);
    return { database: r.database, server_port: r.server_port, system_identifier: r.system_identifier };
  } catch {
    return {};
  }
}

// the version of the queue library `name` as installed beside this package, or null
function versionOf(name) {
  try {
    let dir = new URL('.', import.meta.resolve(name));
    for (let i = 0; i < 6; i++) {
      try {
        const pkg = JSON.parse(readFileSync(new URL('package.json', dir), 'utf8'));
        if (pkg.name === name) return pkg.version ?? null;
      } catch { /* not here: one directory up */ }
      dir = new URL('..', dir);
    }
  } catch { /* not installed */ }
  return null;
}

async function sayHello(socket, db, queueLibrary, wrapper) {
  if (helloPid === process.pid) return;
  helloPid = process.pid;
  const line = signoffHelloMessage({
    helper: 'pg-idempotency', helper_version: VERSION, runtime: 'node', runtime_version: process.versions.node,
    queue_library: queueLibrary, queue_library_version: queueLibrary ? versionOf(queueLibrary) : null,
    ...(await databaseOf(db)), wrapper,
  });
  await exchange(socket, 'hello', line, `sign-off runner at ${socket}, point hello`);
}
