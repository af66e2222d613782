"""idempotency_celery: a Celery task base class for the claim protocol of the
PostgreSQL extension `idempotency`.

    @app.task(base=IdempotentTask, job_type="send_confirmation", key_arg="order", lease=600)
    def send_confirmation(order, email): ...

For every delivery: claim_operation(job type, key, fingerprint, worker);
  run / verify        -> the task body runs, with a heartbeat thread calling
                         extend_lease; then complete_operation; the message is
                         acknowledged (task_acks_late: after the body)
  completed, skipped  -> return the stored result: acknowledged, nothing runs
  in_progress         -> self.retry(countdown=lease): look again after the lease
  held                -> return None: acknowledged; a person decides
                         (resolve_operation)
The body raising KnownFailure (the effect certainly did not happen) releases
the claim and retries at once; any other exception leaves the claim to its
lease (the job type's stale-claim policy decides at the next delivery, or the
sweeper finds it). Use with task_acks_late = True and
task_reject_on_worker_lost = True, so that a killed worker's message is
redelivered.
"""
import hashlib
import inspect
import json
import logging
import os
import socket
import threading

import psycopg
from celery import Task

log = logging.getLogger(__name__)


class KnownFailure(Exception):
    """Raise from the task body when the effect certainly did not happen."""


_db = {"pid": None, "conn": None}
_db_lock = threading.Lock()


def connection(dsn=""):
    """one autocommit connection per worker process (made after the fork)"""
    with _db_lock:
        if _db["pid"] != os.getpid() or _db["conn"] is None or _db["conn"].closed:
            _db["conn"] = psycopg.connect(dsn, autocommit=True)
            _db["pid"] = os.getpid()
        return _db["conn"]


class IdempotentTask(Task):
    job_type = None        # default: the task's name
    key_arg = None         # the argument that names the effect (e.g. "order")
    lease = 600            # seconds, as in idempotency.job_types
    dsn = ""               # libpq connection string; "" = PG* environment
    max_retries = None     # in_progress retries until the other claim ends

    # -- override these as needed ---------------------------------------
    def operation_key(self, args, kwargs):
        bound = inspect.signature(self.run).bind(*args, **kwargs)
        return str(bound.arguments[self.key_arg])

    def fingerprint(self, args, kwargs):
        body = json.dumps([list(args), kwargs], sort_keys=True, separators=(",", ":"))
        return "sha256:" + hashlib.sha256(body.encode()).hexdigest()

    def on_verdict(self, event):
        log.info("%s %s: %s #%s -> %s", self.name, event["key"], event["verdict"],
                 event["attempt"], event["action"])

    # -- the protocol -------------------------------------------------------
    def __call__(self, *args, **kwargs):
        job_type = self.job_type or self.name
        key = self.operation_key(args, kwargs)
        db = connection(self.dsn)
        verdict, attempt, result = db.execute(
            "SELECT verdict, attempt, result FROM idempotency.claim_operation(%s, %s, %s, %s)",
            (job_type, key, self.fingerprint(args, kwargs),
             f"{socket.gethostname()}/pid-{os.getpid()}")).fetchone()
        event = {"key": key, "verdict": verdict, "attempt": attempt,
                 "delivery": (self.request.delivery_info or {}).get("redelivered"),
                 "retries": self.request.retries}

        if verdict in ("completed", "skipped", "held"):
            self.on_verdict({**event, "action": "ack"})
            return result
        if verdict == "in_progress":
            self.on_verdict({**event, "action": "retry"})
            raise self.retry(countdown=self.lease)
        if verdict not in ("run", "verify"):
            raise RuntimeError(f"unknown verdict {verdict}")

        self.on_verdict({**event, "action": "work"})
        stop = threading.Event()

        def heartbeat():
            while not stop.wait(self.lease / 4):
                try:
                    connection(self.dsn).execute("SELECT idempotency.extend_lease(%s, %s, %s)",
                                                 (job_type, key, attempt))
                except psycopg.Error as err:
                    log.warning("extend_lease %s: %s", key, err)
                    if err.sqlstate == "ID003":
                        return

        beat = threading.Thread(target=heartbeat, daemon=True)
        beat.start()
        try:
            self.request.idempotency = {"attempt": attempt, "verify": verdict == "verify"}
            value = self.run(*args, **kwargs)
        except KnownFailure:
            stop.set()
            db.execute("SELECT idempotency.release_operation(%s, %s, %s)", (job_type, key, attempt))
            self.on_verdict({**event, "action": "released"})
            raise self.retry(countdown=0)
        finally:
            stop.set()
            beat.join()
        try:
            db.execute("SELECT idempotency.complete_operation(%s, %s, %s, %s)",
                       (job_type, key, attempt, json.dumps(value)))
        except psycopg.Error as err:
            if err.sqlstate != "ID003":
                raise
            # taken over after the lease ran out: the new owner records it
            self.on_verdict({**event, "action": "superseded"})
            return None
        self.on_verdict({**event, "action": "completed"})
        return value
