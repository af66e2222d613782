"""pg_idempotency: the claim protocol of the PostgreSQL extension
`idempotency` (0.3 or later) for any psycopg worker.

    import pg_idempotency as idem

    c = idem.claim("send_confirmation", order, idem.fingerprint({"order": order, "email": email}))
    if c.verdict in ("run", "verify"):
        with idem.Heartbeat("send_confirmation", order, c.attempt, every=150):
            try:
                value = send(order, email)
            except Refused:                    # certainly not sent
                idem.release("send_confirmation", order, c.attempt)
                raise
        idem.complete("send_confirmation", order, c.attempt, value)
    elif c.verdict == "in_progress":
        ...                                    # look again after the lease
    else:                                      # completed, skipped, held
        ...                                    # acknowledge; c.result is the stored result

The Celery task base class is pg_idempotency.celery.IdempotentTask.

The delivery token: claim() makes a uuid4 (or takes delivery=...) and sends
it with the claim. When the claim's connection is lost (the reply may be lost
after the server committed the claim), the claim is sent once more on a new
connection with the same token, and the server gives the claim back: the same
verdict and attempt, instead of in_progress for a whole lease. While the
database cannot be reached (a PgBouncer or PostgreSQL restart, PgBouncer
refusing logins for server_login_retry after one) the call is tried again,
with the same token, after 0, 0.1, 0.2 ... 2 s, for up to reconnect_for
seconds (at least once more); then the error is raised. complete() and
release() are sent again the same way (they are no-ops when repeated). A
connection error is one without a SQLSTATE on a connection psycopg marks
closed, or SQLSTATE class 08 (PgBouncer reports its own failures as 08P01 and
closes the connection) or 57P01-57P03 (the server is shutting down, e.g. a
backend terminated by pg_ctl restart -m fast, or starting up).

One autocommit connection per process (made after a fork), without prepared
statements (prepare_threshold=None): behind PgBouncer in transaction pooling
mode every transaction may run on another server connection, where the
statements psycopg prepares by itself do not exist (26000) or exist already
(42P05).

The bound: claim(wait=0) (the default) claims with wait => false: another
transaction's uncommitted claim of the key is answered in_progress at once.
claim(wait=N), N > 0, waits up to N seconds (wait => true under SET LOCAL
lock_timeout); a claim that times out raises 55P03 (or 57014 from a
statement_timeout): is_busy(err) is true, treat it as in_progress.

The sign-off points (docs/signoff-protocol.md, version 1): only when the
sign-off runner started the worker with IDEMPOTENCY_SIGNOFF (its Unix
socket), signoff_point("claimed" | "handled", ...) tells the runner where the
worker is and waits for its answer ("continue"; "fail" at claimed: release,
do not call the handler; no answer: the runner kills the worker there);
claim() reports the third point, "judged", for an answer that runs nothing.
IDEMPOTENCY_SIGNOFF_JOB_TYPES ("yours=run's,...") maps the job types of
every claim, complete, release and extend_lease (signoff_job_type);
IDEMPOTENCY_SIGNOFF_LEASE is the run's lease (signoff_lease), for the timings
a helper derives from its own lease. They are read once per process; unset,
nothing changes and nothing is connected.
"""
import contextlib
import contextvars
import hashlib
import json
import logging
import os
import platform
import re
import socket
import sys
import threading
import time
import uuid
from typing import Any, Callable, NamedTuple, Optional

import psycopg

from .portable import install_portable, portable_sql  # noqa: F401 -- the portable edition's script

__version__ = "0.5.1"
EXTENSION_VERSION = "0.3"   # the extension version these helpers need (delivery, wait)

__all__ = [
    "BUSY", "Claim", "EXTENSION_VERSION", "Heartbeat", "KnownFailure", "Outcome", "PermanentFailure", "SERVER_GONE",
    "SIGNOFF_VERSION", "SignoffError",
    "claim", "claim_batch", "claim_error_heals", "complete", "complete_batch", "connection",
    "connection_lost", "discard", "error_message", "extend_lease", "fail_permanently", "fingerprint",
    "install_portable", "is_busy", "new_delivery", "parse_job_types", "parse_lease", "permanent_failure_of",
    "permanent_failure_result", "portable_sql", "release", "release_batch", "signoff_answer", "signoff_ended",
    "signoff_ended_message", "signoff_hello", "signoff_hello_armed", "signoff_hello_message", "signoff_job_type",
    "signoff_lease", "signoff_message", "signoff_point", "signoff_wrapper", "with_reconnect", "worker_id",
]

# deprecated names (docs/helpers.md): they still work, with a
# DeprecationWarning, and go away in 0.5.0
_DEPRECATED = {"reconnecting": "with_reconnect", "SIGNOFF_PROTOCOL": "SIGNOFF_VERSION"}


