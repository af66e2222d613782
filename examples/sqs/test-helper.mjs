// test-helper.mjs: focused tests of idempotency.mjs's verdict mapping that
// need a database but no SQS (the wrapped handler is called directly, as
// sqs-consumer calls it; a fake SQS client records the commands sent):
//
//   node --test test-helper.mjs     # in examples/sqs; PG* environment; the
//                                   # extension is created if missing
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
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import pg from 'pg';
import { idempotent, fingerprintOf } from './idempotency.mjs';

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
  await admin.query('CREATE EXTENSION IF NOT EXISTS idempotency');
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
