#!/usr/bin/python3
"""The lost-reply cases through test/faults/pgproxy.py: the server commits a
call, the proxy drops its reply and closes the connection, the worker
reconnects and retries the same call.

    PGHOST=... PGPORT=... PGUSER=postgres /usr/bin/python3 test/faults/lost_reply.py [--require]

Needs the 0.3 API (claim_operation(..., delivery, wait)). Without it the
script says so and exits 0 with "lost-reply: skipped", unless --require is
given (then it is a failure). Its own job types are lost_reply_<policy>,
removed at the end. Prints TAP-like lines and "lost-reply: N passed, N failed".

The cases, under each policy (hold, retry, skip, lookup):
  1. the claim's reply is lost; the retry with the same delivery token gets
     its own claim back (run, attempt 1), the work runs once, completes;
     a later claim with that token answers completed
  2. contrast, the old behaviour: the retry without a token, or with
     another token, is answered in_progress (the key would wait a lease)
  3. the completion's reply is lost; the retry succeeds, nothing changes
     (the first result stays)
  4. the release's reply is lost; the retry succeeds; the next delivery runs
     attempt 2
  5. extend_lease's reply is lost; the retry succeeds
  6. (retry, lookup) the reply to a takeover of a stale claim is lost; the
     retry gets the same verdict (run or verify) and attempt 2
and once: 7. the transactional mode, with the reply to COMMIT lost, and
with the reply to the claim inside the transaction lost; 8. bounded waits
through the proxy: a claim behind another transaction's uncommitted claim
with wait => false answers in_progress at once, with lock_timeout or
statement_timeout fails 55P03 / 57014 and records nothing; a proxy reset
ends the stuck transaction and the next delivery runs.
"""

import argparse
import json
import os
import sys
import time
import uuid

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import faultlib                     # noqa: E402
from faultlib import Proxy, Tap, direct_dsn   # noqa: E402

import psycopg                      # noqa: E402
from psycopg import errors          # noqa: E402

tap = Tap('lost-reply')
POLICIES = ('hold', 'retry', 'skip', 'lookup')
CLAIM = ('SELECT verdict, attempt, result FROM idempotency.claim_operation('
         '%s, %s, fingerprint => %s, worker => %s, delivery => %s)')
CLAIM_NO_TOKEN = 'SELECT verdict, attempt, result FROM idempotency.claim_operation(%s, %s, %s, %s)'
COMPLETE = 'SELECT idempotency.complete_operation(%s, %s, %s, %s::jsonb)'
RELEASE = 'SELECT idempotency.release_operation(%s, %s, %s)'
EXTEND = 'SELECT idempotency.extend_lease(%s, %s, %s)'
# a retry's bound: the proxy answers at once, so a lost reply costs one
# reconnect; far below any lease here (1 hour)
RETRY_BOUND = 30.0


def direct():
    return psycopg.connect(direct_dsn(), autocommit=True)


def has_03():
    with direct() as c:
        c.execute('CREATE EXTENSION IF NOT EXISTS idempotency')
        avail = c.execute("SELECT default_version, installed_version FROM pg_available_extensions "
                          "WHERE name = 'idempotency'").fetchone()
        if avail and avail[0] != avail[1]:
            try:
                c.execute('ALTER EXTENSION idempotency UPDATE')
                tap.note('ALTER EXTENSION idempotency UPDATE: %s -> %s' % (avail[1], avail[0]))
            except psycopg.Error as e:
                tap.note('ALTER EXTENSION idempotency UPDATE failed: %s' % e)
        return c.execute("SELECT 'delivery' = ANY (proargnames) FROM pg_proc "
                         "WHERE oid = 'idempotency.claim_operation'::regproc").fetchone()[0]


def record(jt, key):
    with direct() as c:
        return c.execute('SELECT status, attempt, result FROM idempotency.operations '
                         'WHERE job_type = %s AND operation_key = %s', (jt, key)).fetchone()


# every worker connection has this bound on each statement, whatever a test
# sets on top
STATEMENT_BOUND = "'-c statement_timeout=20s'"


