#!/usr/bin/python3
"""bench/compare_report.py: bench/compare.md from bench/compare.tsv.

    compare_report.py compare.tsv > compare.md

compare.tsv: "# key<TAB>value" lines (the run's settings), then one line per
pgbench run (bench/compare.sh). Medians over the rounds; a ratio is the
median of the ratios within each round (the runs of a round follow each
other within a minute, so a burst of other load hits both sides of a ratio
less often than it hits two medians).
"""
import statistics
import sys


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt_int(x):
    return "–" if x is None else f"{x:,.0f}".replace(",", " ")


def fmt(x, d=2):
    return "–" if x is None else f"{x:.{d}f}"


def main(path):
    kv = {}
    rows = []
    header = None
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith("# "):
                k, _, v = line[2:].partition("\t")
                kv[k] = v
            elif header is None:
                header = line.split("\t")
            elif line:
                rows.append(dict(zip(header, line.split("\t"))))
    for r in rows:
        for k in ("ops", "tps", "lat_avg_ms", "wal_bytes", "wal_records", "wal_fpi", "xids",
                  "backend_cpu_s", "bg_cpu_s", "client_cpu_s", "machine_cpu_s", "load1"):
            r[k] = float(r[k]) if r[k] not in ("", None) else None
        r["round"] = int(r["round"])
    rounds = sorted({r["round"] for r in rows})
    by = {(r["round"], r["cell"]): r for r in rows}
    cells = []
    for r in rows:
        if r["cell"] not in cells:
            cells.append(r["cell"])
    bs = next((c.split(".")[0][1:] for c in cells if c.startswith("b")), "10")

    def per_round(cell, fn):
        return [fn(by[(rd, cell)]) for rd in rounds if (rd, cell) in by]

    def ratio(num, den, key="tps"):
        out = []
        for rd in rounds:
            a, b = by.get((rd, num)), by.get((rd, den))
            if a and b and b[key]:
                out.append(a[key] / b[key])
        return med(out), out

    def cpu_us(r):
        return (r["backend_cpu_s"] + (r["bg_cpu_s"] or 0)) * 1e6 / r["ops"] if r["ops"] else None

    def ratio_of_ratios(n1, d1, n2, d2):
        out = []
        for rd in rounds:
            a, b, c, d = (by.get((rd, x)) for x in (n1, d1, n2, d2))
            if a and b and c and d and b["tps"] and c["tps"] and d["tps"]:
                out.append((a["tps"] / b["tps"]) / (c["tps"] / d["tps"]))
        return med(out)

    p = print
    before = kv.get("before", "?").split(" ")[0]
    after = kv.get("after", "?").split(" ")[0]
    p("# Before/after on one node: the library of two revisions side by side")
    p()
    p("<!-- written by bench/compare_report.py from bench/compare.tsv; `bench/compare.sh BEFORE AFTER` rewrites both -->")
    p()
    p(f"**BEFORE** `{kv.get('before', '?')}`  ")
    p(f"**AFTER** `{kv.get('after', '?')}`  ")
    p(f"Between them: {kv.get('src_commits', '?')} commits touching `src/` or the Makefile ({kv.get('src_diff', '?')}); "
      f"the SQL scripts and the control file are the same, so one `CREATE EXTENSION` serves both and only the "
      f"shared library differs (md5 {kv.get('so_before', '?')} / {kv.get('so_after', '?')}).")
    p()
    p("How: `bench/compare.sh` builds each library from `git archive` into a temp dir, starts one throwaway cluster "
      "(initdb, its own port and socket), and before each pgbench run points the extension's "
      f"{kv.get('c_functions', '?')} C functions at one library or the other (`pg_proc.probin`); every run opens "
      "new sessions, and the libraries each run's backends mapped are read from `/proc/PID/maps` (every run below "
      "mapped only its side's library; a reference run mapped none; the script fails otherwise). "
      f"pgbench `-M prepared`, {kv.get('mode', '?')}; in each round the cells of a group run back to back and their order "
      "changes per round (a group of three takes its six permutations in turn, a pair alternates); a CHECKPOINT before each run, autovacuum off, VACUUM at the start of a round. "
      "Medians over the rounds; a ratio is the median of the ratios within each round. CPU per operation: the "
      "server's (the run's sessions, from the postmaster's `cutime`/`cstime` after they ended, plus the background "
      "processes), in µs.")
    p()
    p("## Targets (issue 30, 'No regression on one node')")
    p()
    p(f"| target ({kv.get('mode', '').split(' ')[0].replace('clients=', '')} clients) | BEFORE {before} | AFTER {after} | AFTER / BEFORE | goal | |")
    p("|---|---:|---:|---:|---|---|")

    def verdict(x, goal):
        return "–" if x is None else ("**met**" if x >= goal else "**missed**")

    rb, _ = ratio("run.before", "raw")
    ra, _ = ratio("run.after", "raw")
    rr = ratio_of_ratios("run.after", "raw", "run.before", "raw")
    p(f"| run path / raw recipe | {fmt(rb)}× | {fmt(ra)}× | {fmt(rr)} | ≥ 0.84× (today's), aim ≥ 0.95× | "
      f"{verdict(ra, 0.84)} (0.84); {'met' if ra is not None and ra >= 0.95 else 'missed'} (0.95) |")
    db_, _ = ratio("dup.before", "pk")
    da, _ = ratio("dup.after", "pk")
    dr = ratio_of_ratios("dup.after", "pk", "dup.before", "pk")
    p(f"| duplicate path / primary-key SELECT | {fmt(db_)}× | {fmt(da)}× | {fmt(dr)} | ≥ 0.80× | {verdict(da, 0.80)} |")
    bb, _ = ratio(f"b{bs}.run.before", "run.before")
    ba, _ = ratio(f"b{bs}.run.after", "run.after")
    p(f"| batches of {bs} / single calls, run path | {fmt(bb)}× | {fmt(ba)}× | {fmt(ba / bb if ba and bb else None)} | ≥ 5× | {verdict(ba, 5.0)} |")
    bdb, _ = ratio(f"b{bs}.dup.before", "dup.before")
    bda, _ = ratio(f"b{bs}.dup.after", "dup.after")
    p(f"| batches of {bs} / single calls, duplicate path | {fmt(bdb)}× | {fmt(bda)}× | {fmt(bda / bdb if bda and bdb else None)} | ≥ 3× (issue 13) | {verdict(bda, 3.0)} |")

    def dupwal(side):
        w = o = x = n = 0
        for r in rows:
            if r["path"] == "dup" and r["side"] == side:
                w += r["wal_bytes"]
                o += r["ops"]
                x += r["xids"]
                n += r["wal_records"]
        return w, o, x, n
    wb = dupwal("before")
    wa = dupwal("after")
    # the records pg_waldump found in the duplicate runs of a side, by kind:
    # the background writer's Standby records and pruning (any reader
    # prunes) are not the claims'; anything else is
    def own_records(side):
        own = {}
        for k, v in kv.items():
            if not (k.startswith("dupwal.") and k.endswith("." + side)):
                continue
            for item in v.split():
                name, _, cnt = item.rpartition(":")
                if name.startswith("Standby/") or name == "Heap2/PRUNE":
                    continue
                own[name] = own.get(name, 0) + int(cnt)
        return own
    ob, oa = own_records("before"), own_records("after")

    def walcell(w, own):
        s = f"{fmt_int(w[0])} B in {fmt_int(w[1])} duplicates, {fmt_int(w[2])} xids; records of the claims: "
        return s + (", ".join(f"{k} {v}" for k, v in sorted(own.items())) if own else "none")
    p(f"| WAL on a duplicate (all duplicate runs, single and batch) | {walcell(wb, ob)} | {walcell(wa, oa)} | | 0 | "
      f"{'**met**' if not oa and wa[2] == 0 else '**missed**'} |")
    for side, cell in (("before", "run.before"), ("after", "run.after")):
        pass
    cb = med(per_round("run.before", cpu_us))
    ca = med(per_round("run.after", cpu_us))
    craw = med(per_round("raw", cpu_us))
    p(f"| server CPU per run-path operation, µs (raw recipe {fmt(craw, 1)}) | {fmt(cb, 1)} | {fmt(ca, 1)} | {fmt(ca / cb if ca and cb else None)} | no more than BEFORE | "
      f"{'**met**' if ca is not None and cb is not None and ca <= cb * 1.03 else '**check**'} |")
    cdb = med(per_round("dup.before", cpu_us))
    cda = med(per_round("dup.after", cpu_us))
    cpk = med(per_round("pk", cpu_us))
    p(f"| server CPU per duplicate, µs (PK SELECT {fmt(cpk, 1)}) | {fmt(cdb, 1)} | {fmt(cda, 1)} | {fmt(cda / cdb if cda and cdb else None)} | no more than BEFORE | "
      f"{'**met**' if cda is not None and cdb is not None and cda <= cdb * 1.03 else '**check**'} |")
    p()
    p("AFTER / BEFORE of a ratio to a reference: the median over the rounds of (AFTER / reference) / (BEFORE / reference) "
      "within each round; of CPU: the ratio of the medians. \"No more than BEFORE\" allows 3 % of noise.")
    p()
    p("## Every cell")
    p()
    p("| group | cell | library | ops/s (median; lowest–highest round) | AFTER / BEFORE (per-round median) | latency avg ms | server CPU µs/op | pgbench µs/op | machine busy µs/op | WAL B/op | xids/op |")
    p("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for cell in cells:
        rs = [by[(rd, cell)] for rd in rounds if (rd, cell) in by]
        if not rs:
            continue
        tps = [r["tps"] for r in rs]
        side = rs[0]["side"]
        ab = "–"
        if side == "after":
            other = cell.replace("after", "before")
            x, _ = ratio(cell, other)
            ab = fmt(x)
        ops = [r["ops"] for r in rs]
        p(f"| {rs[0]['group']} | {cell} | {side if side != 'ref' else 'none (reference)'} | {fmt_int(med(tps))} <sub>({fmt_int(min(tps))}–{fmt_int(max(tps))})</sub> | {ab} | "
          f"{fmt(med([r['lat_avg_ms'] for r in rs]), 3)} | {fmt(med([cpu_us(r) for r in rs]), 1)} | "
          f"{fmt(med([r['client_cpu_s'] * 1e6 / r['ops'] for r in rs if r['ops']]), 1)} | "
          f"{fmt(med([r['machine_cpu_s'] * 1e6 / r['ops'] for r in rs if r['ops']]), 1)} | "
          f"{fmt(sum(r['wal_bytes'] for r in rs) / sum(ops), 1)} | {fmt(sum(r['xids'] for r in rs) / sum(ops), 3)} |")
    p()
    p("Operations of a batch cell are keys (a batch of 10 is 10 operations); its latency is per batch. "
      "The run path's WAL and xids are per operation (two transactions each).")
    p()
    dw = {k: v for k, v in kv.items() if k.startswith("dupwal.")}
    if dw:
        p("WAL records written during duplicate runs of the extension (pg_waldump): " +
          "; ".join(f"{k[7:]}: {v}" for k, v in sorted(dw.items())) +
          ". The WAL bytes above are these records: the background writer's `Standby/RUNNING_XACTS` (every 15 s "
          "after other WAL) and `Heap2/PRUNE` of a page with dead versions (any read of it prunes, a plain SELECT too); "
          "\"records of the claims\" counts every other kind.")
        p()
    p("## Load")
    p()
    p("The machine has " + kv.get("cores", "?") + " cores and is shared with other work. Load average (1, 5, 15 min) "
      f"before the run {kv.get('load_before', '?')}, after it {kv.get('load_after', '?')}; per round:")
    p()
    p("| round | load at start | load at end | machine busy share during the round's runs |")
    p("|---:|---|---|---:|")
    cores = float(kv.get("cores", "2") or 2)
    for rd in rounds:
        rs = [r for r in rows if r["round"] == rd]
        busy = sum(r["machine_cpu_s"] for r in rs) / sum(float(r["secs"]) for r in rs) / cores
        p(f"| {rd} | {kv.get(f'round{rd}.load_start', '?')} | {kv.get(f'round{rd}.load_end', '?')} | {busy * 100:.0f} % |")
    p()
    p("## Machine")
    p()
    p("| | |")
    p("|---|---|")
    for k in ("date", "cpu", "cores", "memory", "os", "postgresql", "pgbench", "idempotency", "settings",
              "dup_pool", "mode", "records", "records_claimed_left", "duration_s", "command"):
        if k in kv:
            p(f"| {k} | {kv[k]} |")


if __name__ == "__main__":
    main(sys.argv[1])
