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

With effect = http or smtp in the job file the runner exports
IDEMPOTENCY_SIGNOFF_HTTP (a base URL) or IDEMPOTENCY_SIGNOFF_SMTP
(host:port): the effect is then a POST there (the key in the path and an
Idempotency-Key header; a GET of the same path is the lookup policy's
question) or a mail (the key in its subject), with a client timeout of
three leases. A refusal for now (503, 451, connection refused) is a known
failure: the claim is released and the message dropped (the runner's next
enqueue is the retry); a refusal for good (422, 550) completes the
operation with the refusal as its result; no answer (the timeout) raises,
which leaves the claim to its lease. Broken variants of that:
  --broken swallow-errors      a failed call is logged and the job reports
                               success (completes)
  --broken no-timeout          the call has no client timeout
  --broken short-timeout       a client timeout of 1.5 leases, shorter than
                               case 17's slow provider (two leases): an
                               unknown outcome the policy decides (hold and
                               skip fail, retry and lookup pass)
  --broken release-on-timeout  a timeout is taken for a known failure
                               (the claim released: the effect may have
                               been made)
  --broken retry-forever       a refusal for good is retried like one for
                               now (released, and the message put back,
                               due 0.3 s later)
  --broken no-key              the POST names no key (path, header and body
                               without it): the run cannot count it
  --broken shared-client       the Idempotency-Key header is set once per
                               process, by the first key (a client shared
                               between keys): later keys' refunds are
                               sent under it (only the storm has one
                               worker take several keys)

--key MODE: the operation key the job claims under, made from the
message's key (the run's): format:TEMPLATE (e.g. format:refund:{key}),
hash (the first 16 hex digits of sha256("refund:" + key)), or message-id
(the message's own file name: another for every delivery, the mistake of
keying a job by Sidekiq's jid or SQS's MessageId). The effects stay
counted under the run's key.

--batch N: a batch handler: up to N messages taken at once (one
receive), claimed in one call (claim_batch; on ID002 each key alone), then
each handled as above (the job file says batch = yes: case 20). Its
broken variant, --broken batch-drop, drops the whole receive when
claim_batch refuses it (one key's other arguments): every other key of
the receive is lost.

--transactional: the job's effect is a row of the table
SIGNOFF_TEST_TX_TABLE (default public.signoff_tx_effects), written in the
claim's own transaction with the completion (the job file says
transactional = yes and counts the rows with effects_sql), on one psycopg
connection: BEGIN; claim; point claimed; INSERT the row; point handled;
complete; COMMIT. Its broken variant, --broken commit-first, commits the
claim on its own first (the row and the completion in a second
transaction): the run's case 8 must fail it.

--slow-redelivery once|always: a machine slower than the lease for cases
7a and 7b, not a broken job: a message that came before (a marker per key
in the spool) waits the lease and 0.5 s before its claim. once: only the
spool's first such delivery; always: every one. The runner keeps the dead
claim young meanwhile, so the claim is judged in_progress all the same and
the case holds on its first try.

--slow-runner: a runner descheduled between the verdict and its read of
the record (a loaded machine), not a broken job: before the claim of a
message that came before, the worker stops the runner (SIGSTOP; the
runner is the parent of the worker's process group leader) and a process
of its own session resumes it (SIGCONT) the lease and 0.5 s later. The
claim is judged in_progress at once, and the runner reads the record
only after the lease ran out: 7a and 7b must hold all the same. With
--slow-redelivery always: the runner stops for two leases and 1 s, and the
claim waits the lease and 0.5 s, so that the runner cannot keep the claim
young and the database judges the redelivery after the lease: the try
tests nothing, and the case fails after its tries saying so.

--in-progress-again LEASES: a message judged in_progress is put back due
after LEASES leases (default 1, after the lease). A correct job all the
same: under 1, each copy of a killed key is judged in_progress again and
again inside the lease, so that every copy the runner enqueued has been
delivered before the lease ran out and the takeover came (the storm, 19,
must wait for the record the policy gives, not count deliveries).

--slow-takeover SECONDS: a claim that took over (attempt 2 or later)
waits SECONDS, its heartbeat running, before its claimed point: a worker
descheduled between its claim and its report, while other copies of the
message are judged in_progress against the claim it took. With
--in-progress-again under 1 this is the storm's race (19 under retry: the
killed key's copies all reported before its takeover was).

--stall-in-12 once|always: a machine that stalls the worker, not a
broken job: at the claimed point of case 12's key (the first try's only,
or every try's) a process of its own session stops the worker (SIGSTOP,
its heartbeat thread with it) 0.3 s later for the lease and 1 s. The
claim runs out and stale_claims() lists it until the heartbeat comes
again: once, the case holds on its second try; always, it fails after 3
tries saying the machine stalls the worker.
--heartbeat-every LEASES: the heartbeat's period (default 0.25 leases).
Above half the lease a stall is the job's fault: the case fails at once."""
import argparse
import hashlib
import json
import logging
import os
import re
import signal
import smtplib
import subprocess
import socket
import sys
import time
import traceback
import urllib.error
import urllib.request

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "helpers", "python"))

