# shellcheck shell=bash
# scripts/cluster.sh: a throwaway PostgreSQL cluster, for scripts to source.
#
#   source scripts/cluster.sh
#   cluster_start [-c name=value ...]   # extra server settings, optional;
#                                       # $CLUSTER_SETTINGS is added too
#   psql -c 'select 1'                  # PGHOST/PGPORT/PGUSER/PGDATABASE are set
#   cluster_stop                        # optional: also done on exit/error/signal
#
# cluster_start
#   - makes a temp dir ($CLUSTER_DIR, under $TMPDIR or /tmp) holding the data
#     directory ($CLUSTER_DIR/data), the server log ($CLUSTER_DIR/server.log)
#     and the Unix socket; the server listens on that socket only
#     (listen_addresses=''), so nothing is reachable over TCP;
#   - runs initdb and pg_ctl as user postgres when root (initdb refuses root),
#     as the current user otherwise ($CLUSTER_OWNER says which);
#   - uses the port in $CLUSTER_PORT if set (and fails with "port N in use" if
#     it is taken), else picks a free one in 20000-29999;
#   - exports PGHOST, PGPORT, PGUSER=postgres, PGDATABASE=postgres, PGDATA,
#     and PG_BINDIR (prepended to PATH);
#   - sets traps on EXIT, INT, TERM and HUP that stop the server and remove the
#     temp dir. They replace traps the caller had. A caller that needs its own
#     clean-up can define a function `cluster_cleanup_hook`: it is called
#     before the server is stopped (e.g. to copy logs out of $CLUSTER_DIR).
#
# Other helpers: cluster_as_owner CMD...   (run CMD as $CLUSTER_OWNER)
#                cluster_require_tools, cluster_require_headers
#                cluster_port_free N, cluster_pick_port
#
# Settings (environment): PG_CONFIG or PG_MAJOR (which PostgreSQL; default:
# the newest supported server installed, see scripts/versions.sh), CLUSTER_PORT, TMPDIR,
# CLUSTER_SETTINGS (e.g. "-c shared_preload_libraries=idempotency").
# Needs bash; works with and without `set -euo pipefail` in the caller.

# shellcheck source=scripts/versions.sh
source "$(dirname "${BASH_SOURCE[0]}")/versions.sh"
versions_resolve
CLUSTER_DIR=${CLUSTER_DIR:-}

# never fatal: on Ctrl-C of `scripts/test | tee log`, stderr may be a broken pipe
_cluster_log() { echo "cluster: $*" >&2 || true; }
_cluster_die() { echo "cluster: error: $*" >&2; exit 1; }

# cluster_require_tools: pg_config, initdb, pg_ctl, pg_isready, psql; sets PG_BINDIR
cluster_require_tools() {
    if [[ ! -x $PG_CONFIG ]]; then
        _cluster_die "pg_config not found at $PG_CONFIG (package postgresql-client-$PG_MAJOR; run scripts/deps, or set PG_CONFIG)"
    fi
    PG_BINDIR=$("$PG_CONFIG" --bindir) || _cluster_die "$PG_CONFIG --bindir failed"
    # the pg_config may have changed since versions_resolve (a caller's own)
    local major
    major=$(versions_major_of "$PG_CONFIG") || _cluster_die "$PG_CONFIG --version printed no PostgreSQL version"
    versions_check_major "$major" "PG_CONFIG=$PG_CONFIG"
    PG_MAJOR=$major
    local tool
    for tool in initdb pg_ctl postgres; do
        [[ -x $PG_BINDIR/$tool ]] ||
            _cluster_die "$PG_BINDIR/$tool not found (package postgresql-$PG_MAJOR; run scripts/deps)"
    done
    for tool in pg_isready psql; do
        [[ -x $PG_BINDIR/$tool ]] ||
            _cluster_die "$PG_BINDIR/$tool not found (package postgresql-client-$PG_MAJOR; run scripts/deps)"
    done
    if ((EUID == 0)) && ! id -u postgres >/dev/null 2>&1; then
        _cluster_die "running as root but there is no user 'postgres' to run the server (package postgresql-$PG_MAJOR creates it)"
    fi
    export PG_BINDIR
}

