#!/usr/bin/python3
"""bench/citus/cure_rss.py: the memory of a server's backends during a run of
bench/citus/cure.sh.

    cure_rss.py INTERVAL NAME=POSTMASTER_PID ...

Every INTERVAL seconds, until SIGTERM or SIGINT, reads RssAnon (kB, from
/proc/PID/status) of every child of each postmaster, and which
idempotency.so each child has mapped (/proc/PID/maps; read once per child,
the first time it maps one). Then prints one line, tab-separated: for each
NAME in order, the largest RssAnon of one child seen, the largest sum over
its children in one sample, and the number of children seen with the
library mapped; last, the libraries mapped, as "DIR:COUNT,..." where DIR is
the name of the directory holding the file (cure.sh keeps the two builds in
.../before/ and .../after/), with "(deleted)" if the file was replaced.
"""
import os
import signal
import sys
import time

stop = False


def on_signal(signum, frame):
    global stop
    stop = True


def children_of():
    """{ppid: [pid, ...]} of every process now."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                s = f.read()
        except OSError:
            continue
        rest = s[s.rfind(")") + 2:].split()
        out.setdefault(int(rest[1]), []).append(int(d))
    return out


def rss_anon_kb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def mapped_lib(pid):
    """The idempotency.so a process has mapped, as DIR (or None)."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                if line.rstrip().endswith("idempotency.so") or "idempotency.so (deleted)" in line:
                    path = line.split(None, 5)[5].strip()
                    deleted = path.endswith(" (deleted)")
                    path = path.replace(" (deleted)", "")
                    label = os.path.basename(os.path.dirname(path))
                    return label + (" (deleted)" if deleted else "")
    except OSError:
        pass
    return None


def main(argv):
    interval = float(argv[1])
    nodes = []
    for a in argv[2:]:
        name, pid = a.split("=", 1)
        nodes.append((name, int(pid)))
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    max_one = {n: 0 for n, _ in nodes}
    max_sum = {n: 0 for n, _ in nodes}
    libs_seen = {}          # (node, pid) -> label
    while not stop:
        kids = children_of()
        for name, pm in nodes:
            total = 0
            for pid in kids.get(pm, []):
                kb = rss_anon_kb(pid)
                if kb is None:
                    continue
                total += kb
                max_one[name] = max(max_one[name], kb)
                if (name, pid) not in libs_seen:
                    label = mapped_lib(pid)
                    if label is not None:
                        libs_seen[(name, pid)] = label
            max_sum[name] = max(max_sum[name], total)
        end = time.monotonic() + interval
        while not stop and time.monotonic() < end:
            time.sleep(0.05)
    cols = []
    for name, _ in nodes:
        cols += [str(max_one[name]), str(max_sum[name]),
                 str(sum(1 for (n, _p) in libs_seen if n == name))]
    counts = {}
    for label in libs_seen.values():
        counts[label] = counts.get(label, 0) + 1
    cols.append(",".join(f"{k}:{v}" for k, v in sorted(counts.items())) or "none")
    print("\t".join(cols), flush=True)


if __name__ == "__main__":
    main(sys.argv)
