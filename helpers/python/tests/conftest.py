"""Shared fixtures. The tests need a PostgreSQL with idempotency 0.3 or
later installed (either edition); they connect with libpq's PG* environment
(PGHOST, PGPORT, PGUSER, PGDATABASE, ...), create the extension if missing,
and work in job types of their own (celery_unit_PID_..., py_unit_PID_...),
deleted at the end.

IDEMPOTENCY_EDITION=portable: the database must hold the portable edition;
where no edition answers, it is installed with this package's
install_portable() (as the database's owner: PGUSER), where the C edition
answers the tests stop. IDEMPOTENCY_EDITION=c: the C extension (created if
missing). Unset: whichever answers, else the C extension is created.

The sign-off tests use FakeRunner (the fixture `runner`): the runner's side
of docs/signoff-protocol.md. Every test starts unarmed (the variables
IDEMPOTENCY_SIGNOFF* removed, the process's reading of them forgotten)."""
import json
import os
import queue
import shutil
import signal
import socketserver
import subprocess
import sys
import tempfile
import threading

import psycopg
import pytest

import pg_idempotency


def installed_edition(conn):
    """(edition, version) of the idempotency that answers in conn's database
    (autocommit), or None: idempotency.edition() (0.5 on, both editions; a
    plain-script install of the portable edition has no pg_extension row),
    else, before 0.5 (or without EXECUTE on it), the C extension's row"""
    try:
        return tuple(conn.execute("SELECT edition, version FROM idempotency.edition()").fetchone())
    except (psycopg.errors.UndefinedFunction, psycopg.errors.InvalidSchemaName,
            psycopg.errors.InsufficientPrivilege):
        row = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'idempotency'").fetchone()
        return ("c", row[0]) if row else None


# the package under test is this checkout's sources (not an installed
# copy): its portable script made as a build makes it
CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if os.path.dirname(os.path.abspath(pg_idempotency.__file__)) == os.path.join(CHECKOUT, "pg_idempotency"):
    subprocess.run(["sh", os.path.join(CHECKOUT, "..", "portable-sql.sh"),
                    os.path.join(CHECKOUT, "pg_idempotency", pg_idempotency.portable.PORTABLE_SQL_FILE)],
                   check=True)

EDITION = os.environ.get("IDEMPOTENCY_EDITION") or None


@pytest.fixture(scope="session")
def admin():
    if EDITION not in (None, "c", "portable"):
        pytest.exit(f"IDEMPOTENCY_EDITION must be c or portable, not {EDITION!r}", returncode=2)
    conn = psycopg.connect("", autocommit=True)
    conn.execute("SET client_min_messages = warning")
    installed = installed_edition(conn)
    if installed is None:
        if EDITION == "portable":
            pg_idempotency.install_portable(conn)
        else:
            conn.execute("CREATE EXTENSION IF NOT EXISTS idempotency")
        installed = installed_edition(conn)
    edition, version = installed
    if EDITION is not None and edition != EDITION:
        pytest.exit(f"IDEMPOTENCY_EDITION={EDITION}, but the {edition} edition ({version}) answers in "
                    f"database {conn.info.dbname}", returncode=1)
    if tuple(int(p) for p in version.split(".")) < (0, 3):
        pytest.exit(f"idempotency {version} ({edition} edition) is installed; these helpers need "
                    f"{pg_idempotency.EXTENSION_VERSION} (ALTER EXTENSION idempotency UPDATE)", returncode=1)
    yield conn
    conn.close()


class JobTypes:
    """job types made for one test module, deleted with their records at the end"""

    def __init__(self, admin, prefix):
        self.admin, self.prefix, self.made = admin, f"{prefix}_{os.getpid()}_", []

    def make(self, policy, lease):
        t = f"{self.prefix}{policy}_{len(self.made)}"
        self.drop(t)
        self.admin.execute("INSERT INTO idempotency.job_types (job_type, lease, stale_policy) "
                           "VALUES (%s, make_interval(secs => %s), %s)", (t, lease, policy))
        self.made.append(t)
        return t

    def drop(self, t):
        self.admin.execute("DELETE FROM idempotency.operations WHERE job_type = %s", (t,))
        self.admin.execute("DELETE FROM idempotency.job_types WHERE job_type = %s", (t,))

    def close(self):
        for t in self.made:
            self.drop(t)

    def age(self, job_type, key):
        """the claim's worker died an hour ago (as the regression tests age claims)"""
        self.admin.execute("UPDATE idempotency.operations SET claimed_at = claimed_at - interval '1 hour', "
                           "heartbeat_at = heartbeat_at - interval '1 hour' "
                           "WHERE job_type = %s AND operation_key = %s", (job_type, key))

    def record(self, job_type, key):
        row = self.admin.execute("SELECT status::text || ' #' || attempt FROM idempotency.operations "
                                 "WHERE job_type = %s AND operation_key = %s",
                                 (job_type, key)).fetchone()
        return row[0] if row else "none"


