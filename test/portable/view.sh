#!/usr/bin/env bash
# test/portable/view.sh VIEWDIR [PGTLE_ROOT]: a private "installation view"
# of the PostgreSQL of PG_CONFIG without the C edition of idempotency, and
# with pg_tle: what a managed service is to the portable edition. Prints
# the view's bin directory (run initdb, pg_ctl and postgres from there).
#
# PostgreSQL is relocatable: a server binary finds share/ and lib/ relative
# to its own path (make_relative_path: the part of the configured bindir
# past its common prefix with sharedir, pkglibdir, ..., is replaced by the
# binary's directory). So the view mirrors the configured absolute paths
# under VIEWDIR:
#   VIEWDIR$(bindir)     copies of postgres, initdb and pg_ctl (copies:
#                        find_my_exec resolves symlinks, and initdb and
#                        pg_ctl find postgres beside themselves)
#   VIEWDIR$(sharedir)   symlinks to every entry of sharedir, but extension/
#                        is a directory of symlinks to every file but
#                        idempotency.control and idempotency--*.sql, plus
#                        pg_tle's files
#   VIEWDIR$(pkglibdir)  symlinks to every entry but idempotency.so and
#                        bitcode/ (a directory of symlinks without
#                        idempotency's bitcode), plus pg_tle.so
# PGTLE_ROOT: a tree holding pg_tle under the same absolute paths
# (scripts/pgtle build prints one); without it pg_tle is taken from the
# PostgreSQL itself, if installed there. The clients (psql, pg_regress,
# pg_dump) need no view: they do not read share/ or lib/.
# Nothing outside VIEWDIR changes; rm -rf VIEWDIR removes the view.
set -euo pipefail

(($# >= 1 && $# <= 2)) || { echo "usage: test/portable/view.sh VIEWDIR [PGTLE_ROOT]" >&2; exit 2; }
view=$1
tle=${2:-}
PG_CONFIG=${PG_CONFIG:-pg_config}
bindir=$("$PG_CONFIG" --bindir)
sharedir=$("$PG_CONFIG" --sharedir)
pkglibdir=$("$PG_CONFIG" --pkglibdir)

die() { echo "test/portable/view.sh: error: $*" >&2; exit 1; }
[[ -x $bindir/postgres ]] || die "no server binary $bindir/postgres ($PG_CONFIG)"

mkdir -p "$view"
view=$(cd "$view" && pwd)
[[ -z $(ls -A "$view") ]] || die "$view is not empty"
chmod 755 "$view"

# link_all SRC DST EXCLUDE_REGEX: DST a directory of symlinks to SRC's
# entries, but those whose name matches EXCLUDE_REGEX
link_all() {
    local src=$1 dst=$2 skip=$3 e name
    mkdir -p "$dst"
    for e in "$src"/* "$src"/.[!.]*; do
        [[ -e $e || -L $e ]] || continue
        name=${e##*/}
        [[ $name =~ $skip ]] && continue
        ln -s "$e" "$dst/$name"
    done
}

umask 022
mkdir -p "$view$bindir"
for b in postgres initdb pg_ctl; do
    cp "$bindir/$b" "$view$bindir/$b"
done

# share: everything, but extension/ rebuilt without the C edition
link_all "$sharedir" "$view$sharedir" '^extension$'
link_all "$sharedir/extension" "$view$sharedir/extension" '^idempotency(\.control|--.*\.sql)$'
# lib: everything but idempotency.so; bitcode/ without idempotency's
link_all "$pkglibdir" "$view$pkglibdir" '^(idempotency\.so|bitcode)$'
if [[ -d $pkglibdir/bitcode ]]; then
    link_all "$pkglibdir/bitcode" "$view$pkglibdir/bitcode" '^idempotency(\.index\.bc)?$'
fi

# pg_tle, from its tree
if [[ -n $tle ]]; then
    [[ -f $tle$pkglibdir/pg_tle.so ]] || die "$tle has no $pkglibdir/pg_tle.so"
    rm -f "$view$pkglibdir/pg_tle.so" "$view$sharedir"/extension/pg_tle[.-]*
    ln -s "$tle$pkglibdir/pg_tle.so" "$view$pkglibdir/pg_tle.so"
    for f in "$tle$sharedir"/extension/pg_tle[.-]*; do
        ln -s "$f" "$view$sharedir/extension/${f##*/}"
    done
fi
[[ -e $view$pkglibdir/pg_tle.so ]] || die "no pg_tle.so in the view (give PGTLE_ROOT: scripts/pgtle build)"
echo "$view$bindir"
