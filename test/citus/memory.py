#!/usr/bin/python3
"""Memory per backend under long-lived connections (issue 18); see memory.sh.

Each scenario is one client thread holding one connection for the whole run,
as a pool holds it, with every statement prepared by the server (psycopg's
prepare=True, as pgbench -M prepared or a driver's prepared statements do).
It makes MEMORY_WARMUP calls, then every thread waits; the private memory
(RssAnon in /proc/PID/status) of every backend that serves a scenario is
read; then each scenario makes MEMORY_CALLS calls (20 000) and the memory is
read again. A backend that grew by more than MEMORY_LIMIT_KB (4 MiB) fails
the run.

Two more scenarios check the advice the README gives for an application's
own functions on Citus, and that this measurement sees growth at all: a
delegated PL/pgSQL function of the application's that writes and reads a
colocated table must grow by more than the limit in MEMORY_SELFTEST_CALLS
(2000) calls (Citus's growth, not ours: if it does not, the run fails,
because the test could no longer tell), and the same function with
SET plan_cache_mode = force_custom_plan must stay within it.

The backends that serve a scenario: the one its connection talks to, and,
on a Citus node, every backend Citus opened for that session on the other
nodes (application_name 'citus_internal gpid=G', where G is the session's
citus_backend_gpid()). Backends that appear after the first reading are
listed (they had no baseline) and their size is reported.

Scenarios (a call is one function call; the run path's operation is two):
  plain_run      one plain node: claim a new key, complete it (autocommit)
  plain_dup      one plain node: claim a completed key
  coord_run      Citus, through the coordinator: the run path (autocommit;
                 the calls are delegated to the worker holding the key)
  coord_dup      Citus, through the coordinator: the duplicate path
  coord_txn      Citus, through the coordinator: BEGIN; claim; complete;
                 COMMIT (force_delegation: the transaction runs on the
                 key's worker)
  coord_batch    Citus, through the coordinator: claim_operations of 2 new
                 keys with wait => false (the helpers' way: its bound is
                 carried to the workers with a SET LOCAL each call),
                 complete_operations of them
  worker_run     Citus, connected to worker w1: the run path (keys held by
                 w1 run there; keys held by w2 are delegated from w1)
  worker_batch   Citus, connected to worker w2: the batch calls
  inplace_run    Citus, connected to worker w2: the run path through the
                 calls in place (0.4; not delegated: keys held by w2 on the
                 shard directly, keys held by w1 through Citus from w2)
  inplace_dup    Citus, connected to worker w1: the duplicate path through
                 the calls in place (keys of both workers, as inplace_run)
  app_generic    Citus, through the coordinator: public.app_effect(key),
                 the application's delegated function (must grow)
  app_custom     the same with SET plan_cache_mode = force_custom_plan
                 (public.app_effect_custom)

Environment: PLAIN_HOST/PLAIN_PORT/PLAIN_DB for the plain node;
CITUS_DIR, CITUS_DB, CITUS_PORT_COORD/W1/W2 for the Citus nodes (as
test/citus/cluster.sh exports them). MEMORY_SCENARIOS (comma-separated)
runs a subset. The job type "memory" must exist on both installs, the keys
DUP-1 .. DUP-1000 completed, and on Citus the two application functions
(memory.sh makes them).

Exit 0 if every backend did as its scenario expects, 1 if not, 2 if the run
could not be made.
"""
import os
import sys
import threading
import time
import uuid

import psycopg

WARMUP = int(os.environ.get("MEMORY_WARMUP", "1000"))
CALLS = int(os.environ.get("MEMORY_CALLS", "20000"))
SELFTEST_CALLS = int(os.environ.get("MEMORY_SELFTEST_CALLS", "2000"))
LIMIT_KB = int(os.environ.get("MEMORY_LIMIT_KB", str(4 * 1024)))
JOB = "memory"
DUP_KEYS = 1000
RUN_ID = uuid.uuid4().hex[:8]

CLAIM = "SELECT verdict, attempt FROM idempotency.claim_operation(%s, %s)"
COMPLETE = "SELECT idempotency.complete_operation(%s, %s, %s)"
CLAIM_IN_PLACE = "SELECT verdict, attempt FROM idempotency.claim_operation_in_place(%s, %s)"
COMPLETE_IN_PLACE = "SELECT idempotency.complete_operation_in_place(%s, %s, %s)"
CLAIM_BATCH = ("SELECT operation_key, verdict, attempt"
               " FROM idempotency.claim_operations(%s, %s)")
CLAIM_BATCH_NOWAIT = ("SELECT operation_key, verdict, attempt"
                      " FROM idempotency.claim_operations(%s, %s, wait => false)")
COMPLETE_BATCH = ("SELECT done, sqlstate"
                  " FROM idempotency.complete_operations(%s, %s, %s)")


