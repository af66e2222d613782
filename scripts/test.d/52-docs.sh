#!/usr/bin/env bash
# The docs test: every ```sql block of README.md and docs/*.md run in order,
# as a reader would, in a fresh database of the test cluster (one per file,
# dropped afterwards), stopping at the first error with the file and line of
# the block; blocks marked <!-- docs-test: skip (why) --> are counted, not
# run. Then the README's worker and operator roles must be able to call
# every function of their role and nothing else. Needs Debian's python3
# (installed with apt-get when missing, as root). See test/docs/run.sh.
set -euo pipefail
exec test/docs/run.sh
