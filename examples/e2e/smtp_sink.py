#!/usr/bin/python3
"""smtp_sink.py: a local SMTP server that counts the emails the example
jobs send, for the sign-off runs of the examples (examples/e2e/signoff.py).

    smtp_sink.py serve LOG [--port-file FILE]   # until SIGTERM
    smtp_sink.py count LOG KEY                  # prints a number

serve: an SMTP server on 127.0.0.1 (a free port, written to --port-file once
it listens; Debian's python3-aiosmtpd). Every message it accepts is one line
appended to LOG and fsync'd before the server answers 250, so an email the
sender saw accepted is counted:

    <time>\t<operation key>\t<recipients>\t<subject>

The operation key is the message's X-Operation-Key header (the example
providers set it to the job's key), else its Subject.

count: the number of lines of LOG whose key is exactly KEY (0 when LOG does
not exist yet). It is the sign-off job files' `effects` command.
"""
import argparse
import datetime
import email
import email.policy
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


class Handler:
    def __init__(self, log):
        self.log = log
        self.lock = threading.Lock()

    async def handle_DATA(self, server, session, envelope):
        msg = email.message_from_bytes(envelope.content, policy=email.policy.default)
        key = str(msg.get("X-Operation-Key") or msg.get("Subject") or "")
        subject = str(msg.get("Subject") or "")
        line = "\t".join([datetime.datetime.now().isoformat(),
                          key.replace("\t", " "),
                          ",".join(envelope.rcpt_tos),
                          subject.replace("\t", " ")]) + "\n"
        with self.lock:
            fd = os.open(self.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line.encode())
                os.fsync(fd)
            finally:
                os.close(fd)
        return "250 OK"


def serve(log, port_file):
    from aiosmtpd.controller import Controller
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    open(log, "a").close()
    controller = Controller(Handler(log), hostname="127.0.0.1", port=port)
    controller.start()
    if port_file:
        with open(port_file + ".tmp", "w") as f:
            f.write(f"{port}\n")
        os.rename(port_file + ".tmp", port_file)
    print(f"smtp sink on 127.0.0.1:{port}, log {log}", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    controller.stop()


def main(argv=None):
    ap = argparse.ArgumentParser(description="a counting SMTP sink")
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
