"""pg_idempotency.celery.IdempotentTask's verdict mapping, in-process (the
task runs as a worker's tracer runs it; no broker):

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
PgBouncer's 08P01); another transaction's uncommitted claim of the key
answers in_progress at once (wait => false), and with claim_wait > 0 the
claim's lock_timeout (55P03) is retried like in_progress.

The acknowledging verdicts go through task.apply() (Celery's eager tracer).
in_progress does not: apply() answers a Retry by applying the task again at
once, ignoring the countdown, so a young claim would loop; instead the task is
called with an eager request pushed (what apply() pushes), where self.retry
raises Retry and publishes nothing.

The sign-off points (docs/signoff-protocol.md) against FakeRunner
(conftest): claimed inside the heartbeat before the body, handled after the
body with the heartbeat stopped, before the completion; fail at claimed
releases without the body; an unreachable or silent runner and a malformed
job-type map fail the task; the run's job type gets the records; and a
worker process running the task is killed with SIGKILL at each point.

Skipped when Celery is not installed, unless PG_IDEMPOTENCY_TEST_CELERY=1
(the repository's hook sets it: there a missing Celery fails).
"""
import os
import socket
import time
import uuid

import psycopg
import pytest

if os.environ.get("PG_IDEMPOTENCY_TEST_CELERY") == "1":
    import celery  # noqa: F401
else:
    pytest.importorskip("celery")

from celery import Celery                      # noqa: E402
from celery.exceptions import Retry            # noqa: E402

import pg_idempotency                          # noqa: E402
from pg_idempotency.celery import IdempotentTask, PermanentFailure   # noqa: E402
from conftest import check_killed_at            # noqa: E402

LEASE = 1.0

app = Celery("idempotency_unit", set_as_current=False)
app.conf.task_eager_propagates = True


@pytest.fixture
def make_task(types):
    def make(policy, **options):
        """a job type with this policy and a 1 s lease, and a bound task for
        it; returns (task, calls, verdicts)"""
        t = types.make(policy, LEASE)
        calls, verdicts = [], []

        def body(self, order):
            calls.append(dict(self.request.idempotency))
            return {"sent": order}

        task = app.task(body, base=IdempotentTask, bind=True, name=t, job_type=t,
                        key_arg="order", lease=LEASE, heartbeat=0.25, **options,
                        on_verdict=lambda _self, e: verdicts.append(f"{e['verdict']}:{e['action']}"))
        return task, calls, verdicts
    return make


def claim_directly(admin, task, key):
    """another worker's claim, with the fingerprint the task computes"""
    verdict, = admin.execute(
        "SELECT verdict FROM idempotency.claim_operation(%s, %s, %s, 'dead-worker')",
        (task.job_type, key, task.fingerprint((key,), {}))).fetchone()
    assert verdict == "run"


def call_eagerly(task, key):
    """the task called as a worker calls it, with an eager request
    pushed: self.retry raises Retry (apply() would run it again)"""
    task.push_request(id=str(uuid.uuid4()), args=(key,), kwargs={}, retries=0,
                      is_eager=True, called_directly=False, delivery_info={"is_eager": True})
    try:
        return task(key)
    finally:
        task.pop_request()


def test_run(make_task, types):
    task, calls, verdicts = make_task("hold")
    r = task.apply(("K-run",))
    assert r.successful()
    assert r.get() == {"sent": "K-run"}
    assert verdicts == ["run:work", "run:completed"]
    assert calls == [{"attempt": 1, "verify": False}]
    assert types.record(task.job_type, "K-run") == "completed #1"


def test_verify(make_task, types, admin):
    task, calls, verdicts = make_task("lookup")
    claim_directly(admin, task, "K-verify")
    types.age(task.job_type, "K-verify")
    r = task.apply(("K-verify",))
    assert r.successful()
    assert verdicts == ["verify:work", "verify:completed"]
    assert calls == [{"attempt": 2, "verify": True}]
    assert types.record(task.job_type, "K-verify") == "completed #2"


def test_completed(make_task, types):
    task, calls, verdicts = make_task("hold")
    task.apply(("K-done",))
    del calls[:], verdicts[:]
    r = task.apply(("K-done",))
    assert r.successful()
    assert r.get() == {"sent": "K-done"}   # the stored result
    assert verdicts == ["completed:ack"]
    assert calls == []
    assert types.record(task.job_type, "K-done") == "completed #1"


