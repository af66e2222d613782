#!/usr/bin/env bash
# bench/citus/cure.sh: what the cure of issue 18 costs. Commit 92faf81 made
# the extension's kept SPI plans custom (CURSOR_OPT_CUSTOM_PLAN) where Citus
# manages the tables, so that Citus 13.2.x no longer adds a local plan to a
# generic plan at every call (about 37 kB per call on the worker). This
# measures the library before and after that change on one Citus cluster,
# interleaved: tps, CPU per operation per server, and the workers' memory.
# The report is bench/citus/cure.md, the raw numbers cure.tsv.
#
#   bench/citus/cure.sh [--quick] [--out DIR] [--before REV] [--after REV]
#
# What it does:
#   build    the shared library at two commits, BEFORE (default 0a5e4e5, the
#            commit before the cure) and AFTER (default HEAD), each from
#            `git archive` in a temp dir, with
#            make with_llvm=no PG_CFLAGS="-Wall -Wextra -Werror"; both must
#            have the same SQL scripts and control file (only the library
#            differs); then `make install with_llvm=no` of AFTER (SQL files
#            and AFTER's library in $(pg_config --pkglibdir))
#   cluster  a coordinator and two workers (test/citus/cluster.sh) with the
#            settings of bench/citus/run.sh; CREATE EXTENSION idempotency,
#            SELECT idempotency.distribute(), job type send_confirmation, the
#            completed records DUP-1 .. DUP-$CB_DUP_POOL, and on worker w1 the
#            lookup tables of run.sh's lk scripts (keys that w1 holds)
#   switch   the two libraries stay in this run's temp dir (.../before/,
#            .../after/); the extension's C functions point to one of them:
#            UPDATE pg_proc SET probin = '<dir>/idempotency.so' on all three
#            nodes. A new backend loads the library its pg_proc names; every
#            pgbench run opens new sessions, and the worker sessions Citus
#            opens for them belong to the coordinator's backends, so they
#            are new too. The installed library (pkglibdir) is never
#            swapped: other tests on the machine keep using AFTER. Before
#            each run: wait until no backend has a library mapped, switch,
#            CHECKPOINT on all nodes; during the run, which library every
#            backend mapped is recorded (column libs: it must be the side's)
#   rounds   $CB_ROUNDS rounds; in each, for each of four configurations,
#            BEFORE and AFTER back to back (the order alternates per round),
#            pgbench -n -M prepared, $CB_CLIENTS clients, -j 2,
#            $CB_SECONDS s, keys unique per run:
#              run  coord  claim + complete of a new key through the
#                          coordinator (bench/pgbench/fn_run.sql)
#              dup  coord  claim of a completed key (fn_dup.sql)
#              run  w1     clients connected to worker w1, keys w1 holds
#                          (bench/citus/pgbench/lk_run.sql)
#              dup  w1     the same, completed keys (lk_dup.sql)
# Per run: tps; the CPU of each server (its postmaster and all its children,
# living and reaped, from /proc, as run.sh), of pgbench and of the machine;
# the largest RssAnon of one backend of each server, sampled every 0.5 s
# (bench/citus/cure_rss.py; with BEFORE the workers' backends grow during a
# run: that is the leak, shown, not a target). bench/citus/cure_report.py
# writes cure.md from cure.tsv: medians over the rounds, AFTER/BEFORE ratios
# as the median of the per-round ratios.
#
# Options:
#   --quick       2 rounds of 3 s, a pool of 5 000: checks
#                 that everything works; output in a temp dir (removed; the
#                 report is printed) unless --out
#   --out DIR     where cure.tsv and cure.md go (default: bench/citus/ for a
#                 full run)
#   --before REV, --after REV   the two commits (CB_BEFORE, CB_AFTER)
# Settings (environment): CB_CLIENTS=16, CB_ROUNDS=5, CB_SECONDS=10,
# CB_DUP_POOL=20000, CB_SHARED_BUFFERS=512MB, CB_BEFORE=0a5e4e5,
# CB_AFTER=HEAD, CB_MAX_SECONDS=1800 (the watchdog: the whole run is stopped
# and cleaned up after that long). PG_CONFIG / PG_MAJOR as
# scripts/versions.sh.
#
# How long: the full run about 9 minutes on the 2-core machine of the
# report (2 builds, setup, 40 runs of 10 s); --quick about 1.5 minutes. Needs Citus installed
# (scripts/citus check), root or a user who can install into pkglibdir and
# start servers. At the end, and on error, Ctrl-C or the watchdog: the
# cluster is stopped and removed, the temp dir removed, and pkglibdir holds
# AFTER's library (reinstalled if it does not).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)