def __getattr__(name):
    if name in _DEPRECATED:
        import warnings
        warnings.warn(f"pg_idempotency.{name} is deprecated, use {_DEPRECATED[name]} "
                      "(removed in 0.6.0)", DeprecationWarning, stacklevel=2)
        return globals()[_DEPRECATED[name]]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

log = logging.getLogger(__name__)


class KnownFailure(Exception):
    """Raise from a job's body when the effect certainly did not happen: the
    claim is released and the job retried (pg_idempotency.celery does so)."""


class PermanentFailure(Exception):
    """Raise from a job's body when the provider refused for good (HTTP 422,
    SMTP 550: the effect did not happen, and asking again with the same
    arguments cannot change that): the operation is ended, completed with
    permanent_failure_result(reason) as its result (the record no longer
    claimed, and it says why), and the delivery fails as the queue library
    fails a job, without a retry (pg_idempotency.celery: the task in state
    FAILURE). A later delivery of the operation meets that result and fails
    the same way, without running. The plain functions: fail_permanently."""


PERMANENT_FAILURE = "permanent_failure"   # the key of the stored result that marks one


def permanent_failure_result(reason):
    """the result a permanent failure completes the operation with:
    {"permanent_failure": reason}"""
    return {PERMANENT_FAILURE: str(reason)}


def permanent_failure_of(result):
    """the reason when a stored result (a completed verdict's Claim.result)
    marks a permanent failure, else None"""
    if isinstance(result, dict) and set(result) == {PERMANENT_FAILURE} and isinstance(result[PERMANENT_FAILURE], str):
        return result[PERMANENT_FAILURE]
    return None


_db = {"pid": None, "conn": None, "in_place": False}
_db_lock = threading.Lock()


def connection(dsn=""):
    """one autocommit connection per worker process (made after the fork);
    replaced when it was closed or broken (psycopg marks it closed, or
    discard() dropped it). prepare_threshold=None: no prepared statements,
    which a pooler in transaction mode would lend to other clients' sessions.
    dsn "" = libpq's PG* environment."""
    with _db_lock:
        if _db["pid"] != os.getpid() or _db["conn"] is None or _db["conn"].closed:
            conn = psycopg.connect(dsn, autocommit=True, prepare_threshold=None)
            try:
                _db["in_place"] = _uses_in_place(conn)
            except BaseException:
                conn.close()
                raise
            _db["conn"] = conn
            _db["pid"] = os.getpid()
        return _db["conn"]


# Citus (extension 0.4): on a worker node that holds the metadata, the four
# single-key calls go to their *_in_place names, which Citus does not plan
# as distributed function calls (idempotency.use_in_place() says where, and
# whether this role may call them); everywhere else, and before 0.4, the
# names stay. Decided once per connection; the one place that knows.
_IN_PLACE = re.compile(r"\bidempotency\.(claim_operation|complete_operation|release_operation|extend_lease)\(")


def _uses_in_place(conn):
    may = conn.execute("SELECT coalesce(pg_catalog.has_function_privilege("
                       "pg_catalog.to_regprocedure('idempotency.use_in_place()'), 'EXECUTE'), false)").fetchone()[0]
    return bool(may) and bool(conn.execute("SELECT idempotency.use_in_place()").fetchone()[0])


def _sql(conn, sql):
    """sql for conn: its single-key calls renamed *_in_place where
    use_in_place() said so (a Citus worker), else as it is"""
    if _db.get("in_place") and _db["conn"] is conn:
        return _IN_PLACE.sub(lambda m: f"idempotency.{m.group(1)}_in_place(", sql)
    return sql


def discard(conn):
    """close a connection that failed with a connection error (it may still
    look open: PgBouncer's 08P01), so that connection() opens a new one"""
    if conn is None:
        return
    with _db_lock:
        if _db["conn"] is conn:
            _db["conn"] = None
    try:
        conn.close()
    except Exception:   # noqa: BLE001 -- it is being thrown away
        pass


CLAIM_SQL = ("SELECT verdict, attempt, result FROM idempotency.claim_operation("
             "%s, %s, %s, %s, delivery => %s, wait => %s)")
BUSY = ("55P03", "57014")   # lock_timeout, statement_timeout: the claim hit its bound

# the server is going away or not there yet: admin_shutdown (a fast
# shutdown or restart terminates the backend, even in the middle of a call),
# crash_shutdown, cannot_connect_now (starting up, shutting down)
SERVER_GONE = ("57P01", "57P02", "57P03")


def connection_lost(err, conn):
    """the error is the connection's (lost, closed by the server, refused,
    or PgBouncer's own: class 08), not the statement's"""
    if not isinstance(err, psycopg.Error):
        return False
    code = err.sqlstate
    if code is not None and (code.startswith("08") or code in SERVER_GONE):
        return True
    return isinstance(err, (psycopg.OperationalError, psycopg.InterfaceError)) and \
        (conn is None or conn.closed)


