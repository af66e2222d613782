#!/usr/bin/env bash
# The Celery example's end-to-end test (examples/celery/e2e.py): the seed's
# replay matrix through a private rabbitmq-server on 127.0.0.1 (random ports,
# started and stopped by the test) and two Celery workers whose pool process
# is killed with kill -9, under the policies hold, retry and skip, plus case 8
# (a person's 'retry' reaches a worker through the sweeper), case 9 (a known
# failure, released and sent after a backoff), case 12 (an unexpected error:
# Celery acknowledges the failed task, the sweeper hands the stale claim to a
# person or re-enqueues it), case 13 (a job longer than two leases: the
# heartbeat keeps the claim, a duplicate gets in_progress), case 14 (same
# key, other payload: ID002, failed without retry) and Celery's cases 10 (a claim
# refused with 42501 is retried, not acknowledged away) and 11 (fingerprint of
# positional and keyword arguments; ID002 fails without retries), case 15
# (the reply to the claim is lost, through test/faults/pgproxy.py: claimed
# again with the same delivery token, run #1, no lease waited) and case 16 (a
# redelivery behind another transaction's uncommitted claim: in_progress at
# once, sent once after the rollback). First the helper package
# pg-idempotency (helpers/python) is installed from the checkout into
# examples/celery/.venv (examples/celery/venv.sh: pip without an index, in a
# venv that sees Debian's packages) and its unit tests run with pytest
# against the installed package (helpers/python/tests: the plain functions;
# the Celery task base class's verdict mapping run, verify, completed,
# in_progress, held, skipped, a lost reply, a stuck transaction, claim_wait,
# in-process, no broker; the sign-off points and job-type map of both, with a
# fake runner and worker processes killed with SIGKILL at each point); then
# the e2e test runs with that venv's python.
# Needs extension 0.3 (delivery, wait).
# Creates and drops the role idempotency_e2e_celery_worker. Installs
# python3-celery, python3-psycopg, rabbitmq-server, python3-pytest,
# python3-venv, python3-setuptools and python3-wheel (root) when missing.
set -euo pipefail
source examples/e2e/deps.sh
e2e_debs python3-celery python3-psycopg rabbitmq-server python3-pytest \
    python3-venv python3-setuptools python3-wheel
py=$(bash examples/celery/venv.sh)
PG_IDEMPOTENCY_TEST_CELERY=1 "$py" -m pytest -p no:cacheprovider -q helpers/python/tests
exec "$py" examples/celery/e2e.py --policy "${E2E_POLICIES:-hold,retry,skip}"