quick=no
out=""
die() { echo "citus-cure: error: $*" >&2; exit 1; }
log() { echo "citus-cure: $*" >&2 || true; }
while (($#)); do
    case $1 in
        --quick) quick=yes; shift ;;
        --out) [[ $# -ge 2 ]] || die "--out needs a directory"; out=$2; shift 2 ;;
        --before) [[ $# -ge 2 ]] || die "--before needs a revision"; CB_BEFORE=$2; shift 2 ;;
        --after) [[ $# -ge 2 ]] || die "--after needs a revision"; CB_AFTER=$2; shift 2 ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) die "unknown argument: $1 (try --help)" ;;
    esac
done
if [[ $quick == yes ]]; then
    : "${CB_ROUNDS:=2}" "${CB_SECONDS:=3}" "${CB_DUP_POOL:=5000}"
fi
: "${CB_CLIENTS:=16}" "${CB_ROUNDS:=5}" "${CB_SECONDS:=10}" "${CB_DUP_POOL:=20000}"
: "${CB_SHARED_BUFFERS:=512MB}" "${CB_MAX_SECONDS:=1800}" "${CB_BEFORE:=0a5e4e5}" "${CB_AFTER:=HEAD}"
((CB_CLIENTS >= 1 && CB_ROUNDS >= 1 && CB_SECONDS >= 1)) || die "CB_CLIENTS, CB_ROUNDS, CB_SECONDS must be positive"

started=$SECONDS
cmdline="bench/citus/cure.sh${*:+ $*}"
command -v pgbench >/dev/null || die "pgbench not found"
[[ -x /usr/bin/python3 ]] || die "python3 not found"
git -C "$root" rev-parse --git-dir >/dev/null 2>&1 || die "$root is not a git checkout"
before=$(git -C "$root" rev-parse --verify "$CB_BEFORE^{commit}") || die "no commit $CB_BEFORE"
after=$(git -C "$root" rev-parse --verify "$CB_AFTER^{commit}") || die "no commit $CB_AFTER"
before_s=$(git -C "$root" rev-parse --short "$before")
after_s=$(git -C "$root" rev-parse --short "$after")
[[ $before != "$after" ]] || die "BEFORE and AFTER are the same commit ($before_s)"
git -C "$root" diff --quiet "$before" "$after" -- 'idempotency*.sql' idempotency.control ||
    die "$before_s and $after_s differ in their SQL scripts or control file; this compares libraries only"

# shellcheck source=test/citus/cluster.sh
source "$root/test/citus/cluster.sh"   # also scripts/cluster.sh: PG_CONFIG, PG_BINDIR
pkglib=$("$PG_CONFIG" --pkglibdir)
installed=$pkglib/idempotency.so

work=$(mktemp -d "${TMPDIR:-/tmp}/citus-cure.XXXXXX")
chmod 755 "$work"
if [[ -z $out ]]; then
    if [[ $quick == yes ]]; then out=$work/out; else out=$here; fi
fi
mkdir -p "$out" "$work/logs" "$work/scripts" "$work/lib/before" "$work/lib/after"
chmod 755 "$work/lib" "$work/lib/before" "$work/lib/after"
results=$work/cure.tsv
kv=$work/kv.tsv
: >"$kv"
kvput() { printf '%s\t%s\n' "$1" "$2" >>"$kv"; }
printf 'round\tside\tcommit\tpath\ttarget\tclients\tsecs\tops\ttps\tlat_avg_ms\tcpu_coord_s\tcpu_w1_s\tcpu_w2_s\tcpu_client_s\tcpu_machine_s\trss_max_coord_kb\trss_max_w1_kb\trss_max_w2_kb\trss_sum_w1_kb\trss_sum_w2_kb\tlib_backends_w1\tlib_backends_w2\tlibs\n' >"$results"

# ------------------------------------------------------------ cleanup
watchdog=""
bg_pids=()
after_so=""
# restore_installed: pkglibdir holds AFTER's library (atomically: a temp name
# in the same directory, then mv)
restore_installed() {
    [[ -n $after_so && -f $after_so ]] || return 0
    if ! cmp -s "$after_so" "$installed"; then
        log "installing AFTER's library ($after_s) into $pkglib"
        install -m 755 "$after_so" "$pkglib/.idempotency.so.cure.$$" &&
            mv -f "$pkglib/.idempotency.so.cure.$$" "$installed"
    fi
}
cc_cleanup() {
    set +e
    trap '' PIPE
    local p
    for p in "${bg_pids[@]}"; do kill -INT "$p" 2>/dev/null; done
    if [[ -n $watchdog ]]; then kill "$watchdog" 2>/dev/null; wait "$watchdog" 2>/dev/null; fi
    watchdog=""
    citus_cluster_stop
    restore_installed
    rm -rf "$work"
}
trap 'rc=$?; cc_cleanup; exit $rc' EXIT
trap 'trap - EXIT; log "interrupted"; cc_cleanup; exit 130' INT
trap 'trap - EXIT; log "terminated"; cc_cleanup; exit 143' TERM
trap 'trap - EXIT; cc_cleanup; exit 129' HUP
# the watchdog: a TERM to this script after CB_MAX_SECONDS (the trap cleans up)
(
    trap 'kill "$sp" 2>/dev/null; exit 0' TERM
    sleep "$CB_MAX_SECONDS" &
    sp=$!
    wait "$sp"
    echo "citus-cure: watchdog: $CB_MAX_SECONDS s, stopping" >&2
    kill -TERM $$
) &
watchdog=$!

# ------------------------------------------------------------ build
build() { # SIDE REV
    local side=$1 rev=$2 dir=$work/src-$1
    mkdir -p "$dir"
    git -C "$root" archive "$rev" | tar -x -C "$dir"
    log "building $side ($(git -C "$root" rev-parse --short "$rev"))"
    if ! timeout 600 make -C "$dir" -j"$(nproc)" with_llvm=no PG_CONFIG="$PG_CONFIG" \
            PG_CFLAGS="-Wall -Wextra -Werror" >"$work/logs/build-$side.log" 2>&1; then
        tail -n 30 "$work/logs/build-$side.log" >&2
        die "the build of $side failed"
    fi
    install -m 755 "$dir/idempotency.so" "$work/lib/$side/idempotency.so"
}
build before "$before"
build after "$after"
after_so=$work/lib/after/idempotency.so
cmp -s "$work/lib/before/idempotency.so" "$after_so" && die "the two libraries are identical"
log "installing AFTER ($after_s): SQL files and library"
timeout 300 make -C "$work/src-after" install with_llvm=no PG_CONFIG="$PG_CONFIG" >"$work/logs/install.log" 2>&1 ||
    { tail -n 30 "$work/logs/install.log" >&2; die "make install failed"; }
cmp -s "$after_so" "$installed" || die "make install did not install AFTER's library into $pkglib"
kvput before "$before_s $(git -C "$root" show -s --format='%cs %s' "$before")"
kvput after "$after_s $(git -C "$root" show -s --format='%cs %s' "$after")"
# the commits in between that change the library's sources
kvput src_commits "$(git -C "$root" log --format='%h' "$before..$after" -- src Makefile | tr '\n' ' ' | sed 's/ $//')"
kvput so_before "$(md5sum "$work/lib/before/idempotency.so" | cut -c1-12)"
kvput so_after "$(md5sum "$after_so" | cut -c1-12)"

# ------------------------------------------------------------ the cluster
common_settings=(shared_buffers="$CB_SHARED_BUFFERS" autovacuum=off checkpoint_timeout=1h max_wal_size=20GB
                 max_connections=100)
# shellcheck disable=SC2089,SC2090
CITUS_SETTINGS=""
# shellcheck disable=SC2089
for s in "${common_settings[@]}"; do CITUS_SETTINGS+="${s%%=*} = '${s#*=}'"$'\n'; done
# shellcheck disable=SC2090
export CITUS_SETTINGS
log "starting the Citus cluster (coordinator + 2 workers)"
citus_cluster_start --no-traps
C_DIR=$CITUS_DIR
declare -A PORT=([coord]=$CITUS_PORT_COORD [w1]=$CITUS_PORT_W1 [w2]=$CITUS_PORT_W2)
declare -A PMPID=()
for n in coord w1 w2; do PMPID[$n]=$(head -n 1 "$C_DIR/$n/postmaster.pid"); done
NODES=(coord w1 w2)
DB=$CITUS_DB
unset PGHOST PGPORT PGDATABASE

sql() { # NODE [psql args]
    local n=$1
    shift
    PGOPTIONS="-c statement_timeout=600s -c client_min_messages=warning" \
        psql -X -q -v ON_ERROR_STOP=1 -h "$C_DIR" -p "${PORT[$n]}" -U postgres -d "$DB" "$@"
}
val() { sql "$1" -At -c "$2"; }

sql coord -c "CREATE EXTENSION idempotency"
val coord "SELECT idempotency.distribute()" >/dev/null
sql coord -c "INSERT INTO idempotency.job_types (job_type) VALUES ('send_confirmation')"
sql coord -c "INSERT INTO idempotency.operations (job_type, operation_key, status, attempt,
                  claimed_at, heartbeat_at, completed_at)
              SELECT 'send_confirmation', 'DUP-' || g, 'completed', 1,
                  now() - interval '1 day', now() - interval '1 day', now() - interval '1 day'
              FROM generate_series(1, $CB_DUP_POOL) g"

# the keys worker w1 holds (as run.sh): new LR- keys for lk_run.sql, one
# block of CB_CLIENTS * LSTRIDE rows per run; DUP- keys for lk_dup.sql
w1_shards="SELECT s.shardid FROM pg_dist_shard s JOIN pg_dist_placement p USING (shardid)
           JOIN pg_dist_node d ON d.groupid = p.groupid
           WHERE s.logicalrelid = 'idempotency.operations'::regclass AND d.nodeport = ${PORT[w1]}"
LSTRIDE=$((CB_SECONDS * 300 > 1000 ? CB_SECONDS * 300 : 1000))
lk_rows=$((CB_ROUNDS * 2 * CB_CLIENTS * LSTRIDE))
sql w1 -c "CREATE TABLE public.cb_run_keys (i int PRIMARY KEY, k text NOT NULL)" \
       -c "CREATE TABLE public.cb_dup_keys (i int PRIMARY KEY, k text NOT NULL)"
sql coord -c "\\copy (SELECT row_number() OVER (ORDER BY g), 'LR-' || g FROM generate_series(1, $((lk_rows * 2 + lk_rows / 4))) g
                     WHERE get_shard_id_for_distribution_column('idempotency.operations', 'LR-' || g) IN ($w1_shards)) TO '$work/run_keys.tsv'"
sql coord -c "\\copy (SELECT row_number() OVER (ORDER BY g), 'DUP-' || g FROM generate_series(1, $CB_DUP_POOL) g
                     WHERE get_shard_id_for_distribution_column('idempotency.operations', 'DUP-' || g) IN ($w1_shards)) TO '$work/dup_keys.tsv'"
nrun=$(wc -l <"$work/run_keys.tsv")
LDUPN=$(wc -l <"$work/dup_keys.tsv")
((nrun >= lk_rows)) || die "only $nrun LR- keys on w1, $lk_rows needed"
sql w1 -c "\\copy public.cb_run_keys FROM '$work/run_keys.tsv'" -c "\\copy public.cb_dup_keys FROM '$work/dup_keys.tsv'"
rm -f "$work/run_keys.tsv" "$work/dup_keys.tsv"
for n in coord w1 w2; do sql "$n" -c "VACUUM ANALYZE"; done

# ------------------------------------------------------------ the switch
# the extension's C functions on every node: how many, and where they point
nfun=$(val coord "SELECT count(*) FROM pg_proc WHERE probin = '\$libdir/idempotency'")
((nfun > 0)) || die "no C function of the extension found on the coordinator"
for n in w1 w2; do
    [[ $(val "$n" "SELECT count(*) FROM pg_proc WHERE probin = '\$libdir/idempotency'") == "$nfun" ]] ||
        die "$n has not the coordinator's $nfun C functions of the extension"
done
current=""
use_lib() { # SIDE: the C functions of every node point to SIDE's library
    local side=$1 path=$work/lib/$1/idempotency.so n got
    [[ $current == "$side" ]] && return 0
    for n in "${NODES[@]}"; do
        got=$(val "$n" "WITH u AS (UPDATE pg_catalog.pg_proc SET probin = '$path'
                                  WHERE probin IN ('\$libdir/idempotency', '$work/lib/before/idempotency.so',
                                                   '$work/lib/after/idempotency.so') RETURNING 1)
                        SELECT count(*) FROM u")
        [[ $got == "$nfun" ]] || die "$n: $got C functions switched to $side, not $nfun"
    done
    current=$side
}

# ------------------------------------------------------------ measuring
# (the CPU accounting of run.sh)
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
all_ticks() { local n; for n in "${NODES[@]}"; do printf '%s ' "$(node_ticks "${PMPID[$n]}")"; done; machine_ticks; }
HZ=$(getconf CLK_TCK)
secs_of() { awk -v a="$1" -v b="$2" -v hz="$HZ" 'BEGIN { printf "%.3f", (b - a) / hz }'; }

# lib_mapped: how many backends of the three servers have a idempotency.so mapped
lib_mapped() {
    local n p c=0
    for n in "${NODES[@]}"; do
        for p in $(ps -o pid= --ppid "${PMPID[$n]}" 2>/dev/null); do
            grep -qs 'idempotency\.so' "/proc/$p/maps" && c=$((c + 1))
        done
    done
    echo "$c"
}
# quiet: until pgbench's sessions are gone and no backend has the library
# mapped (the worker sessions of the coordinator's backends end after them)
quiet() {
    local n busy
    for _ in $(seq 1 200); do
        busy=0
        for n in "${NODES[@]}"; do
            (($(val "$n" "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgbench'") == 0)) || busy=1
        done
        ((busy == 0)) && (($(lib_mapped) == 0)) && { sleep 0.2; return 0; }
        sleep 0.05
    done
    log "warning: sessions with the library still there after 10 s"
}
checkpoint_all() {
    local n pids=()
    for n in "${NODES[@]}"; do sql "$n" -c CHECKPOINT & pids+=($!); done
    wait "${pids[@]}"
}
script() { # NAME: the path of a pgbench script ready to run
    local name=$1 src
    case $name in
        fn_run|fn_dup) src=$root/bench/pgbench/$name.sql ;;
        *) src=$here/pgbench/$name.sql ;;
    esac
    [[ -f $work/scripts/$name.sql ]] ||
        sed -e 's/@S@/idempotency/g' -e 's/@T@/idempotency.operations/g' "$src" >"$work/scripts/$name.sql"
    echo "$work/scripts/$name.sql"
}

