#!/usr/bin/env bash
# test/pooler/run.sh: the replay matrix through PgBouncer in transaction
# pooling mode.
#
#   PGHOST=/sockdir PGPORT=5432 PGUSER=postgres test/pooler/run.sh [RUNNER-ARGS...]
#
# Needs a running server with the extension installed (make install); it is
# reached through libpq's environment (PGHOST may be a Unix socket
# directory). Steps:
#   1. installs Debian's pgbouncer with apt-get when it is missing and we are
#      root (POOLER_INSTALL=0: never; then a missing pgbouncer is a failure);
#   2. starts pgbouncer on 127.0.0.1 and a free random port, pool_mode =
#      transaction, as the cluster's owner (pgbouncer refuses to run as
#      root), in a temporary directory;
#   3. builds matrix/idempotency-matrix and runs it with --dsn pointing at
#      pgbouncer (default: every policy and case; RUNNER-ARGS are passed on,
#      e.g. --policy hold,retry);
#   4. checks from pgbouncer's admin console that the pool really ran in
#      transaction mode and carried the matrix's transactions;
#   5. stops pgbouncer (by its pid) and removes the directory, also on error
#      or Ctrl-C. The log is printed on failure.
# The last line is "pooler: N passed, N failed". Exit 0 only if the matrix
# passed through the pooler.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
runner=$root/matrix/idempotency-matrix
pgbouncer=${PGBOUNCER:-/usr/sbin/pgbouncer}

die() { echo "test/pooler/run.sh: error: $*" >&2; echo "pooler: 0 passed, 1 failed"; exit 2; }

: "${PGHOST:?PGHOST must name the server (socket directory or host)}"
: "${PGPORT:=5432}"
: "${PGUSER:=postgres}"
: "${PGDATABASE:=postgres}"

if [[ ! -x $pgbouncer ]]; then
    if [[ $(id -u) == 0 && ${POOLER_INSTALL:-1} != 0 ]]; then
        echo "== installing pgbouncer (Debian package)"
        apt_start=$SECONDS
        apt_opts=(-o DPkg::Lock::Timeout=600 -o Dpkg::Use-Pty=0)
        export DEBIAN_FRONTEND=noninteractive
        # a stale package index: update once and retry
        apt-get "${apt_opts[@]}" install -y -q pgbouncer >/dev/null ||
            { apt-get "${apt_opts[@]}" update -qq && apt-get "${apt_opts[@]}" install -y -q pgbouncer >/dev/null; } ||
            die "apt-get install pgbouncer failed"
        echo "== installed pgbouncer in $((SECONDS - apt_start)) s"
    elif [[ $(id -u) != 0 ]]; then
        die "$pgbouncer not found; install it with: sudo apt-get install -y pgbouncer"
    else
        die "$pgbouncer not found (POOLER_INSTALL=0): apt-get install -y pgbouncer"
    fi
fi

# pgbouncer must not run as root; the cluster's owner can reach its socket
owner=${CLUSTER_OWNER:-$(id -un)}
[[ $owner == root ]] && owner=postgres
as_owner() {
    if [[ $(id -un) == "$owner" ]]; then "$@"; else runuser -u "$owner" -- "$@"; fi
}