def claim_error_heals(err):
    """Can the same claim succeed later? No for the caller's bugs: ID002
    (the operation key was claimed with a different fingerprint) and class
    22 (bad input). Yes for everything else, first of all for errors without
    a SQLSTATE (the connection failed or was lost)."""
    code = getattr(err, "sqlstate", None)
    return not (code is not None and (code == "ID002" or code.startswith("22")))


def is_busy(err):
    """the claim hit its bound (claim(wait=N)'s lock_timeout, a
    statement_timeout): treat it as in_progress"""
    return getattr(err, "sqlstate", None) in BUSY


def error_message(err):
    """the error's primary message, one line (the sign-off point judged's
    message): the server's, else the first line of the client's text"""
    diag = getattr(err, "diag", None)
    primary = getattr(diag, "message_primary", None) if diag is not None else None
    text = primary or str(err) or type(err).__name__
    return text.strip().splitlines()[0] if text.strip() else type(err).__name__


def new_delivery():
    """a delivery token: one per handler invocation, never stored in the
    message (a redelivered copy of the message is another delivery)"""
    return str(uuid.uuid4())


def worker_id():
    """the claim's worker column: host/pid-N"""
    return f"{socket.gethostname()}/pid-{os.getpid()}"


def fingerprint(arguments):
    """sha256 of the job's arguments by name (JSON, keys sorted): the same
    for the same arguments however they were passed"""
    body = json.dumps(arguments, sort_keys=True, separators=(",", ":"), default=str)
    return "sha256:" + hashlib.sha256(body.encode()).hexdigest()


def with_reconnect(call: Callable[[Any], Any], *, dsn="", reconnect_for=30.0,
                   on_lost: Optional[Callable[[Exception], None]] = None):
    """call(conn) on the process's connection; after a connection error
    on a new connection, after 0, 0.1, 0.2 ... 2 s, until reconnect_for
    seconds have passed since the first error (at least once more);
    on_lost(err) before each new try. Other errors are raised at once."""
    deadline = None
    pause = 0.0
    while True:
        conn = None
        try:
            conn = connection(dsn)
            return call(conn)
        except psycopg.Error as err:
            if not connection_lost(err, conn):
                raise
            discard(conn)
            now = time.monotonic()
            if deadline is None:
                deadline = now + max(0.0, reconnect_for)
            elif now + pause > deadline:
                raise
            if on_lost is not None:
                on_lost(err)
            time.sleep(pause)
            pause = min(2.0, max(0.1, pause * 2))


class Claim(NamedTuple):
    verdict: str          # run | verify | completed | in_progress | held | skipped
    attempt: int
    result: Any           # the stored result (verdict completed), else None
    delivery: str         # the delivery token the claim was sent with

    @property
    def runs(self):
        """run or verify: do the work (verify: check first whether the
        effect of an earlier attempt happened), then complete()"""
        return self.verdict in ("run", "verify")


def claim(job_type, key, fingerprint=None, worker=None, *, delivery=None, wait=0.0,
          dsn="", reconnect_for=30.0, on_lost=None) -> Claim:
    """idempotency.claim_operation(job_type, key, fingerprint, worker,
    delivery => token, wait => wait > 0). Sent again on a new connection
    with the same token while the connection is lost (see with_reconnect).
    wait: seconds to wait for another transaction's uncommitted claim of the
    key (0: not at all, in_progress at once). Raises psycopg.Error: ID002
    (other fingerprint) and class 22 are the caller's bugs
    (claim_error_heals(err) is false); is_busy(err): as in_progress; anything
    else may heal: try again later with a new delivery. job_type is mapped
    by signoff_job_type (here, in complete, release and extend_lease).

    An answer that runs nothing (completed, in_progress, held, skipped; the
    bound: verdict busy; any error, a connection lost for longer than
    reconnect_for included: verdict error, with its SQLSTATE and message)
    is the sign-off point "judged" (nothing unless IDEMPOTENCY_SIGNOFF is
    set), reported here, before the caller acknowledges, postpones or fails
    the message; the first claim of an armed process also reports the point
    hello (signoff_hello) on the claim's connection, naming what made the
    claim: the wrapper of signoff_wrapper, else "plain"."""
    yours = job_type
    job_type = signoff_job_type(job_type)   # before anything is sent
    delivery = delivery or new_delivery()
    params = (job_type, key, fingerprint, worker_id() if worker is None else worker, delivery)

    used = []   # the connection the claim went to, for the sign-off point hello

    def call(conn):
        used[:] = [conn]
        if wait and wait > 0:
            with conn.transaction():
                conn.execute("SELECT set_config('lock_timeout', %s, true)",
                             (f"{max(1, round(wait * 1000))}ms",))
                return conn.execute(_sql(conn, CLAIM_SQL), params + (True,)).fetchone()
        return conn.execute(_sql(conn, CLAIM_SQL), params + (False,)).fetchone()

    try:
        verdict, attempt, result = with_reconnect(call, dsn=dsn, reconnect_for=reconnect_for,
                                                  on_lost=on_lost)
    except psycopg.Error as err:
        signoff_hello(used[0] if used else None, wrapper=_WRAPPER.get() or "plain")
        signoff_point("judged", yours, key, verdict="busy" if is_busy(err) else "error",
                      sqlstate=err.sqlstate, message=error_message(err))
        raise
    signoff_hello(used[0] if used else None, wrapper=_WRAPPER.get() or "plain")
    claimed = Claim(verdict, attempt, result, delivery)
    if not claimed.runs:
        signoff_point("judged", yours, key, claimed)
    return claimed


