#!/usr/bin/env bash
# test/portable/run.sh: the portable edition (portable/: SQL and PL/pgSQL
# only) tested as a managed service runs it, on a throwaway cluster of the
# PostgreSQL of PG_CONFIG / PG_MAJOR (scripts/versions.sh). Hook 86 runs it;
# by hand: `test/portable/run.sh` (root, or a user who can build pg_tle).
#
#  1. portable/build.sh into a temp dir: the body, the plain script and the
#     pg_tle installer;
#  2. pg_tle 1.5.2 from the vendored tarball (scripts/pgtle build, cached
#     under /var/cache/idempotency/pgtle: seconds once built);
#  3. an installation view of that PostgreSQL without the C edition and
#     with pg_tle (test/portable/view.sh: pg_tle refuses a name an
#     extension control file on the server has, and the C edition may be
#     installed on this machine); one cluster from it, shared_preload_
#     libraries = 'pg_tle', as postgres when root, on a Unix socket in the
#     temp dir only; roles: regress_tle_admin (LOGIN, pgtle_admin, no
#     superuser) runs the installers, regress_app_owner (LOGIN, no
#     superuser) owns the application databases;
#  4. checks of the installers (one result line each):
#     pgtle-install    a fresh install by regress_tle_admin, then CREATE
#                      EXTENSION by the database owner;
#     pgtle-rerun      the installer again: pg_tle's functions unchanged;
#     pgtle-update     over an older version (the body under version 0.0.1,
#                      created with records): the installer adds VERSION and
#                      the update path and makes it the default; run again,
#                      nothing changes; the owner's ALTER EXTENSION
#                      idempotency UPDATE keeps the records;
#     pgtle-newer      pg_tle holding a newer version (999.0): refused,
#                      nothing changed;
#     pgtle-c-edition  an idempotency.control in the view (the C edition
#                      installed on the server): the installer refuses, and
#                      so does pgtle.install_extension itself;
#     plain-twice      the plain script run twice by the database owner on a
#                      fresh database: pg_dump (schema and data) the same
#                      after the second run as after the first;
#     plain-records    over an install holding records: run again, the dump
#                      is unchanged (records, job types, audit kept);
#  5. pg_regress --use-existing: every sql/*.sql with the C edition's
#     expected/*.out, unchanged, but the tests test/portable/skip names
#     (with the reason), in a database where pg_tle is created and the
#     installer ran (each test runs CREATE EXTENSION idempotency itself);
#  6. pg_isolation_regress --use-existing: every test/isolation/specs/*.spec
#     but those skipped, in a database where the extension is created.
# Prints each failure's diffs, then "summary: N passed, N failed (N
# skipped)"; exits 0 only if nothing failed and something ran.
#
# Settings: PORTABLE_PARTIAL=1 builds the body from the files portable/
# has when some of build.sh's FILES are still missing (empty stand-ins;
# said loudly; for the portable edition's development); PORTABLE_KEEP=1
# keeps the temp dir (logs, results, the built files); PORTABLE_TIMEOUT
# bounds each suite (seconds, default 600). TMPDIR: where the temp dir goes
# (the server's user must be able to enter it; /tmp if not).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
srcdir=$(cd "$here/../.." && pwd)
# shellcheck source=scripts/versions.sh disable=SC1091
source "$srcdir/scripts/versions.sh"
versions_resolve
export PG_CONFIG

die() { echo "test/portable/run.sh: error: $*" >&2; exit 1; }
log() { echo "== $*"; }
start_time=$SECONDS
timeout_s=${PORTABLE_TIMEOUT:-600}

bindir=$("$PG_CONFIG" --bindir)
pgxs_src=$(dirname "$(dirname "$("$PG_CONFIG" --pgxs)")")
pg_regress=$pgxs_src/test/regress/pg_regress
pg_isolation_regress=$pgxs_src/test/isolation/pg_isolation_regress
[[ -x $pg_regress && -x $pg_isolation_regress ]] || die "no pg_regress or pg_isolation_regress under $pgxs_src (postgresql-client-$PG_MAJOR)"