def nodes():
    d = os.environ.get("CITUS_DIR")
    n = {"plain": (os.environ["PLAIN_HOST"], os.environ["PLAIN_PORT"],
                   os.environ.get("PLAIN_DB", "postgres"))}
    if d:
        db = os.environ.get("CITUS_DB", "citus")
        n["coord"] = (d, os.environ["CITUS_PORT_COORD"], db)
        n["w1"] = (d, os.environ["CITUS_PORT_W1"], db)
        n["w2"] = (d, os.environ["CITUS_PORT_W2"], db)
    return n


NODES = nodes()
CITUS_NODES = [n for n in ("coord", "w1", "w2") if n in NODES]


def connect(node):
    host, port, db = NODES[node]
    return psycopg.connect(host=host, port=port, dbname=db, user="postgres",
                           autocommit=True)


def rss_anon_kb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


class Failure(Exception):
    pass


# ---------------------------------------------------------------- scenarios
# Each step function makes `calls` calls on conn; i counts operations so that
# keys are new across warm-up and measurement.

def run_path(conn, name, calls, state, claim=None, complete=None):
    done = 0
    while done < calls:
        state["n"] += 1
        key = f"{RUN_ID}-{name}-{state['n']}"
        verdict, attempt = conn.execute(claim or CLAIM, (JOB, key), prepare=True).fetchone()
        if verdict != "run":
            raise Failure(f"{name}: claim of new key {key} answered {verdict}")
        conn.execute(complete or COMPLETE, (JOB, key, attempt), prepare=True)
        done += 2


def in_place(step):
    """the same step through the calls in place (0.4: claim_operation_in_place,
    complete_operation_in_place; generic plans from the sixth call)"""
    def in_place_step(conn, name, calls, state):
        return step(conn, name, calls, state, CLAIM_IN_PLACE, COMPLETE_IN_PLACE)
    return in_place_step


def dup_path(conn, name, calls, state, claim=None, complete=None):
    for _ in range(calls):
        state["n"] += 1
        key = f"DUP-{state['n'] % DUP_KEYS + 1}"
        verdict, _ = conn.execute(claim or CLAIM, (JOB, key), prepare=True).fetchone()
        if verdict != "completed":
            raise Failure(f"{name}: claim of completed key {key} answered {verdict}")


def txn_path(conn, name, calls, state):
    done = 0
    while done < calls:
        state["n"] += 1
        key = f"{RUN_ID}-{name}-{state['n']}"
        with conn.transaction():
            verdict, attempt = conn.execute(CLAIM, (JOB, key), prepare=True).fetchone()
            if verdict != "run":
                raise Failure(f"{name}: claim of new key {key} answered {verdict}")
            conn.execute(COMPLETE, (JOB, key, attempt), prepare=True)
        done += 2


def batch_path(conn, name, calls, state):
    done = 0
    while done < calls:
        keys = []
        for _ in range(2):
            state["n"] += 1
            keys.append(f"{RUN_ID}-{name}-{state['n']}")
        claim = CLAIM_BATCH_NOWAIT if name == "coord_batch" else CLAIM_BATCH
        rows = conn.execute(claim, (JOB, keys), prepare=True).fetchall()
        if sorted(r[0] for r in rows) != sorted(keys) or any(r[1] != "run" for r in rows):
            raise Failure(f"{name}: claim_operations of new keys answered {rows}")
        att = {r[0]: r[2] for r in rows}
        res = conn.execute(COMPLETE_BATCH, (JOB, keys, [att[k] for k in keys]),
                           prepare=True).fetchall()
        if any(not r[0] for r in res):
            raise Failure(f"{name}: complete_operations refused: {res}")
        done += 2


def app_path(function):
    def step(conn, name, calls, state):
        for _ in range(calls):
            state["n"] += 1
            key = f"{RUN_ID}-{name}-{state['n']}"
            n, = conn.execute(f"SELECT public.{function}(%s)", (key,), prepare=True).fetchone()
            if n != 1:
                raise Failure(f"{name}: {function}({key}) answered {n}")
    return step


SCENARIOS = {
    # name: (node, step, calls, expected: "flat" or "grows")
    "plain_run": ("plain", run_path, CALLS, "flat"),
    "plain_dup": ("plain", dup_path, CALLS, "flat"),
    "coord_run": ("coord", run_path, CALLS, "flat"),
    "coord_dup": ("coord", dup_path, CALLS, "flat"),
    "coord_txn": ("coord", txn_path, CALLS, "flat"),
    "coord_batch": ("coord", batch_path, CALLS, "flat"),
    "worker_run": ("w1", run_path, CALLS, "flat"),
    "worker_batch": ("w2", batch_path, CALLS, "flat"),
    "inplace_run": ("w2", in_place(run_path), CALLS, "flat"),
    "inplace_dup": ("w1", in_place(dup_path), CALLS, "flat"),
    "app_generic": ("coord", app_path("app_effect"), SELFTEST_CALLS, "grows"),
    "app_custom": ("coord", app_path("app_effect_custom"), SELFTEST_CALLS, "flat"),
}


