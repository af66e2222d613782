#!/usr/bin/env bash
# The Sidekiq example's end-to-end test (examples/sidekiq/e2e.py): the seed's
# replay matrix through a private redis-server on 127.0.0.1 (random port,
# started and stopped by the test) and two Sidekiq processes killed with
# kill -9 (default fetch: the job is lost, the sweeper finds the claim), under
# the policies hold, retry and skip, plus case 8 (a person's 'retry' reaches a
# worker through the sweeper), case 9 (a known failure, released and sent
# after a backoff), case 12 (the job lost with a killed process: the sweeper
# hands the stale claim to a person or re-enqueues it), case 13 (a job longer
# than two leases: the heartbeat keeps the claim, a duplicate gets
# in_progress) and case 14 (same key, other payload: ID002, the job goes to
# Sidekiq's retry set), case 15 (the reply to the claim is lost, through
# test/faults/pgproxy.py: claimed again with the same delivery token, run #1,
# no lease waited) and case 16 (a redelivery behind another transaction's
# uncommitted claim: in_progress at once, sent once after the rollback).
# First the gem pg-idempotency (helpers/ruby) is built and installed into
# examples/sidekiq/gems (examples/sidekiq/install-gem.sh: gem build, gem
# install --local --ignore-dependencies), where the example's processes find
# it (GEM_HOME), and its unit tests run with minitest (helpers/ruby/test:
# the plain calls; the middleware's reconnect, heartbeat failures, verify, a
# lost reply, a stuck transaction, claim_wait; the sign-off points against
# a fake runner, with a forked worker SIGKILLed at each; no Redis). Needs extension
# 0.3 (delivery, wait). Installs ruby-rubygems, ruby-sidekiq, ruby-pg,
# redis-server and python3-psycopg (root) when missing.
set -euo pipefail
source examples/e2e/deps.sh
e2e_debs ruby-rubygems ruby-sidekiq ruby-pg redis-server python3-psycopg
bash examples/sidekiq/install-gem.sh
(cd helpers/ruby && RUBYOPT=-W0 ruby -Ilib -Itest test/run.rb)
exec /usr/bin/python3 examples/sidekiq/e2e.py --policy "${E2E_POLICIES:-hold,retry,skip}"
