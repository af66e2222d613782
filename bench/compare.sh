#!/usr/bin/env bash
# bench/compare.sh: the extension's library at two git revisions, side by
# side on one node, in one run, on one throwaway cluster (issue 30: "No
# regression on one node"). The report is bench/compare.md, the raw numbers
# bench/compare.tsv.
#
#   bench/compare.sh [--quick] [--out DIR] BEFORE AFTER
#
# What it does:
#   build    the shared library of BEFORE and of AFTER, each from
#            `git archive REV` in a temp dir (make with_llvm=no); both must
#            have the same SQL scripts and control file as the ones
#            installed in $(pg_config --sharedir) (only the libraries differ;
#            CREATE EXTENSION runs the installed script). Nothing is
#            installed: the libraries stay in this run's temp dir.
#   cluster  initdb as postgres in the temp dir, port $CMP_PORT, Unix socket
#            in the temp dir only, bench/run.sh's settings (shared_buffers
#            $CMP_SHARED_BUFFERS, autovacuum off, checkpoint_timeout 1h,
#            max_wal_size 20GB, fsync and synchronous_commit on). One
#            database: the raw recipe's schema (bench/sql/raw.sql), CREATE
#            EXTENSION idempotency, bench/sql/fn_setup.sql, the completed
#            records DUP-1 .. DUP-$CMP_DUP_POOL.
#   switch   the extension's C functions point to one library or the other:
#            UPDATE pg_proc SET probin = '<tmp>/lib/<side>/idempotency.so'
#            (as bench/citus/cure.sh did). Every pgbench run opens new
#            sessions, which load the library pg_proc names. Before each run:
#            wait until no backend has a library mapped, switch, CHECKPOINT.
#            During the run every backend's /proc/PID/maps is read
#            (bench/compare_maps.py): column libs says which library the
#            backends mapped; a run whose backends mapped another side's
#            library, or the installed one, fails the run.
#   rounds   $CMP_ROUNDS rounds; in each, VACUUM, then these groups (a VACUUM
#            of the records before each duplicate group), the
#            order of the cells within a group changing per round (order())
#            (pgbench -n -M prepared, $CMP_CLIENTS clients, -j 2,
#            $CMP_SECONDS s, keys unique per run):
#              run    raw (bench/pgbench/raw_run.sql), BEFORE and AFTER
#                     (fn_run.sql): claim + complete of a new key
#              dup    pk (pk_dup.sql, a plain primary-key SELECT), BEFORE
#                     and AFTER (fn_dup.sql): claim of a completed key
#              b10    BEFORE and AFTER: batch_run.sql with 10 keys per call
#                     (claim_operations + complete_operations), and
#                     batch_dup.sql (10 completed keys per call)
# Per run: ops/s (keys for a batch), the server CPU of the run's sessions
# (the postmaster's cutime + cstime after they ended) and of the background
# processes, pgbench's CPU, the machine's busy time (/proc/stat), WAL bytes,
# WAL records, full-page images and transaction ids spent (pg_stat_wal,
# pg_current_wal_lsn(), pg_current_snapshot()); for a duplicate run that
# wrote WAL, pg_waldump names the records. The load average before and
# after each round. bench/compare_report.py writes compare.md from
# compare.tsv: medians over the rounds; a ratio is the median of the
# ratios within each round.
#
# Options:
#   --quick     2 rounds of 2 s, a pool of 5 000: checks that everything
#               works; output in a temp dir (removed; the report is printed)
#               unless --out
#   --out DIR   where compare.tsv and compare.md go (default: bench/)
# Settings (environment): CMP_CLIENTS=16, CMP_ROUNDS=6, CMP_SECONDS=5,
# CMP_DUP_POOL=100000, CMP_BATCH=10, CMP_SHARED_BUFFERS=1GB, CMP_PORT=55901,
# CMP_MAX_SECONDS=1200 (the watchdog: the run is stopped and cleaned up after
# that long). PG_CONFIG / PG_MAJOR as scripts/versions.sh.
#
# How long: about 7 minutes for the full run on the 2-core machine of the
# report (2 builds, setup, 6 rounds of 9 runs; 407 s at load 15); --quick
# about 1.5 minutes.
# Runs as root (initdb and the server as postgres) or as the user who owns
# the cluster. Touches no other cluster and installs nothing.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)

