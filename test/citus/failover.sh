#!/usr/bin/env bash
# test/citus/failover.sh: a worker node crashes during a run (issue 11,
# item 4, "Failures of a node"). On a throwaway cluster (test/citus/cluster.sh:
# coordinator + 2 workers), the extension installed on the coordinator and
# distributed with idempotency.distribute(), a job type 'failover' (policy
# hold, lease 5 minutes: no claim goes stale during the run), then
# test/citus/failover.py: 4 client threads race over the same 400 keys
# through the coordinator, each delivery claimed with its own delivery token,
# the effect recorded in memory, then completed; connection errors (class 08,
# 57P01-57P03) retried with the same step and token on a new connection for
# up to 60 s. After 80 completions worker w1 is stopped with
# `pg_ctl -m immediate` (a crash), kept down 5 s and started again. Checks,
# one line each (OK / WRONG): the calls for w1's keys failed with class 08
# and no call for w2's keys failed; w2's keys completed while w1 was down;
# after recovery every key is completed, none lost, none still claimed; every
# key's effect happened exactly once, with the record's attempt; the records
# completed before the crash are all there. Exit 0 when every check is OK,
# 1 when one is WRONG or the test could not run.
#
#   test/citus/failover.sh       (root or not: cluster.sh runs the servers as
#                                 postgres via runuser when root)
#
# About 25 s (cluster start ~8 s, the run ~16 s); bounded: the clients
# stop at 90 s, the whole script is killed after 170 s. Needs Citus
# (scripts/citus install, as root), the extension installed (make install
# with_llvm=no) and python3-psycopg. FAILOVER_* variables are passed on to
# failover.py (see its docstring; FAILOVER_NO_RETRY=1 and
# FAILOVER_NO_DELIVERY=1 are self-tests that must report WRONG).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)

"$root/scripts/citus" check >/dev/null || {
    echo "failover: Citus is not installed: scripts/citus install (root)" >&2
    exit 1
}
python=/usr/bin/python3    # Debian's, which sees Debian's modules
"$python" -c 'import psycopg' 2>/dev/null || {
    echo "failover: python3-psycopg is missing: apt-get install python3-psycopg" >&2
    exit 1
}

# shellcheck source=test/citus/cluster.sh
source "$here/cluster.sh"
citus_cluster_start
export PG_BINDIR    # failover.py runs pg_ctl to stop and start w1

[[ -f $("$PG_CONFIG" --sharedir)/extension/idempotency.control ]] || {
    echo "failover: idempotency is not installed: make install with_llvm=no (root)" >&2
    exit 1
}

echo "== install, distribute, job type"
citus_psql coord -e <<'EOF'
CREATE EXTENSION idempotency;
SELECT extname, extversion FROM pg_extension WHERE extname = 'idempotency';
SELECT idempotency.distribute();
INSERT INTO idempotency.job_types (job_type, lease, stale_policy)
VALUES ('failover', '5 minutes', 'hold');
EOF

echo "== the run"
set +e
timeout -k 5 170 "$python" "$here/failover.py"
rc=$?
set -e
if ((rc == 124 || rc == 137)); then
    echo "failover: failover.py did not finish in 170 s" >&2
fi
if ((rc != 0)); then
    echo "== w1's log (last lines)"
    grep -v -e "lock timeout" -e "^\s" -e "STATEMENT:" -e "CONTEXT:" "$CITUS_DIR/w1.log" 2>/dev/null | tail -n 15 || true
    echo "== the coordinator's log (last lines)"
    grep -v -e "lock timeout" -e "^\s" -e "STATEMENT:" -e "CONTEXT:" "$CITUS_DIR/coord.log" 2>/dev/null | tail -n 15 || true
fi
exit "$rc"
