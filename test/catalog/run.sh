#!/usr/bin/env bash
# test/catalog/run.sh: a fresh install and an updated one have the same
# catalog. On a running cluster (PGHOST, PGPORT, PGUSER: a superuser; the
# extension of this tree installed, `make install`):
#
#   test/catalog/run.sh
#
# 1. The default version V (idempotency.control) has its own install
#    script, idempotency--V.sql (the consolidated script a fresh install
#    runs), and the installed control file and scripts are this tree's.
# 2. CREATE EXTENSION idempotency (V, from idempotency--V.sql) in one fresh
#    database; in another, CREATE EXTENSION idempotency VERSION 'F' and
#    ALTER EXTENSION idempotency UPDATE, for every other version F that has
#    an install script (today 0.1: 0.1 -> 0.2 -> 0.3 -> 0.4 -> 0.5; 0.3 and
#    0.4 -> 0.5). Both must be at V, and idempotency.edition() must answer
#    edition c, version V in each (the version a client reads, since 0.5).
# 3. Each database's catalog as canonical text (test/catalog/catalog.sql:
#    functions with their bodies, settings, grants and comments; columns
#    with types and defaults; indexes, constraints, triggers, views, types
#    and enum labels, extension members, extconfig, initial privileges,
#    comments, dependencies), and pg_dump --schema-only --binary-upgrade (it
#    dumps every member of the extension, as pg_upgrade restores it; OIDs,
#    xids and \restrict keys left out). Any difference fails and is printed
#    (diff -u: "-" fresh install, "+" updated).
# 4. Self-test: copies of idempotency--V.sql, each changed in one way (a
#    comment, a missing REVOKE, a column default, a volatility, a setting,
#    SECURITY DEFINER, a function body, a pg_extension_config_dump call),
#    installed as version 'V.selftest' (idempotency--V.selftest.sql,
#    written into the installation's extension directory for the moment of
#    its CREATE EXTENSION and removed right after, also on failure): each
#    must differ from the fresh install, in the lines that name the changed
#    object; the changed lines are printed.
#    CATALOG_SELFTEST=0 leaves it out (and says so).
#
# Databases are made with unique names and dropped at the end, also on
# failure. Exit 0 only if every comparison and every self-test held.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
srcdir=$(cd "$here/../.." && pwd)
cd "$srcdir" || exit 2

PG_CONFIG=${PG_CONFIG:-pg_config}
bindir=${PG_BINDIR:-$("$PG_CONFIG" --bindir)}
share=$("$PG_CONFIG" --sharedir)/extension

