#!/usr/bin/python3
"""A kill storm through test/faults/pgproxy.py where a fraction of the
replies are lost.

    PGHOST=... PGPORT=... PGUSER=postgres /usr/bin/python3 test/faults/storm.py [--require] [--keys N]

Worker processes (python3-psycopg, through the proxy) deliver a queue of
keys, each several times, the copies close together so that redeliveries
race. The proxy drops the reply to a fraction of the claim_operation,
complete_operation and COMMIT calls (drop-fraction: the server committed,
the connection is closed), and meanwhile the test terminates random worker
backends (pg_terminate_backend) and resets every proxied connection at once
a few times. A worker that loses its connection reconnects and retries the
same call, with the same delivery token (bounded: a delivery gives up after
MAX_TRIES lost connections, which counts as a failure). Four job types,
lease 1 hour (longer than the whole run):

  storm_hold    policy hold     claim (commit), email, complete (commit)
  storm_retry   policy retry, max_attempts 3, the same
  storm_lookup  policy lookup, the same (a verify would look the email up)
  storm_tx      transactional: claim, invoice row, completion, one commit;
                half the deliveries claim with wait => false, the other half
                wait with lock_timeout 2 s

The "email" is a row written on a direct connection (the provider: outside
the proxy, never lost, never rolled back). Invariants checked at the end:

  * no duplicate effect beyond what the policy allows: with no claim ever
    going stale, that is exactly one email (one invoice) per key under every
    policy, sent under attempt 1;
  * no claim waits a lease because its reply was lost: every key ends
    completed #1 during the run (the lease is 1 hour), so every claim whose
    reply was lost got its own claim back on the retry;
  * no worker waits longer than its bound: every delivery ends within
    DELIVERY_BOUND seconds (lost replies, reconnects and waits included);
  * nothing recorded is lost: every completion a worker saw succeed is in
    the record with its result, and every record names the delivery that
    sent its email;
  * and the faults happened: replies were dropped, claims and completions
    retried, backends terminated, connections reset.

Then the contrast (--contrast, on by default): one worker without delivery
tokens, the same lost claim replies: the retry of a claim whose reply was
lost is answered in_progress and the key is left claimed, waiting its lease.

Prints TAP-like lines and "storm: N passed, N failed". Without the 0.3 API:
"storm: skipped", exit 0 (--require: a failure).
"""

import argparse
import json
import multiprocessing
import os
import random
import sys
import tempfile
import time
import uuid

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import faultlib                     # noqa: E402
from faultlib import Proxy, Tap, direct_dsn   # noqa: E402

import psycopg                      # noqa: E402
from psycopg import errors          # noqa: E402

tap = Tap('storm')
EXT_TYPES = {'storm_hold': ('hold', None), 'storm_retry': ('retry', 3), 'storm_lookup': ('lookup', None)}
TX_TYPE = 'storm_tx'
CONTRAST_TYPE = 'storm_contrast'
MAX_TRIES = 25              # lost connections per call before a delivery gives up
DELIVERY_BOUND = 30.0       # seconds; a delivery takes milliseconds normally
STATEMENT_BOUND = 10        # statement_timeout of every worker connection, seconds
CLAIM = ('SELECT verdict, attempt FROM idempotency.claim_operation(%s, %s, fingerprint => %s, worker => %s, '
         'delivery => %s, wait => %s)')
CLAIM_NO_TOKEN = 'SELECT verdict, attempt FROM idempotency.claim_operation(%s, %s, %s, %s)'
COMPLETE = 'SELECT idempotency.complete_operation(%s, %s, %s, %s::jsonb)'


class Lost(Exception):
    """The connection went away: the call may or may not have happened."""


