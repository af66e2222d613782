// create-queue.mjs NAME: create the queue NAME on $SQS_ENDPOINT (visibility
// timeout $VISIBILITY_TIMEOUT, default 30 s) and print its URL. The test uses
// it to give each policy a fresh queue, so that nothing a failed case left
// in a queue reaches the next policy's cases.
import { CreateQueueCommand } from '@aws-sdk/client-sqs';
import { sqs } from './sqs-client.mjs';

const { QueueUrl } = await sqs.send(new CreateQueueCommand({
  QueueName: process.argv[2],
  Attributes: { VisibilityTimeout: process.env.VISIBILITY_TIMEOUT ?? '30' },
}));
console.log(QueueUrl);
