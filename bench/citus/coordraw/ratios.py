#!/usr/bin/python3
"""bench/citus/coordraw/ratios.py: same-round ratios of bench/citus/run.sh's parts phase.

    ratios.py DIR [DIR ...]

DIR: an output directory of run.sh (its results.tsv). For each comparison
the parts phase made in the same rounds (coordfn / coord in the sql and pk
groups: tps; w1ip / single and w1 / single in the lk group: the servers' CPU
per op), the median of the per-round ratios and the rounds in their order.
With several directories, also the ratios of all their rounds pooled, and
how many of them are above 1.
"""
import csv
import statistics
import sys
from collections import defaultdict

COMPARISONS = (("sql", "coordfn", "coord", "tps"), ("pk", "coordfn", "coord", "tps"),
               ("lk", "w1ip", "single", "cpu"), ("lk", "w1", "single", "cpu"))
CPU_COLUMNS = ("cpu_single_s", "cpu_coord_s", "cpu_w1_s", "cpu_w2_s")


def cpu_per_op(r):
    return 1e6 * sum(float(r[k] or 0) for k in CPU_COLUMNS) / float(r["ops"])


def ratios(directory):
    """{(group, path, a, b, kind): [ratio per round, in round order]}"""
    rounds = defaultdict(dict)
    with open(directory + "/results.tsv") as f:
        for r in csv.DictReader(f, delimiter="\t"):
            if r["phase"] == "parts":
                rounds[(r["group"], r["path"], int(r["round"]))][r["target"]] = r
    out = defaultdict(list)
    for (group, path, _), t in sorted(rounds.items()):
        for g, a, b, kind in COMPARISONS:
            if g != group or a not in t or b not in t:
                continue
            if kind == "tps":
                x = float(t[a]["tps"]) / float(t[b]["tps"])
            else:
                x = cpu_per_op(t[a]) / cpu_per_op(t[b])
            out[(group, path, a, b, kind)].append(x)
    return out


def main(dirs):
    pooled = defaultdict(list)
    for d in dirs:
        for (g, path, a, b, kind), rat in sorted(ratios(d).items()):
            pooled[(g, path, a, b, kind)] += rat
            prefix = d + ": " if len(dirs) > 1 else ""
            print(f"{prefix}{g} {path} {a} / {b} {kind} median {statistics.median(rat):.3f} "
                  + " ".join(f"{x:.2f}" for x in rat))
    if len(dirs) > 1:
        for (g, path, a, b, kind), rat in sorted(pooled.items()):
            print(f"pooled: {g} {path} {a} / {b} {kind} median {statistics.median(rat):.3f}"
                  f" over {len(rat)} rounds, {sum(x > 1 for x in rat)} above 1")
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1:]))
