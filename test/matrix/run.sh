#!/usr/bin/env bash
# test/matrix/run.sh: the replay matrix and its report, tested end to end.
#
#   PGHOST=... PGPORT=... PGUSER=... [PGDATABASE=...] test/matrix/run.sh [RUNNER-ARGS...]
#
# Needs a running server with the idempotency extension installed (make
# install); the runner creates the extension in the database if it is not
# there yet (--create-extension). Steps:
#   1. build ./idempotency-matrix if it is missing or stale (make idempotency-matrix);
#   2. run the full matrix (all policies, cases 1-13) with --html and --json
#      into a temporary directory; it must exit 0 and every case must hold;
#   3. the runner's own check: hold checked against retry's expectations
#      must fail (exit 1) in exactly the cells where the policies differ;
#   4. the browser test (test/matrix/browser-test.mjs, Debian's headless
#      chromium, no npm packages) on the HTML report: it renders, and
#      ArrowRight scrolls the focused matrix in a narrow window.
# The last line is the total: "matrix: N passed, N failed". Exits non-zero
# on any failure. The reports, screenshots and the PDF are kept in
# $MATRIX_OUT if set, else in a temporary directory that is removed on
# success and kept (and named) on failure.
#
# Environment: MATRIX_OUT, CHROMIUM (default /usr/bin/chromium),
# MATRIX_INSTALL_CHROMIUM=0 to never apt-get install chromium when it is missing
# (by default, as root, it is installed).
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
runner=$root/idempotency-matrix
chromium=${CHROMIUM:-/usr/bin/chromium}

die() { echo "test/matrix/run.sh: error: $*" >&2; exit 2; }

command -v node >/dev/null || die "node is not installed (the browser test needs Node.js 18 or later)"
if [[ ! -x $chromium ]]; then
    if [[ $(id -u) == 0 && ${MATRIX_INSTALL_CHROMIUM:-1} != 0 && -z ${CHROMIUM:-} ]]; then
        echo "== installing chromium (Debian package) for the browser test"
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -q chromium >/dev/null ||
            die "apt-get install chromium failed"
    else
        die "$chromium not found: apt-get install -y chromium (or set CHROMIUM)"
    fi
fi

echo "== build"
make --no-print-directory -C "$root" idempotency-matrix >/dev/null || die "make idempotency-matrix failed"

if [[ -n ${MATRIX_OUT:-} ]]; then
    out=$MATRIX_OUT
    mkdir -p "$out" || die "cannot create $out"
    keep=1
else
    out=$(mktemp -d "${TMPDIR:-/tmp}/idempotency-matrix-test.XXXXXX") || die "mktemp failed"
    keep=0
fi

passed=0
failed=0
count() {   # add up the "N passed, N failed" line of a log
    local line
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$1" | tail -n 1)
    if [[ -z $line ]]; then
        failed=$((failed + 1))
        return
    fi
    passed=$((passed + $(cut -d' ' -f1 <<<"$line")))
    failed=$((failed + $(cut -d' ' -f3 <<<"$line")))
}
bad=0

echo "== the full matrix (idempotency-matrix --create-extension --html --json $*)"
start=$(date +%s)
"$runner" --create-extension --html "$out/matrix.html" --json "$out/matrix.json" "$@" | tee "$out/matrix.txt"
rc=${PIPESTATUS[0]}
echo "== the matrix took $(( $(date +%s) - start )) s and exited $rc"
count "$out/matrix.txt"
if ((rc != 0)); then
    bad=1
fi
[[ -s $out/matrix.html && -s $out/matrix.json ]] || { echo "not ok - the runner wrote no HTML/JSON report"; bad=1; failed=$((failed + 1)); }

echo "== the runner's own check: policy hold checked against retry's expectations must fail"
"$runner" --quiet --color=never --policy hold --check-as retry --cases 5,6,9 --lease 1 >"$out/check-as.txt" 2>&1
rc=$?
if ((rc == 1)) && grep -qx '0 passed, 3 failed' "$out/check-as.txt"; then
    echo "ok - the mismatching cases 5, 6 and 9 fail, exit status 1"
    passed=$((passed + 1))
else
    echo "not ok - expected exit 1 and '0 passed, 3 failed'; got exit $rc:"
    sed 's/^/    /' "$out/check-as.txt"
    failed=$((failed + 1))
    bad=1
fi

if [[ -s $out/matrix.html ]]; then
    echo "== the browser test (chromium, headless) on $out/matrix.html"
    CHROMIUM=$chromium node "$here/browser-test.mjs" "$out/matrix.html" "$out/matrix.json" --out "$out" | tee "$out/browser.txt"
    rc=${PIPESTATUS[0]}
    count "$out/browser.txt"
    ((rc == 0)) || bad=1
fi

if ((bad == 0 && failed == 0)); then
    if ((keep)); then
        echo "== reports in $out"
    else
        rm -rf "$out"
    fi
    echo "matrix: $passed passed, $failed failed"
    exit 0
fi
echo "== failed; reports, screenshots and logs kept in $out"
echo "matrix: $passed passed, $((failed > 0 ? failed : 1)) failed"
exit 1
