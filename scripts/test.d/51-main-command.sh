#!/usr/bin/env bash
# The README's main command, scripts/matrix, as a user runs it (issue 3's
# "done when"):
#   1. twice in a row (restricted to --policy hold to keep CI time down):
#      each run builds and installs (already done by scripts/test: no-ops),
#      starts its own throwaway cluster, runs the matrix, prints the total,
#      exits 0, and removes its cluster and the runner's mail directory;
#   2. with --dsn it starts no cluster and builds/installs no extension: the
#      runner works in the given database (here the test cluster's);
#   3. a port in use (CLUSTER_PORT held by a real TCP listener): the clear
#      message and a non-zero exit, and no cluster is left behind;
#   4. no server headers (PG_CONFIG is a pg_config whose --includedir-server
#      is an empty directory, which is what a machine without
#      postgresql-server-dev-N reports): the clear message, non-zero exit;
#   5. no libpq headers (--includedir empty, as without libpq-dev): the
#      clear message from scripts/matrix, and from `make -C matrix`; and
#      `make` at the top, in a copy of the tree, still builds the extension
#      (it builds no client: matrix/ has its own Makefile);
#   6. an unsupported PostgreSQL (PG_MAJOR=14; a pg_config that says 14.11):
#      one sentence naming the supported majors, a non-zero exit, and
#      nothing installed, built or started;
#   7. a supported major this Debian release has no package of (16; as root
#      only, it runs apt-get update): one sentence, non-zero, nothing
#      installed.
# Run by scripts/test with its hook environment (PGHOST, PGPORT, ... of the
# test cluster, CLUSTER_DIR, PG_CONFIG); scripts/matrix makes its own cluster,
# so those are removed from its environment. Adds about 35 s to CI.
set -uo pipefail

