#!/usr/bin/python3
"""sink.py: the receiving end of the example jobs' effects, counting them by
key, for the sign-off runs of the examples (examples/e2e/signoff.py).

    sink.py serve smtp LOG [--port-file FILE]   # until SIGTERM
    sink.py serve http LOG [--port-file FILE]
    sink.py count LOG KEY                       # prints a number

serve smtp: an SMTP server on 127.0.0.1 (Debian's python3-aiosmtpd), for
the email jobs. The key of a message is its X-Operation-Key header (the
example mail providers set it to the job's key), else its Subject.
serve http: an HTTP server on 127.0.0.1 (the standard library), for jobs
whose effect is an HTTP call (a webhook, a ledger): every POST, to any path,
is an effect; its key is the request's Idempotency-Key header (else 400,
and nothing is counted).

Both listen on a free port, written to --port-file once they listen. Every
effect is one line appended to LOG and fsync'd before the server answers
(250, or 201), so an effect the sender saw accepted is counted:

    <time>\t<key>\t<recipients or path>\t<subject or body>

count: the number of lines of LOG whose key is exactly KEY (0 when LOG does
not exist yet). It is the sign-off job files' `effects` command.
"""
import argparse
import datetime
import os
import signal
import socket
import sys
import threading

_lock = threading.Lock()


def keys(log):
    """the key of each effect in log (none while there is no log)"""
    try:
        with open(log, encoding="utf-8") as f:
            return [line.split("\t")[1] for line in f if "\t" in line]
    except FileNotFoundError:
        return []


def count(log, key):
    return keys(log).count(key)


def record(log, *fields):
    """append one effect, fsync'd, before the server answers"""
    line = "\t".join([datetime.datetime.now().isoformat()] +
                     [f.replace("\t", " ").replace("\r", " ").replace("\n", " ") for f in fields]) + "\n"
    with _lock:
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)


class SmtpHandler:
    def __init__(self, log):
        self.log = log

    async def handle_DATA(self, server, session, envelope):
        import email
        import email.policy
        msg = email.message_from_bytes(envelope.content, policy=email.policy.default)
        key = str(msg.get("X-Operation-Key") or msg.get("Subject") or "")
        record(self.log, key, ",".join(envelope.rcpt_tos), str(msg.get("Subject") or ""))
        return "250 OK"


def smtp_server(log):
    """(port, stop)"""
    from aiosmtpd.controller import Controller
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    controller = Controller(SmtpHandler(log), hostname="127.0.0.1", port=port)
    controller.start()
    return port, controller.stop


def http_server(log):
    """(port, stop)"""
    import http.server

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            key = self.headers.get("Idempotency-Key")
            if not key:
                self.send_error(400, "no Idempotency-Key header")
                return
            record(log, key, self.path, body.decode("utf-8", "replace"))
            self.send_response(201)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, fmt, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    def stop():
        server.shutdown()
        server.server_close()
    return server.server_address[1], stop


def serve(kind, log, port_file):
    open(log, "a").close()
    port, stop_server = (smtp_server if kind == "smtp" else http_server)(log)
    if port_file:
        with open(port_file + ".tmp", "w") as f:
            f.write(f"{port}\n")
        os.rename(port_file + ".tmp", port_file)
    print(f"{kind} sink on 127.0.0.1:{port}, log {log}", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    stop_server()


def main(argv=None):
    ap = argparse.ArgumentParser(description="a counting SMTP or HTTP sink")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("kind", choices=["smtp", "http"])
    s.add_argument("log")
    s.add_argument("--port-file")
    c = sub.add_parser("count")
    c.add_argument("log")
    c.add_argument("key")
    args = ap.parse_args(argv)
    if args.cmd == "count":
        print(count(args.log, args.key))
    else:
        serve(args.kind, args.log, args.port_file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
