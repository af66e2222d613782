#!/usr/bin/python3
"""bench/compare_maps.py: which idempotency library the backends mapped.

    compare_maps.py POSTMASTER_PID LIBDIR

Until SIGTERM, every 0.2 s: each child of the postmaster not seen with a
library yet has its /proc/PID/maps read; a mapped file named idempotency.so
counts for the side whose directory holds it (LIBDIR/before/, LIBDIR/after/),
any other one as "installed". Then prints one line: "side:backends" for each
side seen, comma-separated ("before:16"), or "none".
"""
import os
import signal
import sys
import time

stop = False


def on_term(signum, frame):
    global stop
    stop = True


def children(ppid):
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                st = f.read()
        except OSError:
            continue
        fields = st[st.rindex(")") + 2:].split()
        if fields[1] == ppid:
            out.append(d)
    return out


def main(argv):
    pm, libdir = argv[0], os.path.realpath(argv[1])
    signal.signal(signal.SIGTERM, on_term)
    seen = {}
    while True:
        for pid in children(pm):
            if pid in seen:
                continue
            try:
                with open(f"/proc/{pid}/maps") as f:
                    maps = f.read()
            except OSError:
                continue
            for line in maps.splitlines():
                if line.endswith("idempotency.so"):
                    path = line.split(None, 5)[-1]
                    if path.startswith(libdir + "/before/"):
                        seen[pid] = "before"
                    elif path.startswith(libdir + "/after/"):
                        seen[pid] = "after"
                    else:
                        seen[pid] = "installed"
                    break
        if stop:
            break
        time.sleep(0.2)
    counts = {}
    for side in seen.values():
        counts[side] = counts.get(side, 0) + 1
    print(",".join(f"{k}:{v}" for k, v in sorted(counts.items())) or "none")


if __name__ == "__main__":
    main(sys.argv[1:])