@pytest.fixture(scope="module")
def types(admin, request):
    """the job types of one test module (prefix: the module's name)"""
    t = JobTypes(admin, request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_") + "_unit")
    yield t
    t.close()


@pytest.fixture(autouse=True)
def fresh_process_connection():
    """every test starts with no process connection and closes the one it made"""
    pg_idempotency.discard(pg_idempotency._db["conn"])
    yield
    pg_idempotency.discard(pg_idempotency._db["conn"])


@pytest.fixture(autouse=True)
def unarmed(monkeypatch):
    """no sign-off variables, and pg_idempotency reads them again (it reads
    them once per process)"""
    monkeypatch.delenv("IDEMPOTENCY_SIGNOFF", raising=False)
    monkeypatch.delenv("IDEMPOTENCY_SIGNOFF_JOB_TYPES", raising=False)
    monkeypatch.delenv("IDEMPOTENCY_SIGNOFF_LEASE", raising=False)
    monkeypatch.delenv("IDEMPOTENCY_SIGNOFF_HELLO", raising=False)
    pg_idempotency._signoff = None
    pg_idempotency._hello_pid = None
    yield
    pg_idempotency._signoff = None
    pg_idempotency._hello_pid = None


class FakeRunner:
    """The sign-off runner's side: a Unix socket server, a thread per
    connection. Each connection's line is kept (.raw: the bytes; .lines: the
    JSON; .arrived: a queue of the JSON, to wait for a point) and answered
    with what .answer(message) returns: a str (sent with "\n"), bytes (sent
    as they are), None (the connection closed without a line) or HOLD (no
    answer: the connection stays open until the worker's end closes, e.g.
    when the test killed the worker)."""
    HOLD = object()

    def __init__(self, monkeypatch):
        self.monkeypatch = monkeypatch
        self.dir = tempfile.mkdtemp(prefix="signoff-")   # short: sun_path has 108 bytes
        self.path = os.path.join(self.dir, "runner.sock")
        self.raw, self.lines, self.arrived = [], [], queue.Queue()
        self.answer = lambda message: "continue"
        runner = self

        class Exchange(socketserver.StreamRequestHandler):
            def handle(self):
                line = self.rfile.readline()
                runner.raw.append(line)
                message = json.loads(line)
                runner.lines.append(message)
                runner.arrived.put(message)
                answer = runner.answer(message)
                if answer is FakeRunner.HOLD:
                    self.rfile.read()   # until the worker's end is closed
                elif isinstance(answer, bytes):
                    self.wfile.write(answer)
                elif answer is not None:
                    self.wfile.write(answer.encode() + b"\n")

        self.server = socketserver.ThreadingUnixStreamServer(self.path, Exchange)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever,
                                       kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def arm(self, job_types=None, socket_path=None, lease=None, hello=False, ended=False):
        """the variables a runner starts the worker with (in this process);
        hello, ended: a runner that answers the point hello, ended"""
        self.monkeypatch.setenv("IDEMPOTENCY_SIGNOFF", socket_path or self.path)
        if hello:
            self.monkeypatch.setenv("IDEMPOTENCY_SIGNOFF_HELLO", "1")
        if ended:
            self.monkeypatch.setenv("IDEMPOTENCY_SIGNOFF_ENDED", "1")
        if job_types is not None:
            self.monkeypatch.setenv("IDEMPOTENCY_SIGNOFF_JOB_TYPES", job_types)
        if lease is not None:
            self.monkeypatch.setenv("IDEMPOTENCY_SIGNOFF_LEASE", lease)
        pg_idempotency._signoff = None

    def points(self):
        return [m["point"] for m in self.lines]

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def runner(monkeypatch):
    r = FakeRunner(monkeypatch)
    yield r
    r.close()


WORKER = os.path.join(os.path.dirname(__file__), "signoff_worker.py")


def start_worker(mode, job_type, key, effect, *, signoff, job_types, lease):
    """tests/signoff_worker.py in a new session (its own process group, as
    the runner starts workers), armed; the package imported from where this
    process imports it"""
    env = dict(os.environ, IDEMPOTENCY_SIGNOFF=signoff, IDEMPOTENCY_SIGNOFF_JOB_TYPES=job_types,
               PYTHONPATH=os.pathsep.join(filter(None, [
                   os.path.dirname(os.path.dirname(pg_idempotency.__file__)),
                   os.environ.get("PYTHONPATH")])))
    return subprocess.Popen([sys.executable, WORKER, mode, job_type, key, str(effect), str(lease)],
                            env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def kill_at(runner, point, mode, types, effect, lease=60):
    """a worker (mode: plain or celery) armed against the runner, its job
    type mapped to the run's; killed with SIGKILL (its process group, as the
    runner does) when it reports `point`. Returns (your job type, the run's)."""
    yours, runs = types.make("hold", lease), types.make("hold", lease)
    runner.answer = lambda m: FakeRunner.HOLD if m["point"] == point else "continue"
    worker = start_worker(mode, yours, "K-kill", effect, signoff=runner.path,
                          job_types=f"{yours}={runs}", lease=lease)
    try:
        while True:
            try:
                message = runner.arrived.get(timeout=60)
            except queue.Empty:
                worker.kill()
                pytest.fail(f"the worker never reached {point}: {worker.communicate()[0]!r}")
            if message["point"] == point:
                break
        assert message["pid"] == worker.pid
        assert (message["job_type"], message["key"]) == (runs, "K-kill")
        os.killpg(worker.pid, signal.SIGKILL)
        assert worker.wait(timeout=60) == -signal.SIGKILL
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        worker.stdout.close()
    return yours, runs


def check_killed_at(runner, point, mode, types, tmp_path):
    """kill_at, and what a death at the point must leave: an uncompleted
    claim of the run's job type, nothing of yours, and the handler's effect
    only after handled"""
    effect = tmp_path / "effect"
    yours, runs = kill_at(runner, point, mode, types, effect)
    assert runner.points() == ["claimed", "handled"][:1 + (point == "handled")]
    assert types.record(runs, "K-kill") == "claimed #1"
    assert types.record(yours, "K-kill") == "none"
    assert effect.exists() == (point == "handled")
    if point == "handled":
        assert effect.read_text() == "K-kill\n"
