#!/usr/bin/env bash
# test/matrix/run.sh: the replay matrix and its report, tested end to end.
#
#   PGHOST=... PGPORT=... PGUSER=... [PGDATABASE=...] test/matrix/run.sh [RUNNER-ARGS...]
#
# Needs a running server with the idempotency extension installed (make
# install), reached as a superuser (PGUSER): the test creates the extension
# in the database if it is not there, and a role of its own,
# idempotency_matrix_test_runner, that it drops at the end. Steps:
#   1. build matrix/idempotency-matrix if it is missing or stale (make -C matrix);
#   2. run the full matrix (all policies, cases 1-13) with --html and --json,
#      through --dsn, as that role: a non-superuser with exactly the
#      privileges the README lists. It must exit 0 and every case must hold.
#      The output must have the banner, each policy's header, the policy
#      summary rows (RUNNER-ARGS given: not checked), no escape sequences
#      (piped: no colour), and on stderr only progress lines;
#   3. the run cleaned up after itself: no job type, record or table with
#      its prefix is left, and its mail directory is gone; the reference
#      job's own checks reached the engine (notes of cases 2, 3s, 8); no
#      two of the runner's files call each other (make -C matrix
#      check-layout); the case tables of docs/replay-matrix.md and
#      docs/signoff.md are what --list-cases prints;
#   4. the runner's own check: hold checked against retry's expectations
#      must fail (exit 1) in exactly the cells where the policies differ,
#      shown with the failure mark and "observed ≠ expected"; the JSON
#      report records the --cases selection;
#   5. colour only on a terminal: --color=always, and a terminal (script(1)),
#      give escape sequences; NO_COLOR, TERM=dumb and --color=never do not;
#   6. each progress line is written with one write() (stderr is a
#      SOCK_SEQPACKET socket, which keeps write boundaries), so a log that
#      merges stdout and stderr cannot tear it;
#   7. interrupted by SIGINT, and by SIGTERM, at a progress line (the run
#      waits for a lease, with a record, a job type, case 8's table and its
#      mail directory in place): it exits 130 and leaves nothing behind;
#   8. the browser test (test/matrix/browser-test.mjs, Debian's headless
#      chromium, no npm packages) on the HTML report: it renders, and
#      ArrowRight scrolls the focused matrix in a narrow window.
# The last line is the total: "matrix: N passed, N failed". Exits non-zero
# on any failure. The reports, logs, screenshots and the PDF are kept in
# $MATRIX_OUT if set, else in a temporary directory that is removed on
# success and kept (and named) on failure.
#
# Needs: Node.js 18 or later (the `node` on PATH, else Debian's /usr/bin/node)
# and Chromium (Debian's) for the browser test, script(1) (bsdutils) for the
# terminal test. What is missing is installed with apt-get as root:
# `nodejs` and `chromium fonts-liberation`, without recommends (on a clean
# Debian 12 Chromium's recommends add ~135 packages of a desktop: systemd,
# udev, upower, Mesa, a printer dialog; headless it needs none of them, and
# fonts-liberation is its one recommended font). Not root: the exact
# `sudo apt-get install` line, exit 2.
# Environment: MATRIX_OUT, CHROMIUM (default /usr/bin/chromium; if set, it is
# never installed), MATRIX_INSTALL=0 (or the older MATRIX_INSTALL_CHROMIUM=0)
# to never apt-get install anything.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
runner=$root/matrix/idempotency-matrix
chromium=${CHROMIUM:-/usr/bin/chromium}
role=idempotency_matrix_test_runner
psql=(psql -X -q -At -v ON_ERROR_STOP=1)
[[ -n ${PG_BINDIR:-} && -x $PG_BINDIR/psql ]] && psql[0]=$PG_BINDIR/psql

die() { echo "test/matrix/run.sh: error: $*" >&2; exit 2; }

command -v script >/dev/null || die "script(1) is not installed (bsdutils; the terminal colour test needs it)"

