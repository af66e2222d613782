// queue-state.mjs [purge]: print the message counts of $QUEUE_URL
// ("visible N in-flight N delayed N"); with `purge`, PurgeQueue first (it
// removes in-flight messages too: a killed consumer's message is then gone
// for good). The end-to-end test uses it to lose a message (case 12) and to
// see that a refused message was not deleted (case 14).
import { GetQueueAttributesCommand, PurgeQueueCommand } from '@aws-sdk/client-sqs';
import { sqs, queueUrl } from './sqs-client.mjs';

if (process.argv[2] === 'purge') await sqs.send(new PurgeQueueCommand({ QueueUrl: queueUrl }));
const { Attributes: a } = await sqs.send(new GetQueueAttributesCommand({
  QueueUrl: queueUrl,
  AttributeNames: ['ApproximateNumberOfMessages', 'ApproximateNumberOfMessagesNotVisible',
                   'ApproximateNumberOfMessagesDelayed'],
}));
console.log(`visible ${a.ApproximateNumberOfMessages} in-flight ${a.ApproximateNumberOfMessagesNotVisible} ` +
            `delayed ${a.ApproximateNumberOfMessagesDelayed}`);
