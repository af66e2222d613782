"""The plain functions of pg_idempotency (no Celery): claim with a delivery
token, complete, release, extend_lease and Heartbeat against the database;
the error classification without one."""
import time
import uuid

import psycopg
import pytest

import pg_idempotency as idem

LEASE = 1.0


class Coded(psycopg.Error):
    """an error with a SQLSTATE of the test's choosing"""

    def __init__(self, sqlstate):
        self._code = sqlstate   # before psycopg's __init__, which reads sqlstate
        super().__init__(f"error {sqlstate}")

    @property
    def sqlstate(self):
        return self._code


class Closed:
    closed = True


class Open:
    closed = False


# -- no database ----------------------------------------------------------
def test_fingerprint_is_by_name_and_by_value():
    a = idem.fingerprint({"order": "ORD-1", "email": "a@example.test"})
    assert a == idem.fingerprint({"email": "a@example.test", "order": "ORD-1"})
    assert a.startswith("sha256:") and len(a) == len("sha256:") + 64
    assert a != idem.fingerprint({"order": "ORD-1", "email": "b@example.test"})


def test_connection_lost():
    lost = psycopg.OperationalError("server closed the connection unexpectedly")
    assert idem.connection_lost(lost, Closed())
    assert idem.connection_lost(lost, None)          # the connect itself failed
    assert not idem.connection_lost(lost, Open())    # the statement's, on a live connection
    assert idem.connection_lost(Coded("08P01"), Open())   # PgBouncer's own
    assert idem.connection_lost(Coded("08006"), Open())
    for code in ("57P01", "57P02", "57P03"):
        assert idem.connection_lost(Coded(code), Open())
    for code in ("ID002", "42501", "40001", "55P03"):
        assert not idem.connection_lost(Coded(code), Closed())
    assert not idem.connection_lost(ValueError("x"), Closed())


def test_claim_error_heals_and_is_busy():
    assert not idem.claim_error_heals(Coded("ID002"))
    assert not idem.claim_error_heals(Coded("22023"))
    for code in (None, "42501", "40001", "40P01", "ID001", "42P01", "25006", "08006"):
        assert idem.claim_error_heals(Coded(code)), code
    assert idem.is_busy(Coded("55P03")) and idem.is_busy(Coded("57014"))
    assert not idem.is_busy(Coded("ID002")) and not idem.is_busy(ValueError())


def test_delivery_and_worker():
    d = idem.new_delivery()
    assert str(uuid.UUID(d)) == d and d != idem.new_delivery()
    assert idem.worker_id().endswith(f"/pid-{__import__('os').getpid()}")


def test_versions():
    assert idem.__version__ == "0.5.1"
    assert idem.EXTENSION_VERSION == "0.3"


# -- against the database ----------------------------------------------------
def test_claim_complete_then_completed(types):
    t = types.make("hold", LEASE)
    c = idem.claim(t, "K-1", idem.fingerprint({"k": 1}))
    assert (c.verdict, c.attempt, c.result, c.runs) == ("run", 1, None, True)
    assert str(uuid.UUID(c.delivery)) == c.delivery
    assert types.record(t, "K-1") == "claimed #1"
    idem.complete(t, "K-1", c.attempt, {"sent": 1})
    idem.complete(t, "K-1", c.attempt, {"sent": 1})   # repeated: a no-op
    assert types.record(t, "K-1") == "completed #1"
    again = idem.claim(t, "K-1", idem.fingerprint({"k": 1}))
    assert (again.verdict, again.attempt, again.result, again.runs) == ("completed", 1, {"sent": 1}, False)


def test_release_then_next_attempt(types):
    t = types.make("hold", LEASE)
    c = idem.claim(t, "K-rel")
    idem.release(t, "K-rel", c.attempt)
    idem.release(t, "K-rel", c.attempt)   # repeated: a no-op
    assert types.record(t, "K-rel") == "released #1"
    c2 = idem.claim(t, "K-rel")
    assert (c2.verdict, c2.attempt) == ("run", 2)


def test_same_delivery_gets_its_claim_back(types):
    t = types.make("hold", LEASE)
    c = idem.claim(t, "K-tok", "fp", "w1")
    assert (c.verdict, c.attempt) == ("run", 1)
    back = idem.claim(t, "K-tok", "fp", "w1", delivery=c.delivery)
    assert (back.verdict, back.attempt, back.delivery) == ("run", 1, c.delivery)
    other = idem.claim(t, "K-tok", "fp", "w1")   # another delivery, inside the lease
    assert (other.verdict, other.attempt) == ("in_progress", 1)


def test_other_fingerprint_is_raised_at_once(types):
    t = types.make("hold", LEASE)
    idem.claim(t, "K-fp", "fp-1")
    lost = []
    with pytest.raises(psycopg.Error) as e:
        idem.claim(t, "K-fp", "fp-2", on_lost=lost.append)
    assert e.value.sqlstate == "ID002"
    assert not idem.claim_error_heals(e.value)
    assert lost == []


