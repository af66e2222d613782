// mail-provider.mjs: the mail provider, outside the database. With
// $SMTP_PORT set, every email is sent through SMTP to $SMTP_HOST (default
// 127.0.0.1) with the header `X-Operation-Key: <the job's key>` (smtp.mjs);
// the server's 250 to the message means sent (the sign-off run's SMTP
// endpoint counts them by that header). A refusal for now (a 4xx reply,
// 451: try again later) or a refused connection is Refused: certainly not
// sent. A refusal for good (a 5xx reply, 550: no such mailbox) is
// RefusedForGood: not sent, and a retry would be refused again. No reply
// within $SMTP_TIMEOUT seconds (default 30) after the message, or a lost
// connection, is an SmtpError with sent: null: the server may have taken
// it. Without $SMTP_PORT (the
// end-to-end test), every email is one line appended to $MAIL_LOG and
// fsync'd before send() returns. Either way an email that "left" cannot be
// rolled back, and like the seed's provider it takes no reference and
// cannot be searched.
//
// Test hook (only when $E2E_DIR is set): the end-to-end test makes a worker
// stop exactly before or after an email by creating the FIFO
// $E2E_DIR/pause-<key>-<before|after>. The first worker to reach that point
// takes the FIFO (rename), writes $E2E_DIR/at-<key>-<point> with its pid and
// waits on the FIFO; the test then kill -9s it, or writes to the FIFO to let
// it go on. The test also makes the provider refuse the next email of a key
// (Refused, nothing is sent) by creating the file $E2E_DIR/refuse-<key>.
import { promises as fsp } from 'node:fs';
import { smtpSend } from './smtp.mjs';

/** The provider refused the request for now (say HTTP 429, SMTP 451) or
 * could not be reached: nothing was sent; a later try may succeed. */
export class Refused extends Error {}

/** The provider refused the request for good (SMTP 550): nothing was sent,
 * and sending it again would be refused again. */
export class RefusedForGood extends Error {}

async function refused(key) {
  const dir = process.env.E2E_DIR;
  if (!dir) return false;
  try {
    await fsp.rename(`${dir}/refuse-${key}`, `${dir}/refuse-${key}.taken-${process.pid}`);
    return true;
  } catch (err) {
    if (err.code === 'ENOENT') return false;
    throw err;
  }
}

async function checkpoint(key, point) {
  const dir = process.env.E2E_DIR;
  if (!dir) return;
  const fifo = `${dir}/pause-${key}-${point}`;
  const taken = `${fifo}.taken-${process.pid}`;
  try {
    await fsp.rename(fifo, taken);
  } catch (err) {
    if (err.code === 'ENOENT') return;   // no pause here, or another worker took it
    throw err;
  }
  await fsp.writeFile(`${dir}/at-${key}-${point}`, `${process.pid}\n`);
  const fh = await fsp.open(taken, 'r');  // blocks (in the thread pool) until the test writes
  await fh.readFile();
  await fh.close();
}

export async function sendEmail({ to, subject, key }) {
  if (await refused(key)) throw new Refused(`429 too many requests: ${to} not sent`);
  await checkpoint(key, 'before');
  if (process.env.SMTP_PORT) {
    try {
      await smtpSend({
        host: process.env.SMTP_HOST || '127.0.0.1', port: process.env.SMTP_PORT,
        from: process.env.MAIL_FROM ?? 'shop@example.test', to,
        headers: { Subject: subject, 'X-Operation-Key': key },
        body: `Thank you for your order ${key}.\n`,
        // every reply: without it a server that takes the message and never
        // answers holds the worker (and its claim) for ever
        timeoutMs: Number(process.env.SMTP_TIMEOUT || 30) * 1000,
      });
    } catch (err) {
      if (err.sent === false && err.code >= 500) throw new RefusedForGood(err.message);
      if (err.sent === false) throw new Refused(err.message);
      throw err;   // the server may have taken it: uncertain
    }
  } else {
    const fh = await fsp.open(process.env.MAIL_LOG ?? 'outbox.log', 'a');
    try {
      await fh.write(`${new Date().toISOString()}\t${key}\t${to}\t${subject}\tpid ${process.pid}\n`);
      await fh.sync();
    } finally {
      await fh.close();
    }
  }
  await checkpoint(key, 'after');
  return { accepted: true };
}
