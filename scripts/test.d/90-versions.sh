#!/usr/bin/env bash
# scripts/test: background
# Every supported Debian release and PostgreSQL major, each in a clean root
# (scripts/root: debootstrap minbase + postgresql-N + git + make, nothing
# else), running the README's two commands exactly as a user types them:
#
#   bookworm  Debian 12, PostgreSQL 15   scripts/matrix; scripts/test
#                                        regress isolation tap, and hooks
#                                        50-54 (see below)
#   trixie    Debian 13, PostgreSQL 17   scripts/matrix; scripts/test (whole,
#                                        with hook 93: Citus 14.0 built for
#                                        17, and hook 86: the portable
#                                        edition through pg_tle 1.5.2 built
#                                        for 17; but hooks 55, 60, 84, 85,
#                                        88 and 89: see below)
#   forky     Debian testing, 18         scripts/matrix; scripts/test regress
#                                        isolation tap, hook 93: Citus
#                                        14.0 built for 18, and hooks 87 and
#                                        88: the portable edition's plain
#                                        script (no pg_tle for 18) moved to
#                                        and from the C edition, and the
#                                        replay matrix on it
#
# Each command installs what it needs itself (compiler, headers, test tools):
# that is what this proves. Inside a root the hooks 90-92 (clean roots,
# packages, pg_upgrade) are left out: no root inside a root. Hook 93 (Citus)
# runs in the Debian 13 and testing roots, on Citus 14.0.1 (scripts/citus:
# Citus 13.2 stops at 17, 14.0 drops 15); the host's run covers 15 on Citus
# 13.2.2, so the Debian 12 root leaves it out. The vendored source is copied
# in (CITUS_VENDOR, default ../shared/vendor beside the checkout) and the
# build is kept in $CITUS_ROOT_CACHE/RELEASE (default
# /var/cache/idempotency/citus-roots) for the next run. Measured: Citus
# 14.0.1 built cold in a root in 161 s (18, one root, little else running:
# configure 14 s, make 140 s) to 330-350 s (17 and 18, two roots at once
# beside the end of a whole run); Citus 13.2.2 for 17 took 165 s in the
# whole run on 9914fc3; from the cache, seconds. Hook 93 on Citus 14.0:
# 400-561 s in Debian 13, 324-561 s in testing (616 s on 13.2.2 in Debian
# 13 in the whole run on 9914fc3, its Citus build included). In both roots
# the memory test (test/citus/memory.sh) makes 5 000 calls per scenario,
# not 20 000: the growth it guards against was 35-76 kB per call on Citus
# 13.2 and is 20 kB per call on 14.0 (100 MB or more in 5 000 calls against
# a limit of 4 MiB), the host's run keeps the long one, and it saves about
# 3 minutes of each root's critical path.
# Time: the roots run two at a time in the order of TEST_RELEASES, testing
# after Debian 12; hooks 91 and 92 run beside them (scripts/test: lane 2).
# Debian 13 is the longest chain (its whole suite with hook 93: 2855-3247 s
# in whole runs beside the other roots), so the Debian 12 root runs only
# what the host's own run cannot prove: both README commands from a bare
# root (no compiler, no headers, no test tools), the main job and the suites
# regress, isolation and TAP, and hooks 50-54 (the matrix, the main command,
# the docs, the catalog, the test command). The host's run is the whole
# suite on Debian 12 and PostgreSQL 15; CI runs it on a fresh Debian 12
# machine. Until 0.3 this root ran the whole suite but hooks 55, 74, 83 and
# 84 (2087 s); with it, and 91 and 92 waiting for 90, the background chain
# took 3780 s of a 3872 s run on a fresh machine (stop 25's CI). Debian 13
# runs hooks 80-82 with reduced sign-offs: the seed's cases 1-7 only
# (SIGNOFF_CASES=1-7: the runner's 9-13 and the second jobs are the host's)
# under hold, retry and skip, through each real broker, beside the
# end-to-end scenarios (SQS: the modes single, sigterm and signoff; the
# batch handler's are the host's: claim_operations on 17 is regress's).
# Neither Debian 13 nor testing runs hook 55 (the release tarball): the
# host does. Debian 13 leaves out hooks 60 (the benchmarks' smoke run: 417
# s on the host, and the pgbench scripts are the same SQL on every major),
# 84 (the sign-off run's own tests: 703 s there in the background, and what
# they test is the runner's) and 85 (the helpers' catalogue of broken jobs
# through the runner: 557 s on the host, and what it judges is the runner's
# and the helpers', not the server's). With 60 and 85 that root ran out of
# its 3300 s in hook 93, its last, in stop 37's CI (3329-3340 s, CI and
# here); without them, but with 84 and every SQS mode, it still did in the
# next CI (3339 s; 3136 s here). The extension's own behaviour on 17 stays
# covered there by the suites, the matrix, the faults (74), and the brokers
# (80-82) with the runner's sign-offs through them.
#
# Settings: TEST_RELEASES (default "bookworm trixie forky"), TEST_ROOT_JOBS
# (roots run at once, default 2; the machine has 2 cores and most of a run
# is apt and waiting), TEST_ROOT_TIMEOUT (seconds per root, default 3300).
# Needs root (debootstrap, mount, chroot); as another user it says so and
# exits 0. Logs: $CLUSTER_DIR/roots/RELEASE.log (on a failure, each failed
# hook's own part of it is printed, then its tail).
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

