#!/usr/bin/python3
"""Property test of the claim protocol's state machine.

    PGHOST=... PGPORT=... PGUSER=postgres /usr/bin/python3 test/fuzz/state_machine.py
        [--sequences N] [--steps N] [--seed N] [--verbose]

Random sequences of claim / complete / release / extend / resolve / purge
with random job types (one of each policy, one with max_attempts 1, one
unregistered), a small pool of keys (so that steps collide), random
attempts (the current one, stale ones, future ones, 0, negative, NULL),
random fingerprints and results, and clock jumps: a record is aged by
moving its timestamps into the past as superuser (UPDATE), which is how a
lease runs out or a retention passes without waiting. After every step the
whole of idempotency.operations, the resolutions audit, stale_claims() and
job_type_stats are compared with a small model of the contract (issue 2),
and so are the verdict, attempt and result of a claim, the SQLSTATE of an
error, and the count purge_operations() returns. An error must change
nothing.

Runs in its own database (fuzz_state_machine, dropped and created again),
needs a superuser and the extension installed (make install). Exits 1 on
the first divergence, printing the seed and the steps that led to it.
The last line is "state-machine: N passed, N failed" (N counts sequences).
"""

import argparse
import json
import os
import random
import sys

import psycopg
from psycopg import sql

LEASE_MIN = 60          # every job type's lease, in minutes
RETENTION_MIN = 60      # retention of the job types that have one
AGE_STEPS = (25, 70)    # clock jumps, in minutes: far from the lease's edges

JOB_TYPES = {
    # name: (policy, max_attempts, retention?)
    'fz_hold': ('hold', None, True),
    'fz_retry': ('retry', 3, False),
    'fz_retry1': ('retry', 1, True),
    'fz_skip': ('skip', None, True),
    'fz_lookup': ('lookup', None, False),
}
UNREGISTERED = 'fz_nobody'
KEYS = ['K1', 'K2', 'K3', 'ORD-1001', 'é-ü', 'k' * 1024]


class Divergence(Exception):
    pass


class Record:
    def __init__(self, attempt, fingerprint, worker):
        self.status = 'claimed'
        self.attempt = attempt
        self.fingerprint = fingerprint
        self.claimed_by = worker
        self.result = None
        self.hb_age = 0          # minutes since the heartbeat (claim or extend)
        self.done_age = None     # minutes since completed_at; None when NULL

    def stale(self):
        return self.status == 'claimed' and self.hb_age >= LEASE_MIN

    def row(self):
        return (self.status, self.attempt, self.fingerprint, self.claimed_by,
                self.result, self.done_age is not None)