tmp=$(mktemp -d "${TMPDIR:-/tmp}/catalog-test.XXXXXX") || exit 2
dbs=() selftest_file=
failures=0 passes=0
psql_admin() { "$bindir/psql" -X -q -v ON_ERROR_STOP=1 -d postgres "$@"; }
psql_in() { local d=$1; shift; "$bindir/psql" -X -q -v ON_ERROR_STOP=1 -d "$d" "$@"; }
cleanup() {
    local db
    [[ -n $selftest_file ]] && rm -f "$selftest_file"
    for db in "${dbs[@]}"; do
        psql_admin -c "DROP DATABASE IF EXISTS \"$db\"" >/dev/null 2>&1 ||
            echo "catalog test: could not drop database $db" >&2
    done
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

ok() { passes=$((passes + 1)); echo "ok: $*"; }
not_ok() { failures=$((failures + 1)); echo "not ok: $*"; }
die() { echo "catalog test: $*" >&2; exit 1; }

# --- 1. the scripts ----------------------------------------------------------
version=$(sed -n "s/^default_version[[:space:]]*=[[:space:]]*'\(.*\)'/\1/p" idempotency.control)
[[ -n $version ]] || die "no default_version in idempotency.control"
script=idempotency--$version.sql
[[ -f $script ]] ||
    die "default_version is '$version' but there is no $script: a fresh install would run the upgrade chain. Write the consolidated script of $version (docs/upgrades.md)"
for f in idempotency.control idempotency--*.sql; do
    cmp -s "$f" "$share/$f" ||
        die "$share/$f is not this tree's $f: run make install (scripts/test does) before this test"
done
for f in "$share"/idempotency--*.sql; do
    [[ -f $(basename "$f") ]] ||
        die "$f is installed but not in this tree: a stale script (from another checkout?) could take part in CREATE EXTENSION; remove it"
done
# every other version with an install script, updated to the default
from_versions=()
for f in idempotency--*.sql; do
    v=${f#idempotency--}; v=${v%.sql}
    [[ $v == *--* || $v == "$version" ]] && continue
    from_versions+=("$v")
done
((${#from_versions[@]})) || die "no install script of an older version (idempotency--0.1.sql): nothing to update from"
echo "default version $version ($script); updated from: ${from_versions[*]}"

# --- helpers -------------------------------------------------------------------
# newdb LABEL: a fresh database, its name in $db
newdb() {
    db="catalog_$1_$$"
    psql_admin -c "CREATE DATABASE \"$db\"" >/dev/null || die "CREATE DATABASE $db failed"
    dbs+=("$db")
}
# describe DB OUT: the canonical catalog text and the filtered pg_dump
describe() {
    local db=$1 out=$2
    psql_in "$db" -At -f "$here/catalog.sql" >"$out.catalog" 2>"$out.err" ||
        { cat "$out.err" >&2; die "test/catalog/catalog.sql failed in $db"; }
    # what the comparison cannot tell apart: OIDs, xids, the random key of
    # \restrict (pg_dump 17.6+, 15.14+)
    "$bindir/pg_dump" --schema-only --binary-upgrade -d "$db" 2>"$out.err" |
        sed -E -e '/^\\(un)?restrict /d' \
               -e '/binary_upgrade_set_next_/d' \
               -e "s/relfrozenxid = '[0-9]+', relminmxid = '[0-9]+'/relfrozenxid = XID, relminmxid = XID/" \
               -e "s/^WHERE oid = '[0-9]+';/WHERE oid = OID;/" \
               -e "s/(binary_upgrade_create_empty_extension\('[^']*', '[^']*', [a-z]+, '[^']*', )'\{[0-9,]*\}'/\1'{OIDS}'/" \
               -e "s/'$version\.selftest'/'$version'/" >"$out.dump"
    ((PIPESTATUS[0] == 0)) || { cat "$out.err" >&2; die "pg_dump of $db failed"; }
}
# compare A B LABEL_A LABEL_B DIFF: 0 if both texts are the same
compare() {
    local a=$1 b=$2 la=$3 lb=$4 d=$5 rc=0
    : >"$d"
    diff -u --label "$la (catalog.sql)" --label "$lb (catalog.sql)" "$a.catalog" "$b.catalog" >>"$d" || rc=1
    diff -u --label "$la (pg_dump)" --label "$lb (pg_dump)" "$a.dump" "$b.dump" >>"$d" || rc=1
    return $rc
}
extversion() {
    psql_in "$1" -At -c "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'"
}
# edition DB: what idempotency.edition() answers, "EDITION VERSION"
edition() {
    psql_in "$1" -At -c "SELECT edition || ' ' || version FROM idempotency.edition()"
}

# --- 2./3. fresh and updated ------------------------------------------------------
newdb fresh; fresh=$db
psql_in "$fresh" -c "CREATE EXTENSION idempotency" >/dev/null || die "CREATE EXTENSION idempotency failed"
[[ $(extversion "$fresh") == "$version" ]] || die "the fresh install is at $(extversion "$fresh"), not $version"
if [[ $(edition "$fresh") == "c $version" ]]; then
    ok "fresh $version: idempotency.edition() answers c $version"
else
    not_ok "fresh $version: idempotency.edition() answers '$(edition "$fresh")', not 'c $version'"
fi
describe "$fresh" "$tmp/fresh"
if grep '^UNCOMPARED' "$tmp/fresh.catalog"; then
    not_ok "the extension has members test/catalog/catalog.sql does not describe (above): extend it"
fi
echo "fresh install: $(wc -l <"$tmp/fresh.catalog") catalog lines, $(wc -l <"$tmp/fresh.dump") pg_dump lines"

for from in "${from_versions[@]}"; do
    newdb "from_${from//[^0-9a-z]/_}"
    path=$(psql_in "$db" -At -c \
        "SELECT path FROM pg_extension_update_paths('idempotency') WHERE source = '$from' AND target = '$version'")
    if [[ -z $path ]]; then
        not_ok "no update path from $from to $version"
        continue
    fi
    psql_in "$db" -c "CREATE EXTENSION idempotency VERSION '$from'" -c "ALTER EXTENSION idempotency UPDATE" >/dev/null ||
        die "CREATE EXTENSION idempotency VERSION '$from'; ALTER EXTENSION idempotency UPDATE failed"
    got=$(extversion "$db")
    if [[ $got != "$version" ]]; then
        not_ok "$from updated: at $got, not $version"
        continue
    fi
    got=$(edition "$db")
    if [[ $got != "c $version" ]]; then
        not_ok "$from updated: idempotency.edition() answers '$got', not 'c $version'"
    fi
    describe "$db" "$tmp/from-$from"
    if compare "$tmp/fresh" "$tmp/from-$from" "fresh $version" "$from updated ($path)" "$tmp/diff-$from"; then
        ok "fresh $version and $from updated to $version ($path): the same catalog ($(wc -l <"$tmp/fresh.catalog") catalog lines, $(wc -l <"$tmp/fresh.dump") pg_dump lines)"
    else
        cat "$tmp/diff-$from"
        not_ok "fresh $version and $from updated to $version ($path) differ (diff above: - fresh, + updated)"
    fi
done

# --- 4. self-test: a changed consolidated script must be seen -----------------------
# NAME|PATTERN|SED: SED changes a copy of the script; the diff against the
# fresh install must have a changed line ("-" or "+") matching PATTERN
# (grep -E)
mutations=(
    "a changed comment|^[-+]comment on function idempotency\.job_types_guard\(\)|s/^'Trigger: refuses to delete or rename a job type that still has operations';\$/'Trigger: refuses to delete or rename a job type that has operations';/"
    "a missing REVOKE|^[-+]initial privileges of function idempotency\.distribute\(\)|/^REVOKE ALL ON FUNCTION idempotency\.distribute\(\) FROM PUBLIC;\$/d"
    "a changed column default|^[-+]relation idempotency\.job_types: column 2 lease: .*default '00:11:00'|s/DEFAULT '10 minutes'/DEFAULT '11 minutes'/"
    "a changed volatility|^[-+]function idempotency\.delegated_functions\(\): .*volatility s|s/^LANGUAGE sql IMMUTABLE PARALLEL SAFE\$/LANGUAGE sql STABLE PARALLEL SAFE/"
    "a changed setting|^[-+]function idempotency\.job_types_guard\(\): .*settings \{search_path=pg_catalog\}|0,/^SET search_path = pg_catalog, pg_temp\$/s//SET search_path = pg_catalog/"
    "a missing SECURITY DEFINER|^[-+]function idempotency\.job_types_truncate_guard\(\): .*security definer f|/^CREATE FUNCTION idempotency\.job_types_truncate_guard\(\)/,/^AS/{/^SECURITY DEFINER\$/d}"
    "a changed function body|^[-+]function idempotency\.purge\(integer,interval,bigint\): prosrc line|s/^        -- a batch that deleted nothing wrote \(next to\) no WAL: no pause\$/        -- no pause after a batch that deleted nothing/"
    "a missing pg_extension_config_dump|^[-+]extension idempotency: extconfig 4: idempotency\.resolutions_id_seq|/pg_extension_config_dump\('idempotency\.resolutions_id_seq'/d"
)
if [[ ${CATALOG_SELFTEST:-1} == 0 ]]; then
    echo "self-test: left out (CATALOG_SELFTEST=0)"
elif [[ ! -w $share ]]; then
    not_ok "self-test: cannot write $share (the mutated scripts are installed there for a moment); CATALOG_SELFTEST=0 leaves it out"
else
    n=0
    for m in "${mutations[@]}"; do
        n=$((n + 1))
        name=${m%%|*}; rest=${m#*|}; pattern=${rest%%|*}; expr=${rest#*|}
        sed -E -e "$expr" "$script" >"$tmp/mutated.sql"
        if cmp -s "$script" "$tmp/mutated.sql"; then
            not_ok "self-test $n ($name): the change did not apply to $script (sed: $expr)"
            continue
        fi
        newdb "selftest_$n"
        selftest_file=$share/idempotency--$version.selftest.sql
        cp "$tmp/mutated.sql" "$selftest_file"
        rc=0
        psql_in "$db" -c "CREATE EXTENSION idempotency VERSION '$version.selftest'" >"$tmp/selftest.log" 2>&1 || rc=$?
        rm -f "$selftest_file"; selftest_file=
        if ((rc)); then
            cat "$tmp/selftest.log"
            not_ok "self-test $n ($name): CREATE EXTENSION of the changed script failed (above)"
            continue
        fi
        describe "$db" "$tmp/selftest-$n"
        if compare "$tmp/fresh" "$tmp/selftest-$n" "fresh $version" "changed copy" "$tmp/selftest-$n.diff"; then
            not_ok "self-test $n ($name): the changed script gave the same catalog; the comparison misses it"
        elif ! grep -qE -- "$pattern" "$tmp/selftest-$n.diff"; then
            cat "$tmp/selftest-$n.diff"
            not_ok "self-test $n ($name): a difference, but no changed line matches $pattern (diff above)"
        else
            ok "self-test $n ($name): seen ($(grep -cE '^[-+][^-+]' "$tmp/selftest-$n.diff") changed lines):"
            grep -E '^[-+][^-+]' "$tmp/selftest-$n.diff" | cut -c1-200 | sed 's/^/    /'
        fi
        psql_admin -c "DROP DATABASE \"$db\"" >/dev/null && unset 'dbs[-1]'
    done
fi

echo "catalog test: $passes passed, $failures failed"
((failures == 0))