class Conn:
    """A worker's connection through the proxy, made again after a loss."""

    def __init__(self, proxy_dsn, name, stats):
        self.dsn = proxy_dsn + " application_name=%s options='-c statement_timeout=%ds -c lock_timeout=2s'" % (
            name, STATEMENT_BOUND)
        self.conn = None
        self.stats = stats

    def get(self):
        if self.conn is None:
            try:
                self.conn = psycopg.connect(self.dsn, autocommit=True)
            except psycopg.OperationalError as e:
                raise Lost(str(e)) from None
        return self.conn

    def lost(self, e):
        """Raise Lost if e is a lost connection, else re-raise e."""
        if self.conn is not None and not self.conn.closed:
            raise e
        self.stats['lost_connections'] += 1
        if self.conn is not None:
            try:
                self.conn.close()
            except Exception:
                pass
        self.conn = None
        raise Lost(str(e)) from None

    def one(self, sql, params):
        try:
            return self.get().execute(sql, params).fetchone()
        except psycopg.OperationalError as e:
            self.lost(e)

    def retried(self, sql, params, counter):
        """The same call again after each lost connection (bounded)."""
        for i in range(MAX_TRIES):
            try:
                return self.one(sql, params)
            except Lost:
                self.stats[counter] += 1
                time.sleep(min(0.005 * (i + 1), 0.1))
        raise Lost('%d lost connections in a row' % MAX_TRIES)


def deliver_ext(c, direct, jt, key, wname, stats):
    d = str(uuid.uuid4())
    r = {'jt': jt, 'key': key, 'delivery': d, 'verdict': None, 'attempt': None,
         'claim_retries': 0, 'complete_retries': 0, 'email': False, 'completed': False}
    before = stats['claim_retries']
    try:
        r['verdict'], r['attempt'] = c.retried(CLAIM, (jt, key, 'fp-' + key, wname, d, True), 'claim_retries')
    except errors.LockNotAvailable:
        r['verdict'] = 'in_progress'
    r['claim_retries'] = stats['claim_retries'] - before
    if r['verdict'] not in ('run', 'verify'):
        return r
    found = False
    if r['verdict'] == 'verify':        # the lookup at the provider
        found = direct.execute('SELECT count(*) > 0 FROM storm_emails WHERE job_type = %s AND operation_key = %s',
                               (jt, key)).fetchone()[0]
    if not found:
        direct.execute('INSERT INTO storm_emails VALUES (%s, %s, %s, %s)', (jt, key, r['attempt'], d))
        r['email'] = True
    before = stats['complete_retries']
    c.retried(COMPLETE, (jt, key, r['attempt'], json.dumps({'delivery': d})), 'complete_retries')
    r['complete_retries'] = stats['complete_retries'] - before
    r['completed'] = True
    return r


def deliver_tx(c, jt, key, wname, stats, nowait):
    d = str(uuid.uuid4())
    r = {'jt': jt, 'key': key, 'delivery': d, 'verdict': None, 'attempt': None, 'tx_retries': 0,
         'completed': False, 'wait': not nowait}
    for i in range(MAX_TRIES):
        try:
            conn = c.get()
            try:
                with conn.transaction():
                    v = conn.execute(CLAIM, (jt, key, 'fp-' + key, wname, d, not nowait)).fetchone()
                    r['verdict'], r['attempt'] = v
                    if v[0] in ('run', 'verify'):
                        conn.execute('INSERT INTO storm_invoices VALUES (%s, %s)', (key, d))
                        conn.execute(COMPLETE, (jt, key, v[1], json.dumps({'delivery': d})))
                r['completed'] = r['verdict'] in ('run', 'verify')
                return r
            except errors.LockNotAvailable:
                r['verdict'] = '55P03'       # lock_timeout (or wait => false's 1 s): like in_progress
                return r
            except psycopg.OperationalError as e:
                c.lost(e)
        except Lost:
            stats['tx_retries'] += 1
            r['tx_retries'] += 1
            time.sleep(min(0.005 * (i + 1), 0.1))
    raise Lost('%d lost connections in a row' % MAX_TRIES)


