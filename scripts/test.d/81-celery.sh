#!/usr/bin/env bash
# The Celery example: its sign-off through the real queue, and the end-to-end
# scenarios (examples/celery/e2e.py) for what the sign-off does not cover.
#
# First the helper package pg-idempotency (helpers/python) is installed from
# the checkout into examples/celery/.venv (examples/celery/venv.sh: pip
# without an index, in a venv that sees Debian's packages) and its unit tests
# run with pytest against the installed package (helpers/python/tests: the
# plain functions; the Celery task base class's verdict mapping run, verify,
# completed, in_progress, held, skipped, a lost reply, a stuck transaction,
# claim_wait, in-process, no broker; the sign-off points and job-type map of
# both, with a fake runner and worker processes killed with SIGKILL at each
# point). Both runs below use that venv's python, each with a private
# rabbitmq-server on 127.0.0.1 (random ports, started and stopped by it).
#
# The end-to-end scenarios (examples/celery/e2e.py, examples/e2e/scenarios.py;
# two Celery workers whose pool process is killed with kill -9), what the
# runner does not do. Under each policy: queue-redelivery-after-kill-claimed
# and -handled (the message of a killed pool process requeued by
# task_reject_on_worker_lost, which the sign-off does not do: it kills a
# worker's whole process group), lost-message-sweeper (an unexpected error:
# Celery acknowledges the failed task, the sweeper hands the stale claim to
# a person or re-enqueues it) and, under hold and skip, sweeper-retry (a
# person's 'retry' reaches a worker through the sweeper). Under the first
# policy only, as their outcome does not depend on it: known-failure-backoff
# (the provider refuses: released, sent after a backoff), heartbeat-long-job
# (a job longer than two leases: the heartbeat keeps the claim, a duplicate
# gets in_progress and comes back completed), fingerprint-mismatch (same key,
# other payload: ID002, the task fails at once), lost-reply (the reply to
# the claim is lost, through test/faults/pgproxy.py: claimed again with the
# same delivery token, run #1, no lease waited), stuck-transaction (a
# redelivery behind another transaction's uncommitted claim: in_progress at
# once, sent once after the rollback), and Celery's own
# grant-revoked-backoff (a claim refused with 42501 is retried, not
# acknowledged away) and fingerprint-args-kwargs (the fingerprint of
# positional and keyword arguments).
#
# The sign-off (examples/e2e/signoff.py celery): idempotency-matrix --job
# examples/celery/signoff.job under hold, retry and skip, with one Celery
# worker process per worker the runner starts, killed at the helper's
# sign-off points, and the emails sent to and counted by the runner's own
# SMTP endpoint (effect = smtp): the seed's 1-7 and the runner's 9-13 must
# hold under each policy, then the faults at the effect and the storm
# (14-19) under retry, with the database given as --dsn alone and no PG*
# variable in the runner's environment (signoff.py --dsn-only: the workers
# and commands reach it through the libpq variables the runner hands
# them). Then a second job that the examples do not have,
# with another kind of effect (examples/celery/second-job/signoff.job:
# record_payment, an HTTP POST to a ledger, effect = http), its faults at
# the effect (14-18) under retry.
#
# E2E_POLICIES (default hold,retry,skip) are the scenarios' policies;
# SIGNOFF_POLICIES (default hold,retry,skip) the sign-off's, and
# SIGNOFF_POLICIES=none leaves it out; SIGNOFF_CASES (e.g. 1-7) gives it
# the runner's --cases; SIGNOFF_SECOND_JOB=0 leaves the second job out (the
# clean roots of hook 90 set SIGNOFF_CASES and SIGNOFF_SECOND_JOB). Each of
# the three runs is run even if an earlier one failed; the hook fails if
# any did.
# Needs extension 0.3 (delivery, wait).
# Creates and drops the role idempotency_e2e_celery_worker. Installs
# python3-celery, python3-psycopg, rabbitmq-server, python3-pytest,
# python3-venv, python3-setuptools, python3-wheel and python3-aiosmtpd (root)
# when missing.
set -euo pipefail
source examples/e2e/deps.sh
e2e_debs python3-celery python3-psycopg rabbitmq-server python3-pytest \
    python3-venv python3-setuptools python3-wheel python3-aiosmtpd
py=$(bash examples/celery/venv.sh)
PG_IDEMPOTENCY_TEST_CELERY=1 "$py" -m pytest -p no:cacheprovider -q helpers/python/tests
rc=0
"$py" examples/celery/e2e.py --policy "${E2E_POLICIES:-hold,retry,skip}" || rc=1
if [[ ${SIGNOFF_POLICIES:-} == none ]]; then
    echo "== 81-celery: sign-off left out (SIGNOFF_POLICIES=none)"
else
    # cases 1-13 under each policy; then, under retry only, the faults at the
    # effect and the storm (14-19: their outcomes but 15's do not depend on the
    # policy, and test/signoff proves each under every one)
    "$py" examples/e2e/signoff.py celery --policy "${SIGNOFF_POLICIES:-hold,retry,skip}" \
        --cases "${SIGNOFF_CASES:-1-13}" || rc=1
    if [[ -z ${SIGNOFF_CASES:-} ]]; then
        # with the database in --dsn alone, no PG* variable in the runner's environment
        "$py" examples/e2e/signoff.py celery --policy retry --cases 14-19 --dsn-only || rc=1
    fi
fi
if [[ ${SIGNOFF_SECOND_JOB:-1} != 0 ]]; then
    "$py" examples/e2e/signoff.py celery --job examples/celery/second-job/signoff.job --policy retry --cases 14-18 || rc=1
fi
exit "$rc"