class Model:
    """What the contract says the records are."""

    def __init__(self):
        self.records = {}        # (job_type, key) -> Record
        self.resolutions = 0

    # each method returns ('ok', value) or ('error', sqlstate)

    def claim(self, jt, key, fp, worker):
        if jt not in JOB_TYPES:
            return ('error', 'ID001')
        policy, max_attempts, _ = JOB_TYPES[jt]
        r = self.records.get((jt, key))
        if r is None:
            self.records[(jt, key)] = Record(1, fp, worker)
            return ('ok', ('run', 1, None))
        if fp is not None and r.fingerprint is not None and fp != r.fingerprint:
            return ('error', 'ID002')
        if r.status == 'completed':
            return ('ok', ('completed', r.attempt, r.result))
        if r.status == 'skipped':
            return ('ok', ('skipped', r.attempt, None))
        if r.status == 'released':
            self._take_over(r, fp, worker)
            return ('ok', ('run', r.attempt, None))
        if not r.stale():
            return ('ok', ('in_progress', r.attempt, None))
        if policy == 'skip':
            r.status = 'skipped'
            r.done_age = 0
            return ('ok', ('skipped', r.attempt, None))
        if policy in ('retry', 'lookup') and (max_attempts is None or r.attempt < max_attempts):
            self._take_over(r, fp, worker)
            return ('ok', ('run' if policy == 'retry' else 'verify', r.attempt, None))
        return ('ok', ('held', r.attempt, None))

    def _take_over(self, r, fp, worker):
        r.status = 'claimed'
        r.attempt += 1
        r.hb_age = 0
        r.done_age = None
        r.claimed_by = worker
        if r.fingerprint is None:
            r.fingerprint = fp
        r.result = None

    def _fenced(self, jt, key, attempt, allowed, done):
        """complete/release/extend: None when the fenced update applies."""
        if attempt is None:
            return ('error', '22004')
        if attempt < 1:
            return ('error', '22023')
        if jt not in JOB_TYPES:
            return ('error', 'ID001')
        r = self.records.get((jt, key))
        if r is None:
            return ('error', 'ID004')
        if attempt < r.attempt:
            return ('error', 'ID003')     # superseded by a later claim
        if attempt > r.attempt:
            return ('error', '22023')     # never issued: a caller bug
        if r.status in allowed:
            return None
        if r.status == done:
            return ('ok', None)        # a repeated call is a no-op
        return ('error', 'ID005')

    def complete(self, jt, key, attempt, result):
        refusal = self._fenced(jt, key, attempt, ('claimed', 'skipped'), 'completed')
        if refusal:
            return refusal
        r = self.records[(jt, key)]
        r.status = 'completed'
        r.result = result
        r.done_age = 0
        return ('ok', None)

    def release(self, jt, key, attempt):
        refusal = self._fenced(jt, key, attempt, ('claimed', 'skipped'), 'released')
        if refusal:
            return refusal
        r = self.records[(jt, key)]
        r.status = 'released'
        r.result = None
        r.done_age = None
        return ('ok', None)

    def extend(self, jt, key, attempt):
        refusal = self._fenced(jt, key, attempt, ('claimed',), None)
        if refusal:
            return refusal
        self.records[(jt, key)].hb_age = 0
        return ('ok', None)

    def resolve(self, jt, key, resolution):
        if resolution is None:
            return ('error', '22004')
        if resolution not in ('completed', 'retry'):
            return ('error', '22023')
        if jt not in JOB_TYPES:
            return ('error', 'ID001')
        r = self.records.get((jt, key))
        if r is None:
            return ('error', 'ID004')
        if not (r.status == 'skipped' or r.stale()):
            return ('error', 'ID005')
        if resolution == 'completed':
            r.status = 'completed'
            r.done_age = 0
        else:
            r.status = 'released'
            r.done_age = None
            r.result = None
        self.resolutions += 1
        return ('ok', None)

    def purge(self, batch_size):
        if batch_size is None:
            return ('error', '22004')
        if batch_size < 1:
            return ('error', '22023')
        gone = [k for k, r in self.records.items()
                if JOB_TYPES[k[0]][2] and r.status in ('completed', 'skipped')
                and r.done_age is not None and r.done_age >= RETENTION_MIN]
        for k in gone:
            del self.records[k]
        return ('ok', len(gone))

    def age(self, jt, key, minutes):
        r = self.records.get((jt, key))
        if r is not None:
            r.hb_age += minutes
            if r.done_age is not None:
                r.done_age += minutes

    def stale_claims(self):
        return sorted((jt, key, r.attempt) for (jt, key), r in self.records.items() if r.stale())

    def stats(self):
        out = {}
        for jt in JOB_TYPES:
            counts = {'claimed': 0, 'completed': 0, 'released': 0, 'skipped': 0, 'stale': 0}
            for (j, _), r in self.records.items():
                if j == jt:
                    counts[r.status] += 1
                    counts['stale'] += r.stale()
            out[jt] = counts
        return out