# what the browser test needs: node >= 18 and chromium
node_major() { "$1" -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0; }
find_node() {   # the first node >= 18: PATH's, then Debian's
    local n
    for n in "$(command -v node 2>/dev/null)" /usr/bin/node; do
        [[ -n $n && -x $n ]] && (($(node_major "$n") >= 18)) && { echo "$n"; return 0; }
    done
    return 1
}
node=$(find_node) || node=
need=()
[[ -n $node ]] || need+=(nodejs)
if [[ ! -x $chromium ]]; then
    [[ -z ${CHROMIUM:-} ]] || die "CHROMIUM=$chromium is not an executable"
    need+=(chromium fonts-liberation)
fi
if ((${#need[@]})); then
    if ((EUID != 0)) || [[ ${MATRIX_INSTALL:-1} == 0 || ${MATRIX_INSTALL_CHROMIUM:-1} == 0 ]]; then
        die "the browser test needs Node.js 18+ and Chromium; install them with: sudo apt-get install -y --no-install-recommends ${need[*]}"
    fi
    echo "== installing ${need[*]} (Debian packages, no recommends) for the browser test"
    apt_start=$SECONDS
    apt_opts=(-o DPkg::Lock::Timeout=600 -o Dpkg::Use-Pty=0)
    export DEBIAN_FRONTEND=noninteractive
    # a stale package index: update once and retry
    apt-get "${apt_opts[@]}" install -y -q --no-install-recommends "${need[@]}" >/dev/null ||
        { apt-get "${apt_opts[@]}" update -qq &&
          apt-get "${apt_opts[@]}" install -y -q --no-install-recommends "${need[@]}" >/dev/null; } ||
        die "apt-get install ${need[*]} failed"
    echo "== installed ${need[*]} in $((SECONDS - apt_start)) s"
    hash -r
    node=$(find_node) || die "nodejs installed, but no node 18 or later found (PATH's: $(command -v node || echo none))"
    [[ -x $chromium ]] || die "chromium installed, but $chromium is not there"
fi

echo "== build"
make --no-print-directory -C "$root/matrix" >/dev/null || die "make -C matrix failed"

if [[ -n ${MATRIX_OUT:-} ]]; then
    out=$MATRIX_OUT
    mkdir -p "$out" || die "cannot create $out"
    keep=1
else
    out=$(mktemp -d "${TMPDIR:-/tmp}/idempotency-matrix-test.XXXXXX") || die "mktemp failed"
    keep=0
fi
# the runner's TMPDIR (its mail directories): nothing else writes here
runtmp=$out/tmp
mkdir -p "$runtmp" || die "cannot create $runtmp"

passed=0
failed=0
bad=0
ok() { echo "ok - $*"; passed=$((passed + 1)); }
not_ok() {   # not_ok LOG|"" TEXT: the failure, with the log that explains it
    local log=$1; shift
    echo "not ok - $*"
    [[ -n $log && -f $log ]] && sed 's/^/    /' "$log"
    failed=$((failed + 1))
    bad=1
}
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
has_esc() { grep -q $'\033' "$1"; }

# ---------------------------------------------------------------------
# the database and the role the runner connects as
# ---------------------------------------------------------------------
[[ $("${psql[@]}" -c 'SELECT rolsuper FROM pg_roles WHERE rolname = current_user' 2>&1) == t ]] ||
    die "connect as a superuser (PGUSER): the test creates the extension and the role $role"
db=$("${psql[@]}" -c 'SELECT current_database()') || die "cannot connect (PGHOST, PGPORT, PGUSER, PGDATABASE)"
drop_role() {
    "${psql[@]}" -c "DO \$\$BEGIN
        IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '$role') THEN
            EXECUTE 'DROP OWNED BY $role'; EXECUTE 'DROP ROLE $role';
        END IF; END\$\$" >/dev/null
}
trap drop_role EXIT
drop_role || die "cannot drop an old role $role"
# exactly the privileges the README ("Running it against your own
# database") and --help list; the runner's current schema is public
"${psql[@]}" >"$out/role.log" 2>&1 <<SQL || { cat "$out/role.log"; die "cannot create the role $role"; }
CREATE EXTENSION IF NOT EXISTS idempotency;
CREATE ROLE $role LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE;
GRANT USAGE ON SCHEMA idempotency TO $role;
GRANT EXECUTE ON FUNCTION
    idempotency.claim_operation(text, text, text, text, text, boolean),
    idempotency.complete_operation(text, text, integer, jsonb),
    idempotency.release_operation(text, text, integer),
    idempotency.extend_lease(text, text, integer),
    idempotency.stale_claims(text),
    idempotency.edition()          -- 0.5: which edition and version answer
  TO $role;
GRANT SELECT, INSERT, DELETE ON idempotency.job_types TO $role;
GRANT SELECT, DELETE ON idempotency.operations TO $role;
GRANT CREATE ON SCHEMA public TO $role;
SQL
# libpq takes host and port from PGHOST/PGPORT; the DSN names the role and the database
dsn="user=$role dbname='${db//\'/\\\'}'"

# what a run with job type prefix $1 and mail directory $2 left behind: "" if nothing
leftovers() {
    local prefix=$1 maildir=$2 q
    q=$("${psql[@]}" -v p="${prefix}_" <<'SQL'
SELECT concat_ws(', ',
    nullif((SELECT count(*) FROM idempotency.job_types
            WHERE left(job_type, length(:'p')) = :'p') || ' job types', '0 job types'),
    nullif((SELECT count(*) FROM idempotency.operations
            WHERE left(job_type, length(:'p')) = :'p') || ' records', '0 records'),
    (SELECT 'table ' || string_agg(c.oid::regclass::text, ' ') FROM pg_class c
      WHERE left(c.relname, length(:'p')) = :'p'))
SQL
    ) || q="cannot query the database"
    [[ -e $maildir ]] && q+="${q:+, }the mail directory $maildir"
    printf '%s' "$q"
}
banner_prefix() { sed -n 's/^job types \(idempotency_matrix_[0-9a-z]*\)_<policy>_<case>, mailboxes in .*/\1/p' "$1" | head -n 1; }
banner_maildir() { sed -n 's/^job types idempotency_matrix_[0-9a-z]*_<policy>_<case>, mailboxes in \(.*\): removed at the end$/\1/p' "$1" | head -n 1; }

# ---------------------------------------------------------------------
# 2. the full matrix, through --dsn, as the non-superuser role
# ---------------------------------------------------------------------
echo "== the full matrix (idempotency-matrix --dsn \"$dsn\" --html --json $*)"
start=$(date +%s)
TMPDIR=$runtmp LC_ALL=C.UTF-8 "$runner" --dsn "$dsn" --html "$out/matrix.html" --json "$out/matrix.json" "$@" \
    2>"$out/matrix.err" | tee "$out/matrix.txt"
rc=${PIPESTATUS[0]}
echo "== the matrix took $(( $(date +%s) - start )) s and exited $rc"
count "$out/matrix.txt"
((rc == 0)) || bad=1
[[ -s $out/matrix.html && -s $out/matrix.json ]] || not_ok "" "the runner wrote no HTML/JSON report"

txt=$out/matrix.txt
prefix=$(banner_prefix "$txt")
maildir=$(banner_maildir "$txt")
npol=$(grep -cE '^Policy (hold|retry|skip|lookup): ' "$txt")
server_major=$("${psql[@]}" -c "SELECT current_setting('server_version_num')::int / 10000")
if grep -qE "^Replay matrix: send_confirmation for ORD-1001, idempotency [0-9.]+ \((c|portable) edition\) on PostgreSQL $server_major\." "$txt" &&
    grep -qE "^server (socket )?[^ ]+ port [0-9]+, database $db, user $role; lease [0-9.]+ seconds?; stress [0-9]+ workers; [0-9]{4}-" "$txt" &&
    [[ -n $prefix && $maildir == "$runtmp"/idempotency-matrix.* ]]; then
    ok "the banner: versions, server (as $role), lease, the job type prefix $prefix and the mail directory"
else
    not_ok "" "the banner lines are missing or wrong (prefix '$prefix', mail directory '$maildir'):"
    head -n 4 "$txt" | sed 's/^/    /'
fi
if ((npol > 0)) &&
    (($(grep -cE '^ +case +attempt +observed +expected$' "$txt") == npol)) &&
    (($(grep -cE '^ +emails +record afterwards +verdicts$' "$txt") == npol)) &&
    (($(grep -cE "^job types ${prefix}_(hold|retry|skip|lookup)_<case>, lease [0-9.]+ seconds?, [0-9]+ of [0-9]+ cases hold, " "$txt") == npol)); then
    ok "each of the $npol policy tables has its header (case, attempt, observed: emails, record afterwards, verdicts; expected)"
else
    not_ok "" "a policy table lacks its header lines (case attempt observed expected / emails record afterwards verdicts)"
fi
if (($# == 0)); then
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
if has_esc "$txt"; then
    not_ok "" "piped output has escape sequences (colour only on a terminal)"
else
    ok "piped output has no escape sequences"
fi
total=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$txt" | tail -n 1)
# a case run again (a try that tested nothing: 7a, 7b, 12 on a stalled
# machine) has a second line, "... (try N: why)": one line per case besides
nprog=$(grep -E '^\.\.\. \[[0-9]+/[0-9]+\] policy (hold|retry|skip|lookup), case [0-9a-z]+: ' "$out/matrix.err" |
    grep -cvE ' \(try [0-9]+: [^()]+\)$')
if grep -qvE '^\.\.\. ' "$out/matrix.err"; then
    not_ok "$out/matrix.err" "stderr has more than progress lines (an error, e.g. of the cleanup):"
elif [[ -n $total ]] && ((nprog == $(cut -d' ' -f1 <<<"$total") + $(cut -d' ' -f3 <<<"$total"))); then
    ok "stderr: one progress line per case ($nprog), '[n/N] policy P, case C: ...', and nothing else"
else
    not_ok "$out/matrix.err" "expected one '[n/N] policy P, case C' progress line per case, got $nprog for '$total'"
fi

# 3. it cleaned up
if [[ -z $prefix ]]; then
    not_ok "" "no job type prefix in the banner: cannot check the cleanup"
else
    left=$(leftovers "$prefix" "$maildir")
    if [[ -z $left ]] && [[ -z $(ls -A "$runtmp") ]]; then
        ok "after the --dsn run nothing of $prefix is left: no job types, records, effects table or mail directory"
    else
        not_ok "" "the run left behind: ${left:-files in $runtmp: $(ls -A "$runtmp")}"
    fi
fi

# 3b. one engine: what only the reference job's worker offers reached the
# engine and was checked there (notes of the JSON report)
if (($# == 0)); then
    if /usr/bin/python3 - "$out/matrix.json" >"$out/notes.check" 2>&1 <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for p in r["policies"]:
    notes = {c["case"]: "\n".join(c["notes"]) for c in p["cases"]}
    assert "The redelivery got the stored result back: {" in notes["2"], (p["policy"], notes["2"])
    assert "16 workers; while pid " in notes["3s"], (p["policy"], notes["3s"])
    assert "Its server process (pid " in notes["8"] and "left the transaction" in notes["8"], (p["policy"], notes["8"])
    assert '"none" and 0 effect rows existed' in notes["8"], (p["policy"], notes["8"])
PY
    then
        ok "one engine: case 2 compared the stored result, 3s ran 16 workers, case 8 waited for the killed worker's server process, under every policy"
    else
        not_ok "$out/notes.check" "the notes of cases 2, 3s and 8 do not show the engine's checks"
    fi
fi

# 3c. the layout: no two of the runner's files call each other
if make --no-print-directory -s -C "$root/matrix" check-layout >"$out/layout.log" 2>&1; then
    ok "matrix/: $(sed -n 's/^check-layout: //p' "$out/layout.log")"
else
    not_ok "$out/layout.log" "matrix/check-layout.sh: the runner's files call each other in a loop"
fi

# 3c'. the reference job's commands refuse what they cannot use: exit 2, one sentence
refusals_ok=1
for args in "--reference-job=worker" "--reference-job=send --reference-dir=$runtmp KEY" \
            "--reference-job=enqueue --reference-dir=$runtmp" "--list-cases=everything"; do
    # shellcheck disable=SC2086 # the words are the arguments
    "$runner" $args >"$out/refusal.log" 2>&1
    rc=$?
    if ((rc != 2)) || [[ $(wc -l <"$out/refusal.log") -ne 1 ]]; then
        refusals_ok=0
        echo "    $args: exit $rc: $(cat "$out/refusal.log")"
    fi
done
if ((refusals_ok)); then
    ok "--reference-job without a directory, with an unknown command or without a key, and --list-cases=everything: exit 2, one sentence each"
else
    not_ok "" "a refused --reference-job or --list-cases did not exit 2 with one sentence"
fi

# 3d. the case tables of the docs are the runner's case table
docs_ok=1
for what in proves policies steps; do
    case $what in steps) doc=$root/docs/signoff.md ;; *) doc=$root/docs/replay-matrix.md ;; esac
    "$runner" --list-cases="$what" >"$out/cases-$what.md" 2>&1 || docs_ok=0
    sed -n "/^<!-- generated by idempotency-matrix --list-cases=$what;/,/^<!-- end of --list-cases=$what -->/p" "$doc" |
        sed '1d;$d' >"$out/doc-$what.md"
    if ! cmp -s "$out/cases-$what.md" "$out/doc-$what.md"; then
        docs_ok=0
        diff -u "$out/doc-$what.md" "$out/cases-$what.md" >>"$out/docs-cases.diff"
    fi
done
if ((docs_ok)); then
    ok "docs/replay-matrix.md and docs/signoff.md hold the case table as --list-cases=proves, policies and steps print it"
else
    not_ok "$out/docs-cases.diff" "a case table in the docs differs from the runner's (regenerate with --list-cases):"
fi

# ---------------------------------------------------------------------
# 4. the runner's own check: failing cells are shown as failing
# ---------------------------------------------------------------------
echo "== the runner's own check: policy hold checked against retry's expectations must fail"
check=$out/check-as.txt
TMPDIR=$runtmp LC_ALL=C.UTF-8 "$runner" --dsn "$dsn" --quiet --color=never --policy hold --check-as retry \
    --cases 5,6,9 --lease 1 --json "$out/check-as.json" >"$check" 2>&1
rc=$?
if ((rc == 1)) && grep -qx '0 passed, 3 failed' "$check"; then
    ok "the mismatching cases 5, 6 and 9 fail, exit status 1"
else
    not_ok "$check" "expected exit 1 and '0 passed, 3 failed'; got exit $rc:"
fi
# the rows: the mark, and "observed ≠ expected" in every cell that differs
if grep -qE '^Policy hold: .*  \[checked against retry'"'"'s expectations\]$' "$check" &&
    grep -qE '^✗  5 +worker dies after the claim, before the email +0 ≠ 1 +claimed #1 \(stale\) ≠ completed #2 +run \(killed\), held ≠ run \(killed\), run +sent after the lease by a takeover$' "$check" &&
    grep -qE '^✗  6 +worker dies after the email, before completed +1 ≠ 2 +claimed #1 \(stale\) ≠ completed #2 +run \(killed\), held ≠ run \(killed\), run +' "$check" &&
    grep -qE '^✗  9 +slow worker completes after a redelivery +1 ≠ 2 +completed #1 ≠ completed #2 +run \(slow\), held, late completion ok ≠ run \(slow\), run, late completion ID003 +' "$check" &&
    grep -qx '  case 5 (hold):' "$check" &&
    grep -qx '    expected: emails 1; record completed #2; verdicts run (killed), run' "$check" &&
    ! grep -q '^✓' "$check"; then
    ok "failing rows are marked ✗, each differing cell shows 'observed ≠ expected', and the notes say what was expected"
else
    not_ok "$check" "the failing rows do not show the ✗ mark and 'observed ≠ expected' cells as expected:"
fi
if grep -qE '^hold +0 +1 +1 and 2 +✗$' "$check"; then
    ok "the policy summary marks hold's 0 and 1 emails against retry's 1 and 2 with ✗"
else
    not_ok "" "the policy summary row 'hold 0 1 1 and 2 ✗' is missing"
fi
if grep -qF '"cases": "5,6,9"' "$out/check-as.json" 2>/dev/null &&
    grep -qF '"check_as": "every policy checked against the expectations of retry (--check-as)"' "$out/check-as.json"; then
    ok "the report's settings record --cases 5,6,9 and --check-as retry"
else
    not_ok "" "the JSON settings do not record --cases 5,6,9 and --check-as: $(grep -E '"(cases|check_as)"' "$out/check-as.json" 2>&1)"
fi
prefix=$(banner_prefix "$check")
left=$([[ -n $prefix ]] && leftovers "$prefix" "$(banner_maildir "$check")")
[[ -n $prefix && -z $left ]] || not_ok "" "the --check-as run left behind: ${left:-(no prefix in its banner)}"

# without a UTF-8 locale the marks and the "≠" fall back to ASCII
ascii=$out/check-as-ascii.txt
TMPDIR=$runtmp LC_ALL=C "$runner" --dsn "$dsn" --quiet --color=never --policy hold --check-as retry \
    --cases 1,5 --stress 0 --lease 1 >"$ascii" 2>&1
rc=$?
if ((rc == 1)) && grep -qx '1 passed, 1 failed' "$ascii" &&
    grep -qE '^ok +1 +first delivery ' "$ascii" &&
    grep -qE '^FAIL +5 +worker dies after the claim, before the email +0 != 1 +claimed #1 \(stale\) != completed #2 ' "$ascii" &&
    ! LC_ALL=C grep -q '[^ -~]' "$ascii"; then
    ok "in the C locale the output is plain ASCII: 'ok', 'FAIL' and 'observed != expected'"
else
    not_ok "$ascii" "expected exit 1, 'ok'/'FAIL' marks, ' != ' cells and only ASCII in the C locale; got exit $rc:"
fi
prefix=$(banner_prefix "$ascii")
left=$([[ -n $prefix ]] && leftovers "$prefix" "$(banner_maildir "$ascii")")
[[ -n $prefix && -z $left ]] || not_ok "" "the C-locale run left behind: ${left:-(no prefix in its banner)}"

# ---------------------------------------------------------------------
# 5. colour only on a terminal
# ---------------------------------------------------------------------
echo "== colour"
small=(--dsn "$dsn" --quiet --policy hold --cases 1 --stress 0)
# on_tty OUTFILE [VAR=VALUE...] -- ARGS: the runner with a terminal as stdout (script(1))
on_tty() {
    local outf=$1; shift
    local envs=() cmd
    while [[ $1 != -- ]]; do envs+=("$1"); shift; done
    shift
    cmd=$(printf '%q ' "$runner" "$@")
    env TMPDIR="$runtmp" LC_ALL=C.UTF-8 TERM=xterm SHELL=/bin/bash "${envs[@]}" \
        script -qec "$cmd" /dev/null >"$outf" 2>&1 </dev/null
}
TMPDIR=$runtmp "$runner" "${small[@]}" --color=always >"$out/color-always.txt" 2>&1
rc=$?
if ((rc == 0)) && has_esc "$out/color-always.txt"; then
    ok "--color=always colours piped output"
else
    not_ok "$out/color-always.txt" "--color=always: expected escape sequences and exit 0 (exit $rc)"
fi
on_tty "$out/color-tty.txt" -- "${small[@]}"
rc=$?
if ((rc == 0)) && grep -q '1 passed, 0 failed' "$out/color-tty.txt" && has_esc "$out/color-tty.txt"; then
    ok "on a terminal the output is coloured"
else
    not_ok "$out/color-tty.txt" "on a terminal (script -qec): expected escape sequences and '1 passed, 0 failed' (exit $rc)"
fi
for variant in NO_COLOR=1 TERM=dumb --color=never; do
    f=$out/color-tty-${variant//[^a-zA-Z]/_}.txt
    if [[ $variant == --* ]]; then
        on_tty "$f" -- "${small[@]}" "$variant"
    else
        on_tty "$f" "$variant" -- "${small[@]}"
    fi
    rc=$?
    if ((rc == 0)) && grep -q '1 passed, 0 failed' "$f" && ! has_esc "$f"; then
        ok "on a terminal with $variant: no escape sequences"
    else
        not_ok "$f" "on a terminal with $variant: expected no escape sequences and '1 passed, 0 failed' (exit $rc)"
    fi
done

# ---------------------------------------------------------------------
# 6. a progress line is one write()
# ---------------------------------------------------------------------
echo "== progress lines"
TMPDIR=$runtmp perl -MSocket -e '
    socketpair(my $r, my $w, AF_UNIX, SOCK_SEQPACKET, 0) or die "socketpair: $!\n";
    my $pid = fork() // die "fork: $!\n";
    if ($pid == 0) {
        close $r;
        open(STDERR, ">&", $w) or die "dup: $!\n";
        close $w;
        open(STDOUT, ">", "/dev/null") or die;
        exec(@ARGV) or die "exec: $!\n";
    }
    close $w;
    my ($n, $torn) = (0, 0);
    while (1) {
        my $got = sysread($r, my $buf, 65536);
        last unless $got;
        $n++;
        if ($buf !~ /\A\.\.\. [^\n]+\n\z/) { $torn++; printf "write %d: %s\n", $n, quotemeta($buf); }
    }
    waitpid($pid, 0);
    printf "%d writes to stderr, %d not a whole progress line; exit %d\n", $n, $torn, $? >> 8;
    exit(($torn == 0 && $n >= 3 && $? == 0) ? 0 : 1);' \
    "$runner" --dsn "$dsn" --policy hold --cases 1,2,5 --stress 0 --lease 1 >"$out/progress.txt" 2>&1
rc=$?
if ((rc == 0)); then
    ok "each progress line is a single write(): $(tail -n 1 "$out/progress.txt")"
else
    not_ok "$out/progress.txt" "progress lines are written in pieces (a merged log tears them):"
fi

# ---------------------------------------------------------------------
# 7. interrupted mid-run, it still cleans up
# ---------------------------------------------------------------------
interrupted() {   # interrupted SIG
    local sig=$1 base=$out/interrupt-$1 line pid rc sent=0 before="" p="" m="" left
    rm -f "$base.fifo"
    if ! mkfifo "$base.fifo"; then not_ok "" "mkfifo failed"; return; fi
    TMPDIR=$runtmp LC_ALL=C.UTF-8 "$runner" --dsn "$dsn" --color=never --policy hold --cases 1,5,8 \
        >"$base.out" 2>"$base.fifo" &
    pid=$!
    # synchronised on the runner's own progress line, not on a sleep: case
    # 5's worker was killed after its claim, and the run waits for its lease
    while IFS= read -r line; do
        printf '%s\n' "$line" >>"$base.err"
        if ((sent == 0)) && [[ $line == '... hold case 5: waiting for the lease'* ]]; then
            p=$(banner_prefix "$base.out")
            m=$(banner_maildir "$base.out")
            [[ -n $p ]] && before=$(leftovers "$p" "$m")
            kill -s "$sig" "$pid"
            sent=1
        fi
    done <"$base.fifo"
    wait "$pid"
    rc=$?
    left=$([[ -n $p ]] && leftovers "$p" "$m")
    if ((sent == 1 && rc == 130)) && grep -qx 'idempotency-matrix: interrupted; cleaning up' "$base.err" &&
        [[ $before == "2 job types, 2 records, table "*"${p}_effects"*", the mail directory $m" && -n $p && -z $left ]]; then
        ok "SIG$sig while waiting for a lease: exit 130; what was there ($before) is gone"
    else
        not_ok "$base.err" "SIG$sig mid-run: expected exit 130 and nothing left; got exit $rc (signal sent: $sent), there before: '$before', left: '$left'"
    fi
}
echo "== interrupted runs"
interrupted INT
interrupted TERM

# ---------------------------------------------------------------------
# 8. the browser test
# ---------------------------------------------------------------------
if [[ -s $out/matrix.html ]]; then
    echo "== the browser test (chromium, headless) on $out/matrix.html"
    echo "# $("$node" --version) ($node), $("$chromium" --version 2>/dev/null | head -n 1)"
    CHROMIUM=$chromium "$node" "$here/browser-test.mjs" "$out/matrix.html" "$out/matrix.json" --out "$out" | tee "$out/browser.txt"
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
