#!/usr/bin/python3
"""A worker node crashes during a run (issue 11, item 4); see failover.sh.

Connects to the coordinator with PGHOST/PGPORT/PGDATABASE/PGUSER (as
test/citus/cluster.sh exports them); CITUS_DIR and CITUS_PORT_W1/W2 name the
workers, PG_BINDIR (or PATH) has pg_ctl (run via runuser as postgres when
root). The job type (FAILOVER_JOB_TYPE, default "failover") must exist with
stale_policy 'hold' and a lease longer than FAILOVER_LIMIT + FAILOVER_RETRY_FOR
(failover.sh: 5 minutes), so that no claim goes stale: any duplicate effect
or lost record is then a failure, none is allowed by the policy.

The run: FAILOVER_KEYS keys (400) are published one by one (one every
FAILOVER_PUBLISH_EVERY = 0.04 s), and every key is delivered to every one of
FAILOVER_CLIENTS client threads (4): they race over the same keys, so each
key is claimed 4 times and must run exactly once. Each client does for one
delivery what the queue helpers do (helpers/python, pg_idempotency.claim):
a delivery token made for the delivery (uuid4);
claim_operation(..., delivery => token, wait => false) through the
coordinator, in autocommit (Citus delegates it to the worker that holds the
key); on run, the effect (the row (key, client, attempt) appended to an
in-memory list: "the email"), then complete_operation(key, attempt, result).
A call that fails with a connection error (SQLSTATE class 08, 57P01-57P03,
or none) is sent again, the same step with the same token and attempt, on a
new connection: at once, then after 0.1, 0.2, 0.4 ... 2 s, for up to
FAILOVER_RETRY_FOR = 60 s from its first error. in_progress, completed and
55P03 (wait => false met another delivery's uncommitted claim: the README
says to treat it as in_progress) acknowledge the delivery.

While a call waits for its retry, its client goes on with its other
deliveries, first come first served (at most 64 in flight per client): a
client that retried in place would, as soon as it met a key of the stopped
worker, stop serving the keys of the other one (all 4 clients do so within
a few keys), and "calls for other shards go on" could not be seen.
FAILOVER_BLOCKING=1 retries in place, as the Celery helper's
_reconnecting() does (a client takes no new delivery while one waits for
its retry): it shows that stall (0 completions during the outage); it is
not the test.

After FAILOVER_CRASH_AFTER (80) completions: a snapshot of the completed
records. Then replies of w1 are made to get lost (FAILOVER_HANG_COMMITS=1,
the default): w1 gets a synchronous standby that does not exist (ALTER
SYSTEM SET synchronous_standby_names, reload), so its next commits are
written and flushed but not answered, until 3 calls wait so (at most 3 s);
the setting is reset in the file at once, for the restart. (Without it,
only the crash's own timing loses a reply after a commit, now and then.)
Then w1 is stopped with pg_ctl -m immediate (a crash), kept down
FAILOVER_OUTAGE seconds (5), and started again (pg_ctl -w start). The
waiting calls' commits are in the WAL: after the restart their retries must
get their claims back (run, the same attempt) or repeat a completion (a
no-op). The clients go on until every key is published and every delivery
acknowledged or given up (at most FAILOVER_LIMIT = 90 s from the start).
Then one line per check, OK or WRONG; exit 1 if any is WRONG, 2 if the run
could not be made.

Self-tests (each must make the run WRONG): FAILOVER_NO_RETRY=1 gives a
delivery up at its first connection error (keys lost); FAILOVER_NO_DELIVERY=1
claims without a token (a retried claim that had committed is answered
in_progress: its key stays claimed, its effect never happens).
"""
import os
import re
import subprocess
import sys
import threading
import time
import uuid

import psycopg
from psycopg.types.json import Jsonb


def env_num(name, default, kind=float):
    v = os.environ.get(name)
    return kind(v) if v not in (None, "") else default


JOB_TYPE = os.environ.get("FAILOVER_JOB_TYPE", "failover")
KEYS = env_num("FAILOVER_KEYS", 400, int)
CLIENTS = env_num("FAILOVER_CLIENTS", 4, int)
PUBLISH_EVERY = env_num("FAILOVER_PUBLISH_EVERY", 0.04)
CRASH_AFTER = env_num("FAILOVER_CRASH_AFTER", 80, int)
OUTAGE = env_num("FAILOVER_OUTAGE", 5.0)
RETRY_FOR = env_num("FAILOVER_RETRY_FOR", 60.0)
LIMIT = env_num("FAILOVER_LIMIT", 90.0)
MAX_IN_FLIGHT = env_num("FAILOVER_MAX_IN_FLIGHT", 64, int)
BLOCKING = os.environ.get("FAILOVER_BLOCKING") == "1"
NO_RETRY = os.environ.get("FAILOVER_NO_RETRY") == "1"
NO_DELIVERY = os.environ.get("FAILOVER_NO_DELIVERY") == "1"
HANG_COMMITS = os.environ.get("FAILOVER_HANG_COMMITS", "1") == "1"

