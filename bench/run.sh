#!/usr/bin/env bash
# bench/run.sh: the benchmark suite. `make bench` runs it; see bench/README.md.
#
#   bench/run.sh [--smoke] [--existing-cluster] [--out DIR] [--proto DIR]
#                [--phases LIST]
#
# Three implementations of the claim protocol, side by side in one run on one
# throwaway cluster: raw (the seed's recipe in raw SQL, bench/sql/raw.sql and
# bench/pgbench/raw_*.sql), portable (the portable edition, SQL and
# PL/pgSQL: the plain script portable/build.sh writes, installed with psql -f
# into databases of its own, *_portable, since it uses the extension's schema
# name) and c (the extension). portable and c run the same pgbench scripts
# (bench/pgbench/fn_*.sql, batch_*.sql). Phases, in this order:
#   verdicts  portable and c give the same verdicts and SQLSTATEs for one
#             scripted sequence (bench/sql/verdicts.sql); fails otherwise
#   sizes     run path on fresh tables with keys ORD-1000001...: table + index
#             bytes, WAL bytes, full-page images and xids per operation, HOT
#   matrix    pgbench -M prepared: run and dup paths at $BENCH_CLIENTS
#             clients, tx, stale and mixed at $BENCH_SIDE_CLIENTS; $BENCH_REPS
#             repetitions, interleaved (the order of the implementations
#             rotates); plus "pk", a plain primary-key SELECT, on the dup path
#   batch     c and portable, at $BENCH_BATCH_CLIENTS clients: the batch calls
#             claim_operations()/complete_operations() with batches of
#             $BENCH_BATCH_SIZES keys (bench/pgbench/batch_*.sql; run path:
#             claim N, complete N, two transactions per batch; duplicate
#             path: claim N completed keys) against the single calls
#             (fn_run.sql, fn_dup.sql) of the same edition (cells c, bN,
#             portable, pbN) and, if redis-server is installed,
#             durable Redis's claim (SET NX PX) and done (SET) writes, all
#             interleaved in $BENCH_REPS repetitions; operations/s count
#             keys, latency is per pgbench transaction (a batch)
#   scale     c only: run path with $BENCH_SCALE_BIG records present vs
#             $BENCH_SCALE_SMALL (two databases, interleaved); stale_claims()
#             on the big table with $BENCH_STALE_ROWS stale claims; the
#             purge of $BENCH_PURGE_ROWS expired records while the run path
#             runs at a fixed rate (p99 before and during), twice:
#             purge_operations() (one transaction), then the same number
#             again with the paced procedure CALL idempotency.purge()
#   redis     redis-server on 127.0.0.1 ($BENCH_REDIS_PORT, else a free
#             port; appendonly yes,
#             appendfsync always) with redis-benchmark: SET NX PX (claim),
#             SET (done), SET NX on an existing key (duplicate)
#   report    bench/report.py writes README.md and, with gnuplot, its figures
#             throughput.png and batch.png into the output directory
#
# Options:
#   --smoke             tiny sizes, one repetition, transaction counts instead
#                       of durations: checks that every script works (the test
#                       suite's hook scripts/test.d/60-bench-smoke.sh). Its
#                       numbers mean nothing. Output goes to a temp dir unless
#                       --out is given.
#   --existing-cluster  use the server at PGHOST/PGPORT/PGUSER (superuser) with
#                       the extension installed: no build, no install, no
#                       cluster of our own. Databases bench_<pid>_* are
#                       created and dropped again.
#   --out DIR           where results.tsv, kv.tsv, machine.txt, README.md,
#                       throughput.png and batch.png go (default: bench/, i.e.
#                       the report in the repository, for a full run)
#   --proto DIR         also benchmark the extension tree in DIR as a fourth
#                       implementation "proto": its copy is renamed to
#                       idempotency_proto (module, control file, schema), built
#                       and installed under that name (bench/proto-rename.sh);
#                       the installed idempotency is not touched
#   --phases LIST       comma-separated subset of the phases above
#
# Settings (environment; defaults for a full run, about 16 minutes on the
# 2-core machine of the report): BENCH_SECONDS=4 per pgbench run, BENCH_REPS=3,
# BENCH_CLIENTS="1 4 16 32", BENCH_SIDE_CLIENTS=16, BENCH_DUP_POOL=100000,
# BENCH_SIZE_OPS=40000, BENCH_SCALE_BIG=10000000, BENCH_SCALE_SMALL=10000,
# BENCH_PURGE_ROWS=1000000, BENCH_STALE_ROWS=300, BENCH_PURGE_CLIENTS=4,
# BENCH_PATHS="run dup tx stale mixed" (the matrix's paths),
# BENCH_PURGE_RATE (default: a quarter of the c run path's 4-client median),
# BENCH_REDIS=auto|no, BENCH_REDIS_PORT, BENCH_SHARED_BUFFERS=1GB; the paced purge that is
# compared with purge_operations(), CALL idempotency.purge(pages, pause):
# BENCH_PACED_PAGES=20 pages per transaction, BENCH_PACED_PAUSE_MS=20;
# the batch phase: BENCH_BATCH_SIZES="10 100", BENCH_BATCH_CLIENTS=16.
#
# The portable edition is always this tree's: portable/build.sh writes its
# plain script into the run's temp dir.
#
# Without --existing-cluster: builds and installs the extension like
# scripts/test (scripts/build.sh; the install is skipped when the installed
# files already match the build), then starts a throwaway cluster
# (scripts/cluster.sh, Unix socket only) that is stopped and removed at the
# end, also on error or Ctrl-C. Redis, when started, is stopped the same way.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)

smoke=no
existing=no
out=""
proto_src=""
phases="verdicts,sizes,matrix,batch,scale,redis,report"

die() { echo "bench: error: $*" >&2; exit 1; }
log() { echo "bench: $*" >&2 || true; }

