"""pg_idempotency.celery: a Celery task base class for the claim protocol of the
PostgreSQL extension `idempotency`.

    from pg_idempotency.celery import IdempotentTask, KnownFailure, PermanentFailure

    @app.task(base=IdempotentTask, job_type="send_confirmation", key_arg="order", lease=600)
    def send_confirmation(order, email): ...

For every delivery: claim_operation(job type, key, fingerprint, worker,
delivery, wait) (extension 0.3 or later);
  run / verify        -> the task body runs, with a heartbeat thread calling
                         extend_lease; then complete_operation; the message is
                         acknowledged (task_acks_late: after the body)
  completed, skipped  -> return the stored result: acknowledged, nothing runs
  in_progress         -> self.retry(countdown=lease): look again after the lease
                         (also a claim that hit its bound: 55P03, 57014)
  held                -> return None: acknowledged; a person decides
                         (resolve_operation; the sweeper then re-enqueues)
The body raising KnownFailure (the effect certainly did not happen) releases
the claim and retries after a backoff (doubling with the attempt, at most
backoff_max and half the lease); the body raising PermanentFailure (the
provider refused for good) completes the operation with
{"permanent_failure": reason} as its result and fails the task without a
retry (state FAILURE, the exception its result; a later delivery of the
operation meets that result and fails the same way without running the
body); any other exception leaves the claim to its lease (the job type's
stale-claim policy decides at the next delivery, or the sweeper finds it).

A claim that fails with an error is never acknowledged away: self.retry
publishes the task again (before the message is acknowledged) after a capped
exponential backoff, unless the error is the caller's bug that no retry can
heal (ID002: the key was claimed with other arguments; class 22: bad input
such as an empty key), which fails the task at once and loudly. Everything
else is retried: a lost connection, a server shutdown (57P01), a
serialization failure or deadlock (40001, 40P01), a grant not given yet (42501),
the extension or the job type not installed yet (42P01, 3F000, 42883, ID001),
a standby after a failover (25006).

The delivery token: a uuid4 made when the task starts (one per handler
invocation, never stored in the message: a redelivered copy of the message
is another delivery). When the claim's connection is lost (the reply may be
lost after the server committed the claim), the claim is sent once more on a
new connection with the same token, and the server gives the claim back:
the same verdict and attempt, instead of in_progress for a whole lease.
While the database cannot be reached (a PgBouncer or PostgreSQL restart,
PgBouncer refusing logins for server_login_retry after one) the claim is
tried again, with the same token, after 0, 0.1, 0.2 ... 2 s, for up to
reconnect_for seconds (30; at most half the lease); only then does the task
fall back to self.retry (a new message, a new token). complete_operation and
release_operation are sent again the same way (they are no-ops when
repeated). A connection error is one without a SQLSTATE on a connection
psycopg marks closed, or SQLSTATE class 08 (PgBouncer reports its own
failures as 08P01 and closes the connection) or 57P01-57P03 (the server is
shutting down, e.g. a backend terminated by pg_ctl restart -m fast, or
starting up).

No prepared statements (prepare_threshold=None): behind PgBouncer in
transaction pooling mode every transaction may run on another server
connection, where the statements psycopg prepares by itself (after 5
executions of a query) do not exist (26000) or exist already (42P05).

The bound: a claim never waits for another transaction's uncommitted claim
of the same key (a worker stuck or idle in a transaction, the transactional
mode) unless claim_wait says so: claim_wait = 0 (the default) claims with
wait => false, answered in_progress at once; claim_wait = N > 0 waits up to
N seconds (wait => true under SET LOCAL lock_timeout), and a claim that
times out (55P03, or 57014 from a statement_timeout) is treated as
in_progress: self.retry(countdown=lease). Either way no pool process is held
by someone else's transaction.

Use with task_acks_late = True and task_reject_on_worker_lost = True, so that
a killed worker's message is redelivered.

A stop finishes the task in hand: in a prefork pool process, SIGTERM is
ignored from the claim to the completion (or release) of a task, as Celery
makes pool processes ignore SIGINT (finish_on_sigterm = True, the default).
A SIGTERM to the worker's whole process group (systemd's default
KillMode=control-group, a terminal's kill of the job) otherwise killed the
pool process in the middle of the task, e.g. after the email and before
complete_operation: the claim then waited out its lease and the policy
decided, for a shutdown that was meant to be warm. The main process's warm
shutdown ends the pool once the task is done; SIGKILL still kills at once.
Threads and other pools (solo, threads, gevent) are left alone.

The calls to the database are pg_idempotency's plain functions (claim,
complete, release, Heartbeat), with reconnect_for capped at half the lease.

The sign-off points (docs/signoff-protocol.md), only when the sign-off
runner started the worker with IDEMPOTENCY_SIGNOFF: "claimed" after a run or
verify claim, with the heartbeat running, before the body ("fail": as if
the body raised KnownFailure, the body is not called); "handled" after the
body returned and the heartbeat stopped, before complete_operation. An
exchange that fails (SignoffError) fails the task with the claim left to its
lease, as any other exception of the body. The job types are mapped by
IDEMPOTENCY_SIGNOFF_JOB_TYPES in every call (pg_idempotency.signoff_job_type).
"""

