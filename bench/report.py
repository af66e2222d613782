#!/usr/bin/python3
"""bench/report.py: the benchmark report, from what bench/run.sh measured.

    report.py DIR

Reads DIR/results.tsv (one line per pgbench or redis-benchmark run),
DIR/kv.tsv (everything else) and DIR/machine.txt; writes DIR/README.md and,
with gnuplot, DIR/throughput.png and DIR/batch.png (gnuplot's data files go
to a temp dir, removed at exit). The hand-written analysis
bench/portable.md and bench/analysis.md (next to this script) are appended to
the report as they are (for the report in the repository only).
Medians over repetitions; a ratio is the median of the per-repetition ratios.
"""
import atexit
import csv
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
_scratch = []


def scratch(name):
    """a path for gnuplot's data file NAME in a temp dir removed at exit
    (the data is in the report's tables; only the figures are kept)"""
    if not _scratch:
        _scratch.append(tempfile.mkdtemp(prefix="bench-report-"))
        atexit.register(shutil.rmtree, _scratch[0], True)
    return os.path.join(_scratch[0], name)
IMPL_NAMES = {
    "raw": "raw SQL (seed recipe)",
    "portable": "portable edition (SQL, PL/pgSQL)",
    "c": "C extension",
    "proto": "C prototype",
    "pk": "plain PK SELECT",
    "redis": "Redis",
}
PATH_NAMES = {
    "run": "run path (claim, then complete: two commits)",
    "dup": "duplicate path (claim of a completed key)",
    "tx": "transactional path (claim + side-effect row + complete, one commit)",
    "stale": "stale takeover (policy retry), then complete",
    "mixed": "mixed stream (90 % new keys, 10 % duplicates)",
}