def _write(function, params, *, dsn, reconnect_for, on_lost):
    sql = f"SELECT idempotency.{function}({', '.join(['%s'] * len(params))})"
    if on_lost is None:
        def on_lost(err):
            log.warning("%s: %s; once more on a new connection", function, err)
    with_reconnect(lambda conn: conn.execute(_sql(conn, sql), params), dsn=dsn,
                   reconnect_for=reconnect_for, on_lost=on_lost)


def complete(job_type, key, attempt, result=None, *, dsn="", reconnect_for=30.0, on_lost=None):
    """idempotency.complete_operation(job_type, key, attempt, result as
    JSON); again on a new connection while the connection is lost (a repeated
    completion is a no-op). ID003: another worker took the claim over after
    its lease ran out (it records the effect)."""
    job_type = signoff_job_type(job_type)
    _write("complete_operation", (job_type, key, attempt, json.dumps(result)),
           dsn=dsn, reconnect_for=reconnect_for, on_lost=on_lost)


def release(job_type, key, attempt, *, dsn="", reconnect_for=30.0, on_lost=None):
    """idempotency.release_operation(job_type, key, attempt): the effect did
    not happen, the next claim runs attempt + 1; again on a new connection
    while the connection is lost (a repeated release is a no-op)"""
    job_type = signoff_job_type(job_type)
    _write("release_operation", (job_type, key, attempt),
           dsn=dsn, reconnect_for=reconnect_for, on_lost=on_lost)


def fail_permanently(job_type, key, attempt, reason, *, dsn="", reconnect_for=30.0, on_lost=None,
                     delivery="left to the caller"):
    """End the operation of a permanent refusal (PermanentFailure): the
    sign-off point ended (nothing unless a sign-off runner that answers it
    started the worker), then complete() with permanent_failure_result(reason)
    as the result. The caller then fails the message the way its queue fails
    a job, without a retry (and, meeting that result in a later completed
    verdict, fails it again without running): `delivery` says how, for the
    sign-off report. ID003 as complete()."""
    signoff_ended(job_type, key, attempt, reason, delivery=delivery)
    complete(job_type, key, attempt, permanent_failure_result(reason), dsn=dsn,
             reconnect_for=reconnect_for, on_lost=on_lost)


CLAIMS_SQL = ("SELECT operation_key, verdict, attempt, result FROM idempotency.claim_operations("
              "%s, %s::text[], %s::text[], %s, deliveries => %s::text[], wait => %s)")


class Outcome(NamedTuple):
    """one key's row of complete_batch or release_batch"""
    key: str
    attempt: int
    done: bool            # completed (released) now, or already by this attempt
    sqlstate: Optional[str]   # else the refusal: ID003 taken over, ID004 no record, ID005 wrong state
    message: Optional[str]


def claim_batch(job_type, keys, fingerprints=None, worker=None, *, deliveries=None, wait=0.0,
                dsn="", reconnect_for=30.0, on_lost=None) -> list:
    """idempotency.claim_operations(job_type, keys, fingerprints, worker,
    deliveries => tokens, wait => wait > 0): many keys of one job type in one
    call and one commit (at most 1000). Returns one Claim per key, in the
    order of `keys`, each with the verdict claim() would give it (a key given
    twice is two deliveries: run, then in_progress). fingerprints and
    deliveries are parallel to keys; a token per key is made unless given.
    Sent again, with the same tokens, while the connection is lost.

    The server answers or refuses the call as a whole: ID002 (one key's
    other fingerprint), class 22, or the bound (55P03, 57014) raise
    psycopg.Error and record nothing; claim those keys one by one with
    claim() to find the bad one (as the Node.js idempotentBatch does). Every
    key answered anything but run or verify is reported at the sign-off point
    "judged", as claim() does; so is every key, with the verdict error, when
    the call fails otherwise (42501, ID001, a lost connection). The point
    hello names "plain_batch" (or the wrapper of signoff_wrapper)."""
    keys = [str(k) for k in keys]
    yours = job_type
    job_type = signoff_job_type(job_type)   # before anything is sent
    deliveries = list(deliveries) if deliveries is not None else [new_delivery() for _ in keys]
    fingerprints = list(fingerprints) if fingerprints is not None else None
    if len(deliveries) != len(keys) or (fingerprints is not None and len(fingerprints) != len(keys)):
        raise ValueError("claim_batch: fingerprints and deliveries must be parallel to keys")
    params = (job_type, keys, fingerprints, worker_id() if worker is None else worker, deliveries)

    used = []

    def call(conn):
        used[:] = [conn]
        if wait and wait > 0:
            with conn.transaction():
                conn.execute("SELECT set_config('lock_timeout', %s, true)",
                             (f"{max(1, round(wait * 1000))}ms",))
                return conn.execute(CLAIMS_SQL, params + (True,)).fetchall()
        return conn.execute(CLAIMS_SQL, params + (False,)).fetchall()

    try:
        rows = with_reconnect(call, dsn=dsn, reconnect_for=reconnect_for, on_lost=on_lost)
    except psycopg.Error as err:
        signoff_hello(used[0] if used else None, wrapper=_WRAPPER.get() or "plain_batch")
        if not (is_busy(err) or not claim_error_heals(err)):
            # an error no key alone causes (a grant, a job type, the connection):
            # every key's, as claim() would report it
            for key in keys:
                signoff_point("judged", yours, key, verdict="error", sqlstate=err.sqlstate,
                              message=error_message(err))
        raise
    signoff_hello(used[0] if used else None, wrapper=_WRAPPER.get() or "plain_batch")
    if [r[0] for r in rows] != keys:
        raise RuntimeError(f"claim_operations answered {len(rows)} rows for {len(keys)} keys, "
                           "not one per key in their order")
    claims = [Claim(verdict, attempt, result, d) for (_, verdict, attempt, result), d in zip(rows, deliveries)]
    for key, c in zip(keys, claims):
        if not c.runs:
            signoff_point("judged", yours, key, c)
    return claims


