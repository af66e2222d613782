// sweeper.mjs: stale claims whose message the queue will not bring back
// (the worker died and the message was deleted, expired or dead-lettered).
// Run it every few minutes (cron, a scheduled Lambda):
//
//   node sweeper.mjs
//
// For each claim whose lease ran out (idempotency.stale_claims()):
//   policy hold                -> hand it to a person: print it (page, ticket);
//                                 nothing is re-sent until someone calls
//                                 idempotency.resolve_operation(...)
//   policy retry, skip, lookup -> re-enqueue the message; the next claim
//                                 applies the policy (takeover or skip)
// The role needs EXECUTE on idempotency.stale_claims(text).
import pg from 'pg';
import { SendMessageCommand } from '@aws-sdk/client-sqs';
import { sqs, queueUrl } from './sqs-client.mjs';
import { confirmationMessage } from './orders.mjs';

const jobType = process.env.JOB_TYPE ?? 'send_confirmation';
const client = new pg.Client();
await client.connect();
const { rows } = await client.query(
  `SELECT operation_key, attempt, stale_policy::text, claimed_by, stale_for::text
     FROM idempotency.stale_claims($1)`, [jobType]);
for (const r of rows) {
  if (r.stale_policy === 'hold') {
    console.log(`for a person: ${jobType} ${r.operation_key} attempt ${r.attempt} (claimed by ${r.claimed_by}, ` +
                `stale for ${r.stale_for}); decide with SELECT idempotency.resolve_operation(` +
                `'${jobType}', '${r.operation_key}', 'completed' | 'retry', 'note')`);
  } else {
    await sqs.send(new SendMessageCommand({ QueueUrl: queueUrl, MessageBody: confirmationMessage(r.operation_key) }));
    console.log(`re-enqueued: ${jobType} ${r.operation_key} attempt ${r.attempt} (policy ${r.stale_policy})`);
  }
}
console.log(`sweeper: ${rows.length} stale claim(s)`);
await client.end();
