#!/usr/bin/env bash
# The replay matrix (idempotency-matrix: real worker processes, SIGKILL at
# exact points, all four policies, cases 1-13) and the headless-browser test
# of its HTML report, against the test cluster. See test/matrix/README.md.
set -euo pipefail
exec test/matrix/run.sh
