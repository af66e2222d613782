#!/usr/bin/python3
"""counter.py: a local HTTP server that counts the webhook calls of the
second SQS job (notify_shipment), for its sign-off run (signoff.py).

    counter.py serve LOG [--port-file FILE]   # until SIGTERM
    counter.py count LOG KEY                  # prints a number

serve: HTTP on 127.0.0.1 (a free port, written to --port-file once it
listens; the standard library's http.server). Every POST is one line
appended to LOG and fsync'd before the server answers 201, so a call the
sender saw accepted is counted:

    <time>\t<Idempotency-Key header>\t<path>\t<body>

A POST without an Idempotency-Key header is answered 400 and not counted;
any other method 405.

count: the number of lines of LOG whose key is exactly KEY (0 when LOG does
not exist yet): the job file's `effects` command.
"""
import argparse
import datetime
import http.server
import os
import signal
import sys
import threading


def count(log, key):
    try:
        with open(log, encoding="utf-8") as f:
            return sum(1 for line in f if line.split("\t")[1:2] == [key])
    except FileNotFoundError:
        return 0


class Handler(http.server.BaseHTTPRequestHandler):
    lock = threading.Lock()
    log_path = None

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        key = self.headers.get("Idempotency-Key") or ""
        if not key or "\t" in key or "\n" in key:
            self.send_error(400, "an Idempotency-Key header (one line, no tab) is needed")
            return
        line = "\t".join([datetime.datetime.now().isoformat(), key, self.path,
                          body.decode("utf-8", "replace").replace("\t", " ").replace("\n", " ")]) + "\n"
        with self.lock:
            fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line.encode())
                os.fsync(fd)
            finally:
                os.close(fd)
        self.send_response(201)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self):
        self.send_error(405)

    def log_message(self, fmt, *args):
        sys.stderr.write("counter: " + (fmt % args) + "\n")


def serve(log, port_file):
    Handler.log_path = log
    open(log, "a").close()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    port = server.server_address[1]
    if port_file:
        with open(port_file + ".tmp", "w") as f:
            f.write(f"{port}\n")
        os.rename(port_file + ".tmp", port_file)
    print(f"counter on 127.0.0.1:{port}, log {log}", flush=True)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: threading.Thread(target=server.shutdown).start())
    server.serve_forever()
    server.server_close()


def main(argv=None):
    ap = argparse.ArgumentParser(description="a counting HTTP server")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("log")
    s.add_argument("--port-file")
    c = sub.add_parser("count")
    c.add_argument("log")
    c.add_argument("key")
    args = ap.parse_args(argv)
    if args.cmd == "count":
        print(count(args.log, args.key))
    else:
        serve(args.log, args.port_file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
