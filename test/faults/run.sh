#!/usr/bin/env bash
# test/faults/run.sh: faults between the worker and the database, through
# the fault-injection proxy test/faults/pgproxy.py.
#
#   PGHOST=/sockdir PGPORT=5432 PGUSER=postgres test/faults/run.sh
#
# Needs a running server with the extension installed (make install),
# reached through libpq's environment (PGHOST may be a Unix socket
# directory), and Debian's python3-psycopg (installed with apt-get when
# missing and we are root). Steps:
#   1. the proxy's self-test (test_pgproxy.py): each control command and
#      the protocol (startup, SSL/GSSENC refusal, cancel, simple and extended
#      queries, named statements, pipelining, COPY) against the server;
#   2. the whole replay matrix (matrix/idempotency-matrix, every policy and case)
#      through the proxy, with the replies to every claim_operation,
#      complete_operation, release_operation and extend_lease call held
#      FAULTS_DELAY_MS (default 150) ms: every cell as expected, and the
#      proxy really delayed them;
#   3. the lost-reply cases (lost_reply.py) and the storm with lost replies
#      (storm.py). They need the 0.3 API (claim_operation(..., delivery,
#      wait)): when the installed extension (after ALTER EXTENSION UPDATE)
#      has none, they say "skipped", unless the checkout's control file
#      says 0.3 or later: then a missing API is a failure.
# The proxy listens on 127.0.0.1 (a free port) and is stopped by its pid,
# also on error or Ctrl-C. The last line is "faults: N passed, N failed";
# exit 0 only if everything that ran passed.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
python=/usr/bin/python3     # Debian's, which sees Debian's modules
runner=$root/matrix/idempotency-matrix

die() { echo "test/faults/run.sh: error: $*" >&2; echo "faults: 0 passed, 1 failed"; exit 2; }

: "${PGHOST:?PGHOST must name the server (socket directory or host)}"
: "${PGPORT:=5432}"
: "${PGUSER:=postgres}"
: "${PGDATABASE:=postgres}"
export PGHOST PGPORT PGUSER PGDATABASE PYTHONDONTWRITEBYTECODE=1

if ! "$python" -c 'import psycopg' 2>/dev/null; then
    if ((EUID == 0)); then
        echo "== installing python3-psycopg (Debian package)"
        apt_opts=(-o DPkg::Lock::Timeout=600 -o Dpkg::Use-Pty=0)
        export DEBIAN_FRONTEND=noninteractive
        # a stale package index: update once and retry
        apt-get "${apt_opts[@]}" install -y -q python3-psycopg >/dev/null ||
            { apt-get "${apt_opts[@]}" update -qq && apt-get "${apt_opts[@]}" install -y -q python3-psycopg >/dev/null; } ||
            die "apt-get install python3-psycopg failed"
    else
        die "python3-psycopg is missing; install it with: sudo apt-get install -y python3-psycopg"
    fi
fi

