#!/usr/bin/python3
"""Self-test of test/faults/pgproxy.py against a real server: each command
does what it says, and what the proxy must understand of the protocol works.

    PGHOST=... PGPORT=... PGUSER=postgres /usr/bin/python3 test/faults/test_pgproxy.py

Needs python3-psycopg and the extension installed (it creates it if
missing). It registers its own job type, pgproxy_selftest, and removes it at
the end. Prints TAP-like lines and "pgproxy: N passed, N failed"; exit 0 only
if everything passed.
"""

import os
import socket
import struct
import sys
import threading
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import faultlib                     # noqa: E402
from faultlib import Proxy, Tap, direct_dsn, wait_until   # noqa: E402

import psycopg                      # noqa: E402
from psycopg import errors          # noqa: E402

JT = 'pgproxy_selftest'
tap = Tap('pgproxy')


def direct():
    return psycopg.connect(direct_dsn(), autocommit=True)


def record(key):
    with direct() as c:
        return c.execute('SELECT status, attempt FROM idempotency.operations '
                         'WHERE job_type = %s AND operation_key = %s', (JT, key)).fetchone()


def backends(appname):
    with direct() as c:
        return c.execute('SELECT count(*) FROM pg_stat_activity WHERE application_name = %s',
                         (appname,)).fetchone()[0]


def connection_lost(fn):
    """True if fn() failed because the connection went away."""
    try:
        fn()
    except psycopg.OperationalError:
        return True
    return False


# -- a minimal protocol client, for what psycopg does not let a test choose -----

def startup_packet(user, dbname, appname='pgproxy_raw'):
    params = b''.join(k.encode() + b'\0' + v.encode() + b'\0'
                      for k, v in (('user', user), ('database', dbname), ('application_name', appname)))
    body = struct.pack('!I', 196608) + params + b'\0'
    return struct.pack('!I', len(body) + 4) + body


def msg(t, body=b''):
    return t + struct.pack('!I', len(body) + 4) + body


def cstr(s):
    return s.encode() + b'\0'


class Raw:
    def __init__(self, proxy, ssl_first=False, gss_first=False):
        self.s = socket.create_connection(('127.0.0.1', proxy.port), timeout=10)
        self.answers = []
        for code, wanted in ((80877104, gss_first), (80877103, ssl_first)):
            if wanted:
                self.s.sendall(struct.pack('!II', 8, code))
                self.answers.append(self.s.recv(1))
        self.s.sendall(startup_packet(proxy.user, proxy.dbname))
        self.buf = b''
        self.until_ready()

    def read_msg(self):
        while len(self.buf) < 5 or len(self.buf) < 1 + struct.unpack('!I', self.buf[1:5])[0]:
            data = self.s.recv(65536)
            if not data:
                raise EOFError('connection closed')
            self.buf += data
        n = struct.unpack('!I', self.buf[1:5])[0]
        m, self.buf = self.buf[:1 + n], self.buf[1 + n:]
        return m[:1], m[5:]

    def until_ready(self):
        """Messages up to and including the next ReadyForQuery; the values of the DataRows."""
        rows = []
        while True:
            t, body = self.read_msg()
            if t == b'E':
                rows.append(('error', body))
            if t == b'D':
                (ncol,) = struct.unpack('!H', body[:2])
                pos, vals = 2, []
                for _ in range(ncol):
                    (ln,) = struct.unpack('!i', body[pos:pos + 4])
                    pos += 4
                    vals.append(None if ln < 0 else body[pos:pos + ln].decode())
                    pos += max(ln, 0)
                rows.append(tuple(vals))
            if t == b'Z':
                return rows

    def close(self):
        try:
            self.s.sendall(msg(b'X'))
        except OSError:
            pass
        self.s.close()


def raw_parse(name, sql):
    return msg(b'P', cstr(name) + cstr(sql) + struct.pack('!H', 0))


def raw_bind_exec(stmt, value):
    v = value.encode()
    bind = msg(b'B', cstr('') + cstr(stmt) + struct.pack('!H', 0) + struct.pack('!H', 1)
               + struct.pack('!i', len(v)) + v + struct.pack('!H', 0))
    return bind + msg(b'E', cstr('') + struct.pack('!i', 0))


SYNC = msg(b'S')


# -- the checks -------------------------------------------------------------------

