#!/usr/bin/python3
"""bench/purge_probe.py: what bench/purge_probe.sh recorded, per experiment.

    purge_probe.py --summary OUTDIR TAG      one line per window (idle, during, after)
    purge_probe.py --timeline OUTDIR TAG [BIN_S]   a time line in bins
    purge_probe.py --phases OUTDIR TAG       a paced purge's walk and deletes apart

Latency: pgbench's per-transaction log (-R: counted from the scheduled
start, so it includes the schedule lag). Windows: before the purge started
(idle), while it ran (during), after it ended.
"""
import collections
import math
import sys


def pct(v, q):
    if not v:
        return float("nan")
    return v[max(1, math.ceil(q / 100.0 * len(v))) - 1]


def load(outdir, tag):
    meta = {}
    for line in open(f"{outdir}/meta-{tag}.tsv"):
        k, _, v = line.rstrip("\n").partition("\t")
        meta[k] = v
    tx = []
    for line in open(f"{outdir}/tx-{tag}.log"):
        f = line.split()
        if len(f) < 6 or not f[2].isdigit():
            continue
        end = int(f[4]) + int(f[5]) / 1e6
        lag = int(f[6]) if len(f) > 6 else 0
        tx.append((end, int(f[2]) / 1000.0, lag / 1000.0))
    db = []
    for line in open(f"{outdir}/db-{tag}.tsv"):
        f = line.rstrip("\n").split("\t")
        if len(f) < 11:
            continue
        try:
            db.append((float(f[0]), int(f[1]), int(f[2]), int(f[3]), int(f[4]), int(f[5]), int(f[6]),
                       int(f[7]), int(f[8]), f[9], f[10]))
        except ValueError:
            pass
    cpu = []
    for line in open(f"{outdir}/cpu-{tag}.txt"):
        f = line.split()
        if len(f) == 3:
            cpu.append((float(f[0]), int(f[1]), None if f[2] == "-" else int(f[2])))
    return meta, tx, db, cpu


def stats(v):
    v = sorted(v)
    if not v:
        return "n=0"
    return (f"n={len(v)} mean={sum(v) / len(v):.2f} p50={pct(v, 50):.2f} p95={pct(v, 95):.2f} "
            f"p99={pct(v, 99):.2f} max={v[-1]:.2f}")


def summary(outdir, tag):
    meta, tx, db, cpu = load(outdir, tag)
    s, e = float(meta["purge_start"]), float(meta["purge_end"])
    idle = [t[1] for t in tx if t[0] < s]
    during = [t[1] for t in tx if s <= t[0] <= e]
    after = [t[1] for t in tx if t[0] > e + 1]
    wal = [d for d in db if s <= d[0] <= e]
    walmb = (wal[-1][1] - wal[0][1]) / 1e6 if len(wal) > 1 else 0
    fpi = (wal[-1][2] - wal[0][2]) if len(wal) > 1 else 0
    bb = (wal[-1][5] - wal[0][5]) if len(wal) > 1 else 0
    i99 = pct(sorted(idle), 99)
    d99 = pct(sorted(during), 99)
    print(f"{tag}: purge {e - s:.1f} s, WAL {walmb:.0f} MB, FPI {fpi}, backend buffer writes {bb}; "
          f"load {meta['load_before']} -> {meta['load_after']}; expired left {meta['expired_left']}; {meta['purge_out'].strip()}")
    print(f"  idle   {stats(idle)}")
    print(f"  during {stats(during)}")
    print(f"  after  {stats(after)}")
    print(f"  p99 during / idle = {d99 / i99:.2f}")


