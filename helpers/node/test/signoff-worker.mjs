// test/signoff-worker.mjs: a worker for signoff.test.mjs's kill tests, run as
// a child process (not a test file itself):
//
//   node test/signoff-worker.mjs single|batch KEY...
//
// handles one message per KEY (single: one idempotent() call each; batch: one
// idempotentBatch() receive) with a fake SQS client; the handler's effect is
// a line KEY appended to $EFFECT_FILE. The user's job type is $JOB_TYPE; the
// sign-off variables and PG* come from the environment the test gives it.
import { appendFileSync } from 'node:fs';
import pg from 'pg';
import { idempotent, idempotentBatch } from 'pg-idempotency';

const [mode, ...keys] = process.argv.slice(2);
const pool = new pg.Pool({ max: 2 });
const opts = {
  pool, sqs: { async send() { return {}; } }, queueUrl: 'http://127.0.0.1:1/000000000000/kill',
  jobType: process.env.JOB_TYPE, key: (p) => p.order, heartbeat: 250, retryAfter: 7, worker: 'kill-test',
};
const handler = async (payload) => {
  appendFileSync(process.env.EFFECT_FILE, `${payload.order}\n`);
  return { sent: payload.order };
};
const message = (k) => ({ MessageId: `m-${k}`, ReceiptHandle: `rh-${k}`, Body: JSON.stringify({ order: k }),
                          Attributes: { ApproximateReceiveCount: '1' } });

if (mode === 'batch') {
  await idempotentBatch(handler, opts)(keys.map(message));
} else {
  const handle = idempotent(handler, opts);
  for (const k of keys) await handle(message(k));
}
await pool.end();
console.log('done');
