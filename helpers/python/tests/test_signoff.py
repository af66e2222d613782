"""The sign-off points and the job-type map of the plain functions
(docs/signoff-protocol.md), against FakeRunner (conftest): unarmed nothing
is connected; the line's fields; the answers continue and fail; the map in
the records actually written; a malformed map; an unreachable or silent
runner; and real kills (SIGKILL) of a worker process at claimed and at
handled."""
import json
import os
import socket

import psycopg
import pytest

import pg_idempotency as idem
from conftest import check_killed_at, start_worker

LEASE = 1.0


def test_unarmed_connects_nowhere(types, runner, monkeypatch):
    def no_socket(*args, **kwargs):
        raise AssertionError("a socket was made")

    t = types.make("hold", LEASE)
    # empty variables are unset ones; the runner is listening, but not named
    monkeypatch.setenv("IDEMPOTENCY_SIGNOFF", "")
    monkeypatch.setenv("IDEMPOTENCY_SIGNOFF_JOB_TYPES", "")
    monkeypatch.setattr(socket, "socket", no_socket)
    c = idem.claim(t, "K-unarmed")
    assert idem.signoff_point("claimed", t, "K-unarmed", c, heartbeat=True) == "continue"
    assert idem.signoff_point("handled", t, "K-unarmed", c) == "continue"
    idem.complete(t, "K-unarmed", c.attempt)
    assert types.record(t, "K-unarmed") == "completed #1"
    assert idem.signoff_job_type(t) == t
    assert runner.lines == []


def test_variables_are_read_once_per_process(types, runner, monkeypatch):
    t = types.make("hold", LEASE)
    c = idem.claim(t, "K-once")
    assert idem.signoff_point("claimed", t, "K-once", c) == "continue"   # read: unset
    monkeypatch.setenv("IDEMPOTENCY_SIGNOFF", runner.path)   # too late for this process
    assert idem.signoff_point("claimed", t, "K-once", c) == "continue"
    assert runner.lines == []


def test_unknown_point():
    with pytest.raises(ValueError):
        idem.signoff_point("done", "t", "k", None)


def test_the_line(types, runner, admin):
    yours, runs = types.make("lookup", LEASE), types.make("lookup", LEASE)
    runner.arm(job_types=f"other=x,{yours}={runs}")
    c = idem.claim(yours, "K-line")
    assert idem.signoff_point("claimed", yours, "K-line", c, heartbeat=True) == "continue"
    assert idem.signoff_point("handled", yours, "K-line", c) == "continue"
    assert runner.lines == [
        {"v": 1, "point": "claimed", "job_type": runs, "key": "K-line", "attempt": 1,
         "verdict": "run", "pid": os.getpid(), "heartbeat": True},
        {"v": 1, "point": "handled", "job_type": runs, "key": "K-line", "attempt": 1,
         "verdict": "run", "pid": os.getpid(), "heartbeat": False},
    ]
    for raw in runner.raw:   # one line of UTF-8 JSON each, ending in \n
        assert raw.endswith(b"\n") and raw.count(b"\n") == 1
        assert json.loads(raw.decode("utf-8"))["v"] == 1
    # a verify claim: its verdict and attempt
    types.age(runs, "K-line")
    v = idem.claim(yours, "K-line")
    assert (v.verdict, v.attempt) == ("verify", 2)
    idem.signoff_point("claimed", yours, "K-line", v)
    assert (runner.lines[-1]["verdict"], runner.lines[-1]["attempt"]) == ("verify", 2)


def test_judged_line(types, runner):
    t = types.make("hold", LEASE)
    runner.arm()
    assert idem.signoff_point("judged", t, "K-judged", verdict="busy", sqlstate="55P03") == "continue"
    assert runner.lines == [{"v": 1, "point": "judged", "job_type": t, "key": "K-judged",
                             "pid": os.getpid(), "heartbeat": False, "attempt": None,
                             "verdict": "busy", "sqlstate": "55P03"}]
    runner.answer = lambda m: "fail"   # fail is no answer at judged
    with pytest.raises(idem.SignoffError, match=r'unexpected answer "fail" \(expected continue\)'):
        idem.signoff_point("judged", t, "K-judged", verdict="error", sqlstate="ID002")


