#!/usr/bin/env bash
# The Celery example's end-to-end test (examples/celery/e2e.py): the seed's
# replay matrix through a private rabbitmq-server on 127.0.0.1 (random ports,
# started and stopped by the test) and two Celery workers whose pool process
# is killed with kill -9, under the policies hold, retry and skip. Installs
# python3-celery, python3-psycopg and rabbitmq-server (root) when missing.
set -euo pipefail
source examples/e2e/deps.sh
e2e_debs python3-celery python3-psycopg rabbitmq-server
exec /usr/bin/python3 examples/celery/e2e.py --policy "${E2E_POLICIES:-hold,retry,skip}"