def _outcomes(function, job_type, keys, attempts, extra, *, dsn, reconnect_for, on_lost):
    keys = [str(k) for k in keys]
    attempts = list(attempts)
    if len(attempts) != len(keys) or any(len(e) != len(keys) for e in extra):
        raise ValueError(f"{function}: attempts (and results) must be parallel to keys")
    casts = ["%s", "%s::text[]", "%s::int[]", "%s::jsonb[]"][:3 + len(extra)]
    sql = (f"SELECT operation_key, attempt, done, sqlstate, message FROM idempotency.{function}("
           f"{', '.join(casts)})")
    if on_lost is None:
        def on_lost(err):
            log.warning("%s: %s; once more on a new connection", function, err)
    params = (signoff_job_type(job_type), keys, attempts, *extra)
    rows = with_reconnect(lambda conn: conn.execute(sql, params).fetchall(), dsn=dsn,
                          reconnect_for=reconnect_for, on_lost=on_lost)
    return [Outcome(*r) for r in rows]


def complete_batch(job_type, keys, attempts, results=None, *, dsn="", reconnect_for=30.0,
                   on_lost=None) -> list:
    """idempotency.complete_operations(job_type, keys, attempts, results as
    JSON): many completions in one call. One Outcome per key, in their
    order: done, or the refusal of that key alone (ID003: taken over, the new
    owner records the effect; ID004, ID005). Sent again while the connection
    is lost (a repeated completion is done again)."""
    keys = list(keys)
    results = [None] * len(keys) if results is None else list(results)
    return _outcomes("complete_operations", job_type, keys, attempts, [[json.dumps(r) for r in results]],
                     dsn=dsn, reconnect_for=reconnect_for, on_lost=on_lost)


def release_batch(job_type, keys, attempts, *, dsn="", reconnect_for=30.0, on_lost=None) -> list:
    """idempotency.release_operations(job_type, keys, attempts): many
    releases in one call; one Outcome per key, as complete_batch"""
    return _outcomes("release_operations", job_type, keys, attempts, [],
                     dsn=dsn, reconnect_for=reconnect_for, on_lost=on_lost)


def extend_lease(job_type, key, attempt, *, dsn=""):
    """idempotency.extend_lease(job_type, key, attempt): the lease restarts
    now; returns the new expiry. Tried once: a heartbeat tries again at the
    next beat (a lost connection is replaced then)."""
    job_type = signoff_job_type(job_type)
    conn = None
    try:
        conn = connection(dsn)
        return conn.execute(_sql(conn, "SELECT idempotency.extend_lease(%s, %s, %s)"),
                            (job_type, key, attempt)).fetchone()[0]
    except psycopg.Error as err:
        if connection_lost(err, conn):
            discard(conn)
        raise


class Heartbeat:
    """a daemon thread calling extend_lease every `every` seconds (a
    quarter of the lease is usual) until stop(); stops by itself on ID003
    (another worker took the claim over). A context manager:

        with Heartbeat(job_type, key, c.attempt, every=lease / 4):
            work()
    """

    def __init__(self, job_type, key, attempt, every, *, dsn=""):
        self.job_type, self.key, self.attempt, self.every, self.dsn = job_type, key, attempt, every, dsn
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True,
                                        name=f"heartbeat {job_type} {key}")

    def _beat(self):
        while not self._stop.wait(self.every):
            try:
                extend_lease(self.job_type, self.key, self.attempt, dsn=self.dsn)
            except psycopg.Error as err:
                log.warning("extend_lease %s: %s", self.key, err)
                if err.sqlstate == "ID003":
                    return

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        """no beat after this returns"""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False