class Database:
    """The same calls against the extension, in autocommit (like a worker)."""

    def __init__(self, conn):
        self.conn = conn

    def _call(self, query, params, fetch):
        try:
            cur = self.conn.execute(query, params)
            return ('ok', fetch(cur))
        except psycopg.Error as e:
            if e.sqlstate is None or e.sqlstate.startswith('XX') or e.sqlstate.startswith('58'):
                raise Divergence(f'internal error {e.sqlstate}: {e}')
            return ('error', e.sqlstate)

    def claim(self, jt, key, fp, worker):
        def fetch(cur):
            rows = cur.fetchall()
            if len(rows) != 1:
                raise Divergence(f'claim_operation returned {len(rows)} rows')
            return tuple(rows[0])
        return self._call('SELECT verdict, attempt, result FROM idempotency.claim_operation(%s, %s, %s, %s)',
                          (jt, key, fp, worker), fetch)

    def complete(self, jt, key, attempt, result):
        r = self._call('SELECT idempotency.complete_operation(%s, %s, %s, %s::jsonb)',
                       (jt, key, attempt, None if result is None else json.dumps(result)),
                       lambda cur: None)
        return r

    def release(self, jt, key, attempt):
        return self._call('SELECT idempotency.release_operation(%s, %s, %s)',
                          (jt, key, attempt), lambda cur: None)

    def extend(self, jt, key, attempt):
        def fetch(cur):
            # the new expiry is the database clock now plus the lease
            ok = self.conn.execute(
                'SELECT abs(extract(epoch FROM %s - (clock_timestamp() + %s::interval))) < 60',
                (cur.fetchone()[0], f'{LEASE_MIN} minutes')).fetchone()[0]
            if not ok:
                raise Divergence('extend_lease returned an expiry that is not now + lease')
            return None
        return self._call('SELECT idempotency.extend_lease(%s, %s, %s)', (jt, key, attempt), fetch)

    def resolve(self, jt, key, resolution):
        return self._call("SELECT idempotency.resolve_operation(%s, %s, %s, 'fuzz')",
                          (jt, key, resolution), lambda cur: None)

    def purge(self, batch_size):
        return self._call('SELECT idempotency.purge_operations(%s)', (batch_size,),
                          lambda cur: cur.fetchone()[0])

    def age(self, jt, key, minutes):
        self.conn.execute(
            'UPDATE idempotency.operations SET claimed_at = claimed_at - %(m)s::interval,'
            ' heartbeat_at = heartbeat_at - %(m)s::interval,'
            ' completed_at = completed_at - %(m)s::interval'
            ' WHERE job_type = %(j)s AND operation_key = %(k)s',
            {'m': f'{minutes} minutes', 'j': jt, 'k': key})

    def records(self):
        rows = self.conn.execute(
            'SELECT job_type, operation_key, status::text, attempt, fingerprint, claimed_by,'
            ' result, completed_at IS NOT NULL FROM idempotency.operations').fetchall()
        return {(r[0], r[1]): tuple(r[2:]) for r in rows}

    def stale_claims(self):
        return sorted(tuple(r) for r in self.conn.execute(
            'SELECT job_type, operation_key, attempt FROM idempotency.stale_claims()').fetchall())

    def stats(self):
        out = {}
        for r in self.conn.execute(
                'SELECT job_type, claimed, completed, released, skipped, stale'
                ' FROM idempotency.job_type_stats').fetchall():
            out[r[0]] = dict(zip(('claimed', 'completed', 'released', 'skipped', 'stale'), r[1:]))
        return out

    def resolutions(self):
        return self.conn.execute('SELECT count(*) FROM idempotency.resolutions').fetchone()[0]


def show(op, args):
    """A step as text, long strings shortened"""
    def short(a):
        if isinstance(a, str) and len(a) > 40:
            return f'{a[:1]!r}*{len(a)}'
        return repr(a)
    return f'{op}(' + ', '.join(short(a) for a in args) + ')'


def random_step(rng, model):
    """One random call: (name, args)."""
    jt = rng.choice(list(JOB_TYPES) * 6 + [UNREGISTERED])
    key = rng.choice(KEYS)
    r = model.records.get((jt, key))
    cur = r.attempt if r else 1
    attempt = rng.choice([cur] * 8 + [cur - 1, cur + 1, 0, -3, None, rng.randint(1, 5)])
    op = rng.choices(
        ['claim', 'complete', 'release', 'extend', 'resolve', 'purge', 'age'],
        weights=[30, 20, 8, 6, 10, 4, 20])[0]
    if op == 'claim':
        return op, (jt, key, rng.choice([None, None, 'fpA', 'fpB']), rng.choice([None, 'w1', 'w2']))
    if op == 'complete':
        result = rng.choice([None, {'sent': True}, {'id': rng.randint(1, 99)}, [1, 'two'], 'text', 0])
        return op, (jt, key, attempt, result)
    if op in ('release', 'extend'):
        return op, (jt, key, attempt)
    if op == 'resolve':
        return op, (jt, key, rng.choice(['completed', 'retry'] * 4 + ['done', None, '']))
    if op == 'purge':
        return op, (rng.choice([1, 2, 10000, 0, None]),)
    return op, (jt, key, rng.choice(AGE_STEPS))


