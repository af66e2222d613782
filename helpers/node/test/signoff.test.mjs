// test/signoff.test.mjs: the sign-off protocol (docs/signoff-protocol.md,
// version 1) in idempotent() and idempotentBatch(), against a fake runner (a
// Unix socket server in this process recording the lines and answering
// continue, fail, nothing (held until the test answers) or closing), and the
// PostgreSQL of the PG* environment (as helper.test.mjs):
//
// unarmed: no connection, but the map and the run's lease applied (the
// variables are independent); the map parsed and a malformed one refused
// before any call; continue (single): the two lines and their fields,
// `claimed` inside the heartbeat before the handler, `handled` after it with
// the heartbeat stopped, every call on the run's job type; fail at claimed
// releases without the handler (single, batch); a batch's points per
// run/verify key, its `claimed` exchanges open at the same time; `judged`
// (completed, in_progress, busy, ID002) once per such key before its message
// is acknowledged or postponed, single and batch, and `fail` refused there;
// IDEMPOTENCY_SIGNOFF_LEASE: the heartbeat, the postponements, the release
// cap and the reconnect bound from the run's lease, a bad value refused
// before any call; an unreachable socket, a connection closed without an
// answer, an answer not allowed; and real kills: a child worker
// (test/signoff-worker.mjs) SIGKILLed at `claimed` (record claimed, no
// effect) and at `handled` (effect, record not completed), single and batch.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { countingPool } from './counting-pool.mjs';
import { forgetHello } from '../lib/signoff.mjs';
import { fingerprintOf, idempotent, idempotentBatch, parseJobTypes, parseLease, signoff, signoffPoint }
  from 'pg-idempotency';
import { prepareEdition } from './edition.mjs';

const LEASE = 2;            // seconds
const HEARTBEAT = 200;      // ms
const RETRY_AFTER = 7;      // seconds
const QUEUE_URL = 'http://127.0.0.1:1/000000000000/signoff';
const PREFIX = `signoff_unit_${process.pid}_`;
const T = { timeout: 20_000 };   // a point never reached fails, not hangs
const WORKER = new URL('./signoff-worker.mjs', import.meta.url).pathname;

let admin;
let pool;
const types = [];
const dirs = [];
const runners = new Set();   // closed at the end too, so that a failed test does not keep the file alive

before(async () => {
  admin = new pg.Client();
  await admin.connect();
  await admin.query('SET client_min_messages = warning');
  await prepareEdition(admin);
  pool = new pg.Pool({ max: 3 });
});