class Client(threading.Thread):
    def __init__(self, name, barrier):
        super().__init__(name=name, daemon=True)
        self.node, self.step, self.calls, self.expected = SCENARIOS[name]
        self.conn = connect(self.node)
        self.pid = self.conn.info.backend_pid
        self.gpid = None
        if self.node != "plain":
            self.gpid = self.conn.execute("SELECT citus_backend_gpid()").fetchone()[0]
        self.barrier = barrier
        self.state = {"n": 0}
        self.error = None
        self.seconds = None

    def run(self):
        try:
            self.step(self.conn, self.name, WARMUP, self.state)
            self.barrier.wait()     # the first reading
            self.barrier.wait()     # measure from here
            t = time.monotonic()
            self.step(self.conn, self.name, self.calls, self.state)
            self.seconds = time.monotonic() - t
        except threading.BrokenBarrierError:
            pass
        except Exception as e:     # noqa: BLE001 - reported, the run fails
            self.error = e
            self.barrier.abort()


def serving_backends(clients, monitors):
    """{(scenario, node, pid): RssAnon kB} for every backend serving a client."""
    out = {}
    for c in clients:
        out[(c.name, c.node, c.pid)] = rss_anon_kb(c.pid)
    gpids = {f"citus_internal gpid={c.gpid}": c.name for c in clients if c.gpid}
    for node, conn in monitors.items():
        rows = conn.execute(
            "SELECT pid, application_name FROM pg_stat_activity"
            " WHERE application_name LIKE 'citus_internal gpid=%'").fetchall()
        for pid, app in rows:
            if app in gpids:
                out[(gpids[app], node, pid)] = rss_anon_kb(pid)
    return out


def main():
    wanted = os.environ.get("MEMORY_SCENARIOS")
    names = [n for n in SCENARIOS if SCENARIOS[n][0] in NODES]
    if wanted:
        names = [n for n in wanted.split(",") if n]
        unknown = [n for n in names if n not in SCENARIOS]
        if unknown:
            print(f"memory: unknown scenario(s) {', '.join(unknown)}", file=sys.stderr)
            return 2
    barrier = threading.Barrier(len(names) + 1)
    try:
        clients = [Client(n, barrier) for n in names]
        monitors = {n: connect(n) for n in CITUS_NODES}
    except psycopg.Error as e:
        print(f"memory: cannot connect: {e}", file=sys.stderr)
        return 2
    print(f"memory: {len(names)} scenarios, {WARMUP} calls of warm-up, then"
          f" {CALLS} calls each ({SELFTEST_CALLS} for app_*), at once;"
          f" limit {LIMIT_KB} kB per backend", flush=True)
    for c in clients:
        c.start()
    try:
        barrier.wait()
        before = serving_backends(clients, monitors)
        barrier.wait()
    except threading.BrokenBarrierError:
        pass
    for c in clients:
        c.join()
    errors = [c for c in clients if c.error]
    if errors:
        for c in errors:
            print(f"memory: {c.name}: {type(c.error).__name__}: {c.error}", file=sys.stderr)
        return 2
    after = serving_backends(clients, monitors)

    wrong = 0
    print(f"{'scenario':<13} {'node':<6} {'pid':>8} {'before kB':>10} {'after kB':>10}"
          f" {'growth kB':>10} {'B/call':>7}  verdict")
    for c in clients:
        print(f"# {c.name}: {c.calls} calls in {c.seconds:.1f} s", flush=True)
    by_name = {c.name: c for c in clients}
    grown = {n: 0 for n in names}
    for key in sorted(after, key=lambda k: (names.index(k[0]), k[1], k[2])):
        scen, node, pid = key
        a = after[key]
        b = before.get(key)
        if b is None or a is None:
            print(f"{scen:<13} {node:<6} {pid:>8} {'-':>10} {a if a is not None else '-':>10}"
                  f" {'-':>10} {'-':>7}  NEW (no baseline: opened during the run)")
            continue
        g = a - b
        c = by_name[scen]
        if g > LIMIT_KB:
            grown[scen] += 1
        verdict = "grew" if g > LIMIT_KB else "flat"
        if c.expected == "flat" and verdict == "grew":
            verdict, wrong = "WRONG: grew", wrong + 1
        print(f"{scen:<13} {node:<6} {pid:>8} {b:>10} {a:>10} {g:>10} {g * 1024 // c.calls:>7}"
              f"  {verdict}")
    for n in names:
        if by_name[n].expected == "grows" and not grown[n]:
            wrong += 1
            print(f"{n:<13} WRONG: no backend grew by more than {LIMIT_KB} kB: the"
                  " measurement no longer sees Citus's growth")
    gone = [k for k in before if k not in after]
    for scen, node, pid in gone:
        print(f"{scen:<13} {node:<6} {pid:>8}  gone during the run")
    print(f"memory: {'WRONG' if wrong else 'OK'}: {wrong} wrong; a backend may grow by at"
          f" most {LIMIT_KB} kB over its scenario's calls (app_generic must)")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