CITUS_DIR = os.environ["CITUS_DIR"]
PORTS = {"w1": int(os.environ["CITUS_PORT_W1"]), "w2": int(os.environ["CITUS_PORT_W2"])}
STOPPED = "w1"
OTHER = "w2"

CLAIM_SQL = ("SELECT verdict, attempt FROM idempotency.claim_operation("
             "%s, %s, %s, %s, delivery => %s, wait => false)")
COMPLETE_SQL = "SELECT idempotency.complete_operation(%s, %s, %s, %s)"
SERVER_GONE = ("57P01", "57P02", "57P03")
BUSY = ("55P03",)

lock = threading.Lock()
effects = []        # "the email": (key, client, attempt, wall time)
completions = []    # (key, client, attempt, monotonic start, monotonic end)
errors = []         # dict per failed call
verdicts = {}       # verdict -> count
odd_verdicts = []   # (key, client, verdict, attempt): held, skipped, verify
unexpected = []     # errors no retry heals: (key, client, step, sqlstate, message)
gave_up = []        # deliveries abandoned with a connection error (bound, or NO_RETRY)
recovered = []      # deliveries that failed at least once and then finished
t0 = time.monotonic()


def now():
    return time.monotonic() - t0


def connect():
    return psycopg.connect(autocommit=True, prepare_threshold=None, connect_timeout=10,
                           options="-c statement_timeout=30s")


def connection_lost(err, conn):
    """as the helpers decide it: class 08, 57P01-57P03, or no SQLSTATE on a
    connection that is gone"""
    code = err.sqlstate
    if code is not None:
        return code.startswith("08") or code in SERVER_GONE
    # no SQLSTATE: the connection failed or was lost (the server's answers
    # always carry one)
    return isinstance(err, (psycopg.OperationalError, psycopg.InterfaceError))


def first_line(err):
    """the message, without the socket paths and ports (so that the same
    failure reads the same on every run): Citus wraps libpq's message in
    'connection to the remote node postgres@DIR:PORT failed with the
    following error: connection to server on socket "..." failed: ...'"""
    msg = (getattr(err.diag, "message_primary", None) or str(err) or type(err).__name__)
    msg = " ".join(msg.split())
    msg = re.sub(r"postgres@\S+:\d+", "postgres@W1", msg)
    msg = re.sub(r'connection to server on socket "[^"]*" failed: ', "", msg)
    return msg[:200]


class Delivery:
    def __init__(self, key, node, client):
        self.key = key
        self.node = node
        self.client = client
        self.token = None if NO_DELIVERY else str(uuid.uuid4())
        self.step = "claim"
        self.attempt = None
        self.tries = 0          # failed tries so far
        self.first_error = None  # monotonic
        self.first_fail_wall = {}  # step -> wall time the first failed try of that step returned
        self.next_try = 0.0