while (($#)); do
    case $1 in
        --smoke) smoke=yes; shift ;;
        --existing-cluster) existing=yes; shift ;;
        --out) [[ $# -ge 2 ]] || die "--out needs a directory"; out=$2; shift 2 ;;
        --proto) [[ $# -ge 2 ]] || die "--proto needs a directory"; proto_src=$(cd "$2" && pwd); shift 2 ;;
        --phases) [[ $# -ge 2 ]] || die "--phases needs a list"; phases=$2; shift 2 ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) die "unknown argument: $1 (try --help)" ;;
    esac
done
want() { [[ ,$phases, == *",$1,"* ]]; }

if [[ $smoke == yes ]]; then
    : "${BENCH_TX:=20}" "${BENCH_REPS:=1}" "${BENCH_CLIENTS:=1 2}" "${BENCH_SIDE_CLIENTS:=2}"
    : "${BENCH_DUP_POOL:=1000}" "${BENCH_SIZE_OPS:=400}" "${BENCH_SCALE_BIG:=20000}"
    : "${BENCH_SCALE_SMALL:=1000}" "${BENCH_PURGE_ROWS:=5000}" "${BENCH_STALE_ROWS:=30}"
    : "${BENCH_PURGE_CLIENTS:=2}" "${BENCH_PURGE_RATE:=100}" "${BENCH_SHARED_BUFFERS:=128MB}"
    : "${BENCH_PURGE_BATCH:=1000}" "${BENCH_BATCH_CLIENTS:=2}"
fi
: "${BENCH_SECONDS:=4}" "${BENCH_REPS:=3}" "${BENCH_CLIENTS:=1 4 16 32}" "${BENCH_SIDE_CLIENTS:=16}"
: "${BENCH_DUP_POOL:=100000}" "${BENCH_SIZE_OPS:=40000}" "${BENCH_SCALE_BIG:=10000000}"
: "${BENCH_SCALE_SMALL:=10000}" "${BENCH_PURGE_ROWS:=1000000}" "${BENCH_STALE_ROWS:=300}"
: "${BENCH_PURGE_CLIENTS:=4}" "${BENCH_PURGE_RATE:=}" "${BENCH_REDIS:=auto}" "${BENCH_REDIS_PORT:=}"
: "${BENCH_SHARED_BUFFERS:=1GB}" "${BENCH_PURGE_BATCH:=10000}" "${BENCH_TX:=}"
: "${BENCH_PACED_PAGES:=20}" "${BENCH_PACED_PAUSE_MS:=20}" "${BENCH_PATHS:=run dup tx stale mixed}"
: "${BENCH_BATCH_SIZES:=10 100}" "${BENCH_BATCH_CLIENTS:=16}"
# which PostgreSQL: PG_CONFIG or PG_MAJOR, else the newest supported server installed
# shellcheck source=scripts/versions.sh
source "$root/scripts/versions.sh"
versions_resolve

if [[ -z $out ]]; then
    if [[ $smoke == yes ]]; then out=""; else out=$here; fi
fi

started=$SECONDS
cmdline="$*"
export PGOPTIONS="${PGOPTIONS:-} -c client_min_messages=warning"
work=$(mktemp -d "${TMPDIR:-/tmp}/bench.XXXXXX")
[[ -n $out ]] || out=$work/out
mkdir -p "$out" "$work/scripts" "$work/logs"
results=$work/results.tsv      # one line per pgbench run
kv=$work/kv.tsv                # phase, name, value: everything else
printf 'phase\tpath\timpl\tclients\trep\tops\tsecs\ttps\tlat_mean_ms\tp50_ms\tp95_ms\tp99_ms\twal_bytes\twal_fpi\twal_records\txids\tupd\thot_upd\tbackend_cpu_s\tbg_cpu_s\tclient_cpu_s\tmachine_cpu_s\n' >"$results"
printf 'phase\tname\tvalue\n' >"$kv"
kvput() { printf '%s\t%s\t%s\n' "$1" "$2" "$3" >>"$kv"; }

# the portable edition: the plain script users install with psql -f
sh "$root/portable/build.sh" "$work/portable" >/dev/null || die "portable/build.sh failed"
portable_sql=$work/portable/idempotency-portable.sql
[[ -s $portable_sql ]] || die "portable/build.sh wrote no $portable_sql"

redis_pid=""
dbs_created=()
bench_cleanup() {
    set +e
    if [[ -n $redis_pid ]] && kill -0 "$redis_pid" 2>/dev/null; then
        kill -TERM "$redis_pid" 2>/dev/null
        local i
        for i in $(seq 1 50); do kill -0 "$redis_pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$redis_pid" 2>/dev/null
    fi
    redis_pid=""
    if [[ $existing == yes ]]; then
        local d
        for d in "${dbs_created[@]}"; do
            psql -X -q -d postgres -c "DROP DATABASE IF EXISTS \"$d\" WITH (FORCE)" >/dev/null 2>&1
        done
    fi
    rm -rf "$work"
}

# ------------------------------------------------------------- packages
# Debian packages the suite uses: python3 (report, percentiles) always;
# gnuplot-nox (the plot), redis-server and redis-tools (the Redis peer) for a
# full run (the smoke run skips what is missing). Installed when root, as
# scripts/deps does for the build; otherwise the command is printed.
bench_deps() {
    local need=() pkg
    [[ -x /usr/bin/python3 ]] || need+=(python3)
    if [[ $smoke == no ]]; then
        command -v gnuplot >/dev/null || need+=(gnuplot-nox)
        if [[ $BENCH_REDIS != no ]]; then
            command -v redis-server >/dev/null || need+=(redis-server)
            command -v redis-benchmark >/dev/null || need+=(redis-tools)
        fi
    fi
    ((${#need[@]})) || return 0
    if ((EUID != 0)); then
        die "missing packages: ${need[*]}; install them with: sudo apt-get install -y ${need[*]}"
    fi
    log "installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    local apt_opts=(-o DPkg::Lock::Timeout=600 -o Dpkg::Use-Pty=0)
    if ! apt-get "${apt_opts[@]}" install -y -qq "${need[@]}" >/dev/null; then
        apt-get "${apt_opts[@]}" update -qq
        apt-get "${apt_opts[@]}" install -y -qq "${need[@]}" >/dev/null ||
            die "apt-get install ${need[*]} failed"
    fi
    for pkg in "${need[@]}"; do log "installed $pkg"; done
}
bench_deps

# ---------------------------------------------------------------- the server
if [[ $existing == yes ]]; then
    [[ -n ${PGHOST:-} && -n ${PGPORT:-} ]] || die "--existing-cluster needs PGHOST and PGPORT"
    export PGUSER=${PGUSER:-postgres}
    trap 'bench_cleanup' EXIT
    trap 'bench_cleanup; exit 130' INT
    trap 'bench_cleanup; exit 143' TERM
    PG_BINDIR=$("$PG_CONFIG" --bindir)
    export PATH="$PG_BINDIR:$PATH"
    dbprefix="bench_$$_"
else
    # shellcheck source=scripts/cluster.sh
    source "$root/scripts/cluster.sh"
    # shellcheck source=scripts/build.sh
    source "$root/scripts/build.sh"
    cluster_require_headers
    build_extension "$root"
    stale=no
    while read -r src dst; do cmp -s "$src" "$dst" || stale=yes; done < <(_installed_pairs "$root")
    if [[ $stale == yes ]]; then
        install_extension "$root"
    else
        log "install: the installed idempotency matches this build; not reinstalling"
    fi
    cluster_cleanup_hook() { bench_cleanup; }
    dbprefix=""
fi

# the prototype: a renamed copy, built and installed as idempotency_proto
impls=(raw portable c)
if [[ -n $proto_src ]]; then
    [[ $existing == no ]] || die "--proto needs a cluster of our own (no --existing-cluster)"
    proto_tree=$work/proto-tree
    mkdir -p "$proto_tree"
    tar -C "$proto_src" --exclude=./.git --exclude='*.o' --exclude='*.so' -cf - . | tar -C "$proto_tree" -xf -
    bash "$here/proto-rename.sh" "$proto_tree"
    build_extension "$proto_tree"
    install_extension "$proto_tree"
    impls+=(proto)
fi

if [[ $existing == no ]]; then
    cluster_start -c shared_buffers="$BENCH_SHARED_BUFFERS" -c max_wal_size=20GB \
        -c checkpoint_timeout=1h -c autovacuum=off -c max_connections=100 \
        -c maintenance_work_mem=512MB -c work_mem=64MB
fi
psql -X -q -d postgres -c 'SELECT 1' >/dev/null || die "cannot connect to the server"

# ------------------------------------------------------------------ helpers
# q DB ARGS...: psql that stops at the first error
q() { local db=$1; shift; psql -X -q -v ON_ERROR_STOP=1 -d "$db" "$@"; }
# val DB SQL: one value
val() { psql -X -q -A -t -v ON_ERROR_STOP=1 -d "$1" -c "$2"; }

# newdb NAME [portable]: a fresh database; its name (with the prefix) is in
# $db. With "portable" also NAME_portable, the portable edition's database
# (impl_db names it).
newdb() {
    local d
    db=$dbprefix$1
    for d in "$db" ${2:+"${db}_portable"}; do
        psql -X -q -d postgres -c "DROP DATABASE IF EXISTS \"$d\"" >/dev/null
        psql -X -q -d postgres -c "CREATE DATABASE \"$d\"" >/dev/null
        dbs_created+=("$d")
    done
}
# impl_db IMPL DB: the database IMPL runs in, of the pair newdb DB portable
# made: the portable edition has one of its own (it creates schema
# idempotency, as the extension does), the others share DB
impl_db() { case $1 in portable|pb[0-9]*) echo "${2}_portable" ;; *) echo "$2" ;; esac; }

# per implementation: function schema, records table, side-effect schema
fn_schema() { case $1 in c|portable) echo idempotency ;; proto) echo idempotency_proto ;; esac; }
ops_table() {
    case $1 in
        raw) echo bench_raw.handled_operations ;;
        c|pk|c@*|b[0-9]*|portable|pb[0-9]*) echo idempotency.operations ;;
        proto) echo idempotency_proto.operations ;;
    esac
}
side_schema() { case $1 in raw) echo bench_raw ;; portable) echo bench_portable ;; c) echo bench_c ;; proto) echo bench_proto ;; esac; }

