#!/usr/bin/env bash
# The replay matrix (idempotency-matrix: real worker processes, SIGKILL at
# exact points, all four policies, cases 1-13) run through --dsn as a
# non-superuser role, the shape of its output, colour, its cleanup (also when
# interrupted), and the headless-browser test of its HTML report, against the
# test cluster. Installs what the browser test needs when missing (root;
# otherwise prints the sudo apt-get line and fails): Debian's nodejs (only if
# no node 18+ is on PATH) and chromium with fonts-liberation, without
# recommends. See test/matrix/README.md.
set -euo pipefail
exec test/matrix/run.sh