def t_passthrough(proxy):
    with psycopg.connect(proxy.dsn(), autocommit=True) as c:
        tap.ok(c.execute('SELECT %s::int + 1', (41,)).fetchone() == (42,), 'extended protocol with a parameter')
        tap.ok(c.execute('SELECT 1; SELECT 2', prepare=False).fetchone() is not None,
               'several statements in one call')
        for i in range(3):
            v = c.execute('SELECT %s::text', ('named-%d' % i,), prepare=True).fetchone()[0]
        tap.ok(v == 'named-2', 'a named prepared statement, re-used')
        with c.pipeline():
            curs = [c.execute('SELECT %s::int * 2', (i,)) for i in range(10)]
        tap.ok([cur.fetchone()[0] for cur in curs] == [i * 2 for i in range(10)],
               'pipeline mode: 10 calls in flight, every answer to its call')
        c.execute('CREATE TEMP TABLE copy_t (a int, b text)')
        with c.cursor().copy('COPY copy_t FROM STDIN') as cp:
            for i in range(1000):
                cp.write_row((i, 'x' * 50))
        tap.ok(c.execute('SELECT count(*), sum(a) FROM copy_t').fetchone() == (1000, 499500), 'COPY FROM STDIN')
        with c.cursor().copy('COPY copy_t TO STDOUT') as cp:
            n = sum(1 for _ in cp.rows())
        tap.ok(n == 1000, 'COPY TO STDOUT')
        big = c.execute("SELECT repeat('y', 5000000)").fetchone()[0]
        tap.ok(len(big) == 5000000, 'a 5 MB reply')
        # notices and notifications arrive
        notices = []
        c.add_notice_handler(lambda d: notices.append(d.message_primary))
        c.execute("DO $$ BEGIN RAISE NOTICE 'hello through the proxy'; END $$")
        tap.ok(notices == ['hello through the proxy'], 'a NOTICE reaches the client')
        got = []
        c.add_notify_handler(lambda n: got.append(n.payload))
        c.execute('LISTEN pgproxy_selftest')
        with psycopg.connect(proxy.dsn(), autocommit=True) as c2:
            c2.execute("NOTIFY pgproxy_selftest, 'payload-1'")
        wait_until(lambda: c.execute('SELECT 1') and got, timeout=5)
        tap.ok(got == ['payload-1'], 'a NOTIFY reaches a listener through the proxy')
        # an error, and the connection goes on
        try:
            c.execute('SELECT 1/0')
            tap.ok(False, 'an error passes through')
        except errors.DivisionByZero:
            tap.ok(c.execute('SELECT 7').fetchone() == (7,), 'an error passes through, the connection goes on')


def t_raw_startup(proxy):
    r = Raw(proxy, ssl_first=True, gss_first=True)
    tap.ok(r.answers == [b'N', b'N'], "GSSENCRequest and SSLRequest are answered 'N'", r.answers)
    r.s.sendall(msg(b'Q', cstr('SELECT 1')) + msg(b'Q', cstr('SELECT 2')) + msg(b'Q', cstr('SELECT 3')))
    got = [r.until_ready(), r.until_ready(), r.until_ready()]
    tap.ok(got == [[('1',)], [('2',)], [('3',)]], 'three pipelined simple queries, three answers in order', got)
    # psycopg with sslmode=require: refused by the proxy's 'N', a clear error
    try:
        psycopg.connect(proxy.dsn(sslmode='require')).close()
        tap.ok(False, 'sslmode=require is refused (the proxy speaks no TLS)')
    except psycopg.OperationalError as e:
        tap.ok('SSL' in str(e), 'sslmode=require is refused (the proxy speaks no TLS)', e)
    r.close()


def t_cancel(proxy):
    before = proxy.stats()['cancels']
    with psycopg.connect(proxy.dsn(), autocommit=True) as c:
        threading.Timer(0.5, c.cancel).start()
        t0 = time.monotonic()
        try:
            c.execute('SELECT pg_sleep(30)')
            tap.ok(False, 'CancelRequest is forwarded: pg_sleep(30) canceled')
        except errors.QueryCanceled:
            tap.ok(time.monotonic() - t0 < 20, 'CancelRequest is forwarded: pg_sleep(30) canceled')
        tap.ok(c.execute('SELECT 1').fetchone() == (1,), 'the canceled connection goes on')
    tap.ok(proxy.stats()['cancels'] == before + 1, 'stats counts the cancel request')


def claim_sql():
    return 'SELECT verdict, attempt FROM idempotency.claim_operation(%s, %s)'


