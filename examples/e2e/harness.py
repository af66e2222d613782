"""harness.py: a queue system under test, its workers and what they report.

Shared by the end-to-end scenarios (scenarios.py, run by examples/sqs,
examples/celery and examples/sidekiq's e2e.py), the sign-off driver
(signoff.py: only the adapter's broker) and the restarts test
(test/restarts/run.py). Each queue system supplies an Adapter (start and
stop its broker on 127.0.0.1, start a worker process, publish the
send_confirmation message of an order, run its sweeper); a Run is one job
type under one policy with its workers.

Synchronisation, never a guessed sleep:
  * kill points: the test creates the FIFO $E2E_DIR/pause-<key>-<before|after>;
    the fake mail provider of the worker that reaches that point first takes
    it, writes $E2E_DIR/at-<key>-<point> with its pid and blocks on the FIFO.
    The test then kill -9s that pid (or writes to the FIFO to let it go on);
  * verdicts: every worker appends one JSON line per delivery to
    $E2E_EVENTS (key, verdict, attempt, action, pid); the test waits on it;
  * leases: the test polls idempotency.stale_claims() in the database.

Run with /usr/bin/python3 (Debian's python3-psycopg). The database comes from
libpq's environment (PGHOST, PGPORT, PGUSER, PGDATABASE); the extension must
be installed there (CREATE EXTENSION is done if missing).
"""

import json
import os
import re
import signal
import subprocess
import time

import psycopg

LEASE = float(os.environ.get("E2E_LEASE", "2"))
WAIT = float(os.environ.get("E2E_WAIT", "40"))   # longest wait for one step



class Failed(Exception):
    pass



FAULT_PROXY = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                           "..", "..", "test", "faults", "pgproxy.py"))


class FaultProxy:
    """test/faults/pgproxy.py between the workers and PostgreSQL (127.0.0.1,
    a free port; upstream: libpq's PGHOST/PGPORT, a host or a socket
    directory). Started by the first scenario that needs it, stopped at the end."""

    def __init__(self, tmp):
        self.tmp = tmp
        self.proc = None
        self.log = None
        self.port = None
        self.control = os.path.join(tmp, "pgproxy.sock")

    def start(self):
        if self.proc is not None:
            return self
        if not os.path.exists(FAULT_PROXY):
            raise Failed(f"the fault proxy {os.path.relpath(FAULT_PROXY)} is not there")
        host = os.environ.get("PGHOST") or "/var/run/postgresql"
        port = os.environ.get("PGPORT") or "5432"
        self.log = open(os.path.join(self.tmp, "pgproxy.log"), "w")
        self.proc = subprocess.Popen(
            ["/usr/bin/python3", FAULT_PROXY, "serve", "--listen-port", "0", "--upstream-host", host,
             "--upstream-port", port, "--control", self.control],
            stdout=subprocess.PIPE, stderr=self.log, text=True, start_new_session=True)
        line = self.proc.stdout.readline().split()   # "ready PORT"
        if len(line) != 2 or line[0] != "ready":
            self.stop()
            raise Failed(f"pgproxy.py did not start: {' '.join(line)!r} (log {self.tmp}/pgproxy.log)")
        self.port = int(line[1])
        return self

    def ctl(self, command):
        out = subprocess.run(["/usr/bin/python3", FAULT_PROXY, "ctl", self.control, command],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=30)
        if out.returncode != 0:
            raise Failed(f"pgproxy.py ctl {command!r}: rc {out.returncode}: {out.stdout.strip()}")
        return out.stdout.strip()

    def dropped(self):
        """how many replies the proxy dropped so far (stats: ok ... dropped=N ...)"""
        m = re.search(r"\bdropped=(\d+)", self.ctl("stats"))
        if not m:
            raise Failed("pgproxy.py stats: no dropped=N")
        return int(m.group(1))

    def env(self):
        """libpq's environment of a worker that connects through the proxy"""
        return {"PGHOST": "127.0.0.1", "PGPORT": str(self.port)}

    def stop(self):
        p, self.proc = self.proc, None
        if p is None:
            return
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        p.stdout.close()
        self.log.close()