def test_in_progress(make_task, types, admin):
    task, calls, verdicts = make_task("hold")
    claim_directly(admin, task, "K-busy")   # young: within its lease
    task.push_request(id=str(uuid.uuid4()), args=("K-busy",), kwargs={}, retries=0,
                      is_eager=True, called_directly=False, delivery_info={"is_eager": True})
    try:
        with pytest.raises(Retry) as cm:
            task("K-busy")
    finally:
        task.pop_request()
    assert cm.value.when == LEASE
    assert verdicts == ["in_progress:retry"]
    assert calls == []
    assert types.record(task.job_type, "K-busy") == "claimed #1"


def test_lost_reply_gets_its_claim_back(make_task, types):
    task, calls, verdicts = make_task("hold")
    real = pg_idempotency.connection()

    class LosesTheReply:
        """runs the claim on the server (recorded, autocommit), then the
        connection is gone before the reply is read"""
        closed = False

        def execute(self, sql, params=None):
            real.execute(sql, params)
            real.close()
            self.closed = True
            raise psycopg.OperationalError("server closed the connection unexpectedly")

    pg_idempotency._db["conn"] = LosesTheReply()
    # not apply(): without the token the claim again would be answered
    # in_progress, and apply() would loop on the Retry
    assert call_eagerly(task, "K-lost") == {"sent": "K-lost"}
    assert verdicts == ["claim error:again", "run:work", "run:completed"]
    assert calls == [{"attempt": 1, "verify": False}]
    assert types.record(task.job_type, "K-lost") == "completed #1"


def test_unreachable_database_is_waited_out_with_the_same_token(make_task, types, monkeypatch):
    # the claim is recorded and its reply lost; then the database cannot
    # be reached for a while (a PgBouncer restart; PgBouncer refusing
    # logins after a PostgreSQL restart, with its own SQLSTATE 08P01 on a
    # connection that still looks open): the helper keeps trying with the
    # same token and gets its claim back, instead of self.retry (a new
    # token: in_progress for a lease)
    task, calls, verdicts = make_task("hold")
    real = pg_idempotency.connection()
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

    connect = pg_idempotency.connection

    def flaky(dsn=""):
        failures.append(1)
        if len(failures) == 1:
            return LosesTheReply()
        if len(failures) == 2:
            raise psycopg.OperationalError("connection refused")
        if len(failures) == 3:
            return StillOpen()
        return connect(dsn)

    monkeypatch.setattr(pg_idempotency, "connection", flaky)
    assert call_eagerly(task, "K-away") == {"sent": "K-away"}
    monkeypatch.undo()
    # tries after 0, 0.1, 0.2 s: within reconnect_for, here half the 1 s lease
    assert verdicts == ["claim error:again"] * 3 + ["run:work", "run:completed"]
    assert calls == [{"attempt": 1, "verify": False}]
    assert types.record(task.job_type, "K-away") == "completed #1"


def test_stuck_transaction_answers_in_progress_at_once(make_task, types):
    task, calls, verdicts = make_task("hold")
    stuck = psycopg.connect("", autocommit=False)
    try:
        stuck.execute("SELECT idempotency.claim_operation(%s, 'K-stuck')", (task.job_type,))
        t0 = time.time()
        with pytest.raises(Retry) as cm:
            call_eagerly(task, "K-stuck")
        assert time.time() - t0 < 5   # not blocked by the open transaction
    finally:
        stuck.rollback()
        stuck.close()
    assert cm.value.when == LEASE
    assert verdicts == ["in_progress:retry"]
    assert calls == []
    assert types.record(task.job_type, "K-stuck") == "none"


