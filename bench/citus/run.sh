#!/usr/bin/env bash
# bench/citus/run.sh: the run and duplicate paths through Citus against one
# node on the same machine (issue 11, item 6); the report is
# bench/citus/README.md, the numbers of the last run summary.md.
#
#   bench/citus/run.sh [--quick] [--out DIR] [--no-perf]
#
# Starts two throwaway servers side by side and stops them at the end (also
# on error, Ctrl-C or a watchdog timeout):
#   single  one plain PostgreSQL (scripts/cluster.sh; shared_preload_libraries
#           unset), CREATE EXTENSION idempotency
#   citus   a coordinator and two workers (test/citus/cluster.sh), CREATE
#           EXTENSION idempotency on the coordinator, then
#           SELECT idempotency.distribute() (operations by operation_key, 32
#           hash shards; the four worker calls delegated by the key)
# with the same settings on every server, the same job type
# (send_confirmation, the defaults) and the same 100 000 completed records
# DUP-1 .. DUP-100000, then measures with pgbench -n -M prepared, keys unique
# per run (bench/pgbench/fn_run.sql etc.: the matrix's scripts):
#   verify  a few transactions of every script with citus.log_remote_commands
#           (coordinator) and citus.log_local_commands (workers): how many
#           calls were delegated, which statements went where (kv.tsv)
#   main    run path (claim + complete of a new key, two autocommit calls:
#           fn_run.sql) and duplicate path (claim of a completed key:
#           fn_dup.sql), single vs through the coordinator, $CB_CLIENTS
#           clients, $CB_ROUNDS rounds of $CB_SECONDS s, interleaved (the
#           order alternates per round)
#   parts   where it goes, $CB_PART_ROUNDS rounds of $CB_PART_SECONDS s:
#           pk (a plain primary-key SELECT of a completed record,
#           pk_dup.sql) and sql (the run path's INSERT + UPDATE as plain
#           statements, pgbench/sql_run.sql), single vs coordinator: Citus's
#           routing without the extension; nd (the calls with "WHERE
#           now() IS NOT NULL", which Citus does not delegate: the function
#           runs on the coordinator, its statements routed; pgbench/nd_*.sql)
#           and tx (each call of the run path in BEGIN ... COMMIT,
#           pgbench/tx_run.sql: delegated when distribute() used
#           force_delegation), single vs coordinator;
#           lk (keys read from a local table first, all held by worker w1,
#           pgbench/lk_*.sql), single vs clients on w1: a call on the worker
#           that holds the key; and w1g, the same clients
#           with plan_cache_mode = force_generic_plan (a diagnosis: Citus
#           keeps a statement that calls a distributed function from a
#           generic plan, see README.md); w1ip, the same clients through the
#           calls in place of 0.4 (pgbench/ip_*.sql); coordfn, in the pk and
#           sql groups, the extension's calls through the coordinator
#           (fn_dup.sql, fn_run.sql) in the same rounds as the raw routed
#           statements; any (clients split over w1 and w2, random
#           keys: "query from any node"), vs the coordinator
#   lat     run, dup and pk with 1 client ($CB_LAT_ROUNDS rounds of
#           $CB_LAT_SECONDS s, pgbench -r): the latency of one call
#   fanout  stale_claims() and the job_type_stats view (every shard), timed
#           on both
#   perf    (if perf works) perf record -a -g during $CB_PERF_SECONDS s of the
#           run path, then of the duplicate path, through the coordinator,
#           then of the raw routed statements they are compared with
#           (sql_run.sql, pk_dup.sql): where the CPU goes, per node, as
#           shares and per 1 000 operations (perf-run-coord.txt,
#           perf-dup-coord.txt, perf-raw-coord.txt, perf-pk-coord.txt)
# Per run: tps, latency (pgbench -l, bench/lat.py), the CPU of each server
# (its postmaster and all its children, living and reaped, /proc), of pgbench
# and of the whole machine (/proc/stat). bench/citus/report.py writes
# summary.md from results.tsv and kv.tsv.
#
# Options:
#   --quick    2 rounds of 3 s, 1 s parts, no perf (CB_PERF=yes: with it):
#              checks that everything works (about 3 minutes); output in a
#              temp dir (removed at the end; summary.md is printed) unless
#              --out
#   --out DIR  where results.tsv, kv.tsv, verify.txt, perf-*.txt and
#              summary.md go (default: bench/citus/ for a full run, about 12
#              minutes on the 2-core machine of the report)
#   --no-perf  skip the perf phase
# Settings (environment): CB_CLIENTS=16, CB_ROUNDS=5, CB_SECONDS=15,
# CB_PART_ROUNDS=3, CB_PART_SECONDS=4, CB_LAT_ROUNDS=3, CB_LAT_SECONDS=3,
# CB_PERF_SECONDS=6, CB_DUP_POOL=100000, CB_SHARED_BUFFERS=512MB,
# CB_MAX_SECONDS=1800 (the watchdog: the whole run is stopped and cleaned up
# after that long), CB_PARTS="pk sql nd tx lk any" (the parts phase's groups). PG_CONFIG / PG_MAJOR as scripts/versions.sh.
#
# Needs Citus installed for the PostgreSQL in use (scripts/citus check) and
# the extension installed (this script installs nothing). Run as root or as a
# user who can start servers (scripts/cluster.sh).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)

