// test/plain.test.mjs: the plain functions (docs/helpers.md), the Python
// helper's semantics on a pg.Pool: claim with a delivery token, complete,
// release, extendLease, Heartbeat; claimBatch, completeBatch, releaseBatch;
// withReconnect's bound (reconnectFor, seconds; the deprecated
// IDEMPOTENCY_RECONNECT_FOR in milliseconds); claim reporting `judged` to an
// armed runner. PG* environment; the extension is created if missing.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createServer } from 'node:net';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { claim, claimBatch, claimErrorHeals, complete, completeBatch, extendLease, Heartbeat, isBusy, release,
         releaseBatch, withReconnect, workerId } from 'pg-idempotency';
import { forgetSignoffSettings } from '../lib/plain.mjs';
import { DATABASE_SQL, forgetHello } from '../lib/signoff.mjs';
import { defaultReconnectFor, timings } from '../lib/common.mjs';
import { prepareEdition } from './edition.mjs';

const LEASE = 1;   // seconds
const PREFIX = `plain_unit_${process.pid}_`;
let admin;
let pool;
const types = [];

before(async () => {
  admin = new pg.Client();
  await admin.connect();
  await admin.query('SET client_min_messages = warning');
  await prepareEdition(admin);
  pool = new pg.Pool({ max: 3 });
});

after(async () => {
  for (const t of types) {
    await admin.query('DELETE FROM idempotency.operations WHERE job_type = $1', [t]);
    await admin.query('DELETE FROM idempotency.job_types WHERE job_type = $1', [t]);
  }
  await pool?.end();
  await admin?.end();
});

async function jobType(policy) {
  const t = `${PREFIX}${policy}_${types.length}`;
  await admin.query('INSERT INTO idempotency.job_types (job_type, lease, stale_policy) ' +
                    'VALUES ($1, make_interval(secs => $2), $3)', [t, LEASE, policy]);
  types.push(t);
  return t;
}

async function record(t, key) {
  const { rows } = await admin.query("SELECT status::text || ' #' || attempt AS r, claimed_by " +
                                     'FROM idempotency.operations WHERE job_type = $1 AND operation_key = $2', [t, key]);
  return rows[0]?.r ?? 'none';
}

const age = (t, key) => admin.query("UPDATE idempotency.operations SET claimed_at = claimed_at - interval '1 hour', " +
                                    "heartbeat_at = heartbeat_at - interval '1 hour' " +
                                    'WHERE job_type = $1 AND operation_key = $2', [t, key]);

// a pool whose first client runs the statement on the server (autocommit:
// recorded), then loses the connection before the reply
function losesTheReply(sent) {
  let lost = false;
  const losing = {
    on() {}, removeListener() {}, release() {},
    async query(sql, params) {
      sent.push(params);
      const c = new pg.Client();
      await c.connect();
      await c.query(sql, params);
      await c.end();
      throw new Error('Connection terminated unexpectedly');
    },
  };
  return { connect: async () => (lost ? pool.connect() : (lost = true, losing)),
           query: (sql, params) => pool.query(sql, params) };
}

test('claim, complete, then completed with the result; the default worker', async () => {
  const t = await jobType('hold');
  const c = await claim(pool, t, 'P-1', { fingerprint: 'fp' });
  assert.deepEqual([c.verdict, c.attempt, c.runs], ['run', 1, true]);
  assert.match(c.delivery, /^[0-9a-f-]{36}$/);
  const { rows: [by] } = await admin.query('SELECT claimed_by FROM idempotency.operations WHERE job_type = $1', [t]);
  assert.equal(by.claimed_by, workerId());
  assert.equal((await claim(pool, t, 'P-1', { fingerprint: 'fp' })).verdict, 'in_progress');
  await complete(pool, t, 'P-1', c.attempt, { sent: 1 });
  const done = await claim(pool, t, 'P-1', { fingerprint: 'fp' });
  assert.deepEqual([done.verdict, done.attempt, done.result, done.runs], ['completed', 1, { sent: 1 }, false]);
  const again = await claim(pool, t, 'P-1', { fingerprint: 'other' }).catch((err) => err);
  assert.equal(again.code, 'ID002');
  assert.equal(claimErrorHeals(again), false);
});

