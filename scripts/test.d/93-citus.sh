#!/usr/bin/env bash
# Citus (issue 11, in progress): a coordinator and two workers on this
# machine (test/citus/cluster.sh), Citus 13.2 built from the vendored tarball
# when it is not installed and cached under /var/cache/idempotency/citus
# (scripts/citus install: about 1 minute cold, under 1 s cached), the
# extension distributed with idempotency.distribute(), and the 38 cases of
# test/citus/repro.py with REPRO_STRICT=1: every one must answer as on one
# node (delegated calls and calls in transaction blocks: claims, duplicates,
# a race of 4 clients over 150 keys, releases, fingerprints, takeovers and
# fencing, holds and where their NOTIFY is heard, extend_lease, the
# transactional mode, stale_claims, the stats view, resolve, both purges,
# deleting a job type with records, records of every status made before
# distribution, per-job-type roles and grants on the workers); a second
# distribute() must refuse with 55000. About 1 minute. PostgreSQL 15 only
# (the Citus source here builds for 15). Needs root (it builds and installs
# Citus); as another user it says so and passes.
set -euo pipefail
if ((EUID != 0)); then
    echo "93-citus: skipped (needs root: scripts/citus install builds and installs Citus)"
    exit 0
fi
# The vendored source lives beside the checkout (../shared/vendor, or
# CITUS_VENDOR): outside the project. Without it and without an installed
# Citus there is nothing to test with: say so, loudly, and pass.
vendor=${CITUS_VENDOR:-$(cd "$(dirname "$0")/../../.." && pwd)/shared/vendor}
if ! scripts/citus check >/dev/null 2>&1 && [[ ! -f $vendor/citus-13.2.2.tar.gz ]]; then
    echo "93-citus: NOT RUN: Citus is not installed and its vendored source $vendor/citus-13.2.2.tar.gz is missing (set CITUS_VENDOR)"
    exit 0
fi
REPRO_DISTRIBUTE=function REPRO_STRICT=1 exec test/citus/repro.sh
