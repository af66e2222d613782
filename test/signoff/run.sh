#!/usr/bin/env bash
# test/signoff/run.sh: the sign-off run (idempotency-matrix --job FILE,
# docs/signoff.md) tested end to end on a job that needs no broker: a queue
# in a directory (dirqueue.py), workers written with pg_idempotency's plain
# functions and sign-off points (worker.py), enqueue.py and effects.sh, the
# job file good.job. Hook 84 runs it.
#
#   PGHOST=... PGPORT=... PGUSER=... [PGDATABASE=...] test/signoff/run.sh
#
# Needs a running server with the idempotency extension installed (make
# install), reached as a superuser (the test creates the extension if it is
# missing, two databases of its own that it drops, and reads the test job's
# effects file with pg_read_file for effects_sql), Debian's python3 with
# python3-psycopg (/usr/bin/python3), jq, and matrix/idempotency-matrix
# (built if missing). Steps, each an "ok - ..." or "not ok - ..." line:
#   1. the good job under hold, retry, skip and lookup: exit 0, every case
#      (1-13 and the storm, 19) holds, also in the JSON report (format, signoff object, each
#      policy's cases); no worker left, nothing of the run's left in the
#      database; the time of each policy is printed;
#   2. the two broken workers (worker.py --broken ...): ignore-verdict under
#      hold must fail exactly cases 2 3 5 6 7a 7b 9 11 12 19, complete-first
#      under retry exactly 6 7b 9 19 (the storm: a duplicate, a loss), exit 1; --broken late-copy (a copy
#      that makes the effect again 2 s later, without a claim): the drain
#      fails exactly cases 1 and 2 (13 runs nothing);
#   3. bad job files (no worker line, an unknown name, a repeated name, a
#      line without "="), a database without the extension and one with
#      0.2: exit 2, the one sentence, nothing started;
#   4. an enqueue command that exits 3: the case fails naming the command
#      and the status, with its stderr;
#   5. a worker whose helper is not armed (env -u IDEMPOTENCY_SIGNOFF):
#      "the helper is not installed or not armed in that worker", the end
#      of its log, the later cases not run;
#   6. SIGINT, and SIGTERM, in the middle of a case with a live worker:
#      exit 130, no worker process left, no job type or record of the run,
#      its directory removed; the text, JSON, HTML and JUnit reports are
#      written all the same, marked interrupted, with the case that
#      finished and without the one interrupted; SIGKILL, with a worker that is not the
#      runner's child: the guardian kills it and removes the directory;
#   7. effects counted by the handled reports (no effects line) and by
#      effects_sql (lookup): the cases hold, the report names the source;
#   8. a transactional job (worker.py --transactional, transactional = yes,
#      effects_sql counting its rows): exactly cases 1 2 4 8 11 run and
#      hold, case 8 "none, then completed #1"; a claim committed on its own
#      (--broken commit-first) fails case 8 with the sentence saying so;
#      transactional = yes without effects_sql: exit 2, one sentence;
#   9. keys (worker.py --key): a prefix or a suffix of the run's key needs no
#      setting, a template (key =) and a hash (key_command) are declared,
#      and the cases hold; a key made otherwise without a declaration fails
#      case 1 within 20 s naming both keys (and that the same message is
#      claimed under the same key again), later cases not run; a message id
#      is named as one; a claim under another key than the declared one
#      (key = ship:{key}, the worker's ship:{key}:0) fails case 1 at once,
#      naming both and what differs, no timeout waited; key with
#      key_command, and key without {key}: exit 2;
#  10. what was signed: the JSON report records the job file's sha256 and
#      the code's (code = paths or globs, separated by commas and blanks
#      alike, a file named twice counted once), as sha256sum computes them, and
#      git's commit; --junit writes JUnit XML; --verify REPORT exits 0 while
#      nothing changed and 1 naming a changed, added or removed code file or
#      a changed job file; a missing report: exit 2; code that matches no
#      file: exit 2, one sentence; a report whose job file name, queue and
#      code file names hold quotes, backslashes, control characters and
#      non-ASCII reads back with python3 -m json.tool, jq and Python, and
#      --verify reads it as written, after jq ., jq -c and Python's
#      json.dump(indent=2), exit 0, then exit 1 naming each changed and
#      removed file; a report that is not JSON: exit 2, one sentence naming
#      the line and column;
#  11. faults at the effect (effect = http, smtp: the runner's endpoint;
#      http.job, smtp.job): the good job's cases 14-19 hold under every
#      policy (the endpoint's counts per policy checked in the JSON), SMTP's
#      under retry; worker.py's broken variants fail exactly their case with
#      their sentence: swallow-errors (14, 18; SMTP 451 too), no-timeout
#      (15, how long it hung), release-on-timeout (15), retry-forever (16),
#      short-timeout (17 judged by the policy: hold and skip fail, retry
#      and lookup hold as 15 gives),
#      no-key (1: a request that names no key), shared-client (19 only: the
#      storm); effect = ftp, effect beside effects, lookup with smtp: exit 2;
#  12. a batch handler (worker.py --batch 10, batch = yes): case 20 holds;
#      --broken batch-drop (the receive dropped for one key's ID002) fails
#      it; batch = sometimes: exit 2;
#  13. a diagnosis: the good run's reports name the helper that ran
#      (pg_idempotency, its version, CPython's, no queue library, the
#      database, the plain functions; hellos from at least 4 and at most
#      the worker processes the run started (a worker says hello at its
#      first claim); the
#      batch run's the plain functions' batch call; --junit's properties);
#      a wrapper of one's own named with signoff_wrapper (wrapped.py
#      named), a helper without the field (old: "wrapper not reported") and
#      a wrapper that is not a name (bad) in all three reports; a worker on a second
#      database fails case 1 within seconds with the one sentence naming both
#      databases, case 2 not run; a worker whose role has no grant fails
#      case 1 at once with "the claim failed: 42501 permission denied for
#      schema idempotency", instead of the timeout; a job file whose
#      job_type is not the one the worker claims under fails case 1 within
#      15 s with one sentence naming both job types, case 2 not run; a
#      run given --dsn alone (a URI with a password) and no PG* variable:
#      its worker and effects command get libpq's variables of it
#      (PGHOST, PGPORT, PGDATABASE, PGUSER, PGPASSWORD decoded), the cases hold.
#  14. a redelivery slower than the lease in 7a/7b (worker.py
#      --slow-redelivery once, always): the runner keeps the dead claim
#      young, and 7a holds on its first try, saying so. A runner stopped
#      past the lease after the in_progress verdict (--slow-runner): 7a and
#      7b hold on their first try, with a note on the late read; stopped
#      before the redelivery's claim, past the lease, every time
#      (--slow-runner --slow-redelivery always): the try tests nothing, and
#      7a fails after 3 tries with the sentence to give a longer lease. The
#      worker's own in_progress retry judged after the lease before the
#      runner read anything (enqueue.py --stop-runner-after-in-progress,
#      skip and retry): 7a and 7b settle as 5 and 6 give, saying so.
#      The storm's race (worker.py --in-progress-again 0.3 --slow-takeover
#      3): every copy of a killed key reported, judged in_progress, before
#      its takeover's claimed point: 19 under retry holds (the runner
#      waits for the record the policy gives; the runner of 3c40d26
#      counted first and failed it: "lost 1 effect", "claimed #2 (young)").
#      Case 12 with the worker stalled (SIGSTOP) past the lease at its
#      claimed point (worker.py --stall-in-12): in the first try only, the
#      try tests nothing and the second holds; in every try, it fails
#      after 3 saying the machine stalls the worker; with a heartbeat
#      slower than half the lease (--heartbeat-every 0.7), it fails at
#      once, naming the heartbeat's period.
# Steps 11, 12 and 14 start first and run beside the others (a spool directory
# of their own); they are judged at the end.
# The broken, bad-input and interrupt runs use a 1.5 s lease (the job
# file's lease) to save time; step 14 a 5 s one (its unslowed redeliveries
# must come inside the lease on a loaded machine); the good job runs with
# the default lease.
# The last line: "signoff: N passed, N failed"; exit non-zero on a failure.
# The logs and reports are kept in a temporary directory (named) on failure.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
runner=$root/matrix/idempotency-matrix
python=/usr/bin/python3
psql=(psql -X -q -At -v ON_ERROR_STOP=1)
[[ -n ${PG_BINDIR:-} && -x $PG_BINDIR/psql ]] && psql[0]=$PG_BINDIR/psql

die() { echo "test/signoff/run.sh: error: $*" >&2; exit 2; }

"$python" -c 'import psycopg' 2>/dev/null ||
    die "$python cannot import psycopg: install python3-psycopg (Debian)"
command -v jq >/dev/null || die "jq not found: install jq (Debian)"
[[ $("${psql[@]}" -c 'SELECT rolsuper FROM pg_roles WHERE rolname = current_user' 2>&1) == t ]] ||
    die "connect as a superuser (PGUSER)"
"${psql[@]}" -c 'CREATE EXTENSION IF NOT EXISTS idempotency' >/dev/null ||
    die "cannot create the extension idempotency"
make --no-print-directory -s -C "$root/matrix" >/dev/null || die "make -C matrix failed"

out=$(mktemp -d "${TMPDIR:-/tmp}/signoff-test.XXXXXX") || die "mktemp failed"
# effects_sql reads the effects file as the server's user: let it in
chmod 755 "$out"
export SIGNOFF_TEST_DIR=$out/spools
mkdir -p "$SIGNOFF_TEST_DIR" && chmod 755 "$SIGNOFF_TEST_DIR"
# the runner's own temp dirs (socket, worker logs) go here too
export TMPDIR=$out/tmp
mkdir -p "$TMPDIR"

passed=0
failed=0
ok() { echo "ok - $*"; passed=$((passed + 1)); }
not_ok() {   # not_ok LOG|"" TEXT
    local log=$1; shift
    echo "not ok - $*"
    [[ -n $log && -f $log ]] && sed 's/^/    /' "$log" | tail -n 60
    failed=$((failed + 1))
}

dbs=()
roles=()
finish() {
    local db role
    for db in "${dbs[@]}"; do
        "${psql[@]}" -d postgres -c "DROP DATABASE IF EXISTS $db" >/dev/null 2>&1
    done
    for role in "${roles[@]}"; do
        "${psql[@]}" -d postgres -c "DROP ROLE IF EXISTS $role" >/dev/null 2>&1
    done
    if ((failed == 0)); then
        rm -rf "$out"
    else
        echo "# logs and reports kept in $out"
    fi
}
trap finish EXIT

