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
# left to its visibility timeout and DLQ). First the wrapper's focused tests
# (test-helper.mjs, node --test: the verdict mapping run, verify, completed,
# in_progress, held, skipped with a fake SQS client; no broker). Installs
# python3-psycopg (root) and the npm packages of examples/sqs (npm ci) when
# missing; the broker is started and stopped by the test.
set -euo pipefail
source examples/e2e/deps.sh
e2e_debs python3-psycopg
e2e_npm examples/sqs
(cd examples/sqs && node --test test-helper.mjs)
exec /usr/bin/python3 examples/sqs/e2e.py --policy "${E2E_POLICIES:-hold,retry,skip}"
