// worker.mjs: the notify_shipment consumer (the second SQS job of the
// sign-off runs): for each shipment message it POSTs the shipment to the
// carrier's webhook, once per shipment.
//
//   QUEUE_URL=... SQS_ENDPOINT=... WEBHOOK_URL=http://... PGHOST=... node worker.mjs
//
// Message body (publish.mjs): {"shipment": "SHP-1", "carrier": "..."}.
// Operation key: the shipment (it names the effect: "the carrier was told
// of this shipment"), sent along as the Idempotency-Key header.
import pg from 'pg';
import { Consumer } from 'sqs-consumer';
import { idempotent, KnownFailure } from 'pg-idempotency';
import { sqs, queueUrl } from '../sqs-client.mjs';

const lease = Number(process.env.LEASE_SECONDS ?? 600);   // as in idempotency.job_types
const webhook = process.env.WEBHOOK_URL;
if (!webhook || !queueUrl) {
  console.error('worker.mjs: WEBHOOK_URL and QUEUE_URL must be set');
  process.exit(2);
}
const pool = new pg.Pool({ max: 2 });                      // PG* environment
pool.on('error', (err) => console.error('pg pool:', err.message));

async function notifyShipment(shipment, { key }) {
  let res;
  try {
    res = await fetch(webhook, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'idempotency-key': key },
      body: JSON.stringify(shipment),
    });
  } catch (err) {
    // no connection: the request never left; anything else: it may have
    if (err.cause?.code === 'ECONNREFUSED') throw new KnownFailure(`${webhook}: ${err.cause.message}`);
    throw err;
  }
  if (res.status >= 400 && res.status < 500) {   // refused: certainly not taken
    throw new KnownFailure(`${webhook}: HTTP ${res.status}`);
  }
  if (!res.ok) throw new Error(`${webhook}: HTTP ${res.status}`);   // uncertain
  return { status: res.status };
}

const visibilityTimeout = Math.ceil(lease) + 2;   // longer than the lease
const consumer = Consumer.create({
  queueUrl,
  sqs,
  batchSize: 1,
  waitTimeSeconds: 1,
  visibilityTimeout,
  heartbeatInterval: Math.max(1, Math.floor(lease / 2)),
  handleMessage: idempotent(notifyShipment, {
    pool, sqs, queueUrl,
    jobType: 'notify_shipment',
    key: (shipment) => shipment.shipment,
    heartbeat: (lease / 4) * 1000,
    retryAfter: Math.ceil(lease),
    onVerdict: (e) => console.log(`notify_shipment ${e.key}: ${e.verdict} #${e.attempt} -> ${e.action}`),
  }),
});
consumer.on('error', (err) => console.error('consumer:', err.message));
consumer.on('processing_error', (err) => console.error('processing:', err.message));
consumer.start();
// SIGTERM, SIGINT: finish the message in hand and the open receive, then exit
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
