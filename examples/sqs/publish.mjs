// publish.mjs: send the send_confirmation message of an order.
//   node publish.mjs ORD-1001 [copies [email]]   (email: another payload, same key)
import { SendMessageCommand } from '@aws-sdk/client-sqs';
import { sqs, queueUrl } from './sqs-client.mjs';
import { confirmationMessage } from './orders.mjs';

const [order, copies = '1', email] = process.argv.slice(2);
for (let i = 0; i < Number(copies); i++) {   // copies: a duplicate publish, byte for byte
  await sqs.send(new SendMessageCommand({ QueueUrl: queueUrl, MessageBody: confirmationMessage(order, email) }));
}
