#!/usr/bin/env bash
# test/citus/cluster.sh: a throwaway Citus cluster on this machine: a
# coordinator and two workers, for the tests of the distributed install
# (issue 11). Needs Citus installed (scripts/citus install).
#
# Sourced (bash):
#   source test/citus/cluster.sh
#   citus_cluster_start              # start, register, export PG* for the coordinator
#   psql -c 'select * from citus_get_active_worker_nodes()'
#   citus_psql w1 -c '...'           # a node by name: coord, w1, w2
#   citus_node_stop w1 [fast|immediate]   # stop one worker (default immediate: a crash)
#   citus_node_start w1              # start it again (same data, same port)
#   citus_cluster_stop               # also done on exit, error, Ctrl-C (traps)
#
# As a command:
#   test/citus/cluster.sh run [--] CMD [ARG...]   start, run CMD (bash -c if
#                                    one word with spaces) with the
#                                    environment below, stop; exit with CMD's status
#   test/citus/cluster.sh start      start and leave it running (no traps);
#                                    prints the path of an env file to source
#   test/citus/cluster.sh stop DIR   stop and remove a cluster started so
#
# What it makes: a temp dir $CITUS_DIR (under $TMPDIR or /tmp) holding three
# data directories (coord, w1, w2), their logs (coord.log, ...) and the Unix
# sockets. Every server listens on the socket in $CITUS_DIR only
# (listen_addresses=''), on a free port (20000-29999), as user postgres via
# runuser when root; trust authentication; shared_preload_libraries=citus;
# citus.node_conninfo='sslmode=disable' (a Unix socket has no SSL; Citus's
# default asks for it). The nodes know each other by the socket directory
# as the host name (libpq takes a directory for host), and each knows
# itself so too (citus.local_hostname: Citus connects to its own node to
# drop orphaned shards before a shard move or split, and for the background
# rebalancer; with the default, localhost, those connections are refused:
# no TCP). In database
# $CITUS_DB (default "citus") on all three: CREATE EXTENSION citus; on the
# coordinator: citus_set_coordinator_host and citus_add_node for both workers.
#
# Environment it exports: CITUS_DIR, CITUS_DB, CITUS_PORT_COORD,
# CITUS_PORT_W1, CITUS_PORT_W2, PGHOST=$CITUS_DIR, PGPORT (the coordinator),
# PGUSER=postgres, PGDATABASE=$CITUS_DB, PG_BINDIR (on PATH).
# Settings: PG_CONFIG / PG_MAJOR (scripts/versions.sh), CITUS_DB,
# CITUS_SETTINGS (extra postgresql.conf lines for every node, newline-separated).

_citus_here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# scripts/cluster.sh: versions_resolve, cluster_require_tools,
# cluster_port_free, cluster_as_owner (it sets no traps until cluster_start)
# shellcheck source=scripts/cluster.sh
source "$_citus_here/../../scripts/cluster.sh"

CITUS_DIR=${CITUS_DIR:-}
: "${CITUS_DB:=citus}"
CITUS_NODES=(coord w1 w2)

_citus_log() { echo "citus-cluster: $*" >&2 || true; }
_citus_die() { echo "citus-cluster: error: $*" >&2; exit 1; }

# _citus_port NODE: the port of NODE
_citus_port() {
    case $1 in
        coord) echo "$CITUS_PORT_COORD" ;;
        w1) echo "$CITUS_PORT_W1" ;;
        w2) echo "$CITUS_PORT_W2" ;;
        *) _citus_die "no node '$1' (coord, w1, w2)" ;;
    esac
}

# citus_psql NODE [psql args]: psql to NODE's database, quiet, stop on error
citus_psql() {
    local node=$1
    shift
    "$PG_BINDIR/psql" -X -q -v ON_ERROR_STOP=1 -h "$CITUS_DIR" -p "$(_citus_port "$node")" \
        -U postgres -d "$CITUS_DB" "$@"
}

