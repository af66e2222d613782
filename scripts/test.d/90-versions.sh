#!/usr/bin/env bash
# scripts/test: background
# Every supported Debian release and PostgreSQL major, each in a clean root
# (scripts/root: debootstrap minbase + postgresql-N + git + make, nothing
# else), running the README's two commands exactly as a user types them:
#
#   bookworm  Debian 12, PostgreSQL 15   scripts/matrix; scripts/test (whole,
#                                        but hooks 55, 74, 83 and 84: see below)
#   trixie    Debian 13, PostgreSQL 17   scripts/matrix; scripts/test (whole,
#                                        with hook 93: Citus built for 17; but
#                                        hook 55: see below)
#   forky     Debian testing, 18         scripts/matrix; scripts/test regress isolation tap
#
# Each command installs what it needs itself (compiler, headers, test tools):
# that is what this proves. Inside a root the hooks 90-92 (clean roots,
# packages, pg_upgrade) are left out: no root inside a root. Hook 93 (Citus)
# runs in the Debian 13 root only: the host's run covers 15, and Citus 13.2
# does not support 18; the vendored source is copied in (CITUS_VENDOR, default
# ../shared/vendor beside the checkout) and the build is kept in
# $CITUS_ROOT_CACHE (default /var/cache/idempotency/citus-roots) for the next
# run (cold: about 2 minutes more). There the memory test (test/citus/memory.sh)
# makes 5 000 calls per scenario, not 20 000: the growth it guards against
# was 35-76 kB per call (175 MB or more in 5 000 calls against a limit of
# 4 MiB), the host's run keeps the long one, and it saves about 3 minutes of
# the root's critical path. In the Debian 12
# root, so are 74 (fault injection), 83 (restarts under load) and 84 (the
# sign-off run on a directory queue): they test the extension's, the
# helpers' and the runner's behaviour, which the host's own run on Debian 12
# and PostgreSQL 15 already does, and they install nothing the other hooks
# do not (CI time: about 10 minutes). Debian 13 runs them. Neither root runs
# the example jobs' sign-offs through the real brokers (hooks 80-82 with
# SIGNOFF_POLICIES=none), nor Debian 12's hook 55 (the release tarball): the
# host runs both; in the roots the end-to-end tests then run every case, as
# before the sign-offs took cases 1-7 over, and Debian 13 runs hook 84 (the
# sign-off run itself, on PostgreSQL 17). Measured: with the sign-offs under retry in both roots, each root ran
# past 2400 s beside the host's hooks, and the whole run took 61 minutes.
#
# Settings: TEST_RELEASES (default "bookworm trixie forky"), TEST_ROOT_JOBS
# (roots run at once, default 2; the machine has 2 cores and most of a run
# is apt and waiting), TEST_ROOT_TIMEOUT (seconds per root, default 3300).
# Needs root (debootstrap, mount, chroot); as another user it says so and
# exits 0. Logs: $CLUSTER_DIR/roots/RELEASE.log (the tail is printed on a
# failure).
set -uo pipefail

srcdir=${TEST_SRCDIR:-$(pwd)}
if ((EUID != 0)); then
    echo "skip - clean roots need root (debootstrap, mount, chroot); run scripts/test as root to test other releases"
    exit 0
fi

releases=${TEST_RELEASES:-bookworm trixie forky}
jobs=${TEST_ROOT_JOBS:-2}
timeout_s=${TEST_ROOT_TIMEOUT:-3300}
logdir=${CLUSTER_DIR:-$(mktemp -d)}/roots
mkdir -p "$logdir"