# the temp dir: short (the socket path), enterable by the server's user
base=${TMPDIR:-/tmp}
((${#base} <= 60)) || base=/tmp
if ((EUID == 0)) && ! runuser -u postgres -- test -x "$base"; then base=/tmp; fi
work=$(mktemp -d "$base/portable.XXXXXX")
chmod 755 "$work"
as_owner() {
    if ((EUID == 0)); then runuser -u postgres -- "$@"; else "$@"; fi
}

data=$work/run/data
stop_cluster() {
    if [[ -f $data/postmaster.pid ]]; then
        (cd "$work" && as_owner "$view_bin/pg_ctl" -D "$data" -m fast -w -t 60 stop >/dev/null 2>&1) || {
            pid=$(head -n 1 "$data/postmaster.pid" 2>/dev/null || true)
            if [[ $pid =~ ^[0-9]+$ ]]; then kill -KILL "$pid" 2>/dev/null || true; fi
        }
    fi
}
cleanup() {
    local rc=$?
    set +e
    stop_cluster
    if [[ ${PORTABLE_KEEP:-0} == 1 ]]; then
        echo "test/portable/run.sh: kept $work"
    else
        rm -rf "$work"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---- 1. the portable files
log "portable/build.sh (PostgreSQL $PG_MAJOR, $PG_CONFIG)"
partial_note=""
if [[ ${PORTABLE_PARTIAL:-0} == 1 ]]; then
    mkdir -p "$work/src/portable"
    cp -R "$srcdir/portable/." "$work/src/portable/"
    cp "$srcdir/idempotency.control" "$work/src/"
    files=$(sed -n 's/^FILES="\(.*\)"$/\1/p' "$srcdir/portable/build.sh")
    missing=()
    for f in $files; do
        [[ -f $work/src/portable/$f ]] || { : >"$work/src/portable/$f"; missing+=("$f"); }
    done
    if ((${#missing[@]})); then
        partial_note=" (PARTIAL BODY: portable/ lacks ${missing[*]})"
        echo "test/portable/run.sh: PORTABLE_PARTIAL=1: empty stand-ins for the missing portable/${missing[*]}"
    fi
    build_sh=$work/src/portable/build.sh
else
    build_sh=$srcdir/portable/build.sh
fi
sh "$build_sh" "$work/build" || die "portable/build.sh failed (PORTABLE_PARTIAL=1 builds from the files there are)"
version=$(sed -n "s/^default_version[[:space:]]*=[[:space:]]*'\(.*\)'/\1/p" "$srcdir/idempotency.control")
body=$work/build/idempotency--$version.sql
plain=$work/build/idempotency-portable.sql
installer=$work/build/idempotency-pgtle.sql
[[ -f $body && -f $plain && -f $installer ]] || die "portable/build.sh made no $body, $plain or $installer"
# installers of other versions, from the same body: an older and a newer one
sh "$srcdir/portable/pgtle.sh" 0.0.1 "$body" "$work/build/older-pgtle.sql"
sh "$srcdir/portable/pgtle.sh" 999.0 "$body" "$work/build/newer-pgtle.sql"
chmod -R go+rX "$work/build"

# ---- 2. pg_tle, 3. the view and its cluster
log "pg_tle"
tle_root=$("$srcdir/scripts/pgtle" build) || die "scripts/pgtle build failed"
view_bin=$(PG_CONFIG=$PG_CONFIG "$here/view.sh" "$work/view" "$tle_root")

mkdir -p "$work/run"
((EUID == 0)) && chown postgres:postgres "$work/run"
port=$((55400 + $$ % 100))
(cd "$work" && as_owner "$view_bin/initdb" -D "$data" -U postgres -A trust -E UTF8 --locale=C.UTF-8 \
    --no-sync >"$work/initdb.log" 2>&1) || { cat "$work/initdb.log" >&2; die "initdb failed"; }
(cd "$work" && as_owner "$view_bin/pg_ctl" -D "$data" -l "$work/run/server.log" -w -t 60 \
    -o "-p $port -k $work/run -c listen_addresses='' -c shared_preload_libraries=pg_tle -c fsync=off -c max_prepared_transactions=10" \
    start >/dev/null) || { tail -n 30 "$work/run/server.log" >&2; die "the server did not start"; }
export PGHOST=$work/run PGPORT=$port PGUSER=postgres PGDATABASE=postgres
unset PGDATA PGSERVICE PGOPTIONS
log "cluster: PostgreSQL $("$view_bin/postgres" -V | awk '{print $3}') from the view $work/view, port $port (Unix socket only)"

# every statement of the checks bounded (the suites: by PORTABLE_TIMEOUT)
psql_() { PGOPTIONS='-c statement_timeout=120s' "$bindir/psql" -X -q -v ON_ERROR_STOP=1 "$@"; }
su_() { psql_ -U postgres "$@"; }

available=$(su_ -Atc "SELECT string_agg(name, ' ' ORDER BY name) FROM pg_available_extensions WHERE name IN ('idempotency', 'pg_tle')")
[[ $available == pg_tle ]] || die "the view's extensions are '$available', not pg_tle alone (the C edition must not be visible)"

su_ <<'EOF'
CREATE ROLE regress_tle_admin LOGIN;
CREATE ROLE regress_app_owner LOGIN;
EOF

# a database for the application: owned by regress_app_owner, pg_tle created
# in it by the superuser, pgtle_admin granted (pg_tle creates the role)
new_db() {
    local db=$1
    su_ -c "CREATE DATABASE $db OWNER regress_app_owner TEMPLATE template0"
    # pg_regress's own settings for its databases (--use-existing sets none)
    su_ -c "ALTER DATABASE $db SET lc_messages TO 'C'" -c "ALTER DATABASE $db SET lc_monetary TO 'C'" \
        -c "ALTER DATABASE $db SET lc_numeric TO 'C'" -c "ALTER DATABASE $db SET lc_time TO 'C'" \
        -c "ALTER DATABASE $db SET bytea_output TO 'hex'" -c "ALTER DATABASE $db SET timezone_abbreviations TO 'Default'"
    [[ ${2:-} == plain ]] && return 0
    su_ -d "$db" -c "CREATE EXTENSION pg_tle" -c "SET client_min_messages = warning" \
        -c "GRANT pgtle_admin TO regress_tle_admin"
}
# the installer INSTALLER in DB, as the pgtle_admin role
install_tle() { psql_ -U regress_tle_admin -d "$1" -f "$2"; }
# pg_tle's state in DB: its functions of idempotency and their scripts
tle_state() {
    su_ -d "$1" -Atc "SELECT p.proname || ' ' || md5(p.prosrc) FROM pg_proc p
        WHERE p.pronamespace = 'pgtle'::regnamespace AND p.proname LIKE 'idempotency%' ORDER BY 1"
}

declare -a results=()
passed=0 failed=0 skipped=0
details=()
result() {   # result ok|fail NAME [NOTE]
    if [[ $1 == ok ]]; then
        echo "ok - $2${3:+ ($3)}"; passed=$((passed + 1))
    else
        echo "not ok - $2${3:+: $3}"; failed=$((failed + 1))
    fi
    results+=("$1 $2")
}
# check NAME CMD...: CMD's output into a log; ok when it exits 0
check() {
    local name=$1; shift
    local out=$work/check-$name.log
    if ("$@") >"$out" 2>&1; then
        result ok "$name"
    else
        result fail "$name" "$(tail -n 5 "$out" | tr '\n' ' ' | cut -c1-400)"
        details+=("$out")
    fi
}

# ---- 4. the installers
log "installers"
check_install() {
    new_db tle_install
    install_tle tle_install "$installer"
    psql_ -U regress_app_owner -d tle_install -c "CREATE EXTENSION idempotency"
    v=$(su_ -d tle_install -Atc "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'")
    [[ $v == "$version" ]] || { echo "extversion '$v', not $version"; return 1; }
    # the owner, not a superuser, created it: the objects are the owner's
    o=$(su_ -d tle_install -Atc "SELECT relowner::regrole FROM pg_class WHERE oid = 'idempotency.operations'::regclass")
    [[ $o == regress_app_owner ]] || { echo "idempotency.operations belongs to '$o'"; return 1; }
}
check_rerun() {
    local before after
    before=$(tle_state tle_install)
    local out
    out=$(install_tle tle_install "$installer" 2>&1)
    echo "$out"
    grep -q 'nothing changed' <<<"$out" || { echo "no 'nothing changed' from the second run"; return 1; }
    after=$(tle_state tle_install)
    [[ -n $before && $before == "$after" ]] || { echo "pg_tle's functions changed:"; diff <(echo "$before") <(echo "$after"); return 1; }
}
check_update() {
    local st1 st2 out
    new_db tle_update
    install_tle tle_update "$work/build/older-pgtle.sql"
    psql_ -U regress_app_owner -d tle_update -c "CREATE EXTENSION idempotency"
    [[ $(su_ -d tle_update -Atc "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'") == 0.0.1 ]]
    # records, written as the owner (the tables hold them whatever the functions)
    psql_ -U regress_app_owner -d tle_update <<'EOF'
INSERT INTO idempotency.job_types (job_type, lease, stale_policy) VALUES ('send', '1 minute', 'hold');
INSERT INTO idempotency.operations (job_type, operation_key, status, attempt, claimed_at, heartbeat_at, completed_at, result)
VALUES ('send', 'K1', 'completed', 1, '2026-01-01 00:00:00+00', '2026-01-01 00:00:00+00', '2026-01-01 00:00:01+00', '{"n": 1}'),
       ('send', 'K2', 'claimed', 2, '2026-01-01 00:00:00+00', '2026-01-01 00:00:00+00', NULL, NULL);
EOF
    records() { su_ -d tle_update -Atc "SELECT j::text FROM idempotency.job_types j ORDER BY 1" \
        -c "SELECT o::text FROM idempotency.operations o ORDER BY 1"; }
    local rec_before; rec_before=$(records)
    install_tle tle_update "$installer"
    st1=$(tle_state tle_update)
    echo "$st1" | grep -q "^idempotency--$version.sql " || { echo "no $version in pg_tle"; return 1; }
    echo "$st1" | grep -q "^idempotency--0.0.1--$version.sql " || { echo "no update path 0.0.1 -> $version"; return 1; }
    [[ $(su_ -d tle_update -Atc "SELECT default_version FROM pgtle.available_extensions() WHERE name = 'idempotency'") == "$version" ]] ||
        { echo "the default version is not $version"; return 1; }
    out=$(install_tle tle_update "$installer" 2>&1)
    grep -q 'nothing changed' <<<"$out" || { echo "$out"; echo "no 'nothing changed' from the second run"; return 1; }
    st2=$(tle_state tle_update)
    [[ $st1 == "$st2" ]] || { echo "the second run changed pg_tle's functions"; return 1; }
    psql_ -U regress_app_owner -d tle_update -c "ALTER EXTENSION idempotency UPDATE"
    [[ $(su_ -d tle_update -Atc "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'") == "$version" ]] ||
        { echo "ALTER EXTENSION UPDATE did not reach $version"; return 1; }
    [[ $(records) == "$rec_before" ]] || { echo "records changed by the update"; return 1; }
}
check_newer() {
    local st1 st2 rc=0
    new_db tle_newer
    install_tle tle_newer "$work/build/newer-pgtle.sql"
    st1=$(tle_state tle_newer)
    install_tle tle_newer "$installer" >"$work/newer.out" 2>&1 || rc=$?
    cat "$work/newer.out"
    ((rc != 0)) || { echo "the installer of $version ran over 999.0"; return 1; }
    grep -q 'newer than this installer' "$work/newer.out"
    st2=$(tle_state tle_newer)
    [[ $st1 == "$st2" ]] || { echo "pg_tle's functions changed"; return 1; }
}
# the C edition on the server: an extension control file of the name in the
# view (for this check only): the installer refuses with its own sentence,
# and pg_tle itself refuses the name
check_c_edition() {
    local ctl out rc=0
    ctl=$work/view$("$PG_CONFIG" --sharedir)/extension/idempotency.control
    new_db tle_c_edition
    printf '%s\n' "comment = 'the C edition, as the check sees it'" "default_version = '$version'" >"$ctl"
    out=$(install_tle tle_c_edition "$installer" 2>&1) || rc=$?
    echo "$out"
    if ((rc == 0)) || ! grep -q 'the C edition' <<<"$out"; then rm -f "$ctl"; echo "the installer did not refuse"; return 1; fi
    out=$(psql_ -U regress_tle_admin -d tle_c_edition -c "SELECT pgtle.install_extension('idempotency', '$version', 'x', 'SELECT 1', '{}')" 2>&1) && rc=0 || rc=$?
    echo "$out"
    rm -f "$ctl"
    if ((rc == 0)) || ! grep -q 'control file already exists' <<<"$out"; then echo "pg_tle did not refuse"; return 1; fi
    [[ -z $(tle_state tle_c_edition) ]] || { echo "pg_tle holds idempotency"; return 1; }
}
# pg_dump from 15.14, 16.10 and 17.6 on frames its output with \restrict and
# \unrestrict lines holding a random key: left out
dump() {
    timeout 120 "$bindir/pg_dump" -U postgres -d "$1" --no-sync | grep -vE '^\\(un)?restrict '
}
check_plain_twice() {
    new_db plain plain
    psql_ -U regress_app_owner -d plain -f "$plain"
    dump plain >"$work/plain-1.sql"
    psql_ -U regress_app_owner -d plain -f "$plain"
    dump plain >"$work/plain-2.sql"
    grep -q 'CREATE TABLE idempotency.operations' "$work/plain-1.sql" || { echo "no idempotency.operations in the dump"; return 1; }
    diff "$work/plain-1.sql" "$work/plain-2.sql"
}
check_plain_records() {
    psql_ -U regress_app_owner -d plain <<'EOF'
INSERT INTO idempotency.job_types (job_type, lease, stale_policy, retention) VALUES ('send', '1 minute', 'retry', '7 days');
INSERT INTO idempotency.operations (job_type, operation_key, status, attempt, claimed_at, heartbeat_at, completed_at, result)
VALUES ('send', 'K1', 'completed', 1, '2026-01-01 00:00:00+00', '2026-01-01 00:00:00+00', '2026-01-01 00:00:01+00', '{"n": 1}'),
       ('send', 'K2', 'claimed', 3, '2026-01-01 00:00:00+00', '2026-01-01 00:00:00+00', NULL, NULL);
INSERT INTO idempotency.resolutions (job_type, operation_key, attempt, previous_status, resolution, resolved_by, resolved_at, note)
VALUES ('send', 'K1', 1, 'claimed', 'completed', 'someone', '2026-01-01 00:00:02+00', 'checked');
EOF
    dump plain >"$work/plain-3.sql"
    grep -q "K2" "$work/plain-3.sql" || { echo "the records are not in the dump"; return 1; }
    psql_ -U regress_app_owner -d plain -f "$plain"
    dump plain >"$work/plain-4.sql"
    diff "$work/plain-3.sql" "$work/plain-4.sql"
}
check pgtle-install check_install
check pgtle-rerun check_rerun
check pgtle-update check_update
check pgtle-newer check_newer
check pgtle-c-edition check_c_edition
check plain-twice check_plain_twice
check plain-records check_plain_records

# ---- 5. and 6.: the suites, but the skipped tests
declare -A skip_why=()
while read -r name why; do
    [[ -z $name || $name == \#* ]] && continue
    skip_why[$name]=$why
done <"$here/skip"
# the Makefile's lists: every file, in byte order
names() { local f; for f in "$@"; do f=${f##*/}; echo "${f%.*}"; done | LC_ALL=C sort; }
regress_all=$(names "$srcdir"/sql/*.sql)
iso_all=$(names "$srcdir"/test/isolation/specs/*.spec)
for name in "${!skip_why[@]}"; do
    grep -qx -- "$name" <<<"$regress_all"$'\n'"$iso_all" || { result fail "skip-list" "test/portable/skip names '$name', which is no test"; }
done
regress_run=() iso_run=()
for t in $regress_all; do
    if [[ -n ${skip_why[$t]:-} ]]; then echo "skip - regress $t: ${skip_why[$t]}"; skipped=$((skipped + 1)); else regress_run+=("$t"); fi
done
for t in $iso_all; do
    if [[ -n ${skip_why[$t]:-} ]]; then echo "skip - isolation $t: ${skip_why[$t]}"; skipped=$((skipped + 1)); else iso_run+=("$t"); fi
done

# run_suite NAME TOOL OUTDIR TESTS...: one result line per test from its
# output (15: "test x ... ok", 16+: "ok 1 - x"); a test without one fails
run_suite() {
    local name=$1 tool=$2 outdir=$3; shift 3
    local out=$work/$name.out rc=0 t line
    mkdir -p "$outdir"
    timeout "$timeout_s" "$tool" "$@" >"$out" 2>&1 || rc=$?
    cat "$out"
    ((rc != 124)) || echo "$name: timed out after $timeout_s s"
    for t in "${tests[@]}"; do
        line=$(grep -E "^(test| ) *$t +\.\.\. |^(not )?ok +[0-9]+ +[-+] +$t( |$)" "$out" | head -n 1 || true)
        if [[ $line =~ \.\.\.\ ok|^ok ]]; then
            passed=$((passed + 1)); results+=("ok $name/$t")
        else
            failed=$((failed + 1)); results+=("fail $name/$t")
            echo "not ok - $name $t${line:+: $line}"
        fi
    done
    [[ -f $outdir/regression.diffs ]] && details+=("$outdir/regression.diffs")
    return 0
}

log "regress (${#regress_run[@]} tests, ${#skip_why[@]} names skipped)"
new_db portable_regress
install_tle portable_regress "$installer" >/dev/null 2>&1 || { result fail "regress-setup" "the installer failed in portable_regress"; }
tests=("${regress_run[@]}")
run_suite regress "$pg_regress" "$work/regress" --use-existing --dbname=portable_regress \
    --inputdir="$srcdir" --outputdir="$work/regress" --bindir="$bindir" "${tests[@]}"

log "isolation (${#iso_run[@]} specs)"
new_db portable_isolation
install_tle portable_isolation "$installer" >/dev/null 2>&1 || { result fail "isolation-setup" "the installer failed in portable_isolation"; }
# pg_isolation_regress --load-extension would need CREATE DATABASE: the
# extension is created beforehand instead (by the superuser, as
# --load-extension does)
su_ -d portable_isolation -c "CREATE EXTENSION idempotency" >/dev/null 2>&1 ||
    result fail "isolation-setup" "CREATE EXTENSION idempotency failed in portable_isolation"
tests=("${iso_run[@]}")
run_suite isolation "$pg_isolation_regress" "$work/isolation" --use-existing --dbname=portable_isolation \
    --inputdir="$srcdir/test/isolation" --outputdir="$work/isolation" --bindir="$bindir" "${tests[@]}"

# ---- the failures' details, then the summary
if ((failed)); then
    for f in "${details[@]}"; do
        echo "== $f (first 400 lines)"
        head -n 400 "$f"
    done
    echo "== server log (last 40 lines)"
    tail -n 40 "$work/run/server.log"
fi
# while the portable edition is being written: what the tests called that
# the body does not have
lacking=$(cat "$work"/regress/regression.diffs "$work"/isolation/regression.diffs 2>/dev/null |
    sed -n 's/^+.*ERROR:  *\(function\|procedure\) \(idempotency\.[a-z_]*\)(.*does not exist$/\2/p' | LC_ALL=C sort -u | tr '\n' ' ' || true)
[[ -z $lacking ]] || echo "== the tests called what the body lacks: $lacking"
bad=()
for r in "${results[@]}"; do [[ $r == fail* ]] && bad+=("${r#fail }"); done
((${#bad[@]} == 0)) || echo "== failed: ${bad[*]}"
echo "== portable edition $version on PostgreSQL $PG_MAJOR in $((SECONDS - start_time)) s$partial_note"
echo "summary: $passed passed, $failed failed ($skipped skipped: test/portable/skip)"
((failed == 0 && passed > 0))
