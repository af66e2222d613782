#!/usr/bin/env bash
# bench/citus/batch.sh: what lifting the batch limit on Citus would cost
# (issue 20). The batch calls run on the coordinator and send their
# statements over the tables' owner's connections, so a role other than the
# owner cannot write its own rows to the same shards in the same transaction
# (25001, docs/citus.md). What works in such a transaction today is the
# single-key calls, each delegated to the key's worker; running a batch's
# keys "where their shards are" would be one delegated call per shard group.
# This measures, through the coordinator of a throwaway cluster
# (test/citus/cluster.sh), one client, keys new per call:
#   batch    BEGIN; claim_operations(100 keys); complete_operations(...); COMMIT
#   tx1      BEGIN; 100 x (claim_operation; complete_operation); COMMIT
#   auto1    100 x (claim_operation; complete_operation), autocommit
# BATCH_ROUNDS rounds (default 5) of BATCH_TX transactions (default 20) each,
# the order alternating per round; per key: the client's wall time and the
# CPU time of the three servers (/proc). Prints a Markdown table; the report
# is bench/citus/batch.md. Needs Citus installed (scripts/citus check) and
# the extension installed; run as root or as a user who can start servers.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=test/citus/cluster.sh
source "$here/../../test/citus/cluster.sh"
citus_cluster_start >/dev/null
citus_psql coord -q -c "CREATE EXTENSION idempotency"
citus_psql coord -q -c "SELECT idempotency.distribute()" >/dev/null 2>&1
citus_psql coord -q -c "INSERT INTO idempotency.job_types (job_type) VALUES ('send_confirmation')"
pids=""
for n in coord w1 w2; do pids+=" $(head -1 "$CITUS_DIR/$n/postmaster.pid")"; done
timeout 900 runuser -u postgres -- env BATCH_PIDS="$pids" BATCH_ROUNDS="${BATCH_ROUNDS:-5}" \
    BATCH_TX="${BATCH_TX:-20}" python3 "$here/batch.py"
