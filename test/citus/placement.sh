#!/usr/bin/env bash
# test/citus/placement.sh: shard placements change while clients race over
# the same keys (issue 20, "Correct while placements change"). On one
# throwaway cluster (test/citus/cluster.sh: coordinator + 2 workers, with
# wal_level = logical for the logical transfers and
# citus.defer_shard_delete_interval = -1: the maintenance daemon drops no
# old shard copy by itself), the extension installed on the coordinator and
# distributed with idempotency.distribute(), a table public.effects
# (operation_key, effect_id uuid, client, attempt, node; primary key
# (operation_key, effect_id)) distributed by operation_key and colocated
# with idempotency.operations, then test/citus/placement.py once per
# scenario, one after another on the same cluster:
#   move-block    citus_move_shard_placement(..., shard_transfer_mode => 'block_writes')
#   move-logical  the same with 'force_logical'
#   split         citus_split_shard_by_split_points(...), blocking
#                 ('block_writes'; PLACEMENT_SPLIT_MODE=force_logical for the
#                 non-blocking one, which hangs under concurrent UPDATEs
#                 with Citus 13.2.2: see placement.py)
#   rebalance     shards moved until the workers differ by 7 or more, then
#                 citus_rebalance_start(shard_transfer_mode => 'block_writes')
#                 and citus_rebalance_wait()
#   isolate       isolate_tenant_to_new_shard('idempotency.operations', KEY,
#                 'CASCADE', shard_transfer_mode => 'block_writes'), KEY one
#                 the clients keep claiming
# In each, 4 clients (2 on the coordinator, 1 on each worker) race over the
# same keys in the transactional mode (claim, effect row, completion in one
# transaction) while the change runs; afterwards every key must be completed
# with exactly one effect, the verdicts those of one node, no error but the
# transient kinds (retried), and no row written to an old copy of a moved or
# split shard (kept to the end; placement.py's docstring says how). One
# line per check (OK / WRONG). Exit 0 when every check of every scenario is
# OK, 1 otherwise.
#
#   test/citus/placement.sh                  (root or not, as cluster.sh)
#   PLACEMENT_SCENARIOS="move-block split" test/citus/placement.sh
#   PLACEMENT_WRITE_ORPHAN=1 test/citus/placement.sh   self-test: must say WRONG
#
# About 75 s on 2 idle cores (scripts/citus check and the cluster ~17 s,
# each scenario 6-13 s, the rebalancer's the longest); 2-4 minutes beside
# other jobs (129-231 s in 8 runs at load averages 9-16); bounded: each
# scenario's clients stop at 60 s and placement.py is killed after 100 s,
# so at worst about 10 minutes. Needs
# Citus (scripts/citus install, as root), the extension installed (make
# install with_llvm=no) and python3-psycopg. PLACEMENT_* variables are
# passed on to placement.py (see its docstring).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)

"$root/scripts/citus" check >/dev/null || {
    echo "placement: Citus is not installed: scripts/citus install (root)" >&2
    exit 1
}
python=/usr/bin/python3    # Debian's, which sees Debian's modules
"$python" -c 'import psycopg' 2>/dev/null || {
    echo "placement: python3-psycopg is missing: apt-get install python3-psycopg" >&2
    exit 1
}
scenarios=${PLACEMENT_SCENARIOS:-move-block move-logical split rebalance isolate}

# shellcheck source=test/citus/cluster.sh
source "$here/cluster.sh"
# the logical transfers need wal_level = logical; the old copies of moved
# shards are dropped only by the changes themselves (placement.py holds
# them), not every 15 s by the maintenance daemon; the background
# rebalancer's job starts within 0.5 s, not 5 s. A non-blocking split
# decodes with Citus's own output plugin, which since PostgreSQL 15.19
# must be listed in output_plugin_libraries (set where the server has it)
CITUS_SETTINGS="wal_level = logical
citus.defer_shard_delete_interval = -1
citus.background_task_queue_interval = '500ms'"
if "$("$PG_CONFIG" --bindir)/postgres" --describe-config 2>/dev/null | grep -q '^output_plugin_libraries'; then
    # shellcheck disable=SC2089 # the quotes are postgresql.conf's
    CITUS_SETTINGS+="
output_plugin_libraries = 'pgoutput, test_decoding, citus'"
fi
# shellcheck disable=SC2090 # cluster.sh writes it into postgresql.conf as is
export CITUS_SETTINGS
t_start=$SECONDS
citus_cluster_start

[[ -f $("$PG_CONFIG" --sharedir)/extension/idempotency.control ]] || {
    echo "placement: idempotency is not installed: make install with_llvm=no (root)" >&2
    exit 1
}

echo "== install, distribute, the effect table"
citus_psql coord -e <<'EOF'
CREATE EXTENSION idempotency;
SELECT extname, extversion FROM pg_extension WHERE extname = 'idempotency';
SELECT idempotency.distribute();
CREATE TABLE public.effects (
    operation_key text NOT NULL,
    effect_id uuid NOT NULL,
    client integer NOT NULL,
    attempt integer NOT NULL,
    node text NOT NULL,
    PRIMARY KEY (operation_key, effect_id));
SELECT create_distributed_table('public.effects', 'operation_key',
                                colocate_with => 'idempotency.operations');
EOF

status=0
declare -A took
for s in $scenarios; do
    echo "== $s"
    t=$SECONDS
    set +e
    timeout -k 5 100 "$python" "$here/placement.py" "$s"
    rc=$?
    set -e
    took[$s]=$((SECONDS - t))
    if ((rc == 124 || rc == 137)); then
        echo "placement: placement.py $s did not finish in 100 s" >&2
    fi
    if ((rc != 0)); then
        status=1
        for node in coord w1 w2; do
            echo "== $node's log (last lines)"
            grep -v -e "^\s" -e "STATEMENT:" -e "CONTEXT:" -e "DETAIL:" -e "HINT:" \
                -e "distributed query from a query on a shard" "$CITUS_DIR/$node.log" 2>/dev/null |
                tail -n 8 || true
        done
    fi
done
echo -n "placement: times:"
for s in $scenarios; do echo -n " $s ${took[$s]} s;"; done
echo " total $((SECONDS - t_start)) s (cluster start included)"
exit "$status"
