#!/usr/bin/env bash
# bench/proto-rename.sh TREE: rename a copy of the extension tree to
# idempotency_proto, so that a prototype can be installed and benchmarked
# next to the real extension (bench/run.sh --proto DIR) without replacing
# the installed idempotency.so that other sessions' tests load.
#
# What changes in TREE (a copy; never run it on the checkout): the control
# file and the install scripts are renamed; module, schema and the C code's
# schema-qualified names become idempotency_proto; the C helpers idem_* become
# idemproto_* (PostgreSQL 15 loads modules RTLD_GLOBAL, so two modules with
# the same global symbols could call each other's helpers); the bench
# include is dropped from the Makefile, and the replay matrix runner is
# removed (matrix/; in a tree older than issue 19, src/matrix/ and its
# include).
set -euo pipefail
tree=${1:?usage: proto-rename.sh TREE}
cd "$tree"
[[ -f idempotency.control ]] || { echo "proto-rename: no idempotency.control in $tree" >&2; exit 1; }
[[ ! -d .git ]] || { echo "proto-rename: $tree is a git checkout; give it a copy" >&2; exit 1; }

sed -e "s|\$libdir/idempotency'|\$libdir/idempotency_proto'|" idempotency.control >idempotency_proto.control
rm idempotency.control
for f in idempotency--*.sql; do
    sed -E 's/\bidempotency\b/idempotency_proto/g' "$f" >"idempotency_proto${f#idempotency}"
    rm "$f"
done
sed -i -E -e 's/^EXTENSION( *)= idempotency$/EXTENSION\1= idempotency_proto/' \
    -e 's/^MODULE_big( *)= idempotency$/MODULE_big\1= idempotency_proto/' \
    -e '/^-include (src\/matrix\/matrix.mk|bench\/bench.mk)/d' Makefile
grep -q '^EXTENSION *= idempotency_proto$' Makefile || { echo "proto-rename: EXTENSION not renamed" >&2; exit 1; }
grep -q '^MODULE_big *= idempotency_proto$' Makefile || { echo "proto-rename: MODULE_big not renamed" >&2; exit 1; }
rm -rf matrix src/matrix sql expected test
for f in src/*.c src/*.h; do
    sed -i -E -e 's/\bidempotency\.(operations|job_types|resolutions|operation_status|stale_policy|job_types_guard)\b/idempotency_proto.\1/g' \
        -e 's/get_namespace_oid\("idempotency"/get_namespace_oid("idempotency_proto"/g' \
        -e 's/\bidem_/idemproto_/g' "$f"
done
echo "proto-rename: $tree is now idempotency_proto"