def compare_state(model, db, label):
    want = {k: r.row() for k, r in model.records.items()}
    got = db.records()
    if want != got:
        lines = []
        for k in sorted(set(want) | set(got)):
            if want.get(k) != got.get(k):
                lines.append(f'  {k}: model {want.get(k)}, database {got.get(k)}')
        raise Divergence(f'{label}: records differ:\n' + '\n'.join(lines))
    if model.stale_claims() != db.stale_claims():
        raise Divergence(f'{label}: stale_claims() {db.stale_claims()}, model {model.stale_claims()}')
    ms, ds = model.stats(), db.stats()
    if ms != ds:
        raise Divergence(f'{label}: job_type_stats {ds}, model {ms}')
    if model.resolutions != db.resolutions():
        raise Divergence(f'{label}: {db.resolutions()} resolutions audited, model {model.resolutions}')


def run_sequence(conn, rng, steps, verbose):
    conn.execute('DELETE FROM idempotency.operations')
    conn.execute('DELETE FROM idempotency.resolutions')
    model, db = Model(), Database(conn)
    history = []
    counts = {}
    for i in range(steps):
        op, args = random_step(rng, model)
        history.append(show(op, args))
        if op == 'age':
            model.age(*args)
            db.age(*args)
        else:
            want = getattr(model, op)(*args)
            got = getattr(db, op)(*args)
            if want != got:
                raise Divergence(f'step {i}: {show(op, args)}: database {got}, model {want}', history)
            outcome = want[1][0] if op == 'claim' and want[0] == 'ok' else want[0] if want[0] == 'ok' else want[1]
            counts[f'{op}:{outcome}'] = counts.get(f'{op}:{outcome}', 0) + 1
        try:
            compare_state(model, db, f'after step {i} {show(op, args)}')
        except Divergence as e:
            raise Divergence(str(e), history)
        if verbose:
            print(f'  {i}: {show(op, args)} ok')
    return counts


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--sequences', type=int, default=int(os.environ.get('FUZZ_SEQUENCES', 20)))
    ap.add_argument('--steps', type=int, default=300)
    ap.add_argument('--seed', type=int, default=None)
    ap.add_argument('--verbose', action='store_true')
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 32)

    dbname = 'fuzz_state_machine'
    with psycopg.connect(dbname=os.environ.get('PGDATABASE', 'postgres'), autocommit=True) as admin:
        admin.execute(sql.SQL('DROP DATABASE IF EXISTS {}').format(sql.Identifier(dbname)))
        admin.execute(sql.SQL('CREATE DATABASE {}').format(sql.Identifier(dbname)))
    passed = failed = 0
    totals = {}
    try:
        with psycopg.connect(dbname=dbname, autocommit=True) as conn:
            conn.execute('CREATE EXTENSION idempotency')
            for jt, (policy, max_attempts, retention) in JOB_TYPES.items():
                conn.execute(
                    'INSERT INTO idempotency.job_types (job_type, lease, stale_policy, max_attempts, retention)'
                    ' VALUES (%s, %s::interval, %s, %s, %s::interval)',
                    (jt, f'{LEASE_MIN} minutes', policy, max_attempts,
                     f'{RETENTION_MIN} minutes' if retention else None))
            for n in range(args.sequences):
                sseed = seed + n
                try:
                    counts = run_sequence(conn, random.Random(sseed), args.steps, args.verbose)
                    passed += 1
                    for k, v in counts.items():
                        totals[k] = totals.get(k, 0) + v
                except Divergence as e:
                    failed += 1
                    print(f'not ok - sequence {n} (replay: --seed {sseed} --sequences 1): {e.args[0]}')
                    if len(e.args) > 1:
                        print('  the last steps:')
                        for h in e.args[1][-15:]:
                            print(f'    {h}')
                    break
    finally:
        with psycopg.connect(dbname=os.environ.get('PGDATABASE', 'postgres'), autocommit=True) as admin:
            admin.execute(sql.SQL('DROP DATABASE IF EXISTS {}').format(sql.Identifier(dbname)))
    steps = sum(totals.values())
    print(f'seed {seed}: {passed} sequences of {args.steps} steps agreed with the model '
          f'({steps} calls checked, plus clock jumps)')
    print('outcomes: ' + ', '.join(f'{k} {v}' for k, v in sorted(totals.items())))
    print(f'state-machine: {passed} passed, {failed} failed')
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
