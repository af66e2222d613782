"""worker.py [--broken ignore-verdict|complete-first]: one worker process
of the sign-off run's test job (hook 84), on the directory queue of
dirqueue.py, written with pg_idempotency's plain functions and sign-off
points as docs/signoff-protocol.md says.

It takes one message at a time and runs the protocol:

    claim (fingerprint of the message's arguments)
      run/verify:  Heartbeat (every quarter of the lease: the run's,
                   signoff_lease()); point claimed; "fail" there: release
                   the claim and drop the message (a known failure; the
                   runner's next enqueue is the retry); else the handler:
                   verify looks the key up in the effects file first
                   (lookup policy), run appends one fsync'd line
                   "key attempt pid"; the heartbeat stops; point handled;
                   complete (ID003: taken over, logged)
      otherwise:   (claim() reported the point judged) in_progress: the
                   message is put back, due after the lease; completed,
                   held, skipped: dropped
      ID002, class 22: (judged, verdict error, reported by claim()) dropped
      any other error: (judged, verdict error, with its message, reported
                   by claim()) the message again in 1 s

SIGTERM: the message in hand is finished, then the process exits.

The broken variants, for the runner's own test (they must fail):
  --broken late-copy        after each run, a copy of the message that
                            makes the effect again without a claim, due
                            2 s later (a job that schedules itself)
  --broken ignore-verdict   the effect also on completed, in_progress,
                            held and skipped (after the judged point)
  --broken complete-first   complete, then the handled point, then the
                            effect
SIGNOFF_TEST_BROKEN=... does the same as --broken.

--key MODE: the operation key the job claims under, made from the
message's key (the run's): format:TEMPLATE (e.g. format:refund:{key}),
hash (the first 16 hex digits of sha256("refund:" + key)), or message-id
(the message's own file name: another for every delivery, the mistake of
keying a job by Sidekiq's jid or SQS's MessageId). The effects stay
counted under the run's key.

--transactional: the job's effect is a row of the table
SIGNOFF_TEST_TX_TABLE (default public.signoff_tx_effects), written in the
claim's own transaction with the completion (the job file says
transactional = yes and counts the rows with effects_sql), on one psycopg
connection: BEGIN; claim; point claimed; INSERT the row; point handled;
complete; COMMIT. Its broken variant, --broken commit-first, commits the
claim on its own first (the row and the completion in a second
transaction): the run's case 8 must fail it."""
import argparse
import hashlib
import logging
import os
import signal
import sys
import time
import traceback

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "helpers", "python"))

import psycopg  # noqa: E402

import dirqueue  # noqa: E402
import pg_idempotency as idem  # noqa: E402

JOB = "signoff_test_job"      # the job type in the job file
log = logging.getLogger("worker")
stopping = False


def on_term(signum, frame):
    global stopping
    stopping = True