class Worker:
    """One worker's connection through the proxy; a call that loses its
    connection is retried on a new one, the same call with the same
    arguments (bounded: tries). An error the server answered (55P03,
    57014, ID003, ...) is raised, not retried."""

    def __init__(self, proxy, name):
        self.proxy, self.name = proxy, name
        self.conn = None
        self.lost = 0

    def connect(self):
        if self.conn is None:
            self.conn = psycopg.connect(self.proxy.dsn(application_name=self.name, options=STATEMENT_BOUND),
                                        autocommit=True)
        return self.conn

    def call(self, sql, params, tries=5):
        t0 = time.monotonic()
        for _ in range(tries):
            try:
                return self.connect().execute(sql, params).fetchone()
            except psycopg.OperationalError:
                if self.conn is not None and not self.conn.closed:
                    raise               # the server answered: not a lost connection
                self.lost += 1
                self.conn = None
            finally:
                assert time.monotonic() - t0 < RETRY_BOUND, 'a call took longer than its bound'
        raise RuntimeError('%s: no answer after %d tries' % (self.name, tries))

    def once(self, sql, params):
        """One try; the connection error, if any, is returned, not raised."""
        try:
            return self.connect().execute(sql, params).fetchone()
        except psycopg.OperationalError as e:
            if self.conn is not None and not self.conn.closed:
                raise
            self.lost += 1
            self.conn = None
            return e

    def close(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def drop_next(proxy, substring):
    proxy.ctl('drop-reply %s 1' % substring)


def case_claim_lost(proxy, jt):
    key = 'claim-lost'
    w = Worker(proxy, 'lr-w1')
    d = str(uuid.uuid4())
    s0 = proxy.stats()
    drop_next(proxy, 'claim_operation')
    t0 = time.monotonic()
    first = w.once(CLAIM, (jt, key, 'fp1', 'w1', d))
    tap.ok(isinstance(first, psycopg.OperationalError), '%s 1: the claim reply is lost (connection error)' % jt, first)
    tap.ok(record(jt, key)[:2] == ('claimed', 1), '%s 1: ... yet the claim was committed' % jt, record(jt, key))
    again = w.call(CLAIM, (jt, key, 'fp1', 'w1', d))
    dt = time.monotonic() - t0
    tap.ok(again[:2] == ('run', 1), '%s 1: the retry with the same delivery gets its own claim back: run #1' % jt,
           again)
    tap.ok(dt < RETRY_BOUND, '%s 1: no lease waited (%.2f s from the lost reply to run)' % (jt, dt))
    other = Worker(proxy, 'lr-w2')
    tap.ok(other.call(CLAIM, (jt, key, 'fp1', 'w2', str(uuid.uuid4())))[:2] == ('in_progress', 1),
           '%s 1: another delivery meanwhile: in_progress' % jt)
    # the work, once; then the completion
    w.call(COMPLETE, (jt, key, 1, json.dumps({'sent': d})))
    rec = record(jt, key)
    tap.ok(rec == ('completed', 1, {'sent': d}), '%s 1: completed #1 with the result' % jt, rec)
    tap.ok(w.call(CLAIM, (jt, key, 'fp1', 'w1', d))[:2] == ('completed', 1),
           '%s 1: the same token after the completion: completed' % jt)
    s1 = proxy.stats()
    tap.ok(s1['dropped'] == s0['dropped'] + 1, '%s 1: the proxy dropped exactly one reply' % jt, s1)
    w.close()
    other.close()


def case_contrast(proxy, jt):
    for label, token in (('without a token', None), ('with another token', 'other')):
        key = 'contrast-%s' % (token or 'none')
        w = Worker(proxy, 'lr-contrast')
        if token is None:
            drop_next(proxy, 'claim_operation')
            first = w.once(CLAIM_NO_TOKEN, (jt, key, 'fp1', 'w1'))
            again = w.call(CLAIM_NO_TOKEN, (jt, key, 'fp1', 'w1'))
        else:
            drop_next(proxy, 'claim_operation')
            first = w.once(CLAIM, (jt, key, 'fp1', 'w1', str(uuid.uuid4())))
            again = w.call(CLAIM, (jt, key, 'fp1', 'w1', str(uuid.uuid4())))
        tap.ok(isinstance(first, psycopg.OperationalError) and again[:2] == ('in_progress', 1)
               and record(jt, key)[:2] == ('claimed', 1),
               '%s 2: contrast, %s: the retry after a lost reply is told in_progress about its own claim, '
               'which now waits its lease' % (jt, label), again)
        w.close()


def case_complete_lost(proxy, jt):
    key = 'complete-lost'
    w = Worker(proxy, 'lr-w1')
    d = str(uuid.uuid4())
    v = w.call(CLAIM, (jt, key, 'fp1', 'w1', d))
    drop_next(proxy, 'complete_operation')
    first = w.once(COMPLETE, (jt, key, v[1], json.dumps({'n': 1})))
    tap.ok(isinstance(first, psycopg.OperationalError) and record(jt, key) == ('completed', 1, {'n': 1}),
           '%s 3: the completion reply is lost, the completion committed' % jt, first)
    try:
        w.call(COMPLETE, (jt, key, v[1], json.dumps({'n': 1})))
        retried = True
    except psycopg.Error as e:
        retried = e
    tap.ok(retried is True, '%s 3: complete_operation retried: succeeds' % jt, retried)
    try:
        w.call(COMPLETE, (jt, key, v[1], json.dumps({'n': 2})))
        retried2 = True
    except psycopg.Error as e:
        retried2 = e
    tap.ok(retried2 is True and record(jt, key) == ('completed', 1, {'n': 1}),
           '%s 3: ... a no-op: the first result stays' % jt, (retried2, record(jt, key)))
    w.close()


def case_release_lost(proxy, jt):
    key = 'release-lost'
    w = Worker(proxy, 'lr-w1')
    v = w.call(CLAIM, (jt, key, 'fp1', 'w1', str(uuid.uuid4())))
    drop_next(proxy, 'release_operation')
    first = w.once(RELEASE, (jt, key, v[1]))
    tap.ok(isinstance(first, psycopg.OperationalError) and record(jt, key)[:2] == ('released', 1),
           '%s 4: the release reply is lost, the release committed' % jt, first)
    try:
        w.call(RELEASE, (jt, key, v[1]))
        ok = True
    except psycopg.Error as e:
        ok = e
    tap.ok(ok is True and record(jt, key)[:2] == ('released', 1), '%s 4: release_operation retried: succeeds' % jt, ok)
    nxt = w.call(CLAIM, (jt, key, 'fp1', 'w2', str(uuid.uuid4())))
    tap.ok(nxt[:2] == ('run', 2), '%s 4: the next delivery runs attempt 2' % jt, nxt)
    w.close()


def case_extend_lost(proxy, jt):
    key = 'extend-lost'
    w = Worker(proxy, 'lr-w1')
    v = w.call(CLAIM, (jt, key, 'fp1', 'w1', str(uuid.uuid4())))
    drop_next(proxy, 'extend_lease')
    first = w.once(EXTEND, (jt, key, v[1]))
    try:
        w.call(EXTEND, (jt, key, v[1]))
        ok = True
    except psycopg.Error as e:
        ok = e
    tap.ok(isinstance(first, psycopg.OperationalError) and ok is True and record(jt, key)[:2] == ('claimed', 1),
           '%s 5: the extend_lease reply is lost; the retry succeeds' % jt, (first, ok))
    w.close()


def case_takeover_lost(proxy, jt, policy):
    key = 'takeover-lost'
    w1 = Worker(proxy, 'lr-w1')
    w1.call(CLAIM, (jt, key, 'fp1', 'w1', str(uuid.uuid4())))
    with direct() as c:         # the claim goes stale: a lease of 10 ms, for a moment
        c.execute("UPDATE idempotency.job_types SET lease = '10 ms' WHERE job_type = %s", (jt,))
    time.sleep(0.1)
    w2 = Worker(proxy, 'lr-w2')
    d2 = str(uuid.uuid4())
    drop_next(proxy, 'claim_operation')
    first = w2.once(CLAIM, (jt, key, 'fp1', 'w2', d2))
    with direct() as c:
        c.execute("UPDATE idempotency.job_types SET lease = '1 hour' WHERE job_type = %s", (jt,))
    verdict = 'verify' if policy == 'lookup' else 'run'
    tap.ok(isinstance(first, psycopg.OperationalError) and record(jt, key)[:2] == ('claimed', 2),
           '%s 6: the reply to the takeover of a stale claim is lost; the takeover committed' % jt, first)
    again = w2.call(CLAIM, (jt, key, 'fp1', 'w2', d2))
    tap.ok(again[:2] == (verdict, 2), '%s 6: the retry with the same token gets %s #2 back' % (jt, verdict), again)
    try:
        w1.call(COMPLETE, (jt, key, 1, '{}'))
        fenced = None
    except psycopg.Error as e:
        fenced = e.sqlstate
    w2.call(COMPLETE, (jt, key, 2, '{}'))
    tap.ok(fenced == 'ID003' and record(jt, key)[:2] == ('completed', 2),
           '%s 6: attempt 1 is fenced off (ID003), attempt 2 completes' % jt, fenced)
    w1.close()
    w2.close()


def case_transactional(proxy, jt):
    with direct() as c:
        c.execute('CREATE TABLE IF NOT EXISTS lost_reply_invoices (operation_key text NOT NULL, delivery text)')
        c.execute('TRUNCATE lost_reply_invoices')

    def deliver(key, delivery, tries=5):
        """BEGIN; claim; invoice; complete; COMMIT, retried whole on a lost connection."""
        verdicts = []
        for _ in range(tries):
            try:
                with psycopg.connect(proxy.dsn(application_name='lr-tx')) as c:
                    v = c.execute(CLAIM, (jt, key, 'fp1', 'tx', delivery)).fetchone()
                    verdicts.append(v[0])
                    if v[0] in ('run', 'verify'):
                        c.execute('INSERT INTO lost_reply_invoices VALUES (%s, %s)', (key, delivery))
                        c.execute(COMPLETE, (jt, key, v[1], '{"invoice": 1}'))
                    c.commit()
                    return verdicts
            except psycopg.OperationalError as e:
                if e.sqlstate is not None and e.sqlstate != '57P01':
                    raise
                verdicts.append('lost')
        raise RuntimeError('no answer after %d tries' % tries)

    def invoices(key):
        with direct() as c:
            return c.execute('SELECT count(*) FROM lost_reply_invoices WHERE operation_key = %s', (key,)).fetchone()[0]

    drop_next(proxy, 'COMMIT')
    v = deliver('tx-commit-lost', str(uuid.uuid4()))
    tap.ok(v == ['run', 'lost', 'completed'] and invoices('tx-commit-lost') == 1,
           '7: transactional, the reply to COMMIT lost: the retried transaction answers completed, one invoice', v)
    drop_next(proxy, 'claim_operation')
    v = deliver('tx-claim-lost', str(uuid.uuid4()))
    tap.ok(v == ['lost', 'run'] and invoices('tx-claim-lost') == 1
           and record(jt, 'tx-claim-lost')[:2] == ('completed', 1),
           '7: transactional, the claim reply lost inside the transaction: it rolled back, the retry runs, '
           'one invoice', v)


def case_bounded_waits(proxy, jt):
    key = 'stuck'
    stuck = psycopg.connect(proxy.dsn(application_name='lr-stuck'))       # a transaction that claims and idles
    stuck.execute(CLAIM, (jt, key, 'fp1', 'stuck', str(uuid.uuid4()))).fetchone()
    w = Worker(proxy, 'lr-w2')
    t0 = time.monotonic()
    v = w.call('SELECT verdict, attempt FROM idempotency.claim_operation(%s, %s, %s, %s, delivery => %s, '
               'wait => false)', (jt, key, 'fp1', 'w2', str(uuid.uuid4())))
    dt = time.monotonic() - t0
    tap.ok(v == ('in_progress', None) or (v[0] == 'in_progress'),
           '8: behind an uncommitted claim, wait => false answers in_progress', v)
    tap.ok(dt < 5, '8: ... at once (%.2f s, bound 5 s)' % dt)
    for setting, state in (('lock_timeout', '55P03'), ('statement_timeout', '57014')):
        w.call("SELECT set_config(%s, '300ms', false)", (setting,))
        t0 = time.monotonic()
        try:
            w.call(CLAIM, (jt, key, 'fp1', 'w2', str(uuid.uuid4())))
            got = None
        except psycopg.Error as e:
            got = e.sqlstate
        dt = time.monotonic() - t0
        w.call('SELECT set_config(%s, reset_val, false) FROM pg_settings WHERE name = %s', (setting, setting))
        tap.ok(got == state and dt < 10, '8: wait => true with %s = 300ms: %s within its bound (%.2f s)'
               % (setting, got, dt))
        tap.ok(record(jt, key) is None, '8: ... and nothing recorded', record(jt, key))
    # the proxy's reset ends the stuck transaction; its claim is rolled back
    proxy.ctl('reset')
    w.conn = None
    v = w.call(CLAIM, (jt, key, 'fp1', 'w2', str(uuid.uuid4())))
    tap.ok(v[:2] == ('run', 1), '8: after a proxy reset ended the stuck transaction, the next delivery runs #1', v)
    try:
        stuck.close()
    except psycopg.Error:
        pass
    w.close()


def main():
    faultlib.exit_on_sigterm()
    ap = argparse.ArgumentParser()
    ap.add_argument('--require', action='store_true', help='the 0.3 API must be there')
    args = ap.parse_args()
    if not has_03():
        tap.note('claim_operation() has no delivery argument: the extension predates 0.3')
        if args.require:
            tap.ok(False, 'the 0.3 API (claim_operation(..., delivery, wait)) is installed')
            return tap.done()
        print('lost-reply: skipped (needs idempotency 0.3)')
        return 0
    jts = {p: 'lost_reply_%s' % p for p in POLICIES}
    with direct() as c:
        for p, jt in jts.items():
            c.execute('DELETE FROM idempotency.operations WHERE job_type = %s', (jt,))
            c.execute('DELETE FROM idempotency.job_types WHERE job_type = %s', (jt,))
            c.execute("INSERT INTO idempotency.job_types (job_type, lease, stale_policy, max_attempts) "
                      "VALUES (%s, '1 hour', %s, 5)", (jt, p))
    t0 = time.monotonic()
    with Proxy() as proxy:
        for p in POLICIES:
            jt = jts[p]
            tap.note('policy %s (job type %s, lease 1 hour)' % (p, jt))
            for fn in (case_claim_lost, case_contrast, case_complete_lost, case_release_lost, case_extend_lost):
                proxy.ctl('clear')
                tap.run('%s %s' % (jt, fn.__name__), fn, proxy, jt)
            if p in ('retry', 'lookup'):
                proxy.ctl('clear')
                tap.run('%s takeover' % jt, case_takeover_lost, proxy, jt, p)
        tap.note('transactional mode and bounded waits (job type %s)' % jts['hold'])
        proxy.ctl('clear')
        tap.run('transactional', case_transactional, proxy, jts['hold'])
        proxy.ctl('clear')
        tap.run('bounded waits', case_bounded_waits, proxy, jts['hold'])
        tap.note('proxy %s; %.1f s' % (proxy.ctl('stats'), time.monotonic() - t0))
        if tap.failed:
            tap.note('proxy log:\n' + proxy.log_text())
    with direct() as c:
        c.execute('DROP TABLE IF EXISTS lost_reply_invoices')
        for jt in jts.values():
            c.execute('DELETE FROM idempotency.operations WHERE job_type = %s', (jt,))
            c.execute('DELETE FROM idempotency.job_types WHERE job_type = %s', (jt,))
    return tap.done()


if __name__ == '__main__':
    sys.exit(main())