def t_drop_reply(proxy):
    s0 = proxy.stats()
    proxy.ctl('drop-reply claim_operation 1')
    with psycopg.connect(proxy.dsn(application_name='pgproxy_drop'), autocommit=True) as c:
        tap.ok(c.execute('SELECT 1').fetchone() == (1,), 'drop-reply: a call that does not match passes')
        lost = connection_lost(lambda: c.execute(claim_sql(), (JT, 'drop-1')))
        tap.ok(lost, 'drop-reply: the client gets a connection error for the matching call')
        tap.ok(c.closed or c.broken, 'drop-reply: the client connection is closed')
    tap.ok(record('drop-1') == ('claimed', 1), 'drop-reply: the claim was committed by the server',
           record('drop-1'))
    tap.ok(wait_until(lambda: backends('pgproxy_drop') == 0),
           "drop-reply: the server's session ended (the proxy closed the server's socket too)")
    s1 = proxy.stats()
    tap.ok(s1['dropped'] == s0['dropped'] + 1 and s1['rules'] == 0,
           'drop-reply 1: one reply dropped, then the rule is gone', s1)
    with psycopg.connect(proxy.dsn(), autocommit=True) as c:
        tap.ok(c.execute(claim_sql(), (JT, 'drop-1b')).fetchone() == ('run', 1),
               'drop-reply 1: the next matching call passes')
    # COUNT 2: two calls lost, the third answered
    proxy.ctl('drop-reply drop-count-probe 2')
    outcomes = []
    for i in range(3):
        with psycopg.connect(proxy.dsn(), autocommit=True) as c:
            outcomes.append(connection_lost(lambda: c.execute("SELECT 'drop-count-probe'")))
    tap.ok(outcomes == [True, True, False], 'drop-reply SUBSTRING 2: exactly the next two matching calls lost',
           outcomes)


def t_named_statements(proxy):
    # an explicitly prepared statement: executed again, only Bind/Execute go out
    with psycopg.connect(proxy.dsn(), autocommit=True) as c:
        c.execute(claim_sql(), (JT, 'named-0'), prepare=True)
        parses = proxy.stats()['parses']
        proxy.ctl('drop-reply claim_operation 1')
        lost = connection_lost(lambda: c.execute(claim_sql(), (JT, 'named-1'), prepare=True))
        s = proxy.stats()
        tap.ok(lost and s['parses'] == parses,
               'a named prepared statement, bound and executed with no Parse, matches', s)
    tap.ok(record('named-1') == ('claimed', 1), 'named statement: the claim was committed', record('named-1'))
    # psycopg's own auto-preparation (prepare_threshold 5)
    with psycopg.connect(proxy.dsn(), autocommit=True) as c:
        for i in range(7):
            c.execute(claim_sql(), (JT, 'auto-%d' % i))
        prepared = c.execute("SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE '%claim_operation%'"
                             ).fetchone()[0]
        parses = proxy.stats()['parses']
        proxy.ctl('drop-reply claim_operation 1')
        lost = connection_lost(lambda: c.execute(claim_sql(), (JT, 'auto-x')))
        s = proxy.stats()
    tap.ok(prepared == 1 and lost and s['parses'] == parses,
           'psycopg auto-prepared statement (after 5 executions) matches on Bind/Execute',
           'prepared=%d lost=%s %s' % (prepared, lost, s))
    tap.ok(record('auto-x') == ('claimed', 1), 'auto-prepared: the claim was committed', record('auto-x'))
    # the raw protocol: a Parse alone runs nothing and is not matched; the
    # named statement's later Bind/Execute is
    r = Raw(proxy)
    proxy.ctl('drop-reply raw-named-probe 1')
    r.s.sendall(raw_parse('s1', "SELECT 'raw-named-probe' || $1::text") + SYNC)
    tap.ok(r.until_ready() == [], 'raw: Parse of a named statement alone is not a matching call')
    r.s.sendall(raw_bind_exec('s1', 'a') + SYNC)
    try:
        r.until_ready()
        tap.ok(False, 'raw: Bind/Execute of the named statement is matched and dropped')
    except (EOFError, ConnectionError):
        tap.ok(True, 'raw: Bind/Execute of the named statement is matched and dropped')
    r.s.close()
    # unnamed statement, then pipelined: P/B/E/S twice in one write
    r = Raw(proxy)
    r.s.sendall(raw_parse('', 'SELECT $1::text') + raw_bind_exec('', 'u1') + SYNC
                + raw_bind_exec('', 'u2') + SYNC)
    got = [r.until_ready(), r.until_ready()]
    tap.ok(got == [[('u1',)], [('u2',)]], 'raw: the unnamed statement bound twice, pipelined', got)
    r.close()


