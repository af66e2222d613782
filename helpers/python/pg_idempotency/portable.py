"""The portable edition's plain script (docs/portable.md), as this release
of pg-idempotency carries it: made from the repository's portable/*.sql when
the package was built (setup.py), so the script and the helpers are of one
release. For an app's migrations, as libraries built on pgmq embed pgmq's
schema:

    import pg_idempotency
    sql = pg_idempotency.portable_sql()       # the script, as text
    pg_idempotency.install_portable(conn)     # or run it on a psycopg connection

    python3 -m pg_idempotency portable-sql > idempotency-portable.sql
"""
from importlib import resources

import psycopg
from psycopg.pq import TransactionStatus

PORTABLE_SQL_FILE = "idempotency-portable.sql"


def portable_sql() -> str:
    """The portable edition's plain script of this release, as text: plain
    SQL with no psql meta-command, one transaction of its own (BEGIN ...
    COMMIT), run by the database's owner (no superuser). A fresh install,
    or the in-place upgrade of an older portable install; run again, it
    changes nothing; it refuses (55000) a database where the C extension is,
    and a newer portable install."""
    try:
        return resources.files(__package__).joinpath(PORTABLE_SQL_FILE).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RuntimeError(
            f"pg_idempotency: {PORTABLE_SQL_FILE} is not in this copy of the package; it is made when the "
            "package is built (pip install of helpers/python, or helpers/portable-sql.sh "
            "helpers/python/pg_idempotency/idempotency-portable.sql in a checkout)") from None


def install_portable(conn) -> tuple:
    """Runs portable_sql() on conn (a psycopg 3 connection, as the
    database's owner) and returns what idempotency.edition() then answers,
    ('portable', VERSION). The script is one transaction of its own, so conn
    must not be in a transaction (psycopg.ProgrammingError otherwise); conn's
    autocommit setting is restored. An error (e.g. 55000: the C extension is
    installed in that database) is raised after the script's transaction was
    rolled back: nothing changed."""
    status = conn.info.transaction_status
    if status != TransactionStatus.IDLE:
        raise psycopg.ProgrammingError(
            "install_portable: the connection is in a transaction (the script runs its own: "
            f"BEGIN ... COMMIT); commit or roll back first (transaction status {status.name})")
    autocommit = conn.autocommit
    conn.autocommit = True
    try:
        try:
            # no parameters: one simple-protocol query, every statement of the script
            conn.execute(portable_sql())
        except BaseException:
            if conn.info.transaction_status == TransactionStatus.INERROR:
                conn.execute("ROLLBACK")
            raise
        return tuple(conn.execute("SELECT edition, version FROM idempotency.edition()").fetchone())
    finally:
        if not conn.closed:
            conn.autocommit = autocommit
