// dirqueue.mjs: the directory queue of test/signoff/dirqueue.py in Node.js
// (the same files: a message is a JSON file, written whole into tmp/ and
// renamed into queue/, taken by a rename into the worker's processing
// directory), for the catalogue's Node.js workers (worker.mjs on the plain
// functions, ../sqs/worker.mjs on the wrappers).
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';

/** the run's spool directory (made if missing); log(msg) says why it cannot be */
export function spool(log) {
  const base = process.env.SIGNOFF_TEST_DIR || process.env.TMPDIR || '/tmp';
  const run = process.env.IDEMPOTENCY_SIGNOFF_RUN;
  if (!run) { log('IDEMPOTENCY_SIGNOFF_RUN is not set'); process.exit(2); }
  const dir = path.join(base, `spool-${run}`);
  for (const d of ['queue', 'tmp', 'processing', 'pids']) fs.mkdirSync(path.join(dir, d), { recursive: true });
  return dir;
}

export function put(dir, message, delay = 0) {
  const { not_before: _, ...rest } = message;
  const name = `${String(BigInt(Date.now()) * 1000000n).padStart(20, '0')}-${process.pid}-${randomBytes(4).toString('hex')}.msg`;
  const tmp = path.join(dir, 'tmp', name);
  const fd = fs.openSync(tmp, 'w');
  fs.writeSync(fd, JSON.stringify({ ...rest, not_before: Date.now() / 1000 + delay }));
  fs.fsyncSync(fd);
  fs.closeSync(fd);
  fs.renameSync(tmp, path.join(dir, 'queue', name));
}

export function take(dir, mine) {
  const now = Date.now() / 1000;
  for (const name of fs.readdirSync(path.join(dir, 'queue')).sort()) {
    const src = path.join(dir, 'queue', name);
    let message;
    try { message = JSON.parse(fs.readFileSync(src, 'utf8')); } catch { continue; }
    if ((message.not_before ?? 0) > now) continue;
    const dst = path.join(mine, name);
    try { fs.renameSync(src, dst); } catch { continue; }
    return [dst, message];
  }
  return null;
}