quick=no
out=""
perf_wanted=yes
die() { echo "citus-bench: error: $*" >&2; exit 1; }
log() { echo "citus-bench: $*" >&2 || true; }
while (($#)); do
    case $1 in
        --quick) quick=yes; shift ;;
        --out) [[ $# -ge 2 ]] || die "--out needs a directory"; out=$2; shift 2 ;;
        --no-perf) perf_wanted=no; shift ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) die "unknown argument: $1 (try --help)" ;;
    esac
done
if [[ $quick == yes ]]; then
    : "${CB_ROUNDS:=2}" "${CB_SECONDS:=3}" "${CB_PART_ROUNDS:=2}" "${CB_PART_SECONDS:=1}"
    : "${CB_LAT_ROUNDS:=1}" "${CB_LAT_SECONDS:=1}" "${CB_DUP_POOL:=10000}" "${CB_PERF_SECONDS:=2}"
    [[ ${CB_PERF:-no} == yes ]] || perf_wanted=no
fi
: "${CB_CLIENTS:=16}" "${CB_ROUNDS:=5}" "${CB_SECONDS:=15}" "${CB_PART_ROUNDS:=3}" "${CB_PART_SECONDS:=4}"
: "${CB_LAT_ROUNDS:=3}" "${CB_LAT_SECONDS:=3}" "${CB_PERF_SECONDS:=6}" "${CB_DUP_POOL:=100000}"
: "${CB_SHARED_BUFFERS:=512MB}" "${CB_MAX_SECONDS:=1800}"
((CB_CLIENTS >= 2 && CB_CLIENTS % 2 == 0)) || die "CB_CLIENTS must be even and at least 2 (the 'any' runs split them over two workers)"

started=$SECONDS
cmdline="bench/citus/run.sh${*:+ $*}"
[[ $quick == no ]] || cmdline="bench/citus/run.sh --quick"
work=$(mktemp -d "${TMPDIR:-/tmp}/citus-bench.XXXXXX")
chmod 755 "$work"
if [[ -z $out ]]; then
    if [[ $quick == yes ]]; then out=$work/out; else out=$here; fi
fi
mkdir -p "$out" "$work/logs" "$work/scripts"
results=$work/results.tsv
kv=$work/kv.tsv
printf 'phase\tgroup\tpath\ttarget\tclients\tround\tsecs\tops\ttps\tlat_mean_ms\tp50_ms\tp95_ms\tp99_ms\tcpu_single_s\tcpu_coord_s\tcpu_w1_s\tcpu_w2_s\tcpu_client_s\tcpu_machine_s\tstmt1_ms\tstmt2_ms\n' >"$results"
printf 'name\tvalue\n' >"$kv"
kvput() { printf '%s\t%s\n' "$1" "$2" >>"$kv"; }

command -v pgbench >/dev/null || die "pgbench not found"
[[ -x /usr/bin/python3 ]] || die "python3 not found (bench/lat.py, report.py)"

# ------------------------------------------------------------ the servers
# test/citus/cluster.sh sources scripts/cluster.sh (cluster_start, ...)
# shellcheck source=test/citus/cluster.sh
source "$root/test/citus/cluster.sh"

watchdog=""
bg_pids=()
cb_cleanup() {
    set +e
    trap '' PIPE
    local p
    for p in "${bg_pids[@]}"; do kill -INT "$p" 2>/dev/null; done
    if [[ -n $watchdog ]]; then kill "$watchdog" 2>/dev/null; wait "$watchdog" 2>/dev/null; fi
    watchdog=""
    citus_cluster_stop
    cluster_stop
    rm -rf "$work"
}

common_settings=(shared_buffers="$CB_SHARED_BUFFERS" autovacuum=off checkpoint_timeout=1h max_wal_size=20GB
                 max_connections=100)
unset CLUSTER_SETTINGS
single_args=()
for s in "${common_settings[@]}"; do single_args+=(-c "$s"); done
log "starting the single node (plain PostgreSQL)"
cluster_start "${single_args[@]}"
# cluster_start set its traps; ours stop both clusters
trap 'rc=$?; cb_cleanup; exit $rc' EXIT
trap 'trap - EXIT; log "interrupted"; cb_cleanup; exit 130' INT
trap 'trap - EXIT; log "terminated"; cb_cleanup; exit 143' TERM
trap 'trap - EXIT; cb_cleanup; exit 129' HUP
S_DIR=$CLUSTER_DIR S_PORT=$PGPORT S_PID=$(head -n 1 "$CLUSTER_DIR/data/postmaster.pid")
# the watchdog: a TERM to this script after CB_MAX_SECONDS (the trap cleans up)
(
    trap 'kill "$sp" 2>/dev/null; exit 0' TERM
    sleep "$CB_MAX_SECONDS" &
    sp=$!
    wait "$sp"
    echo "citus-bench: watchdog: $CB_MAX_SECONDS s, stopping" >&2
    kill -TERM $$
) &
watchdog=$!