# the example jobs signed off through the real brokers (hooks 80-82) on
# the seed's cases only, no second job: the host's run signs them off whole
signoff="SIGNOFF_CASES=1-7 SIGNOFF_SECOND_JOB=0"
job_of() {
    case $1 in
        bookworm) echo "scripts/matrix && TEST_HOOKS='5[0-4]-*' scripts/test" ;;
        trixie) echo "scripts/matrix && TEST_SKIP_HOOKS='@(9[0-2]*|55-*|60-*|8[4589]-*)' SQS_E2E_MODES='single sigterm signoff' MEMORY_CALLS=5000 $signoff scripts/test" ;;
        forky) echo "scripts/matrix && TEST_SKIP_HOOKS='!(@(8[78]|93)-*)' MEMORY_CALLS=5000 scripts/test" ;;
        *) return 1 ;;
    esac
}

# the base roots first, one after another (each is cached; a fresh machine
# builds them once), so that the runs below only copy them
for r in $releases; do
    job_of "$r" >/dev/null || { echo "not ok - unknown release '$r' in TEST_RELEASES"; exit 1; }
    "$srcdir/scripts/root" ensure "$r" >/dev/null || { echo "not ok - could not make the $r root"; exit 1; }
done

# Citus 14.0 on PostgreSQL 17 and 18: the Debian 13 and testing roots run
# hook 93 too, with the vendored source (outside the project: without it
# hook 93 says NOT RUN) copied in, and their builds kept on the host for the
# next run
vendor=${CITUS_VENDOR:-$(cd "$srcdir/.." 2>/dev/null && pwd)/shared/vendor}
citus_cache=${CITUS_ROOT_CACHE:-/var/cache/idempotency/citus-roots}
citus_args() {
    [[ ($1 == trixie || $1 == forky) && -f $vendor/citus-14.0.1.tar.gz ]] || return 0
    mkdir -p "$citus_cache/$1"
    printf '%s\0' --in "$vendor:/vendor" --env CITUS_VENDOR=/vendor \
        --out "/var/cache/idempotency/citus:$citus_cache/$1"
    [[ -d $citus_cache/$1/citus ]] && printf '%s\0' --in "$citus_cache/$1/citus:/var/cache/idempotency/citus"
    return 0
}

# pg_tle 1.5.2 on PostgreSQL 17: the Debian 13 root runs hook 86 (the
# portable edition through pg_tle, test/portable/run.sh) with the vendored
# tarball copied in; its build (scripts/pgtle) is kept on the host in
# $PGTLE_ROOT_CACHE/RELEASE for the next run. pg_tle 1.5.2 stops at 17 (the
# testing root's 18 has no pg_tle); the Debian 12 root leaves hook 86 to the
# host's run. Hooks 88 and 89 (the replay matrix, and the helpers' suites
# and a sign-off, on the portable edition: about one and two minutes) run
# on the host, and 88 in the testing root, not in the Debian 13 root, whose
# chain is the longest (hook 86 covers the edition on 17 there).
pgtle_cache=${PGTLE_ROOT_CACHE:-/var/cache/idempotency/pgtle-roots}
pgtle_args() {
    local tarball=${PGTLE_VENDOR:-$vendor}/pg_tle-1.5.2.tar.gz
    [[ $1 == trixie && -f $tarball ]] || return 0
    mkdir -p "$pgtle_cache/$1"
    printf '%s\0' --in "$tarball:/vendor-pgtle/pg_tle-1.5.2.tar.gz" --env PGTLE_VENDOR=/vendor-pgtle \
        --out "/var/cache/idempotency/pgtle:$pgtle_cache/$1"
    [[ -d $pgtle_cache/$1/pgtle ]] && printf '%s\0' --in "$pgtle_cache/$1/pgtle:/var/cache/idempotency/pgtle"
    return 0
}

run_one() {
    local r=$1 start=$SECONDS rc=0 extra=() tle=()
    mapfile -d '' -t extra < <(citus_args "$r")
    mapfile -d '' -t tle < <(pgtle_args "$r")
    extra+=("${tle[@]}")
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

# hook NAME's part of a root's scripts/test output: from its "== hook"
# line to the next hook's, or to the summary lines
hook_output() {
    awk -v name="$1" '
        /^== hook / { on = index($0, "/" name ".sh") > 0 }
        /^== (hooks'"'"' times|failed hooks|done in)/ { on = 0 }
        on'
}

passed=0
failed=0
for r in $releases; do
    read -r rc secs <"$logdir/$r.rc" || { rc=1; secs='?'; }
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
        echo "not ok - $r: exit $rc after $secs s (matrix: ${matrix:-none}; ${summary:-no summary}${failed_hooks:+; $failed_hooks})"
        # right under it, what failed: each failed hook's failing lines (a
        # case marked ✗, a Diagnosis, a "not ok" or FAILED line), which a
        # reader of a shortened CI log must see first; then the first lines
        # scripts/test's summary repeats (a compiler's error, a failed test)
        for name in ${failed_hooks#failed hooks: }; do
            hook_output "$name" <"$log" |
                grep -E -m 12 '✗|✖|Diagnosis:|FAILED|^ *not ok|WRONG' | cut -c1-300 | sed "s/^ */    $name: /"
        done
        grep -E -m 4 '(^|[ :])error:|^ *not ok' "$log" | cut -c1-300 | sed 's/^ */    /'
        # each failed hook's own output (the log's tail is mostly the
        # background hooks' output), then the tail
        for name in ${failed_hooks#failed hooks: }; do
            echo "  the output of hook $name in the $r root (its last 150 lines):"
            hook_output "$name" <"$log" | tail -n 150 | sed 's/^/    /'
        done
        echo "  last 60 lines of $log:"
        tail -n 60 "$log" | sed 's/^/    /'
        failed=$((failed + 1))
    fi
done
echo "versions: $passed passed, $failed failed"
((failed == 0 && passed > 0))
