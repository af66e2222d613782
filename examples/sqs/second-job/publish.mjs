// publish.mjs: send the notify_shipment message of a shipment.
//   node publish.mjs SHP-1 [--carrier NAME]   (another carrier: other arguments, same key)
import { parseArgs } from 'node:util';
import { SendMessageCommand } from '@aws-sdk/client-sqs';
import { sqs, queueUrl } from '../sqs-client.mjs';

const { values, positionals } = parseArgs({ options: { carrier: { type: 'string', default: 'parcel-co' } },
                                            allowPositionals: true });
if (positionals.length !== 1 || !queueUrl) {
  console.error('usage: QUEUE_URL=... node publish.mjs SHIPMENT [--carrier NAME]');
  process.exit(2);
}
await sqs.send(new SendMessageCommand({
  QueueUrl: queueUrl,
  MessageBody: JSON.stringify({ shipment: positionals[0], carrier: values.carrier }),
}));
