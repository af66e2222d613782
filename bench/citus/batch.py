"""bench/citus/batch.sh's client (see there)."""
import os
import statistics
import time

import psycopg

PIDS = [int(p) for p in os.environ["BATCH_PIDS"].split()]
ROUNDS = int(os.environ["BATCH_ROUNDS"])
TX = int(os.environ["BATCH_TX"])
N = 100
JT = "send_confirmation"


def ticks():
    """CPU ticks of the servers: each postmaster and its children, living and reaped."""
    def stat(p):
        with open("/proc/%d/stat" % p) as f:
            s = f.read()
        return s[s.rindex(")") + 2:].split()
    total = 0
    kids = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                f = stat(int(d))
            except OSError:
                continue
            kids.setdefault(int(f[1]), []).append(f)
    for pm in PIDS:
        f = stat(pm)
        total += sum(int(x) for x in f[11:15])
        total += sum(sum(int(x) for x in k[11:15]) for k in kids.get(pm, []))
    return total


seq = [0]


def keys():
    seq[0] += 1
    return ["B%d-%d" % (seq[0], i) for i in range(N)]


def batch(c):
    with c.transaction():
        ks = keys()
        rows = c.execute("SELECT operation_key, verdict, attempt FROM idempotency.claim_operations(%s, %s)",
                         (JT, ks)).fetchall()
        assert all(r[1] == "run" for r in rows), rows[:3]
        done = c.execute("SELECT bool_and(done) FROM idempotency.complete_operations(%s, %s, %s)",
                         (JT, [r[0] for r in rows], [r[2] for r in rows])).fetchone()[0]
        assert done


def singles(c, tx):
    def work():
        for k in keys():
            v, a = c.execute("SELECT verdict, attempt FROM idempotency.claim_operation(%s, %s)", (JT, k)).fetchone()
            assert v == "run", v
            c.execute("SELECT idempotency.complete_operation(%s, %s, %s)", (JT, k, a))
    if tx:
        with c.transaction():
            work()
    else:
        work()


KINDS = {"batch": batch, "tx1": lambda c: singles(c, True), "auto1": lambda c: singles(c, False)}
res = {k: [] for k in KINDS}
with psycopg.connect(host=os.environ["CITUS_DIR"], port=os.environ["CITUS_PORT_COORD"],
                     dbname=os.environ["CITUS_DB"], autocommit=True) as c:
    for k in KINDS:          # warm-up: plans, connections
        KINDS[k](c)
    for r in range(ROUNDS):
        order = list(KINDS) if r % 2 == 0 else list(reversed(KINDS))
        for k in order:
            t0, c0 = time.monotonic(), ticks()
            for _ in range(TX):
                KINDS[k](c)
            t1, c1 = time.monotonic(), ticks()
            n = TX * N
            res[k].append(((t1 - t0) * 1e6 / n, (c1 - c0) * 1e6 / os.sysconf("SC_CLK_TCK") / n))

print("| per key (%d keys a transaction; %d rounds of %d transactions) | wall µs | × batch | servers' CPU µs | × batch |"
      % (N, ROUNDS, TX))
print("|---|---:|---:|---:|---:|")
bw = statistics.median(x[0] for x in res["batch"])
bc = statistics.median(x[1] for x in res["batch"])
for k in KINDS:
    w = statistics.median(x[0] for x in res[k])
    cpu = statistics.median(x[1] for x in res[k])
    print("| %s | %.0f | %.2f | %.0f | %.2f |" % (k, w, w / bw, cpu, cpu / bc))