def free_port():
    """a free TCP port on 127.0.0.1"""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Adapter:
    """What a queue system provides. Subclasses override the methods."""
    name = "?"
    # what the queue does with the message of a worker killed by kill -9:
    #   "visibility": redelivered when its visibility timeout runs out (after the lease)
    #   "at once":    requeued at once (inside the lease)
    #   "never":      lost; only the stale claim remains (the sweeper finds it)
    redelivery = "?"
    notes = []

    def start_broker(self, tmp):
        raise NotImplementedError

    def begin(self, policy):
        """called before the workers of a policy start"""

    def stop_broker(self):
        raise NotImplementedError

    def worker_command(self):
        """(argv, cwd, extra env) of one worker process"""
        raise NotImplementedError

    def publish(self, key, copies=1, other=False):
        """other: the same key with another payload (another email address)"""
        raise NotImplementedError

    # lost-message-sweeper: how a message gets lost on this system, and how
    # the verdicts show it (a regular expression and its text)
    lost_rx = r"run \(killed, job lost\)"
    lost_text = "run (killed, job lost)"

    def lose(self, r, key):
        """publish key and make its message gone for good after the claim: a
        stale claim remains that no delivery will meet. Default: kill -9 the
        worker before the email, for systems that lose its message then"""
        if self.redelivery != "never":
            raise NotImplementedError
        r.pause(key, "before")
        self.publish(key)
        r.kill9(key, r.wait_paused(key, "before"))

    # fingerprint-mismatch: what the helper does with a claim refused with
    # ID002 (the event's action), and a check of the queue's side (returns a
    # note)
    refused_action = "raise"

    def check_refused(self, r, key):
        return None

    def sweep(self, env):
        """run the sweeper once; return its output"""
        raise NotImplementedError

    def setup_db(self, db, job_type):
        """called after the job type of a policy was registered (e.g. grants)"""

    # lost-reply: the helper's event when its claim's connection was lost
    # and it claimed again on a new connection (with the same delivery token)
    lost_reply_rx = r"claim error \(connection, again\), run"
    lost_reply_text = "claim error (connection, again), run"

    def workers_restarted(self):
        """called after the test stopped the workers and started new ones
        (lost-reply runs them through the fault proxy), before it publishes"""

    # scenarios of this system only: [(name, what it proves, run(r, key) ->
    # note, policies)]; policies as in scenarios.SCENARIOS
    own_scenarios = []
    # scenarios left out on this system: {name: why}
    left_out = {}


