"""test_helper.py: focused tests of idempotency_celery.py's verdict mapping
that need a database but no broker (the task runs in-process, as a worker's
tracer runs it):

    /usr/bin/python3 test_helper.py     # in examples/celery; PG* environment;
                                        # the extension is created if missing

run -> the body runs, completed #1; verify (lookup policy, aged claim) -> the
body sees self.request.idempotency {"verify": True, "attempt": 2}, completed
#2; completed, held (hold policy, aged claim), skipped (skip policy, aged
claim) -> the body does not run, the task returns (acknowledged);
in_progress (a young claim) -> the body does not run, self.retry raises
celery.exceptions.Retry with countdown = the lease.

Extension 0.3: a claim whose reply is lost with its connection (the server
recorded it) is sent once more on a new connection with the same delivery
token and gets its own claim back (run #1, not in_progress), also when the
database then stays unreachable for a while (refused connections,
PgBouncer's 08P01); another
transaction's uncommitted claim of the key answers in_progress at once
(wait => false), and with claim_wait > 0 the claim's lock_timeout (55P03) is
retried like in_progress.

The acknowledging verdicts go through task.apply() (Celery's eager tracer).
in_progress does not: apply() answers a Retry by applying the task again at
once, ignoring the countdown, so a young claim would loop; instead the task is
called with an eager request pushed (what apply() pushes), where self.retry
raises Retry and publishes nothing.
"""
import os
import time
import unittest
import uuid

import psycopg
from celery import Celery
from celery.exceptions import Retry

import idempotency_celery
from idempotency_celery import IdempotentTask

LEASE = 1.0
PREFIX = f"celery_unit_{os.getpid()}_"

app = Celery("idempotency_unit", set_as_current=False)
app.conf.task_eager_propagates = True


class VerdictMappingTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.admin = psycopg.connect("", autocommit=True)
        cls.admin.execute("SET client_min_messages = warning")
        cls.admin.execute("CREATE EXTENSION IF NOT EXISTS idempotency")
        cls.types = []

    @classmethod
    def tearDownClass(cls):
        for t in cls.types:
            cls.admin.execute("DELETE FROM idempotency.operations WHERE job_type = %s", (t,))
            cls.admin.execute("DELETE FROM idempotency.job_types WHERE job_type = %s", (t,))
        cls.admin.close()
        conn = idempotency_celery._db["conn"]
        if conn is not None:
            conn.close()

    def task(self, policy, **options):
        """a job type with this policy and a 1 s lease, and a bound task for
        it; returns (task, calls, verdicts)"""
        t = f"{PREFIX}{policy}_{len(self.types)}"
        self.admin.execute("DELETE FROM idempotency.operations WHERE job_type = %s", (t,))
        self.admin.execute("DELETE FROM idempotency.job_types WHERE job_type = %s", (t,))
        self.admin.execute("INSERT INTO idempotency.job_types (job_type, lease, stale_policy) "
                           "VALUES (%s, make_interval(secs => %s), %s)", (t, LEASE, policy))
        self.types.append(t)
        calls, verdicts = [], []

        def body(self, order):
            calls.append(dict(self.request.idempotency))
            return {"sent": order}

        task = app.task(body, base=IdempotentTask, bind=True, name=t, job_type=t,
                        key_arg="order", lease=LEASE, heartbeat=0.25, **options,
                        on_verdict=lambda _self, e: verdicts.append(f"{e['verdict']}:{e['action']}"))
        return task, calls, verdicts

    def claim_directly(self, task, key):
        """another worker's claim, with the fingerprint the task computes"""
        verdict, = self.admin.execute(
            "SELECT verdict FROM idempotency.claim_operation(%s, %s, %s, 'dead-worker')",
            (task.job_type, key, task.fingerprint((key,), {}))).fetchone()
        self.assertEqual(verdict, "run")

    def age(self, task, key):
        """the claim's worker died an hour ago (as the regression tests age claims)"""
        self.admin.execute("UPDATE idempotency.operations SET claimed_at = claimed_at - interval '1 hour', "
                           "heartbeat_at = heartbeat_at - interval '1 hour' "
                           "WHERE job_type = %s AND operation_key = %s", (task.job_type, key))

    def record(self, task, key):
        row = self.admin.execute("SELECT status::text || ' #' || attempt FROM idempotency.operations "
                                 "WHERE job_type = %s AND operation_key = %s",
                                 (task.job_type, key)).fetchone()
        return row[0] if row else "none"

    def test_run(self):
        task, calls, verdicts = self.task("hold")
        r = task.apply(("K-run",))
        self.assertTrue(r.successful())
        self.assertEqual(r.get(), {"sent": "K-run"})
        self.assertEqual(verdicts, ["run:work", "run:completed"])
        self.assertEqual(calls, [{"attempt": 1, "verify": False}])
        self.assertEqual(self.record(task, "K-run"), "completed #1")

    def test_verify(self):
        task, calls, verdicts = self.task("lookup")
        self.claim_directly(task, "K-verify")
        self.age(task, "K-verify")
        r = task.apply(("K-verify",))
        self.assertTrue(r.successful())
        self.assertEqual(verdicts, ["verify:work", "verify:completed"])
        self.assertEqual(calls, [{"attempt": 2, "verify": True}])
        self.assertEqual(self.record(task, "K-verify"), "completed #2")

    def test_completed(self):
        task, calls, verdicts = self.task("hold")
        task.apply(("K-done",))
        del calls[:], verdicts[:]
        r = task.apply(("K-done",))
        self.assertTrue(r.successful())
        self.assertEqual(r.get(), {"sent": "K-done"})   # the stored result
        self.assertEqual(verdicts, ["completed:ack"])
        self.assertEqual(calls, [])
        self.assertEqual(self.record(task, "K-done"), "completed #1")

    def test_in_progress(self):
        task, calls, verdicts = self.task("hold")
        self.claim_directly(task, "K-busy")   # young: within its lease
        task.push_request(id=str(uuid.uuid4()), args=("K-busy",), kwargs={}, retries=0,
                          is_eager=True, called_directly=False, delivery_info={"is_eager": True})
        try:
            with self.assertRaises(Retry) as cm:
                task("K-busy")
        finally:
            task.pop_request()
        self.assertEqual(cm.exception.when, LEASE)
        self.assertEqual(verdicts, ["in_progress:retry"])
        self.assertEqual(calls, [])
        self.assertEqual(self.record(task, "K-busy"), "claimed #1")

    def call_eagerly(self, task, key):
        """the task called as a worker calls it, with an eager request
        pushed: self.retry raises Retry (apply() would run it again)"""
        task.push_request(id=str(uuid.uuid4()), args=(key,), kwargs={}, retries=0,
                          is_eager=True, called_directly=False, delivery_info={"is_eager": True})
        try:
            return task(key)
        finally:
            task.pop_request()

    def test_lost_reply_gets_its_claim_back(self):
        task, calls, verdicts = self.task("hold")
        real = idempotency_celery.connection()

        class LosesTheReply:
            """runs the claim on the server (recorded, autocommit), then the
            connection is gone before the reply is read"""
            closed = False

            def execute(self, sql, params=None):
                real.execute(sql, params)
                real.close()
                self.closed = True
                raise psycopg.OperationalError("server closed the connection unexpectedly")

        idempotency_celery._db["conn"] = LosesTheReply()
        # not apply(): without the token the claim again would be answered
        # in_progress, and apply() would loop on the Retry
        self.assertEqual(self.call_eagerly(task, "K-lost"), {"sent": "K-lost"})
        self.assertEqual(verdicts, ["claim error:again", "run:work", "run:completed"])
        self.assertEqual(calls, [{"attempt": 1, "verify": False}])
        self.assertEqual(self.record(task, "K-lost"), "completed #1")

    def test_unreachable_database_is_waited_out_with_the_same_token(self):
        # the claim is recorded and its reply lost; then the database cannot
        # be reached for a while (a PgBouncer restart; PgBouncer refusing
        # logins after a PostgreSQL restart, with its own SQLSTATE 08P01 on a
        # connection that still looks open): the helper keeps trying with the
        # same token and gets its claim back, instead of self.retry (a new
        # token: in_progress for a lease)
        task, calls, verdicts = self.task("hold")
        real = idempotency_celery.connection()
        failures = []

        class LosesTheReply:
            closed = False

            def execute(self, sql, params=None):
                real.execute(sql, params)
                real.close()
                self.closed = True
                raise psycopg.OperationalError("server closed the connection unexpectedly")

        class PoolerError(psycopg.errors.ProtocolViolation):
            sqlstate = "08P01"

        class StillOpen:
            closed = False

            def execute(self, sql, params=None):
                raise PoolerError("server login has been failing, try again later (server_login_retry)")

            def close(self):
                pass

        connect = idempotency_celery.connection

        def flaky(dsn=""):
            failures.append(1)
            if len(failures) == 1:
                return LosesTheReply()
            if len(failures) == 2:
                raise psycopg.OperationalError("connection refused")
            if len(failures) == 3:
                return StillOpen()
            return connect(dsn)

        idempotency_celery.connection = flaky
        try:
            self.assertEqual(self.call_eagerly(task, "K-away"), {"sent": "K-away"})
        finally:
            idempotency_celery.connection = connect
        # tries after 0, 0.1, 0.2 s: within reconnect_for, here half the 1 s lease
        self.assertEqual(verdicts, ["claim error:again"] * 3 + ["run:work", "run:completed"])
        self.assertEqual(calls, [{"attempt": 1, "verify": False}])
        self.assertEqual(self.record(task, "K-away"), "completed #1")

    def test_stuck_transaction_answers_in_progress_at_once(self):
        task, calls, verdicts = self.task("hold")
        stuck = psycopg.connect("", autocommit=False)
        try:
            stuck.execute("SELECT idempotency.claim_operation(%s, 'K-stuck')", (task.job_type,))
            t0 = time.time()
            with self.assertRaises(Retry) as cm:
                self.call_eagerly(task, "K-stuck")
            self.assertLess(time.time() - t0, 5)   # not blocked by the open transaction
        finally:
            stuck.rollback()
            stuck.close()
        self.assertEqual(cm.exception.when, LEASE)
        self.assertEqual(verdicts, ["in_progress:retry"])
        self.assertEqual(calls, [])
        self.assertEqual(self.record(task, "K-stuck"), "none")

    def test_claim_wait_lock_timeout_is_retried_like_in_progress(self):
        task, calls, verdicts = self.task("hold", claim_wait=0.2)
        stuck = psycopg.connect("", autocommit=False)
        try:
            stuck.execute("SELECT idempotency.claim_operation(%s, 'K-wait')", (task.job_type,))
            with self.assertRaises(Retry) as cm:
                self.call_eagerly(task, "K-wait")
        finally:
            stuck.rollback()
            stuck.close()
        self.assertEqual(cm.exception.when, LEASE)
        self.assertEqual(verdicts, ["claim error:retry"])
        self.assertEqual(calls, [])
        self.assertEqual(self.record(task, "K-wait"), "none")
        # the connection is usable: the lock_timeout was local to the claim
        r = task.apply(("K-wait",))
        self.assertTrue(r.successful(), r.traceback)
        self.assertEqual(self.record(task, "K-wait"), "completed #1")

    def test_held(self):
        task, calls, verdicts = self.task("hold")
        self.claim_directly(task, "K-held")
        self.age(task, "K-held")
        r = task.apply(("K-held",))
        self.assertTrue(r.successful())
        self.assertIsNone(r.get())
        self.assertEqual(verdicts, ["held:ack"])
        self.assertEqual(calls, [])

    def test_skipped(self):
        task, calls, verdicts = self.task("skip")
        self.claim_directly(task, "K-skip")
        self.age(task, "K-skip")
        r = task.apply(("K-skip",))
        self.assertTrue(r.successful())
        self.assertEqual(verdicts, ["skipped:ack"])
        self.assertEqual(calls, [])


if __name__ == "__main__":
    unittest.main(verbosity=2)
