// publish-batch.mjs: send the send_confirmation messages of up to 10 orders
// in one SendMessageBatch (an order named twice: two copies, byte for byte),
// so that one receive of a batch consumer can get them all.
//   node publish-batch.mjs ORD-1 ORD-2 ORD-2 ...
import { SendMessageBatchCommand } from '@aws-sdk/client-sqs';
import { sqs, queueUrl } from './sqs-client.mjs';
import { confirmationMessage } from './orders.mjs';

const orders = process.argv.slice(2);
if (orders.length < 1 || orders.length > 10) throw new Error('1 to 10 orders');
const out = await sqs.send(new SendMessageBatchCommand({
  QueueUrl: queueUrl,
  Entries: orders.map((order, i) => ({ Id: `e${i}`, MessageBody: confirmationMessage(order) })),
}));
if (out.Failed?.length) throw new Error(`SendMessageBatch: ${JSON.stringify(out.Failed)}`);