def worker_main(idx, messages, proxy_dsn, outpath):
    stats = {'lost_connections': 0, 'claim_retries': 0, 'complete_retries': 0, 'tx_retries': 0}
    wname = 'storm-w%d' % idx
    c = Conn(proxy_dsn, wname, stats)
    direct = psycopg.connect(direct_dsn(application_name='storm-provider'), autocommit=True)
    results, failures = [], []
    rng = random.Random(idx)
    for jt, key in messages:
        t0 = time.monotonic()
        try:
            if jt == TX_TYPE:
                r = deliver_tx(c, jt, key, wname, stats, nowait=rng.random() < 0.5)
            else:
                r = deliver_ext(c, direct, jt, key, wname, stats)
        except Lost as e:
            failures.append('%s %s: gave up: %s' % (jt, key, e))
            continue
        except psycopg.Error as e:
            failures.append('%s %s: %s %s' % (jt, key, e.sqlstate, e))
            c.conn = None
            continue
        r['elapsed'] = time.monotonic() - t0
        results.append(r)
    with open(outpath, 'w') as f:
        json.dump({'results': results, 'failures': failures, 'stats': stats}, f)


def setup(nkeys, copies):
    with psycopg.connect(direct_dsn(), autocommit=True) as c:
        for jt in list(EXT_TYPES) + [TX_TYPE, CONTRAST_TYPE]:
            c.execute('DELETE FROM idempotency.operations WHERE job_type = %s', (jt,))
            c.execute('DELETE FROM idempotency.job_types WHERE job_type = %s', (jt,))
        for jt, (policy, cap) in list(EXT_TYPES.items()) + [(TX_TYPE, ('hold', None)),
                                                           (CONTRAST_TYPE, ('hold', None))]:
            c.execute("INSERT INTO idempotency.job_types (job_type, lease, stale_policy, max_attempts) "
                      "VALUES (%s, '1 hour', %s, %s)", (jt, policy, cap))
        c.execute('DROP TABLE IF EXISTS storm_emails, storm_invoices')
        c.execute('CREATE TABLE storm_emails (job_type text, operation_key text, attempt int, delivery text)')
        c.execute('CREATE TABLE storm_invoices (operation_key text, delivery text)')
    # the queue: every copy of every key, copies close together
    queue = [(k + random.random() * 8, jt, 'K%d' % k)
             for k in range(nkeys) for jt in list(EXT_TYPES) + [TX_TYPE] for _ in range(copies)]
    queue.sort()
    return [(jt, key) for _, jt, key in queue]


def teardown():
    with psycopg.connect(direct_dsn(), autocommit=True) as c:
        c.execute('DROP TABLE IF EXISTS storm_emails, storm_invoices')
        for jt in list(EXT_TYPES) + [TX_TYPE, CONTRAST_TYPE]:
            c.execute('DELETE FROM idempotency.operations WHERE job_type = %s', (jt,))
            c.execute('DELETE FROM idempotency.job_types WHERE job_type = %s', (jt,))


