#!/usr/bin/env bash
# The sign-off run (idempotency-matrix --job FILE, docs/signoff.md) on a
# test job that needs no broker (test/signoff/: a queue in a directory,
# workers on pg_idempotency's plain functions and sign-off points): the good
# job under hold, retry, skip and lookup (every case holds, also in the JSON
# report); two deliberately broken workers (effects on every verdict;
# completion before the effect) whose reports must fail exactly the
# expected cases; bad job files, a database without the extension or with
# 0.2 (exit 2, one sentence); an enqueue command that exits 3; a worker
# whose helper is not armed; SIGINT and SIGTERM mid-case (exit 130, no
# worker, job type or record left); effects counted by the handled reports
# and by effects_sql. See test/signoff/run.sh. Installs python3-psycopg
# (root) when missing. About 3 minutes (188-208 s with other jobs on the 2
# cores), 110-145 s of it the good job's four policies.
set -euo pipefail
source examples/e2e/deps.sh
e2e_debs python3-psycopg
exec test/signoff/run.sh
