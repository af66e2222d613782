#!/usr/bin/env bash
# bench/purge_probe.sh: why the run path's p99 grows while expired records
# are purged (the scale phase of bench/run.sh: "run-path p99 during CALL
# idempotency.purge() / idle"). The findings are in bench/analysis.md.
#
#   bench/purge_probe.sh [--out DIR] [--lib REV[,REV2]] EXPERIMENT...
#
# One throwaway cluster (initdb as postgres, port $PP_PORT, run.sh's
# settings), the scale phase's big table ($PP_BIG records: keys ORD-… in
# order, then $PP_ROWS expired 'old_orders' records appended, VACUUM
# ANALYZE). The extension's C functions point at a library built from
# `git archive REV` (default HEAD; with two revisions, the experiments run
# once with each, alternating: REV first, then REV2, per experiment).
# An experiment: CHECKPOINT, then one pgbench of the run path at a fixed rate
# (-R $PP_RATE, $PP_CLIENTS clients, per-transaction log) for $PP_SECONDS s;
# after $PP_IDLE s the purge starts in another session (application_name
# purge); after it, as many expired records are loaded again (VACUUM
# ANALYZE first, so that they go where the last ones were, as in run.sh)
# for the next experiment. Every 0.1 s a sampler records pg_stat_wal,
# pg_stat_bgwriter, the wait events of the pgbench sessions and of the purge
# session, the machine's busy ticks (/proc/stat) and the purge backend's CPU
# (/proc/PID/stat). bench/purge_probe.py prints, per experiment, p99 before
# (idle), during and after the purge, and a time line in 0.5 s bins.
#
# Experiments (SQL run as the purge):
#   paced      CALL idempotency.purge($PP_PAGES, '$PP_PAUSE_MS ms')  (run.sh's)
#   paced0     the same, but the table's walk starts at the first block
#              that holds an expired record (idempotency.purge_block_range()
#              called from a DO block over those blocks only): the purge's
#              deletes without its walk over the blocks without one
#   pacedwalk  the procedure's loop in a DO block, which also pauses after
#              every $PP_WALK_EVERY-th range that deleted nothing (the walk
#              paced too)
#   walk       the walk alone: purge_block_range() over every block of the
#              table, 20 at a time, one transaction each, with nothing to
#              delete (the job type's retention set to 1000 years first)
#   onetx      SELECT idempotency.purge_operations(10000)
#   none       no purge: two idle halves (the noise of the machine)
#
# Settings (environment): PP_BIG=10000000, PP_ROWS=1000000, PP_RATE=1209,
# PP_CLIENTS=4, PP_SECONDS=45, PP_IDLE=12, PP_PAGES=20, PP_PAUSE_MS=20,
# PP_SHARED_BUFFERS=1GB, PP_PORT=55902, PP_MAX_SECONDS=1500.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
out=""
libs="HEAD"
exps=()
die() { echo "purge-probe: error: $*" >&2; exit 1; }
log() { echo "purge-probe: $*" >&2 || true; }
while (($#)); do
    case $1 in
        --out) out=$2; shift 2 ;;
        --lib) libs=$2; shift 2 ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        -*) die "unknown option $1" ;;
        *) exps+=("$1"); shift ;;
    esac