run_no=0
lk_no=0
# run ROUND SIDE PATH TARGET SCRIPTNAME: one measured run, one line of cure.tsv
run() {
    local round=$1 side=$2 path=$3 target=$4 name=$5
    run_no=$((run_no + 1))
    local id="$run_no-r$round-$side-$path-$target" dir=$work/logs/$run_no scr commit
    mkdir -p "$dir"
    chmod 777 "$dir"
    scr=$(script "$name")
    if [[ $side == before ]]; then commit=$before_s; else commit=$after_s; fi
    local base=$((run_no * 100000000)) lbase=0
    if [[ $name == lk_run ]]; then lbase=$((lk_no * CB_CLIENTS * LSTRIDE)); lk_no=$((lk_no + 1)); fi
    quiet
    use_lib "$side"
    checkpoint_all
    local t0 t1 m1 rc=0 pgb sampler
    /usr/bin/python3 "$here/cure_rss.py" 0.5 coord="${PMPID[coord]}" w1="${PMPID[w1]}" w2="${PMPID[w2]}" >"$dir/rss" &
    sampler=$!
    read -r -a t0 < <(all_ticks)
    (
        TIMEFORMAT='%U %S'
        { time timeout -s INT $((CB_SECONDS + 120)) pgbench -n -M prepared -c "$CB_CLIENTS" -j 2 -T "$CB_SECONDS" \
              -h "$C_DIR" -p "${PORT[$target]}" -U postgres \
              -D n=0 -D base="$base" -D stride=1000000 -D dupn="$CB_DUP_POOL" \
              -D ldupn="$LDUPN" -D lstride="$LSTRIDE" -D lbase="$lbase" \
              -f "$scr" "$DB" >"$dir/out" 2>&1; } 2>"$dir/time"
    ) &
    pgb=$!
    bg_pids=("$pgb" "$sampler")
    wait "$pgb" || rc=$?
    m1=$(machine_ticks)
    kill -TERM "$sampler" 2>/dev/null || true
    wait "$sampler" || true
    bg_pids=()
    if ((rc != 0)) || grep -q 'aborted\|ERROR' "$dir/out"; then
        cat "$dir/out" >&2
        die "pgbench failed: $id"
    fi
    quiet
    read -r -a t1 < <(all_ticks)
    local ops tps lat cl
    ops=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$dir/out")
    tps=$(sed -n 's/^tps = \([0-9.]*\) (without initial connection time)/\1/p' "$dir/out")
    lat=$(sed -n 's/^latency average = \([0-9.]*\) ms/\1/p' "$dir/out")
    cl=$(awk '{ s += $1 + $2 } END { printf "%.3f", s }' "$dir/time")
    # coord: max, sum, n; w1: ...; w2: ...; libs
    local rc_max r1_max r1_sum r1_n r2_max r2_sum r2_n libs
    IFS=$'\t' read -r rc_max _ _ r1_max r1_sum r1_n r2_max r2_sum r2_n libs <"$dir/rss"
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' \
        "$round" "$side" "$commit" "$path" "$target" "$CB_CLIENTS" "$CB_SECONDS" "$ops" "$tps" "$lat" \
        "$(secs_of "${t0[0]}" "${t1[0]}")" "$(secs_of "${t0[1]}" "${t1[1]}")" "$(secs_of "${t0[2]}" "${t1[2]}")" \
        "$cl" "$(secs_of "${t0[3]}" "$m1")" "$rc_max" "$r1_max" "$r2_max" "$r1_sum" "$r2_sum" "$r1_n" "$r2_n" "$libs" >>"$results"
    [[ $libs == "$side:"* && $libs != *,* ]] || log "warning: run $id: the backends mapped $libs, not only $side"
    printf 'citus-cure: %-28s %7.0f tps  w1 max RssAnon %7s kB  libs %s\n' "$id" "$tps" "$r1_max" "$libs" >&2
    rm -rf "$dir"
}
order() { # ROUND: before after for odd rounds, after before for even ones
    if (($1 % 2 == 1)); then echo before after; else echo after before; fi
}

