#!/usr/bin/env bash
# test/package/in-root.sh MAJOR DEBDIR: run by test/package/run.sh inside a
# fresh clean root (scripts/root run: minbase + postgresql-MAJOR + git +
# make, no compiler), as root. Installs the built packages as a user would
# and uses them:
#   1. no C compiler is installed, before and after installing the packages
#      (the packages must not pull one in);
#   2. apt-get install ./postgresql-MAJOR-idempotency_*.deb
#      ./idempotency-matrix_*.deb (apt resolves their dependencies);
#   3. the installed files: the control file, every SQL script, the module,
#      /usr/bin/idempotency-matrix, whose --version is the control file's;
#   4. in a throwaway cluster made by pg_virtualenv (postgresql-common):
#      CREATE EXTENSION idempotency (version 0.2), and ALTER EXTENSION
#      UPDATE from 0.1 in a second database; then the replay matrix runner
#      against the first: exit 0, the banner names this PostgreSQL, every
#      case holds ("N passed, 0 failed"), and the policy summary is
#      hold 0/1, retry 1/2, skip 0/1, lookup 1/1 emails in cases 5 and 6;
#   5. with PACKAGE_AUTOPKGTEST=1 (and the tree in /src): the autopkgtest,
#      debian/tests/installcheck (pg_buildext installcheck: regression,
#      isolation, TAP), as a user other than root, after installing its
#      Depends (which bring a compiler: so after 1-4).
# Prints "ok - ..." / "not ok - ..." lines and the total "N passed, N failed";
# exits 1 on any failure, 2 when it cannot run.
set -uo pipefail

major=${1:?MAJOR}
debdir=${2:?DEBDIR}
passed=0
failed=0
ok() { echo "ok - $*"; passed=$((passed + 1)); }
not_ok() {
    local log=$1; shift
    echo "not ok - $*"
    [[ -n $log && -f $log ]] && tail -n 80 "$log" | sed 's/^/    /'
    failed=$((failed + 1))
}
finish() {
    echo "package ($major): $passed passed, $failed failed"
    echo "$passed passed, $failed failed"
    ((failed == 0))
    exit
}
die() { echo "test/package/in-root.sh: error: $*" >&2; exit 2; }
log=$(mktemp -d /tmp/package-test.XXXXXX) || die "mktemp failed"
compilers() {
    local c found=()
    for c in cc gcc c89 c99 clang tcc "gcc-[0-9]*" "clang-[0-9]*"; do
        # shellcheck disable=SC2086 # the globs are meant
        for f in /usr/bin/$c; do [[ -x $f ]] && found+=("$f"); done
    done
    echo "${found[*]}"
}

# 1. no compiler
c=$(compilers)
if [[ -z $c ]]; then
    ok "the clean root has no C compiler (cc, gcc, clang, tcc)"
else
    not_ok "" "the clean root has a compiler: $c"
fi

# 2. install the packages
cd "$debdir" || die "no $debdir"
debs=(./postgresql-"$major"-idempotency_*.deb ./idempotency-matrix_*.deb)
for d in "${debs[@]}"; do [[ -f $d ]] || die "no $d in $debdir"; done
if { apt-get -q update && apt-get -q -y --no-install-recommends install "${debs[@]}"; } >"$log/apt.log" 2>&1; then
    ok "apt-get install ${debs[*]} (dependencies resolved by apt)"
else
    not_ok "$log/apt.log" "apt-get install of the packages failed:"
    finish
fi
c=$(compilers)
if [[ -z $c ]]; then
    ok "installing the packages brought no compiler"
else
    not_ok "" "installing the packages brought a compiler: $c"
fi

# 3. the installed files
share=/usr/share/postgresql/$major/extension
lib=/usr/lib/postgresql/$major/lib
version=$(sed -n "s/^default_version *= *'\(.*\)'/\1/p" "$share/idempotency.control" 2>/dev/null)
missing=()
# idempotency--$version.sql: the default version's own install script,
# which CREATE EXTENSION runs (without it, the upgrade chain would run and
# still give $version)
for f in "$share/idempotency.control" "$share/idempotency--$version.sql" \
         "$share/idempotency--0.1.sql" "$share/idempotency--0.1--0.2.sql" "$share/idempotency--0.2--0.3.sql" \
         "$lib/idempotency.so" /usr/bin/idempotency-matrix /usr/share/man/man1/idempotency-matrix.1.gz; do
    [[ -f $f ]] || missing+=("$f")
