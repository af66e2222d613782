#!/usr/bin/python3
"""counter.py: a warehouse's HTTP endpoint that counts the calls it gets.

    counter.py serve LOG --port-file FILE   # 127.0.0.1, a free port, until SIGTERM
    counter.py count LOG KEY                # prints a number

serve: every POST is one line "<Idempotency-Key header>\\t<body>" appended to
LOG and fsync'd before the 200 answer. count: the lines of KEY."""
import http.server
import os
import signal
import sys
import threading


def count(log, key):
    try:
        with open(log, encoding="utf-8") as f:
            return sum(1 for line in f if line.split("\t", 1)[0] == key)
    except FileNotFoundError:
        return 0


def serve(log, port_file):
    class Handler(http.server.BaseHTTPRequestHandler):
        lock = threading.Lock()

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            key = (self.headers.get("Idempotency-Key") or "").replace("\t", " ")
            line = key + "\t" + body.decode("utf-8", "replace").replace("\n", " ") + "\n"
            with self.lock:
                fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                try:
                    os.write(fd, line.encode())
                    os.fsync(fd)
                finally:
                    os.close(fd)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    open(log, "a").close()
    with open(port_file + ".tmp", "w") as f:
        f.write(f"{server.server_address[1]}\n")
    os.rename(port_file + ".tmp", port_file)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    server.serve_forever()


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "count":
        print(count(sys.argv[2], sys.argv[3]))
    elif len(sys.argv) == 5 and sys.argv[1] == "serve" and sys.argv[3] == "--port-file":
        serve(sys.argv[2], sys.argv[4])
    else:
        sys.exit(__doc__)