def test_claim_reports_judged(types, runner, admin):
    """claim() itself reports every answer that runs nothing, once, under
    the run's job type: in_progress, completed, busy (55P03), error (ID002);
    a run reports nothing (its points are the caller's: claimed, handled)"""
    yours, runs = types.make("hold", LEASE), types.make("hold", LEASE)
    runner.arm(job_types=f"{yours}={runs}")
    c = idem.claim(yours, "K-j", "fp")
    assert (c.verdict, runner.lines) == ("run", [])
    assert idem.claim(yours, "K-j", "fp").verdict == "in_progress"
    idem.complete(yours, "K-j", c.attempt)
    assert idem.claim(yours, "K-j", "fp").verdict == "completed"
    with pytest.raises(psycopg.Error) as e:
        idem.claim(yours, "K-j", "other")
    assert e.value.sqlstate == "ID002"
    with psycopg.connect("", autocommit=False) as stuck:   # an uncommitted claim of K-busy
        stuck.execute("SELECT idempotency.claim_operation(%s, 'K-busy', 'fp', 'stuck')", (runs,))
        with pytest.raises(psycopg.Error) as e:
            idem.claim(yours, "K-busy", "fp", wait=0.05)
        assert idem.is_busy(e.value)
    base = {"v": 1, "point": "judged", "job_type": runs, "pid": os.getpid(), "heartbeat": False}
    assert runner.lines == [
        {**base, "key": "K-j", "verdict": "in_progress", "attempt": 1},
        {**base, "key": "K-j", "verdict": "completed", "attempt": 1},
        {**base, "key": "K-j", "verdict": "error", "attempt": None, "sqlstate": "ID002",
         "message": f'operation "K-j" of job type "{runs}" was claimed with a different fingerprint'},
        {**base, "key": "K-busy", "verdict": "busy", "attempt": None, "sqlstate": "55P03"}]


@pytest.fixture
def no_grant_role(admin):
    """a login role with no grant on the extension's schema"""
    role = f"py_unit_nogrant_{os.getpid()}"
    admin.execute(f"DROP ROLE IF EXISTS {role}")
    admin.execute(f"CREATE ROLE {role} LOGIN")
    yield role
    idem.discard(idem._db["conn"])
    admin.execute(f"DROP ROLE IF EXISTS {role}")


def test_claim_errors_reach_the_runner(types, runner, no_grant_role):
    """every claim error is judged, verdict error, with its SQLSTATE and
    message: a role without the grant (42501), an unknown job type (ID001),
    a connection that does not come back within reconnect_for (no SQLSTATE);
    the batch claim reports each of its keys"""
    t = types.make("hold", LEASE)
    runner.arm()
    with pytest.raises(psycopg.Error) as e:
        idem.claim(t, "K-grant", "fp", dsn=f"user={no_grant_role}")
    assert e.value.sqlstate == "42501"
    idem.discard(idem._db["conn"])
    with pytest.raises(psycopg.Error) as e:
        idem.claim_batch(t, ["K-b1", "K-b2"], dsn=f"user={no_grant_role}")
    assert e.value.sqlstate == "42501"
    idem.discard(idem._db["conn"])
    with pytest.raises(psycopg.Error) as e:
        idem.claim("py_unit_no_such_type", "K-type", "fp")
    assert e.value.sqlstate == "ID001"
    idem.discard(idem._db["conn"])
    with pytest.raises(psycopg.OperationalError):
        idem.claim(t, "K-lost", "fp", dsn="host=/nonexistent-socket-dir port=1", reconnect_for=0)
    denied = "permission denied for schema idempotency"
    assert [(m["point"], m["key"], m["verdict"], m["attempt"], m["sqlstate"], m["message"])
            for m in runner.lines[:4]] == [
        ("judged", "K-grant", "error", None, "42501", denied),
        ("judged", "K-b1", "error", None, "42501", denied),
        ("judged", "K-b2", "error", None, "42501", denied),
        ("judged", "K-type", "error", None, "ID001", 'job type "py_unit_no_such_type" is not registered')]
    lost = runner.lines[4]
    assert (lost["key"], lost["verdict"], lost["sqlstate"]) == ("K-lost", "error", None)
    assert lost["message"].startswith("connection") and "\n" not in lost["message"], lost
    assert len(runner.lines) == 5