# --------------------------------------------------------------- machine
kvput date "$(date -u '+%Y-%m-%d %H:%M UTC')"
kvput cpu "$(lscpu 2>/dev/null | sed -n 's/^Model name:[[:space:]]*//p' | head -n 1)"
kvput cores "$(nproc)"
kvput memory "$(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo)"
kvput os "Debian $(cat /etc/debian_version 2>/dev/null), kernel $(uname -r)"
kvput postgresql "$(val coord 'SHOW server_version')"
kvput pgbench "$(pgbench --version | awk '{ print $3 }')"
kvput citus "$(val coord "SELECT citus_version()" | sed 's/ on .*//')"
kvput idempotency "$(val coord "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'")"
kvput settings "$(val coord "SELECT string_agg(name || '=' || current_setting(name), ', ' ORDER BY name)
    FROM pg_settings WHERE name IN ('shared_buffers', 'fsync', 'synchronous_commit', 'autovacuum',
    'max_wal_size', 'checkpoint_timeout', 'max_connections', 'citus.shard_count',
    'citus.max_cached_conns_per_worker', 'citus.enable_local_execution')")"
kvput dup_pool "$CB_DUP_POOL"
kvput dup_pool_on_w1 "$LDUPN"
kvput c_functions "$nfun"
kvput mode "clients=$CB_CLIENTS rounds=$CB_ROUNDS x ${CB_SECONDS}s"
kvput command "$cmdline"
kvput load_before "$(cut -d' ' -f1-3 /proc/loadavg)"

