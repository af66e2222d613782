#!/usr/bin/env bash
# test/catalogue/run.sh: the catalogue of broken jobs (catalogue.txt) run
# through the sign-off runner (idempotency-matrix --job, docs/signoff.md):
# the refund job of each helper language (python/worker.py on
# pg_idempotency, ruby/worker.rb on pg-idempotency's gem, node/worker.mjs
# on its npm package; the same job, the plain functions, the directory
# queue of test/signoff/dirqueue.py) and its one-change mutations. Hook 85
# runs it.
#
#   PGHOST=... PGPORT=... PGUSER=... [PGDATABASE=...] test/catalogue/run.sh [LANGUAGE...]
#   test/catalogue/run.sh --table      the docs' table (docs/signoff.md), from catalogue.txt
#
# LANGUAGE: python, ruby, node (default: all three, run at once, one
# after another within a language; a language's wrapper jobs in a lane of
# their own: Celery's workers start slowly). Each broken entry runs with only its
# policy and cases and must exit 1 with exactly its cases failing, each
# failing case's first note "Diagnosis: " with its sentence (the -http
# entries: the runner's own sentence of the faults at the effect, with a
# job file made for effect = http); each correct entry must
# exit 0. Every entry's JSON report must name what made the claims, as the
# workers said at the point hello (signoff.helpers[].wrapper): "plain" for
# the plain functions, the wrapper's name for the wrapper entries
# (IdempotentTask, SidekiqMiddleware, idempotent, idempotentBatch).
# CATALOGUE_KINDS (e.g. correct,correct-http) runs only the entries of those
# kinds (test/signoff/stress.sh); IDEMPOTENCY_MATRIX names the runner (default
# matrix/idempotency-matrix, built if missing).
# Pending entries (none today) are listed, not run. One "ok - ..." or "not ok - ..." line per
# entry and language (and one for docs/signoff.md's table, which must be
# what --table prints); the last line "catalogue: N passed, N failed, N
# pending"; exit non-zero on a failure. Logs and reports are kept in a
# temporary directory (named) on failure.
#
# Needs a running server with the idempotency extension installed, reached
# as a superuser (the extension is created if missing), /usr/bin/python3
# with python3-psycopg and python3-celery, ruby with ruby-pg and
# ruby-sidekiq (the middleware's wrapper job; no Redis), node with
# helpers/node's packages installed (npm ci there, which brings
# @aws-sdk/client-sqs and sqs-consumer: hook 85 does), and
# matrix/idempotency-matrix (built if missing).
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
runner=${IDEMPOTENCY_MATRIX:-$root/matrix/idempotency-matrix}
catalogue=$here/catalogue.txt
python=/usr/bin/python3
effect=refund            # the job files' effect_name
# the job on a wrapper instead of the plain functions, per language and
# entry, and the name its helper gives the wrapper at the point hello
declare -A wrapper_job=([python:wrapper]=celery.job [ruby:wrapper]=sidekiq.job [node:wrapper]=sqs.job
                        [node:batch-wrapper]=sqs-batch.job
                        [python:permanent-failure]=celery.job [ruby:permanent-failure]=sidekiq.job
                        [node:permanent-failure]=sqs.job)
declare -A wrapper_name=([python:wrapper]=IdempotentTask [ruby:wrapper]=SidekiqMiddleware [node:wrapper]=idempotent
                         [node:batch-wrapper]=idempotentBatch
                         [python:permanent-failure]=IdempotentTask [ruby:permanent-failure]=SidekiqMiddleware
                         [node:permanent-failure]=idempotent)
# how each wrapper fails the delivery of a permanent failure (the report's case 16 names it)
declare -A permanent_delivery=([python]="the task in state FAILURE, not retried (Celery)"
                               [ruby]="the job in Sidekiq's dead set, not retried"
                               [node]="the message not deleted: left to the queue's redrive policy")
is_wrapper() { [[ $1 == wrapper || $1 == batch-wrapper || $1 == permanent-failure ]]; }
hash_command="key_command = sh -c 'printf %s \"refund:\$1\" | sha256sum | cut -c1-16' - {key}"

die() { echo "test/catalogue/run.sh: error: $*" >&2; exit 2; }

# the entries: kind|name|languages|policy|cases|fails|sentence|what, trimmed
entries() {
    sed -e '/^[[:space:]]*#/d' -e '/^[[:space:]]*$/d' "$catalogue" |
        awk -F' [|] ' -v OFS='|' '{ $1 = $1; for (i = 1; i <= NF; i++) gsub(/^[[:space:]]+|[[:space:]]+$/, "", $i); print }'
}