test('release: the next claim runs attempt + 1; the same delivery gets its claim back', async () => {
  const t = await jobType('hold');
  const c = await claim(pool, t, 'P-2');
  assert.deepEqual(await claim(pool, t, 'P-2', { delivery: c.delivery }).then((x) => [x.verdict, x.attempt]),
                   ['run', 1]);
  await release(pool, t, 'P-2', c.attempt);
  assert.equal(await record(t, 'P-2'), 'released #1');
  assert.deepEqual(await claim(pool, t, 'P-2').then((x) => [x.verdict, x.attempt]), ['run', 2]);
});

test('a lost reply: the claim again on a new connection with the same token, run #1', async () => {
  const t = await jobType('hold');
  const sent = [];
  const lost = [];
  const c = await claim(losesTheReply(sent), t, 'P-3', { onLost: (err) => lost.push(err.message) });
  assert.deepEqual([c.verdict, c.attempt], ['run', 1]);
  assert.deepEqual(lost, ['Connection terminated unexpectedly']);
  assert.equal(sent[0][4], c.delivery);
  assert.equal(await record(t, 'P-3'), 'claimed #1');
});

test('a stuck transaction: in_progress at once; with wait, busy (55P03) after it', async () => {
  const t = await jobType('hold');
  const stuck = new pg.Client();
  await stuck.connect();
  try {
    await stuck.query('BEGIN');
    await stuck.query("SELECT idempotency.claim_operation($1, 'P-4')", [t]);
    assert.equal((await claim(pool, t, 'P-4')).verdict, 'in_progress');
    const err = await claim(pool, t, 'P-4', { wait: 0.2 }).catch((e) => e);
    assert.ok(isBusy(err), err.message);
    assert.equal(claimErrorHeals(err), true);
  } finally {
    await stuck.end();
  }
});

test('reconnectFor is seconds; the deprecated IDEMPOTENCY_RECONNECT_FOR keeps its milliseconds', async () => {
  const refused = { connect: async () => { tries++; throw new Error('connect ECONNREFUSED (the test)'); } };
  let tries = 0;
  let t0 = Date.now();
  await assert.rejects(claim(refused, 'any', 'K', { reconnectFor: 0.5 }), /ECONNREFUSED \(the test\)/);
  // tries at 0, 0, 0.1 and 0.3 s (pauses 0, 0.1, 0.2); the next, after 0.4 s, would pass the bound
  assert.equal(tries, 4);
  assert.ok(Date.now() - t0 >= 280 && Date.now() - t0 < 1000, `${Date.now() - t0} ms`);
  tries = 0;
  await assert.rejects(withReconnect(refused, () => 1, { reconnectFor: 0 }), /ECONNREFUSED/);
  assert.equal(tries, 2);   // at least once more
  assert.equal(defaultReconnectFor({}), 30);
  assert.equal(defaultReconnectFor({ IDEMPOTENCY_RECONNECT_FOR: '' }), 30);
  assert.equal(defaultReconnectFor({ IDEMPOTENCY_RECONNECT_FOR: '500' }), 0.5);   // ms, as before
  assert.equal(timings({}).reconnectFor, defaultReconnectFor());
  assert.equal(timings({ reconnectFor: 12 }).reconnectFor, 12);
  assert.equal(timings({ reconnectFor: 12 }, 4).reconnectFor, 2);   // at most half the run's lease
  const saved = process.env.IDEMPOTENCY_RECONNECT_FOR;
  process.env.IDEMPOTENCY_RECONNECT_FOR = '500';
  try {
    tries = 0;
    t0 = Date.now();
    await assert.rejects(complete(refused, 'any', 'K', 1, null, { onLost: () => {} }), /ECONNREFUSED/);
    assert.equal(tries, 4);   // 0, 0, 0.1, 0.3 s: the bound is 500 ms, as reconnectFor: 0.5
    assert.ok(Date.now() - t0 >= 280 && Date.now() - t0 < 1000, `${Date.now() - t0} ms`);
    assert.equal(timings({ reconnectFor: 12 }).reconnectFor, 12);   // the option wins
  } finally {
    if (saved === undefined) delete process.env.IDEMPOTENCY_RECONNECT_FOR;
    else process.env.IDEMPOTENCY_RECONNECT_FOR = saved;
  }
});