def test_claim_wait_lock_timeout_is_retried_like_in_progress(make_task, types):
    task, calls, verdicts = make_task("hold", claim_wait=0.2)
    stuck = psycopg.connect("", autocommit=False)
    try:
        stuck.execute("SELECT idempotency.claim_operation(%s, 'K-wait')", (task.job_type,))
        with pytest.raises(Retry) as cm:
            call_eagerly(task, "K-wait")
    finally:
        stuck.rollback()
        stuck.close()
    assert cm.value.when == LEASE
    assert verdicts == ["claim error:retry"]
    assert calls == []
    assert types.record(task.job_type, "K-wait") == "none"
    # the connection is usable: the lock_timeout was local to the claim
    r = task.apply(("K-wait",))
    assert r.successful(), r.traceback
    assert types.record(task.job_type, "K-wait") == "completed #1"


def test_held(make_task, admin, types):
    task, calls, verdicts = make_task("hold")
    claim_directly(admin, task, "K-held")
    types.age(task.job_type, "K-held")
    r = task.apply(("K-held",))
    assert r.successful()
    assert r.get() is None
    assert verdicts == ["held:ack"]
    assert calls == []


def test_skipped(make_task, admin, types):
    task, calls, verdicts = make_task("skip")
    claim_directly(admin, task, "K-skip")
    types.age(task.job_type, "K-skip")
    r = task.apply(("K-skip",))
    assert r.successful()
    assert verdicts == ["skipped:ack"]
    assert calls == []


# -- the sign-off points -------------------------------------------------------
def signoff_task(make_task, types, runner):
    """a task whose job type the armed runner maps to a job type of the run's"""
    task, calls, verdicts = make_task("hold")
    runs = types.make("hold", LEASE)
    runner.arm(job_types=f"{task.job_type}={runs}")
    return task, calls, verdicts, runs


def test_signoff_unarmed_connects_nowhere(make_task, types, runner, monkeypatch):
    def no_socket(*args, **kwargs):
        raise AssertionError("a socket was made")

    task, calls, verdicts = make_task("hold")
    monkeypatch.setattr(socket, "socket", no_socket)
    r = task.apply(("K-unarmed",))
    assert r.successful(), r.traceback
    assert verdicts == ["run:work", "run:completed"]
    assert types.record(task.job_type, "K-unarmed") == "completed #1"
    assert runner.lines == []


def test_signoff_points_around_the_heartbeat(make_task, types, runner):
    task, calls, verdicts, runs = signoff_task(make_task, types, runner)
    seen = {}

    def answer(m):
        """what the database and the body show while the worker waits"""
        with psycopg.connect("", autocommit=True) as db:
            def row():
                return db.execute("SELECT status::text, heartbeat_at FROM idempotency.operations "
                                  "WHERE job_type = %s AND operation_key = %s",
                                  (runs, m["key"])).fetchone()
            status, beat = row()
            if m["point"] == "claimed":
                # the heartbeat runs (a beat every 0.25 s moves heartbeat_at)
                deadline = time.monotonic() + 10
                while row()[1] == beat and time.monotonic() < deadline:
                    time.sleep(0.05)
                seen["claimed"] = (status, row()[1] != beat, list(calls))
            else:
                time.sleep(0.75)   # three beats' time: no beat, it has stopped
                seen["handled"] = (status, row()[1] == beat, list(calls))
        return "continue"

    runner.answer = answer
    r = task.apply(("K-points",))
    assert r.successful(), r.traceback
    assert seen == {"claimed": ("claimed", True, []),
                    "handled": ("claimed", True, [{"attempt": 1, "verify": False}])}
    line = {"v": 1, "job_type": runs, "key": "K-points", "attempt": 1, "verdict": "run",
            "pid": os.getpid(), "heartbeat": True}
    assert runner.lines == [{**line, "point": "claimed"}, {**line, "point": "handled"}]
    assert verdicts == ["run:work", "run:completed"]
    assert types.record(runs, "K-points") == "completed #1"
    assert types.record(task.job_type, "K-points") == "none"


def test_signoff_hello_names_the_wrapper(make_task, types, runner):
    """the point hello of a process whose first claim is IdempotentTask's
    names it (wrapper "IdempotentTask") and Celery"""
    import celery
    task, calls, verdicts, runs = signoff_task(make_task, types, runner)
    runner.arm(job_types=f"{task.job_type}={runs}", hello=True)
    r = task.apply(("K-hello",))
    assert r.successful(), r.traceback
    assert runner.points() == ["hello", "claimed", "handled"]
    hello = runner.lines[0]
    assert (hello["wrapper"], hello["queue_library"], hello["queue_library_version"]) == \
        ("IdempotentTask", "celery", celery.__version__)
    assert pg_idempotency._WRAPPER.get() is None   # the task's block ended


