#!/usr/bin/env bash
# The protocol's decisions, unit-tested without a server: `make unit` builds
# test/unit/test_protocol.c with src/protocol.c (plain C, the system
# compiler, no PostgreSQL header) in a temporary directory and runs it:
# every policy x record state x call combination of claim, complete,
# release, extend_lease and resolve. Under a second.
#
# The runner's JSON reading, unit-tested without a server: `make -C matrix
# unit` builds test/unit/test_protocol_line.c with the runner's objects
# (libpgcommon's JSON parser) and runs it: protocol lines in other
# whitespace and key order, a nested result, \u escapes with surrogate
# pairs, and malformed lines refused with the parser's sentence naming line
# and column; then a protocol line and an object written with the runner's
# json_string() (quotes, backslashes, control characters, non-ASCII) must
# read back with python3 -m json.tool and jq (installed here when missing,
# as root; otherwise the hook says what to install).
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
source examples/e2e/deps.sh
e2e_debs jq
make -s --no-print-directory -C matrix unit MATRIX_UNIT_BIN="$tmp/test_protocol_line"
"$tmp/test_protocol_line" --print-json >"$tmp/written.json"
python3 -m json.tool "$tmp/written.json" >/dev/null
python3 - "$tmp/written.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1], encoding="utf-8"))
assert d["texts"][1] == 'quote " and backslash \\ and slash /', d["texts"][1]
assert d["texts"][2] == "".join(map(chr, list(range(1, 32)) + [127])), d["texts"][2]
assert d["texts"][3] == "caf\u00e9 \u65e5\u672c \U0001F600" == d["key"], d["texts"][3]
PY
jq -e '.key == "caf\u00e9 \u65e5\u672c \ud83d\ude00" and .job_type == .texts[1] and
    .texts[1] == "quote \" and backslash \\ and slash /" and (.texts | length) == 6' "$tmp/written.json" >/dev/null
echo "ok - what json_string() writes reads back with python3 -m json.tool and jq"
