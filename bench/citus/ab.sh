#!/usr/bin/env bash
# bench/citus/ab.sh: two builds of idempotency.so side by side on one Citus
# cluster (issue 30): the coordinator's run path (fn_run.sql) and duplicate
# path (fn_dup.sql), pgbench -n -M prepared, $AB_CLIENTS clients, in rounds
# that alternate library A and library B (ABBA ABBA ...: each library goes
# first in half the pairs).
#
#   bench/citus/ab.sh A.so B.so OUTDIR
#
# One cluster (test/citus/cluster.sh), one catalog: the extension is created
# from the SQL that ships with A (the oldest: 0.3) and distributed once;
# between rounds the installed idempotency.so is replaced (a rename, so no
# backend maps a half-written file) and the three nodes are restarted, so
# every backend of a round runs the round's library. The same catalog under
# both libraries means the only difference measured is the C; 0.4's library
# serves a 0.3 install (its capabilities come from the installed version, and
# the delegated claim_operation / complete_operation take the same variant in
# 0.3 and 0.4's SQL: claim_operation_0_3, complete_operation_0_2).
#
# Per round and path: tps, and the servers' CPU per op (coordinator + both
# workers: every postmaster's own, reaped and living children's utime+stime
# from /proc, as bench/citus/run.sh). Hardware instruction counters: tried
# with perf stat -e instructions (attached to the three postmasters, so the
# backends forked after it inherit the counters); on a machine without them
# (a VM without a PMU: "<not supported>") the column is empty.
# AB_PERF_SECONDS > 0: after the rounds, perf record -g on w1's postmaster
# during that many seconds of the run path, once per library (perf-A.txt,
# perf-B.txt: perf report --no-children, idempotency.so and the top).
# Settings: AB_ROUNDS=8 (even), AB_SECONDS=8, AB_CLIENTS=16, AB_DUP_POOL=50000,
# AB_PERF_SECONDS=0. Needs Citus and pgbench; run as root in a clean root.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
[[ $# -eq 3 ]] || { echo "usage: $0 A.so B.so OUTDIR" >&2; exit 2; }
libA=$(readlink -f "$1") libB=$(readlink -f "$2") out=$3
: "${AB_ROUNDS:=8}" "${AB_SECONDS:=8}" "${AB_CLIENTS:=16}" "${AB_DUP_POOL:=50000}" "${AB_PERF_SECONDS:=0}"
mkdir -p "$out"
log() { echo "ab: $*" >&2; }

export CITUS_SETTINGS="shared_buffers = '512MB'
autovacuum = 'off'
checkpoint_timeout = '1h'
max_wal_size = '20GB'
max_connections = '100'"
# shellcheck source=test/citus/cluster.sh
source "$root/test/citus/cluster.sh"
so=$("$PG_CONFIG" --pkglibdir)/idempotency.so
install_so() { cp "$1" "$so.new" && mv -f "$so.new" "$so"; }
install_so "$libA"
citus_cluster_start
N=(coord w1 w2)
restart() {
    local n
    for n in w2 w1 coord; do citus_node_stop "$n" fast; done
    for n in w1 w2 coord; do citus_node_start "$n"; done
}
pmpid() { head -n 1 "$CITUS_DIR/$1/postmaster.pid"; }
# shellcheck source=bench/citus/ticks.sh
source "$root/bench/citus/ticks.sh"
servers_ticks() { local s=0 n; for n in "${N[@]}"; do s=$((s + $(node_ticks "$(pmpid "$n")"))); done; echo "$s"; }

citus_psql coord -c "CREATE EXTENSION idempotency" -c "SELECT idempotency.distribute()" >/dev/null
citus_psql coord -c "INSERT INTO idempotency.job_types (job_type) VALUES ('send_confirmation')" \
    -c "INSERT INTO idempotency.operations (job_type, operation_key, status, attempt, claimed_at, heartbeat_at, completed_at)
        SELECT 'send_confirmation', 'DUP-' || g, 'completed', 1, now() - interval '1 day',
               now() - interval '1 day', now() - interval '1 day' FROM generate_series(1, $AB_DUP_POOL) g" \
    -c "VACUUM ANALYZE"
for n in w1 w2; do citus_psql "$n" -c "VACUUM ANALYZE"; done
extv=$(citus_psql coord -At -c "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'")
for s in fn_run fn_dup; do
    sed -e 's/@S@/idempotency/g' -e 's/@T@/idempotency.operations/g' "$root/bench/pgbench/$s.sql" >"$CITUS_DIR/$s.sql"
done
chmod 644 "$CITUS_DIR"/*.sql

perf_ok=no
if command -v perf >/dev/null && perf stat -e instructions -x, -- true 2>&1 | grep -q '^[0-9]'; then perf_ok=yes; fi
{
    echo "date	$(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "A	$(md5sum "$libA" | cut -c1-12) $1"
    echo "B	$(md5sum "$libB" | cut -c1-12) $2"
    echo "extversion	$extv"
    echo "postgresql	$(citus_psql coord -At -c 'SHOW server_version')"
    echo "citus	$(citus_psql coord -At -c 'SELECT citus_version()' | sed 's/ on .*//')"
    echo "mode	rounds=$AB_ROUNDS secs=$AB_SECONDS clients=$AB_CLIENTS dup_pool=$AB_DUP_POOL"
    echo "instructions_counter	$perf_ok"
    echo "load_before	$(cut -d' ' -f1-3 /proc/loadavg)"
} >"$out/kv.tsv"
printf 'round\tlib\tpath\tops\ttps\tcpu_servers_s\tcpu_machine_s\tus_per_op\tinstr\tinstr_per_op\tload1\n' >"$out/results.tsv"

base=1000000000
one() { # LIB PATH ROUND
    local lib=$1 path=$2 r=$3 script t0 t1 m0 m1 o ops tps cpu pstat="" instr=""
    script=$CITUS_DIR/fn_$path.sql
    if [[ $perf_ok == yes ]]; then
        pstat=$CITUS_DIR/perfstat.txt
        perf stat -e instructions -x, -o "$pstat" -p "$(pmpid coord),$(pmpid w1),$(pmpid w2)" &
        local pp=$!
        sleep 0.5
    fi
    t0=$(servers_ticks); m0=$(machine_ticks)
    o=$(cd "$CITUS_DIR" && pgbench -n -M prepared -c "$AB_CLIENTS" -j 2 -T "$AB_SECONDS" -D n=0 \
        -D base=$((base + r * 100000000)) -D stride=1000000 -D dupn="$AB_DUP_POOL" \
        -h "$CITUS_DIR" -p "$CITUS_PORT_COORD" -U postgres "$CITUS_DB" -f "$script" 2>&1)
    sleep 0.3
    t1=$(servers_ticks); m1=$(machine_ticks)
    if [[ -n $pstat ]]; then
        kill -INT "$pp"; wait "$pp" || true
        instr=$(awk -F, '$3 ~ /instructions/ { print $1 }' "$pstat")
    fi
    ops=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' <<<"$o")
    tps=$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' <<<"$o" | head -n 1)
    [[ -n $ops && $ops -gt 0 ]] || { echo "$o" >&2; log "pgbench failed"; exit 1; }
    cpu=$(awk -v a="$t0" -v b="$t1" -v hz="$HZ" 'BEGIN { printf "%.3f", (b - a) / hz }')
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$r" "$lib" "$path" "$ops" "$tps" "$cpu" \
        "$(awk -v a="$m0" -v b="$m1" -v hz="$HZ" 'BEGIN { printf "%.3f", (b - a) / hz }')" \
        "$(awk -v c="$cpu" -v o="$ops" 'BEGIN { printf "%.1f", c * 1e6 / o }')" "$instr" \
        "$( [[ -n $instr ]] && awk -v i="$instr" -v o="$ops" 'BEGIN { printf "%.0f", i / o }')" \
        "$(cut -d' ' -f1 /proc/loadavg)" | tee -a "$out/results.tsv" >&2
}
# the run path's keys: unique per round (base + round * 1e8 + client * 1e6 + n)
for ((r = 1; r <= AB_ROUNDS; r++)); do
    # ABBA: rounds 1,4,5,8 are A; 2,3,6,7 are B
    case $((r % 4)) in 1|0) lib=A ;; *) lib=B ;; esac
    if [[ $lib == A ]]; then install_so "$libA"; else install_so "$libB"; fi
    restart
    # warm: the shard map and the plans of every backend, and the caches
    (cd "$CITUS_DIR" && pgbench -n -M prepared -c "$AB_CLIENTS" -j 2 -T 2 -D n=0 -D base=$((9000000000 + r * 100000000)) \
        -D stride=1000000 -D dupn="$AB_DUP_POOL" -h "$CITUS_DIR" -p "$CITUS_PORT_COORD" -U postgres "$CITUS_DB" \
        -f "$CITUS_DIR/fn_run.sql" >/dev/null 2>&1) || true
    one "$lib" run "$r"
    one "$lib" dup "$r"