def test_signoff_judged_reports_every_other_answer(make_task, types, runner, admin):
    """judged: completed, in_progress, an ID002 error (and nothing else of
    those deliveries: no claimed, no handled); always answered continue"""
    task, calls, verdicts, runs = signoff_task(make_task, types, runner)
    assert task.apply(("K-judged",)).successful()
    assert task.apply(("K-judged",)).successful()            # completed
    admin.execute("SELECT idempotency.claim_operation(%s, 'K-young', %s, 'dead-worker')",
                  (runs, task.fingerprint(("K-young",), {})))
    with pytest.raises(Retry):
        call_eagerly(task, "K-young")                        # in_progress
    admin.execute("SELECT idempotency.claim_operation(%s, 'K-other', 'sha256:other', 'w')", (runs,))
    with pytest.raises(psycopg.Error):
        call_eagerly(task, "K-other")                        # ID002
    got = [(m["point"], m["key"], m["verdict"], m["attempt"], m.get("sqlstate", "-"))
           for m in runner.lines]
    assert got == [("claimed", "K-judged", "run", 1, "-"), ("handled", "K-judged", "run", 1, "-"),
                   ("judged", "K-judged", "completed", 1, "-"),
                   ("judged", "K-young", "in_progress", 1, "-"),
                   ("judged", "K-other", "error", None, "ID002")]
    assert {m["job_type"] for m in runner.lines} == {runs}
    assert verdicts[-2:] == ["in_progress:retry", "claim error:fail"]


def test_signoff_lease_sets_the_timings(make_task, types, runner, admin):
    """a task configured for a 600 s lease (a heartbeat every 150 s) under a
    run's lease of 0.4 s: it beats while held at claimed, and looks at an
    in_progress message again after 0.4 s"""
    t = types.make("hold", LEASE)

    def body(self, order):
        return {"sent": order}

    task = app.task(body, base=IdempotentTask, bind=True, name=f"{t}_long", job_type="long_job",
                    key_arg="order", lease=600)
    runner.arm(job_types=f"long_job={t}", lease="0.4")
    beating = {}

    def answer(m):
        if m["point"] == "claimed":
            with psycopg.connect("", autocommit=True) as db:
                def beat():
                    return db.execute("SELECT heartbeat_at FROM idempotency.operations "
                                      "WHERE job_type = %s AND operation_key = %s", (t, m["key"])).fetchone()[0]
                first, deadline = beat(), time.monotonic() + 5
                while beat() == first and time.monotonic() < deadline:
                    time.sleep(0.02)
                beating[m["key"]] = beat() != first
        return "continue"

    runner.answer = answer
    assert task.apply(("K-long",)).successful()
    assert beating == {"K-long": True}
    admin.execute("SELECT idempotency.claim_operation(%s, 'K-held', %s, 'dead-worker')",
                  (t, task.fingerprint(("K-held",), {})))
    with pytest.raises(Retry) as cm:
        call_eagerly(task, "K-held")
    assert cm.value.when == 0.4
    for bad in ("0", "-1", "soon", "nan", "inf"):
        runner.arm(lease=bad)
        with pytest.raises(pg_idempotency.SignoffError, match="IDEMPOTENCY_SIGNOFF_LEASE"):
            call_eagerly(task, "K-bad")
    assert types.record(t, "K-bad") == "none"


def test_signoff_fail_at_claimed_releases_without_the_body(make_task, types, runner):
    task, calls, verdicts, runs = signoff_task(make_task, types, runner)
    runner.answer = lambda m: "fail"
    with pytest.raises(Retry) as cm:
        call_eagerly(task, "K-fail")
    assert 0 < cm.value.when <= LEASE / 2   # the known failure's backoff
    assert runner.points() == ["claimed"]
    assert verdicts == ["run:work", "run:released"]
    assert calls == []
    assert types.record(runs, "K-fail") == "released #1"
    assert types.record(task.job_type, "K-fail") == "none"


