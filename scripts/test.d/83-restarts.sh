#!/usr/bin/env bash
# Restarts under load (issue 12, item 4; test/restarts/run.py): for each queue
# system (Celery + RabbitMQ, Sidekiq + Redis, SQS through fauxqs) a load of
# 150 orders (some published twice) through the example's real broker, two
# real workers and its helper, connected through PgBouncer in transaction
# pooling mode (127.0.0.1, random port); in the middle of the run PgBouncer
# is stopped and started again on the same port and PostgreSQL is restarted
# with pg_ctl restart -m fast (as the cluster's owner), without restarting a
# worker. Then: one email per key, every record completed #1, every key
# completed within 60 s of its publish (the lease is 120 s: a claim whose
# reply was lost and that nobody owns would cost a lease), no in_progress
# except for the second of two copies published at once, no job failed.
# Installs (root) when missing: pgbouncer, python3-psycopg, python3-celery,
# rabbitmq-server, ruby-rubygems, ruby-sidekiq, ruby-pg, redis-server; Node.js
# 22 or later (PATH's, else 24 from the npm registry) and the npm packages of
# examples/sqs as hook 80 does
# (examples/e2e/deps.sh); for Celery also python3-venv, python3-setuptools
# and python3-wheel, and the helper package pg-idempotency into
# examples/celery/.venv (its python runs run.py: the Celery adapter and
# workers import the package). Sidekiq: the gem pg-idempotency is installed
# into examples/sidekiq/gems first, as hook 82 does
# (examples/sidekiq/install-gem.sh).
# RESTARTS_SYSTEMS=celery,sidekiq (a subset), RESTARTS_KEYS=N.
set -euo pipefail
source examples/e2e/deps.sh
systems=${RESTARTS_SYSTEMS:-celery,sidekiq,sqs}
debs=(pgbouncer python3-psycopg)
[[ ,$systems, == *,celery,* ]] && debs+=(python3-celery rabbitmq-server python3-venv python3-setuptools python3-wheel)
[[ ,$systems, == *,sidekiq,* ]] && debs+=(ruby-rubygems ruby-sidekiq ruby-pg redis-server)
needs=0
e2e_debs "${debs[@]}" || needs=1
if [[ ,$systems, == *,sqs,* ]]; then
    e2e_node examples/sqs || needs=1
fi
((needs == 0)) || exit 1
[[ ,$systems, == *,sqs,* ]] && e2e_npm examples/sqs
[[ ,$systems, == *,sidekiq,* ]] && bash examples/sidekiq/install-gem.sh
py=/usr/bin/python3
[[ ,$systems, == *,celery,* ]] && py=$(bash examples/celery/venv.sh)
exec "$py" test/restarts/run.py --systems "$systems"