done

if ((AB_PERF_SECONDS > 0)) && command -v perf >/dev/null; then
    set +o pipefail  # perf report | head
    for lib in A B; do
        if [[ $lib == A ]]; then install_so "$libA"; else install_so "$libB"; fi
        restart
        perf record -e cpu-clock -F 999 -g -p "$(pmpid w1),$(pmpid w2)" -o "$CITUS_DIR/perf-$lib.data" \
            -- sleep "$AB_PERF_SECONDS" >/dev/null 2>&1 &
        pp=$!
        sleep 0.5
        (cd "$CITUS_DIR" && pgbench -n -M prepared -c "$AB_CLIENTS" -j 2 -T "$AB_SECONDS" -D n=0 \
            -D base=$((5000000000 + ${#lib} * 100000000 + RANDOM * 10000)) -D stride=1000000 -D dupn="$AB_DUP_POOL" \
            -h "$CITUS_DIR" -p "$CITUS_PORT_COORD" -U postgres "$CITUS_DB" -f "$CITUS_DIR/fn_run.sql" >/dev/null 2>&1) || true
        wait "$pp" || true
        {
            echo "# perf record -e cpu-clock -F 999 -g on the workers' postmasters (inherited by their backends), run path through the coordinator, library $lib"
            perf report -i "$CITUS_DIR/perf-$lib.data" --no-children --sort dso,sym --stdio -g none 2>/dev/null | grep -v '^$' | head -n 80
            echo "# idempotency.so's own symbols"
            perf report -i "$CITUS_DIR/perf-$lib.data" --no-children --sort sym --dsos idempotency.so --stdio -g none 2>/dev/null | grep '%' | head -n 30
            echo "# inclusive (children), top 60"
            perf report -i "$CITUS_DIR/perf-$lib.data" --children --sort sym --stdio -g none 2>/dev/null | grep '%' | head -n 60
        } >"$out/perf-$lib.txt" 2>&1
    done
fi
echo "load_after	$(cut -d' ' -f1-3 /proc/loadavg)" >>"$out/kv.tsv"
python3 - "$out/results.tsv" <<'EOF' | tee "$out/summary.txt"
import csv, statistics as st, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter='\t'))
for path in ('run', 'dup'):
    for lib in ('A', 'B'):
        rs = [r for r in rows if r['path'] == path and r['lib'] == lib]
        tps = [float(r['tps']) for r in rs]; us = [float(r['us_per_op']) for r in rs]
        ins = [float(r['instr_per_op']) for r in rs if r['instr_per_op']]
        print(f"{path} {lib}: tps median {st.median(tps):.0f} ({min(tps):.0f}-{max(tps):.0f}), "
              f"CPU/op median {st.median(us):.1f} us ({min(us):.1f}-{max(us):.1f})"
              + (f", instr/op median {st.median(ins):.0f}" if ins else ""))
    # pairs: (1,2) (3,4) ...: neighbouring rounds of A and B
    rt, ru = [], []
    for k in range(0, 100, 2):
        a = [r for r in rows if r['path'] == path and int(r['round']) in (k + 1, k + 2) and r['lib'] == 'A']
        b = [r for r in rows if r['path'] == path and int(r['round']) in (k + 1, k + 2) and r['lib'] == 'B']
        if a and b:
            rt.append(float(b[0]['tps']) / float(a[0]['tps']))
            ru.append(float(b[0]['us_per_op']) / float(a[0]['us_per_op']))
    if rt:
        print(f"{path} B/A per pair: tps {' '.join(f'{x:.2f}' for x in rt)} median {st.median(rt):.3f}; "
              f"CPU/op {' '.join(f'{x:.2f}' for x in ru)} median {st.median(ru):.3f}")
EOF