class Run:
    def __init__(self, adapter, policy, tmp, faults=None):
        self.a = adapter
        self.faults = faults   # FaultProxy (lost-reply)
        self.extra_env = {}    # e.g. the proxy's PGHOST/PGPORT for the workers
        self.policy = policy
        self.tmp = tmp
        self.job_type = f"send_confirmation_e2e_{adapter.name}_{policy}"
        self.dir = os.path.join(tmp, policy)
        os.makedirs(self.dir)
        self.events_path = os.path.join(self.dir, "events.jsonl")
        self.mail_path = os.path.join(self.dir, "outbox.log")
        open(self.events_path, "w").close()
        open(self.mail_path, "w").close()
        self.workers = []      # Popen
        self.logs = []
        self.db = psycopg.connect(autocommit=True)
        self.tokens = {}       # key -> list of (time, token) added by the test
        self.killed = set()    # pids killed by the test

    # ---- environment, workers -------------------------------------------
    def env(self):
        e = dict(os.environ)
        e.update(JOB_TYPE=self.job_type, LEASE_SECONDS=str(LEASE), E2E_DIR=self.dir,
                 E2E_EVENTS=self.events_path, MAIL_LOG=self.mail_path)
        return e

    def start_worker(self):
        argv, cwd, extra = self.a.worker_command()
        env = self.env()
        env.update(extra)
        env.update(self.extra_env)   # after the adapter's (which may copy os.environ)
        n = len(self.logs)
        log = open(os.path.join(self.dir, f"worker-{n}.log"), "w")
        self.logs.append(log)
        p = subprocess.Popen(argv, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)
        self.workers.append(p)
        return p

    def ensure_workers(self, n=2):
        for p in self.workers:
            if p.pid in self.killed:
                p.wait()   # reaped, so that poll() below cannot miss it
        self.workers = [p for p in self.workers if p.poll() is None]
        while len(self.workers) < n:
            self.start_worker()

    def restart_workers(self, extra_env):
        """new workers with this environment on top (e.g. the fault proxy's)"""
        self.stop_workers()
        self.extra_env = extra_env
        self.ensure_workers()
        self.a.workers_restarted()

    def stop_workers(self):
        for p in self.workers:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.time() + 10
        for p in self.workers:
            try:
                p.wait(max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                pass
        for p in self.workers:
            # the whole process group: a prefork pool's children too
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
        self.workers = []

    # ---- database ---------------------------------------------------------
    def setup_db(self):
        with self.db.cursor() as c:
            c.execute("CREATE EXTENSION IF NOT EXISTS idempotency")
            c.execute("DELETE FROM idempotency.operations WHERE job_type = %s", (self.job_type,))
            c.execute("DELETE FROM idempotency.job_types WHERE job_type = %s", (self.job_type,))
            c.execute("INSERT INTO idempotency.job_types (job_type, lease, stale_policy) "
                      "VALUES (%s, make_interval(secs => %s), %s)",
                      (self.job_type, LEASE, self.policy))
        self.a.setup_db(self.db, self.job_type)

    def cleanup_db(self):
        with self.db.cursor() as c:
            c.execute("DELETE FROM idempotency.operations WHERE job_type = %s", (self.job_type,))
            c.execute("DELETE FROM idempotency.job_types WHERE job_type = %s", (self.job_type,))
        self.db.close()

    def record(self, key):
        with self.db.cursor() as c:
            c.execute("""SELECT o.status::text, o.attempt,
                                o.heartbeat_at + j.lease > clock_timestamp()
                           FROM idempotency.operations o
                           JOIN idempotency.job_types j USING (job_type)
                          WHERE o.job_type = %s AND o.operation_key = %s""", (self.job_type, key))
            r = c.fetchone()
        if r is None:
            return "none"
        status, attempt, young = r
        s = f"{status} #{attempt}"
        if status == "claimed":
            s += " (young)" if young else " (stale)"
        return s

    def wait_stale(self, key):
        deadline = time.time() + WAIT
        while time.time() < deadline:
            with self.db.cursor() as c:
                c.execute("SELECT 1 FROM idempotency.stale_claims(%s) WHERE operation_key = %s",
                          (self.job_type, key))
                if c.fetchone():
                    return
            time.sleep(0.05)
        raise Failed(f"{key}: the claim never became stale")

    # ---- events, mail, kill points ----------------------------------------
    def events(self, keys=None):
        out = []
        with open(self.events_path) as f:
            for line in f:
                line = line.strip()
                if line:
                    e = json.loads(line)
                    if keys is None or e["key"] in keys:
                        out.append(e)
        return out

    def wait_events(self, keys, pred, what):
        deadline = time.time() + WAIT
        while time.time() < deadline:
            evs = self.events(keys)
            if pred(evs):
                return evs
            self.check_workers_alive()
            time.sleep(0.02)
        raise Failed(f"{','.join(keys)}: timed out waiting for {what}; events: "
                     + "; ".join(f"{e['verdict']}->{e['action']}" for e in self.events(keys)))

    def check_workers_alive(self):
        for p in self.workers:
            rc = p.poll()
            if rc is not None and rc != -signal.SIGKILL:
                raise Failed(f"worker {p.pid} exited with {rc} (log in {self.dir})")

    def settle(self, keys, acks):
        """wait until `acks` deliveries of these keys were acknowledged"""
        done = ("ack", "completed", "superseded")
        return self.wait_events(keys, lambda evs: sum(e["action"] in done for e in evs) >= acks,
                                f"{acks} acknowledged deliveries")

    def emails(self, key):
        with open(self.mail_path) as f:
            return sum(1 for line in f if line.split("\t")[1:2] == [key])

    def pause(self, key, point):
        os.mkfifo(os.path.join(self.dir, f"pause-{key}-{point}"))

    def crash(self, key):
        """the fake provider fails with an unexpected error on the next email
        of key (before sending; the helper cannot know it was not sent)"""
        open(os.path.join(self.dir, f"crash-{key}"), "w").close()

    def stale_listed(self, key):
        with self.db.cursor() as c:
            c.execute("SELECT 1 FROM idempotency.stale_claims(%s) WHERE operation_key = %s",
                      (self.job_type, key))
            return c.fetchone() is not None

    def refuse(self, key):
        """the fake provider refuses the next email of key (and sends nothing)"""
        open(os.path.join(self.dir, f"refuse-{key}"), "w").close()

    def wait_paused(self, key, point):
        marker = os.path.join(self.dir, f"at-{key}-{point}")
        deadline = time.time() + WAIT
        while time.time() < deadline:
            if os.path.exists(marker):
                with open(marker) as f:
                    text = f.read()
                if text.endswith("\n"):
                    return int(text)
            self.check_workers_alive()
            time.sleep(0.01)
        raise Failed(f"{key}: no worker reached the kill point '{point}'")

    def release(self, key, point, pid):
        path = os.path.join(self.dir, f"pause-{key}-{point}.taken-{pid}")
        with open(path, "w") as f:
            f.write("go\n")

    def kill9(self, key, pid):
        os.kill(pid, signal.SIGKILL)
        deadline = time.time() + WAIT
        while time.time() < deadline:
            # our own child: reap it, so that it does not linger as a zombie
            for p in self.workers:
                if p.pid == pid:
                    p.poll()
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                        break   # dead; its parent has not reaped it yet
            except (FileNotFoundError, ProcessLookupError):
                # gone; or reaped between open() and read(), which then
                # fails with ESRCH (seen under load in the Debian 12 root)
                break
            time.sleep(0.01)
        self.killed.add(pid)

    def note(self, key, token, t=None):
        self.tokens.setdefault(key, []).append((t or time.time(), token))

    def sweep(self, key):
        """run the sweeper; return what it did with key: "person" (a stale
        claim handed to a person), "stale" (a stale claim re-enqueued) or
        "released" (a released record nobody claimed for a lease,
        re-enqueued)"""
        t = time.time()   # what it re-enqueues may run before it exits
        out = self.a.sweep(self.env())
        with open(os.path.join(self.dir, "sweeper.log"), "a") as f:
            f.write(out)
        k = re.escape(key)
        if re.search(rf"^for a person: \S+ {k} attempt \d+ ", out, re.M):
            self.note(key, "sweeper: for a person", t)
            return "person"
        if re.search(rf"^re-enqueued: \S+ {k} attempt \d+ \(released\)$", out, re.M):
            self.note(key, "sweeper: re-enqueued (released)", t)
            return "released"
        if re.search(rf"^re-enqueued: \S+ {k} attempt \d+ \(policy \w+\)$", out, re.M):
            self.note(key, "sweeper: re-enqueued", t)
            return "stale"
        raise Failed(f"{key}: the sweeper did not report it:\n{out}")

    def resolve(self, key, resolution):
        """a person's decision (as an operator would type it)"""
        t = time.time()
        with self.db.cursor() as c:
            c.execute("SELECT idempotency.resolve_operation(%s, %s, %s, %s)",
                      (self.job_type, key, resolution, "e2e: the email was not sent"))
        self.note(key, f"person: {resolution}", t)

    def done_count(self, keys):
        return sum(e["action"] in ("ack", "completed", "superseded") for e in self.events(keys))

    # ---- the verdict sequence of a scenario -------------------------------
    def verdicts(self, keys):
        """the verdicts in time order, with the test's notes (sweeper) among
        them; consecutive repeats collapsed ("in_progress ×2")"""
        lost = self.a.redelivery == "never"
        items = []
        evs = self.events(keys)
        released = {(e["key"], e["attempt"]) for e in evs if e["action"] == "released"}
        failed = {(e["key"], e["attempt"]) for e in evs if e["action"] == "failed"}
        for e in evs:
            if e["action"] in ("completed", "superseded", "released", "failed"):
                continue   # the end of a run that is already listed
            v = e["verdict"]
            if v == "claim error":
                v = f"claim error ({e.get('sqlstate')}, {e['action']})"
            if e["action"] == "work" and e["pid"] in self.killed:
                v += " (killed, job lost)" if lost else " (killed)"
            elif e["action"] == "work" and (e["key"], e["attempt"]) in released:
                v += " (released)"
            elif e["action"] == "work" and (e["key"], e["attempt"]) in failed:
                v += " (failed)"
            items.append((e["t"], e["key"], v))
        for k in keys:
            items.extend((t, k, tok) for t, tok in self.tokens.get(k, []))
        items.sort(key=lambda x: x[0])
        collapsed = []   # [verdict, count, key]
        for _, k, v in items:
            if collapsed and collapsed[-1][0] == v and collapsed[-1][2] == k:
                collapsed[-1][1] += 1
            else:
                collapsed.append([v, 1, k])
        shown = ", ".join(v if n == 1 else f"{v} ×{n}" for v, n, _ in collapsed)
        plain = ", ".join(v for v, _, _ in collapsed)
        return shown, plain