# setup_db DB IMPL...: the schemas of these implementations, each in its
# database (impl_db)
setup_db() {
    local db=$1 impl idb; shift
    for impl in "$@"; do
        idb=$(impl_db "$impl" "$db")
        case $impl in
            raw) q "$idb" -f "$here/sql/raw.sql" ;;
            portable) q "$idb" -f "$portable_sql" >/dev/null ;;
            c) q "$idb" -c 'CREATE EXTENSION idempotency' ;;
            proto) q "$idb" -c 'CREATE EXTENSION idempotency_proto' ;;
        esac
        case $impl in
            portable|c|proto) q "$idb" -v S="$(fn_schema "$impl")" -v SIDE="$(side_schema "$impl")" \
                                  -f "$here/sql/fn_setup.sql" ;;
        esac
    done
}

# the pgbench scripts, one per implementation and path
make_scripts() {
    local impl path src
    for impl in "${impls[@]}" pk; do
        for path in run dup tx stale mixed; do
            case $impl in
                raw) src=$here/pgbench/raw_$path.sql ;;
                pk) [[ $path == dup ]] || continue; src=$here/pgbench/pk_dup.sql ;;
                *) src=$here/pgbench/fn_$path.sql ;;
            esac
            sed -e "s/@S@/$(fn_schema "$impl")/g" \
                -e "s/@SIDE@/$(side_schema "$impl").side_effects/g" \
                -e "s/@T@/$(ops_table "$impl")/g" "$src" >"$work/scripts/${impl}_$path.sql"
        done
    done
    # the batch calls: the same script for both editions (schema idempotency)
    for path in run dup; do
        sed -e "s/@S@/$(fn_schema c)/g" "$here/pgbench/batch_$path.sql" >"$work/scripts/batch_$path.sql"
    done
}

# rows: completed keys PREFIX1..PREFIXn of job type send_confirmation
load_completed() {
    local db impl=$2 prefix=$3 n=$4
    db=$(impl_db "$impl" "$1")
    if [[ $impl == raw ]]; then
        q "$db" -c "INSERT INTO bench_raw.handled_operations (job_type, operation_key, status, claimed_at)
                    SELECT 'send_confirmation', '$prefix' || g, 'completed', now() - interval '1 day'
                    FROM generate_series(1, $n) g"
    else
        q "$db" -c "INSERT INTO $(ops_table "$impl") (job_type, operation_key, status, attempt,
                        claimed_at, heartbeat_at, completed_at)
                    SELECT 'send_confirmation', '$prefix' || g, 'completed', 1,
                        now() - interval '1 day', now() - interval '1 day', now() - interval '1 day'
                    FROM generate_series(1, $n) g"
    fi
}

# stale claims STALE-<cell>-<c * 1000000 + n>, c < clients, n <= per_client
load_stale() {
    local db impl=$2 cell=$3 clients=$4 per=$5
    db=$(impl_db "$impl" "$1")
    local keys="FROM generate_series(0, $((clients - 1))) c, generate_series(1, $per) g"
    local key="'STALE-$cell-' || (c * 1000000 + g)"
    if [[ $impl == raw ]]; then
        q "$db" -c "INSERT INTO bench_raw.handled_operations (job_type, operation_key, status, claimed_at)
                    SELECT 'stale_retry', $key, 'claimed', now() - interval '1 hour' $keys"
    else
        q "$db" -c "INSERT INTO $(ops_table "$impl") (job_type, operation_key, status, attempt,
                        claimed_at, heartbeat_at)
                    SELECT 'stale_retry', $key, 'claimed', 1,
                        now() - interval '1 hour', now() - interval '1 hour' $keys"
    fi
}

# snap DB TABLE: wal_lsn_bytes xid fpi records upd hot_upd
snap() {
    val "$1" "SELECT (pg_current_wal_lsn() - '0/0')::bigint,
                     pg_snapshot_xmax(pg_current_snapshot())::text::bigint,
                     w.wal_fpi, w.wal_records,
                     coalesce(s.n_tup_upd, 0), coalesce(s.n_tup_hot_upd, 0)
              FROM pg_stat_wal w
              LEFT JOIN pg_stat_user_tables s ON s.relid = '$2'::regclass" | tr '|' ' '
}