# postgresql.conf lines, quotes included (test/citus/cluster.sh appends them)
# shellcheck disable=SC2089,SC2090
CITUS_SETTINGS=""
# shellcheck disable=SC2089
for s in "${common_settings[@]}"; do CITUS_SETTINGS+="${s%%=*} = '${s#*=}'"$'\n'; done
# shellcheck disable=SC2090
export CITUS_SETTINGS
log "starting the Citus cluster (coordinator + 2 workers)"
citus_cluster_start --no-traps
C_DIR=$CITUS_DIR
# w1g: w1's clients with plan_cache_mode = force_generic_plan (a diagnosis of
# the run path's cost on the worker, not a setting to use: see README.md)
# w1ip: w1's clients through the calls in place (0.4: pgbench/ip_*.sql);
# coordfn: the coordinator running the extension's calls (fn_run.sql in the
# sql group, fn_dup.sql in the pk group) in the same rounds as the raw
# routed statements they are compared with
declare -A PORT=([single]=$S_PORT [coord]=$CITUS_PORT_COORD [w1]=$CITUS_PORT_W1 [w2]=$CITUS_PORT_W2 [w1g]=$CITUS_PORT_W1
                 [w1ip]=$CITUS_PORT_W1 [coordfn]=$CITUS_PORT_COORD)
declare -A HOST=([single]=$S_DIR [coord]=$C_DIR [w1]=$C_DIR [w2]=$C_DIR [w1g]=$C_DIR [w1ip]=$C_DIR [coordfn]=$C_DIR)
declare -A DB=([single]=bench [coord]=$CITUS_DB [w1]=$CITUS_DB [w2]=$CITUS_DB [w1g]=$CITUS_DB [w1ip]=$CITUS_DB
               [coordfn]=$CITUS_DB)
declare -A PMPID=([single]=$S_PID)
for n in coord w1 w2; do PMPID[$n]=$(head -n 1 "$C_DIR/$n/postmaster.pid"); done
NODES=(single coord w1 w2)
unset PGHOST PGPORT PGDATABASE

# sql NODE [psql args]: psql on NODE's database, quiet, stop on error, with a
# statement timeout (only the benchmark's own sessions)
sql() {
    local n=$1
    shift
    PGOPTIONS="-c statement_timeout=600s -c client_min_messages=warning" \
        psql -X -q -v ON_ERROR_STOP=1 -h "${HOST[$n]}" -p "${PORT[$n]}" -U postgres -d "${DB[$n]}" "$@"
}
val() { sql "$1" -At -c "$2"; }

sql single -d postgres -c "CREATE DATABASE bench"
for n in single coord; do
    sql "$n" -c "CREATE EXTENSION idempotency"
done
val coord "SELECT idempotency.distribute()" >/dev/null
for n in single coord; do
    sql "$n" -c "INSERT INTO idempotency.job_types (job_type) VALUES ('send_confirmation')"
    sql "$n" -c "INSERT INTO idempotency.operations (job_type, operation_key, status, attempt,
                     claimed_at, heartbeat_at, completed_at)
                 SELECT 'send_confirmation', 'DUP-' || g, 'completed', 1,
                     now() - interval '1 day', now() - interval '1 day', now() - interval '1 day'
                 FROM generate_series(1, $CB_DUP_POOL) g"
done

# the keys worker w1 holds: DUP- records of the pool, new LR- keys
w1_shards="SELECT s.shardid FROM pg_dist_shard s JOIN pg_dist_placement p USING (shardid)
           JOIN pg_dist_node d ON d.groupid = p.groupid
           WHERE s.logicalrelid = 'idempotency.operations'::regclass AND d.nodeport = ${PORT[w1]}"
LSTRIDE=8000
lk_rows=$((CB_PART_ROUNDS * CB_CLIENTS * LSTRIDE + CB_CLIENTS * LSTRIDE))
# w1, w1g and w1ip each use lk_rows rows (w1g from lk_rows + 1 on, w1ip from
# 2 * lk_rows + 1); about half the generated keys fall on w1's shards
for n in single w1; do
    sql "$n" -c "CREATE TABLE public.cb_run_keys (i int PRIMARY KEY, k text NOT NULL)" \
             -c "CREATE TABLE public.cb_dup_keys (i int PRIMARY KEY, k text NOT NULL)"
done
sql coord -c "\\copy (SELECT row_number() OVER (ORDER BY g), 'LR-' || g FROM generate_series(1, $((lk_rows * 6 + lk_rows / 2))) g
                     WHERE get_shard_id_for_distribution_column('idempotency.operations', 'LR-' || g) IN ($w1_shards)) TO '$work/run_keys.tsv'"
sql coord -c "\\copy (SELECT row_number() OVER (ORDER BY g), 'DUP-' || g FROM generate_series(1, $CB_DUP_POOL) g
                     WHERE get_shard_id_for_distribution_column('idempotency.operations', 'DUP-' || g) IN ($w1_shards)) TO '$work/dup_keys.tsv'"
nrun=$(wc -l <"$work/run_keys.tsv")
LDUPN=$(wc -l <"$work/dup_keys.tsv")
((nrun >= 3 * lk_rows)) || die "only $nrun LR- keys on w1, $((3 * lk_rows)) needed"
for n in single w1; do
    sql "$n" -c "\\copy public.cb_run_keys FROM '$work/run_keys.tsv'" -c "\\copy public.cb_dup_keys FROM '$work/dup_keys.tsv'"
