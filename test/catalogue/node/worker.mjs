// worker.mjs: the catalogue's refund job in Node.js (test/catalogue/README.md):
// one worker process on the directory queue of test/signoff/dirqueue.py (the
// same files: a message is a JSON file taken by rename), written with
// pg-idempotency's plain functions and sign-off points. The same job as
// ../python/worker.py, mutation for mutation: CATALOGUE_MUTATION picks one
// change of the correct job, CATALOGUE_KEY the operation key (run, prefix,
// hash); with IDEMPOTENCY_SIGNOFF_HTTP the refund is a POST to the provider.
//
//   node node/worker.mjs     (helpers/node's packages installed: npm ci there)
import { createHash } from 'node:crypto';
import fs from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { Heartbeat, KnownFailure, claim, claimErrorHeals, complete, fingerprintOf, isBusy, release,
         signoff } from '../../../helpers/node/index.mjs';
import { put, spool, take } from './dirqueue.mjs';

const helper = fileURLToPath(new URL('../../../helpers/node/index.mjs', import.meta.url));
const pg = createRequire(helper)('pg');   // helpers/node's own pg

const JOB = 'catalogue_refund';
const MUTATION = process.env.CATALOGUE_MUTATION || 'correct';
const KEY_MODE = process.env.CATALOGUE_KEY || 'run';
const HTTP = process.env.IDEMPOTENCY_SIGNOFF_HTTP || null;
const so = signoff();
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const log = (msg) => process.stderr.write(`${new Date().toISOString().slice(11, 23)} refund worker ${process.pid}: ${msg}\n`);

class ProviderRefused extends Error {}

async function refund(dir, runKey, opKey, attempt) {
  if (!HTTP) {
    const fd = fs.openSync(path.join(dir, 'effects'), 'a', 0o644);
    fs.writeSync(fd, `${runKey} ${attempt} ${process.pid}\n`);
    fs.fsyncSync(fd);
    fs.closeSync(fd);
    return { refunded: true };
  }
  let headers = { 'content-type': 'application/json', 'idempotency-key': opKey };
  for (let tries = 1; ; tries++) {
    let res;
    try {
      res = await fetch(`${HTTP}/refunds/${encodeURIComponent(opKey)}`, {
        method: 'POST',
        headers,
        body: '{"amount_cents": 1250}',
        ...(MUTATION === 'no-timeout' ? {} : { signal: AbortSignal.timeout(5000) }),
      });
    } catch (err) {
      if (MUTATION === 'swallow-errors') return { status: null };
      if (err.cause?.code === 'ECONNREFUSED') throw new KnownFailure(`provider unreachable: ${err.cause.message}`);
      if (MUTATION === 'retry-without-key' && tries === 1) {   // once more inside the handler, the header left out
        headers = { 'content-type': 'application/json' };
        continue;
      }
      throw err;                                   // a timeout: the outcome is unknown
    }
    if (res.ok) return { status: res.status };
    if (MUTATION === 'retry-without-key' && tries === 1 && res.status !== 422) {
      headers = { 'content-type': 'application/json' };
      continue;
    }
    if (MUTATION === 'retry-forever') { await sleep(200); continue; }   // every error transient
    if (MUTATION === 'swallow-errors') { log(`${opKey}: provider answered ${res.status} (ignored)`); return { status: res.status }; }
    if (res.status >= 400 && res.status < 500 && ![408, 429].includes(res.status)) {
      throw new ProviderRefused(`provider answered ${res.status}`);
    }
    throw new KnownFailure(`provider answered ${res.status}`);
  }
}

// the lookup policy's question (verdict verify): was the refund made? (the
// provider's own record; here the effects file)
function refunded(dir, runKey) {
  try {
    return fs.readFileSync(path.join(dir, 'effects'), 'utf8').split('\n').some((l) => l.split(' ')[0] === runKey);
  } catch {
    return false;
  }
}

function operationKey(runKey, file, message) {
  if (MUTATION === 'message-id') return `msg-${path.basename(file)}`;
  if (MUTATION === 'key-retries' && message.retries > 0) return `${runKey}:${message.retries}`;   // the queue's retry count in the key
  if (KEY_MODE === 'prefix') return `refund:${runKey}`;
  if (KEY_MODE === 'hash') return createHash('sha256').update(`refund:${runKey}`).digest('hex').slice(0, 16);
  return runKey;
}

const sorted = (o) => Object.fromEntries(Object.entries(o).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)));

