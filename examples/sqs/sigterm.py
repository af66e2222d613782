#!/usr/bin/python3
"""worker.mjs on SIGTERM: it finishes the message in hand, then exits.

    /usr/bin/python3 examples/sqs/sigterm.py [--batch]

sqs-consumer (15 as 14) installs no signal handler: worker.mjs has its own
(consumer.stop(), then it waits for the poll in progress, whose handler is
the message in hand, then pool.end()). The sign-off run (docs/signoff.md)
relies on it: it stops a case's workers with SIGTERM and counts the effects
once they are gone. The check, through a local SQS (broker.mjs) and one
worker (SQS_BATCH=1 with --batch): the worker is paused inside the handler
just before the email (mail-provider.mjs's test hook, a FIFO), sent SIGTERM
there, and must still be running 1 s later; released, it must send the
email once, complete the record (completed #1), delete the message (the
queue empty) and exit with status 0 within 10 s; a message published after
the SIGTERM must stay in the queue, untouched.

Needs `npm ci` in examples/sqs, Debian's python3-psycopg, and a PostgreSQL
with the extension from libpq's environment (PGHOST, PGPORT, ...). The last
line is "N passed, N failed".
"""
import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time

import psycopg

HERE = os.path.dirname(os.path.abspath(__file__))
LEASE = 30          # s: nothing here waits for it


def wait_for(what, cond, timeout):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    raise SystemExit(f"sigterm: timed out waiting for {what}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", action="store_true", help="the worker on handleMessageBatch (SQS_BATCH=1)")
    args = ap.parse_args()
    form = "batch" if args.batch else "single"
    job_type = f"sqs_sigterm_{os.getpid()}_{form}"
    key, late = f"ORD-TERM-{os.getpid()}", f"ORD-LATE-{os.getpid()}"
    results = []

    def check(ok, what):
        results.append(ok)
        print(f"{'ok' if ok else 'not ok'} - {form}: {what}", flush=True)

    db = psycopg.connect(autocommit=True)
    with db.cursor() as c:
        c.execute("CREATE EXTENSION IF NOT EXISTS idempotency")
        c.execute("INSERT INTO idempotency.job_types (job_type, lease, stale_policy) "
                  "VALUES (%s, make_interval(secs => %s), 'hold')", (job_type, LEASE))
    tmp = tempfile.mkdtemp(prefix="sqs-sigterm-")
    mail_log = os.path.join(tmp, "outbox.log")
    env = dict(os.environ, VISIBILITY_TIMEOUT=str(LEASE + 2))
    broker_log = open(os.path.join(tmp, "broker.log"), "w")
    broker = subprocess.Popen(["node", "broker.mjs"], cwd=HERE, env=env, stdout=subprocess.PIPE,
                              stderr=broker_log, text=True, start_new_session=True)
    worker = worker_log = None
    try:
        line = broker.stdout.readline()
        if not line.startswith("QUEUE_URL="):
            raise SystemExit(f"sigterm: broker.mjs did not start: {line!r} (log {tmp}/broker.log)")
        env.update(kv.split("=", 1) for kv in line.split())
        env.update(JOB_TYPE=job_type, LEASE_SECONDS=str(LEASE), E2E_DIR=tmp, MAIL_LOG=mail_log,
                   SQS_BATCH="1" if args.batch else "0")

        def node(*argv):
            return subprocess.run(["node", *argv], cwd=HERE, env=env, check=True,
                                  stdout=subprocess.PIPE, text=True).stdout.strip()

        os.mkfifo(os.path.join(tmp, f"pause-{key}-before"))
        worker_log = open(os.path.join(tmp, "worker.log"), "w")
        worker = subprocess.Popen(["node", "worker.mjs"], cwd=HERE, env=env, stdout=worker_log,
                                  stderr=subprocess.STDOUT, start_new_session=True)
        node("publish.mjs", key)
        at = os.path.join(tmp, f"at-{key}-before")
        wait_for("the worker to reach the email", lambda: os.path.exists(at), 30)
        worker.send_signal(signal.SIGTERM)
        t_term = time.monotonic()
        node("publish.mjs", late)
        time.sleep(1)
        check(worker.poll() is None, "SIGTERM inside the handler: the worker is still running 1 s later")
        try:
            with open(os.path.join(tmp, f"pause-{key}-before.taken-{worker.pid}"), "w") as f:
                f.write("go\n")
            released = True
        except OSError as e:        # the worker stopped reading: it is exiting
            released = False
            print(f"# could not release the worker: {e}")
        check(released, "the worker released at the email (it still waited there)")
        try:
            rc = worker.wait(10)
        except subprocess.TimeoutExpired:
            rc = None
        check(rc == 0, f"released: the worker exited with status 0 within 10 s (status {rc}, "
                       f"{time.monotonic() - t_term:.1f} s after the SIGTERM)")
        with open(mail_log) if os.path.exists(mail_log) else open(os.devnull) as f:
            sent = [ln.split("\t")[1] for ln in f if ln.strip()]
        check(sent == [key], f"one email, of the message in hand (sent: {sent})")
        with db.cursor() as c:
            c.execute("SELECT operation_key, status::text, attempt FROM idempotency.operations "
                      "WHERE job_type = %s ORDER BY operation_key", (job_type,))
            rows = c.fetchall()
        check(rows == [(key, "completed", 1)], f"its record completed #1, nothing else claimed ({rows})")
        state = node("queue-state.mjs")
        check(state == "visible 1 in-flight 0 delayed 0",
              f"its message deleted, the one published after the SIGTERM left in the queue ({state})")
    finally:
        for p in (worker, broker):
            if p is not None and p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        broker_log.close()
        if worker_log:
            worker_log.close()
        with db.cursor() as c:
            c.execute("DELETE FROM idempotency.operations WHERE job_type = %s", (job_type,))
            c.execute("DELETE FROM idempotency.job_types WHERE job_type = %s", (job_type,))
        db.close()
    failed = results.count(False)
    if failed:
        print(f"sigterm: logs kept in {tmp}")
    else:
        subprocess.run(["rm", "-rf", tmp])
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
