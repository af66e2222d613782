// worker.mjs [--batch N]: the catalogue's refund job in Node.js on the wrapper
// instead of the plain functions (test/catalogue/README.md): a handler behind
// pg-idempotency's idempotent() (sqs-consumer's handleMessage) or, with
// --batch N, idempotentBatch() (handleMessageBatch, up to N messages a
// receive), called as sqs-consumer calls them, with SQS messages (MessageId,
// ReceiptHandle, Body, Attributes) made from the directory queue of
// test/signoff/dirqueue.py. No SQS: the client the wrapper is given records
// its ChangeMessageVisibility(Batch) calls, and a message the wrapper did not
// return (delete) comes back into the directory queue after the visibility it
// set (in_progress: the lease; released: its backoff), as SQS makes it
// visible again. A message neither deleted nor postponed (its handler threw:
// ID002, other arguments under the key) goes to the dead-letter directory at
// once, where SQS would show it again after the queue's visibility timeout,
// until its redrive policy's maxReceiveCount.
//
//   node sqs/worker.mjs [--batch 10]     (helpers/node's packages installed: npm ci there)
import { randomUUID } from 'node:crypto';
import fs from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { KnownFailure, PermanentFailure, idempotent, idempotentBatch, signoff } from '../../../helpers/node/index.mjs';
import { put, spool, take } from '../node/dirqueue.mjs';

const helper = fileURLToPath(new URL('../../../helpers/node/index.mjs', import.meta.url));
const pg = createRequire(helper)('pg');   // helpers/node's own pg

const JOB = 'catalogue_refund';
const QUEUE_URL = 'http://sqs.catalogue.invalid/000000000000/refunds';
const at = process.argv.indexOf('--batch');
const BATCH = at > 0 ? Number(process.argv[at + 1]) : 0;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const log = (msg) => process.stderr.write(`${new Date().toISOString().slice(11, 23)} refund worker ${process.pid}: ${msg}\n`);

const dir = spool(log);
const mine = path.join(dir, 'processing', String(process.pid));
fs.mkdirSync(mine, { recursive: true });
fs.mkdirSync(path.join(dir, 'dead'), { recursive: true });
fs.writeFileSync(path.join(dir, 'pids', String(process.pid)), `${process.pid}\n`);

// the refund (the effect: a fsync'd line in the spool's effects file)
function refund(runKey, attempt) {
  const fd = fs.openSync(path.join(dir, 'effects'), 'a', 0o644);
  fs.writeSync(fd, `${runKey} ${attempt} ${process.pid}\n`);
  fs.fsyncSync(fd);
  fs.closeSync(fd);
  return { refunded: true };
}

// lookup (verdict verify): the provider's own record first, here the effects file
function refunded(runKey) {
  try {
    return fs.readFileSync(path.join(dir, 'effects'), 'utf8').split('\n').some((l) => l.split(' ')[0] === runKey);
  } catch {
    return false;
  }
}

// with IDEMPOTENCY_SIGNOFF_HTTP (effect = http) the refund is a POST to the
// provider, whose answers the handler tells apart as docs/signoff.md says:
// 503 or a refused connection a KnownFailure, 422 a PermanentFailure (the
// operation ends, the message is not deleted: here the dead-letter
// directory), no answer within 5 s an unknown outcome (thrown)
const HTTP = process.env.IDEMPOTENCY_SIGNOFF_HTTP || null;
async function refundAt(opKey) {
  let res;
  try {
    res = await fetch(`${HTTP}/refunds/${encodeURIComponent(opKey)}`, {
      method: 'POST', headers: { 'Idempotency-Key': opKey, 'Content-Type': 'application/json' },
      body: '{"amount_cents": 1250}', signal: AbortSignal.timeout(5000) });
  } catch (err) {
    if (err.cause?.code === 'ECONNREFUSED') throw new KnownFailure(`provider unreachable: ${err.cause.message}`);
    throw err;
  }
  await res.text();
  if (res.ok) return { status: res.status };
  if (res.status === 422) throw new PermanentFailure(`provider answered ${res.status}`);
  throw new KnownFailure(`provider answered ${res.status}`);
}

// the handler, as an sqs-consumer application writes it for the wrapper
const handler = async (payload, ctx) => {
  if (ctx.verify && refunded(payload.key)) return { found: true };
  return HTTP ? refundAt(ctx.key) : refund(payload.key, ctx.attempt);
};

// the SQS client the wrapper is given: what it asks of the queue
const visibility = new Map();   // ReceiptHandle -> seconds until the message is seen again
const sqs = {
  async send(command) {
    const input = command.input ?? {};
    for (const e of input.Entries ?? [input]) {
      if (e.ReceiptHandle !== undefined) visibility.set(e.ReceiptHandle, Number(e.VisibilityTimeout));
    }
    return {};
  },
};

const so = signoff();
const pool = new pg.Pool({ max: 3, ...(process.env.IDEMPOTENCY_SIGNOFF_DSN ? { connectionString: process.env.IDEMPOTENCY_SIGNOFF_DSN } : {}) });
pool.on('error', (err) => log(`pg pool: ${err.message}`));
const opts = { pool, sqs, queueUrl: QUEUE_URL, jobType: JOB, key: (payload) => payload.key,
               onVerdict: (e) => log(`${e.key}: ${e.verdict} #${e.attempt} -> ${e.action}`) };
const handle = BATCH ? idempotentBatch(handler, opts) : idempotent(handler, opts);

// an SQS message for a taken file: the body the same for every copy of it
const sqsMessage = ([file, message]) => ({
  MessageId: randomUUID(), ReceiptHandle: `${path.basename(file)}#${randomUUID()}`,
  Body: JSON.stringify({ key: message.key, args: message.args }),
  Attributes: { ApproximateReceiveCount: String((message.receives ?? 0) + 1) },
  taken: [file, message],
});

// after the handler: deleted, visible again after its visibility, or dead-lettered
function settle(messages, deleted) {
  for (const m of messages) {
    const [file, message] = m.taken;
    if (!deleted.has(m) && visibility.has(m.ReceiptHandle)) {
      put(dir, { ...message, receives: (message.receives ?? 0) + 1 }, visibility.get(m.ReceiptHandle));
    } else if (!deleted.has(m)) {
      fs.renameSync(file, path.join(dir, 'dead', path.basename(file)));
      continue;
    }
    visibility.delete(m.ReceiptHandle);
    fs.unlinkSync(file);
  }
}

let stopping = false;
process.on('SIGTERM', () => { stopping = true; });   // the receive in hand is finished
log(`started (${BATCH ? `idempotentBatch, up to ${BATCH} a receive` : 'idempotent'}); lease ${so.lease() ?? '-'} s`);
while (!stopping) {
  const first = take(dir, mine);
  if (first === null) { await sleep(20); continue; }
  const messages = [sqsMessage(first)];
  while (BATCH && messages.length < BATCH) {
    const more = take(dir, mine);
    if (more === null) break;
    messages.push(sqsMessage(more));
  }
  let deleted = new Set();
  try {
    const done = BATCH ? await handle(messages) : [await handle(messages[0])];
    deleted = new Set(done.filter(Boolean));
  } catch (err) {                             // not deleted: its visibility decides
    log(`${messages.map((m) => m.taken[1].key).join(', ')}: ${err.code ?? ''} ${err.message}`);
  }
  settle(messages, deleted);
}
await pool.end().catch(() => {});
log('stopped (SIGTERM)');