dir=$(mktemp -d "${TMPDIR:-/tmp}/pooler.XXXXXX") || die "mktemp failed"
chown "$owner" "$dir" 2>/dev/null || true
chmod 755 "$dir"
bouncer_pid=
stop_bouncer() {
    if [[ -n $bouncer_pid ]] && kill -0 "$bouncer_pid" 2>/dev/null; then
        kill -TERM "$bouncer_pid" 2>/dev/null
        local i
        for ((i = 0; i < 100; i++)); do
            kill -0 "$bouncer_pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -0 "$bouncer_pid" 2>/dev/null && kill -KILL "$bouncer_pid" 2>/dev/null
    fi
    bouncer_pid=
}
cleanup() {
    local rc=$?
    stop_bouncer
    if ((rc != 0)) && [[ -f $dir/pgbouncer.log ]]; then
        echo "==== pgbouncer.log (last 60 lines)"
        tail -n 60 "$dir/pgbouncer.log"
    fi
    rm -rf "$dir"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

# a free port on 127.0.0.1, chosen at random
port=
for ((i = 0; i < 50; i++)); do
    p=$((30000 + RANDOM % 20000))
    if perl -MIO::Socket::INET -e 'IO::Socket::INET->new(LocalAddr => "127.0.0.1", LocalPort => $ARGV[0], Proto => "tcp", Listen => 1, ReuseAddr => 1) or exit 1' "$p"; then
        port=$p
        break
    fi
done
[[ -n $port ]] || die "no free port found on 127.0.0.1"

# the server side: the same server the tests use; host may be a socket dir
cat >"$dir/pgbouncer.ini" <<EOF
[databases]
$PGDATABASE = host=$PGHOST port=$PGPORT dbname=$PGDATABASE

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir =
auth_type = trust
auth_file = $dir/userlist.txt
admin_users = $PGUSER
pool_mode = transaction
max_client_conn = 300
default_pool_size = 60
reserve_pool_size = 0
server_reset_query =
ignore_startup_parameters = extra_float_digits,options
logfile = $dir/pgbouncer.log
pidfile = $dir/pgbouncer.pid
EOF
echo "\"$PGUSER\" \"\"" >"$dir/userlist.txt"
chown "$owner" "$dir"/* 2>/dev/null || true

echo "== pgbouncer $("$pgbouncer" --version | head -n 1 | awk '{print $2}') on 127.0.0.1:$port, pool_mode = transaction, server $PGHOST:$PGPORT"
(cd "$dir" && as_owner "$pgbouncer" -d -q "$dir/pgbouncer.ini") || die "pgbouncer did not start"
for ((i = 0; i < 100; i++)); do
    [[ -s $dir/pgbouncer.pid ]] && bouncer_pid=$(cat "$dir/pgbouncer.pid") && break
    sleep 0.1
done
[[ -n $bouncer_pid ]] || die "pgbouncer wrote no pid file"

admin() { psql -X -At -h 127.0.0.1 -p "$port" -U "$PGUSER" -d pgbouncer -c "$1"; }
for ((i = 0; i < 100; i++)); do
    admin 'SHOW VERSION' >/dev/null 2>&1 && break
    sleep 0.1
done
[[ $(admin 'SHOW CONFIG' | awk -F'|' '$1 == "pool_mode" {print $2}') == transaction ]] ||
    die "pgbouncer is not in transaction pooling mode"

echo "== build"
make --no-print-directory -C "$root/matrix" >/dev/null || die "make -C matrix failed"

dsn="host=127.0.0.1 port=$port dbname=$PGDATABASE user=$PGUSER"
echo "== the matrix through pgbouncer (idempotency-matrix --dsn '$dsn' --create-extension $*)"
start=$(date +%s)
"$runner" --dsn "$dsn" --create-extension --color=never "$@" | tee "$dir/matrix.txt"
rc=${PIPESTATUS[0]}
echo "== the matrix took $(($(date +%s) - start)) s through the pooler and exited $rc"

passed=0 failed=0
line=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$dir/matrix.txt" | tail -n 1)
if [[ -n $line ]]; then
    passed=$(cut -d' ' -f1 <<<"$line")
    failed=$(cut -d' ' -f3 <<<"$line")
fi
((rc == 0)) || ((failed > 0)) || failed=1

# the transactions really went through the pool
xacts=$(admin 'SHOW STATS' | awk -F'|' -v db="$PGDATABASE" '$1 == db {print $2}')
echo "== pgbouncer carried ${xacts:-0} transactions for database $PGDATABASE"
if ! [[ ${xacts:-0} =~ ^[0-9]+$ ]] || ((xacts < 100)); then
    echo "not ok - pgbouncer carried only ${xacts:-0} transactions"
    failed=$((failed + 1))
fi
vanished=$(grep -c 'closing because: client unexpected eof' "$dir/pgbouncer.log" || true)
echo "== $vanished client connections ended without a goodbye (the runner's SIGKILLed workers)"
if grep -qE ' (FATAL|ERROR) |server_lost|server conn crashed' "$dir/pgbouncer.log"; then
    echo "== pgbouncer log lines worth a look:"
    grep -E ' (FATAL|ERROR) |server_lost|server conn crashed' "$dir/pgbouncer.log" | head -n 20
fi

stop_bouncer
echo "pooler: $passed passed, $failed failed"
((failed == 0))
