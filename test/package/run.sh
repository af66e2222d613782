#!/usr/bin/env bash
# test/package/run.sh [RELEASE...]: the Debian packages, built and installed
# as a user installs them (root only; default: bookworm trixie forky).
#
# For each release:
#   1. scripts/package RELEASE: build postgresql-N-idempotency and
#      idempotency-matrix in a clean root of that release (with the
#      build-time regression and isolation tests);
#   2. in a FRESH clean root of that release (scripts/root run: the
#      server, git and make; no compiler): test/package/in-root.sh, which
#      checks that no compiler is there before and after, apt-get installs
#      the two .debs, runs CREATE EXTENSION (and ALTER EXTENSION UPDATE from
#      0.1) in a pg_virtualenv cluster, and runs the whole replay matrix
#      with the installed idempotency-matrix (exit status, total, banner,
#      policy summary).
# The releases run in parallel (PACKAGE_TEST_JOBS, default 3; 1: one after
# the other); each one's output is printed when it is done, with the time
# its build and its install test took. The last line is the total:
# "package: N passed, N failed". Exits non-zero on any failure.
#
# Environment:
#   PACKAGE_TEST_JOBS       releases at a time (default 3)
#   PACKAGE_AUTOPKGTEST=1   also run the autopkgtest (debian/tests/installcheck:
#                           regression, isolation and TAP against the installed
#                           package, as a user) in the install root, after
#                           the checks above (it installs a compiler);
#                           about a minute more per release
#   PACKAGE_TEST_OUT=DIR    keep the .debs and logs in DIR (default: a
#                           temporary directory, removed at the end)
#   MATRIX_ARGS             arguments for idempotency-matrix (default none:
#                           the whole matrix; with any, the summary rows are
#                           not checked)
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
srcdir=$(cd "$here/../.." && pwd)
die() { echo "test/package/run.sh: error: $*" >&2; exit 2; }

releases=()
for a in "$@"; do
    case $a in
        bookworm|trixie|forky) releases+=("$a") ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) die "unknown argument '$a': RELEASE is bookworm, trixie or forky" ;;
    esac