if [[ ${1:-} == --table ]]; then
    echo "| mutation | languages | caught by (policy, case) | the diagnosis says |"
    echo "|---|---|---|---|"
    entries | while IFS='|' read -r kind name langs policy cases fails sentence what; do
        [[ $kind == correct* ]] && continue
        what=${what//\{effect\}/$effect}
        sentence=${sentence//\{effect\}/$effect}
        langs=${langs// /, }
        if [[ $kind == broken-http ]]; then
            echo "| \`$name\`: $what | $langs | $policy, $fails (effect = http) | \"… $sentence …\" |"
        elif [[ $kind == pending ]]; then
            echo "| \`$name\`: $what | $langs | $policy, $fails (pending: not run) | \"… $sentence …\" |"
        else
            echo "| \`$name\`: $what | $langs | $policy, $fails | \"… $sentence …\" |"
        fi
    done
    echo
    echo "Correct variants, which must pass:"
    entries | while IFS='|' read -r kind name langs policy cases fails sentence what; do
        [[ $kind == correct* ]] || continue
        [[ $cases == all ]] && cases="every case" || cases="cases $cases"
        echo "\`$name\` ($what; ${langs// /, }): $cases under $policy"
    done | sed 's/^/- /'
    exit 0
fi

languages=("$@")
((${#languages[@]})) || languages=(python ruby node)
for lang in "${languages[@]}"; do
    [[ -f $here/$lang.job ]] || die "no such language: $lang (python, ruby, node)"
done

"$python" -c 'import psycopg' 2>/dev/null || die "$python cannot import psycopg: install python3-psycopg (Debian)"
for lang in "${languages[@]}"; do
    case $lang in
        ruby) ruby -e 'require "pg"' 2>/dev/null || die "ruby cannot require pg: install ruby-pg (Debian)"
              ruby -e 'require "sidekiq"' 2>/dev/null || die "ruby cannot require sidekiq: install ruby-sidekiq (Debian)" ;;
        node) [[ -d $root/helpers/node/node_modules/pg && -d $root/helpers/node/node_modules/@aws-sdk/client-sqs ]] ||
                  die "helpers/node has no node_modules/pg or @aws-sdk/client-sqs: run npm ci in helpers/node" ;;
    esac
done
psql=(psql -X -q -At -v ON_ERROR_STOP=1)
[[ -n ${PG_BINDIR:-} && -x $PG_BINDIR/psql ]] && psql[0]=$PG_BINDIR/psql
[[ $("${psql[@]}" -c 'SELECT rolsuper FROM pg_roles WHERE rolname = current_user' 2>&1) == t ]] ||
    die "connect as a superuser (PGUSER)"
"${psql[@]}" -c 'CREATE EXTENSION IF NOT EXISTS idempotency' >/dev/null || die "cannot create the extension idempotency"
[[ -n ${IDEMPOTENCY_MATRIX:-} ]] || make --no-print-directory -s -C "$root/matrix" >/dev/null || die "make -C matrix failed"

out=$(mktemp -d "${TMPDIR:-/tmp}/catalogue-test.XXXXXX") || die "mktemp failed"
export SIGNOFF_TEST_DIR=$out/spools
export TMPDIR=$out/tmp
mkdir -p "$SIGNOFF_TEST_DIR" "$TMPDIR"
pids=()
finish() {
    local p
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
    if [[ -n ${keep:-} ]]; then
        echo "# logs and reports kept in $out"
    else
        rm -rf "$out"
    fi
}
trap finish EXIT

# the verdict on one run's JSON report: prints "ok|not ok<TAB>what"
judge() {   # judge KIND NAME LANG RC FAILS SENTENCE JSON LOG WRAPPER [PERMANENT-DELIVERY]
    "$python" - "$@" <<'PY'
import fnmatch, json, re, sys
kind, name, lang, rc, fails, sentence, path, log, wrapper = sys.argv[1:10]
permanent = sys.argv[10] if len(sys.argv) > 10 else ""
rc = int(rc)
try:
    r = json.load(open(path))
except (OSError, ValueError) as e:
    print(f"not ok\t{lang} {name}: exit {rc}, no JSON report ({e})")
    sys.exit()
# what made the claims, as every worker said at the point hello
said = sorted({str(h["wrapper"]) for h in r["signoff"]["helpers"]})
if said != [wrapper]:
    print(f"not ok\t{lang} {name}: exit {rc}; the report names the wrappers {said or 'none'} (signoff.helpers), "
          f"not {wrapper!r} alone")
    sys.exit()
failing = [c for p in r["policies"] for c in p["cases"] if not c["pass"]]
ids = " ".join(c["case"] for c in failing)
if kind.startswith("correct"):
    # a permanent failure's entry: case 16's report names how the job ended it
    ending = next((c["observed"].get("ending") for p in r["policies"] for c in p["cases"] if c["case"] == "16"), None)
    want_end = f"ended with PermanentFailure (" if name.startswith("permanent-failure") else None
    end_ok = want_end is None or (ending or "").startswith(want_end) and permanent in ending
    if rc == 0 and not failing and end_ok:
        print(f"ok\t{lang} {name}: exit 0, {r['passed']} cases hold, the report naming {wrapper}"
              + (f"; case 16: the job {ending}" if want_end else ""))
    elif not end_ok:
        print(f"not ok\t{lang} {name}: case 16's ending is {ending!r}, not '{want_end}...{permanent}'")
    else:
        print(f"not ok\t{lang} {name}: expected exit 0; got exit {rc}, failing '{ids}'")
    sys.exit()
want = fails.split()
# the sentence with * for what changes per run, {effect} already filled
pattern = re.compile(".*".join(re.escape(part) for part in sentence.split("*")))
bad = []
said = ""
for c in failing:
    # every failing case opens with its diagnosis (the -http entries: the runner's own sentence of the faults at the effect)
    first = c["notes"][0] if c["notes"] else ""
    if not first.startswith("Diagnosis: ") or not pattern.search(first):
        bad.append(f"case {c['case']}: {first or 'no note'}")
    said = said or first
if rc == 1 and ids.split() == want and not bad:
    print(f"ok\t{lang} {name}: exit 1, case{'s' if len(want) > 1 else ''} {ids} fail{'' if len(want) > 1 else 's'}; {said}")
else:
    print(f"not ok\t{lang} {name}: expected exit 1, failing '{' '.join(want)}', each with the sentence "
          f"'{sentence}'; got exit {rc}, failing '{ids}'" + "".join(f"\n    {b}" for b in bad))
PY
}

run_language() {   # run_language LANG [wrapper]: one line per entry on stdout
    local lang=$1 lane=${2:-} kind name langs policy cases fails sentence what tag job log json rc env start wrapper
    entries | while IFS='|' read -r kind name langs policy cases fails sentence what; do
        [[ $kind == pending ]] && continue
        [[ -z ${CATALOGUE_KINDS:-} || ",$CATALOGUE_KINDS," == *",$kind,"* ]] || continue
        [[ " $langs " == *" $lang "* ]] || continue
        # the wrappers run in a lane of their own
        if is_wrapper "$name"; then [[ $lane == wrapper ]] || continue; else [[ $lane != wrapper ]] || continue; fi
        tag=${name//\//-}              # late-verdict/alone: late-verdict-alone
        [[ $kind == *-http ]] && tag=$name@http
        job=$out/$lang-$tag.job log=$out/$lang-$tag.log json=$out/$lang-$tag.json
        base=$here/$lang.job
        wrapper=plain
        if [[ $kind == correct* ]] && is_wrapper "$name"; then
            [[ -n ${wrapper_job[$lang:$name]:-} ]] || { echo "not ok	$lang $name: no $name job for $lang"; continue; }
            base=$here/${wrapper_job[$lang:$name]}
            wrapper=${wrapper_name[$lang:$name]}
        fi
        # the commands run where the job file says, taken from here
        grep -v '^#' "$base" | sed "s|^dir = |dir = $here/|" >"$job"
        grep -q '^dir = ' "$job" || echo "dir = $here" >>"$job"
        if [[ $kind == *-http ]]; then
            # the run's own HTTP endpoint counts the refunds and fails on cue
            grep -v -e '^effects = ' -e '^lease = ' -e '^timeout = ' "$job" >"$job.tmp"
            printf 'effect = http\nlease = 2\ntimeout = 10\n' >>"$job.tmp"
            mv "$job.tmp" "$job"
        fi
        env=()
        case ${kind%-http}:$name in
            correct:correct | correct:wrapper | correct:batch-wrapper | correct:permanent-failure) ;;
            correct:prefix) env=(CATALOGUE_KEY=prefix) ;;
            correct:hash) env=(CATALOGUE_KEY=hash); echo "$hash_command" >>"$job" ;;
            broken:*) env=("CATALOGUE_MUTATION=${name%%/*}") ;;
            *) echo "not ok	$lang $name: unknown entry $kind $name"; continue ;;
        esac
        args=(--job "$job" --policy "$policy" --json "$json")
        [[ $cases == all ]] || args+=(--cases "$cases")
        start=$SECONDS
        env "${env[@]}" "$runner" "${args[@]}" >"$log" 2>&1
        rc=$?
        judge "$kind" "$tag" "$lang" "$rc" "$fails" "${sentence//\{effect\}/$effect}" "$json" "$log" "$wrapper" \
              "${permanent_delivery[$lang]}" |
            sed "1s/\$/ ($((SECONDS - start)) s)/"
    done
}