async function handle(pool, dir, file, message, lease) {
  const runKey = message.key;
  const args = { ...message.args };
  if (MUTATION === 'args-differ') args.received_at = Date.now() / 1000;
  if (message.copy === 'unclaimed') {          // the job's own follow-up: no claim at all
    await refund(dir, runKey, runKey, 0);
    fs.unlinkSync(file);
    return;
  }
  const key = message.copy === 'new-key' ? `${runKey}:again` : operationKey(runKey, file, message);
  const done = () => fs.unlinkSync(file);
  // the queue's own retry of the message: its retry count one more
  const again = (delay) => { put(dir, { ...message, retries: (message.retries || 0) + 1 }, delay); fs.unlinkSync(file); };

  if (MUTATION === 'effect-before-claim') await refund(dir, runKey, key, 0);
  let c;
  try {
    c = await claim(pool, JOB, key, { fingerprint: fingerprintOf(JSON.stringify(sorted(args))) });
  } catch (err) {
    if (isBusy(err)) return again(lease);
    if (!claimErrorHeals(err)) { log(`${key}: refused (${err.code}): ${err.message}`); return done(); }
    log(`${key}: claim failed, again in 1 s: ${err.message}`);
    return again(1);
  }
  if (!c.runs) {                               // claim() reported the point judged
    log(`${key}: ${c.verdict} #${c.attempt}`);
    if (MUTATION === 'ignore-verdict') await refund(dir, runKey, key, c.attempt);
    return c.verdict === 'in_progress' ? again(lease) : done();
  }
  const point = (p) => so.point(p, { job_type: so.jobType(JOB), key, attempt: c.attempt, verdict: c.verdict,
                                     heartbeat: true });
  const beat = new Heartbeat(pool, JOB, key, c.attempt, lease / 4).start();
  let value;
  try {
    if (await point('claimed') === 'fail') {
      await beat.stop();
      await release(pool, JOB, key, c.attempt);
      log(`${key}: known failure: released attempt ${c.attempt}`);
      return done();
    }
    if (MUTATION === 'complete-first') {
      await beat.stop();
      await complete(pool, JOB, key, c.attempt, { pid: process.pid });
      await point('handled');
      await refund(dir, runKey, key, c.attempt);
      return done();
    }
    try {
      if (MUTATION === 'effect-before-claim') value = { refunded: 'before the claim' };
      else if (c.verdict === 'verify' && refunded(dir, runKey)) value = { found: true };   // lookup: look first
      else {
        try {
          value = await refund(dir, runKey, key, c.attempt);
        } catch (err) {
          // an ensure block: completed, the call failed or not
          if (MUTATION === 'complete-on-failure') await complete(pool, JOB, key, c.attempt, { tried: true });
          throw err;
        }
      }
    } catch (err) {
      if (err instanceof ProviderRefused) {       // refused for good: the operation ends
        value = { refused: err.message };
      } else if (err instanceof KnownFailure) {   // certainly not refunded: released, retried
        await beat.stop();
        await release(pool, JOB, key, c.attempt);
        log(`${key}: ${err.message}: released attempt ${c.attempt}, again in 1 s`);
        return again(1);
      } else {
        throw err;
      }
    }
  } finally {
    await beat.stop();
  }
  await point('handled');
  if (MUTATION === 'reschedule-unclaimed' && !message.copy) put(dir, { ...message, copy: 'unclaimed' }, 1);
  if (MUTATION === 'reschedule-new-key' && !message.copy) put(dir, { ...message, copy: 'new-key' }, 1);
  try {
    await complete(pool, JOB, key, c.attempt, value);
    log(`${key}: ${c.verdict} #${c.attempt} completed`);
  } catch (err) {
    if (err.code !== 'ID003') throw err;
    log(`${key}: attempt ${c.attempt} taken over (ID003)`);
  }
  return done();
}

let stopping = false;
process.on('SIGTERM', () => { stopping = true; });
const dir = spool(log);
const mine = path.join(dir, 'processing', String(process.pid));
fs.mkdirSync(mine, { recursive: true });
fs.writeFileSync(path.join(dir, 'pids', String(process.pid)), `${process.pid}\n`);
const lease = so.lease() ?? 30;
const pool = new pg.Pool({ max: 3, ...(process.env.IDEMPOTENCY_SIGNOFF_DSN ? { connectionString: process.env.IDEMPOTENCY_SIGNOFF_DSN } : {}) });
pool.on('error', (err) => log(`pg pool: ${err.message}`));
log(`started (mutation ${MUTATION}, key ${KEY_MODE}); lease ${lease} s`);
while (!stopping) {
  const taken = take(dir, mine);
  if (taken === null) { await sleep(20); continue; }
  try {
    await handle(pool, dir, ...taken, lease);
  } catch (err) {                              // a failed job: logged, its message dropped
    log(`${taken[1].key} failed: ${err.stack ?? err}`);
    if (fs.existsSync(taken[0])) fs.unlinkSync(taken[0]);
  }
}
await pool.end().catch(() => {});
log('stopped (SIGTERM)');
