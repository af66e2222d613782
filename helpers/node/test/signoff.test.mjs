// test/signoff.test.mjs: the sign-off protocol (docs/signoff-protocol.md,
// version 1) in idempotent() and idempotentBatch(), against a fake runner (a
// Unix socket server in this process recording the lines and answering
// continue, fail, nothing (held until the test answers) or closing), and the
// PostgreSQL of the PG* environment (as helper.test.mjs):
//
// unarmed: no connection, the map not read; the map parsed and a malformed
// one refused before any call; continue (single): the two lines and their
// fields, `claimed` inside the heartbeat before the handler, `handled` after
// it with the heartbeat stopped, every call on the run's job type; fail at
// claimed releases without the handler (single, batch); a batch's points per
// run/verify key, its `claimed` exchanges open at the same time; an
// unreachable socket, a connection closed without an answer, an answer not
// allowed; and real kills: a child worker (test/signoff-worker.mjs) SIGKILLed
// at `claimed` (record claimed, no effect) and at `handled` (effect, record
// not completed), single and batch.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { fingerprintOf, idempotent, idempotentBatch, parseJobTypes, signoff, signoffPoint }
  from 'pg-idempotency';

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
  await admin.query('CREATE EXTENSION IF NOT EXISTS idempotency');
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

async function jobType(name, policy = 'hold') {
  const t = `${PREFIX}${name}_${types.length}`;
  await admin.query('INSERT INTO idempotency.job_types (job_type, lease, stale_policy) ' +
                    'VALUES ($1, make_interval(secs => $2), $3)', [t, LEASE, policy]);
  types.push(t);
  return t;
}

// the user's job type and the run's, both registered: what is written where
async function pair(policy = 'hold') {
  return { user: await jobType('user', policy), run: await jobType('run', policy) };
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
  for (const k of ['IDEMPOTENCY_SIGNOFF', 'IDEMPOTENCY_SIGNOFF_JOB_TYPES']) {
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

// a pool that records the SQL of every query (on its clients and its own)
function countingPool(log) {
  const wrapClient = (c) => new Proxy(c, {
    get(t, p) {
      if (p === 'query') return (sql, params) => { log.push({ sql, params }); return t.query(sql, params); };
      const v = t[p];
      return typeof v === 'function' ? v.bind(t) : v;
    },
  });
  return {
    connect: async () => wrapClient(await pool.connect()),
    query: (sql, params) => { log.push({ sql, params }); return pool.query(sql, params); },
  };
}
const callsOf = (log, fn) => log.filter((q) => new RegExp(`idempotency\\.${fn}\\(`).test(q.sql));
// the job type of every idempotency.* call the helper made
const typesCalled = (log) => [...new Set(log.filter((q) => /idempotency\./.test(q.sql)).map((q) => q.params[0]))];

function fakeSqs() {
  const sent = [];
  return { sent, async send(command) { sent.push(command); return {}; } };
}

const message = (key) => ({ MessageId: `m-${key}`, ReceiptHandle: `rh-${key}`,
                            Body: JSON.stringify({ order: key }),
                            Attributes: { ApproximateReceiveCount: '1' } });

// a wrapper (idempotent, or idempotentBatch with batch: true) made in env;
// behave[key]() runs as that key's handler
function wrap(type, env, { batch = false, behave = {} } = {}) {
  const runs = [];
  const events = [];
  const log = [];
  const sqs = fakeSqs();
  const handler = async (payload, ctx) => {
    runs.push(ctx.key);
    if (behave[ctx.key]) return behave[ctx.key](ctx);
    return { sent: payload.order };
  };
  const opts = { pool: countingPool(log), sqs, queueUrl: QUEUE_URL, jobType: type, key: (p) => p.order,
                 heartbeat: HEARTBEAT, retryAfter: RETRY_AFTER, worker: 'signoff-test',
                 onVerdict: (e) => events.push(e) };
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

test('signoff(env): unarmed is the identity and reads no map; armed maps, a malformed map throws at jobType()', T, async () => {
  const unarmed = signoff({ IDEMPOTENCY_SIGNOFF_JOB_TYPES: 'malformed' });
  assert.equal(unarmed.armed, false);
  assert.equal(unarmed.jobType('mine'), 'mine');
  assert.equal(await unarmed.point('claimed', {}), 'continue');
  assert.equal(signoff({ IDEMPOTENCY_SIGNOFF: '' }).armed, false);
  const so = signoff({ IDEMPOTENCY_SIGNOFF: '/nowhere.sock', IDEMPOTENCY_SIGNOFF_JOB_TYPES: 'mine=theirs' });
  assert.equal(so.armed, true);
  assert.equal(so.jobType('mine'), 'theirs');
  assert.equal(so.jobType('unmapped'), 'unmapped');   // not in the map: as given
  const bad = signoff({ IDEMPOTENCY_SIGNOFF: '/nowhere.sock', IDEMPOTENCY_SIGNOFF_JOB_TYPES: 'mine' });
  assert.throws(() => bad.jobType('mine'), /malformed entry "mine"/);
  assert.throws(() => bad.jobType('mine'), /malformed entry "mine"/);   // every call
  await assert.rejects(signoffPoint('/nowhere.sock', 'started', {}), /unknown point/);
});

test('signoffPoint: one line with the fields, the answer resolved', T, async () => {
  const runner = await fakeRunner(() => 'fail');
  try {
    const answer = await signoffPoint(runner.path, 'claimed',
      { job_type: 'jt', key: 'K', attempt: 3, verdict: 'verify', heartbeat: false });
    assert.equal(answer, 'fail');
    assert.deepEqual(runner.lines, [{ v: 1, point: 'claimed', job_type: 'jt', key: 'K', attempt: 3,
                                      verdict: 'verify', pid: process.pid, heartbeat: false }]);
  } finally {
    await runner.close();
  }
});

// ---- idempotent() ------------------------------------------------------------

test('unarmed: no connection, the map not read, the user\'s job type', T, async () => {
  const types2 = await pair();
  const runner = await fakeRunner();
  try {
    // made without IDEMPOTENCY_SIGNOFF (a map alone does nothing); the
    // variable set afterwards is not looked at again
    const w = wrap(types2.user, { IDEMPOTENCY_SIGNOFF_JOB_TYPES: `${types2.user}=${types2.run}` });
    process.env.IDEMPOTENCY_SIGNOFF = runner.path;
    const m = message('U-1');
    try {
      assert.equal(await w.handle(m), m);
    } finally {
      delete process.env.IDEMPOTENCY_SIGNOFF;
    }
    assert.deepEqual(w.verdicts('U-1'), ['run:work', 'run:completed']);
    assert.equal(runner.connections, 0);
    assert.equal(await record(types2.user, 'U-1'), 'completed #1');
    assert.equal(await count(types2.run), 0);
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

  const runner = await fakeRunner(() => 'hold');
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
    assert.equal(runner.lines.length, 5);   // no point for the completed key
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