# ------------------------------------------------------------ the rounds
log "setup done in $((SECONDS - started)) s; $CB_ROUNDS rounds of 4 x 2 runs of ${CB_SECONDS}s"
for r in $(seq 1 "$CB_ROUNDS"); do
    for s in $(order "$r"); do run "$r" "$s" run coord fn_run; done
    for s in $(order "$r"); do run "$r" "$s" dup coord fn_dup; done
    for s in $(order "$r"); do run "$r" "$s" run w1 lk_run; done
    for s in $(order "$r"); do run "$r" "$s" dup w1 lk_dup; done
done
quiet
use_lib after

# ------------------------------------------------------------ the end
kvput load_after "$(cut -d' ' -f1-3 /proc/loadavg)"
kvput records "$(val coord "SELECT count(*) FROM idempotency.operations")"
kvput records_claimed_left "$(val coord "SELECT count(*) FROM idempotency.operations WHERE status = 'claimed'")"
# what pkglibdir holds now (someone else may have installed a library
# meanwhile: the runs above load theirs from $work/lib, so that changes
# nothing here), then AFTER's again
kvput installed_so "$(md5sum "$installed" | cut -c1-12)"
restore_installed
kvput installed_restored "$(md5sum "$installed" | cut -c1-12)"
kvput duration_s "$((SECONDS - started))"
{
    sed 's/^/# /' "$kv"
    cat "$results"
} >"$out/cure.tsv"
/usr/bin/python3 "$here/cure_report.py" "$out/cure.tsv" >"$out/cure.md"
log "done in $((SECONDS - started)) s: $out/cure.md"
if [[ $quick == yes ]]; then cat "$out/cure.md"; fi