test('extendLease and Heartbeat keep the claim young; ID003 ends the heartbeat', async () => {
  const t = await jobType('retry');
  const c = await claim(pool, t, 'P-5');
  const { rows: [b] } = await admin.query('SELECT heartbeat_at FROM idempotency.operations WHERE job_type = $1', [t]);
  assert.ok(await extendLease(pool, t, 'P-5', c.attempt) > b.heartbeat_at);
  const beat = new Heartbeat(pool, t, 'P-5', c.attempt, 0.2).start();
  await new Promise((r) => setTimeout(r, LEASE * 1600));
  assert.equal((await claim(pool, t, 'P-5')).verdict, 'in_progress');   // kept young
  await beat.stop();
  await age(t, 'P-5');
  assert.equal((await claim(pool, t, 'P-5')).attempt, 2);   // taken over
  const late = new Heartbeat(pool, t, 'P-5', c.attempt, 0.05).start();
  await new Promise((r) => setTimeout(r, 300));
  const err = await extendLease(pool, t, 'P-5', c.attempt).catch((e) => e);
  assert.equal(err.code, 'ID003');
  await late.stop();
});

test('batches: mixed verdicts in one call, completeBatch and releaseBatch per key', async () => {
  const t = await jobType('hold');
  const done = await claim(pool, t, 'B-done');
  await complete(pool, t, 'B-done', done.attempt, { n: 0 });
  const claims = await claimBatch(pool, t, ['B-1', 'B-2', 'B-done', 'B-1'],
                                  { fingerprints: ['fp1', 'fp,2', null, 'fp1'] });
  assert.deepEqual(claims.map((c) => [c.verdict, c.attempt]),
                   [['run', 1], ['run', 1], ['completed', 1], ['in_progress', 1]]);
  assert.deepEqual(claims[2].result, { n: 0 });
  assert.equal(new Set(claims.map((c) => c.delivery)).size, 4);
  const out = await completeBatch(pool, t, ['B-1', 'B-done'], [1, 1], [{ sent: 'a,"b"}' }, null]);
  assert.deepEqual(out[0], { key: 'B-1', attempt: 1, done: true, sqlstate: null, message: null });
  assert.deepEqual([out[1].key, out[1].done], ['B-done', true]);
  const rel = await releaseBatch(pool, t, ['B-2', 'B-none'], [1, 1]);
  assert.equal(rel[0].done, true);
  assert.deepEqual([rel[1].key, rel[1].done, rel[1].sqlstate], ['B-none', false, 'ID004']);
  assert.equal(await record(t, 'B-1'), 'completed #1');
  assert.equal(await record(t, 'B-2'), 'released #1');
  assert.deepEqual((await claim(pool, t, 'B-1')).result, { sent: 'a,"b"}' });
  // refused as a whole: nothing recorded
  const err = await claimBatch(pool, t, ['B-new', 'B-1'], { fingerprints: ['fp', 'other'] }).catch((e) => e);
  assert.equal(err.code, 'ID002');
  assert.equal(await record(t, 'B-new'), 'none');
  await assert.rejects(claimBatch(pool, t, ['a', 'b'], { fingerprints: ['x'] }), /parallel/);
});

test('batches: a lost reply to claimBatch: the same tokens, the same claims', async () => {
  const t = await jobType('hold');
  const sent = [];
  const claims = await claimBatch(losesTheReply(sent), t, ['B-l1', 'B-l2'], { onLost: () => {} });
  assert.deepEqual(claims.map((c) => [c.verdict, c.attempt]), [['run', 1], ['run', 1]]);
  assert.deepEqual(sent[0][4], claims.map((c) => c.delivery));
  assert.deepEqual((await completeBatch(pool, t, ['B-l1', 'B-l2'], [1, 1])).map((o) => o.done), [true, true]);
});