import contextlib
import inspect
import logging
import random
import signal
import threading

import psycopg
from celery import Task
from celery.signals import worker_process_init

import pg_idempotency
from pg_idempotency import BUSY, KnownFailure, PermanentFailure, claim_error_heals

__all__ = ["IdempotentTask", "KnownFailure", "PermanentFailure"]

# the sign-off report's words for how a permanent failure ends the delivery
PERMANENT_DELIVERY = "the task in state FAILURE, not retried (Celery)"

log = logging.getLogger(__name__)

_in_pool_process = False   # set in each prefork pool process as it starts


@worker_process_init.connect(weak=False)
def _pool_process_started(**_):
    global _in_pool_process
    _in_pool_process = True


@contextlib.contextmanager
def _sigterm_ignored(enabled):
    """SIGTERM ignored inside the block, in a prefork pool process's main
    thread (finish_on_sigterm); the handler before it restored after"""
    if not (enabled and _in_pool_process and threading.current_thread() is threading.main_thread()):
        yield
        return
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class IdempotentTask(Task):
    job_type = None        # default: the task's name
    key_arg = None         # the argument that names the effect (e.g. "order")
    lease = 600            # seconds, as in idempotency.job_types
    heartbeat = None       # seconds between extend_lease calls (default: lease / 4)
    dsn = ""               # libpq connection string; "" = PG* environment
    max_retries = None     # in_progress retries until the other claim ends
    backoff = 1.0          # seconds before the first retry after an error
    backoff_max = 60.0     # the retries' delay doubles up to this
    claim_max_retries = None   # None: retry a failing claim until it works
    claim_wait = 0.0       # seconds a claim may wait for another transaction's
                           # uncommitted claim of the key (0: not at all, wait => false)
    reconnect_for = 30.0   # seconds to keep trying a call whose connection was lost
                           # (the claim with its delivery token, complete, release);
                           # at most half the lease, at least one try more
    finish_on_sigterm = True   # a prefork pool process finishes the task in hand
                               # when SIGTERM reaches it (ignored until the end)
    throws = (PermanentFailure,)   # an expected failure (Celery's `throws`)

    # -- override these as needed ---------------------------------------
    def bound_arguments(self, args, kwargs):
        """the task's arguments by name, defaults included: the same for
        .delay("ORD-1", "a@b") and .apply_async(kwargs={"order": ..., ...})"""
        bound = inspect.signature(self.run).bind(*args, **kwargs)
        bound.apply_defaults()
        return dict(bound.arguments)

    def operation_key(self, args, kwargs):
        return str(self.bound_arguments(args, kwargs)[self.key_arg])

    def fingerprint(self, args, kwargs):
        return pg_idempotency.fingerprint(self.bound_arguments(args, kwargs))

    def retry_delay(self, n):
        """seconds before retry n + 1 (n = 0, 1, ...): backoff * 2**n, at
        most backoff_max, with jitter (between half and all of it)"""
        d = min(self.backoff_max, self.backoff * 2 ** min(n, 32))
        return d / 2 + random.random() * d / 2

    def on_verdict(self, event):
        log.info("%s %s: %s #%s -> %s", self.name, event["key"], event["verdict"],
                 event["attempt"], event["action"])

    # -- the protocol -------------------------------------------------------
    def _reconnect_for(self, lease):
        return max(0.0, min(self.reconnect_for, lease / 2))

    def __call__(self, *args, **kwargs):
        # the sign-off point hello names this wrapper (not the plain functions)
        with _sigterm_ignored(self.finish_on_sigterm), pg_idempotency.signoff_wrapper("IdempotentTask"):
            return self._protocol(args, kwargs)

    def _protocol(self, args, kwargs):
        job_type = self.job_type or self.name
        key = self.operation_key(args, kwargs)
        lease, every = self.lease, self.heartbeat or self.lease / 4
        run_lease = pg_idempotency.signoff_lease()   # a sign-off run's timings, not production's
        if run_lease is not None:
            lease, every = run_lease, min(every, run_lease / 4)
        event = {"key": key, "delivery": (self.request.delivery_info or {}).get("redelivered"),
                 "retries": self.request.retries}

        def lost(err):
            log.warning("%s %s: claim_operation: %s; once more on a new connection, same delivery",
                        self.name, key, err)
            self.on_verdict({**event, "verdict": "claim error", "attempt": None,
                             "sqlstate": "connection", "action": "again"})

        try:
            # one token per handler invocation (claim() makes it): this
            # delivery, and only its own tries of the claim, present it
            claimed = pg_idempotency.claim(
                job_type, key, self.fingerprint(args, kwargs), pg_idempotency.worker_id(),
                wait=self.claim_wait, dsn=self.dsn, reconnect_for=self._reconnect_for(lease),
                on_lost=lost)
        except psycopg.Error as err:
            event.update(verdict="claim error", attempt=None, sqlstate=err.sqlstate or "connection")
            if err.sqlstate in BUSY:
                # the claim hit its bound (claim_wait's lock_timeout, or with
                # wait => false a lock met between its check and its write):
                # as in_progress, look again after the lease
                self.on_verdict({**event, "action": "retry", "retry_in": lease})
                raise self.retry(countdown=lease)
            if not claim_error_heals(err):
                self.on_verdict({**event, "action": "fail"})
                raise   # the caller's bug: the task fails (and is acknowledged)
            delay = self.retry_delay(self.request.retries)
            log.warning("%s %s: claim failed (%s), retry in %.1f s: %s", self.name, key,
                        event["sqlstate"], delay, err)
            self.on_verdict({**event, "action": "retry", "retry_in": delay})
            # published again before this message is acknowledged
            raise self.retry(exc=err, countdown=delay, max_retries=self.claim_max_retries)
        verdict, attempt, result = claimed.verdict, claimed.attempt, claimed.result
        event.update(verdict=verdict, attempt=attempt)

        if verdict == "completed" and pg_idempotency.permanent_failure_of(result) is not None:
            # the operation ended in a permanent failure: this delivery fails as that one did
            self.on_verdict({**event, "action": "failed permanently"})
            raise PermanentFailure(pg_idempotency.permanent_failure_of(result))
        if verdict in ("completed", "skipped", "held"):
            self.on_verdict({**event, "action": "ack"})
            return result
        if verdict == "in_progress":
            self.on_verdict({**event, "action": "retry"})
            raise self.retry(countdown=lease)
        if verdict not in ("run", "verify"):
            raise RuntimeError(f"unknown verdict {verdict}")

        self.on_verdict({**event, "action": "work"})
        beat = pg_idempotency.Heartbeat(job_type, key, attempt, every,
                                        dsn=self.dsn).start()
        try:
            self.request.idempotency = {"attempt": attempt, "verify": verdict == "verify"}
            # the sign-off points (docs/signoff-protocol.md; "continue" at
            # once unless IDEMPOTENCY_SIGNOFF is set): claimed inside the
            # heartbeat, before the body; "fail" there is a known failure
            if pg_idempotency.signoff_point("claimed", job_type, key, claimed,
                                            heartbeat=True) == "fail":
                raise KnownFailure("the sign-off runner answered fail at claimed")
            value = self.run(*args, **kwargs)
            beat.stop()
            # handled: the body returned, the heartbeat stopped, not completed
            pg_idempotency.signoff_point("handled", job_type, key, claimed, heartbeat=True)
        except KnownFailure as failure:
            beat.stop()
            try:
                pg_idempotency.release(job_type, key, attempt, dsn=self.dsn,
                                       reconnect_for=self._reconnect_for(lease))
            except psycopg.Error as err:
                # still claimed: the next delivery meets it (in_progress, then
                # the policy once the lease ran out)
                log.warning("%s %s: release_operation failed: %s", self.name, key, err)
                raise self.retry(exc=err, countdown=lease)
            # a later delivery claims attempt + 1; wait less than half the
            # lease, so that the sweeper (a released record nobody claimed
            # for a lease) does not re-enqueue it too
            delay = min(self.retry_delay(attempt - 1), lease / 2)
            self.on_verdict({**event, "action": "released", "retry_in": delay})
            raise self.retry(exc=failure, countdown=delay)
        except PermanentFailure as failure:
            # refused for good: the operation ends (completed, the refusal its
            # result), the task fails without a retry (state FAILURE)
            beat.stop()
            if not self._end_operation(event, "failed permanently", lambda: pg_idempotency.fail_permanently(
                    job_type, key, attempt, str(failure), dsn=self.dsn,
                    reconnect_for=self._reconnect_for(lease), delivery=PERMANENT_DELIVERY)):
                return None
            raise failure
        except Exception:
            # uncertain (or the sign-off runner could not be asked: a
            # SignoffError): the claim is left to its lease. Celery acknowledges
            # the failed task (task_acks_on_failure_or_timeout), so no
            # delivery will meet the claim again: the sweeper finds it
            self.on_verdict({**event, "action": "failed"})
            raise
        finally:
            beat.stop()
        if not self._end_operation(event, "completed", lambda: pg_idempotency.complete(
                job_type, key, attempt, value, dsn=self.dsn, reconnect_for=self._reconnect_for(lease))):
            return None
        return value

    def _end_operation(self, event, action, end):
        """end() completes the claim (with its value, or as a permanent
        failure); reports action. False: the claim was taken over after its
        lease ran out (ID003), and the new owner records the operation. Any
        other error (the database stayed unreachable) leaves the claim to its
        lease, reported as failed, and is raised."""
        try:
            end()
        except psycopg.Error as err:
            if err.sqlstate != "ID003":
                self.on_verdict({**event, "action": "failed", "sqlstate": err.sqlstate or "connection"})
                raise
            self.on_verdict({**event, "action": "superseded"})
            return False
        self.on_verdict({**event, "action": action})
        return True