def storm(proxy, args, workdir):
    queue = setup(args.keys, args.copies)
    # deal the queue out in runs, so that the copies of a key go to different
    # workers at about the same time
    shares = [[] for _ in range(args.workers)]
    for i, m in enumerate(queue):
        shares[i % args.workers].append(m)
    for i, (sub, p) in enumerate((('claim_operation', args.p), ('complete_operation', args.p), ('COMMIT', args.p))):
        proxy.ctl('drop-fraction %s %g %d' % (sub, p, args.seed + i))
    tap.note('%d deliveries of %d keys (%d job types x %d keys x %d copies) by %d worker processes; '
             'drop-fraction %g on claim_operation, complete_operation and COMMIT (seed %d); '
             'up to %d backend terminations and %d proxy resets'
             % (len(queue), args.keys * 4, 4, args.keys, args.copies, args.workers, args.p, args.seed,
                args.terminations, args.resets))
    ctx = multiprocessing.get_context('fork')
    procs = []
    t0 = time.monotonic()
    for i, share in enumerate(shares):
        out = os.path.join(workdir, 'worker-%d.json' % i)
        p = ctx.Process(target=worker_main, args=(i, share, proxy.dsn(), out))
        p.start()
        procs.append((p, out))
    # the storm: terminate random worker backends, reset every connection now and then
    terminated = resets = 0
    rng = random.Random(args.seed)
    deadline = t0 + args.deadline
    tick = 0
    with psycopg.connect(direct_dsn(application_name='storm-killer'), autocommit=True) as k:
        while any(p.is_alive() for p, _ in procs) and time.monotonic() < deadline:
            time.sleep(0.25)
            tick += 1
            if tick % 8 == 2 and resets < args.resets:
                answer = proxy.ctl('reset')
                resets += 1
                tap.note('reset at %.1f s: %s' % (time.monotonic() - t0, answer))
            elif terminated < args.terminations:
                pids = [r[0] for r in k.execute("SELECT pid FROM pg_stat_activity "
                                                "WHERE application_name LIKE 'storm-w%'").fetchall()]
                if pids:
                    if k.execute('SELECT pg_terminate_backend(%s)', (rng.choice(pids),)).fetchone()[0]:
                        terminated += 1
    late = [p for p, _ in procs if p.is_alive()]
    for p in late:
        p.terminate()
    for p, _ in procs:
        p.join(10)
    elapsed = time.monotonic() - t0
    proxy.ctl('clear')
    tap.ok(not late, 'every worker process ended by itself within %d s (%.1f s)' % (args.deadline, elapsed),
           '%d still running' % len(late))
    results, failures = [], []
    wstats = {}
    for p, out in procs:
        if not os.path.exists(out):
            failures.append('worker %s wrote no results (exit %s)' % (p.name, p.exitcode))
            continue
        with open(out) as f:
            data = json.load(f)
        results += data['results']
        failures += data['failures']
        for kk, v in data['stats'].items():
            wstats[kk] = wstats.get(kk, 0) + v
    pstats = proxy.stats()
    tap.note('%.1f s; proxy: %s' % (elapsed, ' '.join('%s=%d' % kv for kv in pstats.items())))
    tap.note('workers: %s; %d backends terminated, %d proxy resets'
             % (' '.join('%s=%d' % kv for kv in sorted(wstats.items())), terminated, resets))
    check(queue, results, failures, wstats, pstats, terminated, resets, args)
    return elapsed, pstats, wstats, terminated, resets