done
if ((${#missing[@]} == 0)) && [[ -n $version ]]; then
    ok "installed: the control file (default_version $version), the SQL scripts (idempotency--$version.sql among them), idempotency.so, /usr/bin/idempotency-matrix and its manual page"
else
    not_ok "" "missing after install: ${missing[*]:-no default_version in the control file}"
fi
runner_version=$(idempotency-matrix --version 2>&1)
if [[ $runner_version == "idempotency-matrix $version" ]]; then
    ok "idempotency-matrix --version: $runner_version"
else
    not_ok "" "idempotency-matrix --version said '$runner_version', expected 'idempotency-matrix $version'"
fi

# 4. a throwaway cluster (pg_virtualenv), the extension, the matrix
cat >"$log/in-venv.sh" <<'EOF'
set -uo pipefail
log=$1 major=$2 version=$3
psql=(psql -X -q -At -v ON_ERROR_STOP=1)
rc=0
{
    "${psql[@]}" -c 'CREATE DATABASE matrix' -c 'CREATE DATABASE upgrade' &&
    "${psql[@]}" -d matrix -c 'CREATE EXTENSION idempotency' &&
    "${psql[@]}" -d matrix -c "SELECT 'created ' || extversion FROM pg_extension WHERE extname = 'idempotency'" &&
    "${psql[@]}" -d upgrade -c "CREATE EXTENSION idempotency VERSION '0.1'" -c 'ALTER EXTENSION idempotency UPDATE' &&
    "${psql[@]}" -d upgrade -c "SELECT 'updated ' || extversion FROM pg_extension WHERE extname = 'idempotency'" &&
    "${psql[@]}" -d matrix -c "SELECT 'server ' || current_setting('server_version_num')::int / 10000"
} >"$log/sql.log" 2>&1 || rc=1
echo "sql $rc" >>"$log/sql.log"
# the runner as a user runs it: libpq settings from the environment
# (pg_virtualenv exports PGHOST, PGPORT, PGUSER, PGPASSWORD)
start=$(date +%s)
TMPDIR=$log LC_ALL=C.UTF-8 PGDATABASE=matrix idempotency-matrix $MATRIX_ARGS >"$log/matrix.txt" 2>"$log/matrix.err"
echo $? >"$log/matrix.rc"
echo $(( $(date +%s) - start )) >"$log/matrix.secs"
EOF
# the roots share the host's network (and other roots' clusters): a port
# nothing listens on for pg_virtualenv's cluster (PGPORT; else it takes 5432)
used=" "
while read -r _ addr _ st _; do
    [[ $st == 0A ]] && used+="$((16#${addr##*:})) "
done < <(cat /proc/net/tcp /proc/net/tcp6 2>/dev/null)
for _ in {1..100}; do
    PGPORT=$((20000 + RANDOM % 20000))
    [[ $used != *" $PGPORT "* ]] && break
done
export PGPORT
echo "== pg_virtualenv -v $major (port $PGPORT): CREATE EXTENSION, ALTER EXTENSION UPDATE, idempotency-matrix ${MATRIX_ARGS:-}"
if ! MATRIX_ARGS=${MATRIX_ARGS:-} pg_virtualenv -v "$major" bash "$log/in-venv.sh" "$log" "$major" "$version" >"$log/venv.log" 2>&1; then
    not_ok "$log/venv.log" "pg_virtualenv -v $major failed:"
fi
sql=$(cat "$log/sql.log" 2>/dev/null)
if grep -qx "sql 0" <<<"$sql" && grep -qx "created $version" <<<"$sql" && grep -qx "server $major" <<<"$sql"; then
    ok "pg_virtualenv cluster (PostgreSQL $major): CREATE EXTENSION idempotency gives version $version"
else
    not_ok "$log/sql.log" "CREATE EXTENSION idempotency in the pg_virtualenv cluster failed:"
fi
if grep -qx "updated $version" <<<"$sql"; then
    ok "CREATE EXTENSION idempotency VERSION '0.1'; ALTER EXTENSION idempotency UPDATE gives $version"
else
    not_ok "$log/sql.log" "ALTER EXTENSION idempotency UPDATE from 0.1 did not give $version:"
fi
txt=$log/matrix.txt
rc=$(cat "$log/matrix.rc" 2>/dev/null || echo "none")
total=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$txt" 2>/dev/null | tail -n 1)
if [[ $rc == 0 && -n $total && $total == *" passed, 0 failed" && ${total%% *} -gt 0 ]]; then
    ok "idempotency-matrix ${MATRIX_ARGS:-}: exit 0, $total (in $(cat "$log/matrix.secs") s)"
else
    echo "    stderr:"; tail -n 20 "$log/matrix.err" 2>/dev/null | sed 's/^/    /'
    not_ok "$txt" "idempotency-matrix ${MATRIX_ARGS:-}: exit $rc, total '${total:-none}':"
fi
if grep -qE "^Replay matrix: send_confirmation for ORD-1001, idempotency $version \(c edition\) on PostgreSQL $major\." "$txt" 2>/dev/null; then
    ok "the runner's banner: idempotency $version (c edition) on PostgreSQL $major"
else
    not_ok "" "the runner's banner does not say 'idempotency $version (c edition) on PostgreSQL $major':"
    head -n 3 "$txt" 2>/dev/null | sed 's/^/    /'
fi
if [[ -z ${MATRIX_ARGS:-} ]]; then
    summary_ok=1
    grep -qE '^policy +case 5 +case 6 +expected$' "$txt" || summary_ok=0
    for row in 'hold 0 1 0 and 1' 'retry 1 2 1 and 2' 'skip 0 1 0 and 1' 'lookup 1 1 1 and 1'; do
        read -r p e5 e6 x5 _ x6 <<<"$row"
        grep -qE "^$p +$e5 +$e6 +$x5 and $x6 +✓$" "$txt" || summary_ok=0
    done
    if ((summary_ok)); then
        ok "the policy summary: hold 0 and 1, retry 1 and 2, skip 0 and 1, lookup 1 and 1 emails in cases 5 and 6, each ✓"
    else
        not_ok "" "the policy summary rows are missing or wrong:"
        sed -n '/^Policy summary/,$p' "$txt" | sed 's/^/    /'
    fi
fi

# 5. the autopkgtest (optional)
if [[ ${PACKAGE_AUTOPKGTEST:-0} == 1 ]]; then
    if [[ ! -x /src/debian/tests/installcheck ]]; then
        not_ok "" "PACKAGE_AUTOPKGTEST=1 but the tree (debian/tests/installcheck) is not in /src"
    else
        start=$(date +%s)
        deps=$(sed -n '/^Depends:/,/^[A-Z]/p' /src/debian/tests/control | sed -e '1d' -e '$d' -e 's/[ ,]//g' | grep -v '^@$' | xargs)
        # shellcheck disable=SC2086 # a list of package names
        if ! apt-get -q -y --no-install-recommends install $deps >"$log/autopkgtest-deps.log" 2>&1; then
            not_ok "$log/autopkgtest-deps.log" "installing the autopkgtest's Depends ($deps) failed:"
        else
            id tester >/dev/null 2>&1 || useradd -m tester
            rm -rf /home/tester/src && cp -a /src /home/tester/src && chown -R tester: /home/tester/src
            if runuser -u tester -- bash -c 'cd ~/src && debian/tests/installcheck' >"$log/autopkgtest.log" 2>&1; then
                # what ran: pg_regress's and prove's summary lines
                ran=$(grep -E '^ *(# )?All [0-9]+ tests passed|^Files=[0-9]+, Tests=[0-9]+' "$log/autopkgtest.log" |
                      sed -e 's/^ *\(# \)\?//' -e 's/\. *$//' -e 's/, *[0-9]* wallclock.*//' | paste -sd ';' -)
                ok "autopkgtest debian/tests/installcheck (pg_buildext installcheck, as a user) passed in $(( $(date +%s) - start )) s: ${ran:-no summary lines}"
            else
                not_ok "$log/autopkgtest.log" "autopkgtest debian/tests/installcheck failed:"
            fi
        fi
    fi
fi

finish
