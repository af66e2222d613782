// smtp.mjs: a minimal SMTP client on node:net (no npm package): one message
// per connection, EHLO, MAIL FROM, RCPT TO, DATA, QUIT, each reply's code
// checked. Enough for a local sink or relay on a trusted network: no TLS,
// no AUTH, no pipelining, ASCII headers.
//
//   await smtpSend({ host, port, from, to, headers: { Subject: ..., ... }, body })
//
// Resolves once the server answered 250 to the message's end (the message
// is accepted). Throws SmtpError with `sent: false` when the server
// refused (a 4xx/5xx reply to EHLO, MAIL, RCPT, DATA or to the message's
// end: `code` is the reply's code) or before the message's end was written
// (a refused connection: `code` null): certainly not sent; and with `sent:
// null` when it failed after the message's end without a reply (no reply
// within `timeoutMs`, `timedOut` true, or a lost connection: the server may
// have taken it). A failed QUIT after the 250 is ignored.
import net from 'node:net';
import { hostname } from 'node:os';

export class SmtpError extends Error {
  constructor(message, sent, code = null, timedOut = false) {
    super(message);
    this.sent = sent;          // false: certainly not sent; null: unknown
    this.code = code;          // the refusing reply's code (451, 550 ...), else null
    this.timedOut = timedOut;  // no reply within timeoutMs
  }
}

// header values and addresses go on one line each
function oneLine(what, value) {
  const s = String(value);
  if (/[\r\n]/.test(s)) throw new SmtpError(`${what} contains a line break: ${JSON.stringify(s)}`, false);
  return s;
}

// the message's text: headers, a blank line, the body with CRLF line ends
// and dot-stuffing (RFC 5321 4.5.2), then the terminating "."
function dataOf(headers, body) {
  const head = Object.entries(headers).map(([k, v]) => `${oneLine('header', k)}: ${oneLine(k, v)}`);
  const lines = String(body).replace(/\r\n/g, '\n').split('\n').map((l) => (l.startsWith('.') ? `.${l}` : l));
  return `${head.join('\r\n')}\r\n\r\n${lines.join('\r\n')}\r\n.\r\n`;
}

export function smtpSend({ host = '127.0.0.1', port = 25, from, to, headers = {}, body = '',
                           timeoutMs = 30_000, helo = hostname() }) {
  return new Promise((resolve, reject) => {
    let data;
    try {
      data = dataOf({ From: from, To: to, Date: new Date().toUTCString(), ...headers }, body);
      oneLine('from', from);
      oneLine('to', to);
    } catch (err) {
      reject(err);
      return;
    }
    // the dialogue: [command (null: the greeting), the reply codes that go on]
    const steps = [
      [null, [220]],
      [`EHLO ${helo}`, [250]],
      [`MAIL FROM:<${from}>`, [250]],
      [`RCPT TO:<${to}>`, [250, 251]],
      ['DATA', [354]],
      [data, [250]],   // the message and its terminating "."
      ['QUIT', [221]],
    ];
    let step = 0;
    let ended = false;     // the message's end was written
    let accepted = false;  // 250 to it
    let buf = '';
    const sock = net.createConnection({ host, port: Number(port) });
    sock.setEncoding('latin1');
    sock.setTimeout(timeoutMs);
    // code: the server's refusal (certainly not sent, even after the
    // message's end: only 250 takes it); none: no reply, sent or not
    const fail = (text, code = null, timedOut = false) => {
      if (accepted) return sock.destroy();   // QUIT's trouble: the message was taken
      sock.destroy();
      reject(new SmtpError(`smtp ${host}:${port}: ${text}`, ended && code === null ? null : false, code, timedOut));
    };
    const next = () => {
      step += 1;
      if (step === steps.length) {
        sock.end();
        return;
      }
      if (step === 5) ended = true;   // the message's end goes out now
      sock.write(step === 5 ? steps[step][0] : `${steps[step][0]}\r\n`);
    };
    sock.on('data', (chunk) => {
      buf += chunk;
      // a reply is one or more lines "250-..." ended by "250 ..."
      for (;;) {
        const m = /^(\d{3})([ -])([^\r\n]*)\r?\n/.exec(buf);
        if (!m) {
          if (buf.length > 64 * 1024 || (buf.includes('\n') && !/^\d{3}[ -]/.test(buf))) {
            fail(`malformed reply ${JSON.stringify(buf.slice(0, 80))}`);
          }
          return;
        }
        buf = buf.slice(m[0].length);
        if (m[2] === '-') continue;
        const code = Number(m[1]);
        const [command, ok] = steps[step];
        if (!ok.includes(code)) {
          const what = command === null ? 'greeting' : step === 5 ? 'the message' : command.split(' ')[0];
          fail(`${what}: ${m[1]} ${m[3]}`, code);
          return;
        }
        if (step === 5) {
          accepted = true;
          resolve({ reply: `${m[1]} ${m[3]}` });
        }
        next();
      }
    });
    sock.on('timeout', () => fail(`no reply in ${timeoutMs} ms`, null, true));
    sock.on('error', (err) => fail(err.message));
    sock.on('close', () => {
      if (!accepted) fail('connection closed');
    });
  });
}