def effect(spool, key, attempt):
    """the job's effect: one line, on disk before it counts"""
    fd = os.open(dirqueue.effects_file(spool), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{key} {attempt} {os.getpid()}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def found(spool, key):
    """the lookup policy's question: did an effect of the key happen?"""
    try:
        with open(dirqueue.effects_file(spool)) as f:
            return any(line.split(" ", 1)[0] == key for line in f)
    except FileNotFoundError:
        return False


def operation_key(run_key, path, key_mode):
    """the key the job claims under: the run's, a format of it, a hash of
    it, or (wrong) the message's own id, which changes per delivery"""
    if key_mode is None:
        return run_key
    kind, _, arg = key_mode.partition(":")
    if kind == "format":
        return arg.replace("{key}", run_key)
    if kind == "hash":
        return hashlib.sha256(f"refund:{run_key}".encode()).hexdigest()[:16]
    return "msg-" + os.path.basename(path)      # message-id


def handle(spool, path, message, lease, broken, key_mode=None):
    run_key = message["key"]
    key = operation_key(run_key, path, key_mode)
    fp = idem.fingerprint(message["args"])
    if message.get("unclaimed"):    # --broken late-copy's copy: no claim at all
        effect(spool, run_key, 0)
        os.unlink(path)
        return

    def done():
        os.unlink(path)

    def again(delay):
        dirqueue.put(spool, {k: v for k, v in message.items() if k != "not_before"}, delay)
        os.unlink(path)

    try:
        c = idem.claim(JOB, key, fp)
    except psycopg.Error as err:
        if idem.is_busy(err):       # claim() reported the point judged
            return again(lease)
        if not idem.claim_error_heals(err):
            log.info("%s: refused (%s): %s", key, err.sqlstate, err)
            return done()
        log.warning("%s: claim failed, again in 1 s: %s", key, err)
        return again(1.0)

    if not c.runs:                  # claim() reported the point judged
        log.info("%s: %s #%s", key, c.verdict, c.attempt)
        if broken == "ignore-verdict":
            effect(spool, run_key, c.attempt)
        if c.verdict == "in_progress":
            return again(lease)
        return done()

    beat = idem.Heartbeat(JOB, key, c.attempt, every=lease / 4).start()
    try:
        if idem.signoff_point("claimed", JOB, key, c, heartbeat=True) == "fail":
            beat.stop()
            idem.release(JOB, key, c.attempt)
            log.info("%s: known failure: released attempt %s", key, c.attempt)
            return done()
        if broken == "complete-first":
            beat.stop()
            idem.complete(JOB, key, c.attempt, {"pid": os.getpid()})
            idem.signoff_point("handled", JOB, key, c, heartbeat=True)
            effect(spool, run_key, c.attempt)
            return done()
        if c.verdict == "verify" and found(spool, run_key):
            value = {"found": True}
        else:
            effect(spool, run_key, c.attempt)
            value = {"pid": os.getpid(), "attempt": c.attempt}
    finally:
        beat.stop()
    idem.signoff_point("handled", JOB, key, c, heartbeat=True)
    if broken == "late-copy":
        # the job schedules a copy of itself that does the effect again,
        # without a claim, two seconds later (a perform_in, a countdown)
        dirqueue.put(spool, dict(message, unclaimed=True), 2.0)
    try:
        idem.complete(JOB, key, c.attempt, value)
        log.info("%s: %s #%s completed", key, c.verdict, c.attempt)
    except psycopg.Error as err:
        if err.sqlstate != "ID003":
            raise
        log.info("%s: attempt %s taken over (ID003)", key, c.attempt)
    return done()


TX_CLAIM_SQL = ("SELECT verdict::text, attempt, result::text "
                "FROM idempotency.claim_operation(%s, %s, %s, %s)")


def handle_tx(conn, path, message, broken):
    """the transactional mode: claim, row and completion in one transaction"""
    key = message["key"]
    fp = idem.fingerprint(message["args"])
    jt = idem.signoff_job_type(JOB)
    table = os.environ.get("SIGNOFF_TEST_TX_TABLE", "public.signoff_tx_effects")
    worker = f"tx/{os.getpid()}"
    idem.signoff_hello(conn)    # the point hello, with this connection's database (once)
    c = None                    # the claim, once it answered
    try:
        if broken == "commit-first":
            with conn.transaction():    # the claim committed on its own: wrong
                c = idem.Claim(*conn.execute(TX_CLAIM_SQL, (jt, key, fp, worker)).fetchone(), None)
        with conn.transaction():
            if broken != "commit-first":
                c = idem.Claim(*conn.execute(TX_CLAIM_SQL, (jt, key, fp, worker)).fetchone(), None)
            if not c.runs:
                idem.signoff_point("judged", JOB, key, c)
                log.info("%s: %s #%s", key, c.verdict, c.attempt)
            else:
                idem.signoff_point("claimed", JOB, key, c)
                conn.execute(f"INSERT INTO {table} (operation_key, attempt, pid) VALUES (%s, %s, %s)",
                             (key, c.attempt, os.getpid()))
                idem.signoff_point("handled", JOB, key, c)
                conn.execute("SELECT idempotency.complete_operation(%s, %s, %s, %s::jsonb)",
                             (jt, key, c.attempt, '{"row": true}'))
                log.info("%s: %s #%s completed with its row", key, c.verdict, c.attempt)
    except psycopg.Error as err:
        if c is None:   # the claim's error is judged (docs/signoff-protocol.md), as claim() does
            idem.signoff_point("judged", JOB, key, verdict="busy" if idem.is_busy(err) else "error",
                               sqlstate=err.sqlstate, message=idem.error_message(err))
        if c is None and err.sqlstate and (err.sqlstate == "ID002" or err.sqlstate.startswith("22")):
            log.info("%s: refused (%s): %s", key, err.sqlstate, err)
        else:
            raise
    os.unlink(path)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--broken", choices=("ignore-verdict", "complete-first", "commit-first", "late-copy"),
                        default=os.environ.get("SIGNOFF_TEST_BROKEN") or None)
    parser.add_argument("--transactional", action="store_true")
    parser.add_argument("--key", dest="key_mode", default=None,
                        help="format:TEMPLATE (with {key}), hash, or message-id: the operation key")
    args = parser.parse_args()
    broken = args.broken
    conn = psycopg.connect("", autocommit=True) if args.transactional else None
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s worker {os.getpid()}: %(message)s")
    signal.signal(signal.SIGTERM, on_term)
    spool = dirqueue.spool()
    mine = os.path.join(spool, "processing", str(os.getpid()))
    os.makedirs(mine, exist_ok=True)
    with open(os.path.join(spool, "pids", str(os.getpid())), "w") as f:
        f.write(f"{os.getpid()}\n")
    lease = idem.signoff_lease() or 30.0
    log.info("started%s; lease %s s; job types %s", f" (broken: {broken})" if broken else "",
             lease, os.environ.get("IDEMPOTENCY_SIGNOFF_JOB_TYPES", "-"))
    while not stopping:
        taken = dirqueue.take(spool, mine)
        if taken is None:
            time.sleep(0.02)
            continue
        try:
            if conn is not None:
                handle_tx(conn, *taken, broken)
            else:
                handle(spool, *taken, lease, broken, args.key_mode)
        except Exception:   # noqa: BLE001 -- a failed job: logged, its message dropped
            log.error("%s failed:\n%s", taken[1].get("key"), traceback.format_exc())
            if os.path.exists(taken[0]):
                os.unlink(taken[0])
    log.info("stopped (SIGTERM)")


if __name__ == "__main__":
    main()