done
((${#exps[@]})) || exps=(paced onetx)
: "${PP_BIG:=10000000}" "${PP_ROWS:=1000000}" "${PP_RATE:=1209}" "${PP_CLIENTS:=4}" "${PP_SECONDS:=45}"
: "${PP_IDLE:=12}" "${PP_PAGES:=20}" "${PP_PAUSE_MS:=20}" "${PP_SHARED_BUFFERS:=1GB}" "${PP_PORT:=55902}"
: "${PP_MAX_SECONDS:=1500}" "${PP_WALK_EVERY:=10}"
source "$root/scripts/versions.sh"
versions_resolve
PG_BINDIR=$("$PG_CONFIG" --bindir)
export PATH="$PG_BINDIR:$PATH"
owner=""
((EUID == 0)) && owner=postgres
as_owner() { if [[ -n $owner ]]; then runuser -u "$owner" -- "$@"; else "$@"; fi; }
started=$SECONDS

work=$(mktemp -d "${TMPDIR:-/tmp}/purge-probe.XXXXXX")
chmod 755 "$work"
[[ -n $out ]] || out=$work/out
mkdir -p "$out" "$work/sock" "$work/logs" "$work/data"
chmod 777 "$work/sock" "$work/logs"
[[ -z $owner ]] || chown "$owner" "$work/data"
chmod 700 "$work/data"
PGD=$work/data
bg=()
cleanup() {
    set +e
    local p
    for p in "${bg[@]}"; do kill "$p" 2>/dev/null; done
    [[ -f $PGD/postmaster.pid ]] && as_owner pg_ctl -D "$PGD" -m immediate -w stop >/dev/null 2>&1
    rm -rf "$work"
}
trap 'rc=$?; cleanup; exit $rc' EXIT
trap 'trap - EXIT; cleanup; exit 130' INT
trap 'trap - EXIT; cleanup; exit 143' TERM
(
    trap 'kill "$sp" 2>/dev/null; exit 0' TERM
    sleep "$PP_MAX_SECONDS" </dev/null >/dev/null 2>&1 &
    sp=$!
    wait "$sp"
    echo "purge-probe: watchdog" >&2
    kill -TERM $$
) &
watchdog=$!
bg+=("$watchdog")

# the libraries
IFS=, read -r -a revs <<<"$libs"
declare -A LIB=()
for rev in "${revs[@]}"; do
    c=$(git -C "$root" rev-parse --short "$rev^{commit}") || die "no commit $rev"
    d=$work/lib/$c
    mkdir -p "$d/src"
    git -C "$root" archive "$c" | tar -x -C "$d/src"
    log "building $c"
    make -C "$d/src" -j2 with_llvm=no PG_CONFIG="$PG_CONFIG" >"$work/logs/build-$c.log" 2>&1 ||
        { tail -n 20 "$work/logs/build-$c.log" >&2; die "build of $c failed"; }
    install -m 755 "$d/src/idempotency.so" "$d/idempotency.so"
    chmod -R a+rX "$work/lib"
    LIB[$c]=$d/idempotency.so
    revs_short+=("$c")
done

as_owner initdb -D "$PGD" -A trust -U postgres --no-instructions >"$work/logs/initdb.log" 2>&1 || die "initdb failed"
as_owner pg_ctl -D "$PGD" -l "$work/logs/server.log" -w -t 120 \
    -o "-p $PP_PORT -k $work/sock -c listen_addresses='' -c shared_buffers=$PP_SHARED_BUFFERS -c max_wal_size=20GB -c checkpoint_timeout=1h -c autovacuum=off -c max_connections=100 -c maintenance_work_mem=512MB -c work_mem=64MB -c track_io_timing=on -c track_wal_io_timing=on" \
    start >/dev/null || { tail -n 20 "$work/logs/server.log" >&2; die "server did not start"; }
export PGHOST=$work/sock PGPORT=$PP_PORT PGUSER=postgres PGOPTIONS="-c client_min_messages=warning"
PM=$(head -n 1 "$PGD/postmaster.pid")
DB=probe
q() { psql -X -q -v ON_ERROR_STOP=1 -d "$DB" "$@"; }
val() { psql -X -q -A -t -v ON_ERROR_STOP=1 -d "$DB" -c "$1"; }
psql -X -q -d postgres -c "CREATE DATABASE $DB"
q -c 'CREATE EXTENSION idempotency'
q -v S=idempotency -v SIDE=bench_c -f "$here/sql/fn_setup.sql"
q -c "INSERT INTO idempotency.job_types (job_type, lease, stale_policy, retention) VALUES ('old_orders', '10 minutes', 'hold', '1 day')"
log "loading $PP_BIG records"
q -c "INSERT INTO idempotency.operations (job_type, operation_key, status, attempt, claimed_at, heartbeat_at, completed_at)
      SELECT 'send_confirmation', 'ORD-' || lpad(g::text, 8, '0'), 'completed', 1,
             now() - interval '1 hour', now() - interval '1 hour', now() - interval '1 hour'
      FROM generate_series(1, $((PP_BIG - PP_ROWS))) g"
gen=0
load_expired() {
    gen=$((gen + 1))
    q -c 'VACUUM ANALYZE idempotency.operations'
    q -c "INSERT INTO idempotency.operations (job_type, operation_key, status, attempt, claimed_at, heartbeat_at, completed_at)
          SELECT 'old_orders', 'OLD$gen-' || lpad(g::text, 8, '0'), 'completed', 1,
                 now() - interval '2 days', now() - interval '2 days', now() - interval '2 days'
          FROM generate_series(1, $PP_ROWS) g"
    q -c 'VACUUM ANALYZE idempotency.operations'
}
load_expired
log "loaded in $((SECONDS - started)) s: $(val "SELECT pg_size_pretty(pg_total_relation_size('idempotency.operations'))"), $(val "SELECT pg_relation_size('idempotency.operations') / 8192") heap blocks"
nfun=$(val "SELECT count(*) FROM pg_proc WHERE probin = '\$libdir/idempotency'")
use_lib() {
    local path=${LIB[$1]}
    val "UPDATE pg_proc SET probin = '$path' WHERE probin = '\$libdir/idempotency' OR probin LIKE '$work/lib/%'" >/dev/null
}
sed -e 's/@S@/idempotency/g' "$here/pgbench/fn_run.sql" >"$work/fn_run.sql"

purge_sql() {
    case $1 in
        paced) echo "CALL idempotency.purge($PP_PAGES, '$PP_PAUSE_MS milliseconds')" ;;
        paced0) echo "DO \$\$ DECLARE b bigint; last bigint; d bigint; BEGIN
              SELECT min((ctid::text::point)[0])::bigint, max((ctid::text::point)[0])::bigint INTO b, last
                FROM idempotency.operations WHERE job_type = 'old_orders';
              WHILE b <= last LOOP
                d := idempotency.purge_block_range(b, $PP_PAGES); COMMIT;
                b := b + $PP_PAGES;
                IF d > 0 THEN PERFORM pg_sleep($PP_PAUSE_MS / 1000.0); END IF;
              END LOOP; END \$\$" ;;
        pacedwalk) echo "DO \$\$ DECLARE b bigint := 0; n bigint := pg_relation_size('idempotency.operations') / 8192; d bigint; empty int := 0; BEGIN
              WHILE b < n LOOP
                d := idempotency.purge_block_range(b, $PP_PAGES); COMMIT;
                b := b + $PP_PAGES;
                IF d = 0 THEN empty := empty + 1; END IF;
                IF d > 0 OR empty % $PP_WALK_EVERY = 0 THEN PERFORM pg_sleep($PP_PAUSE_MS / 1000.0); END IF;
              END LOOP; END \$\$" ;;
        walk) echo "DO \$\$ DECLARE b bigint := 0; n bigint := pg_relation_size('idempotency.operations') / 8192; BEGIN
              WHILE b < n LOOP PERFORM idempotency.purge_block_range(b, $PP_PAGES); COMMIT; b := b + $PP_PAGES; END LOOP; END \$\$" ;;
        onetx) echo "SELECT idempotency.purge_operations(10000)" ;;
        none) echo "SELECT pg_sleep(10)" ;;
        *) die "unknown experiment $1" ;;
    esac
}

