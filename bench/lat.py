#!/usr/bin/python3
"""bench/lat.py: latency percentiles from pgbench per-transaction logs (-l).

    lat.py [--from EPOCH] [--to EPOCH] LOGFILE...

Prints one line: count mean_ms p50_ms p95_ms p99_ms max_ms (nearest-rank
percentiles). A log line is "client_id transaction_no time script_no
time_epoch time_us [schedule_lag]"; time is the transaction's latency in
microseconds (with --rate it counts from the scheduled start), time_epoch and
time_us say when it ended. --from/--to keep only the transactions that ended
inside that window (seconds since the epoch, fractions allowed). Skipped or
failed transactions (a word instead of a time) are not counted.
"""
import math
import sys


def percentile(sorted_values, q):
    if not sorted_values:
        return float("nan")
    rank = max(1, math.ceil(q / 100.0 * len(sorted_values)))
    return sorted_values[rank - 1]


def main(argv):
    lo = hi = None
    files = []
    i = 0
    while i < len(argv):
        if argv[i] == "--from":
            lo = float(argv[i + 1])
            i += 2
        elif argv[i] == "--to":
            hi = float(argv[i + 1])
            i += 2
        else:
            files.append(argv[i])
            i += 1
    values = []
    for name in files:
        with open(name) as f:
            for line in f:
                parts = line.split()
                if len(parts) < 6 or not parts[2].isdigit():
                    continue
                if lo is not None or hi is not None:
                    end = int(parts[4]) + int(parts[5]) / 1e6
                    if (lo is not None and end < lo) or (hi is not None and end > hi):
                        continue
                values.append(int(parts[2]) / 1000.0)
    values.sort()
    if not values:
        print("0 nan nan nan nan nan")
        return 0
    mean = sum(values) / len(values)
    print("%d %.3f %.3f %.3f %.3f %.3f" % (
        len(values), mean, percentile(values, 50), percentile(values, 95),
        percentile(values, 99), values[-1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