srcdir=${TEST_SRCDIR:-$(pwd)}
real_pg_config=${PG_CONFIG:?scripts/test exports PG_CONFIG}
major=$("$real_pg_config" --version | sed -n 's/^PostgreSQL \([0-9]*\).*/\1/p')
tmp=$(mktemp -d "${TMPDIR:-/tmp}/main-command-test.XXXXXX") || exit 2
listener_pid=
cleanup() {
    [[ -n $listener_pid ]] && kill "$listener_pid" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT

passed=0
failed=0
ok() { echo "ok - $*"; passed=$((passed + 1)); }
not_ok() {
    local log=$1; shift
    echo "not ok - $*"
    [[ -n $log && -f $log ]] && sed 's/^/    /' "$log"
    failed=$((failed + 1))
}

# scripts/matrix as a user runs it: not inside the test cluster's environment
# (a CLUSTER_PORT given to scripts/test is not meant for these runs either)
unset CLUSTER_PORT
main_command() {
    env -u CLUSTER_DIR -u CLUSTER_OWNER -u PGHOST -u PGPORT -u PGUSER -u PGDATABASE -u PGDATA "$@"
}

# 1. twice in a row
for run in 1 2; do
    log=$tmp/run$run.log
    start=$SECONDS
    (cd "$tmp" && main_command "$srcdir/scripts/matrix" --policy hold) >"$log" 2>&1
    rc=$?
    total=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$log" | tail -n 1)
    dir=$(sed -n 's/^cluster: PostgreSQL .* running in \(.*\), port .*/\1/p' "$log" | head -n 1)
    maildir=$(sed -n 's/^job types .*, mailboxes in \(.*\): removed at the end$/\1/p' "$log" | head -n 1)
    echo "# run $run: exit $rc, '$total', $((SECONDS - start)) s"
    if ((rc == 0)) && [[ $total =~ ^[1-9][0-9]*\ passed,\ 0\ failed$ ]] &&
        grep -qx '== scripts/matrix: idempotency-matrix exited 0' "$log"; then
        ok "scripts/matrix --policy hold, run $run: exit 0, $total"
    else
        not_ok "$log" "scripts/matrix --policy hold, run $run: expected exit 0 and 'N passed, 0 failed'; got exit $rc, '$total'"
    fi
    if [[ -n $dir && ! -e $dir ]] && grep -qx "cluster: stopped, removed $dir" "$log"; then
        ok "run $run started its own cluster ($dir) and removed it"
    else
        not_ok "$log" "run $run: no cluster started, or its directory '$dir' is still there"
    fi
    if [[ -n $maildir && ! -e $maildir ]]; then
        ok "run $run: the runner removed its mail directory $maildir"
    else
        not_ok "" "run $run: the mail directory '$maildir' was not named or is still there"
    fi
done

# 2. --dsn: the given database, no throwaway cluster, no extension build
log=$tmp/dsn.log
dsn="host=$PGHOST port=$PGPORT dbname=$PGDATABASE user=$PGUSER"
(cd "$tmp" && env -u CLUSTER_DIR "$srcdir/scripts/matrix" --dsn "$dsn" \
    --create-extension --policy hold --cases 1 --quiet) >"$log" 2>&1
rc=$?
if ((rc == 0)) && grep -qx '1 passed, 0 failed' "$log" &&
    grep -q -- '(--dsn, --help or --version given: no throwaway cluster)' "$log" &&
    ! grep -qE '^(cluster: |== build$|== cluster$|install: )' "$log" &&
    grep -q "^server socket $PGHOST port $PGPORT, database $PGDATABASE" "$log"; then
    ok "scripts/matrix --dsn runs in that database, with no cluster and no extension build"
else
    not_ok "$log" "scripts/matrix --dsn: expected exit 0, '1 passed, 0 failed' on $PGHOST:$PGPORT and no cluster or build; got exit $rc"
fi

# 2b. the runner's --help needs no cluster either
log=$tmp/help.log
(cd "$tmp" && env -u CLUSTER_DIR "$srcdir/scripts/matrix" -- --help) >"$log" 2>&1
rc=$?
if ((rc == 0)) && grep -q -- '--policy' "$log" &&
    ! grep -qE '^(cluster: |== build$|== cluster$|install: )' "$log"; then
    ok "scripts/matrix -- --help prints the runner's options, with no cluster and no extension build"
else
    not_ok "$log" "scripts/matrix -- --help: expected exit 0, the options and no cluster or build; got exit $rc"
fi

# 3. a port in use: a real listener holds it
coproc LISTENER {
    exec perl -MIO::Socket::INET -e '
        my $s = IO::Socket::INET->new(LocalAddr => "127.0.0.1", LocalPort => 0,
                                      Proto => "tcp", Listen => 1) or die "listen: $!";
        $| = 1; print $s->sockport, "\n";
        sleep 600;'
}
# shellcheck disable=SC2153 # set by coproc
listener_pid=$LISTENER_PID
port=
read -r -t 10 port <&"${LISTENER[0]}"
if [[ $port =~ ^[0-9]+$ ]]; then
    log=$tmp/port.log
    (cd "$tmp" && CLUSTER_PORT=$port main_command "$srcdir/scripts/matrix" --policy hold) >"$log" 2>&1
    rc=$?
    if ((rc != 0)) &&
        grep -qx "cluster: error: port $port in use (requested with CLUSTER_PORT); pick another or unset it" "$log" &&
        ! grep -q '^cluster: PostgreSQL' "$log" && ! grep -q '^Replay matrix' "$log"; then
        ok "CLUSTER_PORT=$port (held by a listener): 'port $port in use', exit $rc, nothing started"
    else
        not_ok "$log" "CLUSTER_PORT=$port held by a listener: expected 'port $port in use' and a non-zero exit; got exit $rc"
    fi
else
    not_ok "" "could not start a TCP listener to hold a port"
fi
kill "$listener_pid" 2>/dev/null
wait "$listener_pid" 2>/dev/null
listener_pid=

# 4 and 5: a pg_config like one on a machine without the headers
mkdir "$tmp/empty"
fake_pg_config() {   # fake_pg_config FILE OPTION: FILE prints $tmp/empty for OPTION
    cat >"$1" <<EOF
#!/bin/sh
if [ "\$#" -eq 1 ] && [ "\$1" = "$2" ]; then echo "$tmp/empty"; exit 0; fi
exec "$real_pg_config" "\$@"
EOF
    chmod +x "$1"
}

fake_pg_config "$tmp/pg_config_no_server_headers" --includedir-server
log=$tmp/headers.log
(cd "$tmp" && PG_CONFIG=$tmp/pg_config_no_server_headers main_command "$srcdir/scripts/matrix" --policy hold) >"$log" 2>&1
rc=$?
if ((rc != 0)) &&
    grep -qx "cluster: error: server headers not found ($tmp/empty/postgres.h): install postgresql-server-dev-$major (run scripts/deps)" "$log" &&
    ! grep -qE '^(== build|build: |cluster: PostgreSQL)' "$log"; then
    ok "no server headers: the clear message, exit $rc, before any build"
else
    not_ok "$log" "no server headers: expected 'server headers not found ... install postgresql-server-dev-$major' and a non-zero exit; got exit $rc"
fi

fake_pg_config "$tmp/pg_config_no_libpq_headers" --includedir
log=$tmp/libpq.log
(cd "$tmp" && PG_CONFIG=$tmp/pg_config_no_libpq_headers main_command "$srcdir/scripts/matrix" --policy hold) >"$log" 2>&1
rc=$?
if ((rc != 0)) &&
    grep -qx "scripts/matrix: error: the libpq headers are not installed ($tmp/empty/libpq-fe.h not found): install libpq-dev (run scripts/deps)" "$log" &&
    ! grep -qE '^(== build|build: |cluster: PostgreSQL)' "$log"; then
    ok "no libpq headers: scripts/matrix names libpq-dev, exit $rc, before any build"
else
    not_ok "$log" "no libpq headers: expected 'the libpq headers are not installed ... install libpq-dev' and a non-zero exit; got exit $rc"
fi
# make alone, in a copy of the tree (the checkout's runner and objects are
# left alone): `make -C matrix` names libpq-dev before compiling anything;
# `make` at the top builds the extension without the libpq headers, and
# neither builds nor mentions the runner
mkdir "$tmp/tree"
(cd "$srcdir" && cp -r Makefile idempotency.control idempotency--*.sql src matrix "$tmp/tree/") &&
    rm -f "$tmp/tree"/src/*.o "$tmp/tree"/src/*.bc "$tmp/tree"/src/*.so "$tmp/tree"/*.so \
        "$tmp/tree"/matrix/*.o "$tmp/tree/matrix/idempotency-matrix"
log=$tmp/libpq-make.log
make --no-print-directory -C "$tmp/tree/matrix" PG_CONFIG="$tmp/pg_config_no_libpq_headers" >"$log" 2>&1
rc=$?
if ((rc != 0)) && [[ ! -e $tmp/tree/matrix/idempotency-matrix ]] &&
    grep -qxF "idempotency-matrix: error: the libpq headers are not installed ($tmp/empty/libpq-fe.h not found): install libpq-dev (Debian; scripts/deps does)" "$log" &&
    ! compgen -G "$tmp/tree/matrix/*.o" >/dev/null &&
    ! grep -q 'No such file or directory' "$log"; then
    ok "no libpq headers: make -C matrix names libpq-dev, exit $rc, nothing compiled"
else
    not_ok "$log" "no libpq headers: expected make -C matrix to name libpq-dev and fail before compiling; got exit $rc"
fi
log=$tmp/top-make.log
make --no-print-directory -j"$(nproc)" -C "$tmp/tree" PG_CONFIG="$tmp/pg_config_no_libpq_headers" \
    with_llvm=no PG_CFLAGS="-Wall -Wextra -Werror" >"$log" 2>&1
rc=$?
if ((rc == 0)) && [[ -f $tmp/tree/idempotency.so ]] &&
    ! grep -qi 'matrix\|libpq' "$log" &&
    [[ ! -e $tmp/tree/matrix/idempotency-matrix ]] && ! compgen -G "$tmp/tree/matrix/*.o" >/dev/null; then
    ok "no libpq headers: make at the top builds idempotency.so, exit 0, and nothing in matrix/"
else
    not_ok "$log" "no libpq headers: expected make at the top to build idempotency.so and leave matrix/ alone; got exit $rc"
fi

# 6. an unsupported major, named two ways: nothing may happen but the sentence
supported="supported majors: 15, 16, 17, 18."
cat >"$tmp/pg_config_14" <<EOF
#!/bin/sh
if [ "\$#" -eq 1 ] && [ "\$1" = --version ]; then echo "PostgreSQL 14.11"; exit 0; fi
exec "$real_pg_config" "\$@"
EOF
chmod +x "$tmp/pg_config_14"
for how in "PG_MAJOR=14" "PG_CONFIG=$tmp/pg_config_14"; do
    log=$tmp/unsupported.log
    (cd "$tmp" && main_command env -u PG_CONFIG -u PG_MAJOR "$how" "$srcdir/scripts/matrix" --policy hold) >"$log" 2>&1
    rc=$?
    if ((rc != 0)) && [[ $(wc -l <"$log") -eq 1 ]] &&
        grep -qxF "idempotency: PostgreSQL 14 ($how) is not supported; $supported" "$log"; then
        ok "$how: one sentence naming the supported majors, exit $rc, nothing else done"
    else
        not_ok "$log" "$how: expected only 'idempotency: PostgreSQL 14 ($how) is not supported; $supported' and a non-zero exit; got exit $rc"
    fi
done

# 7. a supported major with no package here (16: no Debian release has it)
if ((EUID == 0)); then
    log=$tmp/unpackaged.log
    (cd "$tmp" && main_command env -u PG_CONFIG PG_MAJOR=16 "$srcdir/scripts/matrix" --policy hold) >"$log" 2>&1
    rc=$?
    if ((rc != 0)) &&
        grep -qE "^scripts/deps: PostgreSQL 16 is supported, but .* has no package postgresql-16; install PostgreSQL 16 yourself and set PG_CONFIG to its pg_config, or use a major this release packages \(PG_MAJOR=[0-9]+\)\.$" "$log" &&
        ! grep -qE '^(scripts/deps: apt-get install|== build|build: |cluster: PostgreSQL)' "$log" &&
        [[ ! -e /usr/lib/postgresql/16 ]]; then
        ok "PG_MAJOR=16 (no package here): one sentence, exit $rc, nothing installed"
    else
        not_ok "$log" "PG_MAJOR=16: expected 'PostgreSQL 16 is supported, but ... has no package postgresql-16' and a non-zero exit, nothing installed; got exit $rc"
    fi
else
    echo "skip - PG_MAJOR=16 (not root: scripts/deps would only print the apt-get line)"
fi

echo "main command: $passed passed, $failed failed"
((failed == 0 && passed > 0))
