// sweeper.mjs: records of send_confirmation that no message will bring to a
// worker any more. Run it every few minutes (cron, a scheduled Lambda):
//
//   node sweeper.mjs
//
// 1. Stale claims (idempotency.stale_claims()) whose message the queue will
//    not bring back (the worker died and the message was deleted, expired or
//    dead-lettered):
//      policy hold                -> hand it to a person: print it (page, ticket);
//                                    nothing is re-sent until the person calls
//                                    idempotency.resolve_operation(...)
//      policy retry, skip, lookup -> re-enqueue the message; the next claim
//                                    applies the policy (takeover or skip)
// 2. Released records that nobody claimed for a lease: this is how a person's
//    resolve_operation(..., 'retry') on a held or skipped record reaches a
//    worker (the held message was deleted: no delivery would come), and how a
//    release whose message was lost (expired, dead-lettered) is sent after
//    all. Re-enqueued; the next claim runs attempt + 1. A released record is
//    listed again at every sweep until a worker claims it; the extra copies
//    get `completed`.
// The role needs EXECUTE on idempotency.stale_claims(text) and SELECT on
// idempotency.operations and idempotency.job_types (the operator grants).
import pg from 'pg';
import { SendMessageCommand } from '@aws-sdk/client-sqs';
import { sqs, queueUrl } from './sqs-client.mjs';
import { confirmationMessage } from './orders.mjs';

// released, and untouched for a lease: no worker is on it (a claim would have
// made it claimed again; the wrapper's own redelivery after a known failure
// comes within half a lease)
const RELEASED = `
  SELECT o.operation_key, o.attempt
    FROM idempotency.operations o
    JOIN idempotency.job_types j USING (job_type)
   WHERE o.job_type = $1 AND o.status = 'released'
     AND o.heartbeat_at + j.lease <= clock_timestamp()
   ORDER BY o.heartbeat_at`;

const jobType = process.env.JOB_TYPE ?? 'send_confirmation';
const client = new pg.Client();
await client.connect();
const { rows } = await client.query(
  `SELECT operation_key, attempt, stale_policy::text, claimed_by, stale_for::text
     FROM idempotency.stale_claims($1)`, [jobType]);
const { rows: released } = await client.query(RELEASED, [jobType]);
await client.end();
const enqueue = (key) =>
  sqs.send(new SendMessageCommand({ QueueUrl: queueUrl, MessageBody: confirmationMessage(key) }));
for (const r of rows) {
  if (r.stale_policy === 'hold') {
    console.log(`for a person: ${jobType} ${r.operation_key} attempt ${r.attempt} (claimed by ${r.claimed_by}, ` +
                `stale for ${r.stale_for}); decide with SELECT idempotency.resolve_operation(` +
                `'${jobType}', '${r.operation_key}', 'completed' | 'retry', 'note')`);
  } else {
    await enqueue(r.operation_key);
    console.log(`re-enqueued: ${jobType} ${r.operation_key} attempt ${r.attempt} (policy ${r.stale_policy})`);
  }
}
for (const r of released) {
  await enqueue(r.operation_key);
  console.log(`re-enqueued: ${jobType} ${r.operation_key} attempt ${r.attempt} (released)`);
}
console.log(`sweeper: ${rows.length} stale claim(s), ${released.length} released record(s)`);
