// worker.mjs: the notify_shipment consumer (the second SQS job of the
// sign-off runs): for each shipment message it POSTs the shipment to the
// carrier's webhook, once per shipment.
//
//   QUEUE_URL=... SQS_ENDPOINT=... WEBHOOK_URL=http://... PGHOST=... node worker.mjs
//
// Message body (publish.mjs): {"shipment": "SHP-1", "carrier": "..."}.
// Operation key: the shipment (it names the effect: "the carrier was told
// of this shipment"), sent along as the Idempotency-Key header.
// The webhook's answers: 2xx taken; 503, 429 or no connection: refused for
// now, a known failure (released, the message again after a backoff); any
// other 4xx (422): refused for good, the operation completed with the
// refusal as its result; another 5xx, or no answer within $WEBHOOK_TIMEOUT
// seconds (default 10): taken or not, unknown, the claim left to its lease.
import pg from 'pg';
import { Consumer } from 'sqs-consumer';
import { idempotent, KnownFailure } from 'pg-idempotency';
import { sqs, queueUrl } from '../sqs-client.mjs';

const lease = Number(process.env.LEASE_SECONDS ?? 600);   // as in idempotency.job_types
const webhook = process.env.WEBHOOK_URL;
const timeoutMs = Number(process.env.WEBHOOK_TIMEOUT || 10) * 1000;   // the call's, in all
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
      // the whole call: without it a receiver that takes the call and never
      // answers holds the handler (and, through the heartbeat, the claim)
      // for ever (fetch has no timeout of its own)
      signal: AbortSignal.timeout(timeoutMs),
    });
  } catch (err) {
    // nothing listens: certainly not taken, released and retried
    if (err.cause?.code === 'ECONNREFUSED') throw new KnownFailure(`${webhook}: ${err.cause.message}`);
    // no answer in time (TimeoutError), a lost connection: taken or not,
    // the caller cannot know; the claim is left to its lease
    throw new Error(`${webhook}: ${err.name === 'TimeoutError' ? `no answer in ${timeoutMs} ms` : err.message}`);
  }
  if (res.status === 503 || res.status === 429) {   // busy: certainly not taken, try again later
    throw new KnownFailure(`${webhook}: HTTP ${res.status}`);
  }
  if (res.status >= 400 && res.status < 500) {   // 422 and the like: refused for good
    // the operation ends with the refusal as its result: a retry would
    // only be refused again
    return { status: res.status, refused: (await res.text()).slice(0, 200) };
  }
  if (!res.ok) throw new Error(`${webhook}: HTTP ${res.status}`);   // other 5xx: uncertain
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