done
((${#releases[@]})) || releases=(bookworm trixie forky)
((EUID == 0)) || die "needs root (clean roots: scripts/root)"
njobs=${PACKAGE_TEST_JOBS:-3}
[[ $njobs =~ ^[1-9][0-9]*$ ]] || die "PACKAGE_TEST_JOBS='$njobs' is not a positive number"

if [[ -n ${PACKAGE_TEST_OUT:-} ]]; then
    out=$PACKAGE_TEST_OUT
    mkdir -p "$out" || die "cannot create $out"
    out=$(cd "$out" && pwd)
    keep=1
else
    out=$(mktemp -d "${TMPDIR:-/tmp}/idempotency-package-test.XXXXXX") || die "mktemp failed"
    keep=0
fi
# run_waiting CMD...: CMD in the background, waited for. On SIGTERM or
# SIGINT the signal goes on to CMD and every process it started (by id;
# scripts/root cleans up its root only once its command has ended, and a
# signal to the process group does not reach that command, which timeout(1)
# runs in a group of its own), and this shell exits once CMD has ended.
tree_of() {
    local p
    for p in $(ps -o pid= --ppid "$1" 2>/dev/null); do tree_of "$p"; done
    echo "$1"
}
run_waiting() {
    "$@" &
    local pid=$! rc=0
    # shellcheck disable=SC2046 # a list of process ids
    trap 'kill -TERM $(tree_of '"$pid"') 2>/dev/null; wait '"$pid"'; exit 143' TERM
    # shellcheck disable=SC2046
    trap 'kill -TERM $(tree_of '"$pid"') 2>/dev/null; wait '"$pid"'; exit 130' INT
    wait "$pid" || rc=$?
    trap - TERM INT
    return "$rc"
}

interrupted=0
cleanup() {
    local f
    # the release jobs end their own runs when signalled (run_waiting)
    wait 2>/dev/null
    if ((interrupted)); then
        for f in "$out"/*.log; do
            [[ -f $f ]] || continue
            echo "== $(basename "$f" .log), interrupted:"
            tail -n 15 "$f" | sed 's/^/    /'
        done
        echo "test/package/run.sh: interrupted"
    fi
    ((keep)) || rm -rf "$out"
}
trap cleanup EXIT
trap 'interrupted=1; exit 130' INT
trap 'interrupted=1; exit 143' TERM

major_of() { case $1 in bookworm) echo 15 ;; trixie) echo 17 ;; forky) echo 18 ;; esac; }

# one release: build, then install and use; its output to $out/RELEASE.log
one_release() {
    local rel=$1 major start build_s test_s rc=0
    major=$(major_of "$rel")
    echo "== $rel (PostgreSQL $major): scripts/package $rel"
    start=$SECONDS
    if ! run_waiting "$srcdir/scripts/package" "$rel" --out "$out/debs"; then
        echo "not ok - $rel: scripts/package $rel failed (its log: above)"
        echo "package $rel: build failed after $((SECONDS - start)) s"
        echo "0 passed, 1 failed"
        return 1
    fi
    build_s=$((SECONDS - start))
    echo "ok - $rel: scripts/package built postgresql-$major-idempotency and idempotency-matrix in $build_s s"
    echo "== $rel: install and use the packages in a fresh clean root"
    start=$SECONDS
    local tree=()
    [[ ${PACKAGE_AUTOPKGTEST:-0} == 1 ]] && tree=(--tree "$srcdir")
    run_waiting "$srcdir/scripts/root" run "$rel" "${tree[@]}" --in "$out/debs/$rel:/debs" \
        --in "$here/in-root.sh:/in-root.sh" \
        --env "PACKAGE_AUTOPKGTEST=${PACKAGE_AUTOPKGTEST:-0}" --env "MATRIX_ARGS=${MATRIX_ARGS:-}" \
        --timeout 900 -- "bash /in-root.sh $major /debs" || rc=$?
    test_s=$((SECONDS - start))
    echo "package $rel: build $build_s s, install test $test_s s (exit $rc)"
    # the build counts as one passed check; in-root.sh printed its own total
    return "$rc"
}

start_all=$SECONDS
declare -A pid_of
for rel in "${releases[@]}"; do
    # at most $njobs at a time
    while (($(jobs -rp | wc -l) >= njobs)); do wait -n; done
    one_release "$rel" >"$out/$rel.log" 2>&1 &
    pid_of[$rel]=$!
done

passed=0
failed=0
for rel in "${releases[@]}"; do
    rc=0
    wait "${pid_of[$rel]}" || rc=$?
    cat "$out/$rel.log"
    # every "N passed, N failed" line of the release's log: the build's and in-root.sh's
    if grep -q '^ok - '"$rel"': scripts/package built' "$out/$rel.log"; then
        passed=$((passed + 1))
    fi
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$out/$rel.log" | tail -n 1)
    if [[ -n $line ]]; then
        passed=$((passed + $(cut -d' ' -f1 <<<"$line")))
        failed=$((failed + $(cut -d' ' -f3 <<<"$line")))
    fi
    if ((rc != 0)) && [[ -z $line || $(cut -d' ' -f3 <<<"$line") == 0 ]]; then
        echo "not ok - $rel: exited $rc"
        failed=$((failed + 1))
    fi
done
echo "== package test: ${#releases[@]} release(s) in $((SECONDS - start_all)) s (PACKAGE_TEST_JOBS=$njobs)"
for rel in "${releases[@]}"; do
    grep -h '^package '"$rel"': ' "$out/$rel.log" | sed 's/^/   /'
done
((keep)) && echo "== the .debs and logs: $out"
echo "package: $passed passed, $failed failed"
((failed == 0))