done
for n in single coord w1; do sql "$n" -c "VACUUM ANALYZE"; done
sql w2 -c "VACUUM ANALYZE"
kvput dup_pool "$CB_DUP_POOL"
kvput dup_pool_on_w1 "$LDUPN"
kvput shards "$(val coord "SELECT count(*) FROM pg_dist_shard WHERE logicalrelid = 'idempotency.operations'::regclass")"
kvput shards_w1 "$(val coord "SELECT count(*) FROM ($w1_shards) s")"
kvput dup_pool_per_node "$(val coord "SELECT string_agg(nodeport::text || ':' || n, ' ' ORDER BY nodeport) FROM (
    SELECT d.nodeport, count(*) AS n FROM generate_series(1, $CB_DUP_POOL) g
    JOIN pg_dist_placement p ON p.shardid = get_shard_id_for_distribution_column('idempotency.operations', 'DUP-' || g)
    JOIN pg_dist_node d ON d.groupid = p.groupid GROUP BY d.nodeport) x")"

# --------------------------------------------------------------- machine
kvput date "$(date -u '+%Y-%m-%d %H:%M UTC')"
kvput cpu "$(lscpu 2>/dev/null | sed -n 's/^Model name:[[:space:]]*//p' | head -n 1)"
kvput cores "$(nproc)"
kvput memory "$(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo)"
kvput os "Debian $(cat /etc/debian_version 2>/dev/null), kernel $(uname -r)"
kvput postgresql "$(val single 'SHOW server_version')"
kvput pgbench "$(pgbench --version | awk '{ print $3 }')"
kvput citus "$(val coord "SELECT citus_version()" | sed 's/ on .*//')"
kvput citus_extversion "$(val coord "SELECT extversion FROM pg_extension WHERE extname = 'citus'")"
kvput idempotency "$(val single "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'")"
so=$("$PG_CONFIG" --pkglibdir)/idempotency.so
kvput idempotency_so "$(md5sum "$so" | cut -c1-12) $(date -u -r "$so" '+%Y-%m-%d %H:%M UTC')"
kvput commit "$(git -C "$root" rev-parse --short HEAD 2>/dev/null)$(git -C "$root" diff --quiet HEAD -- src 2>/dev/null || echo ' (src/ modified in the checkout)')"
kvput single_preload "$(val single 'SHOW shared_preload_libraries')"
kvput citus_preload "$(val coord 'SHOW shared_preload_libraries')"
kvput settings "$(val single "SELECT string_agg(name || '=' || current_setting(name), ', ' ORDER BY name)
    FROM pg_settings WHERE name IN ('shared_buffers', 'fsync', 'synchronous_commit', 'autovacuum',
    'max_wal_size', 'checkpoint_timeout', 'max_connections', 'full_page_writes', 'wal_level')")"
kvput citus_settings "$(val coord "SELECT string_agg(name || '=' || setting, ', ' ORDER BY name) FROM pg_settings
    WHERE name IN ('citus.max_adaptive_executor_pool_size', 'citus.max_shared_pool_size',
    'citus.max_cached_conns_per_worker', 'citus.local_shared_pool_size', 'citus.shard_count',
    'citus.enable_local_execution', 'citus.multi_shard_modify_mode', 'citus.node_conninfo',
    'citus.enable_statistics_collection')")"
kvput delegated_functions "$(val coord "SELECT string_agg(p.proname || '(' || coalesce(o.distribution_argument_index::text, '-') || ', force_delegation=' || coalesce(o.force_delegation::text, 'f') || ')', ' ' ORDER BY p.proname)
    FROM pg_dist_object o JOIN pg_proc p ON o.classid = 'pg_proc'::regclass AND o.objid = p.oid")"
kvput load_before "$(cut -d' ' -f1-3 /proc/loadavg)"
kvput mode "clients=$CB_CLIENTS rounds=$CB_ROUNDS x ${CB_SECONDS}s, parts ${CB_PART_ROUNDS} x ${CB_PART_SECONDS}s, lat ${CB_LAT_ROUNDS} x ${CB_LAT_SECONDS}s"
kvput command "$cmdline"

# ------------------------------------------------------------- the scripts
script() { # NAME: the path of a pgbench script ready to run
    local name=$1 src
    case $name in
        fn_run|fn_dup|pk_dup) src=$root/bench/pgbench/$name.sql ;;
        *) src=$here/pgbench/$name.sql ;;
    esac
    [[ -f $work/scripts/$name.sql ]] ||
        sed -e 's/@S@/idempotency/g' -e 's/@T@/idempotency.operations/g' "$src" >"$work/scripts/$name.sql"
    echo "$work/scripts/$name.sql"
}

# ------------------------------------------------------------- measuring
# shellcheck source=bench/citus/ticks.sh
source "$root/bench/citus/ticks.sh"
all_ticks() { local n; for n in "${NODES[@]}"; do printf '%s ' "$(node_ticks "${PMPID[$n]}")"; done; machine_ticks; }
secs_of() { awk -v a="$1" -v b="$2" -v hz="$HZ" 'BEGIN { printf "%.3f", (b - a) / hz }'; }
# others_share: the machine's busy share (0..1 of all CPUs) over half a
# second while this benchmark is idle: the other work on a shared machine
others_share() {
    local m0 m1
    m0=$(machine_ticks); sleep 0.5; m1=$(machine_ticks)
    awk -v a="$m0" -v b="$m1" -v hz="$HZ" -v n="$(nproc)" 'BEGIN { printf "%.2f", (b - a) / hz / 0.5 / n }'
}
others=()

