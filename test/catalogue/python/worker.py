"""worker.py: the catalogue's refund job in Python (test/catalogue/README.md):
one worker process on the directory queue of test/signoff/dirqueue.py,
written with pg_idempotency's plain functions and sign-off points.

CATALOGUE_MUTATION selects one change of the correct job (unset or
"correct": none); test/catalogue/catalogue.txt lists them and what must
catch each. CATALOGUE_KEY selects the operation key: run (the message's
key, default), prefix (refund:{key}) or hash (the first 16 hex digits of
sha256("refund:" + key), which the job file declares with key_command).

The effect is a refund: a fsync'd line "key attempt pid" in the spool's
effects file, or, when the runner exports IDEMPOTENCY_SIGNOFF_HTTP (a job
file with effect = http), a POST to $IDEMPOTENCY_SIGNOFF_HTTP/refunds/KEY
with the header Idempotency-Key: KEY, 200 = accepted. The correct job
treats the provider's answers as docs/signoff.md says: 503 and a refused
connection are a KnownFailure (released, the message retried), no answer
within 5 s is an unknown outcome (an error: the claim is left to its
lease), 422 ends the operation (completed with the refusal as its result)."""
import hashlib
import logging
import os
import signal
import sys
import time
import traceback
import urllib.error
import urllib.request

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "..", "helpers", "python"))
sys.path.insert(0, os.path.join(here, "..", "..", "signoff"))

import psycopg  # noqa: E402

import dirqueue  # noqa: E402
import pg_idempotency as idem  # noqa: E402

JOB = "catalogue_refund"      # the job type in the job file
MUTATION = os.environ.get("CATALOGUE_MUTATION") or "correct"
KEY_MODE = os.environ.get("CATALOGUE_KEY") or "run"
HTTP = os.environ.get("IDEMPOTENCY_SIGNOFF_HTTP")
log = logging.getLogger("refund")
stopping = False


def on_term(signum, frame):
    global stopping
    stopping = True


class ProviderRefused(Exception):
    """the provider answered 4xx: the refund is refused for good"""


