#!/bin/sh
# effects.sh KEY: the number of effects of KEY in the test job's effects
# file (dirqueue.py: one line "key attempt pid" per effect)
set -eu
key=${1:?usage: effects.sh KEY}
file="${SIGNOFF_TEST_DIR:-${TMPDIR:-/tmp}}/spool-${IDEMPOTENCY_SIGNOFF_RUN:?not set by the runner}/effects"
if [ ! -e "$file" ]; then
    echo 0
    exit 0
fi
awk -v k="$key" '$1 == k { n++ } END { print n + 0 }' "$file"
