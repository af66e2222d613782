#!/usr/bin/env bash
# The benchmark suite's smoke variant against the test cluster (bench/run.sh
# --smoke --existing-cluster): the portable edition (this tree's plain
# script, in databases of its own) gives the extension's verdicts and
# SQLSTATEs, every pgbench script of the three implementations
# runs a few transactions on every path, the scale, purge and (if
# redis-server is installed) Redis phases run on tiny data, and the report is
# written to a temp dir and thrown away. A few seconds; no timing assertions.
set -euo pipefail
exec bench/run.sh --smoke --existing-cluster
