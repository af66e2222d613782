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
import { createConnection } from 'node:net';

export const SIGNOFF_VERSION = 1;

const MAP_FORM = "yours=run's[,yours2=run's2...]";

/**
 * IDEMPOTENCY_SIGNOFF_JOB_TYPES's text -> Map(your job type -> the run's).
 * Throws on an entry without '=', with more than one, with an empty side, or
 * naming one of your job types twice.
 */
export function parseJobTypes(text) {
  const map = new Map();
  for (const entry of String(text).split(',')) {
    const sides = entry.split('=').map((s) => s.trim());
    if (sides.length !== 2 || !sides[0] || !sides[1]) {
      throw new Error(`IDEMPOTENCY_SIGNOFF_JOB_TYPES: malformed entry ${JSON.stringify(entry)} ` +
                      `in ${JSON.stringify(text)} (expected ${MAP_FORM}); no job type is used`);
    }
    if (map.has(sides[0])) {
      throw new Error(`IDEMPOTENCY_SIGNOFF_JOB_TYPES: job type ${JSON.stringify(sides[0])} mapped twice ` +
                      `in ${JSON.stringify(text)}; no job type is used`);
    }
    map.set(sides[0], sides[1]);
  }
  return map;
}

/**
 * IDEMPOTENCY_SIGNOFF_LEASE's text -> the run's lease in seconds (a positive,
 * finite decimal number), or null when unset or empty. Throws on anything
 * else ('0', '-1', 'abc', '0x10', 'Infinity', '1e999').
 */
export function parseLease(text) {
  if (text === undefined || text === null || text === '') return null;
  const lease = /^\s*\+?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?\s*$/i.test(text) ? Number(text) : NaN;
  if (!(lease > 0 && Number.isFinite(lease))) {
    throw new Error(`IDEMPOTENCY_SIGNOFF_LEASE: ${JSON.stringify(String(text))} is not a positive number ` +
                    'of seconds; no job is claimed');
  }
  return lease;
}

// the answers each point may get
const ANSWERS = { claimed: ['continue', 'fail'], judged: ['continue'], handled: ['continue'] };

/**
 * One exchange with the runner at `point` ('claimed', 'judged' or
 * 'handled'): a new connection to the Unix socket `socket`, one JSON line
 * written, one line read, no timeout. Resolves the answer ('continue', or
 * 'fail' at 'claimed'); rejects when the socket cannot be reached, when the
 * runner closes the connection without a line, or answers anything else.
 * The runner may instead kill the process while it waits: that is the
 * point. The line has `sqlstate` only with the verdict 'busy' or 'error'
 * (`judged` of a claim that threw; attempt null).
 */
export function signoffPoint(socket, point, { job_type, key, attempt, verdict, heartbeat, sqlstate }) {
  const allowed = Object.hasOwn(ANSWERS, point) ? ANSWERS[point] : null;
  if (!allowed) return Promise.reject(new Error(`sign-off: unknown point ${JSON.stringify(point)}`));
  const fields = { v: SIGNOFF_VERSION, point, job_type, key, attempt, verdict,
                   pid: process.pid, heartbeat: Boolean(heartbeat) };
  if (verdict === 'busy' || verdict === 'error') fields.sqlstate = sqlstate ?? null;
  const line = JSON.stringify(fields) + '\n';
  const at = `sign-off runner at ${socket}, point ${point} of ${job_type}/${key}`;
  return new Promise((resolve, reject) => {
    let buf = '';
    let settled = false;
    const conn = createConnection({ path: socket });
    const settle = (err, answer) => {
      if (settled) return;
      settled = true;
      conn.destroy();
      if (err) reject(err); else resolve(answer);
    };
    conn.setEncoding('utf8');
    conn.on('connect', () => conn.write(line));
    conn.on('data', (chunk) => {
      buf += chunk;
      const nl = buf.indexOf('\n');
      if (nl < 0) return;
      const answer = buf.slice(0, nl).trim();
      if (allowed.includes(answer)) settle(null, answer);
      else settle(new Error(`${at}: unexpected answer ${JSON.stringify(answer)} (expected ${allowed.join(' or ')})`));
    });
    conn.on('error', (err) => settle(new Error(`${at}: ${err.message}`)));
    conn.on('close', () => settle(new Error(`${at}: the runner closed the connection without an answer`)));
  });
}

/**
 * The sign-off settings of the environment `env` (read once, here):
 * { armed, socket, jobType(t), lease(), point(point, fields) }.
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
      return { value: text ? parse(text) : none, error: null };
    } catch (err) {
      return { value: none, error: err.message };
    }
  };
  const map = settle(parseJobTypes, env.IDEMPOTENCY_SIGNOFF_JOB_TYPES, new Map());
  const lease = settle(parseLease, env.IDEMPOTENCY_SIGNOFF_LEASE, null);
  return Object.freeze({
    armed: Boolean(socket),
    socket,
    jobType(t) {
      if (map.error) throw new Error(map.error);
      return map.value.get(t) ?? t;
    },
    lease() {
      if (lease.error) throw new Error(lease.error);
      return lease.value;
    },
    point: socket ? (point, fields) => signoffPoint(socket, point, fields) : async () => 'continue',
  });
}
