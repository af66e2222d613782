"""replay.py: the seed's replay matrix, driven through a real queue.

Shared by the end-to-end tests of examples/sqs, examples/celery and
examples/sidekiq. Each test supplies an adapter (start and stop its broker on
127.0.0.1, start a worker process, publish the send_confirmation message of an
order, run its sweeper) and this module runs the seven cases of the seed
through it, then two cases of the claim protocol around a queue (8: a
person's 'retry' decision reaches a worker through the sweeper; 9: a known
failure is released and sent by a later delivery, after a backoff), three
cases of each helper (12: the queue lost the message of a claim, the way it
happens on that system, and the sweeper hands the stale claim to a person or
re-enqueues it; 13: a job longer than two leases, kept young by the helper's
heartbeat, while a duplicate gets in_progress; 14: the same key with another
payload is refused with ID002), two cases of the wire between a worker and
the database (15: the reply to a claim is lost, for real, through the fault
proxy test/faults/pgproxy.py: the helper claims again on a new connection
with the same delivery token and gets its own claim back, run with the same
attempt, no lease waited; 16: a delivery meets another transaction's
uncommitted claim of the key: the helper does not wait for it, the delivery
is answered in_progress and retried later, the worker is free at once, and
one email is sent by a later delivery once the transaction is rolled back),
plus the adapter's own cases, and prints the matrix in the shape of
idempotency-matrix:

    case  attempt  | observed: emails, record afterwards, verdicts | expected

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
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import psycopg

LEASE = float(os.environ.get("E2E_LEASE", "2"))
WAIT = float(os.environ.get("E2E_WAIT", "40"))   # longest wait for one step

CASES = [
    ("1", "first delivery", "sent once"),
    ("2", "same message again after success", "skipped"),
    ("3", "same message to two workers at once", "one claims, one skips"),
    ("4", "different order ORD-1002, similar data", "both processed"),
    ("5", "worker dies after the claim, before the email", "held for a person after the lease"),
    ("6", "worker dies after the email, before completed", "held for a person after the lease"),
    ("7", "redelivery of case 5 inside the lease", "skipped; no second worker takes over"),
    # not in the seed: the way back from a held or skipped record, and a known failure
    ("8", "case 5, then a person decides 'retry'", "sent once, after the decision (sweeper)"),
    ("9", "the provider refuses the email once", "released; sent by a later delivery, after a backoff"),
    # the sweeper's other half, the heartbeat and the fingerprint, in every system
    ("12", "the queue lost the message of a claim", "held for a person (sweeper)"),
    ("13", "a job longer than two leases; a duplicate meanwhile", "heartbeat: in_progress, sent once"),
    ("14", "same key, other payload", "refused (ID002), sent once"),
    # the wire between the worker and the database (extension 0.3: delivery, wait)
    ("15", "the reply to the claim is lost", "claimed again with its token: run #1, sent once, no lease waited"),
    ("16", "a redelivery behind a stuck transaction", "worker free at once (in_progress); sent once after the rollback"),
]
# cases that only make sense under some policies (default: all)
CASE_POLICIES = {"8": ("hold", "skip"),    # under retry nothing waits for a person
                 "14": ("hold",)}         # the fingerprint does not depend on the policy
EXPECTED_TEXT = {
    "retry": {"5": "sent again after the lease", "6": "sent again after the lease (2nd email)",
              "12": "re-enqueued by the sweeper, sent once"},
    "skip": {"5": "given up after the lease (never sent)", "6": "given up after the lease",
             "12": "re-enqueued by the sweeper, skipped"},
}
KEYS = {"1": ["ORD-1001"], "2": ["ORD-2001"], "3": ["ORD-3001"], "4": ["ORD-4001", "ORD-4002"],
        "5": ["ORD-5001"], "6": ["ORD-6001"], "7": ["ORD-7001"], "8": ["ORD-8001"],
        "9": ["ORD-9001"], "12": ["ORD-12001"], "13": ["ORD-13001"], "14": ["ORD-14001"],
        "15": ["ORD-15001"], "16": ["ORD-16001"]}

# expected emails and record per policy for the uncertain cases
UNCERTAIN = {
    "hold": {"5": (0, "claimed #1 (stale)"), "6": (1, "claimed #1 (stale)"), "12": (0, "claimed #1 (stale)")},
    "retry": {"5": (1, "completed #2"), "6": (2, "completed #2"), "12": (1, "completed #2")},
    "skip": {"5": (0, "skipped #1"), "6": (1, "skipped #1"), "12": (0, "skipped #1")},
}
OUTCOME = {"hold": "held", "retry": "run", "skip": "skipped"}
STUCK = "stuck transaction"   # case 16's notes


class Failed(Exception):
    pass


def utf8():
    enc = (sys.stdout.encoding or "").lower()
    return "utf" in enc


def width(s):
    return len(s)


FAULT_PROXY = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                           "..", "..", "test", "faults", "pgproxy.py"))


class FaultProxy:
    """test/faults/pgproxy.py between the workers and PostgreSQL (127.0.0.1,
    a free port; upstream: libpq's PGHOST/PGPORT, a host or a socket
    directory). Started at the first case that needs it, stopped at the end."""

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

    # case 12: how a message gets lost on this system, and how the verdicts
    # show it (a regular expression and its text)
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

    # case 14: what the helper does with a claim refused with ID002 (the
    # event's action), and a check of the queue's side (returns a note)
    refused_action = "raise"

    def check_refused(self, r, key):
        return None

    def sweep(self, env):
        """run the sweeper once; return its output"""
        raise NotImplementedError

    def setup_db(self, db, job_type):
        """called after the job type of a policy was registered (e.g. grants)"""

    # case 15: the helper's event when its claim's connection was lost and
    # it claimed again on a new connection (with the same delivery token)
    lost_reply_rx = r"claim error \(connection, again\), run"
    lost_reply_text = "claim error (connection, again), run"

    def workers_restarted(self):
        """called after the test stopped the workers and started new ones
        (case 15 runs them through the fault proxy), before it publishes"""

    # cases of this system only: (case, title, expected text, policies or None)
    extra_cases = []

    def run_extra(self, r, case):
        """run one of extra_cases; return (emails, record, shown, plain) as run_case"""
        raise NotImplementedError

    def expected_extra(self, case, policy):
        """(emails, record, verdict regex, verdict text) of one of extra_cases"""
        raise NotImplementedError


class Run:
    def __init__(self, adapter, policy, tmp, faults=None):
        self.a = adapter
        self.faults = faults   # FaultProxy (cases 15 and 16)
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
        self.note_text = None  # a line the test prints under the matrix

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

    # ---- the verdict sequence of a case ----------------------------------
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


def expected_verdicts(case, policy, redelivery, adapter=None):
    """regular expression over the collapsed verdict sequence"""
    if case == "12":
        if policy == "hold":
            tail = ", sweeper: for a person"
        else:
            tail = f", sweeper: re-enqueued, {OUTCOME[policy]}"
        return adapter.lost_rx + tail, adapter.lost_text + tail
    if case == "13":
        return "run, in_progress, completed", "run, in_progress, completed"
    if case == "15":
        return adapter.lost_reply_rx, adapter.lost_reply_text
    if case == "16":
        # in_progress (or the helper's bound: 55P03, 57014) until the
        # rollback; a delivery claimed just before it may answer after it
        busy = r"(in_progress|claim error \((55P03|57014), retry\))"
        return (rf"{STUCK}: claim \(uncommitted\), {busy}(, {busy})*, {STUCK}: rolled back, "
                rf"({busy}, )*run",
                f"{STUCK}: claim (uncommitted), in_progress, {STUCK}: rolled back, run")
    if case == "14":
        act = adapter.refused_action
        return rf"run, claim error \(ID002, {act}\)", f"run, claim error (ID002, {act})"
    killed = r"run \(killed\)" if redelivery != "never" else r"run \(killed, job lost\)"
    out = OUTCOME[policy]
    if case == "1":
        return "run", "run"
    if case == "2":
        return "run, completed", "run, completed"
    if case == "3":
        # the two claims meet in the database: either may write its event
        # first. With wait => false the second may also pass its check for an
        # uncommitted claim just before the first one's INSERT and then meet
        # that INSERT's lock: 55P03, which the README says to treat as
        # in_progress (the helper hands the job back to the queue, and its
        # retry finds the key completed)
        busy = r"(in_progress|claim error \(55P03, retry\))"
        return f"(run, {busy}|{busy}, run), completed", "run, in_progress, completed"
    if case == "4":
        return "run, run", "run, run"
    sweep_hold = ", sweeper: for a person" if policy == "hold" else ""
    if case in ("5", "6"):
        if redelivery == "visibility":
            rx = f"{killed}, {out}{sweep_hold}"
            text = f"run (killed), {out}{sweep_hold}"
        elif redelivery == "at once":
            rx = f"{killed}, (in_progress, )?{out}{sweep_hold}"
            text = f"run (killed), in_progress, {out}{sweep_hold}"
        else:
            if policy == "hold":
                rx = f"{killed}, sweeper: for a person"
                text = "run (killed, job lost), sweeper: for a person"
            else:
                rx = f"{killed}, sweeper: re-enqueued, {out}"
                text = f"run (killed, job lost), sweeper: re-enqueued, {out}"
        return rx, text
    if case == "8":
        # case 5 under hold or skip, then the decision and the sweeper's re-enqueue
        rx, text = expected_verdicts("5", policy, redelivery)
        tail = ", person: retry, sweeper: re-enqueued (released), run"
        return rx + tail.replace("(released)", r"\(released\)"), text + tail
    if case == "9":
        return r"run \(released\), run", "run (released), run"
    if case == "7":
        # inside the lease: in_progress, no takeover; then the policy after the lease
        if policy == "hold":
            rx = f"{killed}, in_progress, held, sweeper: for a person"
        elif policy == "retry":
            rx = f"{killed}, in_progress, run(, (in_progress|completed))*"
        else:
            rx = f"{killed}, in_progress, skipped"
        text = rx.replace("\\", "").replace("(, (in_progress|completed))*", "")
        return rx, text
    raise ValueError(case)


def run_case(r, case):
    a = r.a
    keys = KEYS[case]
    key = keys[0]
    snapshot = None
    if case == "1":
        a.publish(key)
        r.settle(keys, 1)
    elif case == "2":
        a.publish(key)
        r.settle(keys, 1)
        a.publish(key)
        r.settle(keys, 2)
    elif case == "3":
        # both copies are in flight at once: the first worker to claim stops
        # before the email until the second has its verdict
        r.pause(key, "before")
        a.publish(key, copies=2)
        pid = r.wait_paused(key, "before")
        r.wait_events(keys, lambda evs: any(e["verdict"] == "in_progress" or
                                            (e["verdict"] == "claim error" and e.get("sqlstate") == "55P03"
                                             and e["action"] == "retry") for e in evs),
                      "the second worker's verdict")
        r.release(key, "before", pid)
        r.settle(keys, 2)
    elif case == "4":
        a.publish(keys[0])
        a.publish(keys[1])
        r.settle(keys, 2)
    elif case == "9":
        # the provider refuses the first email: the job raises KnownFailure,
        # the helper releases the claim and the queue brings the job back
        # after a backoff; the next claim runs attempt 2
        r.refuse(key)
        a.publish(key)
        evs = r.settle(keys, 1)
        rel = [e for e in evs if e["action"] == "released"]
        if len(rel) != 1:
            raise Failed(f"{key}: {len(rel)} releases, expected 1")
        later = [e for e in evs if e["action"] == "work" and e["t"] > rel[0]["t"]]
        gap = later[0]["t"] - rel[0]["t"] if later else None
        wait = float(rel[0].get("retry_in", -1))
        if gap is None or not 0 < wait <= LEASE / 2 or gap < wait - 0.1:
            raise Failed(f"{key}: the next run came {gap} s after the release; "
                         f"the helper said it would wait {wait} s (0 < wait <= lease/2)")
        r.note_text = f"next run {gap:.1f} s after the release (backoff {wait:.1f} s)"
    elif case == "12":
        # the worker's message is gone for good (how depends on the system:
        # lose()); only the stale claim remains, and only the sweeper finds it
        a.lose(r, key)
        r.ensure_workers()
        rec = r.record(key)
        if not rec.startswith("claimed #1"):
            raise Failed(f"{key}: {rec} after the message was lost, expected claimed #1")
        r.wait_stale(key)
        got = r.sweep(key)
        want = "person" if r.policy == "hold" else "stale"
        if got != want:
            raise Failed(f"{key}: the sweeper reported {got!r}, expected {want!r}")
        if want == "stale":
            r.settle(keys, 1)   # only the sweeper's copy can bring it to a worker
    elif case == "13":
        # a long job: the worker stops before the email for more than two
        # leases; its helper's heartbeat (extend_lease) keeps the claim young,
        # so stale_claims() never lists it and a duplicate gets in_progress
        # (no takeover, whatever the policy)
        r.pause(key, "before")
        a.publish(key)
        pid = r.wait_paused(key, "before")
        t0 = time.time()
        late_checks = 0
        dup = False
        while time.time() < t0 + 2 * LEASE + 0.5:
            if r.stale_listed(key):
                raise Failed(f"{key}: listed by stale_claims() {time.time() - t0:.1f} s into the "
                             f"job: the heartbeat did not extend the lease")
            if time.time() - t0 > LEASE:
                late_checks += 1
                if not dup:
                    a.publish(key)   # a duplicate, after the first lease
                    dup = True
            r.check_workers_alive()
            time.sleep(0.05)
        r.wait_events(keys, lambda evs: any(e["verdict"] == "in_progress" for e in evs),
                      "the duplicate's in_progress")
        rec = r.record(key)
        if r.stale_listed(key) or rec != "claimed #1 (young)":
            raise Failed(f"{key}: {rec} after {time.time() - t0:.1f} s, expected claimed #1 (young)")
        paused = time.time() - t0
        r.release(key, "before", pid)
        r.settle(keys, 2)
        r.note_text = (f"paused {paused:.1f} s ({paused / LEASE:.1f} leases); stale_claims() "
                       f"checked {late_checks} times after the first lease: never listed")
    elif case == "14":
        # the same key with another payload: the caller's bug; the claim is
        # refused (ID002) and the helper fails loudly; nothing is sent again
        a.publish(key)
        r.settle(keys, 1)
        a.publish(key, other=True)
        evs = r.wait_events(keys, lambda evs: any(e["verdict"] == "claim error" for e in evs),
                            "the refused claim")
        err = [e for e in evs if e["verdict"] == "claim error"][0]
        if err.get("sqlstate") != "ID002":
            raise Failed(f"{key}: claim error {err.get('sqlstate')}, expected ID002")
        r.note_text = a.check_refused(r, key)
    elif case == "15":
        lost_reply(r, key)
    elif case == "16":
        stuck_transaction(r, key)
    elif case in ("5", "6", "7", "8"):
        point = "after" if case == "6" else "before"
        r.pause(key, point)
        a.publish(key)
        pid = r.wait_paused(key, point)
        r.kill9(key, pid)
        acks = 0 if a.redelivery == "never" else 1
        if case == "7":
            # a redelivery at once, inside the lease (a duplicate copy of the
            # message, as at-least-once delivery may bring)
            a.publish(key)
            acks += 1
            evs = r.wait_events(keys, lambda evs: len(evs) >= 2, "the redelivery's verdict")
            snapshot = (r.emails(key), r.record(key))
        r.ensure_workers()
        r.settle(keys, acks)
        if r.record(key).startswith("claimed"):
            r.wait_stale(key)
            if r.sweep(key) != "person":
                r.settle(keys, acks + 1)
        if case == "8":
            # held (a stale claim under hold) or skipped: nothing will deliver
            # it again. A person decides the email was not sent; the record
            # becomes released, and the sweeper (released for a lease, no
            # claim) re-enqueues it; the next claim runs attempt 2.
            rec = r.record(key)
            if rec not in ("claimed #1 (stale)", "skipped #1"):
                raise Failed(f"{key}: {rec} before the decision, expected held or skipped")
            done = r.done_count(keys)
            r.resolve(key, "retry")
            if r.record(key) != "released #1":
                raise Failed(f"{key}: {r.record(key)} after resolve_operation(..., 'retry')")
            if r.sweep(key) != "released":
                raise Failed(f"{key}: the sweeper did not re-enqueue the released record")
            r.settle(keys, done + 1)
    emails = [r.emails(k) for k in keys]
    records = [r.record(k) for k in keys]
    shown, plain = r.verdicts(keys)
    if snapshot:
        emails_n, rec = snapshot
    else:
        emails_n, rec = sum(emails), ", ".join(records)
    return emails_n, rec, shown, plain


def lost_reply(r, key):
    """case 15: the workers connect through the fault proxy, which forwards
    the next claim_operation call, swallows the server's reply and closes
    the connection. The claim was committed; the helper only saw a lost
    connection. It claims again on a new connection with the same delivery
    token and gets its own claim back: run with the same attempt, not
    in_progress (which would cost a lease, and under hold the email)."""
    keys = [key]
    proxy = r.faults.start()
    try:
        r.restart_workers(proxy.env())
        before = len(r.events())
        dropped = proxy.dropped()
        proxy.ctl("drop-reply claim_operation 1")
        t0 = time.time()
        r.a.publish(key)
        evs = r.settle(keys, 1)
        done = [e for e in evs if e["action"] in ("completed", "superseded")]
        lost = [e for e in evs if e["verdict"] == "claim error"]
        if not lost:
            others = [e for e in r.events()[before:] if e["verdict"] == "claim error"]
            raise Failed(f"{key}: no claim of it lost its reply"
                         + (f" (the proxy dropped the reply to {others[0]['key']}'s claim)" if others else
                            f" (proxy stats: {proxy.ctl('stats')})"))
        if proxy.dropped() != dropped + 1:
            raise Failed(f"{key}: the proxy dropped {proxy.dropped() - dropped} replies, expected 1")
        busy = [e for e in evs if e["verdict"] == "in_progress"]
        if busy:
            raise Failed(f"{key}: the claim after the lost reply was answered in_progress")
        runs = [e for e in evs if e["action"] == "work"]
        if [e["attempt"] for e in runs] != [1]:
            raise Failed(f"{key}: runs with attempts {[e['attempt'] for e in runs]}, expected [1]")
        r.note_text = (f"pgproxy.py dropped the reply to the claim; the claim again on a new connection "
                       f"got run #1 {runs[0]['t'] - lost[0]['t']:.2f} s later, completed "
                       f"{done[0]['t'] - t0:.1f} s after the publish (lease {LEASE:g} s)")
    finally:
        r.restart_workers({})


def stuck_transaction(r, key):
    """case 16: another session holds an uncommitted claim of the key (the
    transactional mode; a worker stuck or idle in transaction). A delivery of
    the key must not wait for it: the helper answers at once (in_progress,
    or its lock_timeout) and hands the message back to the queue for later,
    so the worker is free again while the transaction is still open (twice:
    the queue's retry meets it too). Once it is rolled back, a later
    delivery runs, one email."""
    keys = [key]
    stuck = psycopg.connect(autocommit=False)
    try:
        stuck.execute("SELECT verdict FROM idempotency.claim_operation(%s, %s, NULL, %s)",
                      (r.job_type, key, "e2e: stuck transaction"))
        r.note(key, f"{STUCK}: claim (uncommitted)")
        t0 = time.time()
        r.a.publish(key)
        busy = ("in_progress", "claim error")
        evs = r.wait_events(keys, lambda evs: sum(e["verdict"] in busy for e in evs) >= 2,
                            "two deliveries answered while the transaction is open")
        answers = [e for e in evs if e["verdict"] in busy]
        for e in answers:
            if e["action"] != "retry" or (e["verdict"] == "claim error"
                                          and e.get("sqlstate") not in ("55P03", "57014")):
                raise Failed(f"{key}: a delivery behind the open transaction: {e['verdict']} "
                             f"({e.get('sqlstate')}) -> {e['action']}, expected in_progress -> retry")
        if r.emails(key) or any(e["action"] == "work" for e in evs):
            raise Failed(f"{key}: ran while the other transaction held the claim")
        first = answers[0]["t"] - t0
        held = time.time() - t0
        stuck.rollback()
        r.note(key, f"{STUCK}: rolled back")
    finally:
        stuck.close()
    r.settle(keys, 1)
    r.note_text = (f"first delivery answered {first:.1f} s after the publish, the second after "
                   f"{answers[1]['t'] - t0:.1f} s, the transaction open for {held:.1f} s")


def expected_row(case, policy):
    if case in ("5", "6", "12"):
        return UNCERTAIN[policy][case]
    if case in ("8", "9"):
        return 1, "completed #2"
    if case == "7":
        return 0, "claimed #1 (young)"
    if case == "4":
        return 2, "completed #1, completed #1"
    return 1, "completed #1"


def print_matrix(adapter, policy, rows, seconds, ok_count):
    ne = " ≠ " if utf8() else " != "
    mk = ("✓", "✗") if utf8() else ("ok", "FAIL")
    head1 = ["", "case", "attempt", "observed", "", "", "expected"]
    head2 = ["", "", "", "emails", "record afterwards", "verdicts", ""]
    cells = []
    for row in rows:
        case, title, exp_text, obs, exp, err = row
        if obs is None:
            c = [mk[1], case, title, "-", "not run: " + err, "-", exp_text]
        else:
            (e_n, rec, shown, plain), (x_n, x_rec, x_rx, x_vtext) = obs, exp
            ok_e, ok_r, ok_v = e_n == x_n, rec == x_rec, re.fullmatch(x_rx, plain) is not None
            c = [mk[0] if (ok_e and ok_r and ok_v) else mk[1], case, title,
                 str(e_n) + ("" if ok_e else f"{ne}{x_n}"),
                 rec + ("" if ok_r else f"{ne}{x_rec}"),
                 shown + ("" if ok_v else f"{ne}{x_vtext}"),
                 exp_text]
        cells.append(c)
    w = [max([width(head2[i])] + [width(c[i]) for c in cells]) for i in range(7)]
    w[1] = max(w[1], 4)
    obs_w = w[3] + w[4] + w[5] + 4
    blurb = {"hold": "hold the order for a person", "retry": "accept a rare duplicate",
             "skip": "accept a rare miss"}[policy]
    print(f"\nPolicy {policy}: {blurb}")
    print(f"system {adapter.title}, job type {adapter_job(adapter, policy)}, lease {LEASE:g} seconds, "
          f"{ok_count} of {len(rows)} cases hold, {seconds:.1f} s\n")
    l1 = "  ".join([head1[0].ljust(w[0]), head1[1].ljust(w[1]), head1[2].ljust(w[2]),
                    head1[3].ljust(obs_w), head1[6]]).rstrip()
    l2 = "  ".join(h.ljust(w[i]) for i, h in enumerate(head2)).rstrip()
    print(l1)
    print(l2)
    for c in cells:
        print("  ".join(v.ljust(w[i]) for i, v in enumerate(c)).rstrip())


def adapter_job(adapter, policy):
    return f"send_confirmation_e2e_{adapter.name}_{policy}"


def row_ok(obs, exp):
    if obs is None:
        return False
    e_n, rec, _, plain = obs
    x_n, x_rec, x_rx, _ = exp
    return e_n == x_n and rec == x_rec and re.fullmatch(x_rx, plain) is not None


def main(adapter, argv=None):
    import argparse
    ap = argparse.ArgumentParser(description=f"replay matrix through {adapter.title}")
    ap.add_argument("--policy", default=os.environ.get("E2E_POLICIES", "hold"),
                    help="comma-separated: hold,retry,skip (default hold)")
    ap.add_argument("--cases", default=None,
                    help="comma-separated case numbers (default: all, with the system's own)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args(argv)
    # a SIGTERM (scripts/test stopping the hook) ends the run through the
    # finally blocks below, so the workers and the broker are stopped too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    policies = args.policy.split(",")
    all_cases = [(c, t, x, CASE_POLICIES.get(c)) for c, t, x in CASES] + list(adapter.extra_cases)
    cases = args.cases.split(",") if args.cases else [c for c, _, _, _ in all_cases]
    t0 = time.time()
    tmp = tempfile.mkdtemp(prefix=f"e2e-{adapter.name}-")
    os.chmod(tmp, 0o755)
    passed = failed = 0
    summary = []
    notes = []   # measured details of some cases
    print(f"== {adapter.title}: the seed's replay matrix through the real queue "
          f"(policies {', '.join(policies)}; lease {LEASE:g} s)")
    faults = FaultProxy(tmp)
    try:
        tb = time.time()
        adapter.start_broker(tmp)
        print(f"broker up in {time.time() - tb:.1f} s: {adapter.broker_desc}", flush=True)
        for policy in policies:
            adapter.begin(policy)
            r = Run(adapter, policy, tmp, faults)
            r.setup_db()
            tp = time.time()
            rows = []
            try:
                r.ensure_workers()
                for case, title, text, only in all_cases:
                    if case not in cases or (only and policy not in only):
                        continue
                    text = EXPECTED_TEXT.get(policy, {}).get(case, text)
                    extra = case not in KEYS
                    if extra:
                        exp = adapter.expected_extra(case, policy)
                    else:
                        x_n, x_rec = expected_row(case, policy)
                        x_rx, x_vtext = expected_verdicts(case, policy, adapter.redelivery, adapter)
                        exp = (x_n, x_rec, x_rx, x_vtext)
                    try:
                        r.note_text = None
                        obs = adapter.run_extra(r, case) if extra else run_case(r, case)
                        err = ""
                        if r.note_text:
                            notes.append(f"{policy} case {case}: {r.note_text}")
                    except Failed as e:
                        obs, err = None, str(e)
                        print(f"case {case}: {e}", file=sys.stderr)
                    rows.append((case, title, text, obs, exp, err))
                    if row_ok(obs, exp):
                        passed += 1
                    else:
                        failed += 1
                        args.keep = True
                    if case in ("5", "6"):
                        summary.append((policy, case, obs[0] if obs else None))
            finally:
                r.stop_workers()
                for log in r.logs:
                    log.close()
                r.cleanup_db()
            ok_count = sum(row_ok(o, x) for _, _, _, o, x, _ in rows)
            print_matrix(adapter, policy, rows, time.time() - tp, ok_count)
    finally:
        faults.stop()
        adapter.stop_broker()
        if args.keep:
            print(f"\nkept: {tmp} (events.jsonl, outbox.log, worker-*.log, sweeper.log per policy)")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print()
    for note in adapter.notes:
        print(note)
    if notes:
        print()
        for note in notes:
            print(note)
    if summary:
        print("\nemails in the uncertain cases: " + ", ".join(
            f"{p} case {c}: {'?' if n is None else n}" for p, c, n in summary))
    print(f"\n{adapter.title}: {time.time() - t0:.1f} s in all")
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 and passed > 0 else 1
