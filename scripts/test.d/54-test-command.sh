#!/usr/bin/env bash
# The README's test command, scripts/test, reporting on hooks: in a copy of
# the extension's tree (--srcdir; no runner, no regression files) whose
# scripts/test.d holds four hooks of this test's own:
#   10-fg-ok    a foreground hook that passes (1 s)
#   20-bg-fail  "# scripts/test: background": prints "not ok - bg broke",
#               exit 4, after 2 s
#   30-bg-ok    background: passes
#   40-fg-fail  foreground: prints "not ok - fg broke", exit 1
# scripts/test must exit non-zero with "summary: 2 passed, 2 failed"; run the
# background hooks one after another (30 starts after 20 ended) beside the
# foreground ones (20 starts before 10 ends); print the foreground hooks'
# output first, each background hook's output in one piece after them;
# and end with each hook's time (background ones marked), the failed hooks
# and their not-ok lines, which is what a CI log shows first. About 30 s (the
# copy is built and installed, a cluster started).
set -uo pipefail

srcdir=${TEST_SRCDIR:-$(pwd)}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/test-command-test.XXXXXX") || exit 2
trap 'rm -rf "$tmp"' EXIT
# the cluster's owner (postgres, when root) reads the copy and the marks
chmod 755 "$tmp"

passed=0
failed=0
ok() { echo "ok - $*"; passed=$((passed + 1)); }
not_ok() {
    local log=$1; shift
    echo "not ok - $*"
    [[ -n $log && -f $log ]] && sed 's/^/    /' "$log"
    failed=$((failed + 1))
}

tree=$tmp/tree
mkdir -p "$tree/scripts/test.d"
(cd "$srcdir" && cp -r Makefile idempotency.control idempotency--*.sql src "$tree/") &&
    rm -f "$tree"/src/*.o "$tree"/src/*.bc "$tree"/src/*.so "$tree"/*.so
marks=$tmp/marks
mkdir "$marks"
chmod 777 "$marks"
hook() {   # name, background (yes/no), body
    {
        echo '#!/usr/bin/env bash'
        [[ $2 == yes ]] && echo '# scripts/test: background'
        echo "mark() { date +%s.%N >\"$marks/$1.\$1\"; }"
        echo "$3"
    } >"$tree/scripts/test.d/$1.sh"
}
hook 10-fg-ok no 'mark start; echo "fg ok output"; sleep 1; mark end'
hook 20-bg-fail yes 'mark start; echo "bg fail output"; sleep 2; echo "not ok - bg broke"; mark end; exit 4'
hook 30-bg-ok yes 'mark start; echo "bg ok output"; mark end'
hook 40-fg-fail no 'mark start; echo "not ok - fg broke"; mark end; exit 1'

log=$tmp/test.log
env -u CLUSTER_DIR -u CLUSTER_PORT -u CLUSTER_OWNER -u PGHOST -u PGPORT -u PGUSER -u PGDATABASE \
    -u PGDATA -u TEST_HOOKS -u TEST_SKIP_HOOKS -u TEST_SRCDIR \
    "$srcdir/scripts/test" --srcdir "$tree" hooks >"$log" 2>&1
rc=$?

if ((rc != 0)) && grep -qx 'summary: 2 passed, 2 failed' "$log" &&
    grep -qx '== done in [0-9]* s: hooks 2/4' "$log"; then
    ok "two of four hooks failed: exit $rc, 'summary: 2 passed, 2 failed'"
else
    not_ok "$log" "expected a non-zero exit and 'summary: 2 passed, 2 failed'; got exit $rc"
fi

# the marks: when each hook started and ended
t() { cat "$marks/$1" 2>/dev/null || echo -1; }
before() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a >= 0 && b >= 0 && a < b) }'; }
if before "$(t 20-bg-fail.start)" "$(t 10-fg-ok.end)" && before "$(t 20-bg-fail.end)" "$(t 30-bg-ok.start)"; then
    ok "the background hooks ran beside the foreground ones (20 started before 10 ended) and one after another (30 after 20)"
else
    not_ok "$log" "background order: 20 start $(t 20-bg-fail.start), 10 end $(t 10-fg-ok.end), 20 end $(t 20-bg-fail.end), 30 start $(t 30-bg-ok.start)"
fi

# the output's order: foreground hooks first, then each background one whole
order=$(grep -E '^(fg ok output|not ok - fg broke|bg fail output|not ok - bg broke|bg ok output|== hook scripts/test.d/[0-9a-z-]+\.sh)$' "$log" | tr '\n' '|')
want='== hook scripts/test.d/10-fg-ok.sh|fg ok output|== hook scripts/test.d/40-fg-fail.sh|not ok - fg broke|'
want+='== hook scripts/test.d/20-bg-fail.sh|bg fail output|not ok - bg broke|== hook scripts/test.d/30-bg-ok.sh|bg ok output|'
if [[ $order == "$want" ]]; then
    ok "foreground output first, then each background hook's output in one piece, in order"
else
    not_ok "$log" "output order: $order"
fi

# the last lines: times, failed hooks and their not-ok lines
tail_lines=$(tail -n 8 "$log")
if grep -qE "^== hooks' times: 10-fg-ok [0-9]+s 40-fg-fail [0-9]+s 20-bg-fail [0-9]+s\(bg\) 30-bg-ok [0-9]+s\(bg\)$" <<<"$tail_lines" &&
    grep -qx '== failed hooks: 40-fg-fail 20-bg-fail' <<<"$tail_lines" &&
    grep -qx '   40-fg-fail: not ok - fg broke' <<<"$tail_lines" &&
    grep -qx '   20-bg-fail: not ok - bg broke' <<<"$tail_lines" &&
    grep -q 'hook scripts/test.d/20-bg-fail.sh: FAILED (exit 4)' "$log"; then
    ok "the end names each hook's time, the failed hooks and their not-ok lines; a background failure keeps its exit status (4)"
else
    not_ok "$log" "the last lines lack the hooks' times, the failed hooks or their not-ok lines"
fi

echo "test command: $passed passed, $failed failed"
((failed == 0 && passed > 0))
