#!/usr/bin/env bash
# The protocol's decisions, unit-tested without a server: `make unit` builds
# test/unit/test_protocol.c with src/protocol.c (plain C, the system
# compiler, no PostgreSQL header) in a temporary directory and runs it:
# every policy x record state x call combination of claim, complete,
# release, extend_lease and resolve. Under a second.
#
# And the layout of src/: `make check-layout` reads the extension's objects
# (those scripts/test built before the hooks; built first if missing) and
# checks that no two files call each other, not even through others
# (scripts/check-layout.sh). Under a second once built.
set -euo pipefail
tmp=$(mktemp -d "${TMPDIR:-/tmp}/unit.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
make -s --no-print-directory unit UNIT_BIN="$tmp/test_protocol"
make -s --no-print-directory with_llvm=no check-layout