# a job file: good.job with NAME=VALUE lines replaced or added, the
# commands still run in test/signoff (dir); VALUE "-" drops the line
make_job() {   # make_job FILE [NAME=VALUE...]
    local file=$1; shift
    grep -v '^#' "$here/good.job" >"$file"
    echo "dir = $here" >>"$file"
    local kv name value
    for kv in "$@"; do
        name=${kv%%=*} value=${kv#*=}
        grep -v "^$name *=" "$file" >"$file.tmp"; mv "$file.tmp" "$file"
        [[ $value == - ]] || echo "$name = $value" >>"$file"
    done
}

# the run's job-type prefix and directory, from its banner
prefix_of() { sed -n 's/^job types \(signoff_[0-9a-f]*\)_<policy>.*/\1/p' "$1" | head -n 1; }
rundir_of() { sed -n 's/^job types .*, worker logs in \(.*\)$/\1/p' "$1" | head -n 1; }

# workers of a run still alive: their pid files in the spool, each pid
# only while it is still that run's worker (the pid files outlive their
# processes, and with pid_max 32768, Debian's default, a busy CI machine
# reuses a pid within minutes, while the runner waits for every worker
# group it stops)
alive_workers() {   # alive_workers PREFIX
    local run=${1#signoff_} f pid n=0
    for f in "$SIGNOFF_TEST_DIR/spool-$run"/pids/*; do
        [[ -e $f ]] || continue
        pid=${f##*/}
        kill -0 "$pid" 2>/dev/null || continue
        tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null | grep -qxF "IDEMPOTENCY_SIGNOFF_RUN=$run" &&
            n=$((n + 1))
    done
    echo "$n"
}
workers_started() { local run=${1#signoff_}; ls "$SIGNOFF_TEST_DIR/spool-$run/pids" 2>/dev/null | wc -l; }

left_in_db() {   # left_in_db PREFIX: job types + records of the run
    "${psql[@]}" -c "SELECT (SELECT count(*) FROM idempotency.job_types WHERE job_type LIKE '$1\\_%')
                          + (SELECT count(*) FROM idempotency.operations WHERE job_type LIKE '$1\\_%')"
}

# the failing cases of a JSON report, as "policy:case ..." in report order
failing_cases() {
    "$python" - "$1" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
print(" ".join(f"{p['policy']}:{c['case']}" for p in r["policies"] for c in p["cases"] if not c["pass"]))
EOF
}

# ---------------------------------------------------------------------
# Steps 11, 12 and 14 (faults at the effect, the batch, a slow redelivery) are runs of their own
# (a run id, a spool in spools-bg, an endpoint each): they start now, beside
# the others, and are judged at the end.
# ---------------------------------------------------------------------
mkdir -p "$out/spools-bg" && chmod 755 "$out/spools-bg"
bg_pids=()
bg_start=$SECONDS
effect_run() {   # effect_run NAME JOB BROKEN POLICIES CASES
    local name=$1 job=$2 broken=$3 policies=$4 cases=$5
    SIGNOFF_TEST_BROKEN=$broken SIGNOFF_TEST_DIR=$out/spools-bg "$runner" --job "$here/$job" --policy "$policies" --cases "$cases" \
        --json "$out/effect-$name.json" >"$out/effect-$name.log" 2>&1
    echo $? >"$out/effect-$name.rc"
}
effect_run http-good http.job "" hold,retry,skip,lookup 14-19 & bg_pids+=($!)
effect_run smtp-good smtp.job "" retry 1,2,14-18 & bg_pids+=($!)
effect_run swallow http.job swallow-errors retry 14,16,18 & bg_pids+=($!)
effect_run smtp-swallow smtp.job swallow-errors hold 14 & bg_pids+=($!)
effect_run no-timeout http.job no-timeout hold 15 & bg_pids+=($!)
effect_run release-on-timeout http.job release-on-timeout hold 15 & bg_pids+=($!)
effect_run retry-forever http.job retry-forever retry 16 & bg_pids+=($!)
effect_run short-timeout http.job short-timeout hold,retry,skip,lookup 17 & bg_pids+=($!)
effect_run no-key http.job no-key retry 1 & bg_pids+=($!)
effect_run shared-client http.job shared-client retry 19 & bg_pids+=($!)
batch_run() {   # batch_run NAME WORKER-ARGS
    local name=$1 args=$2 job=$out/batch-$1.job
    make_job "$job" "worker=/usr/bin/python3 worker.py $args" "batch=yes" "lease=1.5" "timeout=10"
    SIGNOFF_TEST_DIR=$out/spools-bg "$runner" --job "$job" --policy retry --cases 1,20 --json "$out/batch-$name.json" >"$out/batch-$name.log" 2>&1
    echo $? >"$out/batch-$name.rc"
}
batch_run good "--batch 10" & bg_pids+=($!)
batch_run drop "--batch 10 --broken batch-drop" & bg_pids+=($!)
# a 5 s lease: the slowed redelivery waits lease + 0.5 s, and an unslowed
# one (--slow-redelivery once's later tries, --slow-runner's every try)
# must still come inside the lease while hooks 85 and 90-92 load the
# machine (1.7-4.1 s from the first claim was seen with a 1.5 s lease)
slow_lease=5
slow_run() {   # slow_run NAME WORKER-FLAGS POLICY CASES
    local name=$1 job=$out/slow-$1.job
    make_job "$job" "worker=/usr/bin/python3 worker.py $2" "lease=$slow_lease" "policies=-"
    SIGNOFF_TEST_DIR=$out/spools-bg "$runner" --job "$job" --policy "$3" --cases "$4" --json "$out/slow-$name.json" >"$out/slow-$name.log" 2>&1
    echo $? >"$out/slow-$name.rc"
}
slow_run once "--slow-redelivery once" retry 7a,7b & bg_pids+=($!)
slow_run always "--slow-redelivery always" hold 7a & bg_pids+=($!)
slow_run runner --slow-runner hold 7a,7b & bg_pids+=($!)
slow_run late "--slow-runner --slow-redelivery always" hold 7a & bg_pids+=($!)
# the runner stopped right after the in_progress verdict, for three leases
# and 1 s (enqueue.py --stop-runner-after-in-progress): the worker's own
# in_progress retry is judged after the lease (skip: skipped; retry: a
# takeover) before the runner reads anything; 1.5 s lease
settle_run() {
    local job=$out/settle.job
    make_job "$job" "enqueue=/usr/bin/python3 enqueue.py {key} --stop-runner-after-in-progress 5.5" \
        "lease=1.5" "policies=-"
    SIGNOFF_TEST_DIR=$out/spools-bg "$runner" --job "$job" --policy skip,retry --cases 7a,7b --json "$out/settle.json" >"$out/settle.log" 2>&1
    echo $? >"$out/settle.rc"
}
settle_run & bg_pids+=($!)
# the storm's race: the killed keys' copies come again every 0.3 leases
# (judged in_progress, each a delivery), and a takeover waits 3 s between
# its claim and its claimed point, so every copy has been reported before
# the takeover is: the case must wait for the record the policy gives
storm_run() {
    local job=$out/storm.job
    make_job "$job" "worker=/usr/bin/python3 worker.py --in-progress-again 0.3 --slow-takeover 3" "policies=-"
    SIGNOFF_TEST_DIR=$out/spools-bg "$runner" --job "$job" --policy retry --cases 19 --json "$out/storm.json" >"$out/storm.log" 2>&1
    echo $? >"$out/storm.rc"
}
storm_run & bg_pids+=($!)
# a machine that stalls the worker in case 12 (worker.py --stall-in-12:
# SIGSTOP for the lease and 1 s, its heartbeat with it), 2 s lease: the
# first try only (holds on the second), every try (fails after 3, saying
# the machine stalls the worker), and with a heartbeat slower than half the
# lease (the job's fault: fails at once, saying so)
stall_run() {   # stall_run NAME WORKER-FLAGS
    local name=$1 job=$out/stall-$1.job
    make_job "$job" "worker=/usr/bin/python3 worker.py $2" "lease=2" "policies=-"
    SIGNOFF_TEST_DIR=$out/spools-bg "$runner" --job "$job" --policy hold --cases 12 --json "$out/stall-$name.json" >"$out/stall-$name.log" 2>&1
    echo $? >"$out/stall-$name.rc"
}
stall_run once "--stall-in-12 once" & bg_pids+=($!)
stall_run always "--stall-in-12 always" & bg_pids+=($!)
stall_run slow-heartbeat "--stall-in-12 once --heartbeat-every 0.7" & bg_pids+=($!)

# ---------------------------------------------------------------------
# 1. the good job, every policy, the default lease
# ---------------------------------------------------------------------
log=$out/good.log
start=$SECONDS
"$runner" --job "$here/good.job" --html "$out/good.html" --json "$out/good.json" >"$log" 2>"$out/good.err"
rc=$?
secs=$((SECONDS - start))
prefix=$(prefix_of "$log")
total=$(tail -n 1 "$log")
if ((rc == 0)) && [[ $total == "56 passed, 0 failed" ]]; then
    ok "the good job under hold, retry, skip and lookup: exit 0, $total ($secs s)"
else
    not_ok "$log" "the good job: expected exit 0 and '56 passed, 0 failed'; got exit $rc, '$total'"
fi
if grep -qx 'Sign-off run: job type signoff_test_job on dirqueue, idempotency .* on PostgreSQL .*' "$log" &&
    grep -qx "worker: /usr/bin/python3 worker.py" "$log" &&
    grep -qx "enqueue: /usr/bin/python3 enqueue.py {key}" "$log" &&
    grep -qx "effects: the command sh effects.sh {key}" "$log" &&
    grep -q "runner idempotency-matrix " "$log" &&
    grep -qx 'Policy chosen: _* *Signed off by: _* *Date: _*' "$log" &&
    grep -qE '^ +effects +record afterwards +verdicts$' "$log"; then
    ok "the text report is headed by job type, queue, commands, effects source and versions, counts effects, and has a line to sign"
else
    not_ok "$log" "the text report's header, effects column or sign line is missing"
fi
if "$python" - "$out/good.json" >"$out/good.check" 2>&1 <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["format"] == "idempotency-signoff/2", r["format"]
assert r["ok"] is True and r["failed"] == 0 and r["passed"] == 56, (r["ok"], r["passed"], r["failed"])
s = r["signoff"]
assert s["job_type"] == "signoff_test_job" and s["queue"] == "dirqueue", s
assert s["worker"] == "/usr/bin/python3 worker.py" and s["effects_source"] == "command", s
assert s["lease_seconds"] == 3 and s["timeout_seconds"] == 30, s
assert [p["policy"] for p in r["policies"]] == ["hold", "retry", "skip", "lookup"]
for p in r["policies"]:
    ids = [c["case"] for c in p["cases"]]
    assert ids == ["1", "2", "3", "4", "5", "6", "7a", "7b", "9", "10", "11", "12", "13", "19"], ids
    for c in p["cases"]:
        assert c["pass"] and c["ran"] and c["effects_ok"], (p["policy"], c["case"])
        assert c["observed"]["effects"] == c["expected"]["effects"], (p["policy"], c["case"])
        assert c["observed"]["verdicts"] == c["expected"]["verdicts"], (p["policy"], c["case"])
    print(f"# policy {p['policy']}: {p['seconds']:.1f} s")
summary = {x["policy"]: (x["case5_effects"], x["case6_effects"]) for x in r["summary"]}
assert summary == {"hold": (0, 1), "retry": (1, 2), "skip": (0, 1), "lookup": (1, 1)}, summary
EOF
then
    cat "$out/good.check"
    ok "the JSON report: format idempotency-signoff/2, the signoff object, 14 passing cases per policy (13 and the storm, 19), effects 0/1, 1/2, 0/1, 1/1 in cases 5 and 6"
else
    not_ok "$out/good.check" "the JSON report of the good job"
fi
if grep -q '<h1>Sign-off: job type signoff_test_job on dirqueue</h1>' "$out/good.html" &&
    grep -q 'Signed off by: ____' "$out/good.html" && grep -q '<th scope="col">effects</th>' "$out/good.html"; then
    ok "the HTML report: its heading, the effects column and the line to sign"
else
    not_ok "" "the HTML report lacks the heading, the effects column or the sign line"
fi
if [[ -n $prefix ]] && (($(workers_started "$prefix") > 0)) && [[ $(alive_workers "$prefix") == 0 ]] &&
    [[ $(left_in_db "$prefix") == 0 ]] && [[ ! -e $(rundir_of "$log") ]]; then
    ok "after the good run: no worker left ($(workers_started "$prefix") started), no job type or record of $prefix, its directory removed"
else
    not_ok "" "after the good run ($prefix): $(alive_workers "$prefix") workers alive, $(left_in_db "$prefix") rows left, or its directory $(rundir_of "$log") is there"
fi

# ---------------------------------------------------------------------
# 2. the broken workers: the report must fail exactly these cases
# ---------------------------------------------------------------------
check_broken() {   # check_broken VARIANT POLICY EXPECTED...
    local variant=$1 policy=$2; shift 2
    local job=$out/$variant.job log=$out/$variant.log want got
    make_job "$job" "worker=/usr/bin/python3 worker.py --broken $variant" "lease=1.5" "policies=-"
    "$runner" --job "$job" --policy "$policy" --json "$out/$variant.json" >"$log" 2>&1
    rc=$?
    want=$(printf "$policy:%s " "$@"); want=${want% }
    got=$(failing_cases "$out/$variant.json" 2>&1)
    if ((rc == 1)) && [[ $got == "$want" ]]; then
        ok "worker.py --broken $variant under $policy: exit 1, exactly cases $* fail"
    else
        not_ok "$log" "worker.py --broken $variant under $policy: expected exit 1 and failing '$want'; got exit $rc, failing '$got'"
    fi
}
# effects on completed, in_progress, held and skipped: duplicates
check_broken ignore-verdict hold 2 3 5 6 7a 7b 9 11 12 19
# the completion before the effect: a kill at handled loses the effect
check_broken complete-first retry 6 7b 9 19
if grep -q "FAILED: the record of signoff-[0-9a-f]*-retry-6-1 is completed #1 already, so stale_claims() will never list it: was the completion sent before the handler returned?" "$out/complete-first.log"; then
    ok "complete-first: case 6 says the record was completed before the handler returned"
else
    not_ok "$out/complete-first.log" "complete-first: case 6 does not say why"
fi

# a job that schedules a copy of itself: the copy's effect lands after the
# case; the drain (default 5 s) counts it, in the case it belongs to
job=$out/late-copy.job
log=$out/late-copy.log
make_job "$job" "worker=/usr/bin/python3 worker.py --broken late-copy" "lease=1.5" "policies=hold"
"$runner" --job "$job" --cases 1,2,13 --json "$out/late-copy.json" >"$log" 2>&1
rc=$?
got=$(failing_cases "$out/late-copy.json" 2>&1)
if ((rc == 1)) && [[ $got == "hold:1 hold:2" ]] &&
    grep -q 'the effects of its key are now 2, not the 1 counted when the case ended: the job made an effect after its case' "$log"; then
    ok "worker.py --broken late-copy: the drain counts the copies' effects in their cases, 1 and 2 fail (13 made none)"
else
    not_ok "$log" "late-copy: expected exit 1, cases hold:1 hold:2 failing with the drain's sentence; got exit $rc, failing '$got'"
fi
if "$python" - "$out/late-copy.json" >"$out/late-copy.check" 2>&1 <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
c = {x["case"]: x["observed"] for x in r["policies"][0]["cases"]}
assert (c["1"]["effects_at_end"], c["1"]["effects_after_drain"]) == (1, 2), c["1"]
assert (c["13"]["effects_at_end"], c["13"]["effects_after_drain"]) == (0, 0), c["13"]
# the copy makes its effect without a claim: no point, so no late delivery is seen
assert c["1"]["late_deliveries"] == 0 and c["13"]["late_deliveries"] == 0, c
EOF
then
    ok "late-copy: the JSON report gives each case's effects at its end and after the drain (case 1: 1, then 2) and its late deliveries (none seen: the copy claims nothing)"
else
    not_ok "$out/late-copy.check" "late-copy: the JSON report's effects_at_end / effects_after_drain / late_deliveries"
fi

# ---------------------------------------------------------------------
# 3. bad input: one sentence, exit 2, nothing started
# ---------------------------------------------------------------------
spools_before=$(ls "$SIGNOFF_TEST_DIR" | wc -l)
# the job types of the runs started beside (steps 11, 12) are not counted:
# their prefixes, from their banners (printed before any job type is made)
not_bg() {
    local f p
    for f in "$out"/effect-*.log "$out"/batch-*.log; do
        [[ -e $f ]] || continue
        p=$(prefix_of "$f")
        [[ -n $p ]] && printf " AND job_type NOT LIKE '%s\\_%%'" "$p"
    done
}
types_before=$("${psql[@]}" -c "SELECT count(*) FROM idempotency.job_types WHERE job_type LIKE 'signoff\\_%'$(not_bg)")
bad_input() {   # bad_input WHAT SENTENCE RUNNER-ARGS...
    local what=$1 sentence=$2; shift 2
    local log=$out/bad.log
    "$runner" "$@" >"$log" 2>&1
    rc=$?
    if ((rc == 2)) && [[ $(wc -l <"$log") -eq 1 ]] && grep -qxF "$sentence" "$log"; then
        ok "$what: exit 2 and one sentence"
    else
        not_ok "$log" "$what: expected exit 2 and only '$sentence'; got exit $rc"
    fi
}
job=$out/no-worker.job
make_job "$job" "worker=-"
bad_input "a job file without worker" \
    "idempotency-matrix: error: $job: no \"worker\" line (the command that starts one worker process of your app)" --job "$job"
job=$out/unknown.job
make_job "$job" "wokrer=python3 worker.py"
line=$(grep -n '^wokrer' "$job" | cut -d: -f1)
bad_input "a job file with an unknown name" \
    "idempotency-matrix: error: $job line $line: unknown name \"wokrer\" (the names are queue, job_type, worker, enqueue, enqueue_other, effects, effects_sql, policies, lease, timeout, dir, transactional, key, key_command, code, effect_name, cleanup, drain, effect and batch)" --job "$job"
job=$out/twice.job
make_job "$job"
echo "enqueue = /usr/bin/python3 enqueue.py {key} --again" >>"$job"
first=$(grep -n '^enqueue =' "$job" | head -n 1 | cut -d: -f1)
line=$(grep -n '^enqueue =' "$job" | tail -n 1 | cut -d: -f1)
bad_input "a job file with a repeated name" \
    "idempotency-matrix: error: $job line $line: \"enqueue\" is given twice (also on line $first)" --job "$job"
job=$out/noeq.job
make_job "$job"
echo "worker /usr/bin/python3 worker.py" >>"$job"
line=$(wc -l <"$job")
bad_input "a job file with a line without =" \
    "idempotency-matrix: error: $job line $line: \"worker /usr/bin/python3 worker.py\" has no \"=\" (each line is name = value)" --job "$job"
noext=signoff_test_noext_$$
old=signoff_test_old_$$
dbs+=("$noext" "$old")
"${psql[@]}" -d postgres -c "CREATE DATABASE $noext" -c "CREATE DATABASE $old" >/dev/null &&
    "${psql[@]}" -d "$old" -c "CREATE EXTENSION idempotency VERSION '0.2'" >/dev/null ||
    not_ok "" "cannot create the databases $noext and $old"
bad_input "a database without the extension" \
    "idempotency-matrix: error: the idempotency extension is not installed in database \"$noext\" (a sign-off run needs 0.3 or later: CREATE EXTENSION idempotency)" \
    --job "$here/good.job" --dsn "dbname=$noext"
bad_input "a database with the extension 0.2" \
    "idempotency-matrix: error: the idempotency extension in database \"$old\" is version 0.2 (c edition), and a sign-off run needs 0.3 or later (ALTER EXTENSION idempotency UPDATE)" \
    --job "$here/good.job" --dsn "dbname=$old"
if [[ $(ls "$SIGNOFF_TEST_DIR" | wc -l) == "$spools_before" ]] &&
    [[ $("${psql[@]}" -c "SELECT count(*) FROM idempotency.job_types WHERE job_type LIKE 'signoff\\_%'$(not_bg)") == "$types_before" ]]; then
    ok "the refused runs started nothing: no worker, no enqueue, no job type"
else
    not_ok "" "a refused run started something (a spool or a job type appeared)"
fi

# ---------------------------------------------------------------------
# 4. an enqueue command that fails
# ---------------------------------------------------------------------
job=$out/enqueue3.job
make_job "$job" "enqueue=sh -c 'echo the queue is down >&2; exit 3' {key}" "lease=1.5"
log=$out/enqueue3.log
"$runner" --job "$job" --policy hold --cases 1 >"$log" 2>&1
rc=$?
if ((rc == 1)) &&
    grep -qE "^    FAILED: the enqueue command \`sh -c 'echo the queue is down >&2; exit 3' 'signoff-[0-9a-f]+-hold-1-1'\` exited with status 3$" "$log" &&
    grep -qx '      | the queue is down' "$log"; then
    ok "an enqueue command that exits 3: the case fails naming the command, status 3 and its stderr"
else
    not_ok "$log" "an enqueue command that exits 3: expected exit 1, the command, 'exited with status 3' and its stderr"
fi

# ---------------------------------------------------------------------
# 5. a worker whose helper is not armed
# ---------------------------------------------------------------------
job=$out/unarmed.job
make_job "$job" "worker=env -u IDEMPOTENCY_SIGNOFF /usr/bin/python3 worker.py" "lease=1.5" "timeout=5"
log=$out/unarmed.log
start=$SECONDS
"$runner" --job "$job" --policy hold --cases 1,2 >"$log" 2>&1
rc=$?
if ((rc == 1)) && grep -q "the helper is not installed or not armed in that worker" "$log" &&
    grep -qE '^      \| .* worker [0-9]+: started; lease 1.5 s' "$log" &&
    grep -q "Not run: in an earlier case no point at all reached the runner" "$log" &&
    ((SECONDS - start < 30)); then
    ok "a worker without IDEMPOTENCY_SIGNOFF: 'not installed or not armed', the end of its log, case 2 not run ($((SECONDS - start)) s)"
else
    not_ok "$log" "a worker without IDEMPOTENCY_SIGNOFF: expected exit 1, 'not installed or not armed', its log's end and case 2 not run; got exit $rc"
fi

# the same worker behind a page of library warnings: the tail leaves them
# out. Python's (12 lines), and those of Debian 12's Sidekiq 6.4 and its
# redis gem 4.8 as hook 82's worker logs show them (6 lines: a notice of
# two lines twice, its second line indented; one of one line; Sidekiq's own)
{
    for i in 1 2 3 4 5 6 7 8 9 10 11 12; do echo "/usr/lib/python3/dist-packages/kombu/x.py:$i: DeprecationWarning: old API"; done
    for i in 1 2; do
        echo 'Passing the timeout as a positional argument is deprecated, it should be passed as a keyword argument:'
        echo '  redis.brpop("queue:q1", timeout: 2)(called from: /usr/share/rubygems-integration/all/gems/sidekiq-6.4.1/lib/sidekiq/fetch.rb:47:in `block in retrieve_work'"')"
    done
    echo 'Redis#sadd will always return an Integer in Redis 5.0.0. Use Redis#sadd? instead.(called from: /usr/share/rubygems-integration/all/gems/sidekiq-6.4.1/lib/sidekiq/launcher.rb:165:in `block (2 levels) in heartbeat'"')"
    echo "/usr/lib/ruby/vendor_ruby/sidekiq/delay.rb:6: warning: Sidekiq's Delayed Extensions will be removed in Sidekiq 7.0"
} >"$out/noise.txt"
job=$out/noisy.job
make_job "$job" "worker=sh -c 'cat \"$out/noise.txt\"; exec env -u IDEMPOTENCY_SIGNOFF /usr/bin/python3 worker.py'" "lease=1.5" "timeout=5"
log=$out/noisy.log
"$runner" --job "$job" --policy hold --cases 1 >"$log" 2>&1
rc=$?
if ((rc == 1)) && grep -qE '^      \| .* worker [0-9]+: started; lease 1.5 s' "$log" &&
    ! grep -qE '^      \| .*(DeprecationWarning|deprecated|called from|Integer in Redis|Sidekiq 7)' "$log" &&
    grep -qF '(18 lines of library warnings left out: deprecation notices; the whole log is kept)' "$log"; then
    ok "a worker log's tail leaves library deprecation warnings out (Python's, Sidekiq 6.4's and the redis gem's), counted (18), and shows the worker's own lines"
else
    not_ok "$log" "a noisy worker log: expected its tail without the 18 lines of Python's, Sidekiq's and redis' deprecation warnings, and the count; got exit $rc"
fi

# ---------------------------------------------------------------------
# 6. interrupted while a worker is alive (case 9: held at handled)
# ---------------------------------------------------------------------
for sig in INT TERM; do
    job=$out/interrupt.job
    make_job "$job" "lease=1.5"
    log=$out/interrupt-$sig.log
    rm -f "$out/interrupt-$sig".{json,html,xml}
    "$runner" --job "$job" --policy hold --cases 1,9 --json "$out/interrupt-$sig.json" --html "$out/interrupt-$sig.html" \
        --junit "$out/interrupt-$sig.xml" >"$log" 2>"$log.err" &
    pid=$!
    for _ in $(seq 600); do
        grep -q 'hold case 9: waiting for the lease' "$log.err" 2>/dev/null && break
        sleep 0.05
    done
    prefix=$(prefix_of "$log")
    before=$(alive_workers "$prefix")
    kill -"$sig" "$pid"
    wait "$pid"
    rc=$?
    after=$(alive_workers "$prefix")
    left=$(left_in_db "$prefix")
    rundir=$(rundir_of "$log")
    if ((rc == 130)) && [[ -n $prefix && $before -ge 1 && $after == 0 && $left == 0 && -n $rundir && ! -e $rundir ]] &&
        grep -qx 'idempotency-matrix: interrupted; cleaning up' "$log.err"; then
        ok "SIG$sig in case 9 ($before worker alive): exit 130, no worker left, no job type or record of $prefix, its directory removed"
    else
        cat "$log.err" >>"$log"
        not_ok "$log" "SIG$sig: expected exit 130 and nothing left; got exit $rc, workers alive before $before, after $after, rows left '$left', directory '$rundir'"
    fi
    # the reports all the same, marked interrupted, with the case that finished (1, not 9)
    said="by SIG$sig after 1 of 2 cases: the report holds the 1 that finished; the drain of policy hold did not run to its end (an effect made late is not counted)"
    if grep -qxF "INTERRUPTED $said." "$log" && [[ $(tail -n 1 "$log") == "1 passed, 0 failed" ]] &&
        grep -qF "<strong>INTERRUPTED</strong> $said.</p>" "$out/interrupt-$sig.html" &&
        grep -qF "<property name=\"interrupted\" value=\"$said\"/>" "$out/interrupt-$sig.xml" &&
        "$python" - "$out/interrupt-$sig.json" "$said" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["interrupted"] is True and r["settings"]["interrupted"] == sys.argv[2], (r["interrupted"], r["settings"])
assert [(p["policy"], [c["case"] for c in p["cases"]]) for p in r["policies"]] == [("hold", ["1"])], r["policies"]
PY
    then
        ok "SIG$sig: the text, JSON, HTML and JUnit reports written all the same, marked interrupted, with case 1 (finished) and not case 9"
    else
        not_ok "$log" "SIG$sig: expected the four reports marked interrupted with case 1 alone; got exit $rc"
    fi
done

# SIGKILL: the runner cannot clean up; its guardian does. The worker runs
# under a shell that stays (not exec'd): the python process is no child of
# the runner and is not killed with its parent, only with its group.
job=$out/sigkill.job
make_job "$job" "worker=sh -c '/usr/bin/python3 worker.py; exit 0'" "lease=1.5"
log=$out/sigkill.log
"$runner" --job "$job" --policy hold --cases 9 >"$log" 2>"$log.err" &
pid=$!
for _ in $(seq 600); do
    grep -q 'hold case 9: waiting for the lease' "$log.err" 2>/dev/null && break
    sleep 0.05
done
prefix=$(prefix_of "$log")
rundir=$(rundir_of "$log")
before=$(alive_workers "$prefix")
kill -KILL "$pid"
wait "$pid" 2>/dev/null
for _ in $(seq 200); do   # the guardian's work: at most 10 s
    [[ $(alive_workers "$prefix") == 0 && -n $rundir && ! -e $rundir ]] && break
    sleep 0.05
done
after=$(alive_workers "$prefix")
if [[ -n $prefix && $before -ge 1 && $after == 0 && -n $rundir && ! -e $rundir ]]; then
    ok "SIGKILL in case 9 ($before worker alive, not the runner's child): the guardian killed it and removed $rundir"
else
    cat "$log.err" >>"$log"
    not_ok "$log" "SIGKILL: expected no worker and no directory left; workers alive before $before, after $after, directory '$rundir' $( [[ -e $rundir ]] && echo there)"
fi
# what a killed runner leaves in the database, as docs/signoff.md says
"${psql[@]}" -c "DELETE FROM idempotency.operations WHERE job_type LIKE '${prefix}\\_%'; DELETE FROM idempotency.job_types WHERE job_type LIKE '${prefix}\\_%'" >/dev/null

# ---------------------------------------------------------------------
# 7. the other effect sources
# ---------------------------------------------------------------------
job=$out/handled.job
make_job "$job" "effects=-" "policies=hold" "lease=1.5" \
    "cleanup=sh -c 'echo cleaned >\"\$SIGNOFF_TEST_DIR/cleaned-\$IDEMPOTENCY_SIGNOFF_RUN\"'"
log=$out/handled.log
"$runner" --job "$job" --cases 1,5,6 --json "$out/handled.json" >"$log" 2>&1
rc=$?
if ((rc == 0)) && [[ $(tail -n 1 "$log") == "3 passed, 0 failed" ]] &&
    grep -qx 'effects: the handled reports (handler runs that returned; not proof that an effect landed)' "$log" &&
    "$python" -c 'import json,sys; assert json.load(open(sys.argv[1]))["signoff"]["effects_source"] == "handled reports"' "$out/handled.json"; then
    ok "no effects line: the handled reports are counted, and the report says so (cases 1, 5, 6 hold)"
else
    not_ok "$log" "no effects line: expected exit 0, '3 passed, 0 failed' and the handled reports named; got exit $rc"
fi
run=$(prefix_of "$log"); run=${run#signoff_}
if [[ -n $run && -e $SIGNOFF_TEST_DIR/cleaned-$run ]] && grep -q '^cleanup: `sh -c .*` exited 0$' "$log" &&
    "$python" -c 'import json,sys; s=json.load(open(sys.argv[1]))["settings"]; assert s["cleanup"].endswith("exited 0"), s' "$out/handled.json"; then
    ok "the job file's cleanup ran at the end, with the run's id; the report says it exited 0"
else
    not_ok "$log" "the cleanup command: not run, or not reported (run '$run')"
fi
# effects_sql: the server reads the effects file; the key names the run
sql="SELECT count(*) FROM pg_catalog.regexp_split_to_table(pg_catalog.pg_read_file('$SIGNOFF_TEST_DIR/spool-' || pg_catalog.split_part(\$1, '-', 2) || '/effects', 0, 100000000, true), E'\\n') AS l WHERE pg_catalog.split_part(l, ' ', 1) = \$1"
job=$out/sql.job
make_job "$job" "effects=-" "effects_sql=$sql" "policies=lookup" "lease=1.5" "cleanup=sh -c 'echo the queue is gone >&2; exit 4'"
log=$out/sql.log
"$runner" --job "$job" --cases 5,6 --json "$out/sql.json" >"$log" 2>&1
rc=$?
if ((rc == 0)) && [[ $(tail -n 1 "$log") == "2 passed, 0 failed" ]] && grep -q '^effects: the query SELECT count' "$log" &&
    grep -q 'verify (not found)' "$log" && grep -q 'verify (found)' "$log" &&
    "$python" -c 'import json,sys; assert json.load(open(sys.argv[1]))["signoff"]["effects_source"] == "sql"' "$out/sql.json"; then
    ok "effects_sql under lookup: cases 5 and 6 hold (verify not found, then found), the report names the query"
else
    not_ok "$log" "effects_sql under lookup: expected exit 0 and '2 passed, 0 failed'; got exit $rc"
fi
if ((rc == 0)) && grep -q '^cleanup: FAILED: the cleanup command `sh -c .*` exited with status 4 .*the queue is gone' "$log"; then
    ok "a cleanup that exits 4: reported with its status and stderr; the cases' exit status stays 0"
else
    not_ok "$log" "a failing cleanup: expected it reported and exit 0; got exit $rc"
fi

# ---------------------------------------------------------------------
# 8. a transactional job (transactional = yes): its cases, with case 8
# ---------------------------------------------------------------------
"${psql[@]}" -c 'DROP TABLE IF EXISTS public.signoff_tx_effects;
                 CREATE TABLE public.signoff_tx_effects (operation_key text NOT NULL, attempt int NOT NULL, pid int NOT NULL)' ||
    die "cannot create public.signoff_tx_effects"
txsql='SELECT count(*) FROM public.signoff_tx_effects WHERE operation_key = $1'
job=$out/tx.job
make_job "$job" "worker=/usr/bin/python3 worker.py --transactional" "effects=-" "effects_sql=$txsql" \
    "transactional=yes" "policies=hold" "lease=1.5"
log=$out/tx.log
"$runner" --job "$job" --json "$out/tx.json" >"$log" 2>&1
rc=$?
if ((rc == 0)) && [[ $(tail -n 1 "$log") == "5 passed, 0 failed" ]] &&
    "$python" - "$out/tx.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
cases = {c["case"]: c for c in r["policies"][0]["cases"]}
assert list(cases) == ["1", "2", "4", "8", "11"], list(cases)
c8 = cases["8"]
assert c8["observed"]["record"] == "none, then completed #1", c8["observed"]
assert c8["observed"]["verdicts"] == "run (killed in transaction), run", c8["observed"]
assert c8["observed"]["effects"] == 1, c8["observed"]
PY
then
    ok "transactional = yes: exactly cases 1 2 4 8 11 run and hold; case 8: none, then completed #1, one row"
else
    not_ok "$log" "transactional = yes: expected exit 0, '5 passed, 0 failed', cases 1 2 4 8 11; got exit $rc"
fi
job=$out/tx-broken.job
make_job "$job" "worker=/usr/bin/python3 worker.py --transactional --broken commit-first" "effects=-" \
    "effects_sql=$txsql" "transactional=yes" "policies=hold" "lease=1.5"
log=$out/tx-broken.log
"$runner" --job "$job" --cases 8 --json "$out/tx-broken.json" >"$log" 2>&1
rc=$?
if ((rc == 1)) && [[ $(failing_cases "$out/tx-broken.json") == "hold:8" ]] &&
    grep -q "FAILED: the record was claimed #1 (young) after the worker died at handled: the claim (or the completion) committed on its own, before the handled point, so the effect is not in the claim's transaction" "$log"; then
    ok "transactional = yes with a claim committed on its own (--broken commit-first): case 8 fails, saying so"
else
    not_ok "$log" "commit-first: expected exit 1, case 8 failing with the sentence; got exit $rc, failing '$(failing_cases "$out/tx-broken.json")'"
fi
job=$out/tx-nosql.job
make_job "$job" "transactional=yes"
line=$(grep -n '^transactional' "$job" | cut -d: -f1)
bad_input "transactional = yes without effects_sql" \
    "idempotency-matrix: error: $job line $line: transactional = yes needs effects_sql (the query that counts the rows your job writes in the completion's transaction)" --job "$job"
"${psql[@]}" -c 'DROP TABLE IF EXISTS public.signoff_tx_effects' >/dev/null

# ---------------------------------------------------------------------
# 9. keys: the run's key inside the operation key, declared mappings, and
#    a key the run cannot map (a message id)
# ---------------------------------------------------------------------
check_keys() {   # check_keys NAME WHAT WORKER-KEY-MODE [NAME=VALUE...]
    local name=$1 what=$2 mode=$3; shift 3
    local job=$out/key-$name.job log=$out/key-$name.log
    make_job "$job" "worker=/usr/bin/python3 worker.py --key $mode" "policies=hold" "lease=1.5" "$@"
    "$runner" --job "$job" --cases 1,2,5,6,9 >"$log" 2>&1
    rc=$?
    if ((rc == 0)) && [[ $(tail -n 1 "$log") == "5 passed, 0 failed" ]]; then
        ok "keys, $what: cases 1 2 5 6 9 hold under hold"
    else
        not_ok "$log" "keys, $what: expected exit 0 and '5 passed, 0 failed'; got exit $rc"
    fi
}
check_keys prefix "a prefix (refund:{key}), no setting" "format:refund:{key}" "effect_name=refund"
if grep -qE '^✓  5 +worker dies after the claim, before the refund ' "$out/key-prefix.log" &&
    grep -q '^Policy hold: hold for a person$' "$out/key-prefix.log" &&
    grep -q '^Policy summary: effects (refund) in the uncertain cases (5: killed after the claim, before the refund; 6: killed after the refund)$' "$out/key-prefix.log" &&
    ! grep -qiE 'order|email' "$out/key-prefix.log"; then
    ok "effect_name = refund: the titles and the summary name the refund, and the report says neither order nor email"
else
    not_ok "$out/key-prefix.log" "effect_name = refund: the report's words"
fi
check_keys suffix "a suffix ({key}/v2), no setting" "format:{key}/v2"
check_keys template "a template (key = order{key}x)" "format:order{key}x" "key=order{key}x"
check_keys hash "a hash (key_command)" "hash" \
    "key_command=sh -c 'printf %s \"refund:\$1\" | sha256sum | cut -c1-16' - {key}"
# a key inside another word is no prefix: the run cannot map it without key =
job=$out/key-unmapped.job
log=$out/key-unmapped.log
make_job "$job" "worker=/usr/bin/python3 worker.py --key format:order{key}x" "policies=hold" "lease=1.5"
start=$SECONDS
"$runner" --job "$job" --cases 1,2 --json "$out/key-unmapped.json" >"$log" 2>&1
rc=$?
secs=$((SECONDS - start))
if ((rc == 1)) && ((secs < 20)) &&
    grep -q 'FAILED: a worker claimed under the key "ordersignoff-[0-9a-f]*-hold-1-1x" (point claimed), which the run cannot map to its key "signoff-[0-9a-f]*-hold-1-1": the operation key must be the run.s key, contain it as a prefix or suffix' "$log" &&
    grep -q 'The same message sent again was claimed under the same key' "$log" &&
    grep -q 'Not run: the worker claims under keys the run cannot map' "$log"; then
    ok "keys, a key made otherwise without key =: case 1 fails in $secs s naming the key seen and the key expected, the same key again, case 2 not run"
else
    not_ok "$log" "keys, unmapped: expected exit 1 within 20 s, the sentence naming both keys, and case 2 not run; got exit $rc in $secs s"
fi
job=$out/key-msgid.job
log=$out/key-msgid.log
make_job "$job" "worker=/usr/bin/python3 worker.py --key message-id" "policies=hold" "lease=1.5"
start=$SECONDS
"$runner" --job "$job" --cases 1 >"$log" 2>&1
rc=$?
secs=$((SECONDS - start))
if ((rc == 1)) && ((secs < 20)) &&
    grep -q 'FAILED: a worker claimed under the key "msg-' "$log" &&
    grep -q 'FAILED: the key changes between deliveries of one message ("msg-[^"]*", then "msg-[^"]*"): it is a message id' "$log"; then
    ok "keys, a message id: case 1 fails in $secs s, naming the key a message id"
else
    not_ok "$log" "keys, message id: expected exit 1 within 20 s and the message-id sentence; got exit $rc in $secs s"
fi
# a key that is not the declared one (key = ship:{key}; the worker claims
# ship:{key}:0, the queue's retry count in it): case 1 fails at once, naming
# both keys and what differs, and waits for no timeout; case 2 not run
job=$out/key-declared.job
log=$out/key-declared.log
make_job "$job" "worker=/usr/bin/python3 worker.py --key format:ship:{key}:0" "key=ship:{key}" "policies=hold" "lease=1.5"
"$runner" --job "$job" --cases 1,2 --json "$out/key-declared.json" >"$log" 2>&1
rc=$?
if ((rc == 1)) &&
    grep -qE '^    Diagnosis: the worker \(pid [0-9]+\) claimed the run.s key signoff-[0-9a-f]+-hold-1-1 under "ship:signoff-[0-9a-f]+-hold-1-1:0", but the job file declares the operation key "ship:signoff-[0-9a-f]+-hold-1-1" \(":0" added at the end: a number that counts' "$log" &&
    grep -q 'Not run: the worker claims under keys the run cannot map' "$log" && ! grep -q 'no worker reached' "$log"; then
    ok "keys, a claim under another key than the declared one: case 1 fails at once naming both and what differs, case 2 not run"
else
    not_ok "$log" "keys, declared key not claimed: expected exit 1, the Diagnosis naming both keys, no timeout waited, case 2 not run; got exit $rc"
fi
job=$out/key-both.job
make_job "$job" "key=refund:{key}" "key_command=echo {key}"
line=$(grep -n '^key_command' "$job" | cut -d: -f1)
bad_input "key and key_command both" \
    "idempotency-matrix: error: $job line $line: give key or key_command, not both (key is on line $((line - 1)))" --job "$job"
job=$out/key-nokey.job
make_job "$job" "key=refund"
line=$(grep -n '^key =' "$job" | cut -d: -f1)
bad_input "key without {key}" \
    "idempotency-matrix: error: $job line $line: \"key\" has no {key} (the operation key your code claims, as a template with {key})" --job "$job"

# ---------------------------------------------------------------------
# 10. what was signed: the job file and the code by sha256, --verify, --junit
# ---------------------------------------------------------------------
mkdir -p "$out/code/lib"
cp "$here/worker.py" "$here/dirqueue.py" "$out/code/"
echo "# a module of the job" >"$out/code/lib/util.py"
job=$out/signed.job
# a list takes commas and blanks alike: a comma, a comma and a blank, a blank
make_job "$job" "code=$out/code/worker.py,$out/code/*.py, $out/code/lib $out/code/{lib,lib}" "policies=hold" "lease=1.5"
log=$out/signed.log
"$runner" --job "$job" --cases 1 --json "$out/signed.json" --junit "$out/signed.xml" >"$log" 2>&1
rc=$?
want_code=$(cd / && sha256sum "$out/code/dirqueue.py" "$out/code/lib/util.py" "$out/code/worker.py" | sha256sum | cut -d' ' -f1)
if ((rc == 0)) && "$python" - "$out/signed.json" "$job" "$want_code" "$here" <<'PY'
import hashlib, json, subprocess, sys
r = json.load(open(sys.argv[1]))
s = r["signoff"]
assert s["job_file_sha256"] == hashlib.sha256(open(sys.argv[2], "rb").read()).hexdigest(), s["job_file_sha256"]
assert s["code_sha256"] == sys.argv[3], (s["code_sha256"], sys.argv[3])
assert [f["path"].rsplit("/code/", 1)[1] for f in s["code_files"]] == ["dirqueue.py", "lib/util.py", "worker.py"], s["code_files"]
git = subprocess.run(["git", "-C", sys.argv[4], "rev-parse", "HEAD"], capture_output=True, text=True)
assert s["git_commit"] == (git.stdout.strip() if git.returncode == 0 else None), (s["git_commit"], git.stdout)
PY
then
    ok "the report records the job file's sha256, each code file's and the code's (as sha256sum FILES | sha256sum), and git's commit"
else
    not_ok "$log" "the signed digests in the JSON report (exit $rc)"
fi
if "$python" - "$out/signed.xml" <<'PY'
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
assert root.tag == "testsuites" and root.get("tests") == "1" and root.get("failures") == "0", root.attrib
cases = root.findall("./testsuite/testcase")
assert [c.get("name") for c in cases] == ["case 1: first delivery"], [c.get("name") for c in cases]
assert root.find("./testsuite").get("name") == "policy hold"
props = {p.get("name"): p.get("value") for p in root.findall("./testsuite/properties/property")}
assert props["wrapper"] == "plain", props
assert props["helpers"].startswith("pg_idempotency ") and ", the plain functions, in 1 worker process" in props["helpers"], props
PY
then
    ok "--junit: JUnit XML, a testsuite per policy and a testcase per case, its properties the helpers and the wrapper (plain)"
else
    not_ok "$out/signed.xml" "--junit: not the expected JUnit XML"
fi
verify() {   # verify WANT-RC PATTERN WHAT
    local want=$1 pattern=$2 what=$3
    "$runner" --verify "$out/signed.json" >"$out/verify.log" 2>&1
    local rc=$?
    if ((rc == want)) && grep -qE "$pattern" "$out/verify.log"; then
        ok "--verify, $what: exit $rc, $(head -n 1 "$out/verify.log" | cut -c1-80)"
    else
        not_ok "$out/verify.log" "--verify, $what: expected exit $want and /$pattern/; got exit $rc"
    fi
}
verify 0 '^unchanged: the job file .* and 3 code files' "nothing changed"
echo "# changed" >>"$out/code/worker.py"
verify 1 '^changed: .*/code/worker.py \(sha256' "a code file changed"
echo "x = 1" >"$out/code/new.py"
rm "$out/code/lib/util.py"
verify 1 '^added: .*/code/new.py$' "a file added"
verify 1 '^removed: .*/code/lib/util.py$' "a file removed"
echo "# a comment" >>"$job"
verify 1 '^changed: the job file .*signed.job' "the job file changed"
"$runner" --verify "$out/no-such-report.json" >"$out/verify.log" 2>&1
rc=$?
if ((rc == 2)) && [[ $(wc -l <"$out/verify.log") -eq 1 ]]; then
    ok "--verify of a report that is not there: exit 2, one sentence"
else
    not_ok "$out/verify.log" "--verify of a missing report: expected exit 2 and one sentence; got $rc"
fi
"$runner" --verify "$out/good.json" >"$out/verify.log" 2>&1
rc=$?
if ((rc == 0)) && grep -q '^unchanged: the job file .*good.job .* and 0 code files' "$out/verify.log"; then
    ok "--verify of a report whose job file names no code: the job file alone, unchanged"
else
    not_ok "$out/verify.log" "--verify of good.json: expected exit 0 and 'unchanged'; got $rc"
fi
# what the runner writes reads back with python3 -m json.tool, jq and the
# runner itself, on a report whose job file name, queue and code file names
# hold quotes, backslashes, control characters and non-ASCII text; --verify
# reads the report after jq ., jq -c and Python's json.dump(indent=2) (which
# writes \u escapes, surrogate pairs for the emoji) and names each change
wdir=$out/$'sig-w\xc3\xabird "code" \\ dir\tx'
mkdir -p "$wdir"
wfiles=($'a "quoted" \\ file.py' $'ctrl\x01char.py' $'tab\there.py' $'\xe6\x97\xa5\xe6\x9c\xac-\xf0\x9f\x98\x80.py')
for f in "${wfiles[@]}"; do echo "# $f" >"$wdir/$f"; done
wjob=$out/$'sig "w\xc3\xabird" \\ job\t\x02.job'
make_job "$wjob" "code=$out/sig-w*" "policies=hold" "lease=1.5" $'queue=dir"queue\\ \xc3\xbc\x01'
log=$out/weird.log
"$runner" --job "$wjob" --cases 1 --json "$out/weird.json" >"$log" 2>&1
rc=$?
if ((rc == 0)) && "$python" -m json.tool "$out/weird.json" >/dev/null 2>>"$log" &&
    jq -e . "$out/weird.json" >/dev/null 2>>"$log" &&
    "$python" - "$out/weird.json" "$wjob" "$wdir" "${wfiles[@]}" >>"$log" 2>&1 <<'PY'
import json, os, sys
r = json.load(open(sys.argv[1], encoding="utf-8"))
s = r["signoff"]
assert s["job_file"] == sys.argv[2], (s["job_file"], sys.argv[2])
assert s["job_file_path"] == os.path.realpath(sys.argv[2]), (s["job_file_path"], sys.argv[2])
assert s["queue"] == 'dir"queue\\ \u00fc\x01', repr(s["queue"])
want = sorted(os.path.join(sys.argv[3], f) for f in sys.argv[4:])
assert [f["path"] for f in s["code_files"]] == want, ([f["path"] for f in s["code_files"]], want)
PY
then
    ok "a report with quotes, backslashes, control characters and non-ASCII in the job file's name, its queue and the code's names reads back with python3 -m json.tool, jq and Python, each name as given"
else
    not_ok "$log" "the report of the job with odd names: expected exit 0 and JSON that reads back as given; got exit $rc"
fi
jq . "$out/weird.json" >"$out/weird-jq.json"
jq -c . "$out/weird.json" >"$out/weird-jqc.json"
"$python" -c 'import json, sys; json.dump(json.load(open(sys.argv[1])), open(sys.argv[2], "w"), indent=2)' \
    "$out/weird.json" "$out/weird-py.json"
reformatted=(weird.json weird-jq.json weird-jqc.json weird-py.json)
verified=0
for r in "${reformatted[@]}"; do
    "$runner" --verify "$out/$r" >"$out/verify-$r.log" 2>&1 &&
        grep -q '^unchanged: the job file .* and 4 code files' "$out/verify-$r.log" && verified=$((verified + 1))
done
if ((verified == 4)); then
    ok "--verify of that report as written, after jq ., after jq -c and after json.dump(indent=2): exit 0, unchanged"
else
    not_ok "$out/verify-weird-py.json.log" "--verify of the reformatted reports: $verified of 4 exit 0 'unchanged'"
fi
echo "# changed" >>"$wdir/${wfiles[0]}"
echo "# changed" >>"$wdir/${wfiles[3]}"
rm "$wdir/${wfiles[1]}"
verified=0
for r in "${reformatted[@]}"; do
    "$runner" --verify "$out/$r" >"$out/verify-$r.log" 2>&1
    rc=$?
    ((rc == 1)) && [[ $(wc -l <"$out/verify-$r.log") -eq 3 ]] &&
        grep -qF "changed: $wdir/${wfiles[0]} (sha256 " "$out/verify-$r.log" &&
        grep -qF "changed: $wdir/${wfiles[3]} (sha256 " "$out/verify-$r.log" &&
        grep -qxF "removed: $wdir/${wfiles[1]}" "$out/verify-$r.log" && verified=$((verified + 1))
done
if ((verified == 4)); then
    ok "--verify of each of the four after two code files changed and one was removed: exit 1, each file named as it is"
else
    not_ok "$out/verify-weird-py.json.log" "--verify of the reformatted reports after changes: $verified of 4 exit 1 naming the three files"
fi
printf '{"format": "idempotency-signoff/2",\n "signoff": {"job_file_path": "/a.job" "directory": "/"}}\n' >"$out/broken.json"
"$runner" --verify "$out/broken.json" >"$out/verify.log" 2>&1
rc=$?
if ((rc == 2)) && [[ $(wc -l <"$out/verify.log") -eq 1 ]] &&
    grep -qF 'is not JSON (line 2, column 40: Expected "," or "}", but found ""directory"")' "$out/verify.log"; then
    ok "--verify of a report that is not JSON: exit 2, one sentence with the line, the column and the parser's words"
else
    not_ok "$out/verify.log" "--verify of broken JSON: expected exit 2 and one sentence naming where; got $rc"
fi
job=$out/drain.job
make_job "$job" "drain=soon"
line=$(grep -n '^drain' "$job" | cut -d: -f1)
bad_input "a drain that is no number" \
    "idempotency-matrix: error: $job line $line: drain \"soon\" is not a number of seconds between 0 and 3600" --job "$job"
job=$out/effect-name.job
make_job "$job" "effect_name=refund; rm -rf"
line=$(grep -n '^effect_name' "$job" | cut -d: -f1)
bad_input "an effect_name that is not a word or two" \
    "idempotency-matrix: error: $job line $line: effect_name \"refund; rm -rf\" is not a word or two (letters, digits, blanks, - and _; at most 40)" --job "$job"
job=$out/nocode.job
make_job "$job" "code=no-such-*.py"
line=$(grep -n '^code' "$job" | cut -d: -f1)
bad_input "code that matches no file" \
    "idempotency-matrix: error: $job line $line: code: \"no-such-*.py\" matches no file in $here" --job "$job"

# ---------------------------------------------------------------------
# 11. faults at the effect: the run's own endpoints (effect = http, smtp)
# ---------------------------------------------------------------------
wait "${bg_pids[@]}"
secs=$((SECONDS - bg_start))
# check_effect NAME RC FAILING SENTENCE WHAT: exit status, the failing
# cases ("policy:case ..."), a sentence of the text report
check_effect() {
    local name=$1 want_rc=$2 want_failing=$3 sentence=$4 what=$5
    local log=$out/effect-$name.log rc failing
    rc=$(cat "$out/effect-$name.rc")
    failing=$(failing_cases "$out/effect-$name.json" 2>/dev/null)
    if [[ $rc == "$want_rc" && $failing == "$want_failing" ]] && { [[ -z $sentence ]] || grep -qF -- "$sentence" "$log"; }; then
        ok "$what"
    else
        not_ok "$log" "$what: expected exit $want_rc, failing '$want_failing'${sentence:+ and \"$sentence\"}; got exit $rc, failing '$failing'"
    fi
}
check_effect http-good 0 "" "effects: counted by the run's http endpoint at http://127.0.0.1:" \
    "effect = http, a job that fails a refusal, gives up on no answer and completes a refusal for good: cases 14-19 hold under hold, retry, skip and lookup (a GET looks the refund up) ($secs s for all the runs of this step)"
if "$python" - "$out/effect-http-good.json" >"$out/effect-http-good.check" 2>&1 <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["passed"] == 24 and r["signoff"]["effects_source"] == "http endpoint", (r["passed"], r["signoff"])
got = {p["policy"]: {c["case"]: (c["observed"]["effects"], c["observed"]["record"]) for c in p["cases"]} for p in r["policies"]}
assert got["hold"]["15"] == (1, "claimed #1 (stale)"), got["hold"]
assert got["retry"]["15"] == (2, "completed #2"), got["retry"]
assert got["skip"]["15"] == (1, "skipped #1"), got["skip"]
assert got["lookup"]["15"] == (1, "completed #2"), got["lookup"]
for p in got.values():
    assert p["14"] == (1, "completed #2") and p["18"] == (1, "completed #2"), p
    assert p["16"] == (0, "completed #1") and p["17"] == (1, "completed #1"), p
EOF
then
    ok "effect = http: the endpoint's counts per policy (case 15 as case 6: hold 1, retry 2, skip 1, lookup 1; 16 no refund)"
else
    not_ok "$out/effect-http-good.check" "effect = http: the JSON report's counts"
fi
check_effect smtp-good 0 "" "effects: counted by the run's smtp endpoint at 127.0.0.1:" \
    "effect = smtp: cases 1, 2 and 14-18 hold under retry (451, no answer, 550, a late 250, no listener)"
check_effect swallow 1 "retry:14 retry:18" "it completed after the provider refused, so the refund was never made" \
    "a job that swallows the provider's errors fails 14 and 18 (16, a refusal for good, may be completed), saying it completed after the provider refused"
check_effect smtp-swallow 1 "hold:14" "the provider refused it for now (SMTP 451), yet the job completed the operation" \
    "the same through SMTP: a 451 swallowed fails case 14"
check_effect no-timeout 1 "hold:15" "with no answer and the job never gave up: no client timeout" \
    "a call without a client timeout fails case 15, saying how long it hung"
check_effect release-on-timeout 1 "hold:15" "the job released the claim after a call that may have reached the provider" \
    "a job that releases its claim after a timeout fails case 15: the next delivery makes the refund again"
check_effect short-timeout 1 "hold:17 skip:17" "before the provider answered (in 4 s here): an unknown outcome, which under hold pages a person" \
    "a client timeout (1.5 leases) shorter than case 17's provider (two leases): judged by the policy, hold and skip fail it"
if grep -q "an unknown outcome, which under skip skips the operation for good whether or not the provider made it" "$out/effect-short-timeout.log" &&
    grep -q "^✓  17 .*completed #2  *run (gave up), run  *sent again after the lease: a duplicate" "$out/effect-short-timeout.log" &&
    grep -q "^✓  17 .*completed #2  *run (gave up), verify (found)  *looked up: found, not sent again" "$out/effect-short-timeout.log"; then
    ok "the same under retry and lookup: 17 holds as 15 gives (retry: the duplicate it accepts; lookup: found), skip's sentence"
else
    not_ok "$out/effect-short-timeout.log" "short-timeout: expected 17 to hold under retry (2, completed #2) and lookup (verify found), and skip's sentence"
fi
check_effect retry-forever 1 "retry:16" "the job retried a permanent refusal:" \
    "a job that retries a refusal for good fails case 16, naming the requests"
check_effect no-key 1 "retry:1" "named none of the run's keys" \
    "a request that names no key fails the case: the run cannot tell whose refund it was"
check_effect shared-client 1 "retry:19" "beyond the policy" \
    "a job that shares its client's key header between keys fails the storm (19) only: one key's refunds counted under another's"
if grep -q "lost 1 refund" "$out/effect-shared-client.log"; then
    ok "the storm names the key that lost its refund"
else
    not_ok "$out/effect-shared-client.log" "shared-client: the storm does not name a lost refund"
fi
job=$out/effect.job
make_job "$job" "effect=ftp"
line=$(grep -n '^effect =' "$job" | cut -d: -f1)
bad_input "an effect that is neither http nor smtp" \
    "idempotency-matrix: error: $job line $line: effect \"ftp\" is not http or smtp (the run's own endpoint your job sends its effect to)" --job "$job"
make_job "$job" "effect=http"
line=$(grep -n '^effects =' "$job" | cut -d: -f1)
eline=$(grep -n '^effect =' "$job" | cut -d: -f1)
bad_input "effect beside an effects command" \
    "idempotency-matrix: error: $job line $line: give effect or effects, not both: with effect = http the run's endpoint counts the effects (effect is on line $eline)" --job "$job"
make_job "$job" "effects=-" "effect=smtp" "policies=lookup"
bad_input "the lookup policy with effect = smtp" \
    "idempotency-matrix: error: the policy lookup needs a provider to look the operation up at; the run's SMTP endpoint has none ($job: effect = smtp): leave lookup out, or use effect = http, whose endpoint answers a GET" --job "$job"

# ---------------------------------------------------------------------
# 12. a batch handler (worker.py --batch 10, batch = yes): case 20
# ---------------------------------------------------------------------
rc=$(cat "$out/batch-good.rc")
if ((rc == 0)) && grep -q "^✓  20 .*completed #1, completed #1, completed #2 .*run, run, ID002, completed, run, released, run" "$out/batch-good.log" &&
    grep -q "The 4 messages were enqueued while no worker ran; one worker (pid [0-9]*) took them" "$out/batch-good.json"; then
    ok "batch = yes: case 20 judges each key of one receive on its own (run; completed and ID002; released, then run)"
else
    not_ok "$out/batch-good.log" "batch = yes, a good batch handler: expected exit 0 and case 20 as the table gives; got exit $rc"
fi
rc=$(cat "$out/batch-drop.rc")
got=$(failing_cases "$out/batch-drop.json" 2>&1)
if ((rc == 1)) && [[ $got == "retry:20" ]]; then
    ok "a batch handler that drops the whole receive for one key's ID002 fails case 20 (the other keys lost)"
else
    not_ok "$out/batch-drop.log" "batch-drop: expected exit 1, failing 'retry:20'; got exit $rc, failing '$got'"
fi
job=$out/batch.job
make_job "$job" "batch=sometimes"
line=$(grep -n '^batch' "$job" | cut -d: -f1)
bad_input "a batch that is neither yes nor no" \
    "idempotency-matrix: error: $job line $line: batch \"sometimes\" is not yes or no" --job "$job"

# ---------------------------------------------------------------------
# 14. a redelivery that comes after the lease in 7a/7b (worker.py
# --slow-redelivery: a message seen before waits lease + 0.5 s): the
# runner keeps the dead claim young, so the case holds on its first try; a
# runner stopped past the lease before the claim (--slow-runner
# --slow-redelivery always): that try tested nothing and the case runs
# again under new keys, at most 3 times; a runner that reads the record
# late (--slow-runner), or only after the worker's own retry was judged
# after the lease (enqueue.py --stop-runner-after-in-progress), tests the
# case all the same
# ---------------------------------------------------------------------
# the notes of a case of a JSON report, one per line
case_notes() {   # case_notes REPORT POLICY CASE
    "$python" - "$@" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
for p in r["policies"]:
    for c in p["cases"]:
        if p["policy"] == sys.argv[2] and c["case"] == sys.argv[3]:
            print("\n".join(c["notes"]))
EOF
}
# the exit status, failing cases and notes of case CASE under POLICY of
# the background run NAME ($out/NAME.rc, $out/NAME.json): rc, got, notes
run_outcome() {   # run_outcome NAME POLICY CASE
    rc=$(cat "$out/$1.rc")
    got=$(failing_cases "$out/$1.json" 2>&1)
    notes=$(case_notes "$out/$1.json" "$2" "$3" 2>&1)
}
young="^From the death until the case had read the record the runner kept the dead claim's lease running \(extend_lease\(\) with attempt 1, [0-9]+ times?, as the worker's heartbeat would have\), so that the message's return was inside the lease however slow the machine"
for name in once always; do
    rc=$(cat "$out/slow-$name.rc")
    got=$(failing_cases "$out/slow-$name.json" 2>&1)
    policy=retry; [[ $name == always ]] && policy=hold
    notes=$(case_notes "$out/slow-$name.json" $policy 7a 2>&1)
    if ((rc == 0)) && [[ -z $got ]] && grep -qE "$young\.$" <<<"$notes" &&
        grep -qE "^The message came again [0-9.]+ s after the death: pid [0-9]+ was judged in_progress, and the attempt is still 1\.$" <<<"$notes" &&
        ! grep -q "^Try 1 " <<<"$notes"; then
        ok "a redelivery slower than the lease ($name): the runner keeps the dead claim young, 7a holds on its first try"
    else
        not_ok "$out/slow-$name.log" "--slow-redelivery $name: expected exit 0, no failing case, no second try, the note on the claim kept young; got exit $rc, failing '$got', notes: $notes"
    fi
done
run_outcome slow-late hold 7a
if ((rc == 1)) && [[ $got == "hold:7a" ]] && grep -qE "^Try 1 under signoff-[0-9a-f]+-hold-7a-1 did not test" <<<"$notes" &&
    grep -qE "^Try 2 under signoff-[0-9a-f]+-hold-7a-try2-1 did not test" <<<"$notes" &&
    grep -qE "^FAILED: the message came again [0-9.]+ s after the death and was judged held \(attempt 1\), as after the lease: the runner got to it only [0-9.]+ s after the lease had run out by the database's clock, in each of 3 tries: the machine stopped the runner for longer than the lease \($slow_lease seconds\), so it could not keep the dead claim young until the message came again; give a longer lease in the job file$" <<<"$notes"; then
    ok "a runner stopped past the lease before the redelivery's claim, every time: 7a fails after 3 tries, saying so and to give a longer lease"
else
    not_ok "$out/slow-late.log" "--slow-runner --slow-redelivery always: expected exit 1, failing 'hold:7a' after 3 tries; got exit $rc, failing '$got', notes: $notes"
fi
# the runner stopped between the in_progress verdict and its read of the
# record (worker.py --slow-runner): the record is the one the redelivery
# found, the case holds on its first try, and a note says why
rc=$(cat "$out/slow-runner.rc")
got=$(failing_cases "$out/slow-runner.json" 2>&1)
late="^The runner read the record only after the $slow_lease seconds lease had run out \([0-9.]+ s after the death the redelivery's report arrived\); the claim was still attempt 1's, and young when the message came again, as the in_progress verdict gives.$"
notes_7a=$(case_notes "$out/slow-runner.json" hold 7a 2>&1)
notes_7b=$(case_notes "$out/slow-runner.json" hold 7b 2>&1)
if ((rc == 0)) && [[ -z $got ]] && grep -qE "$late" <<<"$notes_7a" && grep -qE "$late" <<<"$notes_7b" &&
    ! grep -q "^Try 1 " <<<"$notes_7a$notes_7b" && grep -q '^✓  7a .*claimed #1 (young)' "$out/slow-runner.log"; then
    ok "a runner stopped past the lease after the in_progress verdict: 7a and 7b hold on their first try, noting the late read"
else
    not_ok "$out/slow-runner.log" "--slow-runner: expected exit 0, 7a and 7b holding with the late-read note; got exit $rc, failing '$got', notes: $notes_7a $notes_7b"
fi
# the worker's own in_progress retry judged after the lease, before the
# runner read anything (issue 43: Celery's 7a under skip, "skipped #1 ≠
# claimed #1 (young)" on a loaded machine): the case settles as 5 (6) gives
rc=$(cat "$out/settle.rc")
got=$(failing_cases "$out/settle.json" 2>&1)
bad=""
for pc in "skip 7a 5 0 skipped #1" "skip 7b 6 1 skipped #1" "retry 7a 5 1 completed #2" "retry 7b 6 2 completed #2"; do
    read -r policy case as n rec <<<"$pc"
    notes=$(case_notes "$out/settle.json" "$policy" "$case" 2>&1)
    grep -qE "^After the lease had run out the message came once more: pid [0-9]+ was judged [a-z]+ \(attempt [0-9]+\) by the database, which answers a claim whose lease ran out with the policy\. The case settles as case $as gives under $policy; expected then: $n [a-z ]+, $rec, run \(killed\), in_progress, [a-z]+\.$" <<<"$notes" ||
        bad+=" $policy:$case"
done
if ((rc == 0)) && [[ -z $got && -z $bad ]]; then
    ok "the worker's own in_progress retry judged after the lease before the runner looked (skip, retry): 7a and 7b settle as 5 and 6 give"
else
    not_ok "$out/settle.log" "enqueue.py --stop-runner-after-in-progress: expected exit 0, 7a and 7b settling as 5 and 6; got exit $rc, failing '$got', without the note:$bad"
fi
# a worker stalled past the lease in case 12: not the job's fault when its
# heartbeat beats every half lease or sooner
stalled="the worker's heartbeat extends the lease every [0-9.]+ s or sooner, yet once it did not run for [0-9.]+ s, longer than the lease, and stale_claims\(\) listed the claim meanwhile: the machine stalled the worker"
run_outcome stall-once hold 12
if ((rc == 0)) && [[ -z $got ]] &&
    grep -qE "^Try 1 under signoff-[0-9a-f]+-hold-12-1 did not test the case: $stalled\. The case ran again under new keys\.$" <<<"$notes" &&
    ! grep -q "^Try 2 " <<<"$notes" && grep -qE "^stale_claims\(\) never listed it \([0-9]+ polls\)\.$" <<<"$notes"; then
    ok "case 12, the worker stalled past the lease in the first try (its heartbeat every quarter lease): that try tests nothing, the second holds"
else
    not_ok "$out/stall-once.log" "--stall-in-12 once: expected exit 0, 12 holding on its second try with the note on the first; got exit $rc, failing '$got', notes: $notes"
fi
run_outcome stall-always hold 12
if ((rc == 1)) && [[ $got == "hold:12" ]] &&
    grep -qE "^Try 2 under signoff-[0-9a-f]+-hold-12-try2-1 did not test the case: $stalled\." <<<"$notes" &&
    grep -qE "^FAILED: $stalled, in each of 3 tries: this machine stalls a worker for longer than the lease \(2 seconds\); give a longer lease in the job file$" <<<"$notes"; then
    ok "case 12, the worker stalled past the lease in every try: fails after 3 tries, saying the machine stalls the worker and to give a longer lease"
else
    not_ok "$out/stall-always.log" "--stall-in-12 always: expected exit 1, failing 'hold:12' after 3 tries with the sentence; got exit $rc, failing '$got', notes: $notes"
fi
run_outcome stall-slow-heartbeat hold 12
if ((rc == 1)) && [[ $got == "hold:12" ]] && ! grep -q "^Try 1 " <<<"$notes" &&
    grep -qE "^Diagnosis: stale_claims\(\) listed the heartbeating claim [0-9]+ times: the heartbeat extended the lease at best every 1\.[0-9] s, more than half the lease \(2 seconds\), so one late beat \([0-9.]+ s at the longest\) let the claim run out; extend the lease every quarter of it\.$" <<<"$notes"; then
    ok "case 12, a heartbeat slower than half the lease and a stall: the job's fault, fails on its first try naming the heartbeat's period"
else
    not_ok "$out/stall-slow-heartbeat.log" "--stall-in-12 once --heartbeat-every 0.7: expected exit 1, failing 'hold:12' at once with the heartbeat's period; got exit $rc, failing '$got', notes: $notes"
fi
# the storm's race: the takeovers were slowed (the worker's marker per
# key), and 19 holds all the same
rc=$(cat "$out/storm.rc")
got=$(failing_cases "$out/storm.json" 2>&1)
storm_prefix=$(prefix_of "$out/storm.log")
slowed=$(ls "$out/spools-bg/spool-${storm_prefix#signoff_}/slow-takeover" 2>/dev/null | wc -l)
if ((rc == 0)) && [[ -z $got && -n $storm_prefix ]] && ((slowed > 0)) &&
    grep -q '^✓  19 ' "$out/storm.log"; then
    ok "the storm's race: every copy of a killed key reported before its takeover's claimed point ($slowed takeover(s) slowed): 19 under retry holds"
else
    not_ok "$out/storm.log" "--in-progress-again 0.3 --slow-takeover 3: expected exit 0 and 19 holding under retry, with a slowed takeover; got exit $rc, failing '$got', $slowed takeover(s) slowed"
fi

# ---------------------------------------------------------------------
# 13. a diagnosis: which helper ran; another database; a claim error
# ---------------------------------------------------------------------
run_db=$("${psql[@]}" -c 'SELECT current_database()')
helper_version=$("$python" -c 'import sys; sys.path.insert(0, sys.argv[1]); import pg_idempotency; print(pg_idempotency.__version__)' "$root/helpers/python")
py_version=$("$python" -c 'import platform; print(platform.python_version())')
if "$python" - "$out/good.json" "$helper_version" "$py_version" "$run_db" >"$out/hello.check" 2>&1 <<'EOF2'
import json, sys
r = json.load(open(sys.argv[1]))
version, py, db = sys.argv[2:5]
s = r["signoff"]
assert s["helpers"] == [{"helper": "pg_idempotency", "helper_version": version, "runtime": "CPython",
                         "runtime_version": py, "queue_library": None, "queue_library_version": None,
                         "database": db, "wrapper": "plain", "workers": s["helper_workers"]}], s["helpers"]
# the workers that said hello (at their first claim) are workers the run
# started, one per policy at least (they outlive their cases, not the
# policy); a worker that never got a message (the drain's, say) says none
assert 4 <= s["helper_workers"] <= s["worker_processes"], (s["helper_workers"], s["worker_processes"])
assert r["settings"]["helpers"].startswith(f"pg_idempotency {version} (CPython {py}, no queue library, database {db}), the plain functions, in "), r["settings"]["helpers"]
print(f"# {s['helper_workers']} workers said hello")
EOF2
then
    cat "$out/hello.check"
    ok "the good run's JSON report names the helper that ran: pg_idempotency $helper_version, CPython $py_version, no queue library, database $run_db, the plain functions, every worker"
else
    not_ok "$out/hello.check" "the good run's JSON report: signoff.helpers"
fi
if grep -qE "^helpers: pg_idempotency $helper_version \(CPython $py_version, no queue library, database $run_db\), the plain functions, in [0-9]+ worker processes$" "$out/good.log" &&
    grep -q "<dt>helpers</dt>" "$out/good.html" && grep -qF "pg_idempotency $helper_version (CPython $py_version, no queue library, database $run_db), the plain functions, in " "$out/good.html"; then
    ok "the text and HTML reports name the helper, the runtime, the database and the plain functions"
else
    not_ok "$out/good.log" "the text or HTML report does not name the helper (helpers: ...)"
fi
# the batch run (step 12): its workers' first claim is claim_batch
if "$python" - "$out/batch-good.json" >"$out/hello-batch.check" 2>&1 <<'EOF2'
import json, sys
r = json.load(open(sys.argv[1]))
assert [h["wrapper"] for h in r["signoff"]["helpers"]] == ["plain_batch"], r["signoff"]["helpers"]
assert ", the plain functions' batch call, in " in r["settings"]["helpers"], r["settings"]["helpers"]
EOF2
then
    ok "the batch run's reports name the plain functions' batch call (claim_batch: wrapper plain_batch)"
else
    not_ok "$out/hello-batch.check" "the batch run's JSON report: signoff.helpers[].wrapper"
fi
# what made the claims, as a wrapper says it, as an older helper does not,
# and a value that is not a name (wrapped.py)
for mode in named old bad; do
    case $mode in
        named) json_w='"RefundConsumer"' text='wrapper RefundConsumer' prop=RefundConsumer ;;
        old) json_w=None text='wrapper not reported' prop='not reported' ;;
        bad) json_w=None text='a wrapper that is not a name' prop='not a name' ;;
    esac
    job=$out/wrapped-$mode.job log=$out/wrapped-$mode.log
    make_job "$job" "worker=/usr/bin/python3 wrapped.py $mode" "policies=hold" "lease=1.5"
    "$runner" --job "$job" --cases 1 --json "$out/wrapped-$mode.json" --junit "$out/wrapped-$mode.xml" >"$log" 2>&1
    rc=$?
    if ((rc == 0)) && grep -qE "^helpers: pg_idempotency .*\), $text, in 1 worker process$" "$log" &&
        "$python" - "$out/wrapped-$mode.json" "$out/wrapped-$mode.xml" "$json_w" "$prop" >>"$log" 2>&1 <<'EOF2'
import ast, json, sys, xml.etree.ElementTree as ET
r = json.load(open(sys.argv[1]))
want = ast.literal_eval(sys.argv[3])
assert [h["wrapper"] for h in r["signoff"]["helpers"]] == [want], r["signoff"]["helpers"]
props = {p.get("name"): p.get("value") for p in ET.parse(sys.argv[2]).getroot().findall("./testsuite/properties/property")}
assert props["wrapper"] == sys.argv[4], props
EOF2
    then
        ok "wrapped.py $mode: the text, JSON and JUnit reports say \"$text\" (JSON ${json_w/None/null})"
    else
        not_ok "$log" "wrapped.py $mode: expected exit 0 and \"$text\" in the reports; got exit $rc"
    fi
done
other=signoff_test_other_$$
dbs+=("$other")
"${psql[@]}" -d postgres -c "CREATE DATABASE $other" >/dev/null &&
    "${psql[@]}" -d "$other" -c "CREATE EXTENSION idempotency" >/dev/null ||
    not_ok "" "cannot create the database $other"
job=$out/otherdb.job
log=$out/otherdb.log
make_job "$job" "worker=env PGDATABASE=$other /usr/bin/python3 worker.py" "policies=hold" "lease=1.5"
start=$SECONDS
"$runner" --job "$job" --dsn "dbname=$run_db" --cases 1,2 --json "$out/otherdb.json" >"$log" 2>&1
rc=$?
secs=$((SECONDS - start))
sentence="FAILED: the worker \\(pid [0-9]+\\) uses the database \"$other\", but the run reads \"$run_db\" \(--dsn\), so no claim of the worker's can reach the run: start the worker on the run's database \(the runner gives it to the worker in libpq's PG\* variables and as IDEMPOTENCY_SIGNOFF_DSN; the worker's command or its own configuration names another\)"
if ((rc == 1)) && ((secs < 15)) && [[ $(grep -c 'FAILED' "$log") == 1 ]] && grep -qE "^    $sentence$" "$log" &&
    grep -q 'Not run: the run stopped in an earlier case' "$log" && ! grep -q 'not installed or not armed' "$log" &&
    [[ $(failing_cases "$out/otherdb.json") == "hold:1 hold:2" ]]; then
    ok "a worker on another database: case 1 fails in $secs s with one sentence naming $other and $run_db, case 2 not run"
else
    not_ok "$log" "a worker on another database: expected exit 1 within 15 s, the one sentence, case 2 not run; got exit $rc in $secs s"
fi
nogrant=signoff_test_nogrant_$$
roles+=("$nogrant")
"${psql[@]}" -c "CREATE ROLE $nogrant LOGIN" >/dev/null || not_ok "" "cannot create the role $nogrant"
job=$out/nogrant.job
log=$out/nogrant.log
make_job "$job" "worker=env PGUSER=$nogrant /usr/bin/python3 worker.py" "policies=hold" "lease=1.5"
start=$SECONDS
"$runner" --job "$job" --cases 1 >"$log" 2>&1
rc=$?
secs=$((SECONDS - start))
if ((rc == 1)) && ((secs < 15)) &&
    grep -qE '^    FAILED: the claim failed: 42501 permission denied for schema idempotency \(worker pid [0-9]+, key signoff-[0-9a-f]+-hold-1-1\)$' "$log" &&
    [[ $(grep -c 'FAILED' "$log") == 1 ]] && ! grep -q 'no worker reached' "$log"; then
    ok "a worker whose role has no grant: case 1 fails in $secs s naming 42501 and the message, not after the timeout"
else
    not_ok "$log" "a worker without the grant: expected exit 1 within 15 s and 'the claim failed: 42501 ...'; got exit $rc in $secs s"
fi

job=$out/wrongtype.job
log=$out/wrongtype.log
make_job "$job" "job_type=signoff_test_other_job" "policies=hold" "lease=1.5"
start=$SECONDS
"$runner" --job "$job" --cases 1,2 --json "$out/wrongtype.json" >"$log" 2>&1
rc=$?
secs=$((SECONDS - start))
if ((rc == 1)) && ((secs < 15)) && [[ $(grep -c 'FAILED' "$log") == 1 ]] &&
    grep -qE '^    FAILED: the worker \(pid [0-9]+\) was judged on the case.s key signoff-[0-9a-f]+-hold-1-1 under the job type "signoff_test_job", with the claim error ID001, but the job file says job_type = signoff_test_other_job \(the run gives the worker IDEMPOTENCY_SIGNOFF_JOB_TYPES=signoff_test_other_job=signoff_[0-9a-f]+_hold\): set job_type to the job type the worker claims under$' "$log" &&
    grep -q 'Not run: the run stopped in an earlier case' "$log" && ! grep -q 'not installed or not armed' "$log"; then
    ok "a job file whose job_type is not the worker's: case 1 fails in $secs s naming both job types, case 2 not run"
else
    not_ok "$log" "a job file whose job_type is not the worker's: expected exit 1 within 15 s, the one sentence, case 2 not run; got exit $rc in $secs s"
fi

# --dsn alone (a URI with a percent-encoded password), no PG* variable in
# the runner's environment: the worker and the commands get libpq's
# variables of the --dsn, and the cases hold
job=$out/dsn-only.job
log=$out/dsn-only.log
make_job "$job" "policies=hold" "lease=1.5" \
    "worker=sh -c 'env | grep ^PG | sort >\"\$SIGNOFF_TEST_DIR/pgenv-worker-\$IDEMPOTENCY_SIGNOFF_RUN\"; exec /usr/bin/python3 worker.py'" \
    "effects=sh -c 'env | grep ^PG | sort >\"\$SIGNOFF_TEST_DIR/pgenv-effects-\$IDEMPOTENCY_SIGNOFF_RUN\"; exec sh effects.sh \"\$1\"' - {key}"
uri="postgresql://$PGUSER:s%40cret@/$run_db?host=$PGHOST&port=$PGPORT"
unset_pg=()
while IFS= read -r name; do unset_pg+=(-u "$name"); done < <(env | sed -n 's/^\(PG[A-Za-z_]*\)=.*/\1/p')
env "${unset_pg[@]}" "$runner" --job "$job" --dsn "$uri" --cases 1,2 >"$log" 2>&1
rc=$?
run=$(prefix_of "$log"); run=${run#signoff_}
want=$(printf 'PGDATABASE=%s\nPGHOST=%s\nPGPASSWORD=s@cret\nPGPORT=%s\nPGUSER=%s\n' "$run_db" "$PGHOST" "$PGPORT" "$PGUSER")
if ((rc == 0)) && [[ -n $run && $(tail -n 1 "$log") == "2 passed, 0 failed" ]] &&
    [[ $(cat "$SIGNOFF_TEST_DIR/pgenv-worker-$run" 2>/dev/null) == "$want" &&
       $(cat "$SIGNOFF_TEST_DIR/pgenv-effects-$run" 2>/dev/null) == "$want" ]]; then
    ok "--dsn alone, a URI with a password, no PG* variable set: the worker and effects get PGHOST, PGPORT, PGDATABASE, PGUSER and PGPASSWORD (decoded) of it; cases 1 and 2 hold"
else
    { echo "worker's PG*:"; cat "$SIGNOFF_TEST_DIR/pgenv-worker-$run"; echo "want:"; echo "$want"; } >>"$log" 2>&1
    not_ok "$log" "--dsn alone: expected exit 0, '2 passed, 0 failed' and the worker's and the command's PG* variables those of the URI; got exit $rc"
fi

echo "signoff: $passed passed, $failed failed"
((failed == 0 && passed > 0))

