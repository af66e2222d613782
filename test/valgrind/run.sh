#!/usr/bin/env bash
# test/valgrind/run.sh: the regression and isolation suites against a server
# that runs under Valgrind (memcheck), with the installed extension.
#
#   test/valgrind/run.sh            (root or the postgres user; slow: minutes)
#
# Starts its own throwaway cluster: postgres under
#   valgrind --trace-children=yes --leak-check=no --track-origins=yes
#            --suppressions=test/valgrind/postgres.supp --log-file=.../vg.%p.log
# (every backend is a forked child and writes its own log), runs
# `make installcheck` for REGRESS and then ISOLATION against it in a copy of
# the tree, stops it, and reads every Valgrind log. An error whose stack
# goes through the extension (idempotency.so) fails the run; errors inside
# PostgreSQL alone are counted and shown (Debian's server is not built with
# USE_VALGRIND, so palloc'd chunks are not tracked individually: what is
# caught is use of uninitialised memory and reads or writes outside malloc'd
# blocks, not overruns within a memory context).
# The last line is "valgrind: N passed, N failed". Needs the valgrind package
# (installed with apt-get, without recommends, when missing and root; not
# root: the exact command, and a failure).
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
PG_CONFIG=${PG_CONFIG:?run by scripts/test, which exports PG_CONFIG}
bindir=$("$PG_CONFIG" --bindir)

die() { echo "test/valgrind/run.sh: error: $*" >&2; echo "valgrind: 0 passed, 1 failed"; exit 2; }

if ! command -v valgrind >/dev/null; then
    if ((EUID == 0)); then
        # without recommends: gdb and valgrind-dbg are not needed here
        echo "== installing valgrind (Debian package, no recommends)"
        apt_opts=(-o DPkg::Lock::Timeout=600 -o Dpkg::Use-Pty=0)
        export DEBIAN_FRONTEND=noninteractive
        # a stale package index: update once and retry
        apt-get "${apt_opts[@]}" install -y -q --no-install-recommends valgrind >/dev/null ||
            { apt-get "${apt_opts[@]}" update -qq &&
              apt-get "${apt_opts[@]}" install -y -q --no-install-recommends valgrind >/dev/null; } ||
            die "apt-get install valgrind failed"
    else
        die "valgrind is not installed; install it with: sudo apt-get install -y --no-install-recommends valgrind"
    fi
fi

owner=$(id -un)
((EUID == 0)) && owner=postgres
as_owner() { if [[ $(id -un) == "$owner" ]]; then "$@"; else runuser -u "$owner" -- "$@"; fi; }

