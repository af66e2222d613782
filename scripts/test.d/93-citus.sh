#!/usr/bin/env bash
# Citus (issues 11, 18, 20): a coordinator and two workers on this
# machine (test/citus/cluster.sh), Citus (13.2.2 on PostgreSQL 15, 14.0.1 on
# 16-18: scripts/citus) built from the vendored tarball when it is not
# installed and cached under /var/cache/idempotency/citus
# (scripts/citus install: about 2 minutes cold, under 1 s cached). Four runs,
# each on a cluster of its own:
#  1. test/citus/repro.sh with REPRO_DISTRIBUTE=function REPRO_STRICT=1
#     REPRO_MATRIX=1: distribute() refused with 25001 in a transaction that
#     ran a parallel query (nothing changed), then the install distributed
#     with idempotency.distribute(), and the cases of test/citus/repro.py,
#     each of which must answer as on one node (delegated calls and calls in
#     transaction blocks: claims, duplicates, a race of 4 clients over 150
#     keys, releases, fingerprints, takeovers and fencing, holds and where
#     their NOTIFY is heard, extend_lease, the transactional mode and its
#     one-worker commit without PREPARE TRANSACTION, stale_claims, the stats
#     view, resolve, both purges, deleting a job type with records, records
#     of every status made before distribution, per-job-type roles, grants
#     made after distribute() and distribute_grants()), the same cases
#     through the calls in place on w1 (0.4), and use_in_place(), their
#     verdicts for keys of both workers under each isolation level, where
#     their statements run, their generic plans; a second
#     distribute() must refuse with 55000; then the replay matrix runner
#     through the coordinator, every cell;
#  2. test/citus/failover.sh: a worker crashes (and commits whose replies it
#     never sent) during a run of 4 racing clients over 400 keys: 08006 for
#     its keys only, the other worker's keys go on, and afterwards every key
#     completed with exactly one effect, nothing lost;
#  3. test/citus/placement.sh (issue 20): shard placements change while 4
#     clients (2 on the coordinator, 1 on each worker) race over the same
#     keys in the transactional mode: citus_move_shard_placement with
#     block_writes and with force_logical, a blocking
#     citus_split_shard_by_split_points, the background rebalancer, and
#     isolate_tenant_to_new_shard of a key in use, one after another on one
#     cluster: every key completed with exactly one effect, the verdicts of
#     one node, and nothing written to the old copy of a moved or split
#     shard (75 s on idle cores, up to 4 minutes beside other jobs);
#  4. test/citus/memory.sh (issue 18): on long-lived connections, 20 000
#     calls per scenario (MEMORY_CALLS; 5 000 in hook 90's roots):
#     the run and duplicate paths through the coordinator, a transaction
#     block, the batch calls, calls made on a worker, the run and duplicate
#     paths on a worker through the calls in place (0.4); and one plain node;
#     no backend serving them on any node grows by more than 4 MiB.
# About 10 minutes with Citus cached. On the host's PostgreSQL 15 (Citus
# 13.2), and in hook 90's roots on 17 (Debian 13) and 18 (Debian testing),
# both on Citus 14.0. Needs
# root (it builds and installs Citus); as another user it says so and
# passes.
set -euo pipefail
if ((EUID != 0)); then
    echo "93-citus: skipped (needs root: scripts/citus install builds and installs Citus)"
    exit 0
fi
# The vendored source lives beside the checkout (../shared/vendor, or
# CITUS_VENDOR): outside the project. Without it and without an installed
# Citus there is nothing to test with: say so, loudly, and pass.
vendor=${CITUS_VENDOR:-$(cd "$(dirname "$0")/../../.." && pwd)/shared/vendor}
if ! scripts/citus check >/dev/null 2>&1 && ! compgen -G "$vendor/citus-*.tar.gz" >/dev/null; then
    echo "93-citus: NOT RUN: Citus is not installed and its vendored source ($vendor/citus-*.tar.gz) is missing (set CITUS_VENDOR)"
    exit 0
fi
# the tests' client: Debian's python3-psycopg (installed when missing)
# shellcheck source=examples/e2e/deps.sh
source examples/e2e/deps.sh
e2e_debs python3-psycopg
status=0
REPRO_DISTRIBUTE=function REPRO_STRICT=1 REPRO_MATRIX=1 test/citus/repro.sh || status=1
echo "== 93-citus: a worker fails during a run"
test/citus/failover.sh || status=1
echo "== 93-citus: placements change during a run"
test/citus/placement.sh || status=1
echo "== 93-citus: memory per backend over ${MEMORY_CALLS:-20000} calls"
test/citus/memory.sh || status=1
exit $status