# quiet: until pgbench's sessions are gone from every server (a worker's
# sessions for the coordinator end when the coordinator's do); Citus's own
# background connections between the nodes stay
quiet() {
    local n busy
    for _ in $(seq 1 100); do
        busy=0
        for n in "${NODES[@]}"; do
            (($(val "$n" "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgbench'") == 0)) || busy=1
        done
        ((busy == 0)) && { sleep 0.2; return 0; }
        sleep 0.05
    done
    log "warning: pgbench sessions still there after 5 s"
}
checkpoint_all() {
    local n pids=()
    for n in "${NODES[@]}"; do sql "$n" -c CHECKPOINT & pids+=($!); done
    wait "${pids[@]}"
}

run_no=0
# pgb DIR NAME TARGET CLIENTS THREADS SECS SCRIPT BASE [pgbench args]: one
# pgbench process, in the background; its pid in $pgb_pid
pgb() {
    local dir=$1 name=$2 target=$3 clients=$4 threads=$5 secs=$6 scr=$7 base=$8
    shift 8
    (
        TIMEFORMAT='%U %S'
        [[ $target == w1g ]] && export PGOPTIONS="-c plan_cache_mode=force_generic_plan"
        { time timeout -s INT $((secs + 120)) pgbench -n -M prepared -c "$clients" -j "$threads" -T "$secs" \
              -h "${HOST[$target]}" -p "${PORT[$target]}" -U postgres \
              -D n=0 -D base="$base" -D stride=1000000 -D dupn="$CB_DUP_POOL" \
              -D ldupn="$LDUPN" -D lstride="$LSTRIDE" \
              -l --log-prefix="$dir/tx-$name" "$@" -f "$scr" "${DB[$target]}" \
              >"$dir/out-$name" 2>&1; } 2>"$dir/time-$name"
    ) &
    pgb_pid=$!
}