dir=$(mktemp -d /tmp/pgvalgrind.XXXXXX) || die "mktemp failed"
chown "$owner" "$dir"
keep=0
cleanup() {
    if [[ -f $dir/data/postmaster.pid ]]; then
        (cd "$dir" && as_owner "$bindir/pg_ctl" -D "$dir/data" -m immediate -w -t 120 stop >/dev/null 2>&1)
    fi
    if ((keep)); then echo "== kept $dir"; else rm -rf "$dir"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

port=
for ((i = 0; i < 50; i++)); do
    p=$((30000 + RANDOM % 20000))
    [[ -e $dir/.s.PGSQL.$p ]] && continue
    if perl -MIO::Socket::INET -e 'IO::Socket::INET->new(LocalAddr => "127.0.0.1", LocalPort => $ARGV[0], Proto => "tcp", Listen => 1, ReuseAddr => 1) or exit 1' "$p"; then
        port=$p; break
    fi
done
[[ -n $port ]] || die "no free port"

(cd "$dir" && as_owner "$bindir/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 --locale=C.UTF-8 --no-sync >"$dir/initdb.log" 2>&1) ||
    die "initdb failed: $(tail -n 5 "$dir/initdb.log")"
mkdir "$dir/vg" && chown "$owner" "$dir/vg"

# the server under Valgrind; long timeouts, few processes
cat >>"$dir/data/postgresql.conf" <<EOF
listen_addresses = ''
unix_socket_directories = '$dir'
port = $port
max_connections = 20
max_worker_processes = 4
max_parallel_workers_per_gather = 0
autovacuum = off
jit = off
fsync = off
shared_buffers = 32MB
log_min_messages = warning
EOF
echo "== starting postgres under valgrind (port $port, logs in $dir/vg)"
start=$(date +%s)
# pg_ctl runs "PATH -D data OPTIONS": a wrapper puts valgrind in front
cat >"$dir/postgres" <<EOF
#!/bin/sh
exec $(command -v valgrind) --trace-children=yes --leak-check=no --track-origins=yes \\
    --num-callers=30 --error-limit=no --suppressions=$here/postgres.supp \\
    --log-file=$dir/vg/vg.%p.log $bindir/postgres "\$@"
EOF
chmod 755 "$dir/postgres"
(cd "$dir" && as_owner "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 600 \
    -p "$dir/postgres" start >/dev/null 2>&1) || true
if ! PGHOST=$dir PGPORT=$port "$bindir/pg_isready" -q -t 600; then
    tail -n 30 "$dir/server.log" >&2
    die "postgres under valgrind did not start"
fi
echo "== up after $(($(date +%s) - start)) s"
# the server really runs on valgrind's core (its backends are forks of it)
pm=$(head -n 1 "$dir/data/postmaster.pid")
exe=$(readlink "/proc/$pm/exe" || true)
[[ $exe == *memcheck* ]] || die "the postmaster ($pm) runs $exe, not valgrind's memcheck"
echo "== postmaster $pm runs $exe"

tree=$dir/tree
mkdir "$tree"
tar -C "$root" --exclude=./.git --exclude=./results --exclude=./output_iso --exclude=./tmp_check \
    --exclude=./regression.diffs --exclude=./regression.out -cf - . | tar -C "$tree" -xf -
chown -R "$owner" "$tree"

rc=0
for suite in regress isolation; do
    case $suite in
        regress) args=(ISOLATION= TAP_TESTS=) ;;
        isolation) args=(REGRESS= TAP_TESTS=) ;;
    esac
    echo "== $suite under valgrind"
    t0=$(date +%s)
    if ! (cd "$tree" && as_owner env PGHOST="$dir" PGPORT="$port" PGUSER=postgres \
            make --no-print-directory PG_CONFIG="$PG_CONFIG" with_llvm=no installcheck "${args[@]}" \
            >"$dir/$suite.out" 2>&1); then
        rc=1
    fi
    grep -E ' \.\.\. |^(ok|not ok) ' "$dir/$suite.out" | sed 's/^/   /'
    echo "   ($suite: $(($(date +%s) - t0)) s)"
done

(cd "$dir" && as_owner "$bindir/pg_ctl" -D "$dir/data" -m fast -w -t 600 stop >/dev/null 2>&1)

# read the logs: "ERROR SUMMARY: N errors from M contexts" per process
logs=("$dir"/vg/vg.*.log)
total=0 ours=0 processes=0 summaries=0
for f in "${logs[@]}"; do
    [[ -f $f ]] || continue
    processes=$((processes + 1))
    n=$(sed -n 's/.*ERROR SUMMARY: \([0-9]*\) errors.*/\1/p' "$f" | tail -n 1)
    [[ -n $n ]] && summaries=$((summaries + 1))
    total=$((total + ${n:-0}))
done
echo "== $summaries of $processes valgrind logs end with an ERROR SUMMARY"
# an error report is a block starting at a "==PID== <what>" line after a blank one
ours=$(cat "${logs[@]}" 2>/dev/null | awk '
    /^==[0-9]+== $/ { if (inblock && hit) n++; inblock = 0; hit = 0; next }
    /^==[0-9]+== [A-Z]/ && !/ERROR SUMMARY|HEAP SUMMARY|LEAK SUMMARY|Memcheck|Copyright|Using Valgrind|Command:|Parent PID/ { inblock = 1 }
    inblock && /idempotency\.so|claim_operation|complete_operation|idem_/ { hit = 1 }
    END { if (inblock && hit) n++; print n + 0 }')
echo "== valgrind: $processes processes, $total errors in all, $ours with the extension on the stack"
if ((total > 0)); then
    keep=1
    grep -h -A 25 -E '^==[0-9]+== (Invalid|Conditional|Use of uninitialised|Syscall param|Source and destination)' "${logs[@]}" | head -n 120
fi
echo "   ($(($(date +%s) - start)) s in all)"

passed=0 failed=0
if ((rc == 0)); then passed=$((passed + 1)); echo "ok - regress and isolation pass under valgrind"; else
    failed=$((failed + 1)); keep=1; echo "not ok - regress or isolation failed under valgrind"
    cat "$dir/regress.out" "$dir/isolation.out" | tail -n 40
    [[ -f $tree/regression.diffs ]] && head -n 60 "$tree/regression.diffs"
    [[ -f $tree/output_iso/regression.diffs ]] && head -n 60 "$tree/output_iso/regression.diffs"
fi
if ((ours == 0)); then passed=$((passed + 1)); echo "ok - no valgrind error with the extension on the stack"; else
    failed=$((failed + 1)); echo "not ok - $ours valgrind errors with the extension on the stack"; fi
if ((total == 0)); then passed=$((passed + 1)); echo "ok - no valgrind error at all (errors found: 0)"; else
    failed=$((failed + 1)); echo "not ok - $total valgrind errors in PostgreSQL itself (see above; add a justified suppression)"; fi
echo "valgrind: $passed passed, $failed failed"
((failed == 0))