# -- the sign-off points (docs/signoff-protocol.md) -----------------------------
SIGNOFF_VERSION = 1   # the version of docs/signoff-protocol.md spoken here
# the answers each point may get
SIGNOFF_ANSWERS = {"claimed": ("continue", "fail"), "judged": ("continue",), "handled": ("continue",)}
# and the optional points hello and ended
_ANSWERS = {**SIGNOFF_ANSWERS, "hello": ("continue",), "ended": ("continue",)}


class SignoffError(RuntimeError):
    """IDEMPOTENCY_SIGNOFF_JOB_TYPES is malformed, or the sign-off runner's
    socket could not be reached, or the runner closed the connection without
    a line or answered something else: the job fails (an armed worker never
    runs without its runner, and never touches your job types by mistake)"""


# the sentences below are the same in the three helpers, tested by
# helpers/conformance/signoff.json (docs/helpers.md)
_MAP_FORM = "yours=run's[,yours2=run's2...]"
_SPACE = " \t\n\r\f\v"   # what is dropped around a side of the map and the lease
_LEASE = re.compile(r"[ \t\n\r\f\v]*\+?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?[ \t\n\r\f\v]*")


def _quoted(text):
    return json.dumps(text, ensure_ascii=False)


def parse_job_types(text):
    """IDEMPOTENCY_SIGNOFF_JOB_TYPES's value "yours=run's[,yours2=run's2...]"
    -> {yours: run's}; None or "" (unset) -> {}. Spaces around a side are
    dropped. Raises SignoffError for an entry without exactly one "=", with
    an empty side, or naming one of your job types twice."""
    mapping = {}
    for entry in text.split(",") if text else ():
        sides = [side.strip(_SPACE) for side in entry.split("=")]
        if len(sides) != 2 or not all(sides):
            raise SignoffError(f"IDEMPOTENCY_SIGNOFF_JOB_TYPES: malformed entry {_quoted(entry)} in "
                               f"{_quoted(text)} (expected {_MAP_FORM}); no job type is used")
        if sides[0] in mapping:
            raise SignoffError(f"IDEMPOTENCY_SIGNOFF_JOB_TYPES: malformed entry {_quoted(entry)} in "
                               f"{_quoted(text)} (the job type {_quoted(sides[0])} is mapped twice); "
                               "no job type is used")
        mapping[sides[0]] = sides[1]
    return mapping


def parse_lease(text):
    """IDEMPOTENCY_SIGNOFF_LEASE's value -> the run's lease in seconds (a
    positive, finite decimal number), None when unset or "". Raises
    SignoffError for anything else."""
    if not text:
        return None
    lease = float(text) if _LEASE.fullmatch(text) else 0.0
    if not (0 < lease < float("inf")):
        raise SignoffError(f"IDEMPOTENCY_SIGNOFF_LEASE: {_quoted(text)} is not a positive number "
                           "of seconds; no job is claimed")
    return lease


# (the runner's socket or None, {your job type: the run's}, the map's error
# or None, the run's lease in seconds or None, the lease's error or None,
# whether the runner answers the point hello, and the point ended)
_signoff = None
_hello_pid = None   # the process that sent its hello


def _settle(parse, text, none):
    try:
        return parse(text), None
    except SignoffError as err:
        return none, err


def _signoff_settings():
    """IDEMPOTENCY_SIGNOFF, IDEMPOTENCY_SIGNOFF_JOB_TYPES and
    IDEMPOTENCY_SIGNOFF_LEASE, read once per process (at the first call; a
    forked process inherits the same); an empty variable is an unset one"""
    global _signoff
    if _signoff is None:
        _signoff = (os.environ.get("IDEMPOTENCY_SIGNOFF") or None,
                    *_settle(parse_job_types, os.environ.get("IDEMPOTENCY_SIGNOFF_JOB_TYPES"), {}),
                    *_settle(parse_lease, os.environ.get("IDEMPOTENCY_SIGNOFF_LEASE"), None),
                    os.environ.get("IDEMPOTENCY_SIGNOFF_HELLO") == "1",
                    os.environ.get("IDEMPOTENCY_SIGNOFF_ENDED") == "1")
    return _signoff


def signoff_lease():
    """the sign-off run's lease in seconds (IDEMPOTENCY_SIGNOFF_LEASE), for
    the timings a helper derives from its configured lease, or None when
    unset; SignoffError when it is not a positive number"""
    lease, error = _signoff_settings()[3:5]
    if error is not None:
        raise SignoffError(str(error))
    return lease


