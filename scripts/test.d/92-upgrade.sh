#!/usr/bin/env bash
# scripts/test: background lane 2
# Major-version upgrade with live records: a PostgreSQL 15 cluster holding a
# record of every kind (young claim, held stale claim, completed with a result,
# released, skipped, audited resolutions, a job type with a worker_role, and a
# database still at extension version 0.1) goes through pg_upgradecluster
# (pg_upgrade, and Debian's default dump method) to 17 in a clean trixie root
# and to 18 in a clean forky root, and the protocol goes on there
# (test/upgrade/run.sh; a few minutes). Needs root (scripts/root); as another
# user it says so and passes. UPGRADE_MAJORS="17" runs one.
set -euo pipefail
if ((EUID != 0)); then
    echo "92-upgrade: skipped (needs root: scripts/root mounts and chroots; run scripts/test as root)"
    exit 0
fi
exec test/upgrade/run.sh