def timeline(outdir, tag, width):
    meta, tx, db, cpu = load(outdir, tag)
    s, e = float(meta["purge_start"]), float(meta["purge_end"])
    hz = float(meta.get("hz", 100))
    t0 = min(t[0] for t in tx)
    nb = int((max(t[0] for t in tx) - t0) / width) + 1
    lat = collections.defaultdict(list)
    for t in tx:
        lat[int((t[0] - t0) / width)].append(t)
    print(f"# {tag}: bins of {width} s; purge from {s - t0:.1f} to {e - t0:.1f} s")
    print("t_s\tphase\ttx\tp50_ms\tp99_ms\tmax_ms\tlag_p99_ms\twal_MB\tfpi\twal_sync\tbackend_writes\tbusy_pct\tpurge_cpu_pct\tpurge_waits\tpgbench_waits")

    def at(series, t):
        best = None
        for x in series:
            if x[0] <= t:
                best = x
            else:
                break
        return best
    for b in range(nb):
        lo, hi = t0 + b * width, t0 + (b + 1) * width
        ls = sorted(x[1] for x in lat[b])
        lags = sorted(x[2] for x in lat[b])
        d0, d1 = at(db, lo), at(db, hi)
        c0, c1 = at(cpu, lo), at(cpu, hi)
        walmb = (d1[1] - d0[1]) / 1e6 if d0 and d1 else float("nan")
        fpi = d1[2] - d0[2] if d0 and d1 else 0
        sync = d1[3] - d0[3] if d0 and d1 else 0
        bw = d1[5] - d0[5] if d0 and d1 else 0
        busy = (c1[1] - c0[1]) / hz / (c1[0] - c0[0]) / 2 * 100 if c0 and c1 and c1[0] > c0[0] else float("nan")
        pc = ((c1[2] - c0[2]) / hz / (c1[0] - c0[0]) * 100 if c0 and c1 and c0[2] is not None and c1[2] is not None
              and c1[0] > c0[0] else float("nan"))
        pw = collections.Counter()
        gw = collections.Counter()
        for d in db:
            if lo <= d[0] < hi:
                if d[10]:
                    pw[d[10].split(" ")[0]] += 1
                for w in d[9].split():
                    gw[w] += 1
        phase = "idle" if hi <= s else ("after" if lo > e else "purge")
        print(f"{lo - t0:.1f}\t{phase}\t{len(ls)}\t{pct(ls, 50):.1f}\t{pct(ls, 99):.1f}\t{(ls[-1] if ls else float('nan')):.1f}\t"
              f"{pct(lags, 99):.1f}\t{walmb:.1f}\t{fpi}\t{sync}\t{bw}\t{busy:.0f}\t{pc:.0f}\t"
              f"{' '.join(f'{k}={v}' for k, v in pw.most_common(3))}\t{' '.join(f'{k}={v}' for k, v in gw.most_common(4))}")


if __name__ == "__main__" and sys.argv[1] != "--phases":
    if sys.argv[1] == "--summary":
        summary(sys.argv[2], sys.argv[3])
    else:
        timeline(sys.argv[2], sys.argv[3], float(sys.argv[4]) if len(sys.argv) > 4 else 0.5)


def phases(outdir, tag):
    """The paced purge's window split where its session first and last
    slept (Timeout:PgSleep: it pauses only after a range that deleted
    something): the walk before the expired records, the deletes, the walk
    after them."""
    meta, tx, db, cpu = load(outdir, tag)
    s, e = float(meta["purge_start"]), float(meta["purge_end"])
    sleeps = [d[0] for d in db if d[10].startswith("Timeout:PgSleep")]
    idle = sorted(t[1] for t in tx if s - 10 <= t[0] < s)
    out = [("idle (10 s before)", s - 10, s, idle)]
    if sleeps:
        a, b = sleeps[0], sleeps[-1]
        out += [("walk before the deletes", s, a, None), ("deletes (with pauses)", a, b, None), ("walk after them", b, e, None)]
    else:
        out += [("purge", s, e, None)]
    for name, lo, hi, v in out:
        if v is None:
            v = sorted(t[1] for t in tx if lo <= t[0] < hi)
        w = [d for d in db if lo <= d[0] <= hi]
        walmb = (w[-1][1] - w[0][1]) / 1e6 if len(w) > 1 else 0
        print(f"{tag}\t{name}\t{hi - lo:.1f} s\tn={len(v)}\tp50={pct(v, 50):.2f}\tp95={pct(v, 95):.2f}\tp99={pct(v, 99):.2f}\tmax={(v[-1] if v else float('nan')):.2f}\tWAL {walmb:.0f} MB")


if __name__ == "__main__" and sys.argv[1] == "--phases":
    phases(sys.argv[2], sys.argv[3])