passed=0 failed=0
# the docs' table is this catalogue's
doc=$root/docs/signoff.md
"$0" --table >"$out/table.md"
sed -n '/^<!-- generated by test\/catalogue\/run.sh --table;/,/^<!-- end of test\/catalogue\/run.sh --table -->/p' "$doc" |
    sed '1d;$d' >"$out/doc-table.md"
if [[ -s $out/table.md ]] && cmp -s "$out/table.md" "$out/doc-table.md"; then
    echo "ok - docs/signoff.md holds the catalogue's table as run.sh --table prints it"
    passed=$((passed + 1))
else
    echo "not ok - docs/signoff.md's catalogue table differs from run.sh --table (regenerate it):"
    diff -u "$out/doc-table.md" "$out/table.md" | sed 's/^/    /'
    failed=$((failed + 1))
fi

echo "== the catalogue (test/catalogue/catalogue.txt): ${languages[*]}, at once (a wrapper in a lane of its own)"
start=$SECONDS
lanes=()
for lang in "${languages[@]}"; do
    run_language "$lang" >"$out/$lang.results" 2>"$out/$lang.err" &
    pids+=($!)
    lanes+=("$lang")
    if [[ " ${!wrapper_job[*]} " == *" $lang:"* ]]; then
        run_language "$lang" wrapper >"$out/$lang-wrapper.results" 2>"$out/$lang-wrapper.err" &
        pids+=($!)
        lanes+=("$lang-wrapper")
    fi
