// worker.mjs: the send_confirmation consumer.
//
//   QUEUE_URL=... SQS_ENDPOINT=... PGHOST=... node worker.mjs
//
// Message body (orders.mjs): {"order": "ORD-1001", "email": "..."}.
// Operation key: the order reference (it names the effect: "the
// confirmation of this order"), not the SQS message id.
import pg from 'pg';
import { Consumer } from 'sqs-consumer';
import { idempotent, idempotentBatch, KnownFailure } from 'pg-idempotency';
import { sendEmail, Refused, RefusedForGood } from './mail-provider.mjs';
import { sqs, queueUrl } from './sqs-client.mjs';
import { appendFileSync } from 'node:fs';

const lease = Number(process.env.LEASE_SECONDS ?? 600);          // as in idempotency.job_types
// SQS_BATCH=1: sqs-consumer's handleMessageBatch with idempotentBatch (one
// claim_operations and one complete_operations per receive of up to
// SQS_BATCH_SIZE messages, default 10); otherwise handleMessage, one at a time
const batch = process.env.SQS_BATCH === '1';
const batchSize = Number(process.env.SQS_BATCH_SIZE ?? 10);
const pool = new pg.Pool({ max: 2 });                             // PG* environment
// an idle client whose connection was lost: the pool drops it (without a
// listener the pool's 'error' event would end the process)
pool.on('error', (err) => console.error('pg pool:', err.message));

async function sendConfirmation(order) {
  try {
    const sent = await sendEmail({ to: order.email, subject: `Your order ${order.order}`, key: order.order });
    return { accepted: sent.accepted };
  } catch (err) {
    // certainly not sent: release, and the message comes back after a backoff
    if (err instanceof Refused) throw new KnownFailure(err.message);
    // certainly not sent, and never will be (say no such mailbox): the
    // operation ends here, completed with the refusal as its result; a retry
    // would only ask again
    if (err instanceof RefusedForGood) return { accepted: false, refused: err.message };
    // anything else (no reply in time: sent or not?) leaves the claim to
    // its lease and the message to its visibility timeout: the policy decides
    throw err;
  }
}

// the same options for both forms
const options = {
  pool, sqs, queueUrl,
  jobType: process.env.JOB_TYPE ?? 'send_confirmation',
  key: (order) => order.order,
  heartbeat: Number(process.env.HEARTBEAT_SECONDS ?? lease / 4) * 1000,   // extend_lease
  retryAfter: Math.ceil(lease),
  // s a claim may wait for another transaction's uncommitted claim of the
  // key (default 0: in_progress at once)
  claimWait: Number(process.env.CLAIM_WAIT_SECONDS ?? 0),
  onVerdict: (e) => {
    console.log(`send_confirmation ${e.key}: ${e.verdict} #${e.attempt} -> ${e.action}`);
    if (process.env.E2E_EVENTS) {
      appendFileSync(process.env.E2E_EVENTS, JSON.stringify({ ...e, pid: process.pid, t: Date.now() / 1000 }) + '\n');
    }
  },
};

const visibilityTimeout = Math.ceil(lease) + 2;   // longer than the lease: a crash's redelivery meets a stale claim
const consumer = Consumer.create({
  queueUrl,
  sqs,
  batchSize: batch ? batchSize : 1,
  waitTimeSeconds: 1,
  visibilityTimeout,
  heartbeatInterval: Math.max(1, Math.floor(lease / 2)),
  attributeNames: ['ApproximateReceiveCount'],
  ...(batch ? { handleMessageBatch: idempotentBatch(sendConfirmation, options) }
            : { handleMessage: idempotent(sendConfirmation, options) }),
});
consumer.on('error', (err) => console.error('consumer:', err.message));
consumer.on('processing_error', (err) => console.error('processing:', err.message));
consumer.start();
// SIGTERM, SIGINT: stop receiving, finish the message in hand (and those a
// receive still open brings: sqs-consumer handles them), then exit. Waiting
// for the open receive matters: the broker would otherwise hand a message
// to a long poll whose process is gone, and the message would stay
// invisible for its visibility timeout. At most one visibility timeout.
let stopping = false;
for (const sig of ['SIGTERM', 'SIGINT']) {
  process.on(sig, async () => {
    if (stopping) return;
    stopping = true;
    consumer.stop();
    const until = Date.now() + visibilityTimeout * 1000;
    while (consumer.status.isPolling && Date.now() < until) await new Promise((r) => setTimeout(r, 50));
    await pool.end().catch(() => {});
    process.exit(0);
  });
}
