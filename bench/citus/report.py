#!/usr/bin/python3
"""bench/citus/report.py: summary.md from a run of bench/citus/run.sh.

    report.py DIR      (DIR holds results.tsv and kv.tsv; prints Markdown)

Medians over the rounds; a ratio is the median of the ratios within each
round (the two runs of a round follow each other within seconds, so a burst
of other load on the machine hits both sides of a ratio more often than two
medians). CPU per operation: CPU seconds of a server (its postmaster and all
its children) over the run, divided by the operations (pgbench transactions);
machine: the whole machine's busy time over the run (all CPUs, includes other
work on a shared machine).
"""
import csv
import os
import statistics
import sys


def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def num(s):
    try:
        return float(s)
    except (TypeError, ValueError):
        return None


def fmt(v, digits=0):
    if v is None:
        return "–"
    if digits == 0:
        return f"{v:,.0f}".replace(",", " ")
    return f"{v:.{digits}f}"


def main(argv):
    d = argv[0]
    rows = list(csv.DictReader(open(os.path.join(d, "results.tsv")), delimiter="\t"))
    kv = {}
    for r in csv.DictReader(open(os.path.join(d, "kv.tsv")), delimiter="\t"):
        kv[r["name"]] = r["value"]
    for r in rows:
        for k in list(r):
            if k not in ("phase", "group", "path", "target"):
                r[k] = num(r[k])

    def runs(phase, group, path, target):
        return [r for r in rows if r["phase"] == phase and r["group"] == group
                and r["path"] == path and r["target"] == target]

    def per_op(rs, col):
        return med([r[col] * 1e6 / r["ops"] if r["ops"] else None for r in rs])

    def per_op_sum(rs, cols):
        return med([sum(r[c] for c in cols) * 1e6 / r["ops"] if r["ops"] else None for r in rs])

    def ratio(phase, group, path, a, b, col="tps"):
        ra = {r["round"]: r for r in runs(phase, group, path, a)}
        rb = {r["round"]: r for r in runs(phase, group, path, b)}
        vals = [rb[k][col] / ra[k][col] for k in ra if k in rb and ra[k][col]]
        return med(vals), (min(vals) if vals else None), (max(vals) if vals else None)

    def tps_cell(rs):
        t = [r["tps"] for r in rs]
        if not t:
            return "–"
        return f"{fmt(med(t))} <sub>({fmt(min(t))}–{fmt(max(t))})</sub>"

    out = []
    w = out.append
    w("# Citus benchmark: the numbers of one run")
    w("")
    w("<!-- written by bench/citus/report.py from results.tsv and kv.tsv; bench/citus/run.sh rewrites it -->")
    w("")
    w("| | |")
    w("|---|---|")
    for k in ("date", "command", "duration_s", "mode", "cpu", "cores", "memory", "os", "postgresql", "pgbench",
              "citus", "citus_extversion", "idempotency", "idempotency_so", "commit", "single_preload",
              "citus_preload", "idempotency_so_end", "settings", "citus_settings", "delegated_functions", "shards", "shards_w1",
              "dup_pool", "dup_pool_per_node", "dup_pool_on_w1", "load_before", "load_after", "others_share",
              "records_single", "records_citus", "records_per_worker", "records_claimed_left"):
        if k in kv:
            w(f"| {k} | {kv[k]} |")
    for k in sorted(kv):
        if k.startswith("connections_"):
            w(f"| {k} (client backends halfway through round 1) | {kv[k]} |")
    w("")

    cpu_cols = ("cpu_single_s", "cpu_coord_s", "cpu_w1_s", "cpu_w2_s")

    def cpu_cells(rs, target):
        if target == "single":
            return [fmt(per_op(rs, "cpu_single_s"), 1), "", "",
                    fmt(per_op(rs, "cpu_client_s"), 1), fmt(per_op(rs, "cpu_machine_s"), 1)]
        return ["", fmt(per_op(rs, "cpu_coord_s"), 1), fmt(per_op_sum(rs, ("cpu_w1_s", "cpu_w2_s")), 1),
                fmt(per_op(rs, "cpu_client_s"), 1), fmt(per_op(rs, "cpu_machine_s"), 1)]

    head = ("| path | where | tps | × first | p50 ms | p99 ms | server µs/op (single) | coordinator µs/op "
            "| workers µs/op | pgbench µs/op | machine µs/op |")
    sep = "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"

    def table(phase, groups):
        w(head)
        w(sep)
        for group, path, targets in groups:
            first = targets[0]
            for t in targets:
                rs = runs(phase, group, path, t)
                if not rs:
                    continue
                if t == first:
                    rcell = "1.00"
                else:
                    m, lo, hi = ratio(phase, group, path, first, t)
                    rcell = f"**{fmt(m, 3)}** <sub>({fmt(lo, 3)}–{fmt(hi, 3)})</sub>" if m is not None else "–"
                label = {"single": "single node", "coord": "Citus, via coordinator",
                         "w1": "Citus, clients on w1 (holds every key)",
                         "w1g": "the same, plan_cache_mode = force_generic_plan (diagnosis)",
                         "w1ip": "the same through the calls in place (0.4)",
                         "coordfn": "Citus, via coordinator: the extension's calls (fn_run / fn_dup)",
                         "any": "Citus, clients on w1 + w2 (random keys)"}[t]
                w(f"| {group}/{path} | {label} | {tps_cell(rs)} | {rcell} | {fmt(med([r['p50_ms'] for r in rs]), 2)} "
                  f"| {fmt(med([r['p99_ms'] for r in rs]), 2)} | " + " | ".join(cpu_cells(rs, t)) + " |")
        w("")

    nmain = len(runs("main", "run", "run", "single"))
    w(f"## Main: {kv.get('mode', '')}")
    w("")
    w("run = claim + complete of a new key, two autocommit calls (bench/pgbench/fn_run.sql); dup = claim of a "
      "completed key (fn_dup.sql). tps: median of the rounds (lowest–highest); × first: the median of the "
      "per-round ratios to the first line of the group.")
    w("")
    table("main", [("run", "run", ["single", "coord"]), ("dup", "dup", ["single", "coord"])])

    w("## Parts: where it goes")
    w("")
    w("pk: a plain primary-key SELECT of a completed record (bench/pgbench/pk_dup.sql); sql/run: the run path's "
      "INSERT + UPDATE as plain statements (pgbench/sql_run.sql); nd: the calls with WHERE now() IS NOT NULL, which Citus does "
      "not delegate (pgbench/nd_run.sql, nd_dup.sql); tx: each call of the run path in BEGIN … COMMIT "
      "(pgbench/tx_run.sql; delegated under force_delegation, see Verify); lk: the key read from a local table first, every key held by w1 "
      "(pgbench/lk_run.sql, lk_dup.sql; the single node runs the same lookups; w1g: the clients on w1 with "
      "plan_cache_mode = force_generic_plan, which Citus otherwise keeps from a generic plan: a diagnosis, not a setting to use; w1ip: the clients on w1 through the calls in place of 0.4, pgbench/ip_run.sql, ip_dup.sql); any: fn_run.sql / fn_dup.sql "
      "with half of the clients on each worker, against the coordinator.")
    w("")
    table("parts", [("pk", "pk", ["single", "coord", "coordfn"]), ("sql", "run", ["single", "coord", "coordfn"]),
                    ("nd", "run", ["single", "coord"]), ("nd", "dup", ["single", "coord"]),
                    ("tx", "run", ["single", "coord"]),
                    ("lk", "run", ["single", "w1", "w1g", "w1ip"]), ("lk", "dup", ["single", "w1", "w1g", "w1ip"]),
                    ("any", "run", ["coord", "any"]), ("any", "dup", ["coord", "any"])])

    w("## Latency with one client")
    w("")
    w("pgbench -c 1 -r: per transaction (mean of the rounds' means) and per statement (the claim, then the "
      "completion; pk: the SELECT).")
    w("")
    w("| path | single ms | Citus ms | Citus − single ms | × | single stmt1 / stmt2 ms | Citus stmt1 / stmt2 ms |")
    w("|---|---:|---:|---:|---:|---:|---:|")
    for path in ("run", "dup", "pk"):
        s = runs("lat", "lat", path, "single")
        c = runs("lat", "lat", path, "coord")
        if not s or not c:
            continue
        ms = med([r["lat_mean_ms"] for r in s])
        mc = med([r["lat_mean_ms"] for r in c])
        m, _, _ = ratio("lat", "lat", path, "single", "coord", "lat_mean_ms")

        def st(rs):
            a = med([r["stmt1_ms"] for r in rs])
            b = med([r["stmt2_ms"] for r in rs])
            return f"{fmt(a, 3)} / {fmt(b, 3)}" if path == "run" else fmt(a, 3)
        w(f"| {path} | {fmt(ms, 3)} | {fmt(mc, 3)} | {fmt(mc - ms, 3)} | {fmt(m, 2)} | {st(s)} | {st(c)} |")
    w("")

    w("## Verify: what Citus did, per pgbench transaction")
    w("")
    w("pgbench -c 1 -t 20 with citus.log_remote_commands (the session) and citus.log_local_commands (every "
      "node): pushed_down: calls Citus delegated; same_node: calls run where the client is connected because "
      "that node holds the key; calls_sent: claim/complete calls sent to another node; shard_stmts_sent: "
      "statements on a shard sent to another node; begin/commit_sent: transaction commands sent; prepare_2pc: "
      "two-phase commits; local_shard_stmts: statements a node ran on its own shards. verify.txt has "
      "examples of each.")
    w("")
    w("| script, where | per transaction |")
    w("|---|---|")
    for k in sorted(kv):
        if k.startswith("verify_"):
            w(f"| {k[7:]} | {kv[k]} |")
    w("")
    w("## Calls over every shard")
    w("")
    w("Median of 5 timings (psql \\timing), ms; tasks: statements the coordinator sent for one call.")
    w("")
    w("| call | ms | tasks |")
    w("|---|---|---|")
    for name in ("stale_claims", "job_type_stats"):
        if f"fanout_{name}_ms" in kv:
            w(f"| {name} | {kv[f'fanout_{name}_ms']} | {kv.get(f'fanout_{name}_tasks', '')} |")
    w("")
    if kv.get("perf") == "yes":
        w("## perf")
        w("")
        w("perf-run-coord.txt, perf-dup-coord.txt: CPU profiles (perf record -a -g) of the run and the duplicate "
          "path through the coordinator, per node.")
        w("")
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