# run PHASE GROUP PATH TARGET CLIENTS ROUND SECS SCRIPTNAME [pgbench args]:
# one measured run, one line of results.tsv. TARGET: single, coord, w1, or
# any (clients split over w1 and w2)
run() {
    local phase=$1 group=$2 path=$3 target=$4 clients=$5 round=$6 secs=$7 name=$8
    shift 8
    run_no=$((run_no + 1))
    local id="$run_no-$phase-$group-$path-$target-c$clients-r$round"
    local dir=$work/logs/$id scr
    mkdir -p "$dir"
    chmod 777 "$dir"
    scr=$(script "$name")
    local base=$((run_no * 100000000))
    local threads=$((clients < 2 ? 1 : 2))
    # the lookup scripts: rows lbase + client_id * LSTRIDE + n, per round
    local lbase=$(( (round - 1) * CB_CLIENTS * LSTRIDE ))
    [[ $target == w1g ]] && lbase=$((lbase + lk_rows))
    [[ $target == w1ip ]] && lbase=$((lbase + 2 * lk_rows)) && scr=$(script "${name/lk_/ip_}")
    [[ $target == coordfn && $group == pk ]] && scr=$(script fn_dup)
    [[ $target == coordfn && $group == sql ]] && scr=$(script fn_run)
    checkpoint_all
    local t0 t1 rc=0 p pids=()
    read -r -a t0 < <(all_ticks)
    if [[ $target == any ]]; then
        pgb "$dir" w1 w1 $((clients / 2)) 1 "$secs" "$scr" "$base" -D lbase="$lbase" "$@"; pids+=("$pgb_pid")
        pgb "$dir" w2 w2 $((clients / 2)) 1 "$secs" "$scr" $((base + 50000000)) -D lbase="$lbase" "$@"; pids+=("$pgb_pid")
    else
        pgb "$dir" "$target" "$target" "$clients" "$threads" "$secs" "$scr" "$base" -D lbase="$lbase" "$@"; pids+=("$pgb_pid")
    fi
    bg_pids=("${pids[@]}")
    # in the first round of the main phase, how many connections the
    # servers have halfway through
    if [[ $phase == main && $round == 1 && $target != single ]]; then
        sleep "$(awk -v s="$secs" 'BEGIN { print s / 2 }')"
        local n conns=""
        for n in coord w1 w2; do
            conns+="$n=$(val "$n" "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()") "
        done
        kvput "connections_${path}_$target" "${conns% }"
    fi
    for p in "${pids[@]}"; do wait "$p" || rc=$?; done
    local m1
    m1=$(machine_ticks)
    bg_pids=()
    local f
    for f in "$dir"/out-*; do
        if ((rc != 0)) || grep -q 'aborted\|ERROR' "$f"; then
            cat "$f" >&2
            die "pgbench failed: $id"
        fi
    done
    quiet
    read -r -a t1 < <(all_ticks)
    local ops=0 tps=0 o t
    for f in "$dir"/out-*; do
        o=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$f")
        t=$(sed -n 's/^tps = \([0-9.]*\) (without initial connection time)/\1/p' "$f")
        ops=$((ops + o))
        tps=$(awk -v a="$tps" -v b="$t" 'BEGIN { printf "%.3f", a + b }')
    done
    local lat mean p50 p95 p99
    lat=$(/usr/bin/python3 "$root/bench/lat.py" "$dir"/tx-*)
    read -r _ mean p50 p95 p99 _ <<<"$lat"
    local cl
    cl=$(cat "$dir"/time-* | awk '{ s += $1 + $2 } END { printf "%.3f", s }')
    # -r: the mean latency of the first two SQL statements of the script
    local s1="" s2=""
    if [[ " $* " == *" -r "* ]]; then
        read -r s1 s2 < <(awk '/^statement latencies/ { on = 1; next }
            on && $3 ~ /^(SELECT|BEGIN|INSERT|UPDATE|COMMIT)/ && $3 != "BEGIN;" && $3 != "COMMIT;" { v[++k] = $1 }
            END { print (k >= 1 ? v[1] : ""), (k >= 2 ? v[2] : "") }' "$dir/out-$target")
    fi
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' \
        "$phase" "$group" "$path" "$target" "$clients" "$round" "$secs" "$ops" "$tps" "$mean" "$p50" "$p95" "$p99" \
        "$(secs_of "${t0[0]}" "${t1[0]}")" "$(secs_of "${t0[1]}" "${t1[1]}")" \
        "$(secs_of "${t0[2]}" "${t1[2]}")" "$(secs_of "${t0[3]}" "${t1[3]}")" \
        "$cl" "$(secs_of "${t0[4]}" "$m1")" "$s1" "$s2" >>"$results"
    printf 'citus-bench: %-36s %8.0f tps  p50 %6s ms  p99 %7s ms\n' "$id" "$tps" "$p50" "$p99" >&2
    rm -rf "$dir"
}

# order ROUND LIST...: LIST in order for odd rounds, reversed for even ones
order() {
    local r=$1
    shift
    if ((r % 2 == 1)); then echo "$@"; else echo "$@" | tr ' ' '\n' | tac | tr '\n' ' '; fi
}

# ------------------------------------------------------------- verify
# A few transactions of every script that goes through Citus, with the
# remote commands of the session logged (citus.log_remote_commands, NOTICEs
# pgbench prints) and the commands each worker runs on its own shards
# (citus.log_local_commands, relayed to the client as NOTICEs): per pgbench
# transaction, how many calls were pushed down, run where the client is, and
# which statements went to which node.
for n in w1 w2 coord; do
    sql "$n" -c "ALTER SYSTEM SET citus.log_local_commands = on" -c "SELECT pg_reload_conf()" >/dev/null
done
sleep 0.3
verify_no=0
verify() { # NAME TARGET SCRIPTNAME
    local name=$1 target=$2 scr f tx=20
    verify_no=$((verify_no + 1))
    scr=$(script "$3")
    f=$work/verify-$name.out
    PGOPTIONS="-c citus.log_remote_commands=on -c client_min_messages=debug1" \
        pgbench -n -M prepared -c 1 -j 1 -t "$tx" -h "${HOST[$target]}" -p "${PORT[$target]}" -U postgres \
        -D n=0 -D base=$((99000000000 + verify_no * 10000000)) -D stride=1000000 -D dupn="$CB_DUP_POOL" \
        -D ldupn="$LDUPN" -D lstride=1 -D lbase=$(( (CB_PART_ROUNDS) * CB_CLIENTS * LSTRIDE )) \
        -f "$scr" "${DB[$target]}" >"$f" 2>&1 || { cat "$f" >&2; die "verify $name failed"; }
    if grep -q 'aborted' "$f"; then cat "$f" >&2; die "verify $name: a client aborted"; fi
    local pd nl rs rb rc r2 rf lc
    pd=$(grep -c 'pushing down the function call' "$f" || true)
    nl=$(grep -c 'not pushing down function to the same node' "$f" || true)
    rf=$(grep -c 'issuing SELECT .*idempotency\.\(claim\|complete\)_operation(' "$f" || true)
    rs=$(grep 'issuing ' "$f" | grep -c 'idempotency\.operations_[0-9]' || true)
    rb=$(grep -c 'issuing BEGIN' "$f" || true)
    rc=$(grep -c 'issuing COMMIT$\|issuing COMMIT[^ ]' "$f" || true)
    r2=$(grep -c 'PREPARE TRANSACTION' "$f" || true)
    lc=$(grep -c 'executing the command locally' "$f" || true)
    kvput "verify_$name" "$(awk -v tx=$tx -v pd="$pd" -v nl="$nl" -v rf="$rf" -v rs="$rs" -v rb="$rb" -v rc="$rc" -v r2="$r2" -v lc="$lc" \
        'BEGIN { printf "pushed_down=%.2f same_node=%.2f calls_sent=%.2f shard_stmts_sent=%.2f begin_sent=%.2f commit_sent=%.2f prepare_2pc=%.2f local_shard_stmts=%.2f", pd/tx, nl/tx, rf/tx, rs/tx, rb/tx, rc/tx, r2/tx, lc/tx }')"
    # one example of each kind of line, for the report
    {
        echo "== $name ($target, $3.sql): per transaction: $(tail -n 1 "$kv" | cut -f2)"
        { grep 'pushing down' "$f" || true; } | sed 's/^[^:]*: *//' | sort | uniq -c
        { grep 'issuing \|executing the command locally' "$f" || true; } |
            sed 's/^NOTICE: *//; s/[0-9][0-9]*/N/g' | cut -c1-160 | sort | uniq -c | sort -rn | head -n 8
    } >>"$work/verify.txt"
}
log "verify: which calls are delegated"
verify run_coord coord fn_run
verify dup_coord coord fn_dup
verify pk_coord coord pk_dup
verify sql_coord coord sql_run
verify ndrun_coord coord nd_run
verify nddup_coord coord nd_dup
verify txrun_coord coord tx_run
verify lkrun_w1 w1 lk_run
verify lkdup_w1 w1 lk_dup
verify run_w1_random w1 fn_run
verify dup_w2_random w2 fn_dup
for n in w1 w2 coord; do
    sql "$n" -c "ALTER SYSTEM RESET citus.log_local_commands" -c "SELECT pg_reload_conf()" >/dev/null
done
cp "$work/verify.txt" "$out/verify.txt"

# ------------------------------------------------------------- main
C=$CB_CLIENTS
log "main: $CB_ROUNDS rounds of ${CB_SECONDS}s ($(( SECONDS - started )) s so far)"
for r in $(seq 1 "$CB_ROUNDS"); do
    others+=("$(others_share)")
    for t in $(order "$r" single coord); do run main run run "$t" "$C" "$r" "$CB_SECONDS" fn_run; done
    for t in $(order "$r" single coord); do run main dup dup "$t" "$C" "$r" "$CB_SECONDS" fn_dup; done
done
for n in single coord; do sql "$n" -c "VACUUM idempotency.operations"; done

# ------------------------------------------------------------- parts
# CB_PARTS: the groups to run (default all)
part() { [[ " ${CB_PARTS:-pk sql nd tx lk any} " == *" $1 "* ]]; }
log "parts: $CB_PART_ROUNDS rounds of ${CB_PART_SECONDS}s ($(( SECONDS - started )) s so far)"
for r in $(seq 1 "$CB_PART_ROUNDS"); do
    others+=("$(others_share)")
    ! part pk || for t in $(order "$r" single coord coordfn); do run parts pk pk "$t" "$C" "$r" "$CB_PART_SECONDS" pk_dup; done
    ! part sql || for t in $(order "$r" single coord coordfn); do run parts sql run "$t" "$C" "$r" "$CB_PART_SECONDS" sql_run; done
    ! part nd || for t in $(order "$r" single coord); do run parts nd run "$t" "$C" "$r" "$CB_PART_SECONDS" nd_run; done
    ! part nd || for t in $(order "$r" single coord); do run parts nd dup "$t" "$C" "$r" "$CB_PART_SECONDS" nd_dup; done
    ! part tx || for t in $(order "$r" single coord); do run parts tx run "$t" "$C" "$r" "$CB_PART_SECONDS" tx_run; done
    ! part lk || for t in $(order "$r" single w1 w1g w1ip); do run parts lk run "$t" "$C" "$r" "$CB_PART_SECONDS" lk_run; done
    ! part lk || for t in $(order "$r" single w1 w1g w1ip); do run parts lk dup "$t" "$C" "$r" "$CB_PART_SECONDS" lk_dup; done
    ! part any || for t in $(order "$r" coord any); do run parts any run "$t" "$C" "$r" "$CB_PART_SECONDS" fn_run; done
    ! part any || for t in $(order "$r" coord any); do run parts any dup "$t" "$C" "$r" "$CB_PART_SECONDS" fn_dup; done
done

# ------------------------------------------------------------- lat
log "lat: $CB_LAT_ROUNDS rounds of ${CB_LAT_SECONDS}s ($(( SECONDS - started )) s so far)"
for r in $(seq 1 "$CB_LAT_ROUNDS"); do
    for t in $(order "$r" single coord); do run lat lat run "$t" 1 "$r" "$CB_LAT_SECONDS" fn_run -r; done
    for t in $(order "$r" single coord); do run lat lat dup "$t" 1 "$r" "$CB_LAT_SECONDS" fn_dup -r; done
    for t in $(order "$r" single coord); do run lat lat pk "$t" 1 "$r" "$CB_LAT_SECONDS" pk_dup -r; done
done

# ------------------------------------------------------------- fanout
# the calls that are not single-key: stale_claims() and the job_type_stats
# view read every shard (one task per shard, run in parallel per worker)
log "fanout: stale_claims() and job_type_stats ($((SECONDS - started)) s so far)"
fan() { # NODE SQL: the median of 5 timings, ms
    local n=$1 q=$2 t=()
    for _ in 1 2 3 4 5; do
        t+=("$(sql "$n" -At -c '\timing on' -c "$q" | sed -n 's/^Time: \([0-9.]*\) ms.*/\1/p')")
    done
    printf '%s\n' "${t[@]}" | sort -n | sed -n 3p
}
for q in "SELECT count(*) FROM idempotency.stale_claims()" "SELECT count(*) FROM idempotency.job_type_stats"; do
    key=${q#*idempotency.}
    key=${key%%[^a-z_]*}
    kvput "fanout_${key}_ms" "single=$(fan single "$q") citus=$(fan coord "$q")"
    kvput "fanout_${key}_tasks" "$(PGOPTIONS="-c citus.log_remote_commands=on -c client_min_messages=notice" \
        psql -X -q -h "${HOST[coord]}" -p "${PORT[coord]}" -U postgres -d "${DB[coord]}" -c "$q" 2>&1 >/dev/null |
        grep -c 'issuing SELECT' || true) statements sent to the workers"
done

# ------------------------------------------------------------- perf
perf_ok=no
if [[ $perf_wanted == yes ]] && command -v perf >/dev/null &&
        perf record -e cpu-clock -a -o "$work/perf-probe.data" -- true >/dev/null 2>&1; then
    perf_ok=yes
fi
profile() { # PATH SCRIPTNAME: perf record -a during the path through the coordinator
    local path=$1 name=$2 dir=$work/logs/perf-$1 n pids f=$work/perf-$1-coord.txt
    mkdir -p "$dir"
    chmod 777 "$dir"
    checkpoint_all
    pgb "$dir" coord coord "$C" 2 $((CB_PERF_SECONDS + 3)) "$(script "$name")" $((98000000000 + ${#path} * 1000000000))
    bg_pids=("$pgb_pid")
    sleep 1.5
    ps -eo pid=,ppid=,comm= >"$dir/ps1"
    perf record -e cpu-clock -F 499 -a -g -o "$dir/perf.data" -- sleep "$CB_PERF_SECONDS" >/dev/null 2>"$dir/perf.err" || true
    ps -eo pid=,ppid=,comm= >>"$dir/ps1"
    wait "$pgb_pid" || true
    bg_pids=()
    quiet
    # which process belongs to which server (ps before and after the recording)
    : >"$dir/pidmap"
    for n in coord w1 w2; do
        awk -v pm="${PMPID[$n]}" -v node="$n" '$2 == pm { print $1, node }' "$dir/ps1" | sort -u >>"$dir/pidmap"
    done
    awk '$3 == "pgbench" { print $1, "pgbench" }' "$dir/ps1" | sort -u >>"$dir/pidmap"
    local tps
    tps=$(sed -n 's/^tps = \([0-9.]*\) (without.*/\1/p' "$dir/out-coord")
    {
        echo "# perf record -e cpu-clock -F 499 -a -g, $CB_PERF_SECONDS s: $path path ($name.sql) through the coordinator, $C clients"
        echo "# tps during the recording: $tps (operations: tps x $CB_PERF_SECONDS s)"
        echo
        perf script -i "$dir/perf.data" 2>/dev/null >"$dir/script.txt" || true
        /usr/bin/python3 "$here/perfsplit.py" "$dir/script.txt" "$dir/pidmap" \
            "$(awk -v t="${tps:-0}" -v s="$CB_PERF_SECONDS" 'BEGIN { printf "%d", t * s }')"
    } >"$f" 2>&1 || true
    cp "$f" "$out/perf-$path-coord.txt"
}
if [[ $perf_ok == yes ]]; then
    log "perf: $CB_PERF_SECONDS s of each path through the coordinator ($(( SECONDS - started )) s so far)"
    profile run fn_run
    profile dup fn_dup
    # the raw routed statements the two paths are compared with (coordfn)
    profile raw sql_run
    profile pk pk_dup
    kvput perf "yes"
else
    kvput perf "no"
fi

# ------------------------------------------------------------- the end
kvput others_share "$(printf '%s\n' "${others[@]}" | sort -n | awk '{ v[NR] = $1 } END { if (NR) printf "median %.2f, max %.2f (%d samples)", v[int((NR + 1) / 2)], v[NR], NR }')"
kvput load_after "$(cut -d' ' -f1-3 /proc/loadavg)"
kvput records_single "$(val single "SELECT count(*) FROM idempotency.operations")"
kvput records_citus "$(val coord "SELECT count(*) FROM idempotency.operations")"
kvput records_claimed_left "single=$(val single "SELECT count(*) FROM idempotency.operations WHERE status = 'claimed'") citus=$(val coord "SELECT count(*) FROM idempotency.operations WHERE status = 'claimed'")"
kvput records_per_worker "$(val coord "SELECT string_agg(nodeport::text || ':' || n, ' ' ORDER BY nodeport) FROM (
    SELECT nodeport, sum(result::bigint) AS n FROM run_command_on_shards('idempotency.operations', \$\$SELECT count(*) FROM %s\$\$) r
    JOIN pg_dist_placement p USING (shardid) JOIN pg_dist_node d ON d.groupid = p.groupid GROUP BY nodeport) x")"
kvput idempotency_so_end "$(md5sum "$so" | cut -c1-12) $(date -u -r "$so" '+%Y-%m-%d %H:%M UTC')"
[[ $(md5sum "$so" | cut -c1-12) == $(grep '^idempotency_so	' "$kv" | cut -f2 | cut -c1-12) ]] ||
    log "warning: $so changed during the run (installed by someone else); the servers loaded it when they started a session"
kvput duration_s "$((SECONDS - started))"
cp "$results" "$out/results.tsv"
cp "$kv" "$out/kv.tsv"
/usr/bin/python3 "$here/report.py" "$out" >"$out/summary.md"
log "done in $((SECONDS - started)) s: $out/summary.md"
if [[ $quick == yes ]]; then cat "$out/summary.md"; fi