def test_hello_once_per_process(types, runner, admin):
    """with IDEMPOTENCY_SIGNOFF_HELLO=1 the first exchange of the process is
    the point hello: the helper, the runtime, no queue library (none is
    loaded here unless celery's tests ran: then celery and its version),
    and the database of the claim's connection"""
    import platform
    import sys
    t = types.make("hold", LEASE)
    runner.arm(hello=True)
    c = idem.claim(t, "K-hello")
    assert idem.signoff_point("claimed", t, "K-hello", c) == "continue"
    assert idem.claim(t, "K-hello").verdict == "in_progress"
    assert runner.points() == ["hello", "claimed", "judged"]
    db, port, sysid = admin.execute(idem.DATABASE_SQL).fetchone()
    celery = sys.modules.get("celery")
    assert runner.lines[0] == {
        "v": 1, "point": "hello", "pid": os.getpid(), "helper": "pg_idempotency",
        "helper_version": idem.__version__, "runtime": platform.python_implementation(),
        "runtime_version": platform.python_version(),
        "queue_library": "celery" if celery else None,
        "queue_library_version": celery.__version__ if celery else None,
        "database": db, "server_port": port, "system_identifier": sysid, "wrapper": "plain"}
    assert db == "postgres" or db, db
    assert sysid.isdigit(), sysid


def test_hello_names_the_batch_call_and_a_wrapper(types, runner):
    """the hello's wrapper: "plain_batch" from claim_batch; the name of
    signoff_wrapper's block from a claim inside it (here a wrapper of the
    user's own); the block's name is gone after it"""
    t = types.make("hold", LEASE)
    runner.arm(hello=True)
    idem.claim_batch(t, ["K-b1", "K-b2"])
    assert runner.points() == ["hello"]
    assert runner.lines[0]["wrapper"] == "plain_batch"
    idem._hello_pid = None   # as a new process
    with idem.signoff_wrapper("MyConsumer"):
        idem.claim(t, "K-w1")
    assert runner.points() == ["hello", "hello"]
    assert runner.lines[1]["wrapper"] == "MyConsumer"
    idem._hello_pid = None
    idem.claim(t, "K-w2")
    assert runner.lines[2]["wrapper"] == "plain"


def test_hello_only_for_a_runner_that_asks(types, runner):
    """an older runner exports no IDEMPOTENCY_SIGNOFF_HELLO and would refuse
    the point: no hello; nor for a value other than 1"""
    t = types.make("hold", LEASE)
    runner.arm()
    c = idem.claim(t, "K-nohello")
    idem.signoff_point("claimed", t, "K-nohello", c)
    assert runner.points() == ["claimed"]
    runner.monkeypatch.setenv("IDEMPOTENCY_SIGNOFF_HELLO", "yes")
    idem._signoff = None
    idem.signoff_point("claimed", t, "K-nohello", c)
    assert runner.points() == ["claimed", "claimed"]


def test_hello_at_a_plain_point(types, runner, admin):
    """a worker that claims on a connection of its own reaches a point
    first: hello comes before it, its database from the process's connection
    when there is one, else null"""
    t = types.make("hold", LEASE)
    runner.arm(hello=True)
    assert idem.signoff_point("judged", t, "K-plain", verdict="busy", sqlstate="55P03") == "continue"
    assert runner.points() == ["hello", "judged"]
    assert (runner.lines[0]["database"], runner.lines[0]["system_identifier"]) == (None, None)
    assert runner.lines[0]["wrapper"] == "plain"


def test_fail_at_claimed_is_returned(types, runner):
    t = types.make("hold", LEASE)
    runner.arm()
    runner.answer = lambda m: "fail"
    c = idem.claim(t, "K-fail")
    assert idem.signoff_point("claimed", t, "K-fail", c) == "fail"
    # fail is no answer at handled
    with pytest.raises(idem.SignoffError, match=r'unexpected answer "fail" \(expected continue\)'):
        idem.signoff_point("handled", t, "K-fail", c)


@pytest.mark.parametrize("answer, error", [
    (None, "the runner closed the connection without an answer line"),
    (b"contin", "the runner closed the connection without an answer line"),
    ("maybe", r'unexpected answer "maybe" \(expected continue or fail\)'),
    ("continue\r", r'unexpected answer "continue\\r"'),
])
def test_other_answers_raise(types, runner, answer, error):
    t = types.make("hold", LEASE)
    runner.arm()
    runner.answer = lambda m: answer
    c = idem.claim(t, "K-other")
    with pytest.raises(idem.SignoffError, match=error):
        idem.signoff_point("claimed", t, "K-other", c)
    assert len(runner.lines) == 1   # never tried again


