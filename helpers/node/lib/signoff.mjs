// lib/signoff.mjs: the sign-off protocol, version 1 (docs/signoff-protocol.md):
// the kill points `claimed` and `handled` and the job-type mapping, both only
// when the sign-off runner started the worker with IDEMPOTENCY_SIGNOFF.
//
//   const so = signoff();                          // reads the variables once
//   const jobType = so.jobType('send_confirmation'); // the run's type when mapped
//   ... claim (run or verify), heartbeat started ...
//   if (await so.point('claimed', { job_type: jobType, key, attempt, verdict,
//                                   heartbeat: true }) === 'fail') { release; return; }
//   ... handler returned, heartbeat stopped ...
//   await so.point('handled', { ... });            // then complete
//
// Unarmed (IDEMPOTENCY_SIGNOFF unset or empty): jobType(t) is t, point()
// resolves 'continue' and connects nowhere; IDEMPOTENCY_SIGNOFF_JOB_TYPES is
// not read. The wrappers call point() only when so.armed.
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
 * One exchange with the runner at `point` ('claimed' or 'handled'): a new
 * connection to the Unix socket `socket`, one JSON line written, one line
 * read, no timeout. Resolves the answer ('continue', or 'fail' at
 * 'claimed'); rejects when the socket cannot be reached, when the runner
 * closes the connection without a line, or answers anything else. The runner
 * may instead kill the process while it waits: that is the point.
 */
export function signoffPoint(socket, point, { job_type, key, attempt, verdict, heartbeat }) {
  const allowed = point === 'claimed' ? ['continue', 'fail'] : point === 'handled' ? ['continue'] : null;
  if (!allowed) return Promise.reject(new Error(`sign-off: unknown point ${JSON.stringify(point)}`));
  const line = JSON.stringify({ v: SIGNOFF_VERSION, point, job_type, key, attempt, verdict,
                                pid: process.pid, heartbeat: Boolean(heartbeat) }) + '\n';
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

const UNARMED = Object.freeze({
  armed: false,
  socket: null,
  jobType: (t) => t,
  point: async () => 'continue',
});

/**
 * The sign-off settings of the environment `env` (read once, here):
 * { armed, socket, jobType(t), point(point, fields) }. A malformed
 * IDEMPOTENCY_SIGNOFF_JOB_TYPES makes jobType() throw (at every call), so
 * that the user's job type is never used by an armed worker.
 */
export function signoff(env = process.env) {
  const socket = env.IDEMPOTENCY_SIGNOFF;
  if (!socket) return UNARMED;
  const text = env.IDEMPOTENCY_SIGNOFF_JOB_TYPES;
  let map = new Map();
  let malformed = null;
  try {
    if (text) map = parseJobTypes(text);
  } catch (err) {
    malformed = err.message;
  }
  return Object.freeze({
    armed: true,
    socket,
    jobType(t) {
      if (malformed) throw new Error(malformed);
      return map.get(t) ?? t;
    },
    point: (point, fields) => signoffPoint(socket, point, fields),
  });
}
