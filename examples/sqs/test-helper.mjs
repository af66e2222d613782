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
function wrap(type, sqs) {
  const calls = [];
  const verdicts = [];
  const handle = idempotent(async (payload, ctx) => {
    calls.push({ payload, key: ctx.key, attempt: ctx.attempt, verify: ctx.verify });
    return { sent: payload.order };
  }, { pool, sqs, queueUrl: QUEUE_URL, jobType: type, key: (p) => p.order,
       heartbeat: 250, retryAfter: RETRY_AFTER, worker: 'unit-test',
       onVerdict: (e) => verdicts.push(`${e.verdict}:${e.action}`) });
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