# _citus_pick_ports: three distinct free ports
_citus_pick_ports() {
    local picked=() try port p dup
    for try in $(seq 1 200); do
        ((${#picked[@]} < 3)) || break
        port=$((20000 + RANDOM % 10000))
        dup=no
        for p in "${picked[@]}"; do [[ $p == "$port" ]] && dup=yes; done
        [[ $dup == no ]] || continue
        cluster_port_free "$port" && picked+=("$port")
    done
    ((${#picked[@]} == 3)) || _citus_die "no three free ports found in 20000-29999"
    CITUS_PORT_COORD=${picked[0]} CITUS_PORT_W1=${picked[1]} CITUS_PORT_W2=${picked[2]}
    export CITUS_PORT_COORD CITUS_PORT_W1 CITUS_PORT_W2
}

# citus_node_start NODE: start NODE's server (its data directory exists)
citus_node_start() {
    local node=$1 port
    port=$(_citus_port "$node")
    if ! (cd "$CITUS_DIR" && cluster_as_owner "$PG_BINDIR/pg_ctl" -D "$CITUS_DIR/$node" \
            -l "$CITUS_DIR/$node.log" -w -t 60 start >/dev/null); then
        tail -n 30 "$CITUS_DIR/$node.log" >&2
        _citus_die "node $node did not start (log above: $CITUS_DIR/$node.log)"
    fi
    "$PG_BINDIR/pg_isready" -q -t 10 -h "$CITUS_DIR" -p "$port" ||
        _citus_die "node $node started but pg_isready fails on port $port"
}

# citus_node_stop NODE [immediate|fast]: stop NODE; immediate (default) is a crash
citus_node_stop() {
    local node=$1 mode=${2:-immediate}
    _citus_port "$node" >/dev/null
    [[ -f $CITUS_DIR/$node/postmaster.pid ]] || return 0
    (cd "$CITUS_DIR" && cluster_as_owner "$PG_BINDIR/pg_ctl" -D "$CITUS_DIR/$node" \
        -m "$mode" -w -t 60 stop >/dev/null 2>&1) || {
        local pid
        pid=$(head -n 1 "$CITUS_DIR/$node/postmaster.pid" 2>/dev/null || true)
        if [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null; then
            _citus_log "stop of $node failed; killing its postmaster $pid"
            kill -KILL "$pid" 2>/dev/null || true
            sleep 1
        fi
    }
}

# citus_cluster_start [--no-traps]
citus_cluster_start() {
    local traps=yes
    [[ ${1:-} == --no-traps ]] && traps=no
    [[ -z $CITUS_DIR ]] || _citus_die "a Citus cluster is already running in $CITUS_DIR"
    cluster_require_tools
    [[ -f $("$PG_CONFIG" --pkglibdir)/citus.so ]] ||
        _citus_die "Citus is not installed for PostgreSQL $PG_MAJOR: run scripts/citus install (as root)"

    # socket paths must stay under ~107 bytes
    local base=${TMPDIR:-/tmp}
    ((${#base} <= 60)) || base=/tmp
    if ((EUID == 0)) && [[ $base != /tmp ]] && ! runuser -u postgres -- test -w "$base" -a -x "$base"; then
        base=/tmp
    fi
    CITUS_DIR=$(mktemp -d "$base/citus.XXXXXX") || _citus_die "mktemp -d in $base failed"
    export CITUS_DIR CITUS_DB
    if [[ $traps == yes ]]; then
        trap '_citus_on_exit' EXIT
        trap '_citus_on_signal INT 130' INT
        trap '_citus_on_signal TERM 143' TERM
        trap '_citus_on_signal HUP 129' HUP
    fi
    ((EUID == 0)) && chown postgres:postgres "$CITUS_DIR"
    _citus_pick_ports

    local node port
    for node in "${CITUS_NODES[@]}"; do
        port=$(_citus_port "$node")
        if ! (cd "$CITUS_DIR" && cluster_as_owner "$PG_BINDIR/initdb" -D "$CITUS_DIR/$node" -U postgres \
                -A trust -E UTF8 --locale=C.UTF-8 --no-sync >"$CITUS_DIR/initdb-$node.log" 2>&1); then
            cat "$CITUS_DIR/initdb-$node.log" >&2
            _citus_die "initdb of $node failed (output above)"
        fi
        cluster_as_owner tee -a "$CITUS_DIR/$node/postgresql.conf" >/dev/null <<EOF

# test/citus/cluster.sh
port = $port
listen_addresses = ''
unix_socket_directories = '$CITUS_DIR'
shared_preload_libraries = 'citus'
citus.node_conninfo = 'sslmode=disable'
citus.local_hostname = '$CITUS_DIR'
${CITUS_SETTINGS:-}
EOF
        citus_node_start "$node"
    done

    for node in "${CITUS_NODES[@]}"; do
        "$PG_BINDIR/psql" -X -q -v ON_ERROR_STOP=1 -h "$CITUS_DIR" -p "$(_citus_port "$node")" -U postgres \
            -d postgres -c "CREATE DATABASE \"$CITUS_DB\"" >/dev/null ||
            _citus_die "CREATE DATABASE on $node failed"
        citus_psql "$node" -c 'CREATE EXTENSION citus' >/dev/null ||
            _citus_die "CREATE EXTENSION citus on $node failed"
    done
    citus_psql coord -c "SELECT citus_set_coordinator_host('$CITUS_DIR', $CITUS_PORT_COORD)" >/dev/null ||
        _citus_die "citus_set_coordinator_host failed"
    citus_psql coord -c "SELECT citus_add_node('$CITUS_DIR', $CITUS_PORT_W1)" >/dev/null ||
        _citus_die "citus_add_node (w1) failed"
    citus_psql coord -c "SELECT citus_add_node('$CITUS_DIR', $CITUS_PORT_W2)" >/dev/null ||
        _citus_die "citus_add_node (w2) failed"

    export PGHOST=$CITUS_DIR PGPORT=$CITUS_PORT_COORD PGUSER=postgres PGDATABASE=$CITUS_DB
    case ":$PATH:" in
        *":$PG_BINDIR:"*) ;;
        *) export PATH="$PG_BINDIR:$PATH" ;;
    esac
    local n
    n=$(citus_psql coord -At -c "SELECT count(*) FROM citus_get_active_worker_nodes()")
    [[ $n == 2 ]] || _citus_die "the coordinator sees $n active workers, not 2"
    cat >"$CITUS_DIR/env" <<EOF
export CITUS_DIR=$CITUS_DIR CITUS_DB=$CITUS_DB
export CITUS_PORT_COORD=$CITUS_PORT_COORD CITUS_PORT_W1=$CITUS_PORT_W1 CITUS_PORT_W2=$CITUS_PORT_W2
export PGHOST=$CITUS_DIR PGPORT=$CITUS_PORT_COORD PGUSER=postgres PGDATABASE=$CITUS_DB
export PATH="$PG_BINDIR:\$PATH"
EOF
    _citus_log "Citus $(citus_psql coord -At -c "SELECT extversion FROM pg_extension WHERE extname = 'citus'") on PostgreSQL $("$PG_BINDIR/postgres" -V | awk '{print $3}'): coordinator port $CITUS_PORT_COORD, workers $CITUS_PORT_W1 $CITUS_PORT_W2, sockets in $CITUS_DIR, database $CITUS_DB"
}

# citus_cluster_stop: stop all nodes and remove the temp dir; safe to call twice
citus_cluster_stop() {
    [[ -n ${CITUS_DIR:-} ]] || return 0
    if declare -F citus_cleanup_hook >/dev/null; then
        citus_cleanup_hook || true
    fi
    local node
    for node in "${CITUS_NODES[@]}"; do
        [[ -d $CITUS_DIR/$node ]] && citus_node_stop "$node" fast
    done
    rm -rf "$CITUS_DIR"
    _citus_log "stopped, removed $CITUS_DIR"
    CITUS_DIR=
    unset PGHOST PGPORT
}

_citus_on_exit() {
    local rc=$?
    set +e
    trap '' PIPE
    citus_cluster_stop
    exit "$rc"
}

_citus_on_signal() {
    set +e
    trap '' PIPE
    trap - EXIT INT TERM HUP
    _citus_log "interrupted (SIG$1), cleaning up"
    citus_cluster_stop
    exit "$2"
}

# as a command
if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
    set -euo pipefail
    case ${1:-} in
        run)
            shift
            [[ ${1:-} == -- ]] && shift
            (($#)) || _citus_die "run: no command"
            citus_cluster_start
            set +e
            if (($# == 1)); then bash -c "$1"; else "$@"; fi
            rc=$?
            exit "$rc"
            ;;
        start)
            citus_cluster_start --no-traps
            echo "$CITUS_DIR/env"
            ;;
        stop)
            [[ -n ${2:-} && -d $2 && -f $2/env ]] || _citus_die "stop: give the directory a 'start' printed"
            # shellcheck disable=SC1091
            source "$2/env"
            cluster_require_tools
            citus_cluster_stop
            ;;
        -h|--help|"")
            awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
            [[ -n ${1:-} ]] || exit 2
            ;;
        *) _citus_die "unknown command '$1' (run, start, stop; try --help)" ;;
    esac
fi
