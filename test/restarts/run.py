#!/usr/bin/python3
"""test/restarts/run.py: restarts under load (issue 12, item 4).

For each queue system (Celery + RabbitMQ, Sidekiq + Redis, SQS through
fauxqs), the example's real broker, two real workers with the example's
helper, its fake mail provider and event log (the adapters of
examples/*/e2e.py, reused as they are), connected to PostgreSQL through
PgBouncer in transaction pooling mode (127.0.0.1, a random port). A load of
KEYS distinct orders is published in three waves, some of them twice (at
once, two copies; or again after they completed), and in the middle of the
run the test

  1. restarts PgBouncer: SIGTERM (1.18: immediate shutdown; every client and
     server connection is cut), then a new pgbouncer process on the same port;
  2. restarts PostgreSQL: pg_ctl restart -m fast (every backend terminated,
     a busy one in the middle of its call), as the cluster's owner.

Each restart happens while keys are in flight (published, not completed).
The workers are never restarted by the test: the helpers must reconnect by
themselves. The job type's policy is hold and its lease (E2E_LEASE, 120 s)
is longer than the whole run, so that no claim may go stale and no
duplicate is allowed at all. Afterwards the invariants:

  * exactly once: one email per published key (the fake provider's outbox);
  * every record completed #1 (no takeover, nothing held or left claimed);
  * nothing lost: every key completed within BOUND seconds of its publish
    (default 60 s, less than half the lease);
  * no lease waited because of a lost reply: a delivery that found the
    key's claim owned by nobody would be told in_progress and come back
    only after the lease. Keys published once must see no in_progress at
    all (nor 55P03/57014); a key published as two copies at once at most
    one (the copy that met the other copy's young claim); a key published
    again after it completed, none (it is answered completed);
  * no job failed (action failed or fail), none superseded, and every
    worker process the test started is still the one running.

It prints, per restart, what was cut (PgBouncer's clients and servers at
the moment, PostgreSQL's backends) and how the helpers recovered: claims
sent once more with the same delivery token ("claim error (connection,
again)" events), among them the lost replies (the server had recorded the
claim before the helper saw the connection fail: the record's claimed_at is
before the event), claims handed back to the queue's own retry, and
complete/release calls sent again (the workers' logs).

To make sure each restart cuts a call of the helpers, not only idle
connections, one key per restart is held by the fake provider's kill point
"after" (the email sent, the completion not yet): across PgBouncer's
restart its worker's connection is cut while it waits; for PostgreSQL's,
the test locks the key's row and lets the worker go, so that its
complete_operation waits inside the server when pg_ctl terminates the
backend. Both must end completed #1 with one email, within the bound.

PgBouncer ignores the startup parameter "options" (as in test/pooler), so
the Celery workers' PGOPTIONS role is not applied here: they work as the
connecting user.

    /usr/bin/python3 test/restarts/run.py [--systems celery,sidekiq,sqs] [--keys 150] [--keep]

With celery among the systems, run it with the python of the venv where
examples/celery/venv.sh installed the helper package pg-idempotency
(examples/celery/e2e.py, loaded here, and its workers import it):
$(examples/celery/venv.sh) test/restarts/run.py ...; hook 83 does.

Needs (installed by scripts/test.d/83-restarts.sh): pgbouncer, the three
systems' packages and npm modules, a PostgreSQL with the extension from
libpq's environment (PGHOST, PGPORT, ...), and PGDATA / CLUSTER_DIR /
CLUSTER_OWNER / PG_BINDIR of the throwaway cluster of scripts/test (the
PostgreSQL restart runs scripts/cluster.sh's cluster_as_owner pg_ctl). The
last line is "restarts: N passed, N failed" (one per system).
"""
import os
import sys

# before harness.py (and the adapters) are imported: they read it at import
os.environ.setdefault("E2E_LEASE", "120")

import argparse              # noqa: E402
import importlib.util        # noqa: E402
import re                    # noqa: E402
import shutil                # noqa: E402
import signal                # noqa: E402
import subprocess            # noqa: E402
import tempfile              # noqa: E402
import time                  # noqa: E402

