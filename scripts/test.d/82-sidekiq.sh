#!/usr/bin/env bash
# The Sidekiq example: its job signed off through the real queue, and the
# end-to-end scenarios for what the sign-off does not cover.
#
# First the gem pg-idempotency (helpers/ruby) is built and installed into
# examples/sidekiq/gems (examples/sidekiq/install-gem.sh: gem build, gem
# install --local --ignore-dependencies), where the example's processes find
# it (GEM_HOME), and its unit tests run with minitest (helpers/ruby/test:
# the plain calls; the middleware's reconnect, heartbeat failures, verify, a
# lost reply, a stuck transaction, claim_wait, a claim error that cannot
# heal sent to the dead set at once; the sign-off points against
# a fake runner, with a forked worker SIGKILLed at each; no Redis).
#
# Then the end-to-end scenarios (examples/sidekiq/e2e.py,
# examples/e2e/scenarios.py: a private redis-server on 127.0.0.1, two
# Sidekiq processes, kill -9 at exact points; default fetch: a killed job is
# lost, the sweeper finds the claim), only what the sign-off does not cover:
# lost-message-sweeper (the job lost with a killed process: the sweeper
# hands the stale claim to a person or re-enqueues it) under each policy and
# sweeper-retry (hold, skip: a person's 'retry' reaches a worker through the
# sweeper); under the first policy only, as their outcome does not depend on
# it: known-failure-backoff (the provider refuses once: released, sent after
# the middleware's backoff), fingerprint-mismatch (same key, other payload:
# ID002, the job goes to Sidekiq's dead set at once), lost-reply (the reply to the
# claim is lost, through test/faults/pgproxy.py: claimed again with the
# same delivery token, run #1, no lease waited) and stuck-transaction (a
# redelivery behind another transaction's uncommitted claim: in_progress at
# once, sent once after the rollback). Sidekiq never brings a killed job
# back, so the queue-redelivery-after-kill scenarios do not apply;
# heartbeat-long-job is the sign-off's case 12 here (e2e.py says why).
#
# Last, the sign-off (examples/e2e/signoff.py sidekiq: the runner,
# matrix/idempotency-matrix --job examples/sidekiq/signoff.job, with a
# redis-server; effect = smtp: the runner's own SMTP endpoint counts) under
# hold, retry and skip: the seed's cases 1-7 and the runner's 9-13 through
# the example's own workers and enqueue command; then the faults at the
# effect and the storm (14-19) under retry, with the database given as
# --dsn alone and no PG* variable in the runner's environment
# (signoff.py --dsn-only). Then a job the examples do not
# have, examples/sidekiq/second-job/signoff.job (an HTTP POST, effect =
# http), its faults at the effect (14-18) under retry.
#
# E2E_POLICIES (default hold,retry,skip) limits the policies of the
# scenarios and of the sign-off; SIGNOFF_POLICIES, when set, are the
# sign-off's, and SIGNOFF_POLICIES=none leaves it out; SIGNOFF_CASES (e.g.
# 1-7) gives it the runner's --cases; SIGNOFF_SECOND_JOB=0 leaves the second
# job out (the clean roots of hook 90 set SIGNOFF_CASES and
# SIGNOFF_SECOND_JOB). Needs extension 0.3 (delivery, wait). Installs
# ruby-rubygems, ruby-sidekiq, ruby-pg, redis-server, python3-psycopg and
# python3-aiosmtpd (root) when missing.
set -euo pipefail
source examples/e2e/deps.sh
e2e_debs ruby-rubygems ruby-sidekiq ruby-pg redis-server python3-psycopg python3-aiosmtpd
bash examples/sidekiq/install-gem.sh
(cd helpers/ruby && RUBYOPT=-W0 ruby -Ilib -Itest test/run.rb)
policies=${E2E_POLICIES:-hold,retry,skip}
rc=0
/usr/bin/python3 examples/sidekiq/e2e.py --policy "$policies" || rc=1
if [[ ${SIGNOFF_POLICIES:-} == none ]]; then
    echo "== 82-sidekiq: sign-off left out (SIGNOFF_POLICIES=none)"
else
    # cases 1-13 under each policy; then, under retry only, the faults at the
    # effect and the storm (14-19: their outcomes but 15's do not depend on the
    # policy, and test/signoff proves each under every one)
    /usr/bin/python3 examples/e2e/signoff.py sidekiq --policy "${SIGNOFF_POLICIES:-$policies}" \
        --cases "${SIGNOFF_CASES:-1-13}" || rc=1
    if [[ -z ${SIGNOFF_CASES:-} ]]; then
        # with the database in --dsn alone, no PG* variable in the runner's environment
        /usr/bin/python3 examples/e2e/signoff.py sidekiq --policy retry --cases 14-19 --dsn-only || rc=1
    fi
fi
if [[ ${SIGNOFF_SECOND_JOB:-1} != 0 ]]; then
    /usr/bin/python3 examples/e2e/signoff.py sidekiq --job examples/sidekiq/second-job/signoff.job --policy retry --cases 14-18 || rc=1
fi
exit $rc
