#!/usr/bin/env bash
# test/citus/memory.sh: a backend's memory stays flat over tens of thousands
# of calls on long-lived connections (issue 18), on a distributed install and
# on one plain node, in one run.
#
#   test/citus/memory.sh          # needs Citus and the extension installed
#
# Starts one plain PostgreSQL (scripts/cluster.sh) and a Citus coordinator
# with two workers (test/citus/cluster.sh), creates the extension on both,
# distributes the Citus one (idempotency.distribute()), adds the job type
# "memory" (hold, 5 minutes) and 1000 completed keys DUP-1 .. DUP-1000 on
# each, then runs test/citus/memory.py: every scenario (the run path, the
# duplicate path, a transaction block, the batch calls; through the
# coordinator, on a worker, on a worker through the calls in place of 0.4,
# on the plain node) makes 1000 calls of warm-up
# and then MEMORY_CALLS (20 000) calls on one connection, all scenarios at
# once; the private memory (RssAnon) of every backend serving them is read
# before and after, and one that grew by more than MEMORY_LIMIT_KB (4096)
# fails the test. Also an application's own delegated function, which must
# grow (Citus's growth: the measurement still sees it) and must not once
# ALTER FUNCTION ... SET plan_cache_mode = force_custom_plan, as the README
# advises. About 3 minutes on 2 cores.
#
# Without the fix of issue 18 (on Citus 13.2.x, plans kept with
# SPI_keepplan were generic, and Citus's local plan cache appended a new
# local plan to them at every execution on the node holding the shard), the
# workers' backends grew by about 70 kB per call.
#
# MEMORY_SCENARIOS=a,b runs a subset (memory.py lists them). Every server
# runs on a Unix socket only and is stopped on exit, error or Ctrl-C.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)

"$root/scripts/citus" check >/dev/null || {
    echo "memory: Citus is not installed: scripts/citus install (root)" >&2
    exit 1
}
python=/usr/bin/python3    # Debian's, which sees Debian's modules
"$python" -c 'import psycopg' 2>/dev/null || {
    echo "memory: python3-psycopg is missing: apt-get install python3-psycopg" >&2
    exit 1
}

# The plain node is a cluster of our own: not the one a caller (scripts/test,
# whose hooks get its CLUSTER_DIR and port) may have running
unset CLUSTER_DIR CLUSTER_PORT
# test/citus/cluster.sh sources scripts/cluster.sh (cluster_start, ...)
# shellcheck source=test/citus/cluster.sh
source "$here/cluster.sh"

[[ -f $("$PG_CONFIG" --sharedir)/extension/idempotency.control ]] || {
    echo "memory: idempotency is not installed: make install with_llvm=no (root)" >&2
    exit 1
}

mem_cleanup() {
    set +e
    citus_cluster_stop
    cluster_stop
}
unset CLUSTER_SETTINGS
cluster_start
trap 'rc=$?; mem_cleanup; exit $rc' EXIT
trap 'trap - EXIT; mem_cleanup; exit 130' INT
trap 'trap - EXIT; mem_cleanup; exit 143' TERM
trap 'trap - EXIT; mem_cleanup; exit 129' HUP
export PLAIN_HOST=$CLUSTER_DIR PLAIN_PORT=$PGPORT PLAIN_DB=postgres
citus_cluster_start --no-traps

setup='
CREATE EXTENSION idempotency;
INSERT INTO idempotency.job_types (job_type, lease, stale_policy) VALUES ('"'memory'"', '"'5 minutes'"', '"'hold'"');
INSERT INTO idempotency.operations (job_type, operation_key, status, attempt, claimed_at, heartbeat_at, completed_at)
SELECT '"'memory'"', '"'DUP-'"' || g, '"'completed'"', 1, now(), now(), now() FROM generate_series(1, 1000) g;'

echo "== the plain node: install, job type, 1000 completed keys"
psql -X -q -v ON_ERROR_STOP=1 -h "$PLAIN_HOST" -p "$PLAIN_PORT" -U postgres -d postgres -c "$setup"
echo "== Citus: install, distribute, job type, 1000 completed keys"
citus_psql coord -c "CREATE EXTENSION idempotency" -c "SELECT idempotency.distribute()"
citus_psql coord -c "${setup#*CREATE EXTENSION idempotency;}"
# an application's own delegated function on a colocated table, without and
# with the setting the README advises (memory.py: app_generic, app_custom)
citus_psql coord <<'EOF'
CREATE TABLE public.effects (operation_key text NOT NULL, n integer NOT NULL);
SELECT create_distributed_table('public.effects', 'operation_key', colocate_with => 'idempotency.operations');
CREATE FUNCTION public.app_effect(key text) RETURNS bigint LANGUAGE plpgsql AS $f$
DECLARE c bigint;
BEGIN
    INSERT INTO public.effects VALUES (key, 1);
    SELECT count(*) INTO c FROM public.effects WHERE operation_key = key;
    RETURN c;
END
$f$;
CREATE FUNCTION public.app_effect_custom(key text) RETURNS bigint LANGUAGE plpgsql AS $f$
DECLARE c bigint;
BEGIN
    INSERT INTO public.effects VALUES (key, 1);
    SELECT count(*) INTO c FROM public.effects WHERE operation_key = key;
    RETURN c;
END
$f$;
SELECT create_distributed_function(f, 'key', colocate_with => 'public.effects', force_delegation => true)
FROM unnest(ARRAY['public.app_effect(text)', 'public.app_effect_custom(text)']::regprocedure[]) f;
ALTER FUNCTION public.app_effect_custom(text) SET plan_cache_mode = force_custom_plan;
EOF
citus_psql coord -At -c "SELECT extversion FROM pg_extension WHERE extname = 'citus'" |
    sed 's/^/citus extension version: /'

echo "== the run"
export CITUS_DIR CITUS_DB CITUS_PORT_COORD CITUS_PORT_W1 CITUS_PORT_W2
set +e
timeout -k 5 900 "$python" "$here/memory.py"
rc=$?
set -e
((rc != 124 && rc != 137)) || echo "memory: memory.py did not finish in 900 s" >&2
exit "$rc"