quick=no
out=""
revs=()
die() { echo "compare: error: $*" >&2; exit 1; }
log() { echo "compare: $*" >&2 || true; }
while (($#)); do
    case $1 in
        --quick) quick=yes; shift ;;
        --out) [[ $# -ge 2 ]] || die "--out needs a directory"; out=$2; shift 2 ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        -*) die "unknown option: $1 (try --help)" ;;
        *) revs+=("$1"); shift ;;
    esac
done
((${#revs[@]} == 2)) || die "give two revisions: BEFORE AFTER (try --help)"
if [[ $quick == yes ]]; then
    : "${CMP_ROUNDS:=2}" "${CMP_SECONDS:=2}" "${CMP_DUP_POOL:=5000}"
fi
: "${CMP_CLIENTS:=16}" "${CMP_ROUNDS:=6}" "${CMP_SECONDS:=5}" "${CMP_DUP_POOL:=100000}" "${CMP_BATCH:=10}"
: "${CMP_SHARED_BUFFERS:=1GB}" "${CMP_PORT:=55901}" "${CMP_MAX_SECONDS:=1200}"

started=$SECONDS
cmdline="bench/compare.sh${*:+ $*} ${revs[*]}"
# shellcheck source=scripts/versions.sh
source "$root/scripts/versions.sh"
versions_resolve
PG_BINDIR=$("$PG_CONFIG" --bindir)
export PATH="$PG_BINDIR:$PATH"
command -v pgbench >/dev/null || die "pgbench not found"
[[ -x /usr/bin/python3 ]] || die "python3 not found"
git -C "$root" rev-parse --git-dir >/dev/null 2>&1 || die "$root is not a git checkout"
before=$(git -C "$root" rev-parse --verify "${revs[0]}^{commit}") || die "no commit ${revs[0]}"
after=$(git -C "$root" rev-parse --verify "${revs[1]}^{commit}") || die "no commit ${revs[1]}"
before_s=$(git -C "$root" rev-parse --short "$before")
after_s=$(git -C "$root" rev-parse --short "$after")
[[ $before != "$after" ]] || die "BEFORE and AFTER are the same commit ($before_s)"
git -C "$root" diff --quiet "$before" "$after" -- 'idempotency*.sql' idempotency.control ||
    die "$before_s and $after_s differ in their SQL scripts or control file; this compares libraries only (use a clean root: scripts/root)"
sharedir=$("$PG_CONFIG" --sharedir)/extension
for f in $(git -C "$root" ls-tree --name-only "$after" -- 'idempotency*.sql' idempotency.control); do
    cmp -s <(git -C "$root" show "$after:$f") "$sharedir/$f" ||
        die "$sharedir/$f is not $after_s's $f: install the extension's SQL files of this revision first (in a clean root: scripts/root)"
done

owner=""
((EUID == 0)) && owner=postgres
as_owner() { if [[ -n $owner ]]; then runuser -u "$owner" -- "$@"; else "$@"; fi; }

work=$(mktemp -d "${TMPDIR:-/tmp}/compare.XXXXXX")
chmod 755 "$work"
if [[ -z $out ]]; then
    if [[ $quick == yes ]]; then out=$work/out; else out=$here; fi
fi
mkdir -p "$out" "$work/logs" "$work/scripts" "$work/lib/before" "$work/lib/after" "$work/sock"
chmod 755 "$work/lib" "$work/lib/before" "$work/lib/after"
chmod 777 "$work/sock" "$work/logs"
results=$work/compare.tsv
kv=$work/kv.tsv
: >"$kv"
kvput() { printf '%s\t%s\n' "$1" "$2" >>"$kv"; }
printf 'round\tgroup\tcell\tside\tpath\tclients\tsecs\tops\ttps\tlat_avg_ms\twal_bytes\twal_records\twal_fpi\txids\tbackend_cpu_s\tbg_cpu_s\tclient_cpu_s\tmachine_cpu_s\tlibs\tload1\n' >"$results"

# ------------------------------------------------------------ cleanup
PGDATA_CMP=$work/data
watchdog=""
bg_pids=()
cmp_cleanup() {
    set +e
    trap '' PIPE
    local p
    for p in "${bg_pids[@]}"; do kill -INT "$p" 2>/dev/null; done
    if [[ -n $watchdog ]]; then kill "$watchdog" 2>/dev/null; wait "$watchdog" 2>/dev/null; fi
    watchdog=""
    if [[ -f $PGDATA_CMP/postmaster.pid ]]; then
        as_owner pg_ctl -D "$PGDATA_CMP" -m immediate -w stop >/dev/null 2>&1
    fi
    rm -rf "$work"
}
trap 'rc=$?; cmp_cleanup; exit $rc' EXIT
trap 'trap - EXIT; log "interrupted"; cmp_cleanup; exit 130' INT
trap 'trap - EXIT; log "terminated"; cmp_cleanup; exit 143' TERM
trap 'trap - EXIT; cmp_cleanup; exit 129' HUP
(
    trap 'kill "$sp" 2>/dev/null; exit 0' TERM
    sleep "$CMP_MAX_SECONDS" &
    sp=$!
    wait "$sp"
    echo "compare: watchdog: $CMP_MAX_SECONDS s, stopping" >&2
    kill -TERM $$
) &
watchdog=$!

# ------------------------------------------------------------ build
build() { # SIDE REV
    local side=$1 rev=$2 dir=$work/src-$1
    mkdir -p "$dir"
    git -C "$root" archive "$rev" | tar -x -C "$dir"
    log "building $side ($(git -C "$root" rev-parse --short "$rev"))"
    if ! timeout 600 make -C "$dir" -j2 with_llvm=no PG_CONFIG="$PG_CONFIG" \
            >"$work/logs/build-$side.log" 2>&1; then
        tail -n 30 "$work/logs/build-$side.log" >&2
        die "the build of $side failed"
    fi
    install -m 755 "$dir/idempotency.so" "$work/lib/$side/idempotency.so"
    rm -rf "$dir"
}
build before "$before"
build after "$after"
cmp -s "$work/lib/before/idempotency.so" "$work/lib/after/idempotency.so" && die "the two libraries are identical"
kvput before "$before_s $(git -C "$root" show -s --format='%cs %s' "$before" | cut -c1-120)"
kvput after "$after_s $(git -C "$root" show -s --format='%cs %s' "$after" | cut -c1-120)"
kvput src_commits "$(git -C "$root" log --format='%h' "$before..$after" -- src Makefile | wc -l)"
kvput src_diff "$(git -C "$root" diff --shortstat "$before" "$after" -- src | sed 's/^ //')"
kvput so_before "$(md5sum "$work/lib/before/idempotency.so" | cut -c1-12)"
kvput so_after "$(md5sum "$work/lib/after/idempotency.so" | cut -c1-12)"

# ------------------------------------------------------------ the cluster
log "initdb and start (port $CMP_PORT)"
mkdir -p "$PGDATA_CMP"
[[ -z $owner ]] || chown "$owner" "$PGDATA_CMP"
chmod 700 "$PGDATA_CMP"
as_owner initdb -D "$PGDATA_CMP" -A trust -U postgres --no-instructions >"$work/logs/initdb.log" 2>&1 ||
    { cat "$work/logs/initdb.log" >&2; die "initdb failed"; }
as_owner pg_ctl -D "$PGDATA_CMP" -l "$work/logs/server.log" -w -t 120 \
    -o "-p $CMP_PORT -k $work/sock -c listen_addresses='' -c shared_buffers=$CMP_SHARED_BUFFERS -c max_wal_size=20GB -c checkpoint_timeout=1h -c autovacuum=off -c max_connections=100 -c maintenance_work_mem=512MB -c work_mem=64MB" \
    start >/dev/null ||
    { tail -n 30 "$work/logs/server.log" >&2; die "the server did not start"; }
export PGHOST=$work/sock PGPORT=$CMP_PORT PGUSER=postgres
export PGOPTIONS="-c client_min_messages=warning"
PM=$(head -n 1 "$PGDATA_CMP/postmaster.pid")
DB=bench
q() { psql -X -q -v ON_ERROR_STOP=1 -d "$DB" "$@"; }
val() { psql -X -q -A -t -v ON_ERROR_STOP=1 -d "$DB" -c "$1"; }
psql -X -q -d postgres -c "CREATE DATABASE $DB" >/dev/null
q -f "$here/sql/raw.sql"
q -c 'CREATE EXTENSION idempotency'
q -v S=idempotency -v SIDE=bench_c -f "$here/sql/fn_setup.sql"
q -c "INSERT INTO idempotency.operations (job_type, operation_key, status, attempt,
          claimed_at, heartbeat_at, completed_at)
      SELECT 'send_confirmation', 'DUP-' || g, 'completed', 1,
          now() - interval '1 day', now() - interval '1 day', now() - interval '1 day'
      FROM generate_series(1, $CMP_DUP_POOL) g"
q -c 'VACUUM ANALYZE'

for name in raw_run fn_run pk_dup fn_dup batch_run batch_dup; do
    sed -e 's/@S@/idempotency/g' -e 's/@T@/idempotency.operations/g' \
        "$here/pgbench/$name.sql" >"$work/scripts/$name.sql"
done

# ------------------------------------------------------------ the switch
nfun=$(val "SELECT count(*) FROM pg_proc WHERE probin = '\$libdir/idempotency'")
((nfun > 0)) || die "no C function of the extension found"
current=""
use_lib() { # SIDE: the extension's C functions point to SIDE's library
    local side=$1 path=$work/lib/$1/idempotency.so got
    [[ $current == "$side" ]] && return 0
    got=$(val "WITH u AS (UPDATE pg_catalog.pg_proc SET probin = '$path'
                          WHERE probin IN ('\$libdir/idempotency', '$work/lib/before/idempotency.so',
                                           '$work/lib/after/idempotency.so') RETURNING 1)
               SELECT count(*) FROM u")
    [[ $got == "$nfun" ]] || die "$got C functions switched to $side, not $nfun"
    current=$side
}

# ------------------------------------------------------------ measuring
HZ=$(getconf CLK_TCK)
machine_ticks() { awk '$1 == "cpu" { print $2 + $3 + $4 + $7 + $8 + $9; exit }' /proc/stat; }
# the reaped children of the postmaster: the sessions that ended
backend_ticks() { awk '{ sub(/^.*\) /, ""); print $14 + $15 }' "/proc/$PM/stat"; }
# "pid ticks" of the postmaster and its living children (background processes)
bg_ticks() {
    local p
    for p in "$PM" $(ps -o pid= --ppid "$PM" 2>/dev/null); do
        awk -v p="$p" '{ sub(/^.*\) /, ""); print p, $12 + $13 }' "/proc/$p/stat" 2>/dev/null || true
    done
}
bg_delta() {
    awk -v hz="$HZ" 'NR == FNR { t[$1] = $2; next } ($1 in t) { d += $2 - t[$1] } END { printf "%.3f", d / hz }' \
        <(echo "$1") <(echo "$2")
}
secs_of() { awk -v a="$1" -v b="$2" -v hz="$HZ" 'BEGIN { printf "%.3f", (b - a) / hz }'; }
snap() { # wal_lsn_bytes xid_next fpi records
    val "SELECT (pg_current_wal_lsn() - '0/0')::bigint, pg_snapshot_xmax(pg_current_snapshot())::text::bigint,
                wal_fpi, wal_records FROM pg_stat_wal" | tr '|' ' '
}
lib_mapped() {
    local p c=0
    for p in $(ps -o pid= --ppid "$PM" 2>/dev/null); do
        grep -qs 'idempotency\.so' "/proc/$p/maps" && c=$((c + 1))
    done
    echo "$c"
}
quiet() { # until pgbench's sessions are gone and no backend has a library mapped
    local i
    for i in $(seq 1 200); do
        if (($(val "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgbench'") == 0)) &&
           (($(lib_mapped) == 0)); then
            sleep 0.2
            return 0
        fi
        sleep 0.05
    done
    log "warning: sessions or a mapped library still there after 10 s"
}

run_no=0
# cell ROUND GROUP CELL SIDE PATH SCRIPT [PGBENCH ARGS]: one measured run, one line of compare.tsv
cell() {
    local round=$1 group=$2 name=$3 side=$4 path=$5 scr=$work/scripts/$6.sql
    shift 6
    run_no=$((run_no + 1))
    local id="$run_no-r$round-$name" dir=$work/logs/$run_no mult=1
    mkdir -p "$dir"
    chmod 777 "$dir"
    if [[ $name == b[0-9]* ]]; then mult=$CMP_BATCH; fi
    quiet
    [[ $side == ref ]] || use_lib "$side"
    q -c CHECKPOINT
    local b a c0 c1 g0 g1 m0 m1 rc=0 pgb sampler load1
    load1=$(cut -d' ' -f1 /proc/loadavg)
    read -r -a b < <(snap)
    c0=$(backend_ticks)
    g0=$(bg_ticks)
    m0=$(machine_ticks)
    /usr/bin/python3 "$here/compare_maps.py" "$PM" "$work/lib" >"$dir/libs" &
    sampler=$!
    (
        TIMEFORMAT='%U %S'
        { time timeout -s INT $((CMP_SECONDS + 120)) pgbench -n -M prepared -c "$CMP_CLIENTS" -j 2 -T "$CMP_SECONDS" \
              -D n=0 -D base=$((run_no * 100000000)) -D stride=1000000 -D dupn="$CMP_DUP_POOL" -D bs="$CMP_BATCH" \
              "$@" -f "$scr" "$DB" >"$dir/out" 2>&1; } 2>"$dir/time"
    ) &
    pgb=$!
    bg_pids=("$pgb" "$sampler")
    wait "$pgb" || rc=$?
    m1=$(machine_ticks)
    if ((rc != 0)) || grep -q 'aborted\|ERROR' "$dir/out"; then
        cat "$dir/out" >&2
        die "pgbench failed: $id"
    fi
    quiet
    kill -TERM "$sampler" 2>/dev/null || true
    wait "$sampler" || true
    bg_pids=()
    c1=$(backend_ticks)
    g1=$(bg_ticks)
    read -r -a a < <(snap)
    local ops tps lat cl libs
    ops=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$dir/out")
    tps=$(sed -n 's/^tps = \([0-9.]*\) (without initial connection time)/\1/p' "$dir/out")
    lat=$(sed -n 's/^latency average = \([0-9.]*\) ms/\1/p' "$dir/out")
    ops=$((ops * mult))
    tps=$(awk -v t="$tps" -v m="$mult" 'BEGIN { printf "%.3f", t * m }')
    cl=$(awk '{ printf "%.3f", $1 + $2 }' "$dir/time")
    libs=$(cat "$dir/libs")
    case $side in
        ref) [[ $libs == none ]] || die "run $id (a reference) mapped the library: $libs" ;;
        *) [[ $libs == "$side:"* && $libs != *,* ]] || die "run $id: the backends mapped $libs, not only $side's library" ;;
    esac
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' \
        "$round" "$group" "$name" "$side" "$path" "$CMP_CLIENTS" "$CMP_SECONDS" "$ops" "$tps" "$lat" \
        $((a[0] - b[0])) $((a[3] - b[3])) $((a[2] - b[2])) $((a[1] - b[1])) \
        "$(secs_of "$c0" "$c1")" "$(bg_delta "$g0" "$g1")" "$cl" "$(secs_of "$m0" "$m1")" "$libs" "$load1" >>"$results"
    printf 'compare: %-26s %9.0f ops/s  WAL %6s B/op  CPU %5s us/op  libs %s\n' "$id" "$tps" \
        "$(awk -v w=$((a[0] - b[0])) -v o="$ops" 'BEGIN { printf "%.0f", (o > 0 ? w / o : 0) }')" \
        "$(awk -v a="$c0" -v b="$c1" -v hz="$HZ" -v o="$ops" 'BEGIN { printf "%.1f", (o > 0 ? (b - a) / hz * 1e6 / o : 0) }')" "$libs" >&2
    # a duplicate run of the extension that wrote WAL: which records
    if [[ $path == dup && $side != ref && $((a[0] - b[0])) -gt 0 ]]; then
        local recs
        recs=$( { cd / && as_owner pg_waldump -p "$PGDATA_CMP/pg_wal" \
                   -s "$(val "SELECT '0/0'::pg_lsn + ${b[0]}")" -e "$(val "SELECT '0/0'::pg_lsn + ${a[0]}")" \
                   2>/dev/null || true; } | sed -n 's/^rmgr: \([A-Za-z0-9]*\) .*desc: \([A-Z_0-9]*\).*/\1\/\2/p' | sort | uniq -c |
               awk '{ printf "%s%s:%s", (NR > 1 ? " " : ""), $2, $1 }')
        kvput "dupwal.r$round.$name" "${recs:-unknown}"
    fi
    rm -rf "$dir"
}
# order ROUND CELL...: the order of the cells of a group in a round. Two
# cells: as given in odd rounds, swapped in even ones. Three: the six
# permutations in turn (ABC CBA BCA ACB CAB BAC), so that over six rounds
# each cell runs in each position twice and each one before each other one
# three times (a cell's position within a group changes its result on a
# busy machine: a plain reversal would keep the middle one in the middle)
order() {
    local r=$1
    shift
    if (($# == 3)); then
        local perms=(012 210 120 021 201 102) p i out=()
        p=${perms[(r - 1) % 6]}
        for i in 0 1 2; do out+=("${@:$((${p:i:1} + 1)):1}"); done
        echo "${out[@]}"
    elif ((r % 2 == 1)); then
        echo "$@"
    else
        echo "$@" | awk '{ for (i = NF; i > 0; i--) printf "%s%s", $i, (i > 1 ? " " : "\n") }'
    fi
}

# --------------------------------------------------------------- machine
kvput date "$(date -u '+%Y-%m-%d %H:%M UTC')"
kvput cpu "$(lscpu 2>/dev/null | sed -n 's/^Model name:[[:space:]]*//p' | head -n 1)"
kvput cores "$(nproc)"
kvput memory "$(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo)"
kvput os "Debian $(cat /etc/debian_version 2>/dev/null), kernel $(uname -r)"
kvput postgresql "$(val 'SHOW server_version')"
kvput pgbench "$(pgbench --version | awk '{ print $3 }')"
kvput idempotency "$(val "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'")"
kvput settings "$(val "SELECT string_agg(name || '=' || current_setting(name), ', ' ORDER BY name)
    FROM pg_settings WHERE name IN ('shared_buffers', 'fsync', 'synchronous_commit', 'autovacuum',
    'max_wal_size', 'checkpoint_timeout', 'full_page_writes', 'wal_level')")"
kvput dup_pool "$CMP_DUP_POOL"
kvput c_functions "$nfun"
kvput mode "clients=$CMP_CLIENTS rounds=$CMP_ROUNDS x ${CMP_SECONDS}s batch=$CMP_BATCH"
kvput command "$cmdline"
kvput load_before "$(cut -d' ' -f1-3 /proc/loadavg)"

# ------------------------------------------------------------ the rounds
log "setup done in $((SECONDS - started)) s; $CMP_ROUNDS rounds of 9 runs of ${CMP_SECONDS}s"
bs=$CMP_BATCH
for r in $(seq 1 "$CMP_ROUNDS"); do
    kvput "round$r.load_start" "$(cut -d' ' -f1-3 /proc/loadavg)"
    q -c 'VACUUM idempotency.operations' -c 'VACUUM bench_raw.handled_operations'
    for c in $(order "$r" raw before after); do
        case $c in
            raw) cell "$r" run raw ref run raw_run ;;
            *) cell "$r" run "run.$c" "$c" run fn_run ;;
        esac
    done
    # the run path leaves dead versions; VACUUM them, so that a duplicate's
    # read does not prune a page (a plain SELECT would prune it too)
    q -c 'VACUUM idempotency.operations'
    for c in $(order "$r" pk before after); do
        case $c in
            pk) cell "$r" dup pk ref dup pk_dup ;;
            *) cell "$r" dup "dup.$c" "$c" dup fn_dup ;;
        esac
    done
    for c in $(order "$r" before after); do cell "$r" b10 "b$bs.run.$c" "$c" run batch_run; done
    q -c 'VACUUM idempotency.operations'
    for c in $(order "$r" after before); do cell "$r" b10 "b$bs.dup.$c" "$c" dup batch_dup; done
    kvput "round$r.load_end" "$(cut -d' ' -f1-3 /proc/loadavg)"
done
quiet

# ------------------------------------------------------------ the end
kvput load_after "$(cut -d' ' -f1-3 /proc/loadavg)"
kvput records "$(val "SELECT count(*) FROM idempotency.operations")"
kvput records_claimed_left "$(val "SELECT count(*) FROM idempotency.operations WHERE status = 'claimed'")"
kvput duration_s "$((SECONDS - started))"
{
    sed 's/^/# /' "$kv"
    cat "$results"
} >"$out/compare.tsv"
/usr/bin/python3 "$here/compare_report.py" "$out/compare.tsv" >"$out/compare.md"
log "done in $((SECONDS - started)) s: $out/compare.md"
if [[ $quick == yes ]]; then cat "$out/compare.md"; fi