class Client(threading.Thread):
    def __init__(self, n, keys, node_of, publish_at):
        super().__init__(name="client-%d" % n, daemon=True)
        self.n = n
        self.keys = keys
        self.node_of = node_of
        self.publish_at = publish_at
        self.conn = None
        self.done = False
        self.parked = []

    def db(self):
        if self.conn is None or self.conn.closed:
            self.conn = connect()
        return self.conn

    def discard(self):
        c, self.conn = self.conn, None
        if c is not None:
            try:
                c.close()
            except Exception:  # noqa: BLE001 -- thrown away
                pass

    def run(self):
        try:
            self.loop()
        except Exception as err:  # noqa: BLE001 -- a bug of the test: reported, fails the run
            with lock:
                unexpected.append((None, None, self.n, "client thread", type(err).__name__, str(err)))
                gave_up.extend((d.key, d.node, d.client, d.step, "thread died") for d in self.parked)
        finally:
            self.discard()
            self.done = True

    def loop(self):
        i = 0
        while True:
            t = now()
            if t > LIMIT:
                with lock:
                    gave_up.extend((d.key, d.node, d.client, d.step, "time limit") for d in self.parked)
                self.parked = []
                return
            # first come, first served: a retry that is due, or the next
            # published key, whichever was due first
            d = min(self.parked, key=lambda x: x.next_try) if self.parked else None
            may_take = len(self.parked) < MAX_IN_FLIGHT and not (BLOCKING and self.parked)
            new_due = i < len(self.keys) and may_take and self.publish_at[i] <= t
            if d is not None and d.next_try <= t and not (new_due and self.publish_at[i] < d.next_try):
                self.parked.remove(d)
                self.handle(d)
                continue
            if new_due:
                k = self.keys[i]
                i += 1
                self.handle(Delivery(k, self.node_of[k], self.n))
                continue
            if i >= len(self.keys) and not self.parked:
                return
            waits = [d.next_try for d in self.parked]
            if i < len(self.keys) and may_take:
                waits.append(self.publish_at[i])
            time.sleep(min(0.05, max(0.001, min(waits) - now())) if waits else 0.01)

    def handle(self, d):
        conn = None
        started = now()
        try:
            conn = self.db()
            if d.step == "claim":
                verdict, attempt = conn.execute(
                    CLAIM_SQL, (JOB_TYPE, d.key, "fp:" + d.key, "client-%d" % self.n, d.token)).fetchone()
                with lock:
                    verdicts[verdict] = verdicts.get(verdict, 0) + 1
                    if verdict == "run":
                        effects.append((d.key, self.n, attempt, time.time()))
                    elif verdict not in ("completed", "in_progress"):
                        odd_verdicts.append((d.key, self.n, verdict, attempt))
                if verdict != "run":
                    self.finish(d, verdict)
                    return
                d.step, d.attempt = "complete", attempt
                started = now()
            conn.execute(COMPLETE_SQL, (JOB_TYPE, d.key, d.attempt,
                                        Jsonb({"client": self.n, "delivery": d.token})))
            with lock:
                completions.append((d.key, self.n, d.attempt, started, now()))
            self.finish(d, "completed by me")
        except psycopg.Error as err:
            t = now()
            code = err.sqlstate
            with lock:
                errors.append({"key": d.key, "node": d.node, "client": self.n, "step": d.step,
                               "sqlstate": code, "message": first_line(err), "t": t,
                               "took": t - started})
            if code in BUSY and d.step == "claim":
                with lock:
                    verdicts["55P03 (busy)"] = verdicts.get("55P03 (busy)", 0) + 1
                self.finish(d, "busy")
                return
            if not connection_lost(err, conn):
                with lock:
                    unexpected.append((d.key, d.node, self.n, d.step, code, first_line(err)))
                if conn is not None and (conn.closed or conn.info.transaction_status !=
                                         psycopg.pq.TransactionStatus.IDLE):
                    self.discard()
                return
            self.discard()          # as the helpers do: a new connection for the retry
            d.tries += 1
            d.first_fail_wall.setdefault(d.step, time.time())
            if d.first_error is None:
                d.first_error = t
            if NO_RETRY or t - d.first_error > RETRY_FOR:
                with lock:
                    gave_up.append((d.key, d.node, self.n, d.step, code))
                return
            d.next_try = t + (0.0 if d.tries == 1 else min(2.0, 0.1 * 2 ** (d.tries - 2)))
            self.parked.append(d)

    def finish(self, d, how):
        if d.tries:
            with lock:
                recovered.append((d, how))


checks = []


def check(name, ok, detail):
    checks.append(ok)
    print("%-66s %-5s %s" % (name, "OK" if ok else "WRONG", detail), flush=True)


def admin(sql, args=()):
    with psycopg.connect(autocommit=True, connect_timeout=10) as c:
        cur = c.execute(sql, args)
        return cur.fetchall() if cur.description else None


def w1_admin(sql):
    with psycopg.connect(port=PORTS[STOPPED], autocommit=True, connect_timeout=10) as c:
        cur = c.execute(sql)
        return cur.fetchall() if cur.description else None


def pg_ctl(*args):
    bindir = os.environ.get("PG_BINDIR")
    exe = os.path.join(bindir, "pg_ctl") if bindir else "pg_ctl"
    cmd = [exe] + list(args)
    if os.geteuid() == 0:
        cmd = ["runuser", "-u", "postgres", "--"] + cmd
    return subprocess.run(cmd, cwd=CITUS_DIR, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True, timeout=90)