def t_delay_reply(proxy):
    s0 = proxy.stats()
    proxy.ctl('delay-reply delay-probe 600 2')
    with psycopg.connect(proxy.dsn(), autocommit=True) as c:
        t0 = time.monotonic()
        v = c.execute("SELECT 'delay-probe', %s::int", (1,)).fetchone()
        dt = time.monotonic() - t0
        tap.ok(v == ('delay-probe', 1) and dt >= 0.55, 'delay-reply: the reply comes, after MS milliseconds',
               'got %r after %.3f s' % (v, dt))
    # pipelined behind a delayed call: answers stay in order
    r = Raw(proxy)
    r.s.sendall(msg(b'Q', cstr("SELECT 'delay-probe'")) + msg(b'Q', cstr("SELECT 'after'")))
    got = [r.until_ready(), r.until_ready()]
    tap.ok(got == [[('delay-probe',)], [('after',)]], 'delay-reply: a pipelined call behind it is answered after it',
           got)
    r.close()
    s1 = proxy.stats()
    tap.ok(s1['delayed'] == s0['delayed'] + 2 and s1['rules'] == 0 and s1['dropped'] == s0['dropped'],
           'delay-reply COUNT 2: two delayed, nothing dropped, rule gone', s1)


def fraction_pattern(proxy, n):
    pattern = []
    c = None
    for i in range(n):
        if c is None:
            c = psycopg.connect(proxy.dsn(), autocommit=True)
        try:
            c.execute("SELECT 'fraction-probe', %s::int", (i,))
            pattern.append(0)
        except psycopg.OperationalError:
            pattern.append(1)
            c.close()
            c = None
    if c is not None:
        c.close()
    return pattern


def t_drop_fraction(proxy):
    s0 = proxy.stats()
    proxy.ctl('drop-fraction fraction-probe 0.3 7')
    a = fraction_pattern(proxy, 40)
    proxy.ctl('clear')
    proxy.ctl('drop-fraction fraction-probe 0.3 7')
    b = fraction_pattern(proxy, 40)
    proxy.ctl('clear')
    s1 = proxy.stats()
    tap.ok(0 < sum(a) < 40, 'drop-fraction 0.3: some replies dropped, not all (%d of 40)' % sum(a), a)
    tap.ok(a == b, 'drop-fraction: the same SEED drops the same calls', '%s\n%s' % (a, b))
    tap.ok(s1['dropped'] - s0['dropped'] == sum(a) + sum(b), 'drop-fraction: stats counts every drop', s1)
    proxy.ctl('drop-fraction fraction-probe 0.3 8')
    c = fraction_pattern(proxy, 40)
    proxy.ctl('clear')
    tap.ok(c != a, 'drop-fraction: another SEED drops other calls', '%s\n%s' % (a, c))
    tap.ok(sum(fraction_pattern(proxy, 20)) == 0, 'clear: nothing dropped any more')
    proxy.ctl('drop-fraction fraction-probe 1 1')
    proxy.ctl('delay-reply fraction-probe 10 5')
    proxy.ctl('drop-reply something-else 3')
    tap.ok(proxy.stats()['rules'] == 3, 'three rules in force')
    answer = proxy.ctl('clear')
    tap.ok(answer == 'ok cleared=3' and proxy.stats()['rules'] == 0, 'clear removes every rule', answer)


def t_reset(proxy):
    app = 'pgproxy_reset'
    idle = psycopg.connect(proxy.dsn(application_name=app), autocommit=True)
    intx = psycopg.connect(proxy.dsn(application_name=app))
    intx.execute(claim_sql(), (JT, 'reset-tx'))          # uncommitted claim, idle in transaction
    busy = psycopg.connect(proxy.dsn(application_name=app), autocommit=True)
    busy.execute("SET client_connection_check_interval = '100ms'")
    result = {}

    def sleeper():
        t0 = time.monotonic()
        result['lost'] = connection_lost(lambda: busy.execute('SELECT pg_sleep(30)'))
        result['t'] = time.monotonic() - t0
    th = threading.Thread(target=sleeper)
    th.start()
    tap.ok(wait_until(lambda: backends(app) == 3), 'reset: three sessions through the proxy')
    time.sleep(0.3)
    raw = Raw(proxy)
    answer = proxy.ctl('reset')
    th.join(20)
    # four connections at least (a connection that ended a moment ago may still count)
    tap.ok(answer.startswith('ok reset=') and int(answer.split('=')[1]) >= 4,
           'reset: answered with the number of connections closed', answer)
    tap.ok(result.get('lost') and result['t'] < 15, 'reset: a call in flight fails at once', result)
    tap.ok(connection_lost(lambda: idle.execute('SELECT 1')), 'reset: an idle connection is gone')
    tap.ok(connection_lost(lambda: intx.execute('SELECT 1')), 'reset: a connection idle in transaction is gone')
    try:
        data = raw.s.recv(100)
        tap.ok(False, 'reset: the client side gets an RST (ECONNRESET)', 'recv returned %r' % data)
    except ConnectionResetError:
        tap.ok(True, 'reset: the client side gets an RST (ECONNRESET)')
    raw.s.close()
    tap.ok(wait_until(lambda: backends(app) == 0, timeout=15), "reset: every server session ended")
    tap.ok(record('reset-tx') is None, 'reset: the uncommitted claim was rolled back')
    for c in (idle, intx, busy):
        c.close()
    with psycopg.connect(proxy.dsn(), autocommit=True) as c:
        tap.ok(c.execute('SELECT 1').fetchone() == (1,), 'reset: new connections work')