def test_unreachable_runner_raises(types, runner):
    t = types.make("hold", LEASE)
    runner.arm(socket_path=os.path.join(runner.dir, "nobody.sock"))
    c = idem.claim(t, "K-away")
    with pytest.raises(idem.SignoffError, match="nobody.sock") as e:
        idem.signoff_point("claimed", t, "K-away", c)
    assert isinstance(e.value.__cause__, OSError)


def test_map_applies_to_every_call(types, runner, admin):
    yours, runs, other = (types.make("hold", LEASE) for _ in range(3))
    runner.arm(job_types=f"{yours}={runs}")
    c = idem.claim(yours, "K-map")
    assert types.record(runs, "K-map") == "claimed #1"
    before, = admin.execute("SELECT heartbeat_at FROM idempotency.operations "
                            "WHERE job_type = %s AND operation_key = 'K-map'", (runs,)).fetchone()
    assert idem.extend_lease(yours, "K-map", c.attempt) > before
    idem.release(yours, "K-map", c.attempt)
    assert types.record(runs, "K-map") == "released #1"
    c = idem.claim(yours, "K-map")
    idem.complete(yours, "K-map", c.attempt, {"ok": 1})
    assert types.record(runs, "K-map") == "completed #2"
    assert types.record(yours, "K-map") == "none"
    # a job type the map does not name is used as given
    idem.complete(other, "K-map", idem.claim(other, "K-map").attempt)
    assert types.record(other, "K-map") == "completed #1"


@pytest.mark.parametrize("spec", ["a", "x=", "=y", "x=y,", ",", "x=y,x=z"])
def test_malformed_map_raises_and_touches_nothing(types, runner, spec):
    t = types.make("hold", LEASE)
    c = idem.claim(t, "K-bad")   # unarmed: the user's own claim
    runner.arm(job_types=spec.replace("x", t))
    for call in (lambda: idem.claim(t, "K-bad"),
                 lambda: idem.claim(t, "K-new"),
                 lambda: idem.extend_lease(t, "K-bad", c.attempt),
                 lambda: idem.release(t, "K-bad", c.attempt),
                 lambda: idem.complete(t, "K-bad", c.attempt),
                 lambda: idem.signoff_job_type(t),
                 lambda: idem.signoff_point("claimed", t, "K-bad", c)):
        with pytest.raises(idem.SignoffError, match="IDEMPOTENCY_SIGNOFF_JOB_TYPES"):
            call()
    assert types.record(t, "K-bad") == "claimed #1"
    assert types.record(t, "K-new") == "none"
    assert runner.lines == []


def test_fail_at_claimed_releases_without_the_handler(types, runner, tmp_path):
    yours, runs = types.make("hold", LEASE), types.make("hold", LEASE)
    runner.answer = lambda m: "fail"
    effect = tmp_path / "effect"
    worker = start_worker("plain", yours, "K-wfail", effect, signoff=runner.path,
                          job_types=f"{yours}={runs}", lease=LEASE)
    out, _ = worker.communicate(timeout=60)
    assert worker.returncode == 3, out
    assert runner.points() == ["claimed"]
    assert types.record(runs, "K-wfail") == "released #1"
    assert types.record(yours, "K-wfail") == "none"
    assert not effect.exists()


def test_continue_completes(types, runner, tmp_path):
    yours, runs = types.make("hold", LEASE), types.make("hold", LEASE)
    effect = tmp_path / "effect"
    worker = start_worker("plain", yours, "K-wok", effect, signoff=runner.path,
                          job_types=f"{yours}={runs}", lease=LEASE)
    out, _ = worker.communicate(timeout=60)
    assert worker.returncode == 0, out
    assert runner.points() == ["claimed", "handled"]
    assert {m["pid"] for m in runner.lines} == {worker.pid}
    assert types.record(runs, "K-wok") == "completed #1"
    assert effect.read_text() == "K-wok\n"


@pytest.mark.parametrize("point", ["claimed", "handled"])
def test_killed_at(point, types, runner, tmp_path):
    check_killed_at(runner, point, "plain", types, tmp_path)
