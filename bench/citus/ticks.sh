# shellcheck shell=bash
# bench/citus/ticks.sh: CPU ticks from /proc, sourced by bench/citus/run.sh
# and bench/citus/ab.sh (bash). HZ converts ticks to seconds.

# the whole machine's busy ticks (user, nice, system, irq, softirq, steal)
machine_ticks() { awk '$1 == "cpu" { print $2 + $3 + $4 + $7 + $8 + $9; exit }' /proc/stat; }
# node_ticks PID: CPU ticks of a postmaster and all its children: its own
# utime + stime + cutime + cstime (the reaped children: exited backends) and
# utime + stime of every child alive now
node_ticks() {
    local pm=$1 p
    {
        awk '{ sub(/^.*\) /, ""); print $12 + $13 + $14 + $15 }' "/proc/$pm/stat"
        for p in $(ps -o pid= --ppid "$pm" 2>/dev/null); do
            awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$p/stat" 2>/dev/null || true
        done
    } | awk '{ s += $1 } END { print s + 0 }'
}
# shellcheck disable=SC2034 # used by the scripts that source this
HZ=$(getconf CLK_TCK)