def main():
    jt = admin("SELECT stale_policy::text, extract(epoch FROM lease) FROM idempotency.job_types "
               "WHERE job_type = %s", (JOB_TYPE,))
    if not jt or jt[0][0] != "hold" or jt[0][1] < LIMIT + RETRY_FOR:
        print("failover: job type %s must exist with stale_policy hold and a lease over %d s (got %s)"
              % (JOB_TYPE, LIMIT + RETRY_FOR, jt), file=sys.stderr)
        return 2
    keys = ["fo-%04d" % i for i in range(KEYS)]
    port_name = {p: n for n, p in PORTS.items()}
    node_of = {}
    shards = {"w1": set(), "w2": set()}
    for k, port, shard in admin(
            """SELECT k, n.nodeport, pl.shardid
               FROM unnest(%s::text[]) AS k
               JOIN pg_dist_placement pl
                 ON pl.shardid = get_shard_id_for_distribution_column('idempotency.operations', k)
               JOIN pg_dist_node n ON n.groupid = pl.groupid""", (keys,)):
        node_of[k] = port_name[port]
        shards[port_name[port]].add(shard)
    per_node = {n: sum(1 for k in keys if node_of.get(k) == n) for n in PORTS}
    print("keys: %d (w1 %d in %d shards, w2 %d in %d shards); %d clients race over all of them; "
          "one key published every %.3f s; lease %d s, policy hold%s%s%s"
          % (KEYS, per_node["w1"], len(shards["w1"]), per_node["w2"], len(shards["w2"]), CLIENTS,
             PUBLISH_EVERY, jt[0][1], "; BLOCKING" if BLOCKING else "",
             "; NO_RETRY (self-test)" if NO_RETRY else "",
             "; NO_DELIVERY (self-test)" if NO_DELIVERY else ""), flush=True)
    if len(node_of) != KEYS or not all(per_node.values()):
        print("failover: could not map every key to a worker: %s" % per_node, file=sys.stderr)
        return 2

    global t0
    t0 = time.monotonic()
    publish_at = [i * PUBLISH_EVERY for i in range(KEYS)]
    clients = [Client(n, keys, node_of, publish_at) for n in range(CLIENTS)]
    for c in clients:
        c.start()

    # the crash, after some completions
    while now() < 60 and len(completions) < CRASH_AFTER and not all(c.done for c in clients):
        time.sleep(0.05)
    if len(completions) < CRASH_AFTER:
        print("failover: only %d completions after %.0f s, no crash made" % (len(completions), now()),
              file=sys.stderr)
        return 2
    before = {k: (a, r) for k, a, r in admin(
        "SELECT operation_key, attempt, result FROM idempotency.operations "
        "WHERE job_type = %s AND status = 'completed'", (JOB_TYPE,))}
    waiting = []
    if HANG_COMMITS:
        # commits on w1 that are written and flushed but never answered: a
        # synchronous standby that does not exist. They are in the WAL, so
        # they survive the crash; their replies are lost with it.
        w1_admin("ALTER SYSTEM SET synchronous_standby_names = 'failover_nobody'")
        w1_admin("SELECT pg_reload_conf()")
        t_hang = now()
        while now() < t_hang + 3:
            waiting = w1_admin("SELECT pid, state, substring(query from 'idempotency\\.[a-z_]+') "
                               "FROM pg_stat_activity WHERE wait_event = 'SyncRep' "
                               "AND query LIKE '%%idempotency.%%'")
            if len(waiting) >= min(CLIENTS, 3):
                break
            time.sleep(0.05)
        # the file only: the running server keeps waiting, the restarted one does not
        w1_admin("ALTER SYSTEM RESET synchronous_standby_names")
        print("t=%5.1fs  %d calls on w1 wait for a synchronous standby after their commit: %s"
              % (now(), len(waiting), sorted({q for _, _, q in waiting})), flush=True)
    t_stop = now()
    with lock:
        confirmed_before = [c for c in completions if c[4] <= t_stop]
    r = pg_ctl("-D", os.path.join(CITUS_DIR, STOPPED), "-m", "immediate", "-w", "-t", "60", "stop")
    t_down = now()
    print("t=%5.1fs  stop %s -m immediate (%d completions so far, %d records completed in the snapshot): "
          "rc %d, took %.2f s %s" % (t_stop, STOPPED, len(confirmed_before), len(before), r.returncode,
                                     t_down - t_stop, r.stderr.strip()), flush=True)
    time.sleep(OUTAGE)
    t_start = now()
    r = pg_ctl("-D", os.path.join(CITUS_DIR, STOPPED), "-l", os.path.join(CITUS_DIR, STOPPED + ".log"),
               "-w", "-t", "60", "start")
    t_up = now()
    print("t=%5.1fs  start %s: rc %d, took %.2f s (down %.1f s) %s"
          % (t_start, STOPPED, r.returncode, t_up - t_start, t_up - t_down, r.stderr.strip()), flush=True)
    if r.returncode != 0:
        print("failover: %s did not start again" % STOPPED, file=sys.stderr)

    for c in clients:
        c.join(timeout=max(1.0, LIMIT + 15 - now()))
    t_end = now()
    hung = [c.name for c in clients if c.is_alive()]

    # what the cluster holds now
    rows = admin("""SELECT operation_key, status::text, attempt, result,
                           extract(epoch FROM claimed_at), extract(epoch FROM completed_at)
                    FROM idempotency.operations WHERE job_type = %s""", (JOB_TYPE,))
    recs = {k: {"status": s, "attempt": a, "result": res, "claimed_at": float(ca),
                "completed_at": float(co) if co is not None else None}
            for k, s, a, res, ca, co in rows}

    with lock:
        errs = list(errors)
    w1_up_again = [c for c in completions if node_of[c[0]] == STOPPED and c[3] >= t_up]
    first_w1_after = min((c[4] for c in w1_up_again), default=None)
    print("t=%5.1fs  clients done%s; first completion of a w1 key %.2f s after pg_ctl start returned; "
          "last connection error at t=%.1fs"
          % (t_end, " (HUNG: %s)" % hung if hung else "",
             (first_w1_after - t_up) if first_w1_after is not None else -1,
             max((e["t"] for e in errs if e["sqlstate"] not in BUSY), default=0.0)), flush=True)

    # the SQLSTATEs, per node, step and message (55P03: one line per node)
    summary = {}
    for e in errs:
        msg = "canceling statement due to lock timeout (wait => false)" if e["sqlstate"] in BUSY \
            else e["message"]
        s = summary.setdefault((e["node"], e["step"], str(e["sqlstate"]), msg), [0, 0.0, 1e9, -1e9])
        s[0] += 1
        s[1] = max(s[1], e["took"])
        s[2] = min(s[2], e["t"])
        s[3] = max(s[3], e["t"])
    for (node, step, code, msg), (n, took, t1, t2) in sorted(summary.items()):
        print("  error  %s %-8s %-5s x%-4d t=%5.1f..%5.1fs  slowest %.2fs  %s"
              % (node, step, code, n, t1, t2, took, msg))
    print("  verdicts: %s; effects %d; completions by the clients %d; deliveries that failed and "
          "then finished %d; gave up %d" % (dict(sorted(verdicts.items())), len(effects), len(completions),
                                           len(recovered), len(gave_up)))

    # 1. the errors: class 08 (57P0x), and for keys of the stopped worker
    # only (55P03 of wait => false is an answer, in_progress, not a failure)
    errs = [e for e in errs if e["sqlstate"] not in BUSY]
    codes = sorted({str(e["sqlstate"]) for e in errs})
    w1_errs = [e for e in errs if e["node"] == STOPPED]
    w2_errs = [e for e in errs if e["node"] == OTHER]
    conn_class = [e for e in w1_errs if e["sqlstate"] and (e["sqlstate"].startswith("08")
                                                           or e["sqlstate"] in SERVER_GONE)]
    check("calls for keys of w1 failed during the outage", len(w1_errs) > 0,
          "%d failed calls, SQLSTATEs %s" % (len(w1_errs), codes))
    check("every failure of a w1 key: SQLSTATE class 08 (or 57P01-57P03)",
          len(conn_class) == len(w1_errs),
          "%d of %d; others: %s" % (len(conn_class), len(w1_errs),
                                    sorted({(e["sqlstate"], e["message"]) for e in w1_errs
                                            if e not in conn_class})[:3]))
    check("no failure for keys of w2", not w2_errs,
          "%d; e.g. %s" % (len(w2_errs), [(e["key"], e["sqlstate"], e["message"]) for e in w2_errs[:3]]))
    check("no error outside class 08 / 57P0x for any client", not unexpected,
          "%d; e.g. %s" % (len(unexpected), unexpected[:3]))
    # 2. the other shards went on
    during = [c for c in completions if c[3] >= t_down and c[4] <= t_start]
    w2_during = sum(1 for c in during if node_of[c[0]] == OTHER)
    w1_during = sum(1 for c in during if node_of[c[0]] == STOPPED)
    check("keys of w2 completed while w1 was down (%.1f s)" % (t_start - t_down), w2_during > 0 and w1_during == 0,
          "%d completions of w2 keys, %d of w1 keys (must be 0)" % (w2_during, w1_during))
    # 3. every delivery ended; nothing hung
    check("every client finished, no delivery given up", not hung and not gave_up,
          "hung %s, gave up %d: %s" % (hung, len(gave_up), gave_up[:3]))
    check("no held, skipped or verify verdict", not odd_verdicts, "%d: %s" % (len(odd_verdicts), odd_verdicts[:3]))
    # 4. no record lost: every key completed
    by_status = {}
    for r_ in recs.values():
        by_status[r_["status"]] = by_status.get(r_["status"], 0) + 1
    missing = [k for k in keys if k not in recs]
    not_done = [k for k in keys if k in recs and recs[k]["status"] != "completed"]
    check("after recovery every key is completed in idempotency.operations",
          len(recs) == KEYS and not missing and not not_done,
          "%d records %s; no record: %d %s; not completed: %d %s"
          % (len(recs), by_status, len(missing), missing[:3], len(not_done),
             [(k, recs[k]["status"], node_of[k]) for k in not_done[:3]]))
    # 5. exactly one effect per key, its attempt = the record's
    per_key = {}
    for k, c, a, _ in effects:
        per_key.setdefault(k, []).append((c, a))
    twice = {k: v for k, v in per_key.items() if len(v) > 1}
    never = [k for k in keys if k not in per_key]
    check("every key's effect happened exactly once", not twice and not never,
          "%d effects for %d keys; twice: %d %s; never: %d %s"
          % (len(effects), len(per_key), len(twice), list(twice.items())[:3], len(never), never[:3]))
    mismatch = [k for k, v in per_key.items() if k in recs and
                (recs[k]["attempt"] != v[0][1] or (recs[k]["result"] or {}).get("client") != v[0][0])]
    not_one = [k for k in recs if recs[k]["attempt"] != 1]
    check("each record's attempt and result are the effect's (attempt 1)", not mismatch and not not_one,
          "mismatch %d %s; attempt other than 1: %d"
          % (len(mismatch), [(k, per_key[k], recs[k]["attempt"], recs[k]["result"]) for k in mismatch[:3]],
             len(not_one)))
    # 6. what was completed before the crash is still there
    lost = [k for k, (a, res) in before.items()
            if k not in recs or recs[k]["status"] != "completed" or recs[k]["attempt"] != a
            or recs[k]["result"] != res]
    lost_confirmed = [c[0] for c in confirmed_before
                      if c[0] not in recs or recs[c[0]]["status"] != "completed"]
    n_w1_before = sum(1 for k in before if node_of[k] == STOPPED)
    check("records completed before the crash are all still there",
          not lost and not lost_confirmed and len(before) > 0 and n_w1_before > 0,
          "snapshot %d (%d on w1), all %d present after: %s; confirmed to clients before the stop %d, "
          "lost %d" % (len(before), n_w1_before, len(before), not lost, len(confirmed_before),
                       len(lost_confirmed)))

    # the lost replies: a call that failed although the worker had committed it
    lost_claims = lost_completes = 0
    for d, how in recovered:
        rec = recs.get(d.key)
        if rec is None:
            continue
        fc = d.first_fail_wall.get("claim")
        if fc is not None and how == "completed by me" and rec["claimed_at"] <= fc:
            lost_claims += 1
        fk = d.first_fail_wall.get("complete")
        if fk is not None and rec["completed_at"] is not None and rec["completed_at"] <= fk:
            lost_completes += 1
    print("  lost replies: %d claims had committed on w1 although the call failed (the retry with the "
          "same token got run, same attempt); %d completions had committed although the call failed "
          "(the retry was a no-op)" % (lost_claims, lost_completes))
    if HANG_COMMITS:
        check("w1 commits whose reply the crash lost: given back on retry",
              len(waiting) > 0 and lost_claims + lost_completes >= len(waiting),
              "%d calls waited after their commit; %d claims got run with their attempt again, "
              "%d completions were repeated as no-ops" % (len(waiting), lost_claims, lost_completes))
    print("timeline: stop at %.1f s, down %.1f..%.1f s, up at %.1f s, clients done at %.1f s"
          % (t_stop, t_down, t_start, t_up, t_end))
    bad = checks.count(False)
    print("summary: %d checks, %d WRONG" % (len(checks), bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
