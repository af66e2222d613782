// test/helper.test.mjs: focused tests of pg-idempotency's verdict mapping that
// need a database but no SQS (the wrapped handler is called directly, as
// sqs-consumer calls it; a fake SQS client records the commands sent):
//
//   node --test test/     # in helpers/node (npm test); PG* environment; the
//                         # extension is created if missing
//
// run -> handler runs, completed #1, message returned (sqs-consumer deletes);
// verify (lookup policy, aged claim) -> handler sees ctx.verify and attempt 2,
// completed #2; completed, held (hold policy, aged claim), skipped (skip
// policy, aged claim) -> handler not run, message returned, nothing sent;
// in_progress (a young claim) -> handler not run, message not returned,
// ChangeMessageVisibility(retryAfter) sent.
// Extension 0.3: a claim whose reply is lost with its connection (the server
// recorded it) is sent once more on a new connection with the same delivery
// token and gets its own claim back (run #1, not in_progress); another
// transaction's uncommitted claim of the key answers in_progress at once
// (wait => false); with claimWait the claim's lock_timeout (55P03) postpones
// the message like in_progress.
// idempotentBatch (sqs-consumer's handleMessageBatch): a receive of 10 with
// mixed verdicts (one claim_operations, one complete_operations, one
// release_operations, one ChangeMessageVisibilityBatch); a key twice in one
// receive (run, then in_progress); a lost reply to the batch claim (sent once
// more with the same tokens: run, the same attempts); one key fenced before
// the completion (ID003 on its row, the others completed); a key claimed with
// another body (ID002 for the whole claim: single claims, the others run); a
// stuck transaction on one key (in_progress for it, the others run; with
// claimWait its 55P03 postpones only that message); the heartbeat keeps a key
// whose handler finished early young while a slow one runs.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import pg from 'pg';
import { countingPool } from './counting-pool.mjs';
import { idempotent, idempotentBatch, fingerprintOf, KnownFailure, PermanentFailure, permanentFailureOf,
         failPermanently, claim } from 'pg-idempotency';
import { prepareEdition } from './edition.mjs';

const LEASE = 1;            // seconds
const RETRY_AFTER = 7;      // seconds; distinct from the lease on purpose
const QUEUE_URL = 'http://127.0.0.1:1/000000000000/unit';
const PREFIX = `sqs_unit_${process.pid}_`;

let admin;
let pool;
const types = [];