test('armed: claim and claimBatch report judged under the run\'s job type; a run reports nothing', async () => {
  const yours = await jobType('hold');
  const runs = await jobType('hold');
  const dir = mkdtempSync(join(tmpdir(), 'plain-'));
  const lines = [];
  const server = createServer((conn) => {
    let buf = '';
    conn.setEncoding('utf8');
    conn.on('data', (d) => {
      buf += d;
      if (buf.includes('\n')) { lines.push(JSON.parse(buf)); conn.end('continue\n'); }
    });
  });
  await new Promise((r) => server.listen(join(dir, 'r.sock'), r));
  const saved = { ...process.env };
  Object.assign(process.env, { IDEMPOTENCY_SIGNOFF: join(dir, 'r.sock'),
                               IDEMPOTENCY_SIGNOFF_JOB_TYPES: `${yours}=${runs}` });
  forgetSignoffSettings();
  try {
    const c = await claim(pool, yours, 'J-1', { fingerprint: 'fp' });
    assert.equal(c.verdict, 'run');
    assert.equal((await claim(pool, yours, 'J-1', { fingerprint: 'fp' })).verdict, 'in_progress');
    await assert.rejects(claim(pool, yours, 'J-1', { fingerprint: 'other' }), (e) => e.code === 'ID002');
    await claimBatch(pool, yours, ['J-1', 'J-2']);
    await complete(pool, yours, 'J-1', c.attempt);
    assert.equal(await record(runs, 'J-1'), 'completed #1');
    assert.equal(await record(yours, 'J-1'), 'none');
    const base = { v: 1, point: 'judged', job_type: runs, pid: process.pid, heartbeat: false };
    assert.deepEqual(lines, [
      { ...base, key: 'J-1', attempt: 1, verdict: 'in_progress' },
      { ...base, key: 'J-1', attempt: null, verdict: 'error', sqlstate: 'ID002',
        message: `operation "J-1" of job type "${runs}" was claimed with a different fingerprint` },
      { ...base, key: 'J-1', attempt: 1, verdict: 'in_progress' }]);
  } finally {
    for (const k of ['IDEMPOTENCY_SIGNOFF', 'IDEMPOTENCY_SIGNOFF_JOB_TYPES']) {
      if (saved[k] === undefined) delete process.env[k]; else process.env[k] = saved[k];
    }
    forgetSignoffSettings();
    await new Promise((r) => server.close(r));
    rmSync(dir, { recursive: true, force: true });
  }
});

// a runner that answers continue to every line (kept in `lines`), with the
// variables `env` set for the test's process; fn(lines) runs armed
async function armed(env, fn) {
  const dir = mkdtempSync(join(tmpdir(), 'plain-'));
  const lines = [];
  const server = createServer((conn) => {
    let buf = '';
    conn.setEncoding('utf8');
    conn.on('data', (d) => {
      buf += d;
      if (buf.includes('\n')) { lines.push(JSON.parse(buf)); conn.end('continue\n'); }
    });
  });
  await new Promise((r) => server.listen(join(dir, 'r.sock'), r));
  const all = { IDEMPOTENCY_SIGNOFF: join(dir, 'r.sock'), ...env };
  const saved = Object.fromEntries(Object.keys(all).map((k) => [k, process.env[k]]));
  Object.assign(process.env, all);
  forgetSignoffSettings();
  forgetHello();
  try {
    await fn(lines);
  } finally {
    for (const [k, v] of Object.entries(saved)) {
      if (v === undefined) delete process.env[k]; else process.env[k] = v;
    }
    forgetSignoffSettings();
    forgetHello();
    await new Promise((r) => server.close(r));
    rmSync(dir, { recursive: true, force: true });
  }
}

