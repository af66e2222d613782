#!/usr/bin/python3
"""Placements change while clients race over the same keys (issue 20,
"Correct while placements change"); see placement.sh.

    placement.py SCENARIO      move-block | move-logical | split | rebalance | isolate

Connects to the coordinator with PGHOST/PGPORT/PGDATABASE/PGUSER (as
test/citus/cluster.sh exports them); CITUS_DIR and CITUS_PORT_W1/W2 name the
workers. The extension must be distributed (idempotency.distribute()) and
public.effects must exist, colocated with idempotency.operations
(placement.sh makes it). The nodes need wal_level = logical for the logical
transfers, and citus.local_hostname naming the socket directory (cluster.sh
sets it: Citus connects to its own node to drop old shard copies before
every move and split, and for the background rebalancer).

One scenario, on its own job type (placement-SCENARIO: lease 5 minutes,
policy hold: no claim goes stale, so a second effect is never allowed;
its records and effect rows of an earlier run are deleted first):

  move-block    citus_move_shard_placement(a shard of w1, w1, w2,
                shard_transfer_mode => 'block_writes')
  move-logical  the same, shard_transfer_mode => 'force_logical'
  split         citus_split_shard_by_split_points(a shard of w1, its midpoint,
                children on w1 and w2, shard_transfer_mode =>
                PLACEMENT_SPLIT_MODE, default 'block_writes': blocking. The
                non-blocking split ('force_logical') never finishes while
                keys are updated, with any table (Citus 13.2.2 on PostgreSQL
                15.20: the apply worker of the child on the source's node
                fails again and again with "publisher did not send replica
                identity column expected by the logical replication target
                relation"; apparently upstream #6790); with it the scenario
                says WRONG after PLACEMENT_LIMIT
  rebalance     shards moved one by one (block_writes, before the clients
                start) until the workers' shard counts differ by
                PLACEMENT_UNBALANCE (7) or more; then
                citus_rebalance_start(shard_transfer_mode => 'block_writes')
                and citus_rebalance_wait(): the background rebalancer, which
                must move the shards of its plan (2 or more)
  isolate       isolate_tenant_to_new_shard('idempotency.operations', KEY,
                'CASCADE', shard_transfer_mode => 'block_writes'), KEY one the
                clients keep claiming (below)

The target shards (the moved one; the split one; the ones the rebalancer's
plan, get_rebalance_table_shards_plan(), will move; the tenant's) get half
of the keys, the other shards the other half, alternately. Keys are
published one every PLACEMENT_PUBLISH_EVERY s (0.05), and every key is
delivered to every one of PLACEMENT_CLIENTS (4) client threads: clients 0
and 1 connect to the coordinator, 2 to w1, 3 to w2 (a call on a worker:
Citus delegates it or routes its statements from there). Every 4th
delivery of a client is also followed by a redelivery of one of 3 hot keys
of the target shards (the isolated tenant is one): duplicates claimed
during the change.

A delivery is the transactional mode of the README: in ONE transaction,
claim_operation(job type, key); if run: INSERT INTO public.effects (key, a
new uuid, client, attempt, node) and complete_operation(key, attempt,
{"client", "effect"}); COMMIT. Any error: ROLLBACK (a new connection if the
old one is broken) and the same transaction again, after 0, 0.05, 0.1 ...
1 s, for up to PLACEMENT_RETRY_FOR (30) s; each error is counted by kind
(SQLSTATE and message without numbers) and printed. Transient kinds: 40001,
40P01, class 08, 57P01-57P03, a Citus error that says a shard or placement
moved or does not exist (40001 includes the extension's "the shard of
operation ... is no longer on this node": the coordinator delegated the call
to the key's old node as the move committed, seen about 3 times per moved
shard; before the direct path of issue 20 Citus raised XX000 "cannot
execute a distributed query from a query on a shard" there, which is no
longer transient); any other kind makes the run WRONG. An error at COMMIT leaves the outcome unknown: the
effect table says whether it committed.

After PLACEMENT_WARMUP s (1.5) of traffic the placement change runs in a
thread; Citus's deadlock detection may cancel it (40P01: a client's
transaction wrote the records' shard and waits for the effect table's,
which the change has locked), and then it is run again, as an operator
would (at most PLACEMENT_CHANGE_TRIES = 5 times). Before it, every live
shard of operations and effects is held with an ACCESS SHARE lock (an open
read-only transaction on each worker, to the end of the checks), so that
Citus's cleanup (every move and split first drops the old copies: DROP
TABLE with lock_timeout 1 s) cannot drop the old copies of this change; a
monitor polls pg_dist_cleanup on the coordinator every 20 ms and, when a
record of a deferred drop (object type 1, policy 2) appears, which Citus
writes in the change's own transaction, reads that old copy on its node:
every tuple's ctid, xmin, xmax and row. Publishing goes on PLACEMENT_TAIL s
(2) after the change returned; the clients finish every delivery (at most
PLACEMENT_LIMIT = 60 s from the start).

Checks, one line each (OK / WRONG): the change happened (the shard moved,
the children exist on w1 and w2, the rebalancer moved the shards of its
plan, the tenant has a shard of its own); keys of the changed shards were
claimed after the change too; every key completed (attempt 1, nothing left
claimed, none lost); exactly one effect row per key, the one of the
committed run, whose record names it; the verdicts of one node (per key one
committed run, every other committed claim completed and none before the
run began: no in_progress, held, skipped or verify); no error outside the
transient kinds, no delivery given up; the old copies still there at the
end, holding records of this run (else the next checks prove nothing); no
row of an old copy new, changed or gone between its first read and the
end; no tuple in an old copy whose xmin is as new as the node's own
metadata change (the xmin of that node's pg_dist_placement row of the moved
shard, or of the split's children: a write after the change, even in the
few ms before the first read). Exit 0 when every check is OK, 1 when one is
WRONG, 2 when the run could not be made.

Self-test: PLACEMENT_WRITE_ORPHAN=1 updates one record in the first old
copy of operations (on its node, citus.enable_manual_changes_to_shards =
on) right after the change returned: both checks of the old copies must
say WRONG.
"""
import os
import re
import sys
import threading
import time
import uuid

