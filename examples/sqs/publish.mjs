// publish.mjs: send the send_confirmation message of an order.
//   node publish.mjs ORD-1001 [copies [email]] [--email ADDR]
// email (or --email ADDR): another payload under the same key (the order's
// default address otherwise, orders.mjs)
import { parseArgs } from 'node:util';
import { SendMessageCommand } from '@aws-sdk/client-sqs';
import { sqs, queueUrl } from './sqs-client.mjs';
import { confirmationMessage } from './orders.mjs';

const { values, positionals } = parseArgs({ options: { email: { type: 'string' } }, allowPositionals: true });
const [order, copies = '1', email = values.email] = positionals;
if (!order || positionals.length > 3 || !(Number(copies) >= 1)) {
  console.error('usage: node publish.mjs ORDER [copies [email]] [--email ADDR]');
  process.exit(2);
}
if (!queueUrl) {
  console.error('publish.mjs: QUEUE_URL is not set');
  process.exit(2);
}
for (let i = 0; i < Number(copies); i++) {   // copies: a duplicate publish, byte for byte
  await sqs.send(new SendMessageCommand({ QueueUrl: queueUrl, MessageBody: confirmationMessage(order, email) }));
}
