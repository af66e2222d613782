"""The portable edition's plain script that the package carries
(docs/helpers.md, "The portable edition's script"): portable_sql(),
install_portable(conn) and `python3 -m pg_idempotency portable-sql`. The
script is installed twice in a database of its own (created and dropped
here: the role needs CREATEDB): edition() answers 'portable' at the
release's version, and the second run changes no catalog row (the same oids
too) and no record. Where the C edition answers in the tests' database, the
script refuses it (55000) and nothing changes."""
import os
import subprocess
import sys

import psycopg
import pytest

import pg_idempotency as idem

# every function (signature, source, grants, settings, comment) and
# relation (kind, grants, comment) of the schema with its oid, every
# trigger, every job type and record: the same text in the three helpers'
# tests
SNAPSHOT_SQL = """
SELECT md5(string_agg(t, E'\\n' ORDER BY t)) FROM (
    SELECT p.oid::int || ' ' || p.oid::regprocedure::text || p.prosrc || coalesce(p.proacl::text, '')
           || coalesce(p.proconfig::text, '') || coalesce(obj_description(p.oid, 'pg_proc'), '') AS t
    FROM pg_proc p WHERE p.pronamespace = 'idempotency'::regnamespace
    UNION ALL SELECT c.oid::int || ' ' || c.oid::regclass::text || c.relkind::text || coalesce(c.relacl::text, '')
           || coalesce(obj_description(c.oid, 'pg_class'), '')
    FROM pg_class c WHERE c.relnamespace = 'idempotency'::regnamespace
    UNION ALL SELECT t.oid::int || ' ' || pg_get_triggerdef(t.oid)
    FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid WHERE c.relnamespace = 'idempotency'::regnamespace
    UNION ALL SELECT 'j ' || j::text FROM idempotency.job_types j
    UNION ALL SELECT 'o ' || o::text FROM idempotency.operations o) x"""

RELEASE = ".".join(idem.__version__.split(".")[:2])   # the package 0.5.0 carries the script of 0.5


def test_the_script_is_plain_sql_of_this_release():
    sql = idem.portable_sql()
    assert sql.startswith("/*\n * idempotency " + RELEASE + ", portable edition, as a plain script")
    lines = sql.splitlines()
    assert "BEGIN;" in lines and lines[-1] == "COMMIT;"
    assert not [line for line in lines if line.startswith("\\")], "a psql meta-command"


def test_python_m_prints_the_script():
    out = subprocess.run([sys.executable, "-m", "pg_idempotency", "portable-sql"],
                         capture_output=True, text=True, check=True)
    assert out.stdout == idem.portable_sql()
    bad = subprocess.run([sys.executable, "-m", "pg_idempotency", "nonsense"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stdout == "" and "portable-sql" in bad.stderr


@pytest.fixture
def scratch(admin):
    """a new database of the test, owned by the tests' role; dropped after"""
    name = f"py_unit_portable_{os.getpid()}"
    admin.execute(f"DROP DATABASE IF EXISTS {name}")
    try:
        admin.execute(f"CREATE DATABASE {name}")
    except psycopg.errors.InsufficientPrivilege:
        pytest.skip("the tests' role may not create a database (CREATEDB)")
    try:
        yield name
    finally:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def test_install_portable_twice_changes_nothing(scratch):
    with psycopg.connect(dbname=scratch) as conn:
        conn.execute("SET client_min_messages = warning")
        conn.commit()
        assert idem.install_portable(conn) == ("portable", RELEASE)
        assert conn.autocommit is False and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        # a job type and a claim in flight, kept by the second run
        conn.execute("INSERT INTO idempotency.job_types (job_type, lease, stale_policy) "
                     "VALUES ('portable_t', interval '1 minute', 'retry')")
        conn.execute("SELECT idempotency.claim_operation('portable_t', 'K1', 'fp', 'w', delivery => 'd1')")
        conn.commit()
        before = conn.execute(SNAPSHOT_SQL).fetchone()[0]
        conn.commit()
        assert idem.install_portable(conn) == ("portable", RELEASE)
        assert conn.execute(SNAPSHOT_SQL).fetchone()[0] == before
        assert conn.execute("SELECT status::text, attempt FROM idempotency.operations "
                            "WHERE job_type = 'portable_t'").fetchone() == ("claimed", 1)
        conn.commit()
        # in a transaction of the caller's: refused, nothing run
        conn.execute("SELECT 1")
        with pytest.raises(psycopg.ProgrammingError, match="in a transaction"):
            idem.install_portable(conn)
        conn.rollback()


def test_the_printed_script_installs_with_psql(scratch):
    """what a user does with the printed script: psql -f, as the role"""
    out = subprocess.run([sys.executable, "-m", "pg_idempotency", "portable-sql"],
                         capture_output=True, check=True).stdout
    psql = subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", scratch, "-c",
                           "SET client_min_messages = warning", "-f", "-"],
                          input=out, capture_output=True)
    assert psql.returncode == 0, psql.stderr
    with psycopg.connect(dbname=scratch, autocommit=True) as conn:
        assert conn.execute("SELECT edition, version FROM idempotency.edition()").fetchone() == ("portable", RELEASE)


def test_refused_where_the_c_edition_answers(admin):
    if admin.execute("SELECT edition FROM idempotency.edition()").fetchone()[0] != "c":
        pytest.skip("the C edition does not answer in the tests' database")
    with psycopg.connect("") as conn:
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="extension"):
            idem.install_portable(conn)
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert conn.execute("SELECT edition FROM idempotency.edition()").fetchone() == ("c",)