import psycopg
from psycopg.types.json import Jsonb


def env_num(name, default, kind=float):
    v = os.environ.get(name)
    return kind(v) if v not in (None, "") else default


SCENARIOS = ("move-block", "move-logical", "split", "rebalance", "isolate")
CLIENTS = env_num("PLACEMENT_CLIENTS", 4, int)
PUBLISH_EVERY = env_num("PLACEMENT_PUBLISH_EVERY", 0.05)
WARMUP = env_num("PLACEMENT_WARMUP", 1.5)
TAIL = env_num("PLACEMENT_TAIL", 2.0)
RETRY_FOR = env_num("PLACEMENT_RETRY_FOR", 30.0)
LIMIT = env_num("PLACEMENT_LIMIT", 60.0)
REDELIVER_EVERY = env_num("PLACEMENT_REDELIVER_EVERY", 4, int)
UNBALANCE = env_num("PLACEMENT_UNBALANCE", 7, int)
CHANGE_TRIES = env_num("PLACEMENT_CHANGE_TRIES", 5, int)
SPLIT_MODE = os.environ.get("PLACEMENT_SPLIT_MODE") or "block_writes"
WRITE_ORPHAN = os.environ.get("PLACEMENT_WRITE_ORPHAN") == "1"
MAX_KEYS = 20000

CITUS_DIR = os.environ["CITUS_DIR"]
PORTS = {"w1": int(os.environ["CITUS_PORT_W1"]), "w2": int(os.environ["CITUS_PORT_W2"])}
NODE_OF_PORT = {p: n for n, p in PORTS.items()}
OPS = "idempotency.operations"

CLAIM_SQL = "SELECT verdict, attempt FROM idempotency.claim_operation(%s, %s, %s, %s)"
EFFECT_SQL = "INSERT INTO public.effects VALUES (%s, %s, %s, %s, %s)"
COMPLETE_SQL = "SELECT idempotency.complete_operation(%s, %s, %s, %s)"
SERVER_GONE = ("57P01", "57P02", "57P03")
# what Citus says when a statement meets a placement that changed under it:
# the shard or placement moved or is gone. (A call the coordinator delegated
# to the node that held the key's shard, which moved away meanwhile, gets
# the extension's 40001 there.)
MOVED = re.compile(r"(shard|placement)s? .*(moved|does not exist|not found|could not find)"
                   r"|could not find .*(shard|placement)|relation \S+_(\d+|N)\S* does not exist"
                   r"|no such shard|is being (moved|split)", re.I)

lock = threading.Lock()
T_PROCESS = time.monotonic()
t0 = T_PROCESS      # the run's clock: set again when the clients start


def phase(name):
    if os.environ.get("PLACEMENT_DEBUG"):
        print("[%.2f s since start] %s" % (time.monotonic() - T_PROCESS, name), flush=True)


def now():
    return time.monotonic() - t0


def connect(port=None, autocommit=True, **kw):
    args = dict(autocommit=autocommit, prepare_threshold=None, connect_timeout=10,
                options="-c statement_timeout=20s")
    if port is not None:
        args["port"] = port
    args.update(kw)
    return psycopg.connect(**args)


_admin = {}
_admin_lock = threading.Lock()


def admin(sql, args=(), port=None):
    """a statement on a node (the coordinator by default), in autocommit, on
    a connection kept for it"""
    with _admin_lock:
        c = _admin.get(port)
        if c is None or c.closed:
            c = _admin[port] = connect(port)
        cur = c.execute(sql, args)
        return cur.fetchall() if cur.description else None


def norm(err):
    """a kind of error: the message without numbers, paths and ports"""
    msg = (getattr(err.diag, "message_primary", None) or str(err) or type(err).__name__)
    msg = " ".join(msg.split())
    msg = re.sub(r"postgres@\S+:\d+", "postgres@NODE", msg)
    msg = re.sub(r'connection to server on socket "[^"]*" failed: ', "", msg)
    msg = re.sub(r"\d+", "N", msg)
    return msg[:160]