def signoff_job_type(job_type):
    """the job type every call uses: the run's when IDEMPOTENCY_SIGNOFF_JOB_TYPES
    maps job_type to it, else job_type. claim, complete, release,
    extend_lease (so Heartbeat), the batch calls and signoff_point call it
    themselves: pass them your own job type. A malformed map raises
    SignoffError, at every call, before anything is sent."""
    _, mapping, error = _signoff_settings()[:3]
    if error is not None:
        raise SignoffError(str(error))
    return mapping.get(job_type, job_type)


def signoff_message(point, job_type, key, *, attempt=None, verdict=None, heartbeat=False,
                    sqlstate=None, pid=None, message=None):
    """the line (JSON and a newline) sent to the runner at `point`;
    job_type as sent (the run's); sqlstate only with the verdict busy or
    error; message (the error's) only with the verdict error, when given;
    pid: this process's unless given. ValueError for an unknown point."""
    if point not in SIGNOFF_ANSWERS:
        raise ValueError(f"sign-off: unknown point {_quoted(str(point))} (expected claimed, judged or handled)")
    line = {"v": SIGNOFF_VERSION, "point": point, "job_type": job_type, "key": str(key),
            "attempt": attempt, "verdict": verdict, "pid": os.getpid() if pid is None else pid,
            "heartbeat": bool(heartbeat)}
    if verdict in ("busy", "error"):
        line["sqlstate"] = sqlstate
    if verdict == "error" and message is not None:
        line["message"] = str(message)
    return json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n"


def signoff_answer(point, received, where=None):
    """the runner's answer at `point` from what was read (up to the first
    newline, or all it sent before it closed the connection): "continue",
    or "fail" at claimed. SignoffError otherwise; its message starts with
    `where` when given."""
    lead = f"{where}: " if where else ""
    line, newline, _ = received.partition("\n")
    if not newline:
        raise SignoffError(f"{lead}the runner closed the connection without an answer line")
    if line not in _ANSWERS[point]:
        raise SignoffError(f"{lead}unexpected answer {_quoted(line)} "
                           f"(expected {' or '.join(_ANSWERS[point])})")
    return line


def signoff_point(point, job_type, key, claim=None, *, heartbeat=False, verdict=None, sqlstate=None,
                  message=None):
    """The sign-off point `point` of a claim of (job_type, key):

      "claimed"  claim (a Claim) got run or verify: after the claim
                 committed, with the heartbeat (if any) running, before the
                 handler is called;
      "judged"   any other answer, before the message is acknowledged,
                 postponed or failed: a Claim (completed, in_progress, held,
                 skipped), or claim=None with verdict="busy" (55P03, 57014)
                 or verdict="error" (any other error) and its sqlstate and
                 message;
      "handled"  after the handler returned and the heartbeat stopped,
                 before complete().

    Unarmed (IDEMPOTENCY_SIGNOFF unset): returns "continue" at once. Armed:
    sends one line of JSON (signoff_message) to the runner's Unix socket and
    waits, without a timeout, for its answer, which is returned: "continue"
    (go on), or "fail" at claimed (do as on KnownFailure: release the claim
    and retry later, without calling the handler). Instead of answering, the
    runner may kill the process here. Raises SignoffError when the socket
    cannot be reached or the runner closes without a line or answers
    anything else (never tried again). heartbeat: whether a Heartbeat
    extends the lease while the handler runs."""
    if point not in SIGNOFF_ANSWERS:
        raise ValueError(f"sign-off: unknown point {_quoted(str(point))} (expected claimed, judged or handled)")
    path = _signoff_settings()[0]
    if path is None:
        return "continue"
    job_type = signoff_job_type(job_type)
    signoff_hello()   # the process's first exchange: who it is (once)
    line = signoff_message(point, job_type, key,
                           attempt=claim.attempt if claim is not None else None,
                           verdict=claim.verdict if claim is not None else verdict,
                           heartbeat=heartbeat, sqlstate=sqlstate, message=message)
    return _exchange(path, point, line, f"sign-off runner at {path}, point {point} of {job_type}/{key}")


def _exchange(path, point, line, where):
    """one exchange: connect, send the line, read the answer line"""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as runner:
            runner.settimeout(None)   # the runner answers when it decides to
            runner.connect(path)
            runner.sendall(line.encode("utf-8"))
            with runner.makefile("rb") as answers:
                received = answers.readline()
    except OSError as err:
        raise SignoffError(f"{where}: {err}") from err
    return signoff_answer(point, received.decode("utf-8", "replace"), where)


# -- the point hello (docs/signoff-protocol.md) ---------------------------------
DATABASE_SQL = ("SELECT pg_catalog.current_database(), pg_catalog.inet_server_port(), "
                "(SELECT system_identifier::text FROM pg_catalog.pg_control_system())")


def signoff_hello_armed():
    """the point hello is sent: IDEMPOTENCY_SIGNOFF is set and the runner
    exported IDEMPOTENCY_SIGNOFF_HELLO=1 (it answers the point; an older
    runner, which does not, would refuse it)"""
    settings = _signoff_settings()
    return settings[0] is not None and settings[5]


