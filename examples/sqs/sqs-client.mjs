// sqs-client.mjs: the SQS client of the example. With $SQS_ENDPOINT set
// (the local fauxqs of broker.mjs) it talks to that with dummy credentials;
// unset, it is a plain client for real AWS.
import { SQSClient } from '@aws-sdk/client-sqs';

export const queueUrl = process.env.QUEUE_URL;
export const sqs = process.env.SQS_ENDPOINT
  ? new SQSClient({ endpoint: process.env.SQS_ENDPOINT, region: process.env.AWS_REGION ?? 'us-east-1',
                    credentials: { accessKeyId: 'local', secretAccessKey: 'local' } })
  : new SQSClient({});