def refund(spool, run_key, op_key, attempt):
    """the effect: a line in the effects file, or a POST to the provider"""
    if not HTTP:
        fd = os.open(dirqueue.effects_file(spool), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{run_key} {attempt} {os.getpid()}\n".encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        return {"refunded": True}
    headers = {"Idempotency-Key": op_key, "Content-Type": "application/json"}
    timeout = None if MUTATION == "no-timeout" else 5.0
    tries = 0
    while True:
        tries += 1
        req = urllib.request.Request(f"{HTTP}/refunds/{op_key}", data=b'{"amount_cents": 1250}', method="POST",
                                     headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return {"status": resp.status}
        except (urllib.error.URLError, TimeoutError) as err:
            if MUTATION == "retry-without-key" and tries == 1 and getattr(err, "code", None) != 422:
                # the call tried once more inside the handler, the header left out
                log.warning("%s: %s; trying again at once", op_key, err)
                headers = {"Content-Type": "application/json"}
                continue
            if not isinstance(err, urllib.error.HTTPError):
                if MUTATION == "swallow-errors":
                    log.warning("%s: provider unreachable: %s (ignored)", op_key, err)
                    return {"status": None}
                if isinstance(getattr(err, "reason", None), ConnectionRefusedError):
                    raise idem.KnownFailure(f"provider unreachable: {err.reason}") from err
                raise                            # a timeout: the outcome is unknown
            if MUTATION == "retry-forever":      # every error transient: again, forever
                time.sleep(0.2)
                continue
            if MUTATION == "swallow-errors":     # logged, and reported as a success
                log.warning("%s: provider answered %s (ignored)", op_key, err.code)
                return {"status": err.code}
            if err.code == 422 or 400 <= err.code < 500 and err.code not in (408, 429):
                raise ProviderRefused(f"provider answered {err.code}") from err
            raise idem.KnownFailure(f"provider answered {err.code}") from err


def refunded(spool, run_key):
    """the lookup policy's question (verdict verify): was the refund made?
    (the provider's own record; here the effects file)"""
    try:
        with open(dirqueue.effects_file(spool)) as f:
            return any(line.split(" ", 1)[0] == run_key for line in f)
    except FileNotFoundError:
        return False


def operation_key(run_key, path, message):
    if MUTATION == "message-id":             # the message's own id: another per delivery
        return "msg-" + os.path.basename(path)
    if MUTATION == "key-retries" and message.get("retries"):
        return f"{run_key}:{message['retries']}"     # the queue's retry count in the key
    if KEY_MODE == "prefix":
        return f"refund:{run_key}"
    if KEY_MODE == "hash":
        return hashlib.sha256(f"refund:{run_key}".encode()).hexdigest()[:16]
    return run_key


def handle(spool, path, message, lease):
    run_key = message["key"]
    args = dict(message["args"])
    if MUTATION == "args-differ":            # the delivery's time among the arguments
        args["received_at"] = time.time()
    if message.get("copy") == "unclaimed":   # the job's own follow-up: no claim at all
        refund(spool, run_key, run_key, 0)
        os.unlink(path)
        return
    if message.get("copy") == "new-key":     # the follow-up under a key of its own
        run_key_claimed = f"{run_key}:again"
    else:
        run_key_claimed = None
    key = run_key_claimed or operation_key(run_key, path, message)
    fp = idem.fingerprint(args)

    def done():
        os.unlink(path)

    def again(delay):
        # the queue's own retry of the message: its retry count one more
        retried = dict(message, retries=message.get("retries", 0) + 1)
        dirqueue.put(spool, {k: v for k, v in retried.items() if k != "not_before"}, delay)
        os.unlink(path)

    if MUTATION == "effect-before-claim":
        refund(spool, run_key, key, 0)
    try:
        c = idem.claim(JOB, key, fp)
    except psycopg.Error as err:
        if idem.is_busy(err):
            return again(lease)
        if not idem.claim_error_heals(err):
            log.info("%s: refused (%s): %s", key, err.sqlstate, err)
            return done()
        log.warning("%s: claim failed, again in 1 s: %s", key, err)
        return again(1.0)

    if not c.runs:                          # claim() reported the point judged
        log.info("%s: %s #%s", key, c.verdict, c.attempt)
        if MUTATION == "ignore-verdict":
            refund(spool, run_key, key, c.attempt)
        if MUTATION == "late-verdict":      # the same, after the run has counted the case
            time.sleep(2.0)
            refund(spool, run_key, key, c.attempt)
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
        if MUTATION == "complete-first":
            beat.stop()
            idem.complete(JOB, key, c.attempt, {"pid": os.getpid()})
            idem.signoff_point("handled", JOB, key, c, heartbeat=True)
            refund(spool, run_key, key, c.attempt)
            return done()
        try:
            if MUTATION == "effect-before-claim":
                value = {"refunded": "before the claim"}
            elif c.verdict == "verify" and refunded(spool, run_key):   # lookup: look first
                value = {"found": True}
            else:
                try:
                    value = refund(spool, run_key, key, c.attempt)
                except Exception:
                    if MUTATION == "complete-on-failure":   # an ensure block: completed, the call failed or not
                        idem.complete(JOB, key, c.attempt, {"tried": True})
                    raise
        except ProviderRefused as err:      # refused for good: the operation ends
            value = {"refused": str(err)}
        except idem.KnownFailure as err:    # certainly not refunded: released, retried
            beat.stop()
            idem.release(JOB, key, c.attempt)
            log.info("%s: %s: released attempt %s, again in 1 s", key, err, c.attempt)
            return again(1.0)
    finally:
        beat.stop()
    idem.signoff_point("handled", JOB, key, c, heartbeat=True)
    if MUTATION == "reschedule-unclaimed" and not message.get("copy"):
        dirqueue.put(spool, dict(message, copy="unclaimed"), 1.0)
    if MUTATION == "reschedule-new-key" and not message.get("copy"):
        dirqueue.put(spool, dict(message, copy="new-key"), 1.0)
    try:
        idem.complete(JOB, key, c.attempt, value)
        log.info("%s: %s #%s completed", key, c.verdict, c.attempt)
    except psycopg.Error as err:
        if err.sqlstate != "ID003":
            raise
        log.info("%s: attempt %s taken over (ID003)", key, c.attempt)
    return done()


def main():
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s refund worker {os.getpid()}: %(message)s")
    signal.signal(signal.SIGTERM, on_term)
    spool = dirqueue.spool()
    mine = os.path.join(spool, "processing", str(os.getpid()))
    os.makedirs(mine, exist_ok=True)
    with open(os.path.join(spool, "pids", str(os.getpid())), "w") as f:
        f.write(f"{os.getpid()}\n")
    lease = idem.signoff_lease() or 30.0
    log.info("started (mutation %s, key %s); lease %s s", MUTATION, KEY_MODE, lease)
    while not stopping:
        taken = dirqueue.take(spool, mine)
        if taken is None:
            time.sleep(0.02)
            continue
        try:
            handle(spool, *taken, lease)
        except Exception:   # noqa: BLE001 -- a failed job: logged, its message dropped
            log.error("%s failed:\n%s", taken[1].get("key"), traceback.format_exc())
            if os.path.exists(taken[0]):
                os.unlink(taken[0])
    log.info("stopped (SIGTERM)")


if __name__ == "__main__":
    main()