def signoff_hello_message(*, helper, helper_version, runtime, runtime_version, queue_library=None,
                          queue_library_version=None, database=None, server_port=None,
                          system_identifier=None, wrapper=None, pid=None):
    """the line (JSON and a newline) of the point hello: who this worker is,
    what runs its claims (wrapper: "plain", "plain_batch" or a wrapper's
    name) and the database its claims go to (null where unknown)"""
    line = {"v": SIGNOFF_VERSION, "point": "hello", "pid": os.getpid() if pid is None else pid,
            "helper": helper, "helper_version": helper_version, "runtime": runtime,
            "runtime_version": runtime_version, "queue_library": queue_library,
            "queue_library_version": queue_library_version if queue_library is not None else None,
            "database": database, "server_port": server_port, "system_identifier": system_identifier,
            "wrapper": wrapper}
    return json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n"


def _queue_library():
    """(name, version) of the queue library this process runs under, or (None, None)"""
    celery = sys.modules.get("celery")
    if celery is not None:
        return "celery", str(getattr(celery, "__version__", None) or "") or None
    return None, None


def _database_of(conn):
    """(current_database(), inet_server_port(), system identifier) of conn,
    or Nones when there is none or it cannot answer"""
    if conn is None:
        conn = _db["conn"] if _db["pid"] == os.getpid() else None
    if conn is None or conn.closed:
        return None, None, None
    try:
        return tuple(conn.execute(DATABASE_SQL).fetchone())
    except psycopg.Error:
        return None, None, None


# what runs the claims of this thread or task: signoff_wrapper's name, or None
_WRAPPER = contextvars.ContextVar("pg_idempotency_wrapper", default=None)


@contextlib.contextmanager
def signoff_wrapper(name):
    """Inside the block, the claims are made by the wrapper `name`: the
    sign-off point hello reports it as its `wrapper` (the report names it).
    IdempotentTask says "IdempotentTask"; a wrapper of your own may name
    itself. Outside any block claim() reports "plain", claim_batch()
    "plain_batch"."""
    token = _WRAPPER.set(str(name))
    try:
        yield
    finally:
        _WRAPPER.reset(token)


def signoff_hello(conn=None, *, wrapper=None):
    """The point hello, once per process, before its first claimed or
    judged point: the helper, the runtime, the queue library, what makes the
    claims (wrapper; None: signoff_wrapper's name, else "plain") and the
    database of conn (else of the process's connection, if one is open;
    else null). claim() and claim_batch() call it with the claim's
    connection; a worker that claims on a connection of its own calls it
    with that connection before its first point. Nothing unless
    signoff_hello_armed(); the runner answers continue. SignoffError as at
    any point."""
    global _hello_pid
    if _hello_pid == os.getpid() or not signoff_hello_armed():
        return
    _hello_pid = os.getpid()
    queue, queue_version = _queue_library()
    database, port, sysid = _database_of(conn)
    line = signoff_hello_message(helper="pg_idempotency", helper_version=__version__,
                                 runtime=platform.python_implementation(),
                                 runtime_version=platform.python_version(), queue_library=queue,
                                 queue_library_version=queue_version, database=database,
                                 server_port=port, system_identifier=sysid,
                                 wrapper=wrapper or _WRAPPER.get() or "plain")
    path = _signoff_settings()[0]
    _exchange(path, "hello", line, f"sign-off runner at {path}, point hello")


# -- the point ended (docs/signoff-protocol.md) ---------------------------------
def signoff_ended_message(job_type, key, attempt, reason, *, delivery, pid=None):
    """the line (JSON and a newline) of the point ended: the handler raised
    PermanentFailure (reason), the heartbeat stopped, the completion with the
    refusal as its result not sent yet; delivery: how the delivery then ends,
    in the queue library's words"""
    line = {"v": SIGNOFF_VERSION, "point": "ended", "job_type": job_type, "key": str(key), "attempt": attempt,
            "pid": os.getpid() if pid is None else pid, "ending": "PermanentFailure",
            "delivery": str(delivery), "message": str(reason).strip().splitlines()[0] if str(reason).strip() else ""}
    return json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n"


def signoff_ended(job_type, key, attempt, reason, *, delivery):
    """The point ended, before a permanent failure's completion: nothing
    unless IDEMPOTENCY_SIGNOFF is set and the runner exported
    IDEMPOTENCY_SIGNOFF_ENDED=1 (it answers the point; an older runner, which
    does not, would refuse it). The runner answers continue and names the
    ending in its report. SignoffError as at any point."""
    settings = _signoff_settings()
    if settings[0] is None or not settings[6]:
        return
    job_type = signoff_job_type(job_type)
    signoff_hello()
    path = settings[0]
    _exchange(path, "ended", signoff_ended_message(job_type, key, attempt, reason, delivery=delivery),
              f"sign-off runner at {path}, point ended of {job_type}/{key}")
