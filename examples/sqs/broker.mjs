// broker.mjs: a local SQS (fauxqs 2.4) on 127.0.0.1 and a random free port,
// for the example and its test; there is no AWS here. fauxqs's own CLI and
// startFauxqs() listen on 0.0.0.0, so this builds its app and binds it to
// loopback itself. Creates the queue $QUEUE_NAME (default
// send_confirmation), prints one line "QUEUE_URL=... SQS_ENDPOINT=..." and
// runs until SIGTERM/SIGINT. On Node.js 22 it prints an ExperimentalWarning
// for node:sqlite on stderr (fauxqs 2 loads it for its optional persistence,
// unused here); 24 does not.
import { buildApp } from 'fauxqs';
import { SQSClient, CreateQueueCommand } from '@aws-sdk/client-sqs';

const app = buildApp({ logger: false });
const address = await app.listen({ host: '127.0.0.1', port: Number(process.env.SQS_PORT ?? 0) });
const sqs = new SQSClient({ endpoint: address, region: 'us-east-1',
                            credentials: { accessKeyId: 'x', secretAccessKey: 'x' } });
const { QueueUrl } = await sqs.send(new CreateQueueCommand({
  QueueName: process.env.QUEUE_NAME ?? 'send_confirmation',
  Attributes: { VisibilityTimeout: process.env.VISIBILITY_TIMEOUT ?? '30' },
}));
console.log(`QUEUE_URL=${QueueUrl} SQS_ENDPOINT=${address}`);
for (const sig of ['SIGTERM', 'SIGINT']) {
  process.on(sig, () => app.close().finally(() => process.exit(0)));
}