# cluster_require_headers: the server headers that PGXS builds need
cluster_require_headers() {
    cluster_require_tools
    local inc
    inc=$("$PG_CONFIG" --includedir-server)
    [[ -f $inc/postgres.h ]] ||
        _cluster_die "server headers not found ($inc/postgres.h): install postgresql-server-dev-$PG_MAJOR (run scripts/deps)"
    local pgxs
    pgxs=$("$PG_CONFIG" --pgxs)
    [[ -f $pgxs ]] ||
        _cluster_die "PGXS not found ($pgxs): install postgresql-server-dev-$PG_MAJOR / postgresql-client-$PG_MAJOR (run scripts/deps)"
    command -v "${CC:-gcc}" >/dev/null 2>&1 ||
        _cluster_die "no C compiler (${CC:-gcc}): install gcc (run scripts/deps)"
    command -v make >/dev/null 2>&1 || _cluster_die "make not found: install make (run scripts/deps)"
}

# cluster_as_owner CMD...: run CMD as the cluster's owner (postgres when root)
cluster_as_owner() {
    if ((EUID == 0)); then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

# cluster_port_free N: true if nothing listens on TCP 127.0.0.1:N and no local
# server has a socket .s.PGSQL.N in the usual socket directories
cluster_port_free() {
    local port=$1 dir
    for dir in /var/run/postgresql /run/postgresql /tmp; do
        [[ -e $dir/.s.PGSQL.$port || -e $dir/.s.PGSQL.$port.lock ]] && return 1
    done
    # a real bind, so that any listener (not only PostgreSQL) counts
    perl -MIO::Socket::INET -e '
        IO::Socket::INET->new(LocalAddr => "127.0.0.1", LocalPort => $ARGV[0],
                              Proto => "tcp", Listen => 1, ReuseAddr => 1)
            or exit 1;' "$port"
}

# cluster_pick_port: print a free port ($CLUSTER_PORT if set and free)
cluster_pick_port() {
    if [[ -n ${CLUSTER_PORT:-} ]]; then
        if ! [[ $CLUSTER_PORT =~ ^[1-9][0-9]{0,4}$ ]] || ((CLUSTER_PORT > 65535)); then
            _cluster_die "CLUSTER_PORT='$CLUSTER_PORT' is not a port number"
        fi
        cluster_port_free "$CLUSTER_PORT" ||
            _cluster_die "port $CLUSTER_PORT in use (requested with CLUSTER_PORT); pick another or unset it"
        echo "$CLUSTER_PORT"
        return 0
    fi
    local try port
    for try in $(seq 1 100); do
        port=$((20000 + RANDOM % 10000))
        if cluster_port_free "$port"; then
            echo "$port"
            return 0
        fi
    done
    _cluster_die "no free port found in 20000-29999 after $try tries"
}

# cluster_start [-c name=value ...]
cluster_start() {
    [[ -z $CLUSTER_DIR ]] || _cluster_die "a cluster is already running in $CLUSTER_DIR"
    cluster_require_tools

    local port
    port=$(cluster_pick_port) || exit 1

    # The socket path must stay under ~107 bytes: use /tmp if TMPDIR is long.
    local base=${TMPDIR:-/tmp}
    ((${#base} <= 60)) || base=/tmp
    # as root, the server runs as postgres, which must be able to enter $base
    if ((EUID == 0)) && [[ $base != /tmp ]] && ! runuser -u postgres -- test -w "$base" -a -x "$base"; then
        _cluster_log "user postgres cannot use TMPDIR=$base; using /tmp"
        base=/tmp
    fi
    CLUSTER_DIR=$(mktemp -d "$base/pgcluster.XXXXXX") || _cluster_die "mktemp -d in $base failed"
    export CLUSTER_DIR

    # From here on, the traps clean up whatever happens.
    trap '_cluster_on_exit' EXIT
    trap '_cluster_on_signal INT 130' INT
    trap '_cluster_on_signal TERM 143' TERM
    trap '_cluster_on_signal HUP 129' HUP

    if ((EUID == 0)); then
        CLUSTER_OWNER=postgres
        chown postgres:postgres "$CLUSTER_DIR"
        runuser -u postgres -- test -w "$CLUSTER_DIR" ||
            _cluster_die "user postgres cannot write $CLUSTER_DIR (is $base traversable by it?)"
    else
        CLUSTER_OWNER=$(id -un)
    fi
    export CLUSTER_OWNER

    local data=$CLUSTER_DIR/data log=$CLUSTER_DIR/server.log
    # the subshells cd into CLUSTER_DIR: postgres may not be able to read the caller's cwd
    if ! (cd "$CLUSTER_DIR" && cluster_as_owner "$PG_BINDIR/initdb" -D "$data" -U postgres \
            -A trust -E UTF8 --locale=C.UTF-8 --no-sync >"$CLUSTER_DIR/initdb.log" 2>&1); then
        cat "$CLUSTER_DIR/initdb.log" >&2
        _cluster_die "initdb failed (output above)"
    fi

    local opts="-p $port -k $CLUSTER_DIR -c listen_addresses=''"
    local arg
    # shellcheck disable=SC2206 # CLUSTER_SETTINGS is a word list by design
    local extra=(${CLUSTER_SETTINGS:-} "$@")
    for arg in "${extra[@]}"; do
        opts+=" $arg"
    done
    if ! (cd "$CLUSTER_DIR" && cluster_as_owner "$PG_BINDIR/pg_ctl" -D "$data" -l "$log" \
            -o "$opts" -w -t 60 start >/dev/null); then
        [[ -f $log ]] && tail -n 50 "$log" >&2
        _cluster_die "the server did not start (server log above: $log)"
    fi

    export PGHOST=$CLUSTER_DIR PGPORT=$port PGUSER=postgres PGDATABASE=postgres PGDATA=$data
    case ":$PATH:" in
        *":$PG_BINDIR:"*) ;;
        *) export PATH="$PG_BINDIR:$PATH" ;;
    esac

    "$PG_BINDIR/pg_isready" -q -t 10 ||
        _cluster_die "server started but pg_isready fails on $PGHOST port $PGPORT"
    _cluster_log "PostgreSQL $("$PG_BINDIR/postgres" -V | awk '{print $3}') running in $CLUSTER_DIR, port $PGPORT (Unix socket only), owner $CLUSTER_OWNER"
}

# cluster_stop: stop the server and remove the temp dir; safe to call twice
cluster_stop() {
    [[ -n ${CLUSTER_DIR:-} ]] || return 0
    local dir=$CLUSTER_DIR data=$CLUSTER_DIR/data
    if declare -F cluster_cleanup_hook >/dev/null; then
        cluster_cleanup_hook || true
    fi
    if [[ -f $data/postmaster.pid ]]; then
        if ! (cd "$dir" && cluster_as_owner "$PG_BINDIR/pg_ctl" -D "$data" -m fast -w -t 60 stop >/dev/null 2>&1); then
            # still there? the pid is the postmaster we started
            local pid
            pid=$(head -n 1 "$data/postmaster.pid" 2>/dev/null || true)
            if [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null; then
                _cluster_log "fast shutdown failed; killing postmaster $pid"
                kill -KILL "$pid" 2>/dev/null || true
                sleep 1
            fi
        fi
    fi
    rm -rf "$dir"
    CLUSTER_DIR=
    unset PGHOST PGPORT PGDATA
    _cluster_log "stopped, removed $dir"
}

# The handlers must clean up whatever happens: no errexit, and a write to a
# closed pipe (the reader died with the same Ctrl-C) must not kill us.
_cluster_on_exit() {
    local rc=$?
    set +e
    trap '' PIPE
    cluster_stop
    exit "$rc"
}

_cluster_on_signal() {
    set +e
    trap '' PIPE
    trap - EXIT INT TERM HUP
    _cluster_log "interrupted (SIG$1), cleaning up"
    cluster_stop
    exit "$2"
}
