# shellcheck shell=bash
# scripts/versions.sh: which PostgreSQL the scripts work with; sourced by
# scripts/deps, scripts/cluster.sh, scripts/build.sh and scripts/root.
#
# The one table of supported versions. A major is supported when this tree
# builds and passes on it; "tested" says how CI tests it (README, Supported
# versions):
#
#   major  Debian release that packages it     tested in CI
#   15     12 bookworm                          the machine's own (whole suite)
#   16     none reachable here                  not tested (see README)
#   17     13 trixie                            clean trixie root (scripts/root)
#   18     testing (forky)                      clean forky root (scripts/root)
#
# versions_resolve: sets PG_CONFIG and PG_MAJOR, in this order of preference:
#   - PG_CONFIG if set (PG_MAJOR is read from it);
#   - PG_MAJOR if set: /usr/lib/postgresql/$PG_MAJOR/bin/pg_config;
#   - the newest supported major whose server (postgresql-N) is installed;
#   - the major this Debian release packages (postgresql-common's default).
# An unsupported major is one clear sentence on stderr and exit 1 (before
# anything is installed or built).

IDEMPOTENCY_PG_MAJORS=(15 16 17 18)

# versions_debian_release MAJOR: the Debian codename that packages MAJOR, or nothing
versions_debian_release() {
    case $1 in
        15) echo bookworm ;;
        17) echo trixie ;;
        18) echo forky ;;
        *) ;;
    esac
}

versions_supported_list() {
    local m s=""
    for m in "${IDEMPOTENCY_PG_MAJORS[@]}"; do s+="${s:+, }$m"; done
    echo "$s"
}

_versions_die() {
    echo "$1" >&2
    exit 1
}

# versions_check_major MAJOR WHERE: die unless MAJOR is supported
versions_check_major() {
    local major=$1 where=$2 m
    for m in "${IDEMPOTENCY_PG_MAJORS[@]}"; do
        [[ $major == "$m" ]] && return 0
    done
    _versions_die "idempotency: PostgreSQL $major ($where) is not supported; supported majors: $(versions_supported_list)."
}

# versions_major_of PG_CONFIG: the major of a pg_config ("PostgreSQL 17.12" -> 17)
versions_major_of() {
    local v
    v=$("$1" --version 2>/dev/null) || return 1
    v=${v#PostgreSQL }
    v=${v%%[!0-9]*}
    [[ -n $v ]] || return 1
    echo "$v"
}

# the major Debian's postgresql-common installs by default on this release
_versions_debian_default() {
    local f=/usr/share/postgresql-common/supported_versions m
    if [[ -x $f ]]; then
        m=$("$f" 2>/dev/null | sort -n | tail -n 1)
        [[ -n $m ]] && { echo "$m"; return 0; }
    fi
    # no postgresql-common yet: by the release
    # shellcheck disable=SC1091
    local codename
    codename=$( . /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
    for m in "${IDEMPOTENCY_PG_MAJORS[@]}"; do
        [[ -n $codename && $(versions_debian_release "$m") == "$codename" ]] && { echo "$m"; return 0; }
    done
    return 1
}

versions_resolve() {
    if [[ -n ${PG_CONFIG:-} ]]; then
        if [[ -x $PG_CONFIG ]]; then
            PG_MAJOR=$(versions_major_of "$PG_CONFIG") ||
                _versions_die "idempotency: $PG_CONFIG --version did not print a PostgreSQL version."
            versions_check_major "$PG_MAJOR" "PG_CONFIG=$PG_CONFIG"
        else
            # not installed yet: the path names the major (/usr/lib/postgresql/N/bin/pg_config)
            [[ $PG_CONFIG =~ /postgresql/([0-9]+)/bin/pg_config$ ]] ||
                _versions_die "idempotency: PG_CONFIG=$PG_CONFIG is not an executable pg_config."
            PG_MAJOR=${BASH_REMATCH[1]}
            versions_check_major "$PG_MAJOR" "PG_CONFIG=$PG_CONFIG"
        fi
    elif [[ -n ${PG_MAJOR:-} ]]; then
        [[ $PG_MAJOR =~ ^[0-9]+$ ]] ||
            _versions_die "idempotency: PG_MAJOR='$PG_MAJOR' is not a major version number; supported majors: $(versions_supported_list)."
        versions_check_major "$PG_MAJOR" "PG_MAJOR=$PG_MAJOR"
        PG_CONFIG=/usr/lib/postgresql/$PG_MAJOR/bin/pg_config
    else
        local m
        PG_MAJOR=
        for m in "${IDEMPOTENCY_PG_MAJORS[@]}"; do
            [[ -x /usr/lib/postgresql/$m/bin/postgres ]] && PG_MAJOR=$m
        done
        if [[ -z $PG_MAJOR ]]; then
            PG_MAJOR=$(_versions_debian_default) ||
                _versions_die "idempotency: no PostgreSQL server found and this system packages none the scripts know; install postgresql-N (N one of $(versions_supported_list)) or set PG_MAJOR or PG_CONFIG."
            versions_check_major "$PG_MAJOR" "the version this system packages"
        fi
        PG_CONFIG=/usr/lib/postgresql/$PG_MAJOR/bin/pg_config
    fi
    export PG_CONFIG PG_MAJOR
}