import psycopg               # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "examples", "e2e"))
import harness  # noqa: E402

LEASE = harness.LEASE
BOUND = float(os.environ.get("RESTARTS_BOUND", "60"))   # s from a key's publish to its completion
WAIT = float(os.environ.get("RESTARTS_WAIT", "90"))     # s for the load to reach a restart point
WORKERS = 2
PGBOUNCER = os.environ.get("PGBOUNCER", "/usr/sbin/pgbouncer")
BUSY = ("55P03", "57014")
POLICY = "hold"


class Failed(Exception):
    pass


def owner():
    o = os.environ.get("CLUSTER_OWNER") or ""
    if os.geteuid() == 0 and o in ("", "root"):
        o = "postgres"
    return o


def as_owner(argv):
    o = owner()
    if os.geteuid() == 0 and o:
        return ["runuser", "-u", o, "--"] + argv
    return argv


# ---- PgBouncer -----------------------------------------------------------
class Bouncer:
    """pgbouncer on 127.0.0.1 and a free port, transaction pooling, as the
    cluster's owner, the configuration of test/pooler/run.sh. stop() is a
    real process stop (SIGTERM: 1.18's immediate shutdown, every connection
    cut); start() again uses the same port."""

    def __init__(self, tmp):
        self.dir = os.path.join(tmp, "pgbouncer")
        os.makedirs(self.dir)
        self.port = harness.free_port()
        self.pid = None
        self.starts = 0
        db = os.environ.get("PGDATABASE", "postgres")
        self.user = os.environ.get("PGUSER", "postgres")
        self.db = db
        host = os.environ.get("PGHOST") or "/var/run/postgresql"
        port = os.environ.get("PGPORT") or "5432"
        with open(os.path.join(self.dir, "pgbouncer.ini"), "w") as f:
            f.write(f"""[databases]
{db} = host={host} port={port} dbname={db}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {self.dir}/userlist.txt
admin_users = {self.user}
pool_mode = transaction
max_client_conn = 300
default_pool_size = 60
reserve_pool_size = 0
server_reset_query =
ignore_startup_parameters = extra_float_digits,options
logfile = {self.dir}/pgbouncer.log
pidfile = {self.dir}/pgbouncer.pid
""")
        with open(os.path.join(self.dir, "userlist.txt"), "w") as f:
            f.write(f'"{self.user}" ""\n')
        if os.geteuid() == 0:
            o = owner()
            for p in (self.dir, *(os.path.join(self.dir, n) for n in os.listdir(self.dir))):
                shutil.chown(p, o)
        os.chmod(self.dir, 0o755)

    def version(self):
        return subprocess.run([PGBOUNCER, "--version"], stdout=subprocess.PIPE, text=True).stdout.split()[1]

    def start(self):
        pidfile = os.path.join(self.dir, "pgbouncer.pid")
        if os.path.exists(pidfile):
            os.unlink(pidfile)
        subprocess.run(as_owner([PGBOUNCER, "-d", "-q", os.path.join(self.dir, "pgbouncer.ini")]),
                       cwd=self.dir, check=True)
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                with open(pidfile) as f:
                    self.pid = int(f.read().strip())
                break
            except (FileNotFoundError, ValueError):
                time.sleep(0.02)
        else:
            raise Failed("pgbouncer wrote no pid file in 30 s")
        while time.time() < deadline:
            if self.admin("SHOW VERSION", check=False) is not None:
                self.starts += 1
                return
            time.sleep(0.02)
        raise Failed("pgbouncer does not answer on its admin console")

    def stop(self):
        pid, self.pid = self.pid, None
        if pid is None:
            return
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.time() + 10
        while time.time() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.01)
        os.kill(pid, signal.SIGKILL)

    def admin(self, command, check=True):
        """rows (lists of strings, the first the header) of an admin command"""
        out = subprocess.run(["psql", "-X", "-A", "-F", "\t", "-P", "footer=off", "-h", "127.0.0.1",
                              "-p", str(self.port), "-U", self.user, "-d", "pgbouncer", "-c", command],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=30)
        if out.returncode != 0:
            if check:
                raise Failed(f"pgbouncer admin {command!r}: {out.stderr.strip()}")
            return None
        return [line.split("\t") for line in out.stdout.splitlines()]

    def count(self, command):
        """rows of SHOW CLIENTS / SHOW SERVERS for the test's database"""
        rows = self.admin(command)
        col = rows[0].index("database")
        return sum(1 for r in rows[1:] if r[col] == self.db)

    def mode(self):
        rows = self.admin("SHOW CONFIG")
        return next((r[1] for r in rows[1:] if r[0] == "pool_mode"), None)

    def env(self):
        return {"PGHOST": "127.0.0.1", "PGPORT": str(self.port)}

    def log_count(self, pattern):
        try:
            with open(os.path.join(self.dir, "pgbouncer.log")) as f:
                return sum(1 for line in f if pattern in line)
        except FileNotFoundError:
            return 0