@pytest.mark.parametrize("where", ["unreachable", "claimed", "handled"])
def test_signoff_without_an_answer_fails_the_task(make_task, types, runner, where):
    task, calls, verdicts, runs = signoff_task(make_task, types, runner)
    if where == "unreachable":
        runner.arm(job_types=f"{task.job_type}={runs}", socket_path=runner.path + ".nobody")
    runner.answer = lambda m: None if m["point"] == where else "continue"   # None: closed
    with pytest.raises(pg_idempotency.SignoffError):
        task.apply(("K-silent",))
    assert verdicts == ["run:work", "run:failed"]
    assert calls == ([] if where != "handled" else [{"attempt": 1, "verify": False}])
    assert types.record(runs, "K-silent") == "claimed #1"   # left to its lease


def test_signoff_malformed_map_fails_before_the_claim(make_task, types, runner):
    task, calls, verdicts = make_task("hold")
    runner.arm(job_types=f"{task.job_type}")
    with pytest.raises(pg_idempotency.SignoffError, match="IDEMPOTENCY_SIGNOFF_JOB_TYPES"):
        task.apply(("K-bad",))
    assert verdicts == [] and calls == [] and runner.lines == []
    assert types.record(task.job_type, "K-bad") == "none"


@pytest.mark.parametrize("point", ["claimed", "handled"])
def test_signoff_killed_at(point, types, runner, tmp_path):
    check_killed_at(runner, point, "celery", types, tmp_path)


# -- finish_on_sigterm: a pool process finishes the task in hand ------------

@pytest.fixture
def sigterm_seen(monkeypatch):
    """a SIGTERM handler of the test's own (restored afterwards); returns
    the list of the signals it received"""
    import signal
    seen = []
    previous = signal.signal(signal.SIGTERM, lambda signum, _frame: seen.append(signum))
    yield seen
    signal.signal(signal.SIGTERM, previous)


def sigterm_task(make_task, fail=False, **options):
    """a task whose body records the SIGTERM handler it runs under and sends
    itself a SIGTERM (optionally then raising)"""
    import os
    import signal
    task, calls, verdicts = make_task("hold", **options)
    during = []

    def body(self, order):
        during.append(signal.getsignal(signal.SIGTERM))
        os.kill(os.getpid(), signal.SIGTERM)
        if fail:
            raise RuntimeError("the provider's answer was lost")
        return {"sent": order}
    task.run = body.__get__(task)
    return task, during


def test_sigterm_ignored_in_a_pool_process(make_task, types, monkeypatch, sigterm_seen):
    import signal
    import pg_idempotency.celery as pc
    monkeypatch.setattr(pc, "_in_pool_process", True)
    task, during = sigterm_task(make_task)
    assert call_eagerly(task, "K-term") == {"sent": "K-term"}
    assert during == [signal.SIG_IGN]          # ignored while the task ran
    assert sigterm_seen == []                  # so the SIGTERM was not delivered
    assert types.record(task.job_type, "K-term") == "completed #1"
    os_handler = signal.getsignal(signal.SIGTERM)
    assert os_handler not in (signal.SIG_IGN, signal.SIG_DFL)   # the test's handler is back


def test_sigterm_handler_restored_after_a_failure(make_task, types, monkeypatch, sigterm_seen):
    import signal
    import pg_idempotency.celery as pc
    monkeypatch.setattr(pc, "_in_pool_process", True)
    task, during = sigterm_task(make_task, fail=True)
    with pytest.raises(RuntimeError):
        call_eagerly(task, "K-term-fail")
    assert during == [signal.SIG_IGN]
    import os
    os.kill(os.getpid(), signal.SIGTERM)       # the test's handler gets it again
    assert sigterm_seen == [signal.SIGTERM]
    assert types.record(task.job_type, "K-term-fail") == "claimed #1"


def test_sigterm_left_alone_outside_a_pool_process_or_when_off(make_task, monkeypatch, sigterm_seen):
    import signal
    import pg_idempotency.celery as pc
    # the main process (solo pool, eager calls): not a pool process
    monkeypatch.setattr(pc, "_in_pool_process", False)
    task, during = sigterm_task(make_task)
    call_eagerly(task, "K-term-main")
    # a pool process, but finish_on_sigterm = False
    monkeypatch.setattr(pc, "_in_pool_process", True)
    task2, during2 = sigterm_task(make_task, finish_on_sigterm=False)
    call_eagerly(task2, "K-term-off")
    assert during[0] not in (signal.SIG_IGN, signal.SIG_DFL)
    assert during2[0] not in (signal.SIG_IGN, signal.SIG_DFL)
    assert sigterm_seen == [signal.SIGTERM, signal.SIGTERM]   # both delivered to the handler