def transient(code, msg):
    if code is None or code.startswith("08") or code in SERVER_GONE:
        return True
    if code in ("40001", "40P01"):
        return True
    return bool(MOVED.search(msg))


class Run:
    """what the clients saw"""

    def __init__(self):
        self.committed = []     # (key, client, verdict, attempt, effect_id, t_start, t_end)
        self.uncertain = []     # (key, client, effect_id): the COMMIT failed, outcome unknown
        self.errors = {}        # (sqlstate, kind, at COMMIT?) -> [count, transient?, a key, node]
        self.gave_up = []       # (key, client, why)
        self.deliveries = 0
        self.publish_until = float("inf")


run = Run()


class Client(threading.Thread):
    def __init__(self, n, node, port, job_type, keys, publish_at, hot):
        super().__init__(name="client-%d" % n, daemon=True)
        self.n, self.node, self.port = n, node, port
        self.job_type, self.keys, self.publish_at, self.hot = job_type, keys, publish_at, hot
        self.conn = None
        self.failed = None

    def db(self):
        if self.conn is None or self.conn.closed:
            self.conn = connect(self.port, autocommit=False, application_name="placement-%d" % self.n)
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
            self.failed = "%s: %s" % (type(err).__name__, err)
        finally:
            self.discard()

    def loop(self):
        i = 0
        fresh = 0
        while now() < LIMIT:
            t = now()
            limit = min(t, run.publish_until)
            if i < len(self.keys) and self.publish_at[i] <= limit:
                self.deliver(self.keys[i])
                i += 1
                fresh += 1
                if self.hot and fresh % REDELIVER_EVERY == 0:
                    self.deliver(self.hot[(fresh // REDELIVER_EVERY) % len(self.hot)])
                continue
            if t >= run.publish_until and (i >= len(self.keys) or self.publish_at[i] > run.publish_until):
                return
            nxt = self.publish_at[i] if i < len(self.keys) else t + 0.01
            time.sleep(min(0.01, max(0.0005, nxt - now())))
        with lock:
            run.gave_up.append((None, self.n, "time limit with keys left"))

    def deliver(self, key):
        first_error = None
        tries = 0
        with lock:
            run.deliveries += 1
        while True:
            started = now()
            effect_id = None
            at_commit = False
            conn = None
            try:
                conn = self.db()
                verdict, attempt = conn.execute(
                    CLAIM_SQL, (self.job_type, key, "fp:" + key, "client-%d" % self.n)).fetchone()
                if verdict == "run":
                    effect_id = str(uuid.uuid4())
                    conn.execute(EFFECT_SQL, (key, effect_id, self.n, attempt, self.node))
                    conn.execute(COMPLETE_SQL, (self.job_type, key, attempt,
                                                Jsonb({"client": self.n, "effect": effect_id})))
                at_commit = True
                conn.commit()
                with lock:
                    run.committed.append((key, self.n, verdict, attempt, effect_id, started, now()))
                return
            except psycopg.Error as err:
                code = err.sqlstate
                kind = norm(err)
                tr = transient(code, kind)
                with lock:
                    e = run.errors.setdefault((code, kind, at_commit), [0, tr, key, self.node])
                    e[0] += 1
                    if at_commit and effect_id is not None:
                        run.uncertain.append((key, self.n, effect_id))
                if conn is not None:
                    if conn.closed or conn.broken:
                        self.discard()
                    else:
                        try:
                            conn.rollback()
                        except psycopg.Error:
                            self.discard()
                t = now()
                if first_error is None:
                    first_error = t
                tries += 1
                if t - first_error > RETRY_FOR or t > LIMIT:
                    with lock:
                        run.gave_up.append((key, self.n, "%s %s" % (code, kind)))
                    return
                time.sleep(0.0 if tries == 1 else min(1.0, 0.05 * 2 ** (tries - 2)))


checks = []


def check(name, ok, detail):
    checks.append(ok)
    print("  %-70s %-5s %s" % (name, "OK" if ok else "WRONG", detail), flush=True)


def placements():
    """shardid -> (table, node, minvalue, maxvalue) of operations and effects"""
    out = {}
    for sid, table, port, lo, hi in admin(
            """SELECT s.shardid, s.logicalrelid::regclass::text, n.nodeport,
                      s.shardminvalue::bigint, s.shardmaxvalue::bigint
               FROM pg_dist_shard s JOIN pg_dist_placement p USING (shardid)
               JOIN pg_dist_node n USING (groupid)
               WHERE s.logicalrelid IN ('idempotency.operations'::regclass, 'public.effects'::regclass)"""):
        out[sid] = (table, NODE_OF_PORT.get(port, port), lo, hi)
    return out


def ops_shards(pl, node=None):
    return sorted(s for s, (t, n, _, _) in pl.items() if t == OPS and (node is None or n == node))


def move(sid, src, dst, mode, conn=None):
    sql = ("SELECT citus_move_shard_placement(%s, %s, %s, %s, %s, shard_transfer_mode => %s)")
    args = (sid, CITUS_DIR, PORTS[src], CITUS_DIR, PORTS[dst], mode)
    if conn is not None:
        conn.execute(sql, args)
    else:
        admin(sql, args)


class Orphans:
    """the old copies of moved or split shards (pg_dist_cleanup, deferred
    drop), read on their node when first seen and again at the end"""

    def __init__(self, after_record):
        self.after = after_record
        self.seen = {}      # name -> dict(node, port, t, rows)
        self.stop = False
        self.conn = connect()
        self.node_conns = {}
        self.error = None
        self.polls = []
        self.mutex = threading.Lock()
        for port in PORTS.values():     # opened now: a connection takes a while on a busy node
            self.node(port)

    def node(self, port):
        c = self.node_conns.get(port)
        if c is None or c.closed:
            c = self.node_conns[port] = connect(port)
        return c

    def read(self, name, port):
        """every tuple of the orphan: ctid, xmin, xmax, the row as text"""
        cur = self.node(port).execute(
            "SELECT ctid::text, xmin::text::bigint, xmax::text::bigint, t::text FROM %s AS t" % name)
        return sorted(cur.fetchall())

    def poll(self):
        with self.mutex:
            self._poll()

    def _poll(self):
        rows = self.conn.execute(
            """SELECT c.record_id, c.object_name, n.nodeport FROM pg_dist_cleanup c
               JOIN pg_dist_node n ON n.groupid = c.node_group_id
               WHERE c.object_type = 1 AND c.policy_type = 2 AND c.record_id > %s""",
            (self.after,)).fetchall()
        for _rid, name, port in rows:
            if name in self.seen:
                continue
            t = now()
            try:
                got = self.read(name, port)
            except psycopg.Error as err:
                got = None
                self.error = "%s on %s: %s" % (name, NODE_OF_PORT.get(port), norm(err))
            self.seen[name] = {"node": NODE_OF_PORT.get(port, port), "port": port, "t": t,
                               "rows": got, "took": now() - t}

    def watch(self):
        while not self.stop:
            try:
                self.poll()
            except psycopg.Error as err:
                self.error = norm(err)
                return
            self.polls.append(now())
            time.sleep(0.02)

    def start(self):
        self.thread = threading.Thread(target=self.watch, daemon=True)
        self.thread.start()

    def close(self):
        self.stop = True
        self.thread.join(timeout=5)
        self.poll()


def guard_shards():
    """an ACCESS SHARE lock on every live shard of operations and effects, in
    an open read-only transaction per worker: Citus's cleanup (DROP TABLE,
    lock_timeout 1 s) cannot drop them, nor the orphans they become"""
    guards = {}
    for node, port in PORTS.items():
        g = connect(port, autocommit=False, application_name="placement-guard")
        # (not citus_shards: it leaves out the tables of extensions)
        for (name,) in admin("""SELECT shard_name(s.logicalrelid, s.shardid)
                                FROM pg_dist_shard s JOIN pg_dist_placement p USING (shardid)
                                JOIN pg_dist_node n USING (groupid)
                                WHERE n.nodeport = %s AND s.logicalrelid IN
                                      ('idempotency.operations'::regclass, 'public.effects'::regclass)""",
                             (port,)):
            g.execute("SELECT FROM %s LIMIT 0" % name)
        guards[node] = g
    return guards


def quiesce():
    """no rebalancer job of an earlier run going on, and the old copies of
    earlier changes dropped now, while no client runs (their DROP takes an
    ACCESS EXCLUSIVE lock on the node's job_types shard: the foreign key)"""
    if admin("SELECT count(*) FROM pg_dist_background_job WHERE state NOT IN "
             "('finished', 'cancelled', 'failed')")[0][0]:
        admin("SELECT citus_rebalance_stop()")
    with connect() as c:
        c.execute("CALL citus_cleanup_orphaned_resources()")
    left = admin("SELECT count(*) FROM pg_dist_cleanup")[0][0]
    if left:
        print("placement: %d records left in pg_dist_cleanup after citus_cleanup_orphaned_resources()" % left,
              flush=True)


def main():
    if len(sys.argv) != 2 or sys.argv[1] not in SCENARIOS:
        print("usage: placement.py %s" % " | ".join(SCENARIOS), file=sys.stderr)
        return 2
    scenario = sys.argv[1]
    job_type = "placement-" + scenario
    quiesce()
    admin("INSERT INTO idempotency.job_types (job_type, lease, stale_policy) "
          "VALUES (%s, '5 minutes', 'hold') ON CONFLICT DO NOTHING", (job_type,))
    # a scenario run again on the same cluster starts from no records
    admin("DELETE FROM idempotency.operations WHERE job_type = %s", (job_type,))
    admin("DELETE FROM public.effects WHERE operation_key LIKE %s", ("pl-%s-%%" % scenario,))

    pl = placements()
    w1_shards = ops_shards(pl, "w1")
    op = None           # (description, function run in the change's thread)
    targets = []
    extra = {}
    if scenario in ("move-block", "move-logical"):
        mode = "block_writes" if scenario == "move-block" else "force_logical"
        sid = w1_shards[len(w1_shards) // 2]
        targets = [sid]
        op = ("citus_move_shard_placement(%d, w1, w2, shard_transfer_mode => '%s')" % (sid, mode),
              lambda c: move(sid, "w1", "w2", mode, c))
    elif scenario == "split":
        sid = w1_shards[len(w1_shards) // 2]
        lo, hi = pl[sid][2], pl[sid][3]
        mid = (lo + hi) // 2
        nodeids = dict(admin("SELECT nodeport, nodeid FROM pg_dist_node"))
        targets = [sid]
        extra["split"] = (sid, lo, mid, hi)
        op = ("citus_split_shard_by_split_points(%d, ARRAY['%d'], ARRAY[w1, w2], "
              "shard_transfer_mode => '%s')" % (sid, mid, SPLIT_MODE),
              lambda c: c.execute("SELECT citus_split_shard_by_split_points(%s, ARRAY[%s], ARRAY[%s, %s]::int[], "
                                  "shard_transfer_mode => %s)",
                                  (sid, str(mid), nodeids[PORTS["w1"]], nodeids[PORTS["w2"]], SPLIT_MODE)))
    elif scenario == "rebalance":
        # unbalance: move shards from the node with fewer to the node with more
        t_u = time.monotonic()
        made = []
        for _ in range(8):
            pl = placements()
            counts = {n: len(ops_shards(pl, n)) for n in PORTS}
            if abs(counts["w1"] - counts["w2"]) >= UNBALANCE:
                break
            src, dst = ("w1", "w2") if counts["w1"] <= counts["w2"] else ("w2", "w1")
            sid = ops_shards(pl, src)[0]
            move(sid, src, dst, "block_writes")
            made.append("%d %s->%s" % (sid, src, dst))
        pl = placements()
        counts = {n: len(ops_shards(pl, n)) for n in PORTS}
        plan = admin("SELECT shardid, sourceport, targetport FROM get_rebalance_table_shards_plan() "
                     "WHERE table_name = 'idempotency.operations'::regclass")
        targets = sorted(s for s, _, _ in plan)
        print("unbalanced in %.1f s by %d moves (%s): shards of operations w1 %d, w2 %d; the plan moves %d: %s"
              % (time.monotonic() - t_u, len(made), ", ".join(made), counts["w1"], counts["w2"],
                 len(plan), ["%d %s->%s" % (s, NODE_OF_PORT[a], NODE_OF_PORT[b]) for s, a, b in plan]),
              flush=True)
        extra["plan"] = plan

        def rebalance(c):
            job = c.execute("SELECT citus_rebalance_start(shard_transfer_mode => 'block_writes')").fetchone()[0]
            extra["job"] = job
            c.execute("SELECT citus_rebalance_wait()")
            extra["job_state"] = c.execute("SELECT state::text FROM pg_dist_background_job WHERE job_id = %s",
                                           (job,)).fetchone()[0]
        op = ("citus_rebalance_start(shard_transfer_mode => 'block_writes') + citus_rebalance_wait()",
              rebalance)
        w1_shards = ops_shards(pl, "w1")
    elif scenario == "isolate":
        pass    # the tenant is chosen among the keys below
    if scenario != "isolate" and not targets:
        print("placement: no target shard for %s" % scenario, file=sys.stderr)
        return 2

    phase("scenario set up")
    # the keys: half in the target shards, half elsewhere, alternately
    cands = ["pl-%s-%05d" % (scenario, i) for i in range(MAX_KEYS)]
    shard_of = dict(admin("SELECT k, get_shard_id_for_distribution_column('idempotency.operations', k) "
                          "FROM unnest(%s::text[]) AS k", (cands,)))
    if scenario == "isolate":
        sid = w1_shards[len(w1_shards) // 2]
        targets = [sid]
        tenant = next(k for k in cands if shard_of[k] == sid)
        extra["tenant"] = tenant
        op = ("isolate_tenant_to_new_shard('idempotency.operations', '%s', 'CASCADE', "
              "shard_transfer_mode => 'block_writes')" % tenant,
              lambda c: extra.__setitem__("new_shard", c.execute(
                  "SELECT isolate_tenant_to_new_shard('idempotency.operations', %s::text, 'CASCADE', "
                  "shard_transfer_mode => 'block_writes')", (tenant,)).fetchone()[0]))
    n_keys = int((LIMIT - 5) / PUBLISH_EVERY)
    tkeys = [k for k in cands if shard_of[k] in targets]
    okeys = [k for k in cands if shard_of[k] not in targets]
    if scenario == "isolate":
        tkeys.remove(extra["tenant"])
        tkeys.insert(0, extra["tenant"])
    keys = []
    for a, b in zip(tkeys, okeys):
        keys += [a, b]
    keys = keys[:n_keys]
    hot = tkeys[:3]
    publish_at = [i * PUBLISH_EVERY for i in range(len(keys))]

    quiesce()
    phase("keys mapped")
    guards = guard_shards()
    phase("guards")
    last_record = admin("SELECT coalesce(max(record_id), 0) FROM pg_dist_cleanup")[0][0]
    orphans = Orphans(last_record)
    orphans.start()
    print("scenario %s: %s; %d clients (0,1 on the coordinator, 2 on w1, 3 on w2) race over every key, "
          "one key every %.3f s, half in the target shards %s; hot keys redelivered every %d: %s"
          % (scenario, op[0], CLIENTS, PUBLISH_EVERY, targets, REDELIVER_EVERY, hot), flush=True)

    global t0
    t0 = time.monotonic()
    where = [("coord", None), ("coord", None), ("w1", PORTS["w1"]), ("w2", PORTS["w2"])]
    clients = [Client(n, where[n % 4][0], where[n % 4][1], job_type, keys, publish_at, hot)
               for n in range(CLIENTS)]
    for c in clients:
        c.start()

    time.sleep(WARMUP)
    change = {}

    def do_change():
        # Citus cancels the change itself when it is the youngest of a
        # distributed deadlock (a client's transaction wrote one shard of the
        # group and waits for the other, which the change has locked): as an
        # operator would, run it again (40P01, or the leftover of the
        # cancelled try not dropped yet; at most CHANGE_TRIES times)
        change["t_start"] = now()
        change["tries"] = []
        try:
            for _ in range(CHANGE_TRIES):
                try:
                    with connect(options="-c statement_timeout=%ds" % max(5, LIMIT - TAIL - 5 - now())) as c:
                        change["pid"] = c.info.backend_pid
                        op[1](c)
                    change.pop("error", None)
                    return
                except psycopg.Error as err:
                    change["error"] = "%s %s" % (err.sqlstate, str(err).strip()[:300])
                    change["tries"].append((round(now(), 2), err.sqlstate, norm(err)))
                    # the next try first drops what this one left (Citus's
                    # cleanup); a leftover it could not drop stops a move
                    again = err.sqlstate == "40P01" or "could not be cleaned up" in str(err)
                    if not again or now() > LIMIT - 20:
                        return
                    time.sleep(0.5)
        finally:
            change["t_end"] = now()

    n_before = len(run.committed)
    th = threading.Thread(target=do_change, daemon=True)
    th.start()
    th.join(timeout=max(1.0, LIMIT - TAIL - 3 - now()))
    if th.is_alive():
        change.setdefault("error", "did not return in time")
        change["t_end"] = now()
        if change.get("pid"):
            admin("SELECT pg_cancel_backend(%s)", (change["pid"],))
        if scenario == "rebalance":
            admin("SELECT citus_rebalance_stop()")
    t_end = change["t_end"]
    orphans.poll()
    if os.environ.get("PLACEMENT_DEBUG"):
        print("polls around the end:", [round(p - t_end, 3) for p in orphans.polls if abs(p - t_end) < 1],
              {n: (round(o["t"] - t_end, 3), round(o["took"], 3)) for n, o in orphans.seen.items()})
    print("t=%5.2fs  the change: %.2f s (%s); %d deliveries committed before it, %d during; "
          "tries that failed: %s" % (change.get("t_start", -1), t_end - change.get("t_start", t_end),
                                     change.get("error", "ok"), n_before, len(run.committed) - n_before,
                                     change.get("tries") or "none"), flush=True)
    if WRITE_ORPHAN:
        # self-test: a record written into the old copy after the change
        name, o = next(((n, o) for n, o in sorted(orphans.seen.items()) if "operations" in n and o["rows"]),
                       (None, None))
        if name:
            with connect(o["port"]) as c:
                c.execute("SET citus.enable_manual_changes_to_shards = on")
                c.execute("UPDATE %s SET result = '{\"self-test\": 1}' WHERE ctid = "
                          "(SELECT min(ctid) FROM %s)" % (name, name))
            print("t=%5.2fs  PLACEMENT_WRITE_ORPHAN: one record of %s on %s updated" % (now(), name, o["node"]),
                  flush=True)
    run.publish_until = t_end + TAIL
    for c in clients:
        c.join(timeout=max(1.0, LIMIT + 25 - now()))
    hung = [c.name for c in clients if c.is_alive()]
    died = [(c.name, c.failed) for c in clients if c.failed]
    t_done = now()
    orphans.close()
    phase("clients done")

    # ---- what the cluster holds now
    pl_after = placements()
    recs = {k: (s, a, r) for k, s, a, r in admin(
        "SELECT operation_key, status::text, attempt, result FROM idempotency.operations WHERE job_type = %s",
        (job_type,))}
    eff = {}
    for k, eid, cl, att, node in admin("SELECT operation_key, effect_id::text, client, attempt, node "
                                       "FROM public.effects WHERE operation_key LIKE %s", ("pl-%s-%%" % scenario,)):
        eff.setdefault(k, []).append((eid, cl, att, node))
    published = [k for k, t in zip(keys, publish_at) if t <= run.publish_until]
    pub = set(published)

    print("t=%5.2fs  clients done%s; %d keys published, %d deliveries, %d committed, %d of them in the "
          "%.1f s after the change" % (t_done, " (HUNG: %s)" % hung if hung else "", len(published),
                                       run.deliveries, len(run.committed),
                                       sum(1 for c in run.committed if c[5] >= t_end), t_done - t_end),
          flush=True)
    for (code, kind, at_commit), (n, tr, key, node) in sorted(run.errors.items(), key=lambda x: -x[1][0]):
        print("  retried %-9s x%-4d %-5s %s%s (e.g. %s via %s)" % (
            "transient" if tr else "OTHER", n, code, "at COMMIT: " if at_commit else "", kind, key, node))
    if not run.errors:
        print("  retried: none")

    # ---- 1. the change happened
    if scenario in ("move-block", "move-logical"):
        sid = targets[0]
        ok = "error" not in change and pl_after.get(sid, (None, None))[1] == "w2"
        check("the shard moved (%s)" % op[0].split("(")[0], ok,
              "shard %d on %s (was w1); %s" % (sid, pl_after.get(sid, (0, "gone"))[1], change.get("error", "")))
    elif scenario == "split":
        sid, lo, mid, hi = extra["split"]
        kids = sorted((pl_after[s][2], pl_after[s][3], pl_after[s][1], s) for s in ops_shards(pl_after)
                      if s not in pl and lo <= pl_after[s][2] <= hi)
        ok = ("error" not in change and sid not in pl_after and
              [(a, b, n) for a, b, n, _ in kids] == [(lo, mid, "w1"), (mid + 1, hi, "w2")])
        check("the shard was split into a child on w1 and one on w2", ok,
              "%d -> %s %s" % (sid, [(s, n) for _, _, n, s in kids], change.get("error", "")))
    elif scenario == "rebalance":
        moved = [s for s in ops_shards(pl) if s in pl_after and pl_after[s][1] != pl[s][1]]
        counts = {n: len(ops_shards(pl_after, n)) for n in PORTS}
        ok = ("error" not in change and extra.get("job_state") == "finished" and len(moved) >= 2
              and set(moved) == set(targets))
        check("the rebalancer moved the planned shards (2 or more)", ok,
              "job %s %s; moved %s; now w1 %d, w2 %d %s" % (extra.get("job"), extra.get("job_state"), moved,
                                                         counts["w1"], counts["w2"], change.get("error", "")))
    elif scenario == "isolate":
        tenant = extra["tenant"]
        got = admin("SELECT s.shardid, s.shardminvalue::bigint = s.shardmaxvalue::bigint "
                    "FROM pg_dist_shard s WHERE s.shardid = "
                    "get_shard_id_for_distribution_column('idempotency.operations', %s::text)", (tenant,))
        ok = "error" not in change and got and got[0][1] and got[0][0] == extra.get("new_shard")
        check("the tenant has a shard of its own", ok,
              "%s -> shard %s (returned %s) %s" % (tenant, got, extra.get("new_shard"), change.get("error", "")))

    # ---- 2. traffic on the changed shards after the change
    after = [c for c in run.committed if c[5] >= t_end and shard_of.get(c[0]) in targets]
    after_runs = [c for c in after if c[2] == "run"]
    check("keys of the changed shards claimed after the change", len(after_runs) > 0,
          "%d committed claims (%d runs) of keys of %s started after it" % (len(after), len(after_runs), targets))

    # ---- 3. every key completed, nothing left claimed, nothing lost
    by_status = {}
    for s, _, _ in recs.values():
        by_status[s] = by_status.get(s, 0) + 1
    missing = [k for k in published if k not in recs]
    not_done = [(k, recs[k][0], recs[k][1]) for k in published if k in recs and
                (recs[k][0] != "completed" or recs[k][1] != 1)]
    strays = [k for k in recs if k not in pub]
    check("every key completed, attempt 1; none lost, none left claimed",
          not missing and not not_done and not strays and len(published) > 0,
          "%d keys, records %s; no record %d %s; not completed/attempt 1: %d %s"
          % (len(published), by_status, len(missing), missing[:3], len(not_done), not_done[:3]))

    # ---- 4. exactly one effect per key, the committed run's, named by the record
    runs = {}
    for k, cl, v, a, eid, ts, te in run.committed:
        if v == "run":
            runs.setdefault(k, []).append((cl, eid))
    uncertain_committed = 0
    for k, cl, eid in run.uncertain:
        if any(e[0] == eid for e in eff.get(k, [])):
            runs.setdefault(k, []).append((cl, eid))
            uncertain_committed += 1
    twice = {k: v for k, v in eff.items() if len(v) > 1}
    never = [k for k in published if k not in eff]
    mismatch = []
    for k in published:
        if k in eff and len(eff[k]) == 1 and k in recs:
            eid, cl, att, node = eff[k][0]
            r = recs[k][2] or {}
            if r.get("effect") != eid or r.get("client") != cl or att != 1 or runs.get(k) != [(cl, eid)]:
                mismatch.append((k, eff[k], r, runs.get(k)))
    check("exactly one effect per key: the committed run's, named by its record",
          not twice and not never and not mismatch,
          "%d effect rows for %d keys; twice: %d %s; never: %d %s; mismatch: %d %s"
          % (sum(len(v) for v in eff.values()), len(eff), len(twice), list(twice.items())[:2], len(never),
             never[:3], len(mismatch), mismatch[:2]))

    # ---- 5. the verdicts of one node
    verdicts = {}
    odd = []
    for k, cl, v, a, eid, ts, te in run.committed:
        verdicts[v] = verdicts.get(v, 0) + 1
        if v not in ("run", "completed"):
            odd.append((k, cl, v, a))
    not_one = [(k, runs.get(k)) for k in published if len(runs.get(k, [])) != 1]
    # a completed verdict only after the run's transaction began
    run_start = {k: ts for k, cl, v, a, eid, ts, te in run.committed if v == "run"}
    early = [(k, cl) for k, cl, v, a, eid, ts, te in run.committed
             if v == "completed" and k in run_start and te < run_start[k]]
    check("verdicts of one node: one committed run per key, every other claim completed",
          not odd and not not_one and not early,
          "verdicts %s (%d commits unknown, %d of them committed); keys without exactly one run: %d %s; "
          "other verdicts: %d %s; completed before the run began: %d %s"
          % (dict(sorted(verdicts.items())), len(run.uncertain), uncertain_committed, len(not_one), not_one[:3],
             len(odd), odd[:3], len(early), early[:3]))

    # ---- 6. errors
    other = [(code, kind, n) for (code, kind, _), (n, tr, _, _) in run.errors.items() if not tr]
    check("no error outside the transient kinds; nothing given up; no client died",
          not other and not run.gave_up and not hung and not died,
          "other kinds %s; gave up %d %s; hung %s; died %s" % (other[:3], len(run.gave_up), run.gave_up[:3],
                                                               hung, died))

    # ---- 7. the orphans
    final = {}
    gone = []
    for name, o in sorted(orphans.seen.items()):
        try:
            final[name] = orphans.read(name, o["port"])
        except psycopg.Error as err:
            gone.append((name, o["node"], norm(err)))
    # records of this scenario (the old copies hold earlier scenarios' too)
    n_rows = sum(1 for n, o in orphans.seen.items() if "operations" in n
                 for r in (o["rows"] or []) if r[3].startswith("(%s," % job_type))
    first_lag = max((o["t"] - t_end for o in orphans.seen.values()), default=0.0)
    check("the old copies (pg_dist_cleanup, deferred drop) kept to the end, holding records",
          len(orphans.seen) >= 2 and not gone and n_rows > 0 and orphans.error is None,
          "%d orphans (%s), %d records of this run in those of operations; first read at most %.2f s after the change "
          "returned; gone: %s; %s" % (len(orphans.seen), ", ".join("%s on %s" % (n, o["node"]) for n, o in
                                                                   sorted(orphans.seen.items())),
                                      n_rows, first_lag, gone, orphans.error or ""))
    changed = []
    for name, o in sorted(orphans.seen.items()):
        if name not in final or o["rows"] is None:
            continue
        a, b = set(o["rows"]), set(final[name])
        if a != b:
            changed.append((name, o["node"], "new/changed %d: %s; gone %d" % (
                len(b - a), [r[3][:80] for r in sorted(b - a)[:2]], len(a - b))))
    check("no record written to an old copy after the change (rows at first read = at the end)",
          not changed and len(final) > 0, "%d orphans compared; %s" % (len(final), changed[:3]))

    # the xid of each orphan node's own metadata change: the xmin of its
    # pg_dist_placement row of the moved shard, or of the split's children
    late = []
    xid_detail = []
    for name, o in sorted(orphans.seen.items()):
        if name not in final:
            continue
        sid = int(name.rsplit("_", 1)[1])
        table = OPS if "operations" in name else "public.effects"
        tb, _, lo, hi = pl[sid] if sid in pl else (table, None, None, None)
        meta = admin("""SELECT min(p.xmin::text::bigint) FROM pg_dist_placement p
                        JOIN pg_dist_shard s USING (shardid)
                        WHERE s.logicalrelid = %s::regclass AND (s.shardid = %s OR (s.shardid <> ALL(%s)
                              AND s.shardminvalue::bigint <= %s AND s.shardmaxvalue::bigint >= %s))""",
                     (table, sid, list(pl), hi, lo), port=o["port"])[0][0]
        if meta is None:
            late.append((name, "no metadata change found"))
            continue
        newer = [r for r in final[name] if r[1] >= meta]
        xid_detail.append("%s: xmin < %d" % (name.split(".")[1], meta))
        if newer:
            late.append((name, o["node"], "%d tuples with xmin >= %d: %s" % (len(newer), meta,
                                                                             [r[3][:80] for r in newer[:2]])))
    check("no tuple in an old copy from a transaction after the node's metadata change",
          not late and len(xid_detail) > 0, "%s; %s" % ("; ".join(xid_detail[:4]), late[:3]))

    phase("checks done")
    for c in list(guards.values()) + list(orphans.node_conns.values()) + [orphans.conn] + list(_admin.values()):
        c.close()
    bad = checks.count(False)
    print("summary %s: %d checks, %d WRONG (%.1f s of traffic)" % (scenario, len(checks), bad, t_done))
    phase("end")
    return 1 if bad else 0


if __name__ == "__main__":
    try:
        rc = main()
    except Exception:  # noqa: BLE001 -- the run could not be made: say why, exit 2
        import traceback
        traceback.print_exc()
        rc = 2
    sys.stdout.flush()
    sys.stderr.flush()
    # every connection is closed: skip the interpreter's teardown (a second
    # or two on a busy machine, per scenario)
    os._exit(rc)