def restart_postgres():
    """pg_ctl restart -m fast as the cluster's owner (scripts/cluster.sh's
    cluster_as_owner); the server keeps its options (postmaster.opts)"""
    for var in ("PGDATA", "CLUSTER_DIR", "PG_BINDIR"):
        if not os.environ.get(var):
            raise Failed(f"${var} is not set: run from scripts/test (hook 83-restarts)")
    script = ('source scripts/cluster.sh && cluster_as_owner "$PG_BINDIR/pg_ctl" -D "$PGDATA" '
              '-l "$CLUSTER_DIR/server.log" -m fast -w -t 60 restart')
    out = subprocess.run(["bash", "-c", script], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                         start_new_session=True, timeout=120)
    if out.returncode != 0:
        raise Failed(f"pg_ctl restart -m fast failed ({out.returncode}): {out.stdout.strip()}")


def connect_direct(timeout=60):
    """the test's own connection, straight to the server (not through PgBouncer)"""
    deadline = time.time() + timeout
    while True:
        try:
            return psycopg.connect(autocommit=True)
        except psycopg.OperationalError:
            if time.time() > deadline:
                raise
            time.sleep(0.1)


# ---- publishers and adapters ----------------------------------------------
def load_adapter_module(system):
    path = os.path.join(ROOT, "examples", system, "e2e.py")
    spec = importlib.util.spec_from_file_location(f"e2e_{system}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class LinePublisher:
    """a long-lived publisher process: "ORDER COPIES" in, "ok" out"""

    def __init__(self, argv, cwd, env, log):
        self.proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=log, text=True, start_new_session=True)

    def publish(self, key, copies):
        self.proc.stdin.write(f"{key} {copies}\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if line.strip() != "ok":
            raise Failed(f"the publisher did not publish {key}: {line!r} (exit {self.proc.poll()})")

    def close(self):
        p = self.proc
        try:
            p.stdin.close()
        except OSError:
            pass
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        p.stdout.close()


def make_system(system):
    """(adapter, publisher factory) of a queue system: the e2e test's adapter
    as it is; only the publishing is batched in one process (Sidekiq, SQS)"""
    mod = load_adapter_module(system)
    if system == "celery":
        a = mod.Celery()

        class Pub:
            def publish(self, key, copies):
                a.publish(key, copies)

            def close(self):
                pass
        return a, lambda log: Pub()
    if system == "sidekiq":
        a = mod.Sidekiq()
        return a, lambda log: LinePublisher(["ruby", os.path.join(HERE, "publish.rb")],
                                            os.path.join(ROOT, "examples", "sidekiq"), a._env(), log)
    if system == "sqs":
        a = mod.Sqs()
        return a, lambda log: LinePublisher(["node", os.path.join(HERE, "publish.mjs")],
                                            os.path.join(ROOT, "examples", "sqs"), a._env(), log)
    raise SystemExit(f"unknown system {system}")


# ---- one system -------------------------------------------------------------
class Load:
    def __init__(self, system, keys):
        self.system = system
        self.keys = [f"R{system[:2].upper()}-{i:04d}" for i in range(keys)]
        n = len(self.keys)
        self.waves = [self.keys[: n // 3], self.keys[n // 3: 2 * n // 3], self.keys[2 * n // 3:]]
        # every 10th key from 5: two copies at once; every 10th from 0: published
        # again after it completed (with the next wave; the last wave's at the end)
        self.twins = {k for i, k in enumerate(self.keys) if i % 10 == 5}
        self.again = {k for i, k in enumerate(self.keys) if i % 10 == 0}
        self.published = {}    # key -> time of its first publish
        self.copies = {}       # key -> messages published
        self.republished = {}  # key -> time of the publish after its completion


def run_system(system, bouncer, tmp, nkeys):
    a, publisher = make_system(system)
    load = Load(system, nkeys)
    sdir = os.path.join(tmp, system)
    os.makedirs(sdir)
    os.chmod(sdir, 0o755)
    t0 = time.time()
    a.start_broker(sdir)
    print(f"{system}: broker up in {time.time() - t0:.1f} s: {a.broker_desc}", flush=True)
    r = pub = None
    restarts = []
    try:
        a.begin(POLICY)
        r = harness.Run(a, POLICY, sdir)
        r.setup_db()
        r.extra_env = bouncer.env()
        pub_log = open(os.path.join(sdir, "publisher.log"), "w")
        pub = publisher(pub_log)
        r.ensure_workers(WORKERS)
        pids = [p.pid for p in r.workers]

        def completed_at():
            out = {}
            for e in r.events():
                if e["action"] == "completed" and e["key"] not in out:
                    out[e["key"]] = e["t"]
            return out

        def publish(keys):
            for k in keys:
                copies = 2 if k in load.twins else 1
                load.published.setdefault(k, time.time())
                load.copies[k] = load.copies.get(k, 0) + copies
                pub.publish(k, copies)

        def publish_again(keys):
            for k in keys:
                load.republished[k] = time.time()
                load.copies[k] += 1
                pub.publish(k, 1)

        timeouts = []   # the final waits: the checks below say why

        def wait_for(pred, what, timeout, fatal=True):
            deadline = time.time() + timeout
            while time.time() < deadline:
                r.check_workers_alive()
                v = pred()
                if v:
                    return v
                time.sleep(0.02)
            if fatal:
                raise Failed(f"timed out ({timeout:.0f} s) waiting for {what}")
            timeouts.append(f"timed out ({timeout:.0f} s) waiting for {what() if callable(what) else what}")

        def mid_run(wave, what):
            """wait until a third of the wave completed, while some of it is
            still in flight; returns the keys in flight"""
            need = max(1, len(wave) // 3)
            wait_for(lambda: len(set(wave) & set(completed_at())) >= need,
                     f"{need} keys of the wave to complete before the {what}", WAIT)
            done = completed_at()
            return [k for k in load.published if k not in done]

        t_load = time.time()
        # one key per restart whose completion the restart must cut, for
        # sure: its worker stops after the email (the fake provider's kill
        # point "after"), across the restart (PgBouncer: its connection is
        # cut while it waits) or, for PostgreSQL, is let go while the test
        # holds the key's row locked, so that its complete_operation waits
        # inside the server when pg_ctl terminates the backend
        held = [load.waves[0][1], load.waves[1][1]]   # neither twin nor published again
        r.pause(held[0], "after")
        # wave 1, then PgBouncer's restart in its middle
        publish(load.waves[0])
        flight = mid_run(load.waves[0], "PgBouncer restart")
        pid = r.wait_paused(held[0], "after")
        clients, servers = bouncer.count("SHOW CLIENTS"), bouncer.count("SHOW SERVERS")
        tc = time.time()
        bouncer.stop()
        bouncer.start()
        restarts.append({"what": "PgBouncer restart", "t": tc, "took": time.time() - tc,
                         "flight": len(flight), "held": held[0],
                         "cut": f"{clients} client and {servers} server connections"})
        r.release(held[0], "after", pid)
        # wave 2 (and wave 1's keys again), then PostgreSQL's restart in its middle
        r.pause(held[1], "after")
        publish(load.waves[1])
        publish_again([k for k in load.waves[0] if k in load.again])
        flight = mid_run(load.waves[1], "PostgreSQL restart")
        pid = r.wait_paused(held[1], "after")
        locker = psycopg.connect()   # straight to the server; the restart ends it
        locker.execute("SELECT 1 FROM idempotency.operations WHERE job_type = %s AND operation_key = %s "
                       "FOR UPDATE", (r.job_type, held[1]))
        r.release(held[1], "after", pid)

        def completion_waits():
            with r.db.cursor() as c:
                c.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                          "AND query LIKE %s", ("%complete_operation%",))
                return c.fetchone()[0] > 0
        wait_for(completion_waits, f"the completion of {held[1]} to wait for the test's row lock", WAIT)
        with r.db.cursor() as c:
            c.execute("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' "
                      "AND pid NOT IN (pg_backend_pid(), %s)", (locker.info.backend_pid,))
            backends = c.fetchone()[0]
        servers = bouncer.count("SHOW SERVERS")
        tc = time.time()
        restart_postgres()
        took = time.time() - tc
        locker.close()
        r.db.close()
        r.db = connect_direct()
        restarts.append({"what": "PostgreSQL restart (pg_ctl restart -m fast)", "t": tc, "took": took,
                         "flight": len(flight), "held": held[1],
                         "cut": f"{backends} backends (PgBouncer: {servers} server connections)"})
        # wave 3 (and wave 2's keys again); then every key must complete
        publish(load.waves[2])
        publish_again([k for k in load.waves[1] if k in load.again])
        last = time.time()
        wait_for(lambda: set(load.published) <= set(completed_at()),
                 lambda: (f"all {len(load.published)} keys to complete (missing: "
                          f"{', '.join(sorted(set(load.published) - set(completed_at()))[:10])} ...)"),
                 BOUND + max(0.0, last - time.time()), fatal=False)
        # wave 3's keys again, after their completion: answered completed
        rest = [k for k in load.waves[2] if k in load.again]
        publish_again(rest)

        def acked_again():
            evs = r.events(set(load.republished))
            ok = {e["key"] for e in evs if e["action"] == "ack" and e["t"] >= load.republished[e["key"]]}
            return set(load.republished) <= ok
        if not timeouts:   # else the checks below already fail, and say why
            wait_for(acked_again, "the keys published again after completion to be acknowledged", BOUND,
                     fatal=False)
        t_done = time.time()
        r.check_workers_alive()
        alive = [p.pid for p in r.workers if p.poll() is None]

        # ---- the invariants ------------------------------------------------
        problems = list(timeouts)
        if sorted(alive) != sorted(pids):
            problems.append(f"workers {pids} started, {alive} running at the end")
        emails = {}
        with open(r.mail_path) as f:
            for line in f:
                k = line.split("\t")[1]
                emails[k] = emails.get(k, 0) + 1
        bad = {k: emails.get(k, 0) for k in load.keys if emails.get(k, 0) != 1}
        stray = set(emails) - set(load.keys)
        if bad:
            problems.append(f"{len(bad)} keys without exactly one email: "
                            + ", ".join(f"{k}: {n}" for k, n in sorted(bad.items())[:10]))
        if stray:
            problems.append(f"emails for keys never published: {sorted(stray)[:10]}")
        with r.db.cursor() as c:
            c.execute("SELECT operation_key, status::text, attempt, extract(epoch FROM claimed_at)::float8, "
                      "extract(epoch FROM completed_at)::float8 FROM idempotency.operations "
                      "WHERE job_type = %s", (r.job_type,))
            records = {row[0]: row[1:] for row in c.fetchall()}
        wrong = {k: f"{v[0]} #{v[1]}" for k, v in records.items() if (v[0], v[1]) != ("completed", 1)}
        missing = set(load.keys) - set(records)
        if wrong:
            problems.append(f"{len(wrong)} records not completed #1: "
                            + ", ".join(f"{k}: {v}" for k, v in sorted(wrong.items())[:10]))
        if missing or set(records) - set(load.keys):
            problems.append(f"records: {len(missing)} keys without one, "
                            f"{len(set(records) - set(load.keys))} not published")
        late = {k: records[k][3] - t for k, t in load.published.items()
                if k in records and records[k][3] is not None and records[k][3] - t > BOUND}
        if late:
            problems.append(f"{len(late)} keys completed more than {BOUND:g} s after their publish: "
                            + ", ".join(f"{k}: {d:.1f} s" for k, d in sorted(late.items())[:10]))
        evs = r.events()
        busy = {}
        for e in evs:
            if e["verdict"] == "in_progress" or (e["verdict"] == "claim error" and e.get("sqlstate") in BUSY):
                busy[e["key"]] = busy.get(e["key"], 0) + 1
        over = {k: n for k, n in busy.items() if n > (1 if k in load.twins else 0)}
        if over:
            problems.append(f"{len(over)} keys told in_progress (a claim nobody owned: a lease to wait): "
                            + ", ".join(f"{k} ×{n}{' (2 copies)' if k in load.twins else ''}"
                                        for k, n in sorted(over.items())[:10]))
        # a claim whose connection was lost, handed to the queue's own retry:
        # the next delivery brings a new token, and if the lost claim had been
        # recorded it is told in_progress (a lease to wait). The restarts last
        # seconds; a helper must ride them out with its token.
        handed = [e for e in evs if e["verdict"] == "claim error" and e["action"] != "again"
                  and e.get("sqlstate") not in BUSY]
        if handed:
            kinds = {}
            for e in handed:
                kinds[f"{e.get('sqlstate')} -> {e['action']}"] = kinds.get(f"{e.get('sqlstate')} -> {e['action']}", 0) + 1
            problems.append(f"{len(handed)} claims given up after a lost connection, to the queue's retry "
                            f"with a new token ({', '.join(f'{k} ×{n}' for k, n in sorted(kinds.items()))}); "
                            f"keys {', '.join(sorted({e['key'] for e in handed})[:10])} ...")
        failed = [e for e in evs if e["action"] in ("failed", "fail", "superseded")]
        if failed:
            problems.append(f"{len(failed)} deliveries failed or were superseded: "
                            + "; ".join(f"{e['key']} {e['verdict']} -> {e['action']} ({e.get('sqlstate')})"
                                        for e in failed[:10]))

        # ---- what the restarts cut, how the helpers recovered ----------------
        ends = [x["t"] for x in restarts[1:]] + [t_done + 1]
        logs = []
        for n in range(len(r.logs)):
            with open(os.path.join(r.dir, f"worker-{n}.log"), errors="replace") as f:
                logs.append(f.read())
        notes = []
        for x, end in zip(restarts, ends):
            win = [e for e in evs if x["t"] <= e["t"] < end]
            again = [e for e in win if e["verdict"] == "claim error" and e["action"] == "again"]
            again_keys = {e["key"] for e in again}
            lost = {e["key"] for e in again
                    if e["key"] in records and records[e["key"]][2] < e["t"]}
            handed = [e for e in win if e["verdict"] == "claim error" and e["action"] not in ("again",)
                      and e.get("sqlstate") not in BUSY]
            h = x["held"]
            done_h = [e["t"] for e in evs if e["key"] == h and e["action"] == "completed"]
            held_note = (f"the completion of {h} (cut {'in the server' if 'PostgreSQL' in x['what'] else 'idle'})"
                         + (f" recorded {done_h[0] - x['t']:.1f} s after the restart began" if done_h
                            else " never recorded"))
            notes.append(f"  {x['what']} {x['t'] - t_load:.1f} s into the load (took {x['took']:.1f} s), "
                         f"{x['flight']} keys in flight: cut {x['cut']}; "
                         f"{len(again_keys)} claims sent again with their token ({len(again)} tries), "
                         f"{len(lost)} of them lost replies (recorded before the helper saw the failure) "
                         f"given back; {len(handed)} claims handed to the queue's retry; {held_note}")
        # the helpers' log lines "<complete or release>...: <error, maybe on
        # several lines>; once more on a new connection"
        rewrites = sum(len(re.findall(r"(?:complete|release)_operations?(?:(?!once more).){0,600}?once more",
                                      log, re.S)) for log in logs)
        waited = [records[k][3] - t for k, t in load.published.items() if k in records and records[k][3]]
        messages = sum(load.copies.values())
        summary = (f"{system}: {len(load.keys)} keys, {messages} messages ({len(load.twins)} keys as two "
                   f"copies, {len(load.again)} published again after completing), {WORKERS} workers "
                   f"through PgBouncer; load {t_done - t_load:.1f} s, publish to completion at most "
                   f"{max(waited, default=0):.1f} s (bound {BOUND:g} s, lease {LEASE:g} s); "
                   f"{sum(busy.values())} in_progress (all on keys published twice at once); "
                   f"{rewrites} tries of complete/release calls again on a new connection")
        return problems, summary, notes
    finally:
        if r is not None:
            r.stop_workers()
            for log in r.logs:
                log.close()
            try:
                if r.db.closed:
                    r.db = connect_direct()
                r.cleanup_db()
            except psycopg.Error as err:
                print(f"{system}: cleanup: {err}", file=sys.stderr)
        if pub is not None:
            pub.close()
            pub_log.close()
        a.stop_broker()


def main():
    ap = argparse.ArgumentParser(description="restarts of PgBouncer and PostgreSQL under load")
    ap.add_argument("--systems", default=os.environ.get("RESTARTS_SYSTEMS", "celery,sidekiq,sqs"))
    ap.add_argument("--keys", type=int, default=int(os.environ.get("RESTARTS_KEYS", "150")))
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args()
    if not LEASE >= 1.5 * BOUND:
        raise SystemExit(f"the lease ({LEASE:g} s) must be well above the bound ({BOUND:g} s): "
                         "a key that waits a lease must miss the bound")
    t0 = time.time()
    tmp = tempfile.mkdtemp(prefix="restarts-")
    os.chmod(tmp, 0o755)
    bouncer = Bouncer(tmp)
    passed = failed = 0
    results = []
    try:
        bouncer.start()
        if bouncer.mode() != "transaction":
            raise SystemExit("pgbouncer is not in transaction pooling mode")
        print(f"== restarts under load: pgbouncer {bouncer.version()} on 127.0.0.1:{bouncer.port} "
              f"(pool_mode = transaction), lease {LEASE:g} s, policy {POLICY}, bound {BOUND:g} s", flush=True)
        for system in args.systems.split(","):
            ts = time.time()
            try:
                problems, summary, notes = run_system(system, bouncer, tmp, args.keys)
            except (Failed, harness.Failed) as err:
                problems, summary, notes = [str(err)], f"{system}: not finished", []
            took = time.time() - ts
            results.append((system, problems, took))
            print(f"\n{summary}; {took:.1f} s in all")
            for n in notes:
                print(n)
            for p in problems:
                print(f"  FAIL: {p}")
            if problems:
                failed += 1
                args.keep = True
            else:
                passed += 1
                print(f"  ok: one email per key, all completed #1 within the bound, no lease waited, "
                      f"no job failed, the same {WORKERS} workers throughout")
            sys.stdout.flush()
    finally:
        bouncer.stop()
        print(f"\npgbouncer: started {bouncer.starts} times; its log: "
              f"{bouncer.log_count('server conn crashed?')} server connections crashed under a client, "
              f"{bouncer.log_count('server login has been failing')} logins refused while the server "
              f"was down or just back (server_login_retry)")
        if args.keep:
            print(f"kept: {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"\nrestarts: {', '.join(f'{s} {t:.0f} s' for s, _, t in results)}; {time.time() - t0:.1f} s in all")
    print(f"restarts: {passed} passed, {failed} failed")
    return 0 if failed == 0 and passed > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