# no sign-off of the example jobs through the real brokers (hooks 80-82):
# the host's run signs them off under hold, retry and skip
signoff="SIGNOFF_POLICIES=none SIGNOFF_SECOND_JOB=0"
job_of() {
    case $1 in
        bookworm) echo "scripts/matrix && TEST_SKIP_HOOKS='@(9*|74-*|8[34]-*|55-*)' $signoff scripts/test" ;;
        trixie) echo "scripts/matrix && TEST_SKIP_HOOKS='@(9[0-2]*|55-*)' MEMORY_CALLS=5000 $signoff scripts/test" ;;
        forky) echo "scripts/matrix && TEST_SKIP_HOOKS='9*' scripts/test regress isolation tap" ;;
        *) return 1 ;;
    esac
}

# the base roots first, one after another (each is cached; a fresh machine
# builds them once), so that the runs below only copy them
for r in $releases; do
    job_of "$r" >/dev/null || { echo "not ok - unknown release '$r' in TEST_RELEASES"; exit 1; }
    "$srcdir/scripts/root" ensure "$r" >/dev/null || { echo "not ok - could not make the $r root"; exit 1; }
done

# Citus on PostgreSQL 17: the Debian 13 root runs hook 93 too, with the
# vendored source (outside the project: without it hook 93 says NOT RUN)
# copied in, and its build kept on the host for the next run
vendor=${CITUS_VENDOR:-$(cd "$srcdir/.." 2>/dev/null && pwd)/shared/vendor}
citus_cache=${CITUS_ROOT_CACHE:-/var/cache/idempotency/citus-roots}
citus_args() {
    [[ $1 == trixie && -f $vendor/citus-13.2.2.tar.gz ]] || return 0
    mkdir -p "$citus_cache/$1"
    printf '%s\0' --in "$vendor:/vendor" --env CITUS_VENDOR=/vendor \
        --out "/var/cache/idempotency/citus:$citus_cache/$1"
    [[ -d $citus_cache/$1/citus ]] && printf '%s\0' --in "$citus_cache/$1/citus:/var/cache/idempotency/citus"
    return 0
}

run_one() {
    local r=$1 start=$SECONDS rc=0 extra=()
    mapfile -d '' -t extra < <(citus_args "$r")
    "$srcdir/scripts/root" run "$r" --tree "$srcdir" --timeout "$timeout_s" "${extra[@]}" -- "$(job_of "$r")" \
        >"$logdir/$r.log" 2>&1 || rc=$?
    echo "$rc $((SECONDS - start))" >"$logdir/$r.rc"
}

for r in $releases; do
    while (($(jobs -rp | wc -l) >= jobs)); do
        wait -n
    done
    echo "== $r: $(job_of "$r") (log $logdir/$r.log)"
    run_one "$r" &
done
wait

passed=0
failed=0
for r in $releases; do
    read -r rc secs <"$logdir/$r.rc" || { rc=1; secs=?; }
    log=$logdir/$r.log
    matrix=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$log" | head -n 1)
    summary=$(grep -E '^summary: ' "$log" | tail -n 1)
    suites=$(grep -E '^== done in ' "$log" | tail -n 1 | sed 's/^== done in [0-9]* s: //')
    failed_hooks=$(grep -E '^== failed hooks: ' "$log" | tail -n 1 | sed 's/^== //')
    hook_times=$(grep -E "^== hooks' times: " "$log" | tail -n 1 | sed 's/^== //')
    # the job's own exit status, and both commands' own verdict lines
    if ((rc == 0)) && grep -q '^== scripts/matrix: idempotency-matrix exited 0$' "$log" &&
        [[ $summary =~ ^summary:\ [1-9][0-9]*\ passed,\ 0\ failed$ ]]; then
        echo "ok - $r: matrix $matrix; scripts/test $suites; $secs s${hook_times:+ ($hook_times)}"
        passed=$((passed + 1))
    else
        echo "not ok - $r: exit $rc after $secs s (matrix: ${matrix:-none}; ${summary:-no summary}${failed_hooks:+; $failed_hooks}); last 150 lines of $log:"
        tail -n 150 "$log" | sed 's/^/    /'
        failed=$((failed + 1))
    fi
done
echo "versions: $passed passed, $failed failed"
((failed == 0 && passed > 0))
