#!/usr/bin/python3
"""bench/citus/perfsplit.py: where the CPU goes, per server, from perf script.

    perfsplit.py PERF_SCRIPT_OUTPUT PIDMAP [OPERATIONS]

PIDMAP: lines "pid group" (group: coord, w1, w2, pgbench; other pids are
"other", the idle loop "idle"). Prints, per group, its share of all samples,
the functions with the most self time (the leaf frame) and the inclusive
share of chosen functions: the part of the group's samples whose call stack
contains the function (counted once per sample, also when it recurses).
OPERATIONS (the operations done during the recording, about tps x seconds):
also each group's samples per 1 000 operations, and each chosen function's,
so that two recordings (the extension's calls, the raw statements) compare
per operation and not only as shares; and each server's samples split by
what a backend was doing (the first named frame below PostgresMain: parse,
analysis, planning, PortalRun's execution, the commit, the socket), per
1 000 operations.
"""
import collections
import re
import sys

CHOSEN = [
    # how a statement arrives and is planned
    "exec_simple_query", "exec_parse_message", "exec_bind_message", "exec_execute_message",
    "pg_parse_query", "pg_analyze_and_rewrite_fixedparams", "pg_analyze_and_rewrite_varparams",
    "pg_plan_queries", "distributed_planner", "standard_planner", "TryToDelegateFunctionCall",
    "CreateDistributedPlannedStmt", "FastPathPlanner",
    # Citus's executor, locally and across nodes
    "CitusBeginScan", "CacheLocalPlanForShardQuery", "ExecuteLocalTaskListExtended", "LocallyExecuteTaskPlan",
    "AdaptiveExecutor", "RunDistributedExecution", "pg_get_query_def",
    # the extension, and the parts of a call on the key's worker
    "claim_operation", "complete_operation", "idem_execute", "SPI_execute_plan",
    "idem_claim_one", "idem_store_choose", "idem_probe", "idem_begin_worker",
    "idem_complete_one", "idem_fast_complete",
    # what every row write pays (the statements' and the calls')
    "standard_ExecutorStart", "ExecInitSeqScan", "ExecCheckIndexConstraints", "heap_insert",
    "btinsert", "SPI_execute_snapshot", "standard_ExecutorFinish",
    # transaction end, WAL
    "CommitTransactionCommand", "XLogFlush",
    # talking to the client or another node
    "pq_getbyte", "secure_read", "secure_write", "__send", "__libc_recv", "epoll_wait",
    "PQsendQueryParams", "PQgetResult",
]

HEADER = re.compile(r"^(\S.*?)\s+(\d+)\s+\[\d+\]\s+[\d.]+:")
FRAME = re.compile(r"^\s+[0-9a-f]+\s+(.*?)\s+\((.*)\)\s*$")


def main(argv):
    script, pidmap = argv[0], argv[1]
    ops = float(argv[2]) if len(argv) > 2 else 0.0
    ops = ops if ops > 0 else None
    group_of = {}
    for line in open(pidmap):
        parts = line.split()
        if len(parts) >= 2:
            group_of[parts[0]] = parts[1]
    total = 0
    samples = collections.Counter()
    selfs = collections.defaultdict(collections.Counter)
    incl = collections.defaultdict(collections.Counter)
    below = collections.defaultdict(collections.Counter)
    cur_group = None
    cur_frames = []

    def flush():
        nonlocal cur_group, cur_frames
        if cur_group is None:
            return
        samples[cur_group] += 1
        if cur_frames:
            leaf, dso = cur_frames[0]
            if leaf == "[unknown]":
                leaf = "[unknown] " + dso.rsplit("/", 1)[-1]
            selfs[cur_group][leaf] += 1
            seen = set()
            for name, _ in cur_frames:
                base = name.split("+0x")[0]
                if base in CHOSEN_SET and base not in seen:
                    seen.add(base)
                    incl[cur_group][base] += 1
            if any(d == "kernel.kallsyms]" or d.endswith("kernel.kallsyms]") for _, d in cur_frames[:1]):
                incl[cur_group]["(leaf in the kernel)"] += 1
            below[cur_group][below_main(cur_frames)] += 1
        cur_group = None
        cur_frames = []

    with open(script, errors="replace") as f:
        for line in f:
            m = HEADER.match(line)
            if m:
                flush()
                total += 1
                comm, pid = m.group(1), m.group(2)
                if pid == "0" or comm.startswith("swapper"):
                    cur_group = "idle"
                else:
                    cur_group = group_of.get(pid, "pgbench" if comm.startswith("pgbench") else "other")
                continue
            m = FRAME.match(line)
            if m and cur_group is not None:
                name = m.group(1).split("+0x")[0]
                cur_frames.append((name, m.group(2)))
        flush()
    if not total:
        print("no samples")
        return 0
    print("## share of all samples (both CPUs)")
    print()
    for g in ("coord", "w1", "w2", "pgbench", "other", "idle"):
        per_op = f"   {1000.0 * samples[g] / ops:7.1f} per 1 000 operations" if ops else ""
        print(f"    {g:<8} {100.0 * samples[g] / total:5.1f} %{per_op}")
    for g in ("coord", "w1", "w2"):
        n = samples[g]
        if not n:
            continue
        print()
        print(f"## {g}: {n} samples; top functions by self time (% of {g}'s samples)")
        print()
        for name, c in selfs[g].most_common(15):
            print(f"    {100.0 * c / n:5.1f} %  {name}")
        print()
        print(f"## {g}: inclusive share of chosen functions (% of {g}'s samples whose stack has it"
              + ("; then samples per 1 000 operations)" if ops else ")"))
        print()
        for name in CHOSEN + ["(leaf in the kernel)"]:
            c = incl[g][name]
            if c:
                per_op = f"  {1000.0 * c / ops:7.1f}" if ops else ""
                print(f"    {100.0 * c / n:5.1f} %{per_op}  {name}")
        if ops:
            print()
            print(f"## {g}: what its backends were doing, samples per 1 000 operations"
                  " (the first named frame below PostgresMain)")
            print()
            for name, c in below[g].most_common(12):
                print(f"    {1000.0 * c / ops:7.1f}  {name}")
    return 0


def below_main(frames):
    """The first named frame below PostgresMain (frames: leaf first, as read)."""
    names = [name for name, _ in frames]
    if "PostgresMain" not in names:
        return "(not below PostgresMain)"
    for name in reversed(names[:names.index("PostgresMain")]):
        if name != "[unknown]":
            return name
    return "(PostgresMain itself)"


CHOSEN_SET = set(CHOSEN)

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