def test_a_pool_process_is_recognised_by_worker_process_init(monkeypatch):
    import pg_idempotency.celery as pc
    from celery.signals import worker_process_init
    monkeypatch.setattr(pc, "_in_pool_process", False)
    worker_process_init.send(sender=None)
    assert pc._in_pool_process is True


def refusing_task(types, runs=None, **options):
    """a task whose body raises PermanentFailure (the provider said 422)"""
    t = types.make("retry", LEASE)
    calls, verdicts = [], []

    def body(self, order):
        calls.append(order)
        raise PermanentFailure("provider answered 422")

    task = app.task(body, base=IdempotentTask, bind=True, name=t, job_type=t, key_arg="order", lease=LEASE,
                    heartbeat=0.25, **options,
                    on_verdict=lambda _self, e: verdicts.append(f"{e['verdict']}:{e['action']}"))
    return task, calls, verdicts


def test_permanent_failure_ends_the_operation_and_fails_the_task(types, admin):
    """PermanentFailure: completed with the refusal as its result, the task
    in FAILURE without a retry; a later delivery fails the same way without
    running the body"""
    task, calls, verdicts = refusing_task(types)
    r = task.apply(("K-refused",), throw=False)
    assert r.state == "FAILURE" and isinstance(r.result, PermanentFailure), (r.state, r.result)
    assert str(r.result) == "provider answered 422"
    assert verdicts == ["run:work", "run:failed permanently"]
    assert types.record(task.job_type, "K-refused") == "completed #1"
    result, = admin.execute("SELECT result FROM idempotency.operations WHERE job_type = %s AND operation_key = %s",
                            (task.job_type, "K-refused")).fetchone()
    assert result == {"permanent_failure": "provider answered 422"}
    assert pg_idempotency.permanent_failure_of(result) == "provider answered 422"
    # again: no retry was scheduled (apply() would have run it: one call), and
    # a new delivery meets the ended operation: FAILURE, the body not run
    r = task.apply(("K-refused",), throw=False)
    assert r.state == "FAILURE" and str(r.result) == "provider answered 422"
    assert calls == ["K-refused"]
    assert verdicts[2:] == ["completed:failed permanently"]
    assert types.record(task.job_type, "K-refused") == "completed #1"


def test_signoff_ended_before_the_completion(types, runner):
    """armed by a runner that answers it (IDEMPOTENCY_SIGNOFF_ENDED=1), the
    point ended comes after claimed, with the refusal and how the task ends,
    while the record is still claimed; without it, no point ended"""
    task, calls, verdicts = refusing_task(types)
    runs = types.make("retry", LEASE)
    runner.arm(job_types=f"{task.job_type}={runs}", ended=True)
    seen = {}

    def answer(m):
        if m["point"] == "ended":
            seen["record"] = types.record(runs, m["key"])
        return "continue"

    runner.answer = answer
    r = task.apply(("K-ended",), throw=False)
    assert r.state == "FAILURE"
    assert runner.points() == ["claimed", "ended"]
    assert runner.lines[1] == {"v": 1, "point": "ended", "job_type": runs, "key": "K-ended", "attempt": 1,
                               "pid": os.getpid(), "ending": "PermanentFailure",
                               "delivery": "the task in state FAILURE, not retried (Celery)",
                               "message": "provider answered 422"}
    assert seen == {"record": "claimed #1"}
    assert types.record(runs, "K-ended") == "completed #1"


def test_signoff_no_ended_for_an_older_runner(types, runner):
    task, calls, verdicts = refusing_task(types)
    runs = types.make("retry", LEASE)
    runner.arm(job_types=f"{task.job_type}={runs}")
    assert task.apply(("K-old",), throw=False).state == "FAILURE"
    assert runner.points() == ["claimed"]
    assert types.record(runs, "K-old") == "completed #1"