def test_lost_reply_is_sent_again_with_the_same_token(types):
    t = types.make("hold", LEASE)
    real = idem.connection()
    sent = []

    class LosesTheReply:
        """runs the claim on the server (recorded, autocommit), then the
        connection is gone before the reply is read"""
        closed = False

        def execute(self, sql, params=None):
            sent.append(params)
            real.execute(sql, params)
            real.close()
            self.closed = True
            raise psycopg.OperationalError("server closed the connection unexpectedly")

    idem._db["conn"] = LosesTheReply()
    lost = []
    c = idem.claim(t, "K-lost", "fp", on_lost=lost.append)
    assert (c.verdict, c.attempt) == ("run", 1)
    assert len(lost) == 1 and isinstance(lost[0], psycopg.OperationalError)
    assert sent[0][4] == c.delivery   # the token the first try carried
    assert types.record(t, "K-lost") == "claimed #1"
    idem.complete(t, "K-lost", c.attempt)
    assert types.record(t, "K-lost") == "completed #1"


def test_unreachable_database_gives_up_after_reconnect_for(monkeypatch):
    tries = []

    def refused(dsn=""):
        tries.append(time.monotonic())
        raise psycopg.OperationalError("connection refused")

    monkeypatch.setattr(idem, "connection", refused)
    lost = []
    t0 = time.monotonic()
    with pytest.raises(psycopg.OperationalError):
        idem.claim("any", "K", reconnect_for=0.5, on_lost=lost.append)
    took = time.monotonic() - t0
    # tries at 0, 0, 0.1 and 0.3 s (pauses 0, 0.1, 0.2); the next, after a
    # pause of 0.4 s, would pass the deadline (0.5 s after the first error)
    assert len(tries) == 4 and len(lost) == 3
    assert 0.28 <= took < 1.0
    tries.clear()
    with pytest.raises(psycopg.OperationalError):
        idem.complete("any", "K", 1, reconnect_for=0)   # at least once more
    assert len(tries) == 2


def test_statement_error_is_not_retried(types, monkeypatch):
    t = types.make("hold", LEASE)
    with pytest.raises(psycopg.Error) as e:
        idem.claim(t, "", "fp")   # an empty key: class 22
    assert e.value.sqlstate.startswith("22")
    assert not idem.claim_error_heals(e.value)


def test_stuck_transaction_in_progress_at_once_or_busy_with_wait(types):
    t = types.make("hold", LEASE)
    stuck = psycopg.connect("", autocommit=False)
    try:
        stuck.execute("SELECT idempotency.claim_operation(%s, 'K-stuck')", (t,))
        t0 = time.monotonic()
        c = idem.claim(t, "K-stuck")
        assert c.verdict == "in_progress"
        assert time.monotonic() - t0 < 5
        with pytest.raises(psycopg.Error) as e:
            idem.claim(t, "K-stuck", wait=0.2)
        assert idem.is_busy(e.value)
    finally:
        stuck.rollback()
        stuck.close()
    # the lock_timeout was local to the claim: the connection claims as before
    c = idem.claim(t, "K-stuck", wait=0.2)
    assert (c.verdict, c.attempt) == ("run", 1)


def test_extend_lease_and_heartbeat(types, admin):
    t = types.make("hold", LEASE)
    c = idem.claim(t, "K-beat")
    before, = admin.execute("SELECT heartbeat_at FROM idempotency.operations "
                            "WHERE job_type = %s AND operation_key = %s", (t, "K-beat")).fetchone()
    expiry = idem.extend_lease(t, "K-beat", c.attempt)
    assert expiry > before
    with idem.Heartbeat(t, "K-beat", c.attempt, every=0.2):
        time.sleep(LEASE * 1.6)
        # kept alive: another delivery still meets a claim inside its lease
        assert idem.claim(t, "K-beat").verdict == "in_progress"
    idem.complete(t, "K-beat", c.attempt)
    assert types.record(t, "K-beat") == "completed #1"


def test_heartbeat_stops_when_taken_over(types):
    t = types.make("retry", LEASE)
    c = idem.claim(t, "K-over")
    types.age(t, "K-over")
    taken = idem.claim(t, "K-over")   # the lease ran out: attempt 2 takes over
    assert (taken.verdict, taken.attempt) == ("run", 2)
    beat = idem.Heartbeat(t, "K-over", c.attempt, every=0.05).start()
    beat._thread.join(5)
    assert not beat._thread.is_alive()   # ID003 ended it
    beat.stop()
    with pytest.raises(psycopg.Error) as e:
        idem.complete(t, "K-over", c.attempt)
    assert e.value.sqlstate == "ID003"