after(async () => {
  for (const r of runners) await r.close();
  for (const t of types) {
    await admin.query('DELETE FROM idempotency.operations WHERE job_type = $1', [t]);
    await admin.query('DELETE FROM idempotency.job_types WHERE job_type = $1', [t]);
  }
  await pool?.end();
  await admin?.end();
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

async function jobType(name, policy = 'hold', lease = LEASE) {
  const t = `${PREFIX}${name}_${types.length}`;
  await admin.query('INSERT INTO idempotency.job_types (job_type, lease, stale_policy) ' +
                    'VALUES ($1, make_interval(secs => $2), $3)', [t, lease, policy]);
  types.push(t);
  return t;
}

// the user's job type and the run's, both registered: what is written where
// (lease: the job types' lease in the database, s)
async function pair(policy = 'hold', lease = LEASE) {
  return { user: await jobType('user', policy, lease), run: await jobType('run', policy, lease) };
}

async function record(type, key) {
  const { rows } = await admin.query(
    "SELECT status::text || ' #' || attempt AS r FROM idempotency.operations " +
    'WHERE job_type = $1 AND operation_key = $2', [type, key]);
  return rows.length ? rows[0].r : 'none';
}

async function count(type) {
  const { rows: [r] } = await admin.query(
    'SELECT count(*)::int AS n FROM idempotency.operations WHERE job_type = $1', [type]);
  return r.n;
}

async function heartbeatAt(type, key) {
  const { rows: [r] } = await admin.query(
    'SELECT heartbeat_at FROM idempotency.operations WHERE job_type = $1 AND operation_key = $2', [type, key]);
  return r.heartbeat_at;
}

// the records the claims of a test meet: completed (with the message's own
// body), a young claim of another worker (in_progress), a claim of another
// body (ID002)
const fp = (key) => fingerprintOf(message(key).Body);
async function completedBefore(type, key) {
  await admin.query('SELECT idempotency.claim_operation($1, $2, $3, $4)', [type, key, fp(key), 'earlier']);
  await admin.query("SELECT idempotency.complete_operation($1, $2, 1, '{}')", [type, key]);
}
const claimedElsewhere = (type, key) =>
  admin.query('SELECT idempotency.claim_operation($1, $2, $3, $4)', [type, key, fp(key), 'other-worker']);
const claimedWithOtherBody = (type, key) =>
  admin.query('SELECT idempotency.claim_operation($1, $2, $3, $4)', [type, key, 'sha256:other', 'other-worker']);

const tempDir = () => { const d = mkdtempSync(join(tmpdir(), 'signoff-')); dirs.push(d); return d; };
const pause = (ms) => new Promise((r) => setTimeout(r, ms));

// the fake runner: answer(msg) says what to do with a line: 'continue',
// 'fail' (or any text: sent as the answer line), 'close' (closed without an
// answer) or 'hold' (kept open: runner.held gets { msg, reply(text) })
async function fakeRunner(answer = () => 'continue') {
  const path = join(tempDir(), 'runner.sock');
  const sockets = new Set();
  const waiters = [];
  const runner = { path, lines: [], held: [], connections: 0 };
  const server = net.createServer((sock) => {
    runner.connections++;
    sockets.add(sock);
    sock.on('close', () => sockets.delete(sock));
    sock.on('error', () => {});
    sock.setEncoding('utf8');
    let buf = '';
    sock.on('data', (chunk) => {
      buf += chunk;
      const nl = buf.indexOf('\n');
      if (nl < 0) return;
      const msg = JSON.parse(buf.slice(0, nl));
      buf = buf.slice(nl + 1);
      runner.lines.push(msg);
      const what = answer(msg);
      if (what === 'hold') runner.held.push({ msg, reply: (text) => sock.end(`${text}\n`) });
      else if (what === 'close') sock.end();
      else sock.end(`${what}\n`);
      for (const w of [...waiters]) w();
    });
  });
  server.listen(path);
  await once(server, 'listening');
  // resolves the lines once n of them match pred
  runner.when = (pred, n = 1) => new Promise((resolve) => {
    const check = () => {
      const got = runner.lines.filter(pred);
      if (got.length < n) return false;
      waiters.splice(waiters.indexOf(check), 1);
      resolve(got);
      return true;
    };
    waiters.push(check);
    check();
  });
  runner.close = async () => {
    if (!runners.delete(runner)) return;
    for (const s of sockets) s.destroy();
    server.close();
    await once(server, 'close');
  };
  runners.add(runner);
  return runner;
}

// make a wrapper with these variables in the environment (read when made)
function withEnv(env, make) {
  const saved = {};
  for (const k of ['IDEMPOTENCY_SIGNOFF', 'IDEMPOTENCY_SIGNOFF_JOB_TYPES', 'IDEMPOTENCY_SIGNOFF_LEASE',
                   'IDEMPOTENCY_SIGNOFF_HELLO']) {
    saved[k] = process.env[k];
    delete process.env[k];
  }
  Object.assign(process.env, env);
  try {
    return make();
  } finally {
    for (const [k, v] of Object.entries(saved)) {
      if (v === undefined) delete process.env[k]; else process.env[k] = v;
    }
  }
}

const armedEnv = (runner, { user, run }) => ({ IDEMPOTENCY_SIGNOFF: runner.path,
                                               IDEMPOTENCY_SIGNOFF_JOB_TYPES: `other=x,${user}=${run}` });

const callsOf = (log, fn) => log.filter((q) => new RegExp(`idempotency\\.${fn}\\(`).test(q.sql));
// the job type of every idempotency.* call the helper made
const typesCalled = (log) => [...new Set(log.filter((q) => q.params?.length && /idempotency\./.test(q.sql))
                                                .map((q) => q.params[0]))];

function fakeSqs() {
  const sent = [];
  return { sent, async send(command) { sent.push(command); return {}; } };
}

const message = (key) => ({ MessageId: `m-${key}`, ReceiptHandle: `rh-${key}`,
                            Body: JSON.stringify({ order: key }),
                            Attributes: { ApproximateReceiveCount: '1' } });

// a wrapper (idempotent, or idempotentBatch with batch: true) made in env;
// behave[key]() runs as that key's handler; opts: the wrapper's options
// instead of the defaults below (heartbeat, retryAfter, backoff, pool, ...)
function wrap(type, env, { batch = false, behave = {}, opts: extra = {} } = {}) {
  const runs = [];
  const events = [];
  const log = [];
  const sqs = fakeSqs();
  const handler = async (payload, ctx) => {
    runs.push(ctx.key);
    if (behave[ctx.key]) return behave[ctx.key](ctx);
    return { sent: payload.order };
  };
  const opts = { pool: countingPool(log, pool), sqs, queueUrl: QUEUE_URL, jobType: type, key: (p) => p.order,
                 heartbeat: HEARTBEAT, retryAfter: RETRY_AFTER, worker: 'signoff-test',
                 onVerdict: (e) => events.push(e), ...extra };
  const handle = withEnv(env, () => (batch ? idempotentBatch : idempotent)(handler, opts));
  return { handle, runs, events, log, sqs,
           verdicts: (key) => events.filter((e) => e.key === key).map((e) => `${e.verdict}:${e.action}`) };
}

// ---- the mapping and the public API -----------------------------------------

test('parseJobTypes: pairs; an entry without =, an empty side, a type twice are errors', () => {
  assert.deepEqual([...parseJobTypes('a=run_a,b=run_b')], [['a', 'run_a'], ['b', 'run_b']]);
  assert.deepEqual([...parseJobTypes(' a = run_a ')], [['a', 'run_a']]);
  for (const bad of ['a', 'a=', '=b', 'a=b,', 'a=b,,c=d', 'a=b=c', 'a=b,a=c']) {
    assert.throws(() => parseJobTypes(bad), /IDEMPOTENCY_SIGNOFF_JOB_TYPES: .*no job type is used/, bad);
  }
});

test('parseLease: a positive decimal number of seconds; unset is null; anything else an error', () => {
  assert.equal(parseLease('0.4'), 0.4);
  assert.equal(parseLease('2'), 2);
  assert.equal(parseLease(' 3 '), 3);
  assert.equal(parseLease('.5'), 0.5);
  assert.equal(parseLease('1e1'), 10);
  assert.equal(parseLease(undefined), null);
  assert.equal(parseLease(''), null);
  for (const bad of ['0', '0.0', '-1', 'abc', '0x10', 'Infinity', 'NaN', '1e999', ' ', '2s', '1,5']) {
    assert.throws(() => parseLease(bad), /IDEMPOTENCY_SIGNOFF_LEASE: .* is not a positive number of seconds/, bad);
  }
});

test('signoff(env): the map and the lease apply armed or not; a malformed one throws at every call', T, async () => {
  const none = signoff({});
  assert.equal(none.armed, false);
  assert.equal(none.jobType('mine'), 'mine');
  assert.equal(none.lease(), null);
  assert.equal(await none.point('claimed', {}), 'continue');
  assert.equal(signoff({ IDEMPOTENCY_SIGNOFF: '' }).armed, false);
  // unarmed: no point, but the map and the lease all the same
  const unarmed = signoff({ IDEMPOTENCY_SIGNOFF_JOB_TYPES: 'mine=theirs', IDEMPOTENCY_SIGNOFF_LEASE: '0.4' });
  assert.equal(unarmed.armed, false);
  assert.equal(unarmed.jobType('mine'), 'theirs');
  assert.equal(unarmed.lease(), 0.4);
  assert.equal(await unarmed.point('judged', {}), 'continue');
  const badUnarmed = signoff({ IDEMPOTENCY_SIGNOFF_JOB_TYPES: 'malformed', IDEMPOTENCY_SIGNOFF_LEASE: '0' });
  assert.throws(() => badUnarmed.jobType('mine'), /malformed entry "malformed"/);
  assert.throws(() => badUnarmed.lease(), /IDEMPOTENCY_SIGNOFF_LEASE: "0" is not a positive number/);
  const so = signoff({ IDEMPOTENCY_SIGNOFF: '/nowhere.sock', IDEMPOTENCY_SIGNOFF_JOB_TYPES: 'mine=theirs' });
  assert.equal(so.armed, true);
  assert.equal(so.jobType('mine'), 'theirs');
  assert.equal(so.jobType('unmapped'), 'unmapped');   // not in the map: as given
  assert.equal(so.lease(), null);
  const bad = signoff({ IDEMPOTENCY_SIGNOFF: '/nowhere.sock', IDEMPOTENCY_SIGNOFF_JOB_TYPES: 'mine',
                        IDEMPOTENCY_SIGNOFF_LEASE: 'soon' });
  assert.throws(() => bad.jobType('mine'), /malformed entry "mine"/);
  assert.throws(() => bad.jobType('mine'), /malformed entry "mine"/);   // every call
  assert.throws(() => bad.lease(), /"soon" is not a positive number/);
  assert.throws(() => bad.lease(), /"soon" is not a positive number/);
  await assert.rejects(signoffPoint('/nowhere.sock', 'started', {}), /unknown point/);
});

test('signoffPoint: one line with the fields, the answer resolved; sqlstate only with busy and error', T, async () => {
  const runner = await fakeRunner((l) => (l.point === 'claimed' ? 'fail' : 'continue'));
  try {
    const answer = await signoffPoint(runner.path, 'claimed',
      { job_type: 'jt', key: 'K', attempt: 3, verdict: 'verify', heartbeat: false });
    assert.equal(answer, 'fail');
    assert.equal(await signoffPoint(runner.path, 'judged',
      { job_type: 'jt', key: 'K', attempt: 2, verdict: 'in_progress', sqlstate: 'ignored' }), 'continue');
    assert.equal(await signoffPoint(runner.path, 'judged',
      { job_type: 'jt', key: 'K', attempt: null, verdict: 'busy', sqlstate: '55P03' }), 'continue');
    const base = { v: 1, job_type: 'jt', key: 'K', pid: process.pid, heartbeat: false };
    assert.deepEqual(runner.lines, [
      { ...base, point: 'claimed', attempt: 3, verdict: 'verify' },
      { ...base, point: 'judged', attempt: 2, verdict: 'in_progress' },
      { ...base, point: 'judged', attempt: null, verdict: 'busy', sqlstate: '55P03' }]);
  } finally {
    await runner.close();
  }
});

// ---- idempotent() ------------------------------------------------------------

test('unarmed: no connection, but the map applied: the run\'s job type (single, batch)', T, async () => {
  const t = await pair();
  const runner = await fakeRunner();
  try {
    for (const batch of [false, true]) {
      // made without IDEMPOTENCY_SIGNOFF: the map applies all the same; the
      // socket set afterwards is not looked at again
      const w = wrap(t.user, { IDEMPOTENCY_SIGNOFF_JOB_TYPES: `other=x,${t.user}=${t.run}` }, { batch });
      process.env.IDEMPOTENCY_SIGNOFF = runner.path;
      const k = batch ? 'U-2' : 'U-1';
      const m = message(k);
      try {
        assert.deepEqual(await w.handle(batch ? [m] : m), batch ? [m] : m);
      } finally {
        delete process.env.IDEMPOTENCY_SIGNOFF;
      }
      assert.deepEqual(w.verdicts(k), ['run:work', 'run:completed']);
      assert.equal(await record(t.run, k), 'completed #1');
      assert.deepEqual(typesCalled(w.log), [t.run]);
    }
    assert.equal(runner.connections, 0);
    assert.equal(await count(t.user), 0);
  } finally {
    await runner.close();
  }
});

test('continue: claimed inside the heartbeat before the handler, handled after it with the heartbeat stopped; the run\'s job type', T, async () => {
  const t = await pair();
  const runner = await fakeRunner(() => 'hold');
  try {
    const w = wrap(t.user, armedEnv(runner, t));
    const m = message('C-1');
    const done = w.handle(m);
    const [claimed] = await runner.when((l) => l.point === 'claimed');
    assert.deepEqual(claimed, { v: 1, point: 'claimed', job_type: t.run, key: 'C-1', attempt: 1,
                                verdict: 'run', pid: process.pid, heartbeat: true });
    assert.equal(await record(t.run, 'C-1'), 'claimed #1');   // committed
    await pause(HEARTBEAT * 3);
    assert.deepEqual(w.runs, []);                               // not yet called
    assert.ok(callsOf(w.log, 'extend_lease').length >= 1, 'the heartbeat beats while the runner holds claimed');
    runner.held[0].reply('continue');
    const [handled] = await runner.when((l) => l.point === 'handled');
    assert.deepEqual(handled, { ...claimed, point: 'handled' });
    assert.deepEqual(w.runs, ['C-1']);
    const beats = callsOf(w.log, 'extend_lease').length;
    await pause(HEARTBEAT * 3);
    assert.equal(callsOf(w.log, 'extend_lease').length, beats, 'no beat after handled');
    assert.equal(await record(t.run, 'C-1'), 'claimed #1');    // the completion not sent yet
    assert.equal(callsOf(w.log, 'complete_operation').length, 0);
    runner.held[1].reply('continue');
    assert.equal(await done, m);
    assert.deepEqual(w.verdicts('C-1'), ['run:work', 'run:completed']);
    assert.equal(await record(t.run, 'C-1'), 'completed #1');
    assert.equal(await count(t.user), 0);
    assert.deepEqual(typesCalled(w.log), [t.run]);   // claim, extend_lease, complete
    assert.equal(runner.lines.length, 2);
  } finally {
    await runner.close();
  }
});

test('hello (IDEMPOTENCY_SIGNOFF_HELLO=1): the wrapper that ran names itself, idempotent or idempotentBatch, with sqs-consumer', T, async () => {
  const t = await pair();
  const runner = await fakeRunner(() => 'continue');
  try {
    for (const [batch, name] of [[false, 'idempotent'], [true, 'idempotentBatch']]) {
      forgetHello();   // as a new process
      runner.lines.length = 0;
      const w = wrap(t.user, { ...armedEnv(runner, t), IDEMPOTENCY_SIGNOFF_HELLO: '1' }, { batch });
      const key = `W-${name}`;
      await w.handle(batch ? [message(key)] : message(key));
      assert.deepEqual(runner.lines.map((l) => l.point), ['hello', 'claimed', 'handled']);
      assert.equal(runner.lines[0].wrapper, name);
      assert.equal(runner.lines[0].queue_library, 'sqs-consumer');
    }
  } finally {
    forgetHello();
    await runner.close();
  }
});

test('fail at claimed: released on the run\'s job type, postponed by the backoff, the handler not called', T, async () => {
  const t = await pair();
  const runner = await fakeRunner((l) => (l.point === 'claimed' ? 'fail' : 'continue'));
  try {
    const w = wrap(t.user, armedEnv(runner, t));
    assert.equal(await w.handle(message('F-1')), undefined);   // not deleted
    assert.deepEqual(w.runs, []);
    assert.deepEqual(w.verdicts('F-1'), ['run:work', 'run:released']);
    assert.deepEqual(runner.lines.map((l) => l.point), ['claimed']);
    assert.equal(await record(t.run, 'F-1'), 'released #1');
    assert.equal(await count(t.user), 0);
    assert.deepEqual(typesCalled(w.log), [t.run]);
    assert.equal(callsOf(w.log, 'release_operation').length, 1);
    assert.equal(w.sqs.sent.length, 1);
    const { VisibilityTimeout: delay } = w.sqs.sent[0].input;
    assert.ok(delay >= 1 && delay <= Math.floor(RETRY_AFTER / 2));
  } finally {
    await runner.close();
  }
});

test('a malformed map: the first call throws, nothing claimed, no connection', T, async () => {
  const t = await pair();
  const runner = await fakeRunner();
  try {
    for (const batch of [false, true]) {
      const w = wrap(t.user, { IDEMPOTENCY_SIGNOFF: runner.path, IDEMPOTENCY_SIGNOFF_JOB_TYPES: `${t.user}:${t.run}` },
                     { batch });
      const arg = batch ? [message('M-1')] : message('M-1');
      await assert.rejects(w.handle(arg), /IDEMPOTENCY_SIGNOFF_JOB_TYPES: malformed entry/);
      await assert.rejects(w.handle(arg), /IDEMPOTENCY_SIGNOFF_JOB_TYPES: malformed entry/);
      assert.deepEqual(w.log, []);
      assert.deepEqual(w.runs, []);
    }
    assert.equal(runner.connections, 0);
    assert.equal(await count(t.user), 0);
    assert.equal(await count(t.run), 0);
  } finally {
    await runner.close();
  }
});

test('no runner: an unreachable socket, a close without an answer, an answer not allowed fail the job', T, async () => {
  const t = await pair();
  // nothing listens there: the claim is left to its lease, the handler not called
  const gone = wrap(t.user, { IDEMPOTENCY_SIGNOFF: join(tempDir(), 'none.sock'),
                              IDEMPOTENCY_SIGNOFF_JOB_TYPES: `${t.user}=${t.run}` });
  await assert.rejects(gone.handle(message('N-1')), /sign-off runner at .*none\.sock, point claimed .*ENOENT/);
  assert.deepEqual(gone.runs, []);
  assert.deepEqual(gone.verdicts('N-1'), ['run:work', 'run:failed']);
  assert.equal(await record(t.run, 'N-1'), 'claimed #1');

  const runner = await fakeRunner((l) => (l.key === 'N-2' ? 'close' : l.point === 'handled' ? 'fail' : 'continue'));
  try {
    const w = wrap(t.user, armedEnv(runner, t));
    await assert.rejects(w.handle(message('N-2')), /closed the connection without an answer/);
    assert.deepEqual(w.runs, []);
    assert.equal(await record(t.run, 'N-2'), 'claimed #1');
    // 'fail' is not an answer at handled: the effect happened, not completed
    await assert.rejects(w.handle(message('N-3')), /point handled .*unexpected answer "fail"/);
    assert.deepEqual(w.runs, ['N-3']);
    assert.deepEqual(w.verdicts('N-3'), ['run:work', 'run:failed']);
    assert.equal(await record(t.run, 'N-3'), 'claimed #1');
    assert.equal(await count(t.user), 0);
  } finally {
    await runner.close();
  }
});

// ---- idempotentBatch() --------------------------------------------------------

test('batch: claimed per run/verify key at the same time, fail releases, handled after the heartbeat; the run\'s job type', T, async () => {
  const t = await pair('lookup');
  // before the receive: one completed (no point), one stale claim (verify #2)
  const prior = wrap(t.run, {}, { batch: true });
  await prior.handle([message('B-done')]);
  await admin.query('SELECT idempotency.claim_operation($1, $2, $3, $4)',
                    [t.run, 'B-verify', fingerprintOf(message('B-verify').Body), 'dead-worker']);
  await admin.query("UPDATE idempotency.operations SET claimed_at = claimed_at - interval '1 hour', " +
                    "heartbeat_at = heartbeat_at - interval '1 hour' " +
                    "WHERE job_type = $1 AND operation_key = 'B-verify'", [t.run]);

  // judged (B-done) answered at once, the kill points held
  const runner = await fakeRunner((l) => (l.point === 'judged' ? 'continue' : 'hold'));
  try {
    const w = wrap(t.user, armedEnv(runner, t), { batch: true });
    const ms = ['B-1', 'B-fail', 'B-done', 'B-verify'].map(message);
    const done = w.handle(ms);
    // the three claimed exchanges are open together (each is held)
    const claimed = await runner.when((l) => l.point === 'claimed', 3);
    assert.deepEqual(claimed.map((l) => `${l.key}:${l.verdict}#${l.attempt}`).sort(),
                     ['B-1:run#1', 'B-fail:run#1', 'B-verify:verify#2']);
    assert.ok(claimed.every((l) => l.v === 1 && l.job_type === t.run && l.pid === process.pid && l.heartbeat));
    await pause(HEARTBEAT * 3);
    assert.deepEqual(w.runs, []);
    assert.ok(callsOf(w.log, 'extend_lease').length >= 1, 'the heartbeat beats while the runner holds claimed');
    for (const h of runner.held) h.reply(h.msg.key === 'B-fail' ? 'fail' : 'continue');
    const handled = await runner.when((l) => l.point === 'handled', 2);
    assert.deepEqual(handled.map((l) => l.key).sort(), ['B-1', 'B-verify']);
    assert.deepEqual(w.runs.sort(), ['B-1', 'B-verify']);
    const beats = callsOf(w.log, 'extend_lease').length;
    await pause(HEARTBEAT * 3);
    assert.equal(callsOf(w.log, 'extend_lease').length, beats, 'no beat after handled');
    assert.equal(callsOf(w.log, 'complete_operations').length, 0);
    for (const h of runner.held.filter((x) => x.msg.point === 'handled')) h.reply('continue');
    const acks = await done;
    assert.deepEqual(acks.map((m) => m.MessageId).sort(), ['m-B-1', 'm-B-done', 'm-B-verify']);
    assert.deepEqual(w.verdicts('B-fail'), ['run:work', 'run:released']);
    assert.deepEqual(w.verdicts('B-done'), ['completed:ack']);
    assert.equal(runner.lines.length, 6);   // the completed key: judged only
    assert.deepEqual(runner.lines.filter((l) => l.key === 'B-done').map((l) => `${l.point}:${l.verdict}#${l.attempt}`),
                     ['judged:completed#1']);
    assert.equal(await record(t.run, 'B-1'), 'completed #1');
    assert.equal(await record(t.run, 'B-verify'), 'completed #2');
    assert.equal(await record(t.run, 'B-fail'), 'released #1');
    assert.equal(await count(t.user), 0);
    assert.deepEqual(typesCalled(w.log), [t.run]);   // claim_operations, extend_lease, complete, release
    assert.equal(callsOf(w.log, 'claim_operations').length, 1);
    assert.equal(callsOf(w.log, 'complete_operations').length, 1);
    assert.equal(callsOf(w.log, 'release_operations').length, 1);
  } finally {
    await runner.close();
  }
});

test('batch: a key whose exchange fails is left to its lease, the others go on', T, async () => {
  const t = await pair();
  const runner = await fakeRunner((l) => (l.key === 'BX-closed' && l.point === 'handled' ? 'close' : 'continue'));
  try {
    const w = wrap(t.user, armedEnv(runner, t), { batch: true });
    const acks = await w.handle(['BX-1', 'BX-closed'].map(message));
    assert.deepEqual(acks.map((m) => m.MessageId), ['m-BX-1']);
    assert.deepEqual(w.runs.sort(), ['BX-1', 'BX-closed']);
    assert.deepEqual(w.verdicts('BX-closed'), ['run:work', 'run:failed']);
    assert.equal(await record(t.run, 'BX-1'), 'completed #1');
    assert.equal(await record(t.run, 'BX-closed'), 'claimed #1');
    const complete = callsOf(w.log, 'complete_operations');
    assert.deepEqual(complete.map((q) => q.params[1]), [['BX-1']]);
  } finally {
    await runner.close();
  }
  // unreachable: no handler runs, nothing is completed
  const gone = wrap(t.user, { IDEMPOTENCY_SIGNOFF: join(tempDir(), 'none.sock'),
                              IDEMPOTENCY_SIGNOFF_JOB_TYPES: `${t.user}=${t.run}` }, { batch: true });
  assert.deepEqual(await gone.handle(['BX-2', 'BX-3'].map(message)), []);
  assert.deepEqual(gone.runs, []);
  assert.equal(await record(t.run, 'BX-2'), 'claimed #1');
  assert.equal(await record(t.run, 'BX-3'), 'claimed #1');
  assert.equal(await count(t.user), 0);
});

// ---- judged ----------------------------------------------------------------------

const JUDGED = { v: 1, point: 'judged', pid: process.pid, heartbeat: false };
const settled = (p) => p.then((value) => ({ value }), (error) => ({ error }));

test('judged (single): completed, in_progress, ID002 reported once each, before the message is acknowledged, postponed or failed', T, async () => {
  const t = await pair('hold', 60);
  await completedBefore(t.run, 'J-done');
  await claimedElsewhere(t.run, 'J-busy');
  await claimedWithOtherBody(t.run, 'J-bad');
  const runner = await fakeRunner((l) => (l.point === 'judged' ? 'hold' : 'continue'));
  try {
    const w = wrap(t.user, armedEnv(runner, t));
    for (const [k, fields, verdicts] of [
      ['J-done', { attempt: 1, verdict: 'completed' }, ['completed:ack']],
      ['J-busy', { attempt: 1, verdict: 'in_progress' }, ['in_progress:retry']],
      ['J-bad', { attempt: null, verdict: 'error', sqlstate: 'ID002',
                  message: `operation "J-bad" of job type "${t.run}" was claimed with a different fingerprint` },
       ['claim error:raise']],
    ]) {
      const sent = w.sqs.sent.length;
      let over = false;
      const done = settled(w.handle(message(k))).finally(() => { over = true; });
      const [line] = await runner.when((l) => l.key === k);
      assert.deepEqual(line, { ...JUDGED, job_type: t.run, key: k, ...fields });
      await pause(150);
      assert.equal(over, false, `${k}: the wrapper waits for the answer`);
      assert.deepEqual(w.verdicts(k), [], `${k}: nothing done before the answer`);
      assert.equal(w.sqs.sent.length, sent);
      runner.held.find((h) => h.msg.key === k).reply('continue');
      const out = await done;
      assert.deepEqual(w.verdicts(k), verdicts);
      if (k === 'J-done') assert.equal(out.value?.MessageId, 'm-J-done');   // deleted
      if (k === 'J-busy') {                                                 // postponed
        assert.equal(out.value, undefined);
        assert.deepEqual(w.sqs.sent.slice(sent).map((c) => c.input.VisibilityTimeout), [RETRY_AFTER]);
      }
      if (k === 'J-bad') assert.equal(out.error?.code, 'ID002');           // thrown: left in flight
    }
    assert.deepEqual(w.runs, []);
    // each key reported once, at judged only
    assert.deepEqual(runner.lines.map((l) => `${l.key}:${l.point}`), ['J-done:judged', 'J-busy:judged', 'J-bad:judged']);
    assert.deepEqual(typesCalled(w.log), [t.run]);
    assert.equal(await count(t.user), 0);
  } finally {
    await runner.close();
  }
});

test('judged (batch): one line per key not worked on, at the same time, the heartbeat running, before any acknowledgement or postponement', T, async () => {
  const t = await pair('hold', 60);
  await completedBefore(t.run, 'BJ-done');
  await claimedElsewhere(t.run, 'BJ-busy');
  await claimedWithOtherBody(t.run, 'BJ-bad');
  const runner = await fakeRunner((l) => (l.point === 'judged' ? 'hold' : 'continue'));
  try {
    // ID002 on BJ-bad refuses the batch claim: the fallback claims one by one
    const w = wrap(t.user, armedEnv(runner, t), { batch: true });
    const done = w.handle(['BJ-run', 'BJ-done', 'BJ-busy', 'BJ-bad'].map(message));
    const judged = await runner.when((l) => l.point === 'judged', 3);   // all three open together
    const sorted = (lines) => [...lines].sort((a, b) => a.key.localeCompare(b.key));
    assert.deepEqual(sorted(judged), [
      { ...JUDGED, job_type: t.run, key: 'BJ-bad', attempt: null, verdict: 'error', sqlstate: 'ID002',
        message: `operation "BJ-bad" of job type "${t.run}" was claimed with a different fingerprint` },
      { ...JUDGED, job_type: t.run, key: 'BJ-busy', attempt: 1, verdict: 'in_progress' },
      { ...JUDGED, job_type: t.run, key: 'BJ-done', attempt: 1, verdict: 'completed' }]);
    assert.equal(callsOf(w.log, 'claim_operations').length, 1);
    assert.equal(callsOf(w.log, 'claim_operation').length, 4);
    await pause(HEARTBEAT * 3);
    assert.deepEqual(w.events, [], 'no message acknowledged, postponed or failed before the answers');
    assert.equal(w.sqs.sent.length, 0);
    assert.ok(callsOf(w.log, 'extend_lease').length >= 1, 'BJ-run\'s claim kept young meanwhile');
    for (const h of runner.held) h.reply('continue');
    const acks = await done;
    assert.deepEqual(acks.map((m) => m.MessageId).sort(), ['m-BJ-done', 'm-BJ-run']);
    assert.deepEqual(w.verdicts('BJ-done'), ['completed:ack']);
    assert.deepEqual(w.verdicts('BJ-busy'), ['in_progress:retry']);
    assert.deepEqual(w.verdicts('BJ-bad'), ['claim error:raise']);
    assert.deepEqual(w.verdicts('BJ-run'), ['run:work', 'run:completed']);
    assert.deepEqual(w.sqs.sent.map((c) => c.input.Entries.map((e) => [e.ReceiptHandle, e.VisibilityTimeout])),
                     [[['rh-BJ-busy', RETRY_AFTER]]]);
    // each key once: judged, or claimed and handled for the one worked on
    assert.deepEqual(runner.lines.map((l) => `${l.key}:${l.point}`).sort(),
                     ['BJ-bad:judged', 'BJ-busy:judged', 'BJ-done:judged', 'BJ-run:claimed', 'BJ-run:handled']);

    // the batch claim answering for itself (no fallback): completed, in_progress
    await claimedElsewhere(t.run, 'BJ-busy2');
    const w2 = wrap(t.user, armedEnv(runner, t), { batch: true });
    const done2 = w2.handle(['BJ-done', 'BJ-busy2', 'BJ-run2'].map(message));
    const judged2 = await runner.when((l) => l.point === 'judged' && /^BJ-(done|busy2)$/.test(l.key), 3);
    assert.deepEqual(sorted(judged2.slice(1)), [
      { ...JUDGED, job_type: t.run, key: 'BJ-busy2', attempt: 1, verdict: 'in_progress' },
      { ...JUDGED, job_type: t.run, key: 'BJ-done', attempt: 1, verdict: 'completed' }]);
    for (const h of runner.held.slice(3)) h.reply('continue');
    assert.deepEqual((await done2).map((m) => m.MessageId).sort(), ['m-BJ-done', 'm-BJ-run2']);
    assert.equal(callsOf(w2.log, 'claim_operation').length, 0);
    assert.deepEqual(w2.verdicts('BJ-busy2'), ['in_progress:retry']);
    assert.equal(runner.lines.length, 5 + 4);   // 2 judged, claimed and handled of BJ-run2
  } finally {
    await runner.close();
  }
});

test('judged busy: a claim that hit its bound (55P03) is reported with its sqlstate, then postponed (single, batch)', T, async () => {
  const t = await pair('hold', 60);
  const stuck = new pg.Client();
  await stuck.connect();
  await stuck.query('BEGIN');
  await stuck.query('SELECT idempotency.claim_operation($1, $2, $3, $4)', [t.run, 'JB-1', fp('JB-1'), 'stuck']);
  const runner = await fakeRunner();
  try {
    const busy = { ...JUDGED, job_type: t.run, key: 'JB-1', attempt: null, verdict: 'busy', sqlstate: '55P03' };
    const w = wrap(t.user, armedEnv(runner, t), { opts: { claimWait: 0.2 } });
    assert.equal(await w.handle(message('JB-1')), undefined);
    assert.deepEqual(runner.lines, [busy]);
    assert.deepEqual(w.verdicts('JB-1'), ['claim error:retry']);
    assert.deepEqual(w.sqs.sent.map((c) => c.input.VisibilityTimeout), [RETRY_AFTER]);

    const b = wrap(t.user, armedEnv(runner, t), { batch: true, opts: { claimWait: 0.2 } });
    const acks = await b.handle(['JB-1', 'JB-2'].map(message));
    assert.deepEqual(acks.map((m) => m.MessageId), ['m-JB-2']);
    assert.deepEqual(runner.lines.slice(1).filter((l) => l.key === 'JB-1'), [busy]);
    assert.deepEqual(runner.lines.slice(1).map((l) => `${l.key}:${l.point}`).sort(),
                     ['JB-1:judged', 'JB-2:claimed', 'JB-2:handled']);
    assert.deepEqual(b.verdicts('JB-1'), ['claim error:retry']);
  } finally {
    await stuck.query('ROLLBACK');
    await stuck.end();
    await runner.close();
  }
});

test('fail is not an answer at judged: the message is neither acknowledged nor postponed (single, batch)', T, async () => {
  const t = await pair('hold', 60);
  await completedBefore(t.run, 'JF-1');
  await claimedElsewhere(t.run, 'JF-2');
  const runner = await fakeRunner((l) => (l.point === 'judged' ? 'fail' : 'continue'));
  try {
    const w = wrap(t.user, armedEnv(runner, t));
    await assert.rejects(w.handle(message('JF-1')), /point judged .*unexpected answer "fail" \(expected continue\)/);
    await assert.rejects(w.handle(message('JF-2')), /point judged .*unexpected answer "fail"/);
    assert.deepEqual(w.verdicts('JF-1'), ['completed:failed']);
    assert.deepEqual(w.verdicts('JF-2'), ['in_progress:failed']);
    assert.equal(w.sqs.sent.length, 0);

    const b = wrap(t.user, armedEnv(runner, t), { batch: true });
    const acks = await b.handle(['JF-1', 'JF-2', 'JF-3'].map(message));
    assert.deepEqual(acks.map((m) => m.MessageId), ['m-JF-3']);   // the others go on
    assert.deepEqual(b.verdicts('JF-1'), ['completed:failed']);
    assert.deepEqual(b.verdicts('JF-2'), ['in_progress:failed']);
    assert.equal(b.sqs.sent.length, 0);
    assert.equal(await record(t.run, 'JF-3'), 'completed #1');
  } finally {
    await runner.close();
  }
});

// ---- IDEMPOTENCY_SIGNOFF_LEASE -----------------------------------------------

// a wrapper configured for production: a 600 s lease, a 150 s heartbeat, a
// backoff of 10 s (a release postponed 5-10 s)
const PRODUCTION = { heartbeat: 150_000, retryAfter: 600, backoff: 10, backoffMax: 60 };

test('the run\'s lease (single): the heartbeat at a quarter of it while held at claimed, in_progress postponed by it, a release within half of it', T, async () => {
  const t = await pair('hold', 60);
  const runner = await fakeRunner((l) => (l.point === 'claimed' ? 'hold' : 'continue'));
  try {
    const w = wrap(t.user, { ...armedEnv(runner, t), IDEMPOTENCY_SIGNOFF_LEASE: '0.4' }, { opts: PRODUCTION });
    const done = w.handle(message('L-1'));
    await runner.when((l) => l.point === 'claimed');
    const before = await heartbeatAt(t.run, 'L-1');
    await pause(600);
    assert.ok(await heartbeatAt(t.run, 'L-1') > before, 'heartbeat_at moves while held at claimed');
    assert.ok(callsOf(w.log, 'extend_lease').length >= 3, 'a beat every 100 ms, not every 150 s');
    // a duplicate meets the young claim: postponed by the run's lease (SQS:
    // whole seconds, rounded up), not by retryAfter's 600 s
    assert.equal(await w.handle(message('L-1')), undefined);
    assert.deepEqual(w.verdicts('L-1'), ['run:work', 'in_progress:retry']);
    assert.deepEqual(w.sqs.sent.map((c) => c.input.VisibilityTimeout), [1]);
    // fail at claimed: released and postponed within half the run's lease (at
    // least SQS's 1 s), not by the backoff's 5-10 s
    runner.held[0].reply('fail');
    assert.equal(await done, undefined);
    assert.deepEqual(w.verdicts('L-1'), ['run:work', 'in_progress:retry', 'run:released']);
    assert.deepEqual(w.sqs.sent.map((c) => c.input.VisibilityTimeout), [1, 1]);
    assert.equal(await record(t.run, 'L-1'), 'released #1');
  } finally {
    await runner.close();
  }
});

test('the run\'s lease (batch): the heartbeat while held at claimed, in_progress and a release postponed by it', T, async () => {
  const t = await pair('hold', 60);
  await claimedElsewhere(t.run, 'BL-busy');
  const runner = await fakeRunner((l) => (l.point === 'claimed' ? 'hold' : 'continue'));
  try {
    const w = wrap(t.user, { ...armedEnv(runner, t), IDEMPOTENCY_SIGNOFF_LEASE: '0.4' },
                   { batch: true, opts: PRODUCTION });
    const done = w.handle(['BL-1', 'BL-busy', 'BL-fail'].map(message));
    await runner.when((l) => l.point === 'claimed', 2);
    const before = [await heartbeatAt(t.run, 'BL-1'), await heartbeatAt(t.run, 'BL-fail')];
    await pause(600);
    assert.ok(await heartbeatAt(t.run, 'BL-1') > before[0], 'heartbeat_at moves while held at claimed');
    assert.ok(await heartbeatAt(t.run, 'BL-fail') > before[1]);
    for (const h of runner.held) h.reply(h.msg.key === 'BL-fail' ? 'fail' : 'continue');
    assert.deepEqual((await done).map((m) => m.MessageId), ['m-BL-1']);
    assert.deepEqual(w.sqs.sent.map((c) => c.input.Entries.map((e) => [e.ReceiptHandle, e.VisibilityTimeout])),
                     [[['rh-BL-busy', 1], ['rh-BL-fail', 1]]]);
    assert.deepEqual(w.verdicts('BL-fail'), ['run:work', 'run:released']);
  } finally {
    await runner.close();
  }
});

test('the map and the lease with IDEMPOTENCY_SIGNOFF unset: the run\'s job type, in_progress postponed by the run\'s lease, no connection', T, async () => {
  const t = await pair('hold', 60);
  await claimedElsewhere(t.run, 'UL-1');
  const runner = await fakeRunner();
  try {
    const env = { IDEMPOTENCY_SIGNOFF_JOB_TYPES: `${t.user}=${t.run}`, IDEMPOTENCY_SIGNOFF_LEASE: '3.2' };
    const w = wrap(t.user, env, { opts: PRODUCTION });
    const b = wrap(t.user, env, { batch: true, opts: PRODUCTION });
    process.env.IDEMPOTENCY_SIGNOFF = runner.path;   // after the wrappers were made: not looked at
    try {
      assert.equal(await w.handle(message('UL-1')), undefined);
      assert.deepEqual((await b.handle(['UL-1', 'UL-2'].map(message))).map((m) => m.MessageId), ['m-UL-2']);
    } finally {
      delete process.env.IDEMPOTENCY_SIGNOFF;
    }
    assert.deepEqual(w.verdicts('UL-1'), ['in_progress:retry']);
    assert.deepEqual(w.sqs.sent.map((c) => c.input.VisibilityTimeout), [4]);   // 3.2 s, rounded up
    assert.deepEqual(b.sqs.sent.map((c) => c.input.Entries.map((e) => [e.ReceiptHandle, e.VisibilityTimeout])),
                     [[['rh-UL-1', 4]]]);
    assert.deepEqual(typesCalled(w.log), [t.run]);
    assert.deepEqual(typesCalled(b.log), [t.run]);
    assert.equal(await record(t.run, 'UL-2'), 'completed #1');
    assert.equal(await count(t.user), 0);
    assert.equal(runner.connections, 0);
  } finally {
    await runner.close();
  }
});

test('the run\'s lease: a lost connection is tried again for at most half of it (single, batch)', T, async () => {
  const t = await pair('hold', 60);
  // the database unreachable for 5 s: IDEMPOTENCY_RECONNECT_FOR's 30 s would
  // ride it out; half the run's lease (0.2 s) gives up
  const upAt = Date.now() + 5000;
  let connects = 0;
  const down = {
    connect: async () => {
      connects++;
      if (Date.now() < upAt) throw new Error('connect ECONNREFUSED (the test\'s database is down)');
      return pool.connect();
    },
    query: (sql, params) => pool.query(sql, params),
  };
  for (const batch of [false, true]) {
    const w = wrap(t.user, { IDEMPOTENCY_SIGNOFF_JOB_TYPES: `${t.user}=${t.run}`, IDEMPOTENCY_SIGNOFF_LEASE: '0.4' },
                   { batch, opts: { ...PRODUCTION, pool: down } });
    const before = connects;
    const t0 = Date.now();
    await assert.rejects(w.handle(batch ? [message('LC-2')] : message('LC-1')), /ECONNREFUSED \(the test's/);
    assert.ok(Date.now() - t0 < 2000, `gave up after ${Date.now() - t0} ms`);
    assert.ok(connects - before >= 2, 'tried again');
  }
  assert.ok(Date.now() < upAt, 'both gave up while the database was down');
  assert.equal(await count(t.run), 0);
});

test('a bad IDEMPOTENCY_SIGNOFF_LEASE: every call throws before any database call, armed or not (single, batch)', T, async () => {
  const t = await pair();
  const runner = await fakeRunner();
  try {
    for (const value of ['0', '-2', 'abc', 'Infinity']) {
      for (const armed of [true, false]) {
        for (const batch of [false, true]) {
          const env = { IDEMPOTENCY_SIGNOFF_JOB_TYPES: `${t.user}=${t.run}`, IDEMPOTENCY_SIGNOFF_LEASE: value,
                        ...(armed ? { IDEMPOTENCY_SIGNOFF: runner.path } : {}) };
          const w = wrap(t.user, env, { batch });
          const arg = batch ? [message('BL-1')] : message('BL-1');
          const what = new RegExp(`IDEMPOTENCY_SIGNOFF_LEASE: "${value}" is not a positive number of seconds`);
          await assert.rejects(w.handle(arg), what);
          await assert.rejects(w.handle(arg), what);   // every call
          assert.deepEqual(w.log, [], `${value} ${armed} ${batch}`);
          assert.deepEqual(w.runs, []);
          assert.deepEqual(w.events, []);
        }
      }
    }
    assert.equal(runner.connections, 0);
    assert.equal(await count(t.user), 0);
    assert.equal(await count(t.run), 0);
  } finally {
    await runner.close();
  }
});

// ---- real kills -----------------------------------------------------------------

// a child worker (test/signoff-worker.mjs) armed against a fake runner that
// holds `point`: SIGKILLed (by the pid of its lines) once every key has
// reported it
async function killAt(point, mode, keys) {
  const t = await pair();
  const effects = join(tempDir(), 'effects');
  const runner = await fakeRunner((l) => (l.point === point ? 'hold' : 'continue'));
  try {
    const child = spawn(process.execPath, [WORKER, mode, ...keys], {
      env: { ...process.env, ...armedEnv(runner, t), JOB_TYPE: t.user, EFFECT_FILE: effects },
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    let out = '';
    child.stdout.on('data', (d) => { out += d; });
    const exited = once(child, 'exit');
    const lines = await Promise.race([
      runner.when((l) => l.point === point, keys.length),
      exited.then(([code, signal]) => { throw new Error(`the worker ended (${code}, ${signal}): ${out}`); }),
    ]);
    assert.ok(lines.every((l) => l.pid === child.pid && l.job_type === t.run));
    process.kill(lines[0].pid, 'SIGKILL');
    const [code, signal] = await exited;
    assert.equal(signal, 'SIGKILL');
    assert.equal(code, null);
    assert.equal(out, '');   // never reached its end
    return { t, effects: existsSync(effects) ? readFileSync(effects, 'utf8').split('\n').filter(Boolean) : [] };
  } finally {
    await runner.close();
  }
}

for (const mode of ['single', 'batch']) {
  const keys = mode === 'single' ? ['KS-1'] : ['KB-1', 'KB-2'];

  test(`kill at claimed (${mode}): the record stays claimed, no effect`, T, async () => {
    const { t, effects } = await killAt('claimed', mode, keys);
    assert.deepEqual(effects, []);
    for (const k of keys) assert.equal(await record(t.run, k), 'claimed #1');
    assert.equal(await count(t.user), 0);
  });

  test(`kill at handled (${mode}): the effect happened, the record not completed`, T, async () => {
    const { t, effects } = await killAt('handled', mode, keys);
    assert.deepEqual(effects.sort(), keys);
    for (const k of keys) assert.equal(await record(t.run, k), 'claimed #1');
    assert.equal(await count(t.user), 0);
  });
}