def check(queue, results, failures, wstats, pstats, terminated, resets, args):
    tap.ok(not failures, 'no delivery gave up or met an unexpected error', '\n'.join(failures[:20]))
    tap.ok(len(results) == len(queue), 'every delivery was handled (%d of %d)' % (len(results), len(queue)))
    with psycopg.connect(direct_dsn(), autocommit=True) as c:
        records = {(r[0], r[1]): r[2:] for r in c.execute(
            'SELECT job_type, operation_key, status, attempt, result FROM idempotency.operations '
            'WHERE job_type LIKE %s', ('storm\\_%',)).fetchall()}
        emails = {}
        for jt, key, attempt, d in c.execute('SELECT * FROM storm_emails').fetchall():
            emails.setdefault((jt, key), []).append((attempt, d))
        invoices = {}
        for key, d in c.execute('SELECT * FROM storm_invoices').fetchall():
            invoices.setdefault(key, []).append(d)
    keys = sorted(set(queue))
    # 1. effects: exactly one per key (nothing went stale, so no policy allows a second)
    dup = {k: v for k, v in emails.items() if len(v) > 1}
    missing = [k for k in keys if k[0] in EXT_TYPES and len(emails.get(k, [])) == 0]
    tap.ok(not dup, 'external effects: no key emailed twice (%d keys, %d emails)'
           % (sum(1 for k in keys if k[0] in EXT_TYPES), sum(len(v) for v in emails.values())),
           list(dup.items())[:10])
    tap.ok(not missing, 'external effects: every key emailed', missing[:10])
    tap.ok(all(a == 1 for v in emails.values() for a, _ in v), 'every email was sent under attempt 1 (no takeover)')
    txkeys = [k for jt, k in keys if jt == TX_TYPE]
    bad_tx = {k: invoices.get(k, []) for k in txkeys if len(invoices.get(k, [])) != 1}
    tap.ok(not bad_tx, 'transactional: every key invoiced exactly once (%d keys)' % len(txkeys),
           list(bad_tx.items())[:10])
    # 2. no claim waited a lease: every key completed #1 within the run
    notdone = {k: records.get(k) for k in keys if (records.get(k) or (None,))[0:2] != ('completed', 1)}
    tap.ok(not notdone, 'no claim waits a lease: every key ended completed #1 during the run (lease 1 hour)',
           list(notdone.items())[:10])
    own_back = sum(1 for r in results if r.get('claim_retries') and r['verdict'] in ('run', 'verify'))
    tap.ok(own_back > 0, 'claims whose reply was lost got their own claim back on the retry: %d' % own_back)
    tap.ok(not any(r['verdict'] == 'verify' for r in results), 'no verify verdict (no claim ever went stale)')
    # 3. bounded waits
    worst = max((r['elapsed'] for r in results), default=0)
    slow = [r for r in results if r['elapsed'] > DELIVERY_BOUND]
    tap.ok(not slow, 'no delivery took longer than its bound of %d s (the longest: %.2f s)' % (DELIVERY_BOUND, worst),
           slow[:5])
    # 4. nothing recorded is lost
    acked = [r for r in results if r['completed']]
    lost = [r for r in acked if records.get((r['jt'], r['key'])) is None
            or records[(r['jt'], r['key'])][0] != 'completed'
            or records[(r['jt'], r['key'])][2] != {'delivery': r['delivery']}]
    tap.ok(acked and not lost, 'every completion a worker saw succeed is recorded with its result (%d)' % len(acked),
           lost[:5])
    mism = [k for k, v in emails.items() if records.get(k) and records[k][2] != {'delivery': v[0][1]}]
    tap.ok(not mism, "every record's result names the delivery that sent its email", mism[:5])
    runs = {}
    for r in results:
        if r['verdict'] in ('run', 'verify'):
            runs.setdefault((r['jt'], r['key']), set()).add(r['delivery'])
    tap.ok(all(len(v) == 1 for v in runs.values()), 'one delivery ran each key (a retry of the same delivery '
           'counts once)', [k for k, v in runs.items() if len(v) > 1][:5])
    # 5. the faults happened
    tap.ok(pstats['dropped'] >= 10, 'the proxy dropped %d replies' % pstats['dropped'])
    tap.ok(wstats['claim_retries'] > 0 and wstats['complete_retries'] > 0 and wstats['tx_retries'] > 0,
           'claims (%d), completions (%d) and transactions (%d) were retried after lost connections'
           % (wstats['claim_retries'], wstats['complete_retries'], wstats['tx_retries']))
    tap.ok(terminated > 0 and resets > 0, '%d worker backends terminated, %d proxy resets' % (terminated, resets))
    tap.note('verdicts (the last answer each delivery got; the longest delivery): %s' % ', '.join(
        '%s %d (%.2f s)' % (v, sum(1 for r in results if r['verdict'] == v),
                            max(r['elapsed'] for r in results if r['verdict'] == v))
        for v in sorted({r['verdict'] for r in results})))


