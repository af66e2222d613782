#!/usr/bin/env bash
# Memory: the regression and isolation suites against a server running
# under Valgrind (test/valgrind/run.sh, its own throwaway cluster). Slow
# (minutes on two cores): runs only with IDEMPOTENCY_LONG=1; otherwise it
# says so and passes. The backend-memory-over-a-million-claims check is the
# TAP test test/t/006_memory.pl, which always runs. Installs valgrind
# (without recommends) when missing, as root.
set -euo pipefail
if [[ -z ${IDEMPOTENCY_LONG:-} || ${IDEMPOTENCY_LONG} == 0 ]]; then
    echo "73-valgrind: skipped (slow; run with IDEMPOTENCY_LONG=1, or test/valgrind/run.sh alone)"
    exit 0
fi
exec test/valgrind/run.sh