import psycopg  # noqa: E402

import dirqueue  # noqa: E402
import pg_idempotency as idem  # noqa: E402

JOB = "signoff_test_job"      # the job type in the job file
log = logging.getLogger("worker")
stopping = False
slow_redelivery = None   # --slow-redelivery: once, always
slow_runner = False      # --slow-runner
in_progress_again = 1.0  # --in-progress-again: an in_progress message's next delivery, in leases
slow_takeover = 0.0      # --slow-takeover: seconds between a takeover's claim and its claimed point
heartbeat_every = 0.25   # --heartbeat-every: the heartbeat's period, in leases
stall_in_12 = None       # --stall-in-12: once, always


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


class RefusedForNow(Exception):
    """the provider refused (503, 451) or could not be reached: certainly not made"""


class RefusedForGood(Exception):
    """the provider refused for good (422, 550)"""


SHARED_HEADERS = {"Content-Type": "application/json"}    # --broken shared-client


def provider():
    return os.environ.get("IDEMPOTENCY_SIGNOFF_HTTP"), os.environ.get("IDEMPOTENCY_SIGNOFF_SMTP")


def send(key, attempt, lease, broken):
    """the job's effect at the run's endpoint; raises RefusedForNow,
    RefusedForGood, or (no answer within the client timeout) TimeoutError"""
    http, smtp = provider()
    timeout = None if broken == "no-timeout" else 1.5 * lease if broken == "short-timeout" else 3 * lease
    try:
        if http and broken == "shared-client":
            SHARED_HEADERS.setdefault("Idempotency-Key", key)
            req = urllib.request.Request(f"{http}/refunds", data=b"{}", method="POST", headers=SHARED_HEADERS)
            with urllib.request.urlopen(req, timeout=timeout) as r:
                r.read()
            return
        if http:
            named = broken != "no-key"
            body = json.dumps({"key": key if named else "?", "attempt": attempt}).encode()
            req = urllib.request.Request(f"{http}/refunds" + (f"/{key}" if named else ""), data=body,
                                         method="POST",
                                         headers={"Idempotency-Key": key if named else "none",
                                                  "Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=timeout) as r:
                r.read()
            return
        host, _, port = smtp.rpartition(":")
        with smtplib.SMTP(host, int(port), timeout=timeout) as s:
            s.sendmail("shop@example.test", ["buyer@example.test"],
                       f"Subject: refund {key}\r\n\r\nattempt {attempt}\r\n")
    except urllib.error.HTTPError as err:
        if err.code == 503:
            raise RefusedForNow(f"HTTP {err.code}") from err
        raise RefusedForGood(f"HTTP {err.code}") from err
    except (smtplib.SMTPDataError, smtplib.SMTPRecipientsRefused, smtplib.SMTPSenderRefused) as err:
        code = getattr(err, "smtp_code", 451)
        if 400 <= code < 500:
            raise RefusedForNow(f"SMTP {code}") from err
        raise RefusedForGood(f"SMTP {code}") from err
    except urllib.error.URLError as err:
        if isinstance(err.reason, ConnectionRefusedError):
            raise RefusedForNow("connection refused") from err
        if isinstance(err.reason, (socket.timeout, TimeoutError)):
            raise TimeoutError(str(err.reason)) from err
        raise
    except ConnectionRefusedError as err:
        raise RefusedForNow("connection refused") from err
    except socket.timeout as err:
        raise TimeoutError(str(err)) from err


def looked_up(key, lease):
    """the lookup policy at the provider: GET answers 200 when the effect was made"""
    http, _ = provider()
    try:
        with urllib.request.urlopen(f"{http}/refunds/{key}", timeout=3 * lease) as r:
            return r.status == 200
    except urllib.error.HTTPError as err:
        if err.code == 404:
            return False
        raise


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


def runner_pid():
    """the runner: the parent of this worker's process group leader"""
    with open(f"/proc/{os.getpgid(0)}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def stop_runner(seconds):
    """SIGSTOP the runner; a process of its own session resumes it later"""
    pid = runner_pid()
    subprocess.Popen(["sh", "-c", f"sleep {seconds}; kill -CONT {pid}"], start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.kill(pid, signal.SIGSTOP)


def stall_me(after, seconds):
    """a machine that stalls this worker: a process of its own session
    SIGSTOPs it AFTER seconds from now, for SECONDS (its heartbeat thread
    with it), then SIGCONTs it"""
    pid = os.getpid()
    subprocess.Popen(["sh", "-c", f"sleep {after}; kill -STOP {pid}; sleep {seconds}; kill -CONT {pid}"],
                     start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def first_time(path):
    """creates the marker file path: True if no worker of the spool had"""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False


def handle(spool, path, message, lease, broken, key_mode=None, c=None):
    """one message; c: its claim, made already (a batch's), else claimed here"""
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

    # a delivery of a message that came before: slowed always, or the first
    # one; or the runner stopped for as long (--slow-runner)
    if (slow_redelivery or slow_runner) and c is None and not first_time(os.path.join(spool, "seen", run_key)):
        if slow_runner and slow_redelivery == "always":
            log.info("%s: again; the runner stops for %.1f s and the claim waits %.1f s (--slow-runner "
                     "--slow-redelivery always)", key, 2 * lease + 1.0, lease + 0.5)
            stop_runner(2 * lease + 1.0)
            time.sleep(lease + 0.5)
        elif slow_runner:
            log.info("%s: again; the runner stops for %.1f s (--slow-runner)", key, lease + 0.5)
            stop_runner(lease + 0.5)
        elif slow_redelivery == "always" or first_time(os.path.join(spool, "slowed")):
            log.info("%s: again; its claim waits %.1f s (--slow-redelivery %s)", key, lease + 0.5, slow_redelivery)
            time.sleep(lease + 0.5)
    try:
        if c is None:
            c = idem.claim(JOB, key, fp)
        elif isinstance(c, psycopg.Error):
            raise c
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
        if c.verdict == "in_progress":
            # for enqueue.py --stop-runner-after-in-progress: the verdict came
            os.makedirs(os.path.join(spool, "in_progress"), exist_ok=True)
            open(os.path.join(spool, "in_progress", run_key), "w").close()
        if broken == "ignore-verdict":
            effect(spool, run_key, c.attempt)
        if c.verdict == "in_progress":
            return again(lease * in_progress_again)
        return done()

    beat = idem.Heartbeat(JOB, key, c.attempt, every=lease * heartbeat_every).start()
    try:
        if stall_in_12 and re.search(r"-12-1$" if stall_in_12 == "once" else r"-12(-try[0-9]+)?-1$", run_key):
            log.info("%s: the worker stalls for %.1f s in 0.3 s (--stall-in-12 %s)", key, lease + 1.0, stall_in_12)
            stall_me(0.3, lease + 1.0)
        if slow_takeover and c.attempt > 1:
            log.info("%s: took over attempt %s; its claimed point in %.1f s (--slow-takeover)", key, c.attempt,
                     slow_takeover)
            os.makedirs(os.path.join(spool, "slow-takeover"), exist_ok=True)   # for the test: the race was run
            open(os.path.join(spool, "slow-takeover", run_key), "w").close()
            time.sleep(slow_takeover)
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
        if any(provider()):
            value = provider_effect(key, run_key, c, lease, broken, message, spool)
            if value is None:
                return done()
        elif c.verdict == "verify" and found(spool, run_key):
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


def provider_effect(key, run_key, c, lease, broken, message, spool):
    """the effect at the run's endpoint: the completion's value, or None
    when the claim was released (a known failure: the message is dropped)"""
    if c.verdict == "verify" and provider()[0] and looked_up(run_key, lease):
        return {"found": True}
    try:
        send(run_key, c.attempt, lease, broken)
        return {"pid": os.getpid(), "attempt": c.attempt}
    except RefusedForNow as err:
        if broken == "swallow-errors":
            log.warning("%s: the provider refused (%s); reported as sent", key, err)
            return {"sent": True}
        idem.release(JOB, key, c.attempt)
        log.info("%s: refused for now (%s): released attempt %s", key, err, c.attempt)
        return None
    except RefusedForGood as err:
        if broken == "swallow-errors":
            return {"sent": True}
        if broken == "retry-forever":
            idem.release(JOB, key, c.attempt)
            dirqueue.put(spool, {k: v for k, v in message.items() if k != "not_before"}, 0.3)
            log.info("%s: refused (%s): released, again in 0.3 s", key, err)
            return None
        log.info("%s: refused for good (%s): completed with the refusal", key, err)
        return {"refused": str(err)}
    except TimeoutError as err:
        if broken == "swallow-errors":
            return {"sent": True}
        if broken == "release-on-timeout":
            idem.release(JOB, key, c.attempt)
            log.info("%s: no answer (%s): released attempt %s", key, err, c.attempt)
            return None
        raise


def handle_batch(spool, taken, lease, broken, key_mode):
    """--batch: the messages of one receive, claimed in one call
    (claim_batch), then each handled on its own. claim_batch refuses the
    whole call for one key's other fingerprint (ID002) or class 22: then
    each key is claimed alone, every claim still before any handler runs"""
    keys = [operation_key(m["key"], path, key_mode) for path, m in taken]
    fps = [idem.fingerprint(m["args"]) for _, m in taken]
    log.info("a receive of %d: %s", len(taken), ", ".join(keys))
    try:
        claims = idem.claim_batch(JOB, keys, fps)
    except psycopg.Error as err:
        if not (err.sqlstate == "ID002" or (err.sqlstate or "").startswith("22")):
            raise
        if broken == "batch-drop":
            # the whole receive dropped for one key's refusal: every other key lost
            log.info("claim_batch refused the receive (%s): all %d dropped", err.sqlstate, len(taken))
            for path, _ in taken:
                os.unlink(path)
            return
        log.info("claim_batch refused the receive (%s): each key alone", err.sqlstate)
        claims = []
        for k, fp in zip(keys, fps):
            try:
                claims.append(idem.claim(JOB, k, fp))
            except psycopg.Error as one:
                claims.append(one)
    for (path, message), c in zip(taken, claims):
        try:
            handle(spool, path, message, lease, broken, key_mode, c=c)
        except Exception:   # noqa: BLE001 -- one key's failure is its own
            log.error("%s failed:\n%s", message.get("key"), traceback.format_exc())
            if os.path.exists(path):
                os.unlink(path)


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
    parser.add_argument("--broken", choices=("ignore-verdict", "complete-first", "commit-first", "late-copy",
                                             "swallow-errors", "no-timeout", "short-timeout", "release-on-timeout",
                                             "retry-forever", "no-key", "shared-client", "batch-drop"),
                        default=os.environ.get("SIGNOFF_TEST_BROKEN") or None)
    parser.add_argument("--transactional", action="store_true")
    parser.add_argument("--batch", type=int, default=0,
                        help="take up to N messages at once and claim them in one call")
    parser.add_argument("--key", dest="key_mode", default=None,
                        help="format:TEMPLATE (with {key}), hash, or message-id: the operation key")
    parser.add_argument("--slow-redelivery", choices=("once", "always"), default=None,
                        help="a message that came before waits the lease and 0.5 s before its claim: "
                             "the first such delivery of the run (a machine slow once), or every one")
    parser.add_argument("--slow-runner", action="store_true",
                        help="a message that came before stops the runner for the lease and 0.5 s before its claim")
    parser.add_argument("--in-progress-again", type=float, default=1.0, metavar="LEASES",
                        help="a message judged in_progress comes again after LEASES leases (default 1)")
    parser.add_argument("--slow-takeover", type=float, default=0.0, metavar="SECONDS",
                        help="a claim that took over (attempt 2 or later) waits SECONDS before its claimed point")
    parser.add_argument("--heartbeat-every", type=float, default=0.25, metavar="LEASES",
                        help="the heartbeat extends the lease every LEASES leases (default 0.25)")
    parser.add_argument("--stall-in-12", choices=("once", "always"), default=None,
                        help="at case 12's claimed point the worker is stalled (SIGSTOP) for the lease and 1 s: "
                             "in the case's first try, or in every try")
    args = parser.parse_args()
    broken = args.broken
    global slow_redelivery, slow_runner, in_progress_again, slow_takeover, heartbeat_every, stall_in_12
    slow_redelivery = args.slow_redelivery
    slow_runner = args.slow_runner
    in_progress_again = args.in_progress_again
    slow_takeover = args.slow_takeover
    heartbeat_every = args.heartbeat_every
    stall_in_12 = args.stall_in_12
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
        if args.batch > 1:
            batch = [taken]
            while len(batch) < args.batch:
                more = dirqueue.take(spool, mine)
                if more is None:
                    break
                batch.append(more)
            handle_batch(spool, batch, lease, broken, args.key_mode)
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
