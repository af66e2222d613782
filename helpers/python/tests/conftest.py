"""Shared fixtures. The tests need a PostgreSQL with the extension
idempotency 0.3 or later installed; they connect with libpq's PG* environment
(PGHOST, PGPORT, PGUSER, PGDATABASE, ...), create the extension if missing,
and work in job types of their own (celery_unit_PID_..., py_unit_PID_...),
deleted at the end."""
import os

import psycopg
import pytest

import pg_idempotency


@pytest.fixture(scope="session")
def admin():
    conn = psycopg.connect("", autocommit=True)
    conn.execute("SET client_min_messages = warning")
    conn.execute("CREATE EXTENSION IF NOT EXISTS idempotency")
    version, = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'idempotency'").fetchone()
    if tuple(int(p) for p in version.split(".")) < (0, 3):
        pytest.exit(f"the extension idempotency is {version}; these helpers need "
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