done
wait
pids=()
for lane in "${lanes[@]}"; do
    lang=${lane%-wrapper}
    # one line per entry: judge's indented lines (a failing case's first
    # note) joined to the entry's line by \x1f
    while IFS=$'\t' read -r verdict text; do
        echo "$verdict - ${text%%$'\x1f'*}"
        if [[ $verdict == ok ]]; then
            passed=$((passed + 1))
        else
            failed=$((failed + 1))
            # right under it (scripts/test's summary shows 4 lines): what
            # each failing case said, then the end of the report
            [[ $text == *$'\x1f'* ]] && tr '\037' '\n' <<<"${text#*$'\x1f'}"
            log=$out/$lang-$(awk '{print $2}' <<<"$text" | tr -d :).log
            if [[ -f $log ]]; then
                grep -A2 -E '^  case [^ ]+ \([a-z]+\):$' "$log" | grep -v '^--$' | head -n 12 | sed 's/^/    /'
                echo "    ... the end of $log:"
                sed 's/^/    /' "$log" | tail -n 40
            fi
        fi
    done < <(awk '/^[[:space:]]/ { printf "\037%s", $0; next } NR > 1 { print "" } { printf "%s", $0 } END { if (NR) print "" }' \
                 "$out/$lane.results")
    [[ -s $out/$lane.err ]] && { echo "# $lane: stderr:"; sed 's/^/    /' "$out/$lane.err"; failed=$((failed + 1)); }
done
pending=0
while IFS='|' read -r kind name langs policy cases fails sentence what; do
    [[ $kind == pending ]] || continue
    echo "# pending, not run: $name ($langs; ${what//\{effect\}/$effect}): --policy $policy --cases $cases must fail case $fails saying \"$sentence\""
    pending=$((pending + 1))
done < <(entries)
echo "# the catalogue took $((SECONDS - start)) s"
((failed == 0)) || keep=1
echo "catalogue: $passed passed, $failed failed, $pending pending"
((failed == 0 && passed > 0))
