#!/usr/bin/env bash
# sqlsmith (Debian's) against a database with the extension installed, for
# a bounded run (5000 queries; IDEMPOTENCY_LONG=1: 50000), then the test
# cluster's server log is checked for PANIC, TRAP, crashed backends and the
# extension's own internal errors. Installs Debian's sqlsmith when missing
# (root). See test/fuzz/sqlsmith.sh.
set -euo pipefail
queries=5000
[[ -n ${IDEMPOTENCY_LONG:-} && ${IDEMPOTENCY_LONG} != 0 ]] && queries=50000
SERVER_LOG=${CLUSTER_DIR:+$CLUSTER_DIR/server.log} exec test/fuzz/sqlsmith.sh --max-queries "$queries"