def fnum(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return float("nan")


def med(values):
    values = [v for v in values if not math.isnan(v)]
    return statistics.median(values) if values else float("nan")


def fmt(x, digits=0):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if digits == 0:
        return "{:,.0f}".format(x).replace(",", "\u202f")
    return "{:.{}f}".format(x, digits)


def ratio(a, b):
    if a is None or b is None or math.isnan(a) or math.isnan(b) or b == 0:
        return float("nan")
    return a / b


def load(dirname):
    rows = []
    with open(os.path.join(dirname, "results.tsv")) as f:
        for r in csv.DictReader(f, delimiter="\t"):
            rows.append(r)
    kv = {}
    with open(os.path.join(dirname, "kv.tsv")) as f:
        for r in csv.DictReader(f, delimiter="\t"):
            kv.setdefault((r["phase"], r["name"]), []).append(r["value"])
    machine = {}
    with open(os.path.join(dirname, "machine.txt")) as f:
        for line in f:
            if ":" in line:
                k, v = line.split(":", 1)
                machine[k.strip()] = v.strip()
    return rows, kv, machine


class Cells:
    """results.tsv, grouped by (phase, path, impl, clients)"""

    def __init__(self, rows):
        self.groups = {}
        for r in rows:
            key = (r["phase"], r["path"], r["impl"], int(r["clients"]))
            self.groups.setdefault(key, []).append(r)

    def get(self, phase, path, impl, clients):
        return self.groups.get((phase, path, impl, clients), [])

    def med(self, phase, path, impl, clients, field):
        return med([fnum(r[field]) for r in self.get(phase, path, impl, clients)])

    def spread(self, phase, path, impl, clients, field="tps"):
        v = [fnum(r[field]) for r in self.get(phase, path, impl, clients)]
        v = [x for x in v if not math.isnan(x)]
        return (min(v), max(v)) if v else (float("nan"), float("nan"))

    def per_op(self, phase, path, impl, clients, field):
        """sum(field) / sum(ops) over the repetitions"""
        rs = self.get(phase, path, impl, clients)
        ops = sum(fnum(r["ops"]) for r in rs)
        if not rs or ops == 0:
            return float("nan")
        return sum(fnum(r[field]) for r in rs) / ops

    def hot(self, phase, path, impl, clients):
        rs = self.get(phase, path, impl, clients)
        upd = sum(fnum(r["upd"]) for r in rs)
        if not rs or upd == 0:
            return float("nan")
        return 100.0 * sum(fnum(r["hot_upd"]) for r in rs) / upd

    def paired(self, phase, path, a, b, clients, field="tps"):
        """median over the repetitions of a / b within each repetition"""
        return med(self.paired_list(phase, path, a, b, clients, field))

    def paired_list(self, phase, path, a, b, clients, field="tps"):
        """a / b within each repetition, in the order of the repetitions"""
        ra = {r["rep"]: fnum(r[field]) for r in self.get(phase, path, a, clients)}
        rb = {r["rep"]: fnum(r[field]) for r in self.get(phase, path, b, clients)}
        return [ra[k] / rb[k] for k in sorted(ra, key=int) if k in rb and rb[k]]

    def cpu_us(self, phase, path, impl, clients):
        """median backend CPU microseconds per operation"""
        v = []
        for r in self.get(phase, path, impl, clients):
            if r.get("backend_cpu_s") and fnum(r["ops"]) > 0:
                v.append(fnum(r["backend_cpu_s"]) * 1e6 / fnum(r["ops"]))
        return med(v)

    def clients(self, phase, path):
        return sorted({k[3] for k in self.groups if k[0] == phase and k[1] == path})


def kv1(kv, phase, name, default=None):
    v = kv.get((phase, name))
    return v[-1] if v else default


def lat_fields(s):
    """lat.py's line: count mean p50 p95 p99 max"""
    if not s:
        return None
    p = s.split()
    return {"count": int(p[0]), "mean": fnum(p[1]), "p50": fnum(p[2]),
            "p95": fnum(p[3]), "p99": fnum(p[4]), "max": fnum(p[5])}


def verdict(ok):
    if ok is None:
        return "not measured"
    if isinstance(ok, str):
        return ok
    return "**met**" if ok else "**missed**"


def main(dirname):
    rows, kv, machine = load(dirname)
    cells = Cells(rows)
    smoke = machine.get("mode", "").startswith("smoke")
    impls = machine.get("impls", "raw portable c").split()
    fn_impls = [i for i in impls if i != "raw"]
    out = []
    w = out.append

    run_clients = cells.clients("matrix", "run")
    ref_c = 16 if 16 in run_clients else (max(run_clients) if run_clients else None)

    w("# Benchmarks" + (": the prototype side by side" if "proto" in impls else ""))
    w("")
    w("<!-- written by bench/report.py from bench/results.tsv, bench/kv.tsv and "
      "bench/machine.txt; `make bench` rewrites it -->")
    w("")
    if smoke:
        w("**This is a smoke run (tiny sizes, transaction counts instead of durations): "
          "its numbers mean nothing.**")
        w("")
    w("The claim protocol three ways, measured side by side in one run on one throwaway "
      "cluster: **raw** — the seed's recipe in raw SQL (`INSERT … ON CONFLICT DO NOTHING "
      "RETURNING id`, then `UPDATE status = 'completed'`; the skip path reads the record; "
      "`bench/sql/raw.sql`, `bench/pgbench/raw_*.sql`); **portable** — the portable edition, "
      "the same SQL API in SQL and PL/pgSQL, as users install it: the plain script "
      "`portable/build.sh` writes (`idempotency-portable.sql`), run with `psql -f` into "
      "databases of its own in the same cluster (it creates schema `idempotency`, as the "
      "extension does), checked to give the same verdicts and SQLSTATEs as the extension "
      "(`bench/sql/verdicts.sql`) before it is timed, and timed with the extension's own "
      "pgbench scripts (`bench/pgbench/fn_*.sql`, `batch_*.sql`); **c** — the extension. The "
      "batch calls of both editions (`claim_operations()`, `complete_operations()`) are "
      "measured against their single calls and durable Redis in a section of their own "
      "(Batches).")
    if "proto" in impls:
        w("**proto** is another tree of the extension (`bench/run.sh --proto DIR`: a prototype "
          "of the C code), installed renamed to `idempotency_proto` (`bench/proto-rename.sh`), "
          "so the installed extension is not touched.")
    w("")
    w("Run it: `make bench` (about 16 minutes; `bench/run.sh --help` lists the settings). "
      "It builds and installs the extension, starts a throwaway cluster, runs every "
      "phase and rewrites this file, its figures `throughput.png` and `batch.png` and the raw data "
      "(`results.tsv`, `kv.tsv`, `machine.txt`). `make bench-smoke` runs every script "
      "with tiny sizes (the test suite does the same, without timing assertions).")
    w("")
    w("How it is measured: pgbench `-M prepared`, one operation per pgbench transaction "
      "(so ops/s = pgbench's tps), %s s per run, %s repetitions interleaved (the order of "
      "the implementations rotates), a CHECKPOINT before each run, autovacuum off (VACUUM "
      "between paths). Medians; a ratio is the median of the ratios within each repetition. WAL bytes and full-page images "
      "from `pg_current_wal_lsn()` and `pg_stat_wal`, transaction ids from "
      "`pg_current_snapshot()`'s xmax (no id is spent measuring), HOT from "
      "`pg_stat_user_tables`, latency percentiles from pgbench's per-transaction log. "
      "From 4 clients up every path is CPU-bound on 2 cores shared with pgbench, so the "
      "ratios say more than the absolute numbers." % (
          machine.get("mode", "").split("seconds=")[-1].split()[0] if "seconds=" in machine.get("mode", "") else "?",
          machine.get("mode", "").split("reps=")[-1].split()[0] if "reps=" in machine.get("mode", "") else "?"))
    w("")

    # ---------------------------------------------------------------- machine
    w("## Machine")
    w("")
    w("| | |")
    w("|---|---|")
    for k in ["date", "cpu", "cores", "memory", "os", "postgresql", "pgbench", "redis",
              "commit", "settings", "load_before", "load_after", "duration", "mode", "command"]:
        if k in machine:
            w("| %s | %s |" % (k, machine[k]))
    w("")
    w("The machine is shared with other work (load average above); absolute numbers "
      "are context only.")
    w("")

    # ---------------------------------------------------------------- targets
    targets = []

    def tgt(name, value, goal, ok):
        targets.append((name, value, goal, ok))

    portable_targets(cells, kv, w, impls)

    dup_clients = cells.clients("matrix", "dup")
    dref = 16 if 16 in dup_clients else (max(dup_clients) if dup_clients else None)
    if dref:
        c_dup = cells.med("matrix", "dup", "c", dref, "tps")
        pk_dup = cells.med("matrix", "dup", "pk", dref, "tps")
        raw_dup = cells.med("matrix", "dup", "raw", dref, "tps")
        r3 = cells.paired("matrix", "dup", "c", "pk", dref)
        tgt("duplicate path vs plain PK SELECT (%d clients)" % dref,
            "%s× (%s vs %s ops/s; raw recipe %s)" % (fmt(r3, 2), fmt(c_dup), fmt(pk_dup), fmt(raw_dup)),
            "≥ 0.8×", None if math.isnan(r3) else r3 >= 0.8)
        wal = sum(fnum(r["wal_bytes"]) for c in dup_clients for r in cells.get("matrix", "dup", "c", c))
        xids = sum(fnum(r["xids"]) for c in dup_clients for r in cells.get("matrix", "dup", "c", c))
        ops = sum(fnum(r["ops"]) for c in dup_clients for r in cells.get("matrix", "dup", "c", c))
        recs = {}
        for v in kv.get(("dupwal", "c"), []):
            for item in v.split():
                if ":" in item:
                    k, n = item.rsplit(":", 1)
                    recs[k] = recs.get(k, 0) + int(n)
        # background records (the bgwriter's RUNNING_XACTS, checkpoints) and
        # opportunistic page pruning, which any read of a page with dead
        # tuples may do (a plain SELECT too), are not writes of the claim
        claims_wrote = [k for k in recs if not k.startswith(("Standby/", "XLOG/")) and k != "Heap2/PRUNE"]
        detail = ", ".join("%s × %d" % (k, n) for k, n in sorted(recs.items())) or "none"
        tgt("duplicate path: WAL and xids",
            "%s xids; %s WAL bytes in %s duplicates (all dup runs), records: %s" % (
                fmt(xids), fmt(wal), fmt(ops), detail),
            "0 and 0", xids == 0 and (wal == 0 or (recs and not claims_wrote)))
    if kv1(kv, "sizes", "c.rows"):
        upd = fnum(kv1(kv, "sizes", "c.upd"))
        hot = fnum(kv1(kv, "sizes", "c.hot_upd"))
        share = 100.0 * hot / upd if upd else float("nan")
        tgt("claimed → completed is HOT", "%s %% (%s of %s updates)" % (fmt(share, 1), fmt(hot), fmt(upd)),
            "≥ 95 %", None if math.isnan(share) else share >= 95)
        rows_c = fnum(kv1(kv, "sizes", "c.rows"))
        bpo = fnum(kv1(kv, "sizes", "c.total_bytes")) / rows_c
        seq = ""
        if kv1(kv, "sizes", "c.seq.rows"):
            seq = "; %s B with one increasing stream of keys" % fmt(
                fnum(kv1(kv, "sizes", "c.seq.total_bytes")) / fnum(kv1(kv, "sizes", "c.seq.rows")))
        tgt("table + index bytes per completed operation", "%s B (keys %s from 4 clients%s)" % (
            fmt(bpo), kv1(kv, "sizes", "c.keys"), seq), "≤ 160 B", bpo <= 160)
        nidx = int(kv1(kv, "sizes", "c.indexes"))
        tgt("indexes on the hot table", str(nidx), "1", nidx == 1)
    if kv1(kv, "scale", "big_rows"):
        for c in (1, 4):
            big = cells.med("scale", "run", "c@big", c, "lat_mean_ms")
            small = cells.med("scale", "run", "c@small", c, "lat_mean_ms")
            r = ratio(big, small)
            if not math.isnan(r):
                tgt("run path latency, %s vs %s records (%d client%s)" % (
                    fmt(fnum(kv1(kv, "scale", "big_rows"))), fmt(fnum(kv1(kv, "scale", "small_rows"))), c, "" if c == 1 else "s"),
                    "%s× (%s vs %s ms mean)" % (fmt(r, 2), fmt(big, 3), fmt(small, 3)), "≤ 1.25×", r <= 1.25)
        # the target is the paced procedure's; purge_operations() (one
        # transaction) is shown next to it for comparison
        idle = lat_fields(kv1(kv, "purge", "idle"))
        paced = lat_fields(kv1(kv, "purge", "paced"))
        during = lat_fields(kv1(kv, "purge", "during"))
        # the paced purge against the idle run measured just before it
        # (run.sh since issue 30), else against the first idle run
        idle_paced = lat_fields(kv1(kv, "purge", "idle_paced"))
        just_before = " idle just before" if idle_paced else ""
        idle_paced = idle_paced or idle
        if idle_paced and paced and paced["count"] > 0:
            r = ratio(paced["p99"], idle_paced["p99"])
            tgt("run-path p99 during CALL idempotency.purge() of %s records (%s pages per transaction, %s ms pause)" % (
                fmt(fnum(kv1(kv, "purge", "paced.deleted", "nan"))), kv1(kv, "purge", "paced_pages", "?"),
                kv1(kv, "purge", "paced_pause_ms", "?")),
                "%s× (%s vs %s ms%s)" % (fmt(r, 2), fmt(paced["p99"], 2), fmt(idle_paced["p99"], 2), just_before), "≤ 2×", r <= 2)
        if idle and during and during["count"] > 0:
            r = ratio(during["p99"], idle["p99"])
            tgt("run-path p99 during purge_operations() of %s records (one transaction)" % fmt(fnum(kv1(kv, "purge", "during.deleted", "nan"))),
                "%s× (%s vs %s ms)" % (fmt(r, 2), fmt(during["p99"], 2), fmt(idle["p99"], 2)),
                "–" if paced else "≤ 2×", "comparison" if paced else r <= 2)

    if "proto" in impls and ref_c:
        r = cells.paired("matrix", "run", "proto", "raw", ref_c)
        tgt("*proto*: run path vs raw SQL (%d clients)" % ref_c, "%s×" % fmt(r, 2), "≥ 0.95×", None if math.isnan(r) else r >= 0.95)
    if "proto" in impls and dref:
        r = cells.paired("matrix", "dup", "proto", "pk", dref)
        tgt("*proto*: duplicate path vs plain PK SELECT (%d clients)" % dref, "%s×" % fmt(r, 2), "≥ 0.8×", None if math.isnan(r) else r >= 0.8)
    w("## Other targets of the C extension (issues 5 and 13)")
    w("")
    w("| target | measured | goal | |")
    w("|---|---|---|---|")
    for name, value, goal, ok in targets:
        w("| %s | %s | %s | %s |" % (name, value, goal, verdict(ok)))
    w("")
    if ref_c:
        redis_claim = med([fnum(r["tps"]) for r in cells.get("redis", "claim", "redis", ref_c)])
        redis_done = med([fnum(r["tps"]) for r in cells.get("redis", "done", "redis", ref_c)])
        if not math.isnan(redis_claim):
            comp = 1.0 / (1.0 / redis_claim + 1.0 / redis_done)
            c_run = cells.med("matrix", "run", "c", ref_c, "tps")
            w("Redis peer at %d clients: %s durable claims/s (`SET NX PX`), %s done-writes/s, so about "
              "%s claim+done operations/s; the extension's run path does %s, %s× of that. "
              "The Redis claim is neither transactional with the job's own writes nor fenced "
              "(a worker whose lock expired can still write `done`), and it has no verdicts, "
              "policies or audit." % (ref_c, fmt(redis_claim), fmt(redis_done), fmt(comp), fmt(c_run),
                                      fmt(ratio(c_run, comp), 2)))
            w("")

    batch_section(dirname, cells, kv, machine, w)

    w("![throughput vs clients](throughput.png)")
    w("")

    # ------------------------------------------------------------- throughput
    w("## Throughput (operations/s, median of the repetitions)")
    w("")
    for path in ["run", "dup", "tx", "stale", "mixed"]:
        cl = cells.clients("matrix", path)
        if not cl:
            continue
        list_impls = impls + (["pk"] if path == "dup" else [])
        w("### %s" % PATH_NAMES[path])
        w("")
        head = "| clients | " + " | ".join(list_impls) + " | portable / raw | c / raw | c / portable |"
        sep = "|---:|" + "---:|" * len(list_impls) + "---:|---:|---:|"
        if path == "dup":
            head += " portable / pk | c / pk |"
            sep += "---:|---:|"
        if "proto" in impls:
            head += " proto / c |"
            sep += "---:|"
        w(head)
        w(sep)
        for c in cl:
            vals = {i: cells.med("matrix", path, i, c, "tps") for i in list_impls}
            line = "| %d | " % c
            line += " | ".join("%s <sub>(%s–%s)</sub>" % ((fmt(vals[i]),) + tuple(fmt(x) for x in cells.spread("matrix", path, i, c)))
                               for i in list_impls)
            line += " | %s | %s | %s |" % (fmt(cells.paired("matrix", path, "portable", "raw", c), 2),
                                           fmt(cells.paired("matrix", path, "c", "raw", c), 2),
                                           fmt(cells.paired("matrix", path, "c", "portable", c), 2))
            if path == "dup":
                line += " %s | %s |" % (fmt(cells.paired("matrix", path, "portable", "pk", c), 2),
                                        fmt(cells.paired("matrix", path, "c", "pk", c), 2))
            if "proto" in impls:
                line += " %s |" % fmt(cells.paired("matrix", path, "proto", "c", c), 2)
            w(line)
        w("")
    w("Small numbers: the lowest and highest repetition. Ratios: the median of the ratios within "
      "each repetition (the runs of one repetition follow each other within seconds, so a burst of "
      "other load on the machine hits both sides of a ratio less often than it hits two medians).")
    w("")

    # -------------------------------------------------------------------- CPU
    w("## Server CPU per operation")
    w("")
    w("CPU time (user + system) of the backends of each pgbench run, read from the postmaster's "
      "`cutime`/`cstime` after the sessions ended, divided by the operations: microseconds per "
      "operation, median of the repetitions. It excludes pgbench and the background processes "
      "(WAL writer, checkpointer). From 4 clients up the cores are saturated, so this decides "
      "the throughput.")
    w("")
    cpu_impls = impls + ["pk"]
    w("| path | clients | " + " | ".join(cpu_impls) + " |")
    w("|---|---:|" + "---:|" * len(cpu_impls))
    for path in ["run", "dup", "tx", "stale", "mixed"]:
        for c in cells.clients("matrix", path):
            w("| %s | %d | %s |" % (path, c, " | ".join(
                fmt(cells.cpu_us("matrix", path, i, c), 1) if cells.get("matrix", path, i, c) else "" for i in cpu_impls)))
    w("")

    # --------------------------------------------------------------- latency
    w("## Latency (ms per operation: p50 / p95 / p99, median of the repetitions)")
    w("")
    w("| path | clients | " + " | ".join(impls) + " |")
    w("|---|---:|" + "---:|" * len(impls))
    for path in ["run", "dup", "tx", "stale", "mixed"]:
        for c in cells.clients("matrix", path):
            parts = []
            for i in impls:
                parts.append("%s / %s / %s" % tuple(fmt(cells.med("matrix", path, i, c, f), 2)
                                                     for f in ("p50_ms", "p95_ms", "p99_ms")))
            w("| %s | %d | %s |" % (path, c, " | ".join(parts)))
    w("")

    # ------------------------------------------------------------ per operation
    w("## Cost per operation")
    w("")
    if kv1(kv, "sizes", "c.rows"):
        w("Run path on fresh tables, %s operations by 4 clients, keys `%s` (like `ORD-1000001`); "
          "the numbers after the run, with nothing vacuumed:" % (
              fmt(fnum(kv1(kv, "sizes", "c.rows"))), kv1(kv, "sizes", "c.keys")))
        w("")
        w("| | " + " | ".join(impls) + " |")
        w("|---|" + "---:|" * len(impls))

        def srow(label, f):
            w("| %s | %s |" % (label, " | ".join(f(i) for i in impls)))

        def s(i, k):
            return fnum(kv1(kv, "sizes", "%s.%s" % (i, k)))

        srow("table + index bytes / op", lambda i: fmt(s(i, "total_bytes") / s(i, "rows")))
        srow("of which table (heap)", lambda i: fmt(s(i, "table_bytes") / s(i, "rows")))
        srow("of which indexes", lambda i: fmt(s(i, "index_bytes") / s(i, "rows")))
        srow("indexes", lambda i: fmt(s(i, "indexes")))
        srow("WAL bytes / op", lambda i: fmt(s(i, "wal_bytes") / s(i, "rows")))
        srow("WAL records / op", lambda i: fmt(s(i, "wal_records") / s(i, "rows"), 2))
        srow("full-page images / op", lambda i: fmt(s(i, "wal_fpi") / s(i, "rows"), 3))
        srow("transaction ids / op", lambda i: fmt(s(i, "xids") / s(i, "rows"), 2))
        srow("HOT share of updates", lambda i: "%s %%" % fmt(100.0 * s(i, "hot_upd") / s(i, "upd"), 1) if s(i, "upd") else "–")
        w("")
        if kv1(kv, "sizes", "c.seq.rows"):
            w("The same with one client, so one increasing stream of keys (`%s`): the index fills its "
              "pages to the btree fillfactor instead of splitting them in the middle:" % kv1(kv, "sizes", "c.seq.keys"))
            w("")
            w("| | " + " | ".join(impls) + " |")
            w("|---|" + "---:|" * len(impls))
            srow("table + index bytes / op", lambda i: fmt(s(i, "seq.total_bytes") / s(i, "seq.rows")))
            srow("of which table (heap)", lambda i: fmt(s(i, "seq.table_bytes") / s(i, "seq.rows")))
            srow("of which indexes", lambda i: fmt(s(i, "seq.index_bytes") / s(i, "seq.rows")))
            srow("WAL bytes / op", lambda i: fmt(s(i, "seq.wal_bytes") / s(i, "seq.rows")))
            srow("HOT share of updates", lambda i: "%s %%" % fmt(100.0 * s(i, "seq.hot_upd") / s(i, "seq.upd"), 1) if s(i, "seq.upd") else "–")
            w("")
    if ref_c:
        w("Per path, at %d clients (sums over the repetitions; a CHECKPOINT before each run, so "
          "the first change of each page writes a full-page image):" % ref_c)
        w("")
        w("| path | | " + " | ".join(impls) + " |")
        w("|---|---|" + "---:|" * len(impls))
        for path in ["run", "dup", "tx", "stale", "mixed"]:
            c = ref_c if ref_c in cells.clients("matrix", path) else (cells.clients("matrix", path) or [None])[-1]
            if c is None:
                continue
            w("| %s | WAL bytes / op | %s |" % (path, " | ".join(fmt(cells.per_op("matrix", path, i, c, "wal_bytes")) for i in impls)))
            w("| | full-page images / op | %s |" % " | ".join(fmt(cells.per_op("matrix", path, i, c, "wal_fpi"), 3) for i in impls))
            w("| | xids / op | %s |" % " | ".join(fmt(cells.per_op("matrix", path, i, c, "xids"), 3) for i in impls))
            w("| | HOT share | %s |" % " | ".join(
                ("%s %%" % fmt(cells.hot("matrix", path, i, c), 1)) if not math.isnan(cells.hot("matrix", path, i, c)) else "–"
                for i in impls))
        w("")

    # ------------------------------------------------------------------ scale
    if kv1(kv, "scale", "big_rows"):
        w("## Scale (C extension)")
        w("")
        w("Two databases in the same cluster: %s records vs %s (keys `ORD-00000001…` in order, "
          "like increasing order numbers; new keys go to the right edge of the index), run path "
          "interleaved between them. Loading took %s s; the big table is %s MB (table + index). "
          "Claim and complete: pgbench's per-statement average (`-r`)." % (
              fmt(fnum(kv1(kv, "scale", "big_rows"))), fmt(fnum(kv1(kv, "scale", "small_rows"))),
              kv1(kv, "scale", "load_seconds"), fmt(fnum(kv1(kv, "scale", "big_total_bytes")) / 1048576)))
        w("")
        w("| clients | records | ops/s | mean ms | p99 ms | claim ms | complete ms |")
        w("|---:|---|---:|---:|---:|---:|---:|")
        for c in (1, 4):
            for tag, label in (("small", kv1(kv, "scale", "small_rows")), ("big", kv1(kv, "scale", "big_rows"))):
                if not cells.get("scale", "run", "c@" + tag, c):
                    continue
                cl = med([fnum(x) for x in kv.get(("scale", "stmt_ms.%s.c%d.claim_operation" % (tag, c)), [])])
                co = med([fnum(x) for x in kv.get(("scale", "stmt_ms.%s.c%d.complete_operation" % (tag, c)), [])])
                w("| %d | %s | %s | %s | %s | %s | %s |" % (
                    c, fmt(fnum(label)), fmt(cells.med("scale", "run", "c@" + tag, c, "tps")),
                    fmt(cells.med("scale", "run", "c@" + tag, c, "lat_mean_ms"), 3),
                    fmt(cells.med("scale", "run", "c@" + tag, c, "p99_ms"), 3), fmt(cl, 3), fmt(co, 3)))
        w("")
        sb = med([fnum(x) for x in kv.get(("scale", "stale_claims_ms.big"), [])])
        ss = med([fnum(x) for x in kv.get(("scale", "stale_claims_ms.small"), [])])
        w("`stale_claims()`: %s ms on %s records with %s stale claims (median of 5), %s ms on %s records. "
          "Plan: `%s`." % (
              fmt(sb, 1), fmt(fnum(kv1(kv, "scale", "big_rows"))), kv1(kv, "scale", "stale_claims_rows.big"),
              fmt(ss, 1), fmt(fnum(kv1(kv, "scale", "small_rows"))),
              (kv1(kv, "scale", "stale_claims_plan") or "").strip(";").replace(";", " → ").replace("  ", " ")))
        w("")
        idle = lat_fields(kv1(kv, "purge", "idle"))
        if idle:
            w("Purging while the run path runs at a fixed %s ops/s with %s clients (pgbench `-R`; latency "
              "counts from the scheduled start). A CHECKPOINT before each purge, so the first change of "
              "each page writes a full-page image. *purge_operations()*: one call, one "
              "transaction (batches of %s rows). *idempotency.purge()*: the paced procedure, the same "
              "deletes in ranges of %s pages, one transaction each, %s ms pause after a range that deleted "
              "something, on as many expired records loaded again after the first purge." % (
                  kv1(kv, "purge", "rate"), kv1(kv, "purge", "clients"), kv1(kv, "purge", "batch", "10000"),
                  kv1(kv, "purge", "paced_pages", "?"), kv1(kv, "purge", "paced_pause_ms", "?")))
            w("")
            w("| run path | purge s | deleted | deleted/s | purge WAL MB | FPI | transactions | mean ms | p50 | p95 | p99 | max |")
            w("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
            w("| idle | | | | | | %s | %s | %s | %s | %s | %s |" % (
                fmt(idle["count"]), fmt(idle["mean"], 2), fmt(idle["p50"], 2), fmt(idle["p95"], 2),
                fmt(idle["p99"], 2), fmt(idle["max"], 2)))
            ip = lat_fields(kv1(kv, "purge", "idle_paced"))
            if ip:
                w("| idle, just before the paced purge | | | | | | %s | %s | %s | %s | %s | %s |" % (
                    fmt(ip["count"]), fmt(ip["mean"], 2), fmt(ip["p50"], 2), fmt(ip["p95"], 2),
                    fmt(ip["p99"], 2), fmt(ip["max"], 2)))
            for label, name in (("during", "during purge_operations()"), ("paced", "during CALL idempotency.purge()"),
                                ("throttled", "during the throttled SQL prototype")):
                d = lat_fields(kv1(kv, "purge", label))
                if not d:
                    continue
                deleted = fnum(kv1(kv, "purge", label + ".deleted"))
                secs = fnum(kv1(kv, "purge", label + ".seconds"))
                w("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                    name, fmt(secs, 1), fmt(deleted), fmt(ratio(deleted, secs)),
                    fmt(fnum(kv1(kv, "purge", label + ".wal_bytes")) / 1048576, 1),
                    fmt(fnum(kv1(kv, "purge", label + ".wal_fpi"))),
                    fmt(d["count"]), fmt(d["mean"], 2), fmt(d["p50"], 2), fmt(d["p95"], 2), fmt(d["p99"], 2), fmt(d["max"], 2)))
            w("")

    # ------------------------------------------------------------------ redis
    rcl = cells.clients("redis", "claim")
    if rcl:
        w("## Redis peer")
        w("")
        w("redis-server %s on 127.0.0.1, `appendonly yes`, `appendfsync always` (every write is on disk "
          "before the reply, like a committed claim), redis-benchmark. claim: `SET claim:<random> w1 NX PX "
          "600000`; done: `SET claim:<random> done` (the second write); duplicate: `SET NX` of an existing "
          "key (no write). claim+done is 1 / (1/claim + 1/done): both writes go through one fsync-bound "
          "server. The run path of the extension at the same client count is shown for comparison." % machine.get("redis", ""))
        w("")
        w("| clients | claim ops/s | done ops/s | claim+done ops/s | duplicate ops/s | claim p99 ms | c run path ops/s | c / Redis |")
        w("|---:|---:|---:|---:|---:|---:|---:|---:|")
        for c in rcl:
            cl = med([fnum(r["tps"]) for r in cells.get("redis", "claim", "redis", c)])
            dn = med([fnum(r["tps"]) for r in cells.get("redis", "done", "redis", c)])
            dp = med([fnum(r["tps"]) for r in cells.get("redis", "dup", "redis", c)])
            p99 = med([fnum(r["p99_ms"]) for r in cells.get("redis", "claim", "redis", c)])
            comp = 1.0 / (1.0 / cl + 1.0 / dn) if cl and dn else float("nan")
            crun = cells.med("matrix", "run", "c", c, "tps")
            w("| %d | %s | %s | %s | %s | %s | %s | %s |" % (c, fmt(cl), fmt(dn), fmt(comp), fmt(dp), fmt(p99, 2),
                                                          fmt(crun), fmt(ratio(crun, comp), 2)))
        w("")

    # ------------------------------------------------------------------- plot
    plot(dirname, cells, impls)

    # the hand-written sections, for the report in the repository only
    for name in ("portable.md", "analysis.md"):
        path = os.path.join(HERE, name)
        if (os.path.exists(path) and not smoke
                and os.path.realpath(dirname) == os.path.realpath(HERE)):
            w("")
            with open(path) as f:
                w(f.read().rstrip())
            w("")

    with open(os.path.join(dirname, "README.md"), "w") as f:
        f.write("\n".join(out) + "\n")
    return 0


# ------------------------------------------------------ the portable edition
def portable_targets(cells, kv, w, impls):
    """the issue's targets for the portable edition (and the C extension's
    run path), each a median of the ratios within the repetitions, with
    the ratio of every repetition"""
    if "portable" not in impls:
        return
    rows = []

    def judge(r, goal):
        if math.isnan(r):
            return None, ""
        if r >= goal:
            return True, ""
        return False, "; %s %% short of the goal" % fmt(100.0 * (1 - r / goal), 0)

    def each(lst):
        return ", ".join(fmt(x, 2) for x in lst)

    def matrix_row(label, path, a, b, goal):
        cl = cells.clients("matrix", path)
        if not cl:
            return
        c = 16 if 16 in cl else max(cl)
        lst = cells.paired_list("matrix", path, a, b, c)
        r = med(lst)
        ok, short = judge(r, goal)
        others = ", ".join("%d: %s×" % (x, fmt(cells.paired("matrix", path, a, b, x), 2)) for x in cl if x != c)
        rows.append((label % c, "%s× (%s vs %s ops/s; repetitions %s%s)%s" % (
            fmt(r, 2), fmt(cells.med("matrix", path, a, c, "tps")), fmt(cells.med("matrix", path, b, c, "tps")),
            each(lst), short, "<br>other client counts: " + others if others else ""),
            "≥ %s×" % fmt(goal, 2), ok))

    matrix_row("portable edition: run path vs raw SQL (%d clients)", "run", "portable", "raw", 0.80)
    matrix_row("C extension: run path vs raw SQL (%d clients)", "run", "c", "raw", 0.95)
    matrix_row("portable edition: duplicate path vs plain PK SELECT (%d clients)", "dup", "portable", "pk", 0.70)
    bcl = sorted({k[3] for k in cells.groups if k[0] == "batch" and k[2] == "pb10"})
    if bcl:
        c = bcl[-1]
        for path, what, goal in (("run", "run path: claim_operations() of 10 new keys, then "
                                  "complete_operations(), against claim_operation() + "
                                  "complete_operation() per key", 3.0),
                                 ("dup", "duplicate path: claim_operations() of 10 completed keys, "
                                  "against claim_operation() per key", None)):
            lst = cells.paired_list("batch", path, "pb10", "portable", c)
            r = med(lst)
            ok, short = judge(r, goal) if goal else ("comparison", "")
            rows.append(("portable edition: batches of 10, %s (%d clients, ops/s counting keys)" % (what, c),
                         "%s× (%s vs %s ops/s; repetitions %s%s)" % (
                             fmt(r, 2), fmt(cells.med("batch", path, "pb10", c, "tps")),
                             fmt(cells.med("batch", path, "portable", c, "tps")), each(lst), short),
                         "≥ %s×" % fmt(goal, 0) if goal else "–", ok))
    dup_cl = cells.clients("matrix", "dup")
    if dup_cl:
        wal = sum(fnum(r["wal_bytes"]) for c in dup_cl for r in cells.get("matrix", "dup", "portable", c))
        xids = sum(fnum(r["xids"]) for c in dup_cl for r in cells.get("matrix", "dup", "portable", c))
        ops = sum(fnum(r["ops"]) for c in dup_cl for r in cells.get("matrix", "dup", "portable", c))
        recs = {}
        for v in kv.get(("dupwal", "portable"), []):
            for item in v.split():
                if ":" in item:
                    k, n = item.rsplit(":", 1)
                    recs[k] = recs.get(k, 0) + int(n)
        wrote = [k for k in recs if not k.startswith(("Standby/", "XLOG/")) and k != "Heap2/PRUNE"]
        detail = ", ".join("%s × %d" % (k, n) for k, n in sorted(recs.items())) or "none"
        rows.append(("portable edition, duplicate path: WAL and xids (as the C extension's)",
                     "%s xids; %s WAL bytes in %s duplicates (all dup runs), records: %s" % (
                         fmt(xids), fmt(wal), fmt(ops), detail),
                     "0 and 0", xids == 0 and (wal == 0 or (bool(recs) and not wrote))))
    w("## Targets of the portable edition")
    w("")
    w("The issue's targets: the portable edition's run path (claim + complete of new keys) at least "
      "0.80× raw SQL while the C extension keeps at least 0.95×; its duplicate path (claim of a "
      "completed key) at least 0.70× a primary-key SELECT of the same record; its batches of 10 at "
      "least 3× its own single calls. Each ratio is the median of the ratios within the "
      "repetitions (listed), at 16 clients, where the 2 cores are saturated; the ratios at the "
      "other client counts are in the throughput tables below. The batches' duplicate path is "
      "shown for comparison; the last row checks that the portable edition's duplicate path, "
      "like the extension's, spends no transaction id and writes no WAL of its own.")
    w("")
    w("| target | measured | goal | |")
    w("|---|---|---|---|")
    for name, value, goal, ok in rows:
        w("| %s | %s | %s | %s |" % (name, value, goal, verdict(ok)))
    w("")


# ------------------------------------------------------------------ batches
def batch_section(dirname, cells, kv, machine, w):
    """the batch phase: batch calls against the single calls and Redis"""
    sizes = []
    for k in cells.groups:
        if k[0] == "batch" and k[2].startswith("b") and k[2][1:].isdigit():
            sizes.append(int(k[2][1:]))
    sizes = sorted(set(sizes))
    psizes = sorted({int(k[2][2:]) for k in cells.groups
                     if k[0] == "batch" and k[2].startswith("pb") and k[2][2:].isdigit()})
    cl = sorted({k[3] for k in cells.groups if k[0] == "batch"})
    if not sizes or not cl:
        return
    c = cl[-1]
    ncores = fnum(machine.get("cores", "2"))
    has_redis = bool(cells.get("batch", "redis_claim", "redis", c))

    def rep_vals(path, impl, field="tps"):
        return {r["rep"]: fnum(r[field]) for r in cells.get("batch", path, impl, c)}

    # the Redis pair per repetition: both writes through one fsync-bound
    # server, 1 / (1/claim + 1/done) operations/s
    pair = {}
    if has_redis:
        rc, rd = rep_vals("redis_claim", "redis"), rep_vals("redis_done", "redis")
        pair = {k: 1.0 / (1.0 / rc[k] + 1.0 / rd[k]) for k in rc if k in rd and rc[k] and rd[k]}

    def paired(path, a, b):
        ra = rep_vals(path, a)
        rb = pair if b == "pair" else rep_vals(path, b)
        return med([ra[k] / rb[k] for k in ra if k in rb and rb[k]])

    def cpu_of(path, impl, field):
        """median over the repetitions of field seconds * 1e6 / ops"""
        v = [fnum(r[field]) * 1e6 / fnum(r["ops"]) for r in cells.get("batch", path, impl, c)
             if r.get(field) not in (None, "") and fnum(r["ops"]) > 0]
        return med(v)

    def redis_pair_cpu(field):
        v = []
        for rep, _ in pair.items():
            s = 0.0
            for p in ("redis_claim", "redis_done"):
                rr = [r for r in cells.get("batch", p, "redis", c) if r["rep"] == rep]
                if not rr or rr[0].get(field) in (None, ""):
                    return float("nan")
                s += fnum(rr[0][field]) * 1e6 / fnum(rr[0]["ops"])
            v.append(s)
        return med(v)

    def stmt(path, impl, which):
        return med([fnum(x) for x in kv.get(("batch", "stmt_ms.%s.%s.%s" % (path, impl, which)), [])])

    def label(impl):
        if impl in ("c", "portable"):
            return "%s: single calls" % ("C" if impl == "c" else "portable")
        if impl.startswith("pb"):
            return "portable: batches of %s" % impl[2:]
        return "C: batches of %s" % impl[1:]

    def single_of(impl):
        return "portable" if impl.startswith("p") else "c"

    w("## Batches (issue 13)")
    w("")
    if plot_batch(dirname, cells):
        w("![batches against single calls and Redis](batch.png)")
        w("")
    w("`claim_operations()` and `complete_operations()` of each edition against the same "
      "edition's single calls, at %d clients, the extension in one database of this cluster and "
      "the portable edition in another, each with the same %s completed `DUP-` records; "
      "%s repetitions, interleaved (the order of the cells rotates). **Batch run path**: claim N "
      "new keys in one call, then complete those whose verdict is `run` in a second call, two "
      "transactions per batch as a consumer that holds N messages does "
      "(`bench/pgbench/batch_run.sql`). **Batch duplicate path**: claim N random keys of the "
      "completed pool in one call (`batch_dup.sql`). The single calls: `fn_run.sql` and "
      "`fn_dup.sql`, the matrix's scripts, run again here within the same repetitions. "
      "Operations/s count keys (a batch of 10 is 10 operations); latency is per pgbench "
      "transaction, i.e. per batch (claim + complete) against per operation (claim + complete) "
      "for the single calls. The key arrays are built by the server (`ARRAY(SELECT … FROM "
      "generate_series(1, N))`), which the CPU figures include. pgbench runs with `-r` in this "
      "phase (the mean per call below). After the phase every run-path key is checked: "
      "%s records completed, as many as operations counted, none left claimed." % (
          c, fmt(fnum(kv1(kv, "batch", "dup_pool", "nan"))) if kv1(kv, "batch", "dup_pool") else "pool of",
          machine.get("mode", "").split("reps=")[-1].split()[0] if "reps=" in machine.get("mode", "") else "?",
          " and ".join("%s (%s)" % (fmt(fnum(v)), e) for e, v in (
              ("C", kv1(kv, "batch", "checked_ops.c") or kv1(kv, "batch", "checked_ops", "nan")),
              ("portable", kv1(kv, "batch", "checked_ops.portable"))) if v)))
    w("")
    if has_redis:
        w("**Redis pair**: durable Redis (the redis phase's server setup: `appendonly yes`, "
          "`appendfsync always`, redis-benchmark with %d clients) measured in the same repetitions: "
          "a claim `SET claim:<random> w1 NX PX 600000` and a done `SET claim:<random> done` per "
          "operation, each measured by redis-benchmark, combined as 1 / (1/claim + 1/done) "
          "operations/s (both writes of a pair go through the one fsync-bound server); its latency "
          "is the claim's plus the done's percentile (the last column: the claim's and the done's p50). "
          "Duplicate: `SET NX` of an existing key." % c)
        w("")

    # targets
    single_run = cells.med("batch", "run", "c", c, "tps")
    single_dup = cells.med("batch", "dup", "c", c, "tps")
    rows = []
    for n in sizes:
        b = "b%d" % n
        r = paired("run", b, "c")
        rows.append(("batch run path, %d keys per call, vs the single-call run path" % n,
                     r, 5.0, cells.med("batch", "run", b, c, "tps"), single_run, "run", b))
        if has_redis:
            r = paired("run", b, "pair")
            rows.append(("batch run path, %d keys per call, vs durable Redis claim+done pairs" % n,
                         r, 2.0, cells.med("batch", "run", b, c, "tps"), med(list(pair.values())), "run", b))
        r = paired("dup", b, "c")
        rows.append(("batch duplicate path, %d keys per call, vs the single duplicate path" % n,
                     r, 3.0, cells.med("batch", "dup", b, c, "tps"), single_dup, "dup", b))
    # the portable edition: the goal, 3× its own single calls
    for n in psizes:
        b = "pb%d" % n
        for path, what in (("run", "run path"), ("dup", "duplicate path")):
            rows.append(("*portable*: batch %s, %d keys per call, vs its single calls" % (what, n),
                         paired(path, b, "portable"), 3.0 if path == "run" else None,
                         cells.med("batch", path, b, c, "tps"), cells.med("batch", path, "portable", c, "tps"),
                         path, b))
        if has_redis:
            rows.append(("*portable*: batch run path, %d keys per call, vs durable Redis claim+done pairs" % n,
                         paired("run", b, "pair"), None, cells.med("batch", "run", b, c, "tps"),
                         med(list(pair.values())), "run", b))
    w("| target (%d clients) | measured | goal | |" % c)
    w("|---|---|---|---|")
    for name, r, goal, a, bb, _, _ in rows:
        if goal is None:
            w("| %s | %s× (%s vs %s ops/s) | – | comparison |" % (name, fmt(r, 2), fmt(a), fmt(bb)))
            continue
        ok = None if math.isnan(r) else r >= goal
        miss = ""
        if ok is False:
            miss = "; short of the goal by %s %%" % fmt(100.0 * (1 - r / goal), 0)
        w("| %s | %s× (%s vs %s ops/s%s) | ≥ %s× | %s |" % (name, fmt(r, 2), fmt(a), fmt(bb), miss,
                                                       fmt(goal, 0), verdict(ok)))
    w("")
    w("A ratio is the median of the ratios within each repetition (the Redis pair of the same "
      "repetition); the issues' targets are for batches of 10 (issue 13 for the extension: 5× on "
      "the run path, 3× on the duplicate path; the portable edition's issue: 3× on the run path), "
      "those of 100 are shown against the same goals.")
    w("")

    # the table
    w("| path | cell | ops/s | × single | %sWAL B/op | xids/op | HOT | server CPU µs/op (backends + background) "
      "| pgbench µs/op | machine busy µs/op | latency per call ms p50 / p99 | claim / complete ms (mean, -r) |" %
      ("× Redis pair | " if has_redis else ""))
    w("|---|---|---:|---:|%s---:|---:|---:|---:|---:|---:|---:|---:|" % ("---:|" if has_redis else ""))
    for path in ("run", "dup"):
        for impl in ["c"] + ["b%d" % n for n in sizes] + ["portable"] + ["pb%d" % n for n in psizes]:
            if not cells.get("batch", path, impl, c):
                continue
            lo, hi = cells.spread("batch", path, impl, c)
            xs = paired(path, impl, single_of(impl)) if impl not in ("c", "portable") else 1.0
            xr = paired(path, impl, "pair") if path == "run" and has_redis else float("nan")
            be, bg = cpu_of(path, impl, "backend_cpu_s"), cpu_of(path, impl, "bg_cpu_s")
            hot = cells.hot("batch", path, impl, c)
            w("| %s | %s | %s <sub>(%s–%s)</sub> | %s | %s%s | %s | %s | %s (%s + %s) | %s | %s | %s / %s | %s / %s |" % (
                path, label(impl), fmt(cells.med("batch", path, impl, c, "tps")), fmt(lo), fmt(hi),
                fmt(xs, 2), (fmt(xr, 2) + " | ") if has_redis else "",
                fmt(cells.per_op("batch", path, impl, c, "wal_bytes")),
                fmt(cells.per_op("batch", path, impl, c, "xids"), 2),
                ("%s %%" % fmt(hot, 1)) if not math.isnan(hot) else "–",
                fmt(be + bg, 1), fmt(be, 1), fmt(bg, 1),
                fmt(cpu_of(path, impl, "client_cpu_s"), 1), fmt(cpu_of(path, impl, "machine_cpu_s"), 1),
                fmt(cells.med("batch", path, impl, c, "p50_ms"), 2), fmt(cells.med("batch", path, impl, c, "p99_ms"), 2),
                fmt(stmt(path, impl, "claim"), 3), fmt(stmt(path, impl, "complete"), 3) if path == "run" else "–"))
        if has_redis:
            if path == "run" and pair:
                lat = [cells.med("batch", p, "redis", c, f) for p in ("redis_claim", "redis_done") for f in ("p50_ms", "p99_ms")]
                w("| run | Redis claim+done pair | %s <sub>(%s–%s)</sub> | %s | 1.00 | – | – | – | %s (redis-server) | %s (redis-benchmark) | %s | ≈ %s / %s | %s / %s |" % (
                    fmt(med(list(pair.values()))), fmt(min(pair.values())), fmt(max(pair.values())),
                    fmt(ratio(med(list(pair.values())), single_run), 2),
                    fmt(redis_pair_cpu("backend_cpu_s"), 1), fmt(redis_pair_cpu("client_cpu_s"), 1),
                    fmt(redis_pair_cpu("machine_cpu_s"), 1),
                    fmt(lat[0] + lat[2], 2), fmt(lat[1] + lat[3], 2), fmt(lat[0], 2), fmt(lat[2], 2)))
            if path == "dup" and cells.get("batch", "dup", "redis", c):
                lo, hi = cells.spread("batch", "dup", "redis", c)
                w("| dup | Redis `SET NX` of an existing key | %s <sub>(%s–%s)</sub> | %s | – | – | – | – | %s (redis-server) | %s (redis-benchmark) | %s | %s / %s | – |" % (
                    fmt(cells.med("batch", "dup", "redis", c, "tps")), fmt(lo), fmt(hi),
                    fmt(paired("dup", "redis", "c"), 2), fmt(cpu_of("dup", "redis", "backend_cpu_s"), 1),
                    fmt(cpu_of("dup", "redis", "client_cpu_s"), 1), fmt(cpu_of("dup", "redis", "machine_cpu_s"), 1),
                    fmt(cells.med("batch", "dup", "redis", c, "p50_ms"), 2), fmt(cells.med("batch", "dup", "redis", c, "p99_ms"), 2)))
    w("")
    w("How CPU is measured, per run, divided by the operations (median of the repetitions): "
      "*backends*: user + system time of the sessions' server processes, from the postmaster's "
      "`cutime` + `cstime` in `/proc/<postmaster>/stat` after the sessions ended (the kernel adds "
      "a reaped child's time there); *background*: `utime` + `stime` of the postmaster and its "
      "children alive before and after (WAL writer, checkpointer, background writer, …), from "
      "`/proc/<pid>/stat`; *pgbench*: bash's `time` of the pgbench process (user + system, all "
      "its threads); *machine busy*: the whole machine's busy time from `/proc/stat` (user, nice, "
      "system, irq, softirq, steal, all %d CPUs) over the run: what is left after the three "
      "above is the kernel's share for them (network, fsync) and other work on the machine. "
      "The machine has %d cores, so at most %s µs of CPU per second." % (
          ncores, ncores, fmt(ncores * 1e6)))
    w("")
    shot = cells.hot("batch", "run", "c", c)
    for n in sizes:
        bhot = cells.hot("batch", "run", "b%d" % n, c)
        if not math.isnan(bhot) and bhot < 50:
            w("The completions of batches of %d were HOT updates only %s %% of the time (single calls: %s %%): "
              "the %d records one claim inserts fill the heap pages they land on, so the completions' new "
              "versions do not fit on the same page, and each completion adds a primary-key entry "
              "(WAL: %s B/op against %s B/op with batches of %s)." % (
                  n, fmt(bhot, 1), fmt(shot, 1), n, fmt(cells.per_op("batch", "run", "b%d" % n, c, "wal_bytes")),
                  fmt(cells.per_op("batch", "run", "b%d" % sizes[0], c, "wal_bytes")), sizes[0]))
            w("")
    others = [fnum(v) for (ph, name), vs in kv.items() if ph == "batch" and name.startswith("others.") for v in vs]
    others = [x for x in others if not math.isnan(x)]
    if others:
        busy = sorted(others)
        w("Other work on the machine: its busy share over half a second before each run of this "
          "phase, while the suite was idle, was %s %% of the %d cores at the median, %s %% at the "
          "most (%d samples); load average %s before the phase, %s after." % (
              fmt(100 * med(busy), 0), ncores, fmt(100 * busy[-1], 0), len(busy),
              kv1(kv, "batch", "load_before", "?"), kv1(kv, "batch", "load_after", "?")))
        w("")

    # why: the CPU per key bounds the throughput once the cores are busy
    notes = []
    for n in sizes:
        b = "b%d" % n
        s_srv = cpu_of("run", "c", "backend_cpu_s") + cpu_of("run", "c", "bg_cpu_s")
        b_srv = cpu_of("run", b, "backend_cpu_s") + cpu_of("run", b, "bg_cpu_s")
        s_all, b_all = cpu_of("run", "c", "machine_cpu_s"), cpu_of("run", b, "machine_cpu_s")
        s_busy = med([fnum(r["machine_cpu_s"]) / fnum(r["secs"]) / ncores for r in cells.get("batch", "run", "c", c)
                      if r.get("machine_cpu_s") not in (None, "") and fnum(r["secs"]) > 0])
        b_busy = med([fnum(r["machine_cpu_s"]) / fnum(r["secs"]) / ncores for r in cells.get("batch", "run", b, c)
                      if r.get("machine_cpu_s") not in (None, "") and fnum(r["secs"]) > 0])
        notes.append((n, s_srv, b_srv, s_all, b_all, s_busy, b_busy))
    if notes:
        w("What bounds the batch run path: the cores. Per operation (run path, the C extension):")
        w("")
        w("| | server CPU µs/op | machine busy µs/op | machine busy share during the runs | ceiling at %d cores (machine busy) |" % ncores)
        w("|---|---:|---:|---:|---:|")
        n0 = notes[0]
        w("| single calls | %s | %s | %s %% | %s ops/s |" % (fmt(n0[1], 1), fmt(n0[3], 1), fmt(100 * n0[5], 0),
                                                         fmt(ratio(ncores * 1e6, n0[3]))))
        for n, s_srv, b_srv, s_all, b_all, s_busy, b_busy in notes:
            w("| batches of %d | %s (%s× less) | %s (%s× less) | %s %% | %s ops/s |" % (
                n, fmt(b_srv, 1), fmt(ratio(s_srv, b_srv), 1), fmt(b_all, 1), fmt(ratio(s_all, b_all), 1),
                fmt(100 * b_busy, 0), fmt(ratio(ncores * 1e6, b_all))))
        w("")
        w("Once the machine is busy, operations/s is about (%d cores × 10⁶) / (busy µs per operation), "
          "so the batch's gain over the single calls cannot exceed the ratio of the machine-busy "
          "columns; the single path is also bounded by commit latency (two WAL flushes per operation), "
          "which the batch shares among N keys." % ncores)
        w("")
        if len(notes) >= 2:
            # server CPU per batch = fixed + per_key * N, from the two smallest sizes
            (n1, _, c1, _, _, _, _), (n2, _, c2, _, _, _, _) = notes[0], notes[1]
            per_key = (c2 * n2 - c1 * n1) / (n2 - n1)
            fixed = c1 * n1 - per_key * n1
            s_srv = notes[0][1]
            w("Server CPU per batch, fitted to batches of %d and %d: about %s µs per batch (two calls, two "
              "commits) plus %s µs per key. A single operation (two calls, two commits, one key) costs %s µs, "
              "so per key a batch of %d costs %s× less server CPU than single calls. For 5× in server CPU "
              "alone, a batch of %d would have to cost at most %s µs, i.e. at most %s µs per key next to "
              "the fixed %s µs." % (
                  n1, n2, fmt(fixed, 0), fmt(per_key, 1), fmt(s_srv, 1), n1, fmt(ratio(s_srv, c1), 1),
                  n1, fmt(s_srv / 5 * n1, 0),
                  fmt((s_srv / 5 * n1 - fixed) / n1, 1) if fixed < s_srv / 5 * n1 else "0 (the fixed part alone is above it)",
                  fmt(fixed, 0)))
            w("")
    # latency per batch against a single operation's
    s50, s99 = cells.med("batch", "run", "c", c, "p50_ms"), cells.med("batch", "run", "c", c, "p99_ms")
    parts = []
    for n in sizes:
        b50, b99 = cells.med("batch", "run", "b%d" % n, c, "p50_ms"), cells.med("batch", "run", "b%d" % n, c, "p99_ms")
        parts.append("a batch of %d takes %s ms at the median and %s ms at p99 (%s× and %s× a single "
                     "operation's; %s ms per key at the median)" % (
                         n, fmt(b50, 2), fmt(b99, 2), fmt(ratio(b50, s50), 1), fmt(ratio(b99, s99), 1),
                         fmt(b50 / n, 3)))
    if parts and not math.isnan(s50):
        w("Latency (run path, claim + complete, %d clients): a single operation takes %s ms at the median "
          "and %s ms at p99; %s." % (c, fmt(s50, 2), fmt(s99, 2), "; ".join(parts)))
        w("")


def plot_batch(dirname, cells):
    """batch.png: the batch phase's medians, run and duplicate paths"""
    cl = sorted({k[3] for k in cells.groups if k[0] == "batch"})
    sizes = sorted({int(k[2][1:]) for k in cells.groups
                    if k[0] == "batch" and k[2].startswith("b") and k[2][1:].isdigit()})
    if not cl or not sizes:
        return False
    c = cl[-1]
    rc = {r["rep"]: fnum(r["tps"]) for r in cells.get("batch", "redis_claim", "redis", c)}
    rd = {r["rep"]: fnum(r["tps"]) for r in cells.get("batch", "redis_done", "redis", c)}
    pair = med([1.0 / (1.0 / rc[k] + 1.0 / rd[k]) for k in rc if k in rd and rc[k] and rd[k]])
    data = scratch("batch.dat")
    panels = []
    for path in ("run", "dup"):
        rows = [("C single", cells.med("batch", path, "c", c, "tps"))]
        rows += [("C batches of %d" % n, cells.med("batch", path, "b%d" % n, c, "tps")) for n in sizes]
        psz = sorted({int(k[2][2:]) for k in cells.groups
                      if k[0] == "batch" and k[2].startswith("pb") and k[2][2:].isdigit()})
        if psz:
            rows.append(("portable single", cells.med("batch", path, "portable", c, "tps")))
            rows += [("portable batches of %d" % n, cells.med("batch", path, "pb%d" % n, c, "tps")) for n in psz]
        if path == "run":
            rows.append(("Redis claim+done", pair))
        else:
            rows.append(("Redis SET NX (dup)", cells.med("batch", "dup", "redis", c, "tps")))
        panels.append(rows)
    with open(data, "w") as f:
        for k, rows in enumerate(panels):
            if k:
                f.write("\n\n")
            for label, v in rows:
                f.write("\"%s\" %s\n" % (label, "NaN" if math.isnan(v) else "%.0f" % v))
    try:
        subprocess.run(["gnuplot", "--version"], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError):
        return False
    script = """
set terminal pngcairo size 1400,450 font 'sans,9'
set output '%s'
set multiplot layout 1,2
set xtics rotate by -30
set style fill solid 0.8 border -1
set boxwidth 0.6
set ylabel 'operations/s (median)'
set yrange [0:*]
set grid y
unset key
set title 'Run path at %d clients: claim, then complete'
plot '%s' index 0 using 0:2:xtic(1) with boxes lc rgb '#2ca02c', '' index 0 using 0:2:(sprintf('%%.0f', $2)) with labels offset 0,0.7
set title 'Duplicate path at %d clients: claim of completed keys'
plot '%s' index 1 using 0:2:xtic(1) with boxes lc rgb '#1f77b4', '' index 1 using 0:2:(sprintf('%%.0f', $2)) with labels offset 0,0.7
unset multiplot
""" % (os.path.join(dirname, "batch.png"), c, data, c, data)
    r = subprocess.run(["gnuplot"], input=script, text=True, capture_output=True)
    if r.returncode != 0:
        sys.stderr.write("report: gnuplot failed (batch.png):\n" + r.stderr)
        return False
    return True


def plot(dirname, cells, impls):
    data = scratch("throughput.dat")
    cl = cells.clients("matrix", "run")
    if not cl:
        return
    cols = impls + ["redis"]
    with open(data, "w") as f:
        f.write("# clients run:" + " ".join(cols) + " dup:" + " ".join(impls + ["pk"]) + "\n")
        for c in cl:
            vals = [cells.med("matrix", "run", i, c, "tps") for i in impls]
            rc = med([fnum(r["tps"]) for r in cells.get("redis", "claim", "redis", c)])
            rd = med([fnum(r["tps"]) for r in cells.get("redis", "done", "redis", c)])
            vals.append(1.0 / (1.0 / rc + 1.0 / rd) if not (math.isnan(rc) or math.isnan(rd)) else float("nan"))
            vals += [cells.med("matrix", "dup", i, c, "tps") for i in impls + ["pk"]]
            f.write("%d %s\n" % (c, " ".join("NaN" if math.isnan(v) else "%.1f" % v for v in vals)))
    try:
        subprocess.run(["gnuplot", "--version"], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError):
        sys.stderr.write("report: gnuplot not found, no plot (apt-get install gnuplot-nox)\n")
        return
    colors = {"raw": "#1f77b4", "portable": "#ff7f0e", "c": "#2ca02c", "proto": "#9467bd",
              "redis": "#d62728", "pk": "#7f7f7f"}
    n = len(impls)
    run_plots = []
    for k, i in enumerate(cols):
        dash = "dt 2" if i == "redis" else "dt 1"
        title = IMPL_NAMES[i] + (" (claim+done, estimated)" if i == "redis" else "")
        run_plots.append("'%s' using 1:%d with linespoints lw 2 pt 7 %s lc rgb '%s' title \"%s\"" % (
            data, k + 2, dash, colors[i], title))
    dup_plots = []
    for k, i in enumerate(impls + ["pk"]):
        dup_plots.append("'%s' using 1:%d with linespoints lw 2 pt 7 lc rgb '%s' title \"%s\"" % (
            data, n + 3 + k, colors[i], IMPL_NAMES[i]))
    script = """
set terminal pngcairo size 1200,500 font 'sans,10'
set output '%s'
set multiplot layout 1,2
set logscale x 2
set xtics (%s)
set xlabel 'pgbench clients'
set ylabel 'operations/s (median)'
set yrange [0:*]
set grid
set key top left
set title 'Run path: claim, then complete (two commits)'
plot %s
set title 'Duplicate path: claim of a completed key'
set key top right
plot %s
unset multiplot
""" % (os.path.join(dirname, "throughput.png"), ", ".join(str(c) for c in cl),
       ", ".join(run_plots), ", ".join(dup_plots))
    r = subprocess.run(["gnuplot"], input=script, text=True, capture_output=True)
    if r.returncode != 0:
        sys.stderr.write("report: gnuplot failed:\n" + r.stderr)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else HERE))