def t_ctl(proxy):
    answer, rc = proxy.ctl_answer('no-such-command')
    tap.ok(rc == 1 and answer.startswith('error'), 'ctl: an unknown command is an error, exit 1', answer)
    answer, rc = proxy.ctl_answer('drop-reply x 0')
    tap.ok(rc == 1 and answer.startswith('error'), 'ctl: COUNT 0 is refused', answer)
    answer, rc = proxy.ctl_answer('drop-fraction x 1.5 1')
    tap.ok(rc == 1 and answer.startswith('error'), 'ctl: P outside [0, 1] is refused', answer)
    answer, rc = proxy.ctl_answer('ping')
    tap.ok(rc == 0 and answer == 'ok', 'ctl: ping')
    answer, rc = proxy.ctl_answer("drop-reply 'a b c' 1")
    tap.ok(rc == 0 and proxy.ctl('rules') == "ok drop-reply 'a b c' 1 (fired 0)", 'ctl: a quoted SUBSTRING with spaces',
           proxy.ctl('rules'))
    proxy.ctl('clear')
    s = proxy.stats()
    tap.ok(all(k in s for k in ('connections', 'dropped', 'delayed', 'calls')), 'stats: the four counters', s)


def t_tcp_upstream(proxy):
    # a second proxy whose upstream is the first one, over TCP
    with Proxy(upstream=('127.0.0.1', proxy.port)) as outer:
        with psycopg.connect(outer.dsn(), autocommit=True) as c:
            tap.ok(c.execute('SELECT 5').fetchone() == (5,), 'a TCP upstream (proxy in front of the proxy)')
        outer.ctl('drop-reply claim_operation 1')
        with psycopg.connect(outer.dsn(), autocommit=True) as c:
            tap.ok(connection_lost(lambda: c.execute(claim_sql(), (JT, 'tcp-1'))),
                   'TCP upstream: drop-reply')
        tap.ok(record('tcp-1') == ('claimed', 1), 'TCP upstream: the claim was committed')


def main():
    faultlib.exit_on_sigterm()
    with direct() as c:
        c.execute('CREATE EXTENSION IF NOT EXISTS idempotency')
        c.execute('DELETE FROM idempotency.operations WHERE job_type = %s', (JT,))
        c.execute("INSERT INTO idempotency.job_types (job_type, lease, stale_policy) VALUES (%s, '1 hour', 'hold') "
                  "ON CONFLICT (job_type) DO NOTHING", (JT,))
    t0 = time.monotonic()
    with Proxy() as proxy:
        for name, fn in (('passthrough', t_passthrough), ('raw startup', t_raw_startup), ('cancel', t_cancel),
                         ('drop-reply', t_drop_reply), ('named statements', t_named_statements),
                         ('delay-reply', t_delay_reply), ('drop-fraction', t_drop_fraction),
                         ('reset', t_reset), ('ctl', t_ctl), ('tcp upstream', t_tcp_upstream)):
            tap.note(name)
            proxy.ctl('clear')
            tap.run(name, fn, proxy)
        tap.note('proxy %s after %.1f s' % (proxy.ctl('stats'), time.monotonic() - t0))
        if tap.failed:
            tap.note('proxy log:\n' + proxy.log_text())
    with direct() as c:
        c.execute('DELETE FROM idempotency.operations WHERE job_type = %s', (JT,))
        c.execute('DELETE FROM idempotency.job_types WHERE job_type = %s', (JT,))
    return tap.done()


if __name__ == '__main__':
    sys.exit(main())