test('armed: every claim error is judged, verdict error, with its SQLSTATE and message (42501, the batch per key, ID001, a lost connection)', async () => {
  const t = await jobType('hold');
  const role = `node_unit_nogrant_${process.pid}`;
  await admin.query(`DROP ROLE IF EXISTS ${role}`);
  await admin.query(`CREATE ROLE ${role} LOGIN`);
  const nogrant = new pg.Pool({ max: 1, user: role });
  const lost = new pg.Pool({ max: 1, host: '/nonexistent-socket-dir', port: 1 });
  try {
    await armed({}, async (lines) => {
      await assert.rejects(claim(nogrant, t, 'E-1', { fingerprint: 'fp' }), (e) => e.code === '42501');
      await assert.rejects(claimBatch(nogrant, t, ['E-2', 'E-3']), (e) => e.code === '42501');
      await assert.rejects(claim(pool, 'node_unit_no_such_type', 'E-4', { fingerprint: 'fp' }),
                           (e) => e.code === 'ID001');
      await assert.rejects(claim(lost, t, 'E-5', { fingerprint: 'fp', reconnectFor: 0 }), (e) => !(e instanceof pg.DatabaseError));
      const denied = 'permission denied for schema idempotency';
      assert.deepEqual(lines.slice(0, 4).map((l) => [l.point, l.key, l.verdict, l.attempt, l.sqlstate, l.message]), [
        ['judged', 'E-1', 'error', null, '42501', denied],
        ['judged', 'E-2', 'error', null, '42501', denied],
        ['judged', 'E-3', 'error', null, '42501', denied],
        ['judged', 'E-4', 'error', null, 'ID001', 'job type "node_unit_no_such_type" is not registered']]);
      const [point, key, verdict, sqlstate] = [lines[4].point, lines[4].key, lines[4].verdict, lines[4].sqlstate];
      assert.deepEqual([point, key, verdict, sqlstate], ['judged', 'E-5', 'error', null]);
      assert.match(lines[4].message, /nonexistent-socket-dir|ENOENT|connect/);
      assert.ok(!lines[4].message.includes('\n'));
      assert.equal(lines.length, 5);
    });
  } finally {
    await nogrant.end();
    await lost.end();
    await admin.query(`DROP ROLE IF EXISTS ${role}`);
  }
});

test('armed with IDEMPOTENCY_SIGNOFF_HELLO=1: the point hello first, once per process, with the pool\'s database', async () => {
  const t = await jobType('hold');
  await armed({ IDEMPOTENCY_SIGNOFF_HELLO: '1' }, async (lines) => {
    const c = await claim(pool, t, 'H-1', { fingerprint: 'fp' });
    assert.equal(c.verdict, 'run');
    assert.equal((await claim(pool, t, 'H-1', { fingerprint: 'fp' })).verdict, 'in_progress');
    const { rows: [db] } = await admin.query(DATABASE_SQL);
    assert.deepEqual(lines.map((l) => l.point), ['hello', 'judged']);
    assert.deepEqual(lines[0], {
      v: 1, point: 'hello', pid: process.pid, helper: 'pg-idempotency',
      helper_version: JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')).version,
      runtime: 'node', runtime_version: process.versions.node, queue_library: null, queue_library_version: null,
      database: db.database, server_port: db.server_port, system_identifier: db.system_identifier,
      wrapper: 'plain' });
    assert.match(db.system_identifier, /^\d+$/);
  });
});

test('armed with IDEMPOTENCY_SIGNOFF_HELLO=1: claimBatch\'s hello names the plain functions\' batch call', async () => {
  const t = await jobType('hold');
  await armed({ IDEMPOTENCY_SIGNOFF_HELLO: '1' }, async (lines) => {
    await claimBatch(pool, t, ['H-3', 'H-4']);
    assert.deepEqual(lines.map((l) => [l.point, l.wrapper]), [['hello', 'plain_batch']]);
  });
});

test('armed without IDEMPOTENCY_SIGNOFF_HELLO (an older runner, which would refuse it): no hello', async () => {
  const t = await jobType('hold');
  await armed({}, async (lines) => {
    await claim(pool, t, 'H-2', { fingerprint: 'fp' });
    assert.equal((await claim(pool, t, 'H-2', { fingerprint: 'fp' })).verdict, 'in_progress');
    assert.deepEqual(lines.map((l) => l.point), ['judged']);
  });
});
