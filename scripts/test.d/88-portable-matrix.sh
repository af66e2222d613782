#!/usr/bin/env bash
# The replay matrix on the portable edition (issue 41): the README's main
# command with MATRIX_EDITION=portable, as a user on a managed service would
# see it: its own throwaway cluster, a database whose owner (not a
# superuser) installed the portable edition as a plain script, every policy
# and every case. It must exit 0 with "N passed, 0 failed", and name the
# edition it ran on. Run outside the test cluster's environment, as hook 51
# runs scripts/matrix.
set -uo pipefail

srcdir=${TEST_SRCDIR:-$(pwd)}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/portable-matrix.XXXXXX") || exit 2
trap 'rm -rf "$tmp"' EXIT
chmod 755 "$tmp"
unset CLUSTER_PORT
log=$tmp/matrix.log
start=$SECONDS
(cd "$tmp" && env -u CLUSTER_DIR -u CLUSTER_OWNER -u PGHOST -u PGPORT -u PGUSER -u PGDATABASE -u PGDATA \
    MATRIX_EDITION=portable "$srcdir/scripts/matrix" --json "$tmp/matrix.json") >"$log" 2>&1
rc=$?
total=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$log" | tail -n 1)
echo "# MATRIX_EDITION=portable scripts/matrix: exit $rc, '$total', $((SECONDS - start)) s"
if ((rc == 0)) && [[ $total =~ ^[1-9][0-9]*\ passed,\ 0\ failed$ ]] &&
    grep -q '^== the portable edition, installed as a plain script' "$log" &&
    grep -q '(portable edition) on PostgreSQL' "$log"; then
    echo "ok - the replay matrix gives every case on the portable edition ($total)"
    exit 0
fi
echo "not ok - MATRIX_EDITION=portable scripts/matrix: expected exit 0 and 'N passed, 0 failed'; got exit $rc, '$total'"
sed 's/^/    /' "$log" | tail -n 80
exit 1
