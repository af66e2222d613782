#!/usr/bin/python3
"""Extreme and malformed input: clear errors, nothing recorded changed.

    PGHOST=... PGPORT=... PGUSER=postgres /usr/bin/python3 test/fuzz/extremes.py

Keys and job types at and over their limits (1024 and 128 bytes, in ASCII
and in multi-byte UTF-8), non-UTF-8 bytes (through bytea casts and as raw
parameters), huge result documents and fingerprints, very short and very
long leases, max_attempts of 1, attempts at the integer limits, NOTIFY
payloads of the largest keys. Each refused call must fail with the expected
SQLSTATE (never XX000) and leave idempotency.operations, job_types and
resolutions exactly as they were; each accepted one must round-trip.

Runs in its own database (fuzz_extremes, dropped at the end). Known
problems are reported as "TODO" lines and do not fail the run. The last
line is "extremes: N passed, N failed".
"""

import json
import os
import sys

import psycopg
from psycopg import sql

passed = failed = todo = 0


def ok(cond, name, detail=''):
    global passed, failed
    if cond:
        passed += 1
        print(f'ok - {name}')
    else:
        failed += 1
        print(f'not ok - {name}' + (f': {detail}' if detail else ''))


def todo_ok(cond, name, detail=''):
    """A known problem: reported, does not fail the run."""
    global passed, todo
    if cond:
        passed += 1
        print(f'ok - {name} (TODO passes now: make it a plain check)')
    else:
        todo += 1
        print(f'not ok - {name} # TODO {detail}')


def snapshot(conn):
    return [conn.execute(q).fetchall() for q in (
        'SELECT * FROM idempotency.operations ORDER BY job_type, operation_key',
        'SELECT * FROM idempotency.job_types ORDER BY job_type',
        'SELECT * FROM idempotency.resolutions ORDER BY id')]


def call(conn, query, params=()):
    """('ok', rows) or ('error', sqlstate, message)"""
    try:
        cur = conn.execute(query, params)
        return ('ok', cur.fetchall() if cur.description else None)
    except psycopg.Error as e:
        return ('error', e.sqlstate, str(e).split('\n')[0])


def refused(conn, name, query, params, sqlstate):
    """The call fails with sqlstate and changes nothing."""
    before = snapshot(conn)
    r = call(conn, query, params)
    after = snapshot(conn)
    ok(r[0] == 'error' and r[1] == sqlstate, f'{name}: {sqlstate}', f'got {r[:3]}')
    ok(before == after, f'{name}: nothing recorded changed')
    return r


def accepted(conn, name, query, params=()):
    r = call(conn, query, params)
    ok(r[0] == 'ok', name, f'got {r}')
    return r[1] if r[0] == 'ok' else None


def claim(conn, jt, key, fp=None, worker=None):
    r = call(conn, 'SELECT verdict, attempt, result FROM idempotency.claim_operation(%s, %s, %s, %s)',
             (jt, key, fp, worker))
    return tuple(r[1][0]) if r[0] == 'ok' else r


def age(conn, jt, key, interval):
    conn.execute('UPDATE idempotency.operations SET claimed_at = claimed_at - %(i)s::interval,'
                 ' heartbeat_at = heartbeat_at - %(i)s::interval'
                 ' WHERE job_type = %(j)s AND operation_key = %(k)s',
                 {'i': interval, 'j': jt, 'k': key})


def main():
    dbname = 'fuzz_extremes'
    admin_db = os.environ.get('PGDATABASE', 'postgres')
    with psycopg.connect(dbname=admin_db, autocommit=True) as admin:
        admin.execute(sql.SQL('DROP DATABASE IF EXISTS {}').format(sql.Identifier(dbname)))
        admin.execute(sql.SQL('CREATE DATABASE {}').format(sql.Identifier(dbname)))
    try:
        with psycopg.connect(dbname=dbname, autocommit=True) as conn:
            run(conn)
    finally:
        with psycopg.connect(dbname=admin_db, autocommit=True) as admin:
            admin.execute(sql.SQL('DROP DATABASE IF EXISTS {}').format(sql.Identifier(dbname)))
    if todo:
        print(f'{todo} known problem(s) marked TODO above (they do not fail the run)')
    print(f'extremes: {passed} passed, {failed} failed')
    return 1 if failed else 0