# backend_cpu: CPU seconds (user + system) of the postmaster's children that
# have exited and been reaped: the backends of finished sessions. The
# difference over a pgbench run is the server CPU its sessions used (the
# psql sessions around it add a few ms; the background processes, which do
# not exit, are not counted).
postmaster_pid() {
    local f=${PGDATA:-}/postmaster.pid
    if [[ -r $f ]]; then head -n 1 "$f"; fi
}
backend_cpu() {
    local pid
    pid=$(postmaster_pid)
    if [[ -n $pid && -r /proc/$pid/stat ]]; then
        # after the ") " that ends the command name: cutime and cstime are
        # the 14th and 15th fields, in clock ticks
        awk -v hz="$(getconf CLK_TCK)" '{ sub(/^.*\) /, ""); printf "%.2f", ($14 + $15) / hz }' "/proc/$pid/stat"
    fi
}
# bg_ticks: "pid ticks" lines, utime + stime of the postmaster and of its
# children alive now (the background processes: WAL writer, checkpointer,
# background writer, ...); bg_cpu_delta BEFORE AFTER: the CPU seconds of the
# processes in both lists (a backend that exited in between is in
# backend_cpu's cutime instead)
bg_ticks() {
    local pm p
    pm=$(postmaster_pid)
    [[ -n $pm && -r /proc/$pm/stat ]] || return 0
    for p in "$pm" $(ps -o pid= --ppid "$pm" 2>/dev/null); do
        awk -v p="$p" '{ sub(/^.*\) /, ""); print p, $12 + $13 }' "/proc/$p/stat" 2>/dev/null || true
    done
}
bg_cpu_delta() {
    [[ -n $1 && -n $2 ]] || return 0
    awk -v hz="$(getconf CLK_TCK)" 'NR == FNR { t[$1] = $2; next }
        ($1 in t) { d += $2 - t[$1] } END { printf "%.2f", d / hz }' <(echo "$1") <(echo "$2")
}
# machine_ticks: busy ticks of the whole machine (all CPUs: user, nice,
# system, irq, softirq, steal), from /proc/stat
machine_ticks() { awk '$1 == "cpu" { print $2 + $3 + $4 + $7 + $8 + $9; exit }' /proc/stat; }
# others_share: the machine's busy share (0..1 of all CPUs) over half a
# second while this suite is idle: the other work on a shared machine
others_share() {
    local m0 m1
    m0=$(machine_ticks)
    sleep 0.5
    m1=$(machine_ticks)
    awk -v a="$m0" -v b="$m1" -v hz="$(getconf CLK_TCK)" -v n="$(nproc)" \
        'BEGIN { printf "%.2f", (b - a) / hz / 0.5 / n }'
}
ticks_s() { awk -v a="$1" -v b="$2" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.2f", (b - a) / hz }'; }

# wait until pgbench's backends are gone, so that their statistics are in
wait_quiet() {
    local db=$1 i
    for i in $(seq 1 100); do
        [[ $(val "$db" "SELECT count(*) FROM pg_stat_activity
                        WHERE datname = current_database() AND pid <> pg_backend_pid()
                          AND backend_type = 'client backend'") == 0 ]] && break
        sleep 0.05
    done
    sleep 0.2
}

# len_args: how long one pgbench run lasts
if [[ -n $BENCH_TX ]]; then len_args=(-t "$BENCH_TX"); else len_args=(-T "$BENCH_SECONDS"); fi

cell_no=0
# run_cell PHASE PATH IMPL CLIENTS REP DB [PGBENCH ARGS...]: one pgbench run,
# one line of results.tsv, in IMPL's database of DB's pair (impl_db). Keys
# are unique per cell (base, cell).
run_cell() {
    local phase=$1 path=$2 impl=$3 clients=$4 rep=$5 db
    db=$(impl_db "$impl" "$6")
    shift 6
    cell_no=$((cell_no + 1))
    local id="$cell_no-$phase-$path-$impl-c$clients-r$rep"
    local dir=$work/logs/$id
    mkdir -p "$dir"
    local table threads script=$work/scripts/${impl%@*}_$path.sql mult=1
    # bN (c), pbN (portable): the batch scripts with N keys per call; an
    # operation is a key
    if [[ $impl =~ ^p?b([0-9]+)$ ]]; then
        mult=${BASH_REMATCH[1]}
        script=$work/scripts/batch_$path.sql
        set -- "$@" -D bs="$mult"
    fi
    table=$(ops_table "$impl")
    threads=$((clients < 2 ? 1 : 2))
    q "$db" -c CHECKPOINT
    local b a cpu0 cpu1 bg0 bg1 m0 m1 rc=0
    read -r -a b < <(snap "$db" "$table")
    sleep 0.1
    cpu0=$(backend_cpu)
    bg0=$(bg_ticks)
    m0=$(machine_ticks)
    # bash's time: user + system CPU of pgbench (all its threads)
    local TIMEFORMAT='%U %S'
    { time pgbench -n -M prepared -c "$clients" -j "$threads" "${len_args[@]}" \
            -D n=0 -D base=$((cell_no * 100000000)) -D stride=1000000 -D cell="$cell_no" \
            -D dupn="$BENCH_DUP_POOL" -l --log-prefix="$dir/tx" "$@" \
            -f "$script" "$db" >"$dir/out" 2>&1; } 2>"$dir/time" || rc=$?
    if ((rc != 0)); then
        cat "$dir/out" >&2
        die "pgbench failed: $id"
    fi
    if grep -q 'aborted' "$dir/out"; then
        cat "$dir/out" >&2
        die "pgbench: a client aborted: $id"
    fi
    m1=$(machine_ticks)
    wait_quiet "$db"
    cpu1=$(backend_cpu)
    bg1=$(bg_ticks)
    read -r -a a < <(snap "$db" "$table")
    local ops tps secs lat cpu="" bgcpu clcpu mcpu
    [[ -z $cpu0 || -z $cpu1 ]] || cpu=$(awk -v a="$cpu0" -v b="$cpu1" 'BEGIN { printf "%.2f", b - a }')
    bgcpu=$(bg_cpu_delta "$bg0" "$bg1")
    clcpu=$(awk '{ printf "%.2f", $1 + $2 }' "$dir/time")
    mcpu=$(ticks_s "$m0" "$m1")
    ops=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$dir/out")
    tps=$(sed -n 's/^tps = \([0-9.]*\) (without initial connection time)/\1/p' "$dir/out")
    ops=$((ops * mult))
    tps=$(awk -v t="$tps" -v m="$mult" 'BEGIN { printf "%.6f", t * m }')
    secs=$(awk -v o="$ops" -v t="$tps" 'BEGIN { printf "%.3f", (t > 0 ? o / t : 0) }')
    lat=$(/usr/bin/python3 "$here/lat.py" "$dir"/tx.*)
    local n mean p50 p95 p99 max
    read -r n mean p50 p95 p99 max <<<"$lat"
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' \
        "$phase" "$path" "$impl" "$clients" "$rep" "$ops" "$secs" "$tps" "$mean" "$p50" "$p95" "$p99" \
        $((a[0] - b[0])) $((a[2] - b[2])) $((a[3] - b[3])) $((a[1] - b[1])) \
        $((a[4] - b[4])) $((a[5] - b[5])) "$cpu" "$bgcpu" "$clcpu" "$mcpu" >>"$results"
    printf 'bench: %-44s %9.0f ops/s  p99 %7s ms  WAL %6s B/op  CPU %5s us/op\n' "$id" "$tps" "$p99" \
        "$(awk -v w=$((a[0] - b[0])) -v o="$ops" 'BEGIN { printf "%.0f", (o > 0 ? w / o : 0) }')" \
        "$(awk -v c="$cpu" -v o="$ops" 'BEGIN { if (c == "" || o == 0) print "?"; else printf "%.0f", c * 1e6 / o }')" >&2
    # which WAL records were written during a duplicate-path run of an
    # edition (the claims should write none; the background writer logs
    # RUNNING_XACTS every 15 s)
    # (pg_waldump may stop with an error at the end of what is on disk: what
    # it printed until then counts, its exit status does not)
    if [[ $phase == matrix && $path == dup && ( $impl == c || $impl == proto || $impl == portable ) && $((a[0] - b[0])) -gt 0 && -n ${PGDATA:-} ]]; then
        local recs
        recs=$( { cd / && cluster_as_owner_or_self "$PG_BINDIR/pg_waldump" -p "$PGDATA/pg_wal" \
                   -s "$(val "$db" "SELECT '0/0'::pg_lsn + ${b[0]}")" -e "$(val "$db" "SELECT '0/0'::pg_lsn + ${a[0]}")" \
                   2>/dev/null || true; } | sed -n 's/^rmgr: \([A-Za-z0-9]*\) .*desc: \([A-Z_0-9]*\).*/\1\/\2/p' | sort | uniq -c |
               awk '{ printf "%s%s:%s", (NR > 1 ? " " : ""), $2, $1 }')
        kvput dupwal "$impl" "${recs:-unknown}"
    fi
    # -r (per-statement latencies) is kept for the scale phase
    cp "$dir/out" "$work/logs/last.out"
    rm -rf "$dir"
}

# run a command as the cluster's owner when root (pg_waldump reads pg_wal)
cluster_as_owner_or_self() {
    if ((EUID == 0)); then runuser -u postgres -- "$@"; else "$@"; fi
}

# rotate N: the implementations in the order of repetition N
rotate() {
    local list=("${@:2}") n=$1 k i out=()
    k=$(( (n - 1) % ${#list[@]} ))
    for ((i = 0; i < ${#list[@]}; i++)); do out+=("${list[(k + i) % ${#list[@]}]}"); done
    echo "${out[@]}"
}

# ------------------------------------------------------------- the machine
{
    echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "cpu: $(lscpu 2>/dev/null | sed -n 's/^Model name:[[:space:]]*//p' | head -n 1)"
    echo "cores: $(nproc)"
    echo "memory: $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo)"
    echo "os: Debian $(cat /etc/debian_version 2>/dev/null), kernel $(uname -r)"
    echo "postgresql: $(val postgres 'SHOW server_version')"
    echo "pgbench: $(pgbench --version | awk '{ print $3 }')"
    echo "redis: $(redis-server --version 2>/dev/null | awk '{ print $3 }' | sed 's/v=//')"
    echo "commit: $(git -C "$root" rev-parse --short HEAD 2>/dev/null)$(git -C "$root" diff --quiet HEAD -- src idempotency--*.sql portable 2>/dev/null || echo ' (src modified)')"
    echo "settings: $(val postgres "SELECT string_agg(name || '=' || current_setting(name), ', ' ORDER BY name)
        FROM pg_settings WHERE name IN ('shared_buffers', 'fsync', 'synchronous_commit', 'wal_level',
        'full_page_writes', 'autovacuum', 'max_wal_size', 'checkpoint_timeout', 'wal_compression', 'data_checksums')")"
    echo "load_before: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "mode: $([[ $smoke == yes ]] && echo smoke || echo full) seconds=$BENCH_SECONDS reps=$BENCH_REPS clients=$BENCH_CLIENTS side_clients=$BENCH_SIDE_CLIENTS batch_sizes=$BENCH_BATCH_SIZES batch_clients=$BENCH_BATCH_CLIENTS"
    echo "impls: ${impls[*]}"
    echo "command: bench/run.sh $cmdline"
} >"$work/machine.txt"

make_scripts

# ------------------------------------------------------------------ verdicts
if want verdicts; then
    log "phase verdicts"
    newdb verdicts portable
    setup_db "$db" "${impls[@]}"
    ref=""
    for impl in "${impls[@]}"; do
        [[ $impl == raw ]] && continue
        psql -X -d "$(impl_db "$impl" "$db")" -v S="$(fn_schema "$impl")" -f "$here/sql/verdicts.sql" \
            >"$work/verdicts.$impl" 2>/dev/null || true
        [[ -s $work/verdicts.$impl ]] || die "verdicts: no output from $impl"
        if [[ -z $ref ]]; then
            ref=$impl
        elif ! diff -u "$work/verdicts.$ref" "$work/verdicts.$impl" >&2; then
            die "verdicts: $impl and $ref differ (diff above)"
        fi
    done
    kvput verdicts same "$(printf '%s ' "${impls[@]}" | sed 's/raw //')"
    log "verdicts: identical for ${impls[*]:1}"
fi

# --------------------------------------------------------------------- sizes
if want sizes; then
    log "phase sizes"
    # 4 clients: four interleaved streams of increasing keys (the index
    # splits pages in the middle); 1 client: one increasing stream (the
    # index fills its pages up to the btree fillfactor)
    for sc in 4 1; do
        tag=$([[ $sc == 1 ]] && echo seq. || echo "")
        newdb "sizes_c$sc" portable
        setup_db "$db" "${impls[@]}"
        per=$((sc == 1 ? BENCH_SIZE_OPS / 2 : BENCH_SIZE_OPS / 4))
        base_db=$db
        for impl in "${impls[@]}"; do
            table=$(ops_table "$impl")
            db=$(impl_db "$impl" "$base_db")
            q "$db" -c CHECKPOINT
            read -r -a b < <(snap "$db" "$table")
            pgbench -n -M prepared -c "$sc" -j $((sc < 2 ? 1 : 2)) -t "$per" -D n=0 -D base=1000000 \
                -D stride="$per" -D cell=0 -D dupn=1 -f "$work/scripts/${impl}_run.sql" "$db" \
                >"$work/sizes.out" 2>&1 || { cat "$work/sizes.out" >&2; die "pgbench failed (sizes, $impl)"; }
            wait_quiet "$db"
            sleep 0.5
            read -r -a a < <(snap "$db" "$table")
            IFS='|' read -r rows completed total heap idx nidx minkey maxkey < <(val "$db" "
                SELECT count(*), count(*) FILTER (WHERE status = 'completed'),
                       pg_total_relation_size('$table'), pg_table_size('$table'),
                       pg_indexes_size('$table'),
                       (SELECT count(*) FROM pg_index WHERE indrelid = '$table'::regclass),
                       min(operation_key), max(operation_key)
                FROM $table")
            kvput sizes "$impl.${tag}clients" "$sc"
            kvput sizes "$impl.${tag}rows" "$rows"
            kvput sizes "$impl.${tag}completed" "$completed"
            kvput sizes "$impl.${tag}total_bytes" "$total"
            kvput sizes "$impl.${tag}table_bytes" "$heap"
            kvput sizes "$impl.${tag}index_bytes" "$idx"
            kvput sizes "$impl.${tag}indexes" "$nidx"
            kvput sizes "$impl.${tag}keys" "$minkey .. $maxkey"
            kvput sizes "$impl.${tag}wal_bytes" $((a[0] - b[0]))
            kvput sizes "$impl.${tag}xids" $((a[1] - b[1]))
            kvput sizes "$impl.${tag}wal_fpi" $((a[2] - b[2]))
            kvput sizes "$impl.${tag}wal_records" $((a[3] - b[3]))
            kvput sizes "$impl.${tag}upd" $((a[4] - b[4]))
            kvput sizes "$impl.${tag}hot_upd" $((a[5] - b[5]))
            log "sizes ($sc client(s)): $impl: $rows rows, $((total / (rows > 0 ? rows : 1))) B/op, WAL $(((a[0] - b[0]) / (rows > 0 ? rows : 1))) B/op, HOT $((a[5] - b[5]))/$((a[4] - b[4]))"
        done
    done
fi

# -------------------------------------------------------------------- matrix
if want matrix; then
    log "phase matrix"
    newdb matrix portable
    setup_db "$db" "${impls[@]}"
    for impl in "${impls[@]}"; do load_completed "$db" "$impl" DUP- "$BENCH_DUP_POOL"; done
    q "$db" -c 'VACUUM ANALYZE'
    q "$(impl_db portable "$db")" -c 'VACUUM ANALYZE'
    for path in $BENCH_PATHS; do
        case $path in run|dup) clist=$BENCH_CLIENTS ;; *) clist=$BENCH_SIDE_CLIENTS ;; esac
        list=("${impls[@]}")
        [[ $path == dup ]] && list+=(pk)
        for clients in $clist; do
            for ((rep = 1; rep <= BENCH_REPS; rep++)); do
                for impl in $(rotate "$rep" "${list[@]}"); do
                    if [[ $path == stale ]]; then
                        # enough stale claims for every client: the pool of
                        # the next cell (run_cell numbers it)
                        if [[ -n $BENCH_TX ]]; then
                            perclient=$((BENCH_TX + 10))
                        else
                            perclient=$((60000 / clients))
                            ((perclient >= 3000)) || perclient=3000
                        fi
                        load_stale "$db" "$impl" $((cell_no + 1)) "$clients" "$perclient"
                    fi
                    run_cell matrix "$path" "$impl" "$clients" "$rep" "$db"
                    if [[ $path == stale ]]; then
                        # every operation was a takeover (attempt 2), none a new claim
                        taken=$(val "$(impl_db "$impl" "$db")" "SELECT count(*) FROM $(ops_table "$impl")
                                           WHERE operation_key LIKE 'STALE-$cell_no-%'
                                             AND status = 'completed'")
                        [[ $impl == raw ]] || taken=$(val "$(impl_db "$impl" "$db")" "SELECT count(*) FROM $(ops_table "$impl")
                                           WHERE operation_key LIKE 'STALE-$cell_no-%'
                                             AND status = 'completed' AND attempt = 2")
                        ops=$(tail -n 1 "$results" | cut -f6)
                        [[ $taken == "$ops" ]] ||
                            die "stale: $impl took over $taken records in $ops operations (pool too small?)"
                    fi
                done
            done
        done
        q "$db" -c 'VACUUM ANALYZE' # between paths, not measured
        q "$(impl_db portable "$db")" -c 'VACUUM ANALYZE'
    done
    # every run-path key was claimed once and completed
    for impl in "${impls[@]}"; do
        left=$(val "$(impl_db "$impl" "$db")" "SELECT count(*) FROM $(ops_table "$impl") WHERE status <> 'completed'
                          AND operation_key NOT LIKE 'STALE-%'")
        [[ $left == 0 ]] || die "matrix: $impl left $left records not completed"
    done
fi

# --------------------------------------------------------------------- redis
# redis_ok: redis-server and redis-benchmark can be used (else why, on stderr)
redis_ok() {
    if [[ $BENCH_REDIS == no ]]; then
        log "redis: skipped (BENCH_REDIS=no)"
        return 1
    elif ! command -v redis-server >/dev/null || ! command -v redis-benchmark >/dev/null; then
        [[ $smoke == yes ]] || die "redis-server/redis-benchmark not found: apt-get install redis-server redis-tools (or BENCH_REDIS=no)"
        log "redis: skipped (redis-server or redis-benchmark not installed)"
        return 1
    fi
}
# redis_start: redis-server on 127.0.0.1 and a free port ($rport), durable:
# appendonly yes, appendfsync always; a key dupkey for the duplicate case
redis_start() {
    [[ -z $redis_pid ]] || return 0
    # $BENCH_REDIS_PORT, else a free port, as scripts/cluster.sh picks one
    # (in a subshell: no traps)
    rport=$(
        CLUSTER_DIR=""
        CLUSTER_PORT=$BENCH_REDIS_PORT
        # shellcheck source=scripts/cluster.sh
        source "$root/scripts/cluster.sh"
        cluster_pick_port
    )
    # a fresh directory per start: an AOF left by an earlier start would be
    # loaded first (and the server answer LOADING meanwhile)
    redis_starts=$((${redis_starts:-0} + 1))
    rdir=$work/redis.$redis_starts
    mkdir -p "$rdir"
    redis-server --bind 127.0.0.1 --port "$rport" --dir "$rdir" --appendonly yes \
        --appendfsync always --save '' --daemonize no --protected-mode yes \
        --logfile "$rdir/redis.log" &
    redis_pid=$!
    local i
    for i in $(seq 1 100); do
        [[ $(redis-cli -h 127.0.0.1 -p "$rport" ping 2>/dev/null) == PONG ]] && break
        sleep 0.1
    done
    [[ $(redis-cli -h 127.0.0.1 -p "$rport" ping 2>/dev/null) == PONG ]] || die "redis-server did not start ($rdir/redis.log)"
    redis-cli -h 127.0.0.1 -p "$rport" SET dupkey done >/dev/null
}
redis_stop() {
    [[ -n $redis_pid ]] || return 0
    kvput redis aof_bytes "$(stat -c %s "$rdir"/appendonlydir/*.incr.aof 2>/dev/null | head -n 1)"
    redis-cli -h 127.0.0.1 -p "$rport" shutdown nosave >/dev/null 2>&1 || true
    local i
    for i in $(seq 1 50); do kill -0 "$redis_pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$redis_pid" 2>/dev/null && kill -TERM "$redis_pid"
    wait "$redis_pid" 2>/dev/null || true
    redis_pid=""
    rm -rf "$rdir"
}
# redis_cell PHASE PATH OP CLIENTS REP: one redis-benchmark run of OP (claim:
# SET NX PX of a new key; done: SET; dup: SET NX of an existing key), one
# line of results.tsv (backend_cpu_s: redis-server's CPU; client_cpu_s:
# redis-benchmark's)
redis_cell() {
    local phase=$1 path=$2 op=$3 clients=$4 rep=$5 n cmd line rps avg p50 p95 p99
    if [[ $smoke == yes ]]; then n=200; else n=$((clients * 5000)); ((n <= 60000)) || n=60000; fi
    case $op in
        claim) cmd=(SET "claim:__rand_int__" w1 NX PX 600000) ;;
        done) cmd=(SET "claim:__rand_int__" done) ;;
        dup) cmd=(SET dupkey w1 NX PX 600000) ;;
    esac
    local r0 r1 m0 m1 TIMEFORMAT='%U %S' rc=0
    r0=$(awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$redis_pid/stat")
    m0=$(machine_ticks)
    { time redis-benchmark -h 127.0.0.1 -p "$rport" -c "$clients" -n "$n" \
          -r 1000000000 --csv "${cmd[@]}" >"$work/redis.out" 2>&1; } 2>"$work/redis.time" || rc=$?
    m1=$(machine_ticks)
    r1=$(awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$redis_pid/stat")
    ((rc == 0)) || { cat "$work/redis.out" >&2; die "redis-benchmark failed ($op)"; }
    line=$(tail -n 1 "$work/redis.out")
    # "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
    IFS=, read -r _ rps avg _ p50 p95 p99 _ <<<"$(echo "$line" | tr -d '"')"
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\t\t\t\t\t\t%s\t\t%s\t%s\n' \
        "$phase" "$path" redis "$clients" "$rep" "$n" "" "$rps" "$avg" "$p50" "$p95" "$p99" \
        "$(ticks_s "$r0" "$r1")" "$(awk '{ printf "%.2f", $1 + $2 }' "$work/redis.time")" \
        "$(ticks_s "$m0" "$m1")" >>"$results"
    log "redis $phase $op c$clients r$rep: $rps ops/s, p99 $p99 ms"
}

# --------------------------------------------------------------------- batch
if want batch; then
    log "phase batch"
    # the extension in database batch, the portable edition in
    # batch_portable, each with the same completed DUP- records
    newdb batch portable
    setup_db "$db" c portable
    for impl in c portable; do
        load_completed "$db" "$impl" DUP- "$BENCH_DUP_POOL"
        q "$(impl_db "$impl" "$db")" -c 'VACUUM ANALYZE'
    done
    kvput batch load_before "$(cut -d' ' -f1-3 /proc/loadavg)"
    kvput batch sizes "$BENCH_BATCH_SIZES"
    kvput batch dup_pool "$BENCH_DUP_POOL"
    # cells: c and portable (the single calls), bN and pbN (batches of N
    # of each edition)
    bsizes=()
    for n in $BENCH_BATCH_SIZES; do bsizes+=("b$n"); done
    for n in $BENCH_BATCH_SIZES; do bsizes+=("pb$n"); done
    with_redis=no
    if redis_ok; then
        redis_start
        with_redis=yes
        kvput redis config "$(redis-cli -h 127.0.0.1 -p "$rport" CONFIG GET appendfsync | tr '\n' ' ')"
    fi
    clients=$BENCH_BATCH_CLIENTS
    for path in run dup; do
        list=(c portable "${bsizes[@]}")
        [[ $with_redis == yes ]] && list+=(redis)
        for ((rep = 1; rep <= BENCH_REPS; rep++)); do
            for impl in $(rotate "$rep" "${list[@]}"); do
                kvput batch "others.$path.$impl" "$(others_share)"
                if [[ $impl == redis ]]; then
                    # the Redis pair: a claim (SET NX PX), then done (SET);
                    # a duplicate: SET NX of an existing key
                    if [[ $path == run ]]; then
                        redis_cell batch redis_claim claim "$clients" "$rep"
                        redis_cell batch redis_done done "$clients" "$rep"
                    else
                        redis_cell batch dup dup "$clients" "$rep"
                    fi
                else
                    # -r: the claim call's and the completion call's mean
                    # latency (ms per call) in the batch and in the single path
                    run_cell batch "$path" "$impl" "$clients" "$rep" "$db" -r
                    for stmt in claim complete; do
                        ms=$(awk -v s="$stmt" '$0 ~ ("idempotency[.]" s "_operation") && $1 ~ /^[0-9.]+$/ { print $1; exit }' \
                                 "$work/logs/last.out")
                        [[ -z $ms ]] || kvput batch "stmt_ms.$path.$impl.$stmt" "$ms"
                    done
                fi
            done
        done
        for impl in c portable; do # between paths, not measured
            q "$(impl_db "$impl" "$db")" -c 'VACUUM ANALYZE'
        done
    done
    [[ $with_redis == yes ]] && redis_stop
    kvput batch load_after "$(cut -d' ' -f1-3 /proc/loadavg)"
    # every run-path key was claimed once (verdict run) and completed: in
    # each edition's database as many completed ORD- records as operations
    # counted in its cells
    for impl in c portable; do
        if [[ $impl == c ]]; then cells_re='^(c|b[0-9]+)$'; else cells_re='^(portable|pb[0-9]+)$'; fi
        want_ops=$(awk -F'\t' -v re="$cells_re" '$1 == "batch" && $2 == "run" && $3 ~ re { s += $6 } END { print s + 0 }' "$results")
        IFS='|' read -r got left < <(val "$(impl_db "$impl" "$db")" "SELECT count(*) FILTER (WHERE status = 'completed'),
                                                       count(*) FILTER (WHERE status <> 'completed')
                                                FROM idempotency.operations WHERE operation_key LIKE 'ORD-%'")
        [[ $left == 0 && $got == "$want_ops" ]] ||
            die "batch: $impl: $got completed run-path records for $want_ops operations, $left not completed"
        kvput batch "checked_ops.$impl" "$got"
    done
fi

# --------------------------------------------------------------------- scale
if want scale; then
    log "phase scale: loading $BENCH_SCALE_BIG and $BENCH_SCALE_SMALL records"
    newdb scale_small
    small=$db
    newdb scale_big
    big=$db
    for db in "$small" "$big"; do
        setup_db "$db" c
        q "$db" -c "INSERT INTO idempotency.job_types (job_type, lease, stale_policy, retention)
                    VALUES ('old_orders', '10 minutes', 'hold', '1 day')"
    done
    # keys ORD-00000001...: in key order, like increasing order numbers
    load_scale() {
        local db=$1 n=$2 purge=$3 stale=$4
        q "$db" -c "INSERT INTO idempotency.operations (job_type, operation_key, status, attempt,
                        claimed_at, heartbeat_at, completed_at)
                    SELECT 'send_confirmation', 'ORD-' || lpad(g::text, 8, '0'), 'completed', 1,
                        now() - interval '1 hour', now() - interval '1 hour', now() - interval '1 hour'
                    FROM generate_series(1, $((n - purge - stale))) g"
        if ((purge > 0)); then
            q "$db" -c "INSERT INTO idempotency.operations (job_type, operation_key, status, attempt,
                            claimed_at, heartbeat_at, completed_at)
                        SELECT 'old_orders', 'OLD-' || lpad(g::text, 8, '0'), 'completed', 1,
                            now() - interval '2 days', now() - interval '2 days', now() - interval '2 days'
                        FROM generate_series(1, $purge) g"
        fi
        if ((stale > 0)); then
            q "$db" -c "INSERT INTO idempotency.operations (job_type, operation_key, status, attempt,
                            claimed_at, heartbeat_at, claimed_by)
                        SELECT 'send_confirmation', 'ORD-S' || lpad(g::text, 8, '0'), 'claimed', 1,
                            now() - interval '1 hour', now() - interval '1 hour', 'dead-worker'
                        FROM generate_series(1, $stale) g"
        fi
        q "$db" -c 'VACUUM ANALYZE'
    }
    t0=$SECONDS
    load_scale "$small" "$BENCH_SCALE_SMALL" 0 0
    load_scale "$big" "$BENCH_SCALE_BIG" "$BENCH_PURGE_ROWS" "$BENCH_STALE_ROWS"
    kvput scale load_seconds $((SECONDS - t0))
    kvput scale big_rows "$(val "$big" 'SELECT count(*) FROM idempotency.operations')"
    kvput scale small_rows "$(val "$small" 'SELECT count(*) FROM idempotency.operations')"
    kvput scale big_total_bytes "$(val "$big" "SELECT pg_total_relation_size('idempotency.operations')")"
    q "$big" -c CHECKPOINT

    # stale_claims(): it reads the whole table (no index covers status)
    for db in "$small" "$big"; do
        tag=$([[ $db == "$big" ]] && echo big || echo small)
        for i in 1 2 3 4 5; do
            ms=$(psql -X -q -A -t -v ON_ERROR_STOP=1 -d "$db" -c '\timing on' \
                 -c 'SELECT count(*) FROM idempotency.stale_claims()' |
                 sed -n 's/^Time: \([0-9.]*\) ms.*/\1/p')
            kvput scale "stale_claims_ms.$tag" "$ms"
        done
        kvput scale "stale_claims_rows.$tag" "$(val "$db" 'SELECT count(*) FROM idempotency.stale_claims()')"
    done
    kvput scale stale_claims_plan "$(val "$big" "EXPLAIN (COSTS OFF) SELECT o.job_type FROM idempotency.operations o
        JOIN idempotency.job_types jt ON jt.job_type = o.job_type
        WHERE o.status = 'claimed' AND o.heartbeat_at + jt.lease <= now()" | tr '\n' ';' | sed 's/  */ /g')"

    # run path latency: 10M vs 10k, interleaved; -r for claim and complete
    for clients in 1 4; do
        for ((rep = 1; rep <= BENCH_REPS; rep++)); do
            for tag in $(rotate "$rep" small big); do
                db=$([[ $tag == big ]] && echo "$big" || echo "$small")
                run_cell scale run "c@$tag" "$clients" "$rep" "$db" -r
                for stmt in claim_operation complete_operation; do
                    kvput scale "stmt_ms.$tag.c$clients.$stmt" \
                        "$(awk -v s="$stmt" '$0 ~ s && $1 ~ /^[0-9.]+$/ { print $1; exit }' "$work/logs/last.out")"
                done
            done
        done
    done

    # the purge of the expired records while the run path runs at a fixed
    # rate: p99 before (idle) and during purge_operations(), then during
    # the paced procedure idempotency.purge()
    rate=$BENCH_PURGE_RATE
    if [[ -z $rate ]]; then
        rate=$(awk -F'\t' '$1 == "matrix" && $2 == "run" && $3 == "c" && $4 == 4 { print $8 }' "$results" |
               sort -n | awk '{ v[NR] = $1 } END { if (NR) printf "%d", v[int((NR + 1) / 2)] / 4; else print 500 }')
    fi
    kvput purge rate "$rate"
    kvput purge clients "$BENCH_PURGE_CLIENTS"
    kvput purge batch "$BENCH_PURGE_BATCH"
    kvput purge paced_pages "$BENCH_PACED_PAGES"
    kvput purge paced_pause_ms "$BENCH_PACED_PAUSE_MS"
    purge_chunk() {     # purge_chunk LABEL: one fixed-rate run of the run path
        cell_no=$((cell_no + 1))
        local d=$work/logs/purge-$1-$cell_no
        mkdir -p "$d"
        pgbench -n -M prepared -c "$BENCH_PURGE_CLIENTS" -j 2 -R "$rate" "${len_args[@]}" \
            -D n=0 -D base=$((cell_no * 100000000)) -D stride=1000000 -D cell="$cell_no" -D dupn=1 \
            -l --log-prefix="$d/tx" -f "$work/scripts/c_run.sql" "$big" >"$d/out" 2>&1 ||
            { cat "$d/out" >&2; die "pgbench failed (purge, $1)"; }
        grep -q aborted "$d/out" && { cat "$d/out" >&2; die "pgbench: a client aborted (purge, $1)"; }
        cat "$d"/tx.* >>"$work/logs/purge-$1.log"
        rm -rf "$d"
    }
    : >"$work/logs/purge-idle.log"
    purge_chunk idle
    purge_chunk idle
    kvput purge idle "$(/usr/bin/python3 "$here/lat.py" "$work/logs/purge-idle.log")"
    # measure_purge LABEL SQL: run SQL (a purge) in the background while
    # fixed-rate chunks of the run path go on; p99 of what ended during it
    measure_purge() {
        local label=$1 sql=$2 b a
        q "$big" -c CHECKPOINT
        read -r -a b < <(snap "$big" idempotency.operations)
        : >"$work/logs/purge-$label.log"
        (
            s=$(date +%s.%N)
            rc=0
            psql -X -q -A -t -v ON_ERROR_STOP=1 -d "$big" -c "$sql" >"$work/purge.out" 2>&1 || rc=$?
            echo "$s $(date +%s.%N) $rc" >"$work/purge.time"
        ) &
        local purge_pid=$! chunks=0
        while kill -0 "$purge_pid" 2>/dev/null && ((chunks < 60)); do
            purge_chunk "$label"
            chunks=$((chunks + 1))
        done
        wait "$purge_pid" || true
        read -r -a a < <(snap "$big" idempotency.operations)
        local p0 p1 prc
        read -r p0 p1 prc <"$work/purge.time"
        [[ $prc == 0 ]] || { cat "$work/purge.out" >&2; die "purge ($label) failed"; }
        kvput purge "$label.deleted" "$(grep -o '[0-9]\+' "$work/purge.out" | tail -n 1)"
        kvput purge "$label.seconds" "$(awk -v a="$p0" -v b="$p1" 'BEGIN { printf "%.2f", b - a }')"
        kvput purge "$label.wal_bytes" $((a[0] - b[0]))
        kvput purge "$label.wal_fpi" $((a[2] - b[2]))
        kvput purge "$label" "$(/usr/bin/python3 "$here/lat.py" --from "$p0" --to "$p1" "$work/logs/purge-$label.log")"
    }
    measure_purge during "SELECT idempotency.purge_operations($BENCH_PURGE_BATCH)"
    # the paced purge: as many expired records again (appended to the
    # table, as the first ones were), deleted a range of pages per
    # transaction with a pause in between
    q "$big" -c "INSERT INTO idempotency.operations (job_type, operation_key, status, attempt,
                     claimed_at, heartbeat_at, completed_at)
                 SELECT 'old_orders', 'OLD2-' || lpad(g::text, 8, '0'), 'completed', 1,
                     now() - interval '2 days', now() - interval '2 days', now() - interval '2 days'
                 FROM generate_series(1, $BENCH_PURGE_ROWS) g"
    q "$big" -c 'VACUUM ANALYZE idempotency.operations'
    # the paced purge's own idle reference, measured just before it (the
    # first one is minutes older, before purge_operations() and a reload:
    # on a shared machine the idle p99 moves more than that in a minute)
    : >"$work/logs/purge-idle_paced.log"
    purge_chunk idle_paced
    purge_chunk idle_paced
    kvput purge idle_paced "$(/usr/bin/python3 "$here/lat.py" "$work/logs/purge-idle_paced.log")"
    measure_purge paced "CALL idempotency.purge($BENCH_PACED_PAGES, '$BENCH_PACED_PAUSE_MS milliseconds')"
    kvput purge after_rows "$(val "$big" 'SELECT count(*) FROM idempotency.operations')"
fi

if want redis && redis_ok; then
    log "phase redis"
    redis_start
    kvput redis config "$(redis-cli -h 127.0.0.1 -p "$rport" CONFIG GET appendfsync | tr '\n' ' ')"
    for clients in $BENCH_CLIENTS; do
        for ((rep = 1; rep <= BENCH_REPS; rep++)); do
            for op in $(rotate "$rep" claim done dup); do
                redis_cell redis "$op" "$op" "$clients" "$rep"
            done
        done
    done
    redis_stop
fi

echo "load_after: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$work/machine.txt"
echo "duration: $((SECONDS - started)) s" >>"$work/machine.txt"
cp "$results" "$kv" "$work/machine.txt" "$out/"

# -------------------------------------------------------------------- report
if want report; then
    /usr/bin/python3 "$here/report.py" "$out" || die "report.py failed"
fi
log "done in $((SECONDS - started)) s; results in $out"