dir=$(mktemp -d "${TMPDIR:-/tmp}/faults.XXXXXX") || die "mktemp failed"
proxy_pid=
stop_proxy() {
    if [[ -n $proxy_pid ]] && kill -0 "$proxy_pid" 2>/dev/null; then
        kill -TERM "$proxy_pid" 2>/dev/null
        local i
        for ((i = 0; i < 50; i++)); do
            kill -0 "$proxy_pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -0 "$proxy_pid" 2>/dev/null && kill -KILL "$proxy_pid" 2>/dev/null
        wait "$proxy_pid" 2>/dev/null
    fi
    proxy_pid=
}
cleanup() {
    local rc=$?
    stop_proxy
    if ((rc != 0)) && [[ -s $dir/pgproxy.log ]]; then
        echo "==== pgproxy.log (last 40 lines)"
        tail -n 40 "$dir/pgproxy.log"
    fi
    rm -rf "$dir"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

passed=0 failed=0
result() {  # result NAME RC: one line per step
    if (($2 == 0)); then
        passed=$((passed + 1)); echo "ok - $1"
    else
        failed=$((failed + 1)); echo "not ok - $1 (exit $2)"
    fi
}
t_all=$SECONDS

# 1. the proxy itself
echo "== 1. the proxy's self-test (test/faults/test_pgproxy.py)"
t=$SECONDS
"$python" "$here/test_pgproxy.py"
result "proxy self-test ($((SECONDS - t)) s)" $?

# 2. the replay matrix through the proxy, replies delayed
echo "== 2. the replay matrix through the proxy, replies delayed"
make --no-print-directory -C "$root/matrix" >/dev/null || die "make -C matrix failed"
ctl() { "$python" "$here/pgproxy.py" ctl "$dir/ctl.sock" "$1"; }
"$python" "$here/pgproxy.py" serve --listen-port 0 --upstream-host "$PGHOST" --upstream-port "$PGPORT" \
    --control "$dir/ctl.sock" >"$dir/ready" 2>"$dir/pgproxy.log" &
proxy_pid=$!
port=
for ((i = 0; i < 100; i++)); do
    read -r word port_read <"$dir/ready" 2>/dev/null && [[ $word == ready ]] && port=$port_read && break
    kill -0 "$proxy_pid" 2>/dev/null || break
    sleep 0.1
done
[[ -n $port ]] || die "the proxy did not start: $(cat "$dir/pgproxy.log")"
delay=${FAULTS_DELAY_MS:-150}
for fn in claim_operation complete_operation release_operation extend_lease; do
    ctl "delay-reply idempotency.$fn $delay 1000000" >/dev/null || die "ctl delay-reply failed"
done
dsn="host=127.0.0.1 port=$port dbname=$PGDATABASE user=$PGUSER"
echo "== pgproxy on 127.0.0.1:$port (upstream $PGHOST:$PGPORT), every reply to claim, complete, release and extend_lease held $delay ms"
echo "== idempotency-matrix --dsn '$dsn' --create-extension"
t=$SECONDS
"$runner" --dsn "$dsn" --create-extension --color=never -q | tee "$dir/matrix.txt"
rc=${PIPESTATUS[0]}
stats=$(ctl stats)
echo "== the matrix took $((SECONDS - t)) s through the proxy and exited $rc; proxy: $stats"
line=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$dir/matrix.txt" | tail -n 1)
result "the replay matrix through the proxy, replies delayed ${delay} ms: ${line:-no summary line}" \
    $(( rc != 0 || ${#line} == 0 ))
delayed=$(sed -n 's/.* delayed=\([0-9]*\).*/\1/p' <<<"$stats")
result "the proxy delayed ${delayed:-0} replies during the matrix (at least 100)" $(( ${delayed:-0} < 100 ))
stop_proxy

# 3. lost replies: need the 0.3 API
want=$(sed -n "s/^default_version *= *'\(.*\)'/\1/p" "$root/idempotency.control")
require=()
if [[ $(printf '%s\n%s\n' "0.3" "$want" | sort -V | head -n 1) == 0.3 ]]; then
    require=(--require)
fi
echo "== 3. the lost-reply cases (test/faults/lost_reply.py${require:+ --require}; the checkout is $want)"
t=$SECONDS
"$python" "$here/lost_reply.py" "${require[@]}" | tee "$dir/lost.txt"
rc=${PIPESTATUS[0]}
if grep -q '^lost-reply: skipped' "$dir/lost.txt"; then
    echo "-- lost-reply cases skipped: the extension has no delivery tokens (0.3) yet"
else
    result "the lost-reply cases ($((SECONDS - t)) s)" "$rc"
fi
echo "== 4. the storm with lost replies (test/faults/storm.py${require:+ --require})"
t=$SECONDS
"$python" "$here/storm.py" "${require[@]}" | tee "$dir/storm.txt"
rc=${PIPESTATUS[0]}
if grep -q '^storm: skipped' "$dir/storm.txt"; then
    echo "-- storm skipped: the extension has no delivery tokens (0.3) yet"
else
    result "the storm with lost replies ($((SECONDS - t)) s)" "$rc"
fi

echo "== faults took $((SECONDS - t_all)) s"
echo "faults: $passed passed, $failed failed"
((failed == 0 && passed > 0))