HZ=$(getconf CLK_TCK)
exp_no=0
experiment() { # NAME LIBCOMMIT
    local name=$1 lib=$2
    exp_no=$((exp_no + 1))
    local tag="$exp_no-$name-$lib" d=$work/logs/$exp_no
    mkdir -p "$d"
    chmod 777 "$d"
    use_lib "$lib"
    [[ $name == walk ]] && q -c "UPDATE idempotency.job_types SET retention = '1000 years' WHERE job_type = 'old_orders'"
    q -c CHECKPOINT
    local load0 load1
    load0=$(cut -d' ' -f1-3 /proc/loadavg)
    # sampler: the database's view, 10 per second, in one session
    { while :; do echo "SELECT extract(epoch FROM clock_timestamp()), (pg_current_wal_lsn() - '0/0')::bigint, w.wal_fpi, w.wal_sync, w.wal_write, b.buffers_backend, b.buffers_clean, b.buffers_alloc, b.buffers_checkpoint,
          coalesce((SELECT string_agg(coalesce(wait_event_type || ':' || wait_event, 'CPU'), ' ') FROM pg_stat_activity WHERE application_name = 'pgbench' AND state = 'active'), ''),
          coalesce((SELECT coalesce(wait_event_type || ':' || wait_event, 'CPU') || ' ' || pid FROM pg_stat_activity WHERE application_name = 'purge' AND state = 'active'), '')
          FROM pg_stat_wal w, pg_stat_bgwriter b;"; sleep 0.1; done; } |
        psql -X -q -A -t -F $'\t' -d "$DB" >"$d/db.tsv" 2>/dev/null &
    local sdb=$!
    # sampler: the machine and the purge backend's CPU
    { while :; do
          local pp
          pp=$(awk -F'\t' 'END { split($11, a, " "); print a[2] }' "$d/db.tsv" 2>/dev/null)
          printf '%s %s %s\n' "$(date +%s.%N)" "$(awk '$1 == "cpu" { print $2 + $3 + $4 + $7 + $8 + $9; exit }' /proc/stat)" \
              "$( [[ -n $pp && -r /proc/$pp/stat ]] && awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$pp/stat" || echo -)"
          sleep 0.1
      done; } >"$d/cpu.txt" &
    local scpu=$!
    bg+=("$sdb" "$scpu")
    pgbench -n -M prepared -c "$PP_CLIENTS" -j 2 -R "$PP_RATE" -T "$PP_SECONDS" \
        -D n=0 -D base=$((exp_no * 100000000)) -D stride=1000000 -D dupn=1 \
        -l --log-prefix="$d/tx" -f "$work/fn_run.sql" "$DB" >"$d/pgbench.out" 2>&1 &
    local pgb=$!
    sleep "$PP_IDLE"
    local s e rc=0
    s=$(date +%s.%N)
    PGAPPNAME=purge psql -X -q -A -t -v ON_ERROR_STOP=1 -d "$DB" -c "$(purge_sql "$name")" >"$d/purge.out" 2>&1 || rc=$?
    e=$(date +%s.%N)
    ((rc == 0)) || { cat "$d/purge.out" >&2; die "purge $tag failed"; }
    wait "$pgb" || { cat "$d/pgbench.out" >&2; die "pgbench failed ($tag)"; }
    kill "$sdb" "$scpu" 2>/dev/null; wait "$sdb" "$scpu" 2>/dev/null || true
    bg=("$watchdog")
    load1=$(cut -d' ' -f1-3 /proc/loadavg)
    local left
    left=$(val "SELECT count(*) FROM idempotency.operations WHERE job_type = 'old_orders'")
    [[ $name == walk ]] && q -c "UPDATE idempotency.job_types SET retention = '1 day' WHERE job_type = 'old_orders'"
    cat "$d"/tx.* >"$out/tx-$tag.log"
    cp "$d/db.tsv" "$out/db-$tag.tsv"
    cp "$d/cpu.txt" "$out/cpu-$tag.txt"
    printf 'experiment\t%s\nname\t%s\nlib\t%s\npurge_start\t%s\npurge_end\t%s\nload_before\t%s\nload_after\t%s\nexpired_left\t%s\nrate\t%s\nclients\t%s\nhz\t%s\npurge_out\t%s\n' \
        "$tag" "$name" "$lib" "$s" "$e" "$load0" "$load1" "$left" "$PP_RATE" "$PP_CLIENTS" "$HZ" "$(tr '\n' ' ' <"$d/purge.out")" >"$out/meta-$tag.tsv"
    /usr/bin/python3 "$here/purge_probe.py" --summary "$out" "$tag" >&2 || true
    rm -rf "$d"
    # the next experiment's expired records
    if ((left < PP_ROWS / 2)) && [[ $name != none && $name != walk ]]; then load_expired; fi
}

for name in "${exps[@]}"; do
    for lib in "${revs_short[@]}"; do
        experiment "$name" "$lib"
    done
done
log "done in $((SECONDS - started)) s; output in $out"
