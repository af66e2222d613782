#!/bin/sh
# helpers/portable-sql.sh DEST: the portable edition's plain script
# (portable/build.sh's idempotency-portable.sql) copied to DEST. The three
# helper packages carry it, made when the package is built, never committed:
#
#   Python  helpers/python/setup.py (build_py, egg_info: pip install, sdist,
#           wheel) -> pg_idempotency/idempotency-portable.sql
#   Ruby    pg-idempotency.gemspec, when loaded (gem build)
#           -> lib/pg_idempotency/idempotency-portable.sql
#   Node.js package.json's prepare (npm pack, npm publish, npm ci, a file: install)
#           -> idempotency-portable.sql
#
# and the helpers' test suites run it before testing a checkout's sources.
# DEST is written whole or not at all (a temporary file of this process,
# then mv: test processes that run at once may each write it). Needs only
# sh, sed and cat, as portable/build.sh.
set -eu
[ $# -eq 1 ] || { echo "usage: helpers/portable-sql.sh DEST" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
dest=$1
tmp=$(mktemp -d "${TMPDIR:-/tmp}/portable-sql.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
sh "$here/../portable/build.sh" "$tmp" >/dev/null
cp "$tmp/idempotency-portable.sql" "$dest.$$.tmp"
mv "$dest.$$.tmp" "$dest"