# -- the batch functions -------------------------------------------------------
def test_claim_batch_mixed_verdicts_then_complete_and_release_batch(types):
    t = types.make("hold", LEASE)
    done = idem.claim(t, "B-done")
    idem.complete(t, "B-done", done.attempt, {"n": 0})
    claims = idem.claim_batch(t, ["B-1", "B-2", "B-done", "B-1"], ["fp1", "fp2", None, "fp1"])
    assert [(c.verdict, c.attempt) for c in claims] == [("run", 1), ("run", 1), ("completed", 1),
                                                        ("in_progress", 1)]
    assert claims[2].result == {"n": 0}
    assert len({c.delivery for c in claims}) == 4   # one token per key
    out = idem.complete_batch(t, ["B-1", "B-done"], [1, 1], [{"sent": 1}, None])
    assert out[0] == idem.Outcome("B-1", 1, True, None, None)
    assert (out[1].key, out[1].done) == ("B-done", True)   # already completed by this attempt
    rel = idem.release_batch(t, ["B-2", "B-none"], [1, 1])
    assert rel[0] == idem.Outcome("B-2", 1, True, None, None)
    assert (rel[1].key, rel[1].done, rel[1].sqlstate) == ("B-none", False, "ID004")   # no record
    assert types.record(t, "B-1") == "completed #1"
    assert types.record(t, "B-2") == "released #1"
    assert idem.claim(t, "B-1").result == {"sent": 1}
    assert [(c.verdict, c.attempt) for c in idem.claim_batch(t, ["B-2"])] == [("run", 2)]


def test_claim_batch_refused_as_a_whole_records_nothing(types):
    t = types.make("hold", LEASE)
    idem.claim(t, "B-fp", "fp")
    with pytest.raises(psycopg.Error) as e:
        idem.claim_batch(t, ["B-new", "B-fp"], ["fp", "other"])
    assert e.value.sqlstate == "ID002" and not idem.claim_error_heals(e.value)
    assert types.record(t, "B-new") == "none"
    with pytest.raises(ValueError, match="parallel"):
        idem.claim_batch(t, ["B-a", "B-b"], ["fp"])


def test_claim_batch_lost_reply_same_tokens(types):
    t = types.make("hold", LEASE)
    real = idem.connection()
    sent = []

    class LosesTheReply:
        closed = False

        def execute(self, sql, params=None):
            sent.append(params)
            real.execute(sql, params)
            real.close()
            self.closed = True
            raise psycopg.OperationalError("server closed the connection unexpectedly")

    idem._db["conn"] = LosesTheReply()
    lost = []
    claims = idem.claim_batch(t, ["B-l1", "B-l2"], on_lost=lost.append)
    assert [(c.verdict, c.attempt) for c in claims] == [("run", 1), ("run", 1)]
    assert len(lost) == 1 and sent[0][4] == [c.delivery for c in claims]
    out = idem.complete_batch(t, ["B-l1", "B-l2"], [1, 1])
    assert [o.done for o in out] == [True, True]


def test_claim_batch_stuck_key_in_progress_or_busy_with_wait(types):
    t = types.make("hold", LEASE)
    stuck = psycopg.connect("", autocommit=False)
    try:
        stuck.execute("SELECT idempotency.claim_operation(%s, 'B-stuck')", (t,))
        claims = idem.claim_batch(t, ["B-free", "B-stuck"])
        assert [c.verdict for c in claims] == ["run", "in_progress"]
        with pytest.raises(psycopg.Error) as e:
            idem.claim_batch(t, ["B-free2", "B-stuck"], wait=0.2)
        assert idem.is_busy(e.value)
    finally:
        stuck.rollback()
        stuck.close()
    assert types.record(t, "B-free2") == "none"


def test_complete_batch_taken_over_is_reported_on_its_row(types):
    t = types.make("retry", LEASE)
    c = idem.claim(t, "B-over")
    types.age(t, "B-over")
    assert idem.claim(t, "B-over").attempt == 2
    out, = idem.complete_batch(t, ["B-over"], [c.attempt])
    assert (out.done, out.sqlstate) == (False, "ID003")


# -- the deprecated names (docs/helpers.md) ---------------------------------------
def test_deprecated_names_still_work():
    with pytest.deprecated_call():
        assert idem.reconnecting is idem.with_reconnect
    with pytest.deprecated_call():
        assert idem.SIGNOFF_PROTOCOL == idem.SIGNOFF_VERSION == 1
    with pytest.raises(AttributeError):
        idem.no_such_name   # noqa: B018


def test_fail_permanently(types):
    """the plain functions' PermanentFailure: completed with the refusal as
    its result, which a later claim answers (permanent_failure_of)"""
    jt = types.make("hold", 60)
    c = idem.claim(jt, "K-perm", "fp")
    idem.fail_permanently(jt, "K-perm", c.attempt, "provider answered 422")
    assert types.record(jt, "K-perm") == "completed #1"
    again = idem.claim(jt, "K-perm", "fp")
    assert again.verdict == "completed"
    assert idem.permanent_failure_of(again.result) == "provider answered 422"
    assert idem.permanent_failure_result("x") == {"permanent_failure": "x"}
    assert idem.permanent_failure_of({"sent": 1}) is None and idem.permanent_failure_of(None) is None
    assert idem.permanent_failure_of({"permanent_failure": "x", "more": 1}) is None