before(async () => {
  admin = new pg.Client();
  await admin.connect();
  await admin.query('SET client_min_messages = warning');
  await prepareEdition(admin);
  pool = new pg.Pool({ max: 2 });
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
  await admin.query('DELETE FROM idempotency.operations WHERE job_type = $1', [t]);
  await admin.query('DELETE FROM idempotency.job_types WHERE job_type = $1', [t]);
  await admin.query('INSERT INTO idempotency.job_types (job_type, lease, stale_policy) ' +
                    'VALUES ($1, make_interval(secs => $2), $3)', [t, LEASE, policy]);
  types.push(t);
  return t;
}

function fakeSqs() {
  const sent = [];
  return { sent, async send(command) { sent.push(command); return {}; } };
}

const message = (key) => ({ MessageId: `m-${key}`, ReceiptHandle: `rh-${key}`,
                            Body: JSON.stringify({ order: key }),
                            Attributes: { ApproximateReceiveCount: '1' } });

// a wrapped handler recording its calls and the verdicts
function wrap(type, sqs, extra = {}) {
  const calls = [];
  const verdicts = [];
  const handle = idempotent(async (payload, ctx) => {
    calls.push({ payload, key: ctx.key, attempt: ctx.attempt, verify: ctx.verify });
    return { sent: payload.order };
  }, { pool, sqs, queueUrl: QUEUE_URL, jobType: type, key: (p) => p.order,
       heartbeat: 250, retryAfter: RETRY_AFTER, worker: 'unit-test',
       onVerdict: (e) => verdicts.push(`${e.verdict}:${e.action}`), ...extra });
  return { handle, calls, verdicts };
}

// another worker's claim, as claim_operation gives it (the same body)
async function claimDirectly(type, key) {
  const { rows: [r] } = await admin.query(
    'SELECT verdict FROM idempotency.claim_operation($1, $2, $3, $4)',
    [type, key, fingerprintOf(message(key).Body), 'dead-worker']);
  assert.equal(r.verdict, 'run');
}

// the claim's worker died an hour ago (as the regression tests age claims)
async function age(type, key) {
  await admin.query("UPDATE idempotency.operations SET claimed_at = claimed_at - interval '1 hour', " +
                    "heartbeat_at = heartbeat_at - interval '1 hour' " +
                    'WHERE job_type = $1 AND operation_key = $2', [type, key]);
}

async function record(type, key) {
  const { rows } = await admin.query(
    "SELECT status::text || ' #' || attempt AS r FROM idempotency.operations " +
    'WHERE job_type = $1 AND operation_key = $2', [type, key]);
  return rows.length ? rows[0].r : 'none';
}

test('run: the handler runs, completed #1, the message is deleted', async () => {
  const type = await jobType('hold');
  const sqs = fakeSqs();
  const { handle, calls, verdicts } = wrap(type, sqs);
  const m = message('K-run');
  assert.equal(await handle(m), m);
  assert.deepEqual(verdicts, ['run:work', 'run:completed']);
  assert.deepEqual(calls, [{ payload: { order: 'K-run' }, key: 'K-run', attempt: 1, verify: false }]);
  assert.equal(sqs.sent.length, 0);
  assert.equal(await record(type, 'K-run'), 'completed #1');
});

test('verify: the handler sees verify and attempt 2, completed #2', async () => {
  const type = await jobType('lookup');
  await claimDirectly(type, 'K-verify');
  await age(type, 'K-verify');
  const sqs = fakeSqs();
  const { handle, calls, verdicts } = wrap(type, sqs);
  const m = message('K-verify');
  assert.equal(await handle(m), m);
  assert.deepEqual(verdicts, ['verify:work', 'verify:completed']);
  assert.deepEqual(calls, [{ payload: { order: 'K-verify' }, key: 'K-verify', attempt: 2, verify: true }]);
  assert.equal(sqs.sent.length, 0);
  assert.equal(await record(type, 'K-verify'), 'completed #2');
});

test('completed: the handler does not run, the message is deleted', async () => {
  const type = await jobType('hold');
  const sqs = fakeSqs();
  const first = wrap(type, sqs);
  await first.handle(message('K-done'));
  const { handle, calls, verdicts } = wrap(type, sqs);
  const m = message('K-done');
  assert.equal(await handle(m), m);
  assert.deepEqual(verdicts, ['completed:ack']);
  assert.equal(calls.length, 0);
  assert.equal(sqs.sent.length, 0);
  assert.equal(await record(type, 'K-done'), 'completed #1');
});

test('in_progress: the handler does not run, the message is postponed by retryAfter', async () => {
  const type = await jobType('hold');
  await claimDirectly(type, 'K-busy');   // young: within its lease
  const sqs = fakeSqs();
  const { handle, calls, verdicts } = wrap(type, sqs);
  assert.equal(await handle(message('K-busy')), undefined);   // not deleted
  assert.deepEqual(verdicts, ['in_progress:retry']);
  assert.equal(calls.length, 0);
  assert.equal(sqs.sent.length, 1);
  assert.equal(sqs.sent[0].constructor.name, 'ChangeMessageVisibilityCommand');
  assert.deepEqual(sqs.sent[0].input, { QueueUrl: QUEUE_URL, ReceiptHandle: 'rh-K-busy',
                                        VisibilityTimeout: RETRY_AFTER });
  assert.equal(await record(type, 'K-busy'), 'claimed #1');
});

test('held (hold policy, stale claim): the handler does not run, the message is deleted', async () => {
  const type = await jobType('hold');
  await claimDirectly(type, 'K-held');
  await age(type, 'K-held');
  const sqs = fakeSqs();
  const { handle, calls, verdicts } = wrap(type, sqs);
  const m = message('K-held');
  assert.equal(await handle(m), m);
  assert.deepEqual(verdicts, ['held:ack']);
  assert.equal(calls.length, 0);
  assert.equal(sqs.sent.length, 0);
});

test('skipped (skip policy, stale claim): the handler does not run, the message is deleted', async () => {
  const type = await jobType('skip');
  await claimDirectly(type, 'K-skip');
  await age(type, 'K-skip');
  const sqs = fakeSqs();
  const { handle, calls, verdicts } = wrap(type, sqs);
  const m = message('K-skip');
  assert.equal(await handle(m), m);
  assert.deepEqual(verdicts, ['skipped:ack']);
  assert.equal(calls.length, 0);
  assert.equal(sqs.sent.length, 0);
});

test('a lost reply to the claim: claimed again with the same token, run #1', async () => {
  const type = await jobType('hold');
  const sqs = fakeSqs();
  // the first client runs the claim on the server (recorded: autocommit),
  // then its connection is gone before the reply is read
  let lost = false;
  const losing = {
    on() {}, removeListener() {}, release() {},
    async query(sql, params) {
      const c = new pg.Client();
      await c.connect();
      await c.query(sql, params);
      await c.end();
      throw new Error('Connection terminated unexpectedly');
    },
  };
  const flaky = { connect: async () => (lost ? pool.connect() : (lost = true, losing)),
                  query: (...a) => pool.query(...a) };
  const { handle, calls, verdicts } = wrap(type, sqs, { pool: flaky });
  const m = message('K-lost');
  assert.equal(await handle(m), m);
  assert.deepEqual(verdicts, ['claim error:again', 'run:work', 'run:completed']);
  assert.equal(calls.length, 1);
  assert.equal(calls[0].attempt, 1);
  assert.equal(sqs.sent.length, 0);
  assert.equal(await record(type, 'K-lost'), 'completed #1');
});

// another session's uncommitted claim of the key (a stuck transaction)
async function stuckClaim(type, key) {
  const c = new pg.Client();
  await c.connect();
  await c.query('BEGIN');
  await c.query('SELECT idempotency.claim_operation($1, $2)', [type, key]);
  return c;
}

test('a stuck transaction: in_progress at once, the message postponed', async () => {
  const type = await jobType('hold');
  const stuck = await stuckClaim(type, 'K-stuck');
  try {
    const sqs = fakeSqs();
    const { handle, calls, verdicts } = wrap(type, sqs);
    const t0 = Date.now();
    assert.equal(await handle(message('K-stuck')), undefined);
    assert.ok(Date.now() - t0 < 5000, 'not blocked by the open transaction');
    assert.deepEqual(verdicts, ['in_progress:retry']);
    assert.equal(calls.length, 0);
    assert.deepEqual(sqs.sent.map((c) => c.input.VisibilityTimeout), [RETRY_AFTER]);
  } finally {
    await stuck.query('ROLLBACK');
    await stuck.end();
  }
  assert.equal(await record(type, 'K-stuck'), 'none');
});

test('claimWait: the lock_timeout (55P03) postpones the message like in_progress', async () => {
  const type = await jobType('hold');
  const stuck = await stuckClaim(type, 'K-wait');
  const sqs = fakeSqs();
  try {
    const { handle, calls, verdicts } = wrap(type, sqs, { claimWait: 0.2 });
    assert.equal(await handle(message('K-wait')), undefined);
    assert.deepEqual(verdicts, ['claim error:retry']);
    assert.equal(calls.length, 0);
    assert.deepEqual(sqs.sent.map((c) => c.input.VisibilityTimeout), [RETRY_AFTER]);
  } finally {
    await stuck.query('ROLLBACK');
    await stuck.end();
  }
  // the pool's connections are usable: the lock_timeout was local to the claim
  const { handle, verdicts } = wrap(type, sqs, { claimWait: 0.2 });
  const m = message('K-wait');
  assert.equal(await handle(m), m);
  assert.deepEqual(verdicts, ['run:work', 'run:completed']);
});

// ---- idempotentBatch --------------------------------------------------------


const calls = (log, fn) => log.filter((q) => new RegExp(`idempotency\\.${fn}\\(`).test(q.sql)).length;

// a batch handler; behave[key](ctx) runs as the handler of that key (default:
// returns { sent: key })
function wrapBatch(type, sqs, { behave = {}, extra = {} } = {}) {
  const runs = [];
  const events = [];
  const log = [];
  const handle = idempotentBatch(async (payload, ctx) => {
    runs.push({ key: ctx.key, attempt: ctx.attempt, verify: ctx.verify });
    if (behave[ctx.key]) return behave[ctx.key](ctx);
    return { sent: payload.order };
  }, { pool: countingPool(log, pool), sqs, queueUrl: QUEUE_URL, jobType: type, key: (p) => p.order,
       heartbeat: 250, retryAfter: RETRY_AFTER, worker: 'unit-test',
       onVerdict: (e) => events.push(e), ...extra });
  return { handle, runs, events, log, verdicts: (key) => events.filter((e) => e.key === key)
    .map((e) => `${e.verdict}:${e.action}`) };
}

// the messages of one receive: n-th copy of a key gets its own id and handle
function receiveOf(keys) {
  const seen = {};
  return keys.map((k) => {
    seen[k] = (seen[k] ?? 0) + 1;
    const m = message(k);
    return seen[k] === 1 ? m : { ...m, MessageId: `${m.MessageId}-${seen[k]}`, ReceiptHandle: `${m.ReceiptHandle}-${seen[k]}` };
  });
}

const visibilityEntries = (sqs) => sqs.sent.flatMap((c) => {
  assert.equal(c.constructor.name, 'ChangeMessageVisibilityBatchCommand');
  assert.equal(c.input.QueueUrl, QUEUE_URL);
  return c.input.Entries.map((e) => [e.ReceiptHandle, e.VisibilityTimeout]);
});

test('batch: a receive of 10 with mixed verdicts, one claim, one completion, one release', async () => {
  const type = await jobType('hold');
  // before the receive: two completed, two young claims (in_progress), one stale (held)
  const prior = wrapBatch(type, fakeSqs());
  await prior.handle(receiveOf(['B-done-1', 'B-done-2']));
  await claimDirectly(type, 'B-busy-1');
  await claimDirectly(type, 'B-busy-2');
  await claimDirectly(type, 'B-held');
  await age(type, 'B-held');
  const sqs = fakeSqs();
  const { handle, runs, log, verdicts } = wrapBatch(type, sqs, { behave: {
    'B-refused': () => { throw new KnownFailure('the provider said no'); },
    'B-crash': () => { throw new Error('the provider timed out'); },
  } });
  const keys = ['B-run-1', 'B-done-1', 'B-busy-1', 'B-run-2', 'B-held', 'B-refused',
                'B-done-2', 'B-crash', 'B-busy-2', 'B-run-3'];
  const ms = receiveOf(keys);
  const acks = await handle(ms);
  // deleted: the completed runs, the completed records and the held one, in no particular order
  assert.deepEqual(acks.map((m) => m.Body).sort(),
                   ['B-done-1', 'B-done-2', 'B-held', 'B-run-1', 'B-run-2', 'B-run-3']
                     .map((k) => message(k).Body).sort());
  assert.deepEqual(verdicts('B-run-1'), ['run:work', 'run:completed']);
  assert.deepEqual(verdicts('B-done-1'), ['completed:ack']);
  assert.deepEqual(verdicts('B-busy-1'), ['in_progress:retry']);
  assert.deepEqual(verdicts('B-held'), ['held:ack']);
  assert.deepEqual(verdicts('B-refused'), ['run:work', 'run:released']);
  assert.deepEqual(verdicts('B-crash'), ['run:work', 'run:failed']);
  assert.deepEqual(runs.map((r) => r.key).sort(), ['B-crash', 'B-refused', 'B-run-1', 'B-run-2', 'B-run-3']);
  assert.ok(runs.every((r) => r.attempt === 1 && r.verify === false));
  // one call of each
  assert.equal(calls(log, 'claim_operations'), 1);
  assert.equal(calls(log, 'claim_operation'), 0);
  assert.equal(calls(log, 'complete_operations'), 1);
  assert.equal(calls(log, 'release_operations'), 1);
  const complete = log.find((q) => /complete_operations\(/.test(q.sql));
  assert.deepEqual(complete.params[1], ['B-run-1', 'B-run-2', 'B-run-3']);
  // the postponements: one ChangeMessageVisibilityBatch; the release's backoff
  // within [1, retryAfter / 2]
  assert.equal(sqs.sent.length, 1);
  const vis = Object.fromEntries(visibilityEntries(sqs));
  assert.deepEqual(Object.keys(vis).sort(), ['rh-B-busy-1', 'rh-B-busy-2', 'rh-B-refused']);
  assert.equal(vis['rh-B-busy-1'], RETRY_AFTER);
  assert.equal(vis['rh-B-busy-2'], RETRY_AFTER);
  assert.ok(vis['rh-B-refused'] >= 1 && vis['rh-B-refused'] <= Math.floor(RETRY_AFTER / 2));
  for (const k of ['B-run-1', 'B-run-2', 'B-run-3', 'B-done-1']) assert.equal(await record(type, k), 'completed #1');
  assert.equal(await record(type, 'B-refused'), 'released #1');
  assert.equal(await record(type, 'B-crash'), 'claimed #1');   // left to its lease
  assert.equal(await record(type, 'B-busy-1'), 'claimed #1');
});

test('batch: a key twice in one receive is two deliveries: run, then in_progress', async () => {
  const type = await jobType('hold');
  const sqs = fakeSqs();
  const { handle, runs, events, log } = wrapBatch(type, sqs);
  const ms = receiveOf(['B-twice', 'B-other', 'B-twice']);
  const acks = await handle(ms);
  assert.deepEqual(acks, [ms[0], ms[1]]);
  assert.deepEqual(events.filter((e) => e.key === 'B-twice').map((e) => `${e.messageId}:${e.verdict}:${e.action}`),
                   ['m-B-twice:run:work', 'm-B-twice-2:in_progress:retry', 'm-B-twice:run:completed']);
  assert.deepEqual(runs.map((r) => r.key), ['B-twice', 'B-other']);
  assert.equal(calls(log, 'claim_operations'), 1);
  // a token per message, not per key
  const tokens = log.find((q) => /claim_operations\(/.test(q.sql)).params[4];
  assert.equal(new Set(tokens).size, 3);
  assert.deepEqual(visibilityEntries(sqs), [['rh-B-twice-2', RETRY_AFTER]]);
  assert.equal(await record(type, 'B-twice'), 'completed #1');
  // the postponed copy comes back: completed, deleted
  const again = wrapBatch(type, sqs);
  assert.deepEqual(await again.handle([ms[2]]), [ms[2]]);
  assert.deepEqual(again.verdicts('B-twice'), ['completed:ack']);
});

test('batch: a lost reply to the claim: sent again with the same tokens, run with the same attempts', async () => {
  const type = await jobType('hold');
  await claimDirectly(type, 'B-lost-3');   // young: in_progress in both claims
  const sqs = fakeSqs();
  const log = [];
  let lost = false;
  const losing = {   // runs the claim on the server (autocommit: recorded), then the connection is gone
    on() {}, removeListener() {}, release() {},
    async query(sql, params) {
      log.push({ sql, params });
      const c = new pg.Client();
      await c.connect();
      await c.query(sql, params);
      await c.end();
      throw new Error('Connection terminated unexpectedly');
    },
  };
  const counting = countingPool(log, pool);
  const flaky = { connect: async () => (lost ? counting.connect() : (lost = true, losing)),
                  query: counting.query };
  const events = [];
  const runs = [];
  const handle = idempotentBatch(async (payload, ctx) => { runs.push([ctx.key, ctx.attempt]); return {}; },
    { pool: flaky, sqs, queueUrl: QUEUE_URL, jobType: type, key: (p) => p.order, heartbeat: 250,
      retryAfter: RETRY_AFTER, worker: 'unit-test', onVerdict: (e) => events.push(e) });
  const ms = receiveOf(['B-lost-1', 'B-lost-2', 'B-lost-3']);
  const acks = await handle(ms);
  assert.deepEqual(acks, [ms[0], ms[1]]);
  const claims = log.filter((q) => /claim_operations\(/.test(q.sql));
  assert.equal(claims.length, 2);
  assert.deepEqual(claims[1].params, claims[0].params);   // the same keys, tokens, everything
  assert.deepEqual(events.map((e) => `${e.key}:${e.verdict}:${e.action}`), [
    'B-lost-1:claim error:again', 'B-lost-2:claim error:again', 'B-lost-3:claim error:again',
    'B-lost-1:run:work', 'B-lost-2:run:work', 'B-lost-3:in_progress:retry',
    'B-lost-1:run:completed', 'B-lost-2:run:completed']);
  assert.deepEqual(runs.sort(), [['B-lost-1', 1], ['B-lost-2', 1]]);
  assert.equal(await record(type, 'B-lost-1'), 'completed #1');
  assert.equal(await record(type, 'B-lost-2'), 'completed #1');
  assert.deepEqual(visibilityEntries(sqs), [['rh-B-lost-3', RETRY_AFTER]]);
});

test('batch: one key fenced before the completion: ID003 on its row, the others completed', async () => {
  const type = await jobType('retry');
  const sqs = fakeSqs();
  const { handle, log, verdicts } = wrapBatch(type, sqs, { behave: {
    // while the handler runs, its claim goes stale and another delivery
    // takes it over (retry: run #2)
    'B-fenced': async () => {
      await age(type, 'B-fenced');
      const { rows: [r] } = await admin.query(
        'SELECT verdict, attempt FROM idempotency.claim_operation($1, $2, $3, $4)',
        [type, 'B-fenced', fingerprintOf(message('B-fenced').Body), 'other-worker']);
      assert.deepEqual(r, { verdict: 'run', attempt: 2 });
      return { sent: 'late' };
    },
  } });
  const ms = receiveOf(['B-f-1', 'B-fenced', 'B-f-2']);
  const acks = await handle(ms);
  assert.deepEqual(acks.map((m) => m.MessageId).sort(), ['m-B-f-1', 'm-B-f-2', 'm-B-fenced']);
  assert.equal(calls(log, 'complete_operations'), 1);
  assert.deepEqual(verdicts('B-fenced'), ['run:work', 'run:superseded']);
  assert.deepEqual(verdicts('B-f-1'), ['run:work', 'run:completed']);
  assert.deepEqual(verdicts('B-f-2'), ['run:work', 'run:completed']);
  assert.equal(await record(type, 'B-fenced'), 'claimed #2');   // the new owner's
  assert.equal(await record(type, 'B-f-1'), 'completed #1');
  assert.equal(await record(type, 'B-f-2'), 'completed #1');
  assert.equal(sqs.sent.length, 0);
});

test('batch: ID002 for one key: single claims for that receive, the others run', async () => {
  const type = await jobType('hold');
  // the key was claimed with another body
  await admin.query('SELECT idempotency.claim_operation($1, $2, $3)', [type, 'B-bad', 'sha256:other']);
  const sqs = fakeSqs();
  const { handle, log, events, verdicts } = wrapBatch(type, sqs);
  const ms = receiveOf(['B-ok-1', 'B-bad', 'B-ok-2']);
  const acks = await handle(ms);
  assert.deepEqual(acks.map((m) => m.MessageId).sort(), ['m-B-ok-1', 'm-B-ok-2']);
  assert.equal(calls(log, 'claim_operations'), 1);
  assert.equal(calls(log, 'claim_operation'), 3);
  assert.equal(calls(log, 'complete_operations'), 1);
  assert.deepEqual(verdicts('B-bad'), ['claim error:raise']);
  assert.equal(events.find((e) => e.key === 'B-bad').sqlstate, 'ID002');
  // the single claims present the batch's tokens
  const batchTokens = log.find((q) => /claim_operations\(/.test(q.sql)).params[4];
  assert.deepEqual(log.filter((q) => /claim_operation\(/.test(q.sql)).map((q) => q.params[4]), batchTokens);
  assert.equal(await record(type, 'B-ok-1'), 'completed #1');
  assert.equal(await record(type, 'B-ok-2'), 'completed #1');
  assert.equal(sqs.sent.length, 0);   // the refused message is left to its visibility timeout
});

test('batch: a stuck transaction on one key holds back only its message', async () => {
  const type = await jobType('hold');
  const stuck = await stuckClaim(type, 'B-stuck');
  try {
    // wait => false: in_progress for it, no error
    const sqs = fakeSqs();
    const { handle, verdicts } = wrapBatch(type, sqs);
    const ms = receiveOf(['B-s-1', 'B-stuck', 'B-s-2']);
    const t0 = Date.now();
    assert.deepEqual((await handle(ms)).map((m) => m.MessageId), ['m-B-s-1', 'm-B-s-2']);
    assert.ok(Date.now() - t0 < 5000, 'not blocked by the open transaction');
    assert.deepEqual(verdicts('B-stuck'), ['in_progress:retry']);
    assert.deepEqual(visibilityEntries(sqs), [['rh-B-stuck', RETRY_AFTER]]);
    // claimWait: the batch claim's lock_timeout (55P03) fails the whole call;
    // the single claims postpone only the stuck key's message
    const sqs2 = fakeSqs();
    const w = wrapBatch(type, sqs2, { extra: { claimWait: 0.2 } });
    const ms2 = receiveOf(['B-s-3', 'B-stuck']);
    assert.deepEqual((await w.handle(ms2)).map((m) => m.MessageId), ['m-B-s-3']);
    assert.deepEqual(w.verdicts('B-stuck'), ['claim error:retry']);
    assert.equal(w.events.find((e) => e.key === 'B-stuck').sqlstate, '55P03');
    assert.deepEqual(w.verdicts('B-s-3'), ['run:work', 'run:completed']);
    assert.deepEqual(visibilityEntries(sqs2), [['rh-B-stuck', RETRY_AFTER]]);
  } finally {
    await stuck.query('ROLLBACK');
    await stuck.end();
  }
  assert.equal(await record(type, 'B-stuck'), 'none');
});

test('batch: the heartbeat keeps an early finisher young while a slow handler runs', async () => {
  const type = await jobType('hold');
  const sqs = fakeSqs();
  let listed = null;
  const { handle, log, verdicts } = wrapBatch(type, sqs, { behave: {
    'B-slow': async () => {
      await new Promise((resolve) => setTimeout(resolve, LEASE * 1000 * 1.6));
      const { rows } = await admin.query('SELECT operation_key FROM idempotency.stale_claims($1)', [type]);
      listed = rows.map((r) => r.operation_key);
      return {};
    },
  } });
  const ms = receiveOf(['B-fast', 'B-slow']);
  assert.equal((await handle(ms)).length, 2);
  assert.deepEqual(listed, []);   // neither claim went stale
  assert.ok(calls(log, 'extend_lease') >= 2);
  assert.equal(calls(log, 'complete_operations'), 1);
  assert.deepEqual(verdicts('B-fast'), ['run:work', 'run:completed']);
});

// a handler that throws PermanentFailure (the provider said 422)
function refusing(type, sqs, extra = {}) {
  const calls = [];
  const verdicts = [];
  const opts = { pool, sqs, queueUrl: QUEUE_URL, jobType: type, key: (p) => p.order, heartbeat: 250,
                 retryAfter: RETRY_AFTER, worker: 'unit-test',
                 onVerdict: (e) => verdicts.push(`${e.verdict}:${e.action}`), ...extra };
  const body = async (payload) => {
    calls.push(payload.order);
    throw new PermanentFailure('provider answered 422');
  };
  return { handle: idempotent(body, opts), batch: idempotentBatch(body, opts), calls, verdicts };
}

async function resultOf(type, key) {
  const { rows: [r] } = await admin.query(
    'SELECT result FROM idempotency.operations WHERE job_type = $1 AND operation_key = $2', [type, key]);
  return r.result;
}

test('PermanentFailure: completed with the refusal as its result, the message not deleted nor postponed', async () => {
  const type = await jobType('retry');
  const sqs = fakeSqs();
  const { handle, calls, verdicts } = refusing(type, sqs);
  await assert.rejects(handle(message('K-perm')), (err) => err instanceof PermanentFailure &&
                       err.message === 'provider answered 422');
  assert.deepEqual(verdicts, ['run:work', 'run:failed permanently']);
  assert.equal(sqs.sent.length, 0);   // left to the visibility timeout and the redrive policy
  assert.equal(await record(type, 'K-perm'), 'completed #1');
  assert.deepEqual(await resultOf(type, 'K-perm'), { permanent_failure: 'provider answered 422' });
  // the message again (its next receive): thrown again, the handler not called
  await assert.rejects(handle(message('K-perm')), PermanentFailure);
  assert.deepEqual(calls, ['K-perm']);
  assert.deepEqual(verdicts.slice(2), ['completed:failed permanently']);
  assert.equal(permanentFailureOf(await resultOf(type, 'K-perm')), 'provider answered 422');
});

test("PermanentFailure with permanentFailure: 'delete': the message deleted", async () => {
  const type = await jobType('retry');
  const { handle } = refusing(type, fakeSqs(), { permanentFailure: 'delete' });
  const m = message('K-perm-del');
  assert.equal(await handle(m), m);
  assert.equal(await record(type, 'K-perm-del'), 'completed #1');
  assert.equal(await handle(m), m);
  assert.throws(() => idempotent(async () => null, { pool, permanentFailure: 'drop' }), TypeError);
});

test('batch: PermanentFailure completes the key with the refusal, its message not among the deleted', async () => {
  const type = await jobType('retry');
  const { batch, calls } = refusing(type, fakeSqs());
  assert.deepEqual(await batch([message('B-perm')]), []);
  assert.equal(await record(type, 'B-perm'), 'completed #1');
  assert.deepEqual(await resultOf(type, 'B-perm'), { permanent_failure: 'provider answered 422' });
  assert.deepEqual(await batch([message('B-perm')]), []);
  assert.deepEqual(calls, ['B-perm']);
});

test('failPermanently: the plain functions end the operation with the refusal as its result', async () => {
  const type = await jobType('hold');
  const c = await claim(pool, type, 'P-perm', { fingerprint: 'fp' });
  await failPermanently(pool, type, 'P-perm', c.attempt, 'provider answered 422');
  assert.equal(await record(type, 'P-perm'), 'completed #1');
  const again = await claim(pool, type, 'P-perm', { fingerprint: 'fp' });
  assert.equal(again.verdict, 'completed');
  assert.equal(permanentFailureOf(again.result), 'provider answered 422');
});
