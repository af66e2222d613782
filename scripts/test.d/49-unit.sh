#!/usr/bin/env bash
# The protocol's decisions, unit-tested without a server: `make unit` builds
# test/unit/test_protocol.c with src/protocol.c (plain C, the system
# compiler, no PostgreSQL header) in a temporary directory and runs it:
# every policy x record state x call combination of claim, complete,
# release, extend_lease and resolve. Under a second.
#
# And the layout of src/: `make check-layout` builds the extension's
# objects (a VPATH build in the same temporary directory, so the tree gets
# no objects) and checks that no two files call each other, not even
# through others (scripts/check-layout.sh). About 20 seconds.
set -euo pipefail
tmp=$(mktemp -d "${TMPDIR:-/tmp}/unit.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
make -s --no-print-directory unit UNIT_BIN="$tmp/test_protocol"
mkdir -p "$tmp/build"
make -s --no-print-directory -C "$tmp/build" -f "$PWD/Makefile" VPATH="$PWD" with_llvm=no check-layout