def run(conn):
    conn.execute('CREATE EXTENSION idempotency')
    conn.execute("INSERT INTO idempotency.job_types (job_type, lease, stale_policy) VALUES"
                 " ('hold', '1 hour', 'hold'), ('retry1', '1 hour', 'retry')")
    conn.execute("UPDATE idempotency.job_types SET max_attempts = 1 WHERE job_type = 'retry1'")
    # something recorded, so that "nothing changed" has something to watch
    claim(conn, 'hold', 'ORD-1')
    conn.execute("SELECT idempotency.complete_operation('hold', 'ORD-1', 1, '{\"ok\": 1}')")
    claim(conn, 'hold', 'ORD-2')

    # -- keys and job types at and over the limits
    for name, key in (('1024 ASCII bytes', 'k' * 1024), ('512 two-byte characters', 'é' * 512),
                      ('256 four-byte characters', '\U0001F642' * 256)):
        ok(claim(conn, 'hold', key) == ('run', 1, None), f'key of {name}: claimed')
        accepted(conn, f'key of {name}: completed',
                 'SELECT idempotency.complete_operation(%s, %s, 1)', ('hold', key))
        ok(claim(conn, 'hold', key) == ('completed', 1, None), f'key of {name}: completed on redelivery')
    for name, key in (('1025 ASCII bytes', 'k' * 1025), ('513 two-byte characters', 'é' * 513),
                      ('1023 bytes and a two-byte character', 'k' * 1023 + 'é'),
                      ('one megabyte', 'k' * (1 << 20))):
        refused(conn, f'key of {name}', 'SELECT * FROM idempotency.claim_operation(%s, %s)', ('hold', key), '22001')
        refused(conn, f'complete with a key of {name}',
                'SELECT idempotency.complete_operation(%s, %s, 1)', ('hold', key), '22001')
    refused(conn, 'job type of 129 bytes', 'SELECT * FROM idempotency.claim_operation(%s, %s)',
            ('j' * 129, 'ORD-1'), '22001')
    refused(conn, 'registering a job type of 129 bytes',
            'INSERT INTO idempotency.job_types (job_type) VALUES (%s)', ('j' * 129,), '23514')
    accepted(conn, 'registering a job type of 128 bytes',
             'INSERT INTO idempotency.job_types (job_type) VALUES (%s)', ('j' * 128,))
    ok(claim(conn, 'j' * 128, 'ORD-1') == ('run', 1, None), 'job type of 128 bytes: claimed')
    refused(conn, 'empty key', 'SELECT * FROM idempotency.claim_operation(%s, %s)', ('hold', ''), '22023')
    ok(claim(conn, 'hold', ' ') == ('run', 1, None), 'a key of one space is a key')
    ok(claim(conn, 'hold', "x'); DROP TABLE idempotency.operations; --") == ('run', 1, None),
       'a key that looks like SQL is just a key')
    ok(claim(conn, 'hold', 'e\u0301') == ('run', 1, None) and claim(conn, 'hold', '\u00e9') == ('run', 1, None),
       'keys are compared byte for byte: decomposed and composed é are two keys')

    # -- non-UTF-8 bytes
    refused(conn, 'non-UTF-8 bytes through convert_from(bytea)',
            "SELECT * FROM idempotency.claim_operation('hold', convert_from('\\xff41'::bytea, 'UTF8'))",
            (), '22021')
    refused(conn, 'non-UTF-8 bytes through a bytea cast of the job type',
            "SELECT * FROM idempotency.claim_operation(convert_from('\\xc328'::bytea, 'UTF8'), 'ORD-9')",
            (), '22021')
    ok(claim(conn, 'hold', '\\xff41') == ('run', 1, None),
       "a bytea's text form ('\\xff41') is a valid key")
    conn.execute("SET client_encoding = 'LATIN1'")
    r = call(conn, "SELECT verdict FROM idempotency.claim_operation('hold', 'caf' || chr(233))")
    conn.execute("SET client_encoding = 'UTF8'")
    ok(r[0] == 'ok', 'a LATIN1 client is converted to UTF-8 before the extension sees it', str(r))
    before = snapshot(conn)
    try:
        with conn.cursor() as cur:
            # raw bytes that are not UTF-8, sent as a text parameter
            cur.execute(b"SELECT * FROM idempotency.claim_operation('hold', 'raw\xff\xfe')")
        ok(False, 'raw non-UTF-8 bytes in the query text are refused')
    except psycopg.Error as e:
        ok(e.sqlstate == '22021', 'raw non-UTF-8 bytes in the query text: 22021', e.sqlstate)
    ok(before == snapshot(conn), 'raw non-UTF-8 bytes: nothing recorded changed')
    refused(conn, 'a NUL character cannot reach a key', "SELECT * FROM idempotency.claim_operation('hold', chr(0))",
            (), '54000')

    # -- huge documents
    big = {'blob': 'x' * (20 << 20), 'list': list(range(100000))}
    ok(claim(conn, 'hold', 'BIG') == ('run', 1, None), 'claimed the key of a 20 MB result')
    accepted(conn, 'a 20 MB result document is stored',
             'SELECT idempotency.complete_operation(%s, %s, 1, %s::jsonb)', ('hold', 'BIG', json.dumps(big)))
    got = claim(conn, 'hold', 'BIG')
    ok(got[0] == 'completed' and got[2] == big, 'the 20 MB result comes back whole on redelivery')
    refused(conn, 'a result nested too deep for jsonb',
            'SELECT idempotency.complete_operation(%s, %s, 1, %s::jsonb)',
            ('hold', 'ORD-2', '[' * 20000 + ']' * 20000), '54001')
    ok(claim(conn, 'hold', 'FP', 'f' * (1 << 20), 'w' * (1 << 20)) == ('run', 1, None),
       'a 1 MB fingerprint and worker name are accepted')
    refused(conn, 'a different 1 MB fingerprint', 'SELECT * FROM idempotency.claim_operation(%s, %s, %s)',
            ('hold', 'FP', 'g' * (1 << 20)), 'ID002')

    # -- leases and max_attempts
    for lease, state in (('0', '23514'), ('-1 second', '23514'), ('-1 microsecond', '23514')):
        refused(conn, f'lease {lease!r}', "INSERT INTO idempotency.job_types (job_type, lease) VALUES ('bad', %s)",
                (lease,), state)
    refused(conn, 'max_attempts 0',
            "INSERT INTO idempotency.job_types (job_type, max_attempts) VALUES ('bad', 0)", (), '23514')
    refused(conn, 'stale_policy nonsense',
            "INSERT INTO idempotency.job_types (job_type, stale_policy) VALUES ('bad', 'sometimes')", (), '22P02')
    conn.execute("INSERT INTO idempotency.job_types (job_type, lease, stale_policy) VALUES"
                 " ('tiny', '1 microsecond', 'hold'), ('century', '100 years', 'retry')")
    ok(claim(conn, 'tiny', 'T') == ('run', 1, None), 'lease of 1 microsecond: claimed')
    ok(claim(conn, 'tiny', 'T') == ('held', 1, None), 'lease of 1 microsecond: stale at once, held')
    ok(claim(conn, 'century', 'C') == ('run', 1, None), 'lease of 100 years: claimed')
    age(conn, 'century', 'C', '99 years')
    ok(claim(conn, 'century', 'C') == ('in_progress', 1, None), 'lease of 100 years: in progress after 99')
    age(conn, 'century', 'C', '2 years')
    ok(claim(conn, 'century', 'C') == ('run', 2, None), 'lease of 100 years: taken over after 101')
    ok(claim(conn, 'retry1', 'R') == ('run', 1, None), 'max_attempts 1: claimed')
    age(conn, 'retry1', 'R', '2 hours')
    ok(claim(conn, 'retry1', 'R') == ('held', 1, None), 'max_attempts 1: a stale claim is held, not retried')

    # a lease or retention so long that heartbeat + lease (or now - retention)
    # would leave timestamptz's range is refused by the configuration
    refused(conn, "lease '300000 years'",
            "INSERT INTO idempotency.job_types (job_type, lease) VALUES ('forever', '300000 years')", (), '23514')
    refused(conn, "lease '1001 years'",
            "INSERT INTO idempotency.job_types (job_type, lease) VALUES ('forever', '1001 years')", (), '23514')
    refused(conn, "retention '300000 years'",
            "INSERT INTO idempotency.job_types (job_type, retention) VALUES ('forever', '300000 years')", (), '23514')
    conn.execute("INSERT INTO idempotency.job_types (job_type, lease, stale_policy, retention) VALUES"
                 " ('millennium', '1000 years', 'hold', '1000 years')")
    ok(claim(conn, 'millennium', 'M') == ('run', 1, None), 'lease of 1000 years: first claim')
    ok(claim(conn, 'millennium', 'M') == ('in_progress', 1, None), 'lease of 1000 years: a redelivery is in_progress')
    r = call(conn, 'SELECT count(*) FROM idempotency.stale_claims()')
    ok(r[0] == 'ok', 'lease of 1000 years: stale_claims() of all job types works', f'got {r}')
    r = call(conn, 'SELECT count(*) FROM idempotency.job_type_stats')
    ok(r[0] == 'ok', 'lease of 1000 years: job_type_stats works', f'got {r}')
    r = call(conn, 'SELECT idempotency.purge_operations()')
    ok(r[0] == 'ok', 'retention of 1000 years: purge_operations() works', f'got {r}')
    conn.execute("DELETE FROM idempotency.operations WHERE job_type = 'millennium'")
    conn.execute("DELETE FROM idempotency.job_types WHERE job_type = 'millennium'")

    # -- attempts at the integer limits
    refused(conn, 'attempt 2147483647', 'SELECT idempotency.complete_operation(%s, %s, 2147483647)',
            ('hold', 'ORD-2'), '22023')
    refused(conn, 'attempt -2147483648', 'SELECT idempotency.complete_operation(%s, %s, -2147483648)',
            ('hold', 'ORD-2'), '22023')
    refused(conn, 'attempt 2147483648 (not an integer)',
            'SELECT idempotency.complete_operation(%s, %s, 2147483648)', ('hold', 'ORD-2'), '42883')
    refused(conn, 'purge batch of -2147483648', 'SELECT idempotency.purge_operations(-2147483648)', (), '22023')
    refused(conn, 'resolution of one megabyte', 'SELECT idempotency.resolve_operation(%s, %s, %s)',
            ('hold', 'ORD-2', 'r' * (1 << 20)), '22023')

    # -- the NOTIFY payload of the largest key that needs the most escaping
    notes = []
    conn.add_notify_handler(notes.append)
    conn.execute('LISTEN idempotency_held')
    key = '\x01' * 1024
    jt = '\x01' * 128
    conn.execute('INSERT INTO idempotency.job_types (job_type) VALUES (%s)', (jt,))
    ok(claim(conn, jt, key) == ('run', 1, None), 'worst-case NOTIFY payload: claimed')
    age(conn, jt, key, '1 hour')
    got = claim(conn, jt, key)
    ok(got == ('held', 1, None), 'worst-case NOTIFY payload: held', str(got))
    conn.execute('SELECT 1')    # the notification arrives at commit; read what came
    ok(len(notes) == 1 and json.loads(notes[0].payload) == {'job_type': jt, 'operation_key': key, 'attempt': 1},
       f'worst-case NOTIFY payload ({len(notes[0].payload) if notes else 0} bytes) arrives as JSON')


if __name__ == '__main__':
    sys.exit(main())