def contrast(proxy, args):
    """One worker, no delivery tokens: a lost claim reply leaves the key claimed."""
    proxy.ctl('drop-fraction claim_operation 0.3 %d' % args.seed)
    stats = {'lost_connections': 0, 'claim_retries': 0, 'complete_retries': 0, 'tx_retries': 0}
    c = Conn(proxy.dsn(), 'storm-contrast', stats)
    n, lost_keys, answers = args.contrast_keys, set(), {}
    for i in range(n):
        key = 'C%d' % i
        before = stats['claim_retries']
        v = c.retried(CLAIM_NO_TOKEN, (CONTRAST_TYPE, key, 'fp', 'contrast'), 'claim_retries')
        if stats['claim_retries'] > before:
            lost_keys.add(key)
        answers[key] = v[0]
        if v[0] == 'run':
            c.retried(COMPLETE, (CONTRAST_TYPE, key, v[1], '{}'), 'complete_retries')
    proxy.ctl('clear')
    with psycopg.connect(direct_dsn(), autocommit=True) as d:
        stuck = {r[0] for r in d.execute("SELECT operation_key FROM idempotency.operations WHERE job_type = %s "
                                         "AND status = 'claimed'", (CONTRAST_TYPE,)).fetchall()}
    tap.note('contrast: %d keys, one worker, no delivery tokens, drop-fraction 0.3 on its claims: '
             '%d claims lost their reply' % (n, len(lost_keys)))
    tap.ok(lost_keys and stuck == lost_keys and all(answers[k] == 'in_progress' for k in lost_keys),
           'contrast, without tokens: each of the %d claims whose reply was lost was answered in_progress on the '
           'retry and is left claimed, waiting its lease' % len(lost_keys),
           'lost %s stuck %s' % (sorted(lost_keys), sorted(stuck)))


def has_03():
    with psycopg.connect(direct_dsn(), autocommit=True) as c:
        c.execute('CREATE EXTENSION IF NOT EXISTS idempotency')
        avail = c.execute("SELECT default_version, installed_version FROM pg_available_extensions "
                          "WHERE name = 'idempotency'").fetchone()
        if avail and avail[0] != avail[1]:
            try:
                c.execute('ALTER EXTENSION idempotency UPDATE')
            except psycopg.Error:
                pass
        return c.execute("SELECT 'delivery' = ANY (proargnames) FROM pg_proc "
                         "WHERE oid = 'idempotency.claim_operation'::regproc").fetchone()[0]


def main():
    faultlib.exit_on_sigterm()
    long_run = os.environ.get('IDEMPOTENCY_LONG', '0') not in ('', '0')
    ap = argparse.ArgumentParser()
    ap.add_argument('--require', action='store_true', help='the 0.3 API must be there')
    ap.add_argument('--keys', type=int, default=3000 if long_run else 500, help='keys per job type')
    ap.add_argument('--copies', type=int, default=3, help='deliveries of each key')
    ap.add_argument('--workers', type=int, default=6)
    ap.add_argument('--p', type=float, default=0.1, help='fraction of claim/complete/COMMIT replies dropped')
    ap.add_argument('--seed', type=int, default=12)
    ap.add_argument('--terminations', type=int, default=300 if long_run else 40)
    ap.add_argument('--resets', type=int, default=20 if long_run else 4)
    ap.add_argument('--deadline', type=int, default=900 if long_run else 120, help='seconds')
    ap.add_argument('--contrast-keys', type=int, default=40)
    ap.add_argument('--no-contrast', dest='contrast', action='store_false')
    args = ap.parse_args()
    if not has_03():
        tap.note('claim_operation() has no delivery argument: the extension predates 0.3')
        if args.require:
            tap.ok(False, 'the 0.3 API (claim_operation(..., delivery, wait)) is installed')
            return tap.done()
        print('storm: skipped (needs idempotency 0.3)')
        return 0
    with tempfile.TemporaryDirectory(prefix='storm.') as workdir, Proxy(workdir=workdir) as proxy:
        try:
            tap.run('storm', storm, proxy, args, workdir)
            if args.contrast:
                proxy.ctl('clear')
                tap.run('contrast', contrast, proxy, args)
        finally:
            if tap.failed:
                tap.note('proxy log (last 40 lines):\n' + '\n'.join(proxy.log_text().splitlines()[-40:]))
            teardown()
    return tap.done()


if __name__ == '__main__':
    sys.exit(main())
