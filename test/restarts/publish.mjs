// test/restarts/publish.mjs: a publisher for test/restarts/run.py that stays
// up for the whole run (one node process instead of one per message). Reads
// lines "ORDER COPIES" on stdin and sends the message of each order COPIES
// times, byte for byte what examples/sqs/publish.mjs sends (orders.mjs), to
// $QUEUE_URL at $SQS_ENDPOINT; answers "ok" per line.
//
// The SQS client is built as examples/sqs/sqs-client.mjs builds it, with the
// AWS SDK of examples/sqs/node_modules (this file lives outside that tree).
import { createRequire } from 'node:module';
import { createInterface } from 'node:readline';

const sqsDir = new URL('../../examples/sqs/', import.meta.url);
const { confirmationMessage } = await import(new URL('orders.mjs', sqsDir).href);
const require = createRequire(new URL('package.json', sqsDir));
const { SQSClient, SendMessageCommand } = require('@aws-sdk/client-sqs');

const queueUrl = process.env.QUEUE_URL;
const sqs = new SQSClient({ endpoint: process.env.SQS_ENDPOINT, region: process.env.AWS_REGION ?? 'us-east-1',
                            credentials: { accessKeyId: 'local', secretAccessKey: 'local' } });

for await (const line of createInterface({ input: process.stdin })) {
  const [order, copies = '1'] = line.trim().split(/\s+/);
  for (let i = 0; i < Number(copies); i++) {
    await sqs.send(new SendMessageCommand({ QueueUrl: queueUrl, MessageBody: confirmationMessage(order) }));
  }
  process.stdout.write('ok\n');
}
