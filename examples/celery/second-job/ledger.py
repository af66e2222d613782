#!/usr/bin/python3
"""ledger.py: a local HTTP server that stands in for a payment ledger and
counts the payments posted to it, by key (the second Celery job's effect).

    ledger.py serve LOG [--port-file FILE]   # until SIGTERM
    ledger.py count LOG KEY                  # prints a number

serve: an HTTP server on 127.0.0.1 (a free port, written to --port-file once
it listens). Every POST is one line appended to LOG and fsync'd before the
server answers 201, so a post the client saw accepted is counted:

    <time>\t<operation key>\t<path>\t<body>

The key is the request's X-Operation-Key header. count: the number of lines
of LOG whose key is exactly KEY (0 when LOG does not exist yet).
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


def serve(log, port_file):
    lock = threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            key = self.headers.get("X-Operation-Key")
            if not key:
                self.send_error(400, "no X-Operation-Key header")
                return
            line = "\t".join([datetime.datetime.now().isoformat(), key.replace("\t", " "),
                              self.path, body.decode("utf-8", "replace").replace("\t", " ")
                              .replace("\n", " ")]) + "\n"
            with lock:
                fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                try:
                    os.write(fd, line.encode())
                    os.fsync(fd)
                finally:
                    os.close(fd)
            self.send_response(201)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, fmt, *args):
            pass

    open(log, "a").close()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    port = server.server_address[1]
    if port_file:
        with open(port_file + ".tmp", "w") as f:
            f.write(f"{port}\n")
        os.rename(port_file + ".tmp", port_file)
    print(f"ledger on 127.0.0.1:{port}, log {log}", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    server.serve_forever()
    server.server_close()


def main(argv=None):
    ap = argparse.ArgumentParser(description="a counting HTTP ledger")
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
