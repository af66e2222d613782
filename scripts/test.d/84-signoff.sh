#!/usr/bin/env bash
# scripts/test: background lane 3
# The sign-off run (idempotency-matrix --job FILE, docs/signoff.md) on a
# test job that needs no broker (test/signoff/: a queue in a directory,
# workers on pg_idempotency's plain functions and sign-off points): the good
# job under hold, retry, skip and lookup (every case holds, the storm too,
# also in the JSON report); deliberately broken workers whose reports must
# fail exactly the expected cases; bad job files, a database without the
# extension or with 0.2 (exit 2, one sentence); an enqueue command that
# exits 3; a worker whose helper is not armed; SIGINT, SIGTERM and SIGKILL
# mid-case (exit 130, no worker, job type or record left); effects counted
# by the handled reports and by effects_sql; the runner's own effect
# endpoints (effect = http, smtp) and their faults (cases 14-18) with the
# broken workers each catches; a batch handler (case 20). See
# test/signoff/run.sh. Installs python3-psycopg and jq (root) when missing.
#
# It runs in the background (lane 3), beside the host's other hooks, on a
# throwaway cluster of its own (scripts/cluster.sh): hook 83 restarts the
# host's cluster, and this one must not see that. The extension is
# installed already (scripts/test's make install). About 5-7 minutes with
# the other hooks beside it (418 s in one run with eleven sign-offs at once
# on the 2 cores), the good job's four policies 130 s of it.
set -euo pipefail
source examples/e2e/deps.sh
e2e_debs python3-psycopg jq
# the host's cluster is scripts/test's: forget it here, and make one's own
unset CLUSTER_DIR PGDATA PGHOST PGPORT
source scripts/cluster.sh
cluster_start
test/signoff/run.sh
