#!/usr/bin/env bash
# scripts/test: background lane 2
# The Debian packages (test/package/run.sh): for bookworm (PostgreSQL 15),
# trixie (17) and forky (18), scripts/package builds postgresql-N-idempotency
# and idempotency-matrix in a clean root of that release (with the build-time
# regression and isolation tests), then a fresh clean root with no compiler
# installs the two .debs with apt-get, creates the extension in a
# pg_virtualenv cluster and runs the whole replay matrix with the installed
# runner. The three releases run in parallel; about 3 minutes in all on 2
# cores with the roots cached (see test/package/run.sh for the numbers).
#
# Needs root (the clean roots are chroots with mounts): as another user it
# says so and passes. Bounded: killed after PACKAGE_TEST_TIMEOUT seconds
# (default 1800); scripts/root removes its roots also then.
# The test cluster scripts/test exports is not used.
set -uo pipefail

if ((EUID != 0)); then
    echo "hook 91-package: skipped: building and installing the packages in clean Debian roots needs root (scripts/root); run scripts/test as root"
    exit 0
fi
# in the background, so that a SIGTERM or SIGINT to this hook reaches it
# (timeout(1) runs it in a process group of its own) and the hook ends only
# once run.sh has cleaned up
timeout --kill-after=60 "${PACKAGE_TEST_TIMEOUT:-1800}" test/package/run.sh &
pid=$!
trap 'kill -TERM "$pid" 2>/dev/null; wait "$pid"; exit 143' TERM
trap 'kill -INT "$pid" 2>/dev/null; wait "$pid"; exit 130' INT
rc=0
wait "$pid" || rc=$?
((rc == 124)) && echo "hook 91-package: killed after ${PACKAGE_TEST_TIMEOUT:-1800} s (PACKAGE_TEST_TIMEOUT)"
exit "$rc"
