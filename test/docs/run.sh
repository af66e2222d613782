#!/usr/bin/env bash
# The docs test: the ```sql blocks of README.md and docs/*.md, run in order
# as a reader would, on a running cluster (PGHOST, PGPORT, PGUSER: a
# superuser; the extension installed), plus a check of the README's roles.
#
#   test/docs/run.sh [FILE...]        (default: README.md docs/*.md)
#
# Each file runs in a fresh database (CREATE DATABASE with a unique name,
# dropped at the end). README.md starts from nothing (its own CREATE
# EXTENSION block); each docs/ file starts with the extension created, as a
# reader who followed the README has it. Each block runs with psql -X -v
# ON_ERROR_STOP=1 as one script, as the cluster's superuser; the first error
# stops the test and names the file and line of the block. A block is marked
# by an HTML comment on the line before its fence (test/docs/extract.py):
#   <!-- docs-test: skip (why) -->   not run (Citus, pg_cron, fragments...)
#   <!-- docs-test: as ROLE -->      run after SET ROLE ROLE
# Prints how many blocks ran and were skipped, per file.
#
# After README.md's blocks, in its database: the roles `worker` and
# `operator` that its "Roles and grants" blocks create must have EXECUTE on
# exactly the functions listed below for them (every other function of
# schema idempotency: none), USAGE on the schema, and exactly the table
# privileges listed. The lists are the README's; change both together.
#
# Roles the blocks create (cluster-wide) are dropped afterwards, and so are
# the databases, also on failure. Exit 0 only if every block ran and the
# role check held.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
srcdir=$(cd "$here/../.." && pwd)
cd "$srcdir" || exit 2
python=${PYTHON:-/usr/bin/python3}
if (($#)); then files=("$@"); else files=(README.md docs/*.md); fi

worker_functions="claim_operation complete_operation release_operation extend_lease claim_operations complete_operations release_operations claim_operation_in_place complete_operation_in_place release_operation_in_place extend_lease_in_place use_in_place edition"
operator_functions="stale_claims resolve_operation purge_operations purge_block_range purge_refuse_transaction_block purge"
# relation:privileges (comma-separated; SELECT INSERT UPDATE DELETE TRUNCATE REFERENCES TRIGGER checked)
operator_tables="job_types:SELECT,INSERT,UPDATE,DELETE operations:SELECT resolutions:SELECT job_type_stats:SELECT"

# Debian's python3 (the extractor needs only the standard library); a clean
# minbase root has none: install it as root, or say how
if [[ ! -x $python ]]; then
    if ((EUID == 0)); then
        echo "== installing python3-minimal (Debian package)"
        apt_opts=(-o DPkg::Lock::Timeout=600 -o Dpkg::Use-Pty=0)
        export DEBIAN_FRONTEND=noninteractive
        apt-get "${apt_opts[@]}" install -y -q python3-minimal >/dev/null ||
            { apt-get "${apt_opts[@]}" update -qq && apt-get "${apt_opts[@]}" install -y -q python3-minimal >/dev/null; } ||
            { echo "docs test: apt-get install python3-minimal failed" >&2; exit 2; }
    else
        echo "docs test: $python is missing; install it with: sudo apt-get install -y python3-minimal" >&2
        exit 2
    fi
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/docs-test.XXXXXX") || exit 2
chmod 755 "$tmp"
db=
roles_before=
psql_admin() { psql -X -q -v ON_ERROR_STOP=1 -d postgres "$@"; }

drop_new_roles() {
    local r
    [[ -n $roles_before ]] || return 0
    psql_admin -At -c "SELECT rolname FROM pg_roles ORDER BY oid DESC" >"$tmp/roles_now" || return 1
    while read -r r; do
        grep -qxF -- "$r" "$tmp/roles_before" && continue
        psql_admin -c "DROP ROLE \"$r\"" >/dev/null || echo "docs test: could not drop role $r" >&2
    done <"$tmp/roles_now"
}
drop_db() {
    [[ -n $db ]] || return 0
    psql_admin -c "DROP DATABASE IF EXISTS \"$db\"" >/dev/null || echo "docs test: could not drop database $db" >&2
    db=
}
cleanup() {
    drop_db
    drop_new_roles
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

psql_admin -At -c "SELECT rolname FROM pg_roles" >"$tmp/roles_before" || { echo "docs test: cannot connect (PGHOST=${PGHOST:-} PGPORT=${PGPORT:-})" >&2; exit 2; }
roles_before=yes

mkdir "$tmp/blocks"
"$python" "$here/extract.py" "$tmp/blocks" "${files[@]}" >"$tmp/manifest" || exit 2

role_check() {   # role_check DB: the README's roles, their functions and nothing else
    local out
    out=$(psql -X -At -v ON_ERROR_STOP=1 -d "$1" \
        -v worker_functions="$worker_functions" -v operator_functions="$operator_functions" \
        -v operator_tables="$operator_tables" <<'SQL'
WITH expected_fn(role, fn) AS (
    SELECT 'worker', unnest(string_to_array(:'worker_functions', ' '))
    UNION ALL
    SELECT 'operator', unnest(string_to_array(:'operator_functions', ' '))),
roles(role) AS (VALUES ('worker'), ('operator')),
fns AS (
    SELECT p.oid, p.proname FROM pg_proc p
    JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'idempotency'),
expected_tab(role, rel, priv) AS (
    SELECT 'operator', split_part(x, ':', 1), unnest(string_to_array(split_part(x, ':', 2), ','))
    FROM unnest(string_to_array(:'operator_tables', ' ')) x),
rels AS (
    SELECT c.oid, c.relname FROM pg_class c
    JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = 'idempotency' AND c.relkind IN ('r', 'v', 'm', 'S', 'p', 'f')),
privs(priv) AS (VALUES ('SELECT'), ('INSERT'), ('UPDATE'), ('DELETE'), ('TRUNCATE'), ('REFERENCES'), ('TRIGGER'))
SELECT format('missing role %s (the README creates it)', role)
FROM roles WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = role)
UNION ALL
SELECT format('%s: no function %s in schema idempotency', e.role, e.fn)
FROM expected_fn e WHERE NOT EXISTS (SELECT FROM fns WHERE proname = e.fn)
UNION ALL
SELECT format('%s: EXECUTE on %s is %s, expected %s', r.role, f.oid::regprocedure,
              has_function_privilege(r.role, f.oid, 'EXECUTE'), e.fn IS NOT NULL)
FROM roles r CROSS JOIN fns f
LEFT JOIN expected_fn e ON e.role = r.role AND e.fn = f.proname
WHERE EXISTS (SELECT FROM pg_roles WHERE rolname = r.role)
  AND has_function_privilege(r.role, f.oid, 'EXECUTE') IS DISTINCT FROM (e.fn IS NOT NULL)
UNION ALL
SELECT format('%s: no USAGE on schema idempotency', r.role)
FROM roles r WHERE EXISTS (SELECT FROM pg_roles WHERE rolname = r.role)
  AND NOT has_schema_privilege(r.role, 'idempotency', 'USAGE')
UNION ALL
SELECT format('%s: %s on idempotency.%s is %s, expected %s', r.role, p.priv, t.relname,
              has_table_privilege(r.role, t.oid, p.priv), e.rel IS NOT NULL)
FROM roles r CROSS JOIN rels t CROSS JOIN privs p
LEFT JOIN expected_tab e ON e.role = r.role AND e.rel = t.relname AND e.priv = p.priv
WHERE EXISTS (SELECT FROM pg_roles WHERE rolname = r.role)
  AND NOT (t.oid IN (SELECT oid FROM pg_class WHERE relkind = 'S') AND p.priv NOT IN ('SELECT', 'UPDATE'))
  AND has_table_privilege(r.role, t.oid, p.priv)
      IS DISTINCT FROM (e.rel IS NOT NULL);
SQL
    ) || { echo "not ok - role check: the query failed"; return 1; }
    if [[ -n $out ]]; then
        echo "not ok - README roles worker and operator: privileges differ from the documented lists"
        sed 's/^/    /' <<<"$out"
        return 1
    fi
    local nw no
    nw=$(wc -w <<<"$worker_functions"); no=$(wc -w <<<"$operator_functions")
    echo "ok - README roles: worker can execute exactly its $nw functions, operator exactly its $no; USAGE on the schema; table privileges as documented"
}

failed=0
summary=()
current=
ran=0
skipped=0
finish_file() {
    [[ -n $current ]] || return 0
    if [[ $current == README.md ]] && ((failed == 0)); then
        role_check "$db" || failed=1
    fi
    summary+=("$current: $ran blocks run, $skipped skipped")
    echo "# $current: $ran blocks run, $skipped skipped"
    drop_db
    drop_new_roles
    current=
}
start_file() {
    current=$1; ran=0; skipped=0
    db="docs_test_$$_$(date +%s)_${#summary[@]}"
    psql_admin -c "CREATE DATABASE \"$db\"" >/dev/null || { echo "not ok - CREATE DATABASE $db"; failed=1; return 1; }
    if [[ $current != README.md ]]; then
        psql -X -q -v ON_ERROR_STOP=1 -d "$db" -c 'CREATE EXTENSION idempotency' >/dev/null ||
            { echo "not ok - CREATE EXTENSION idempotency in $db"; failed=1; return 1; }
    fi
}

# every file is started even without blocks, so that it is counted
for f in "${files[@]}"; do
    ((failed)) && break
    start_file "$f" || break
    while IFS=$'\t' read -r n file line mode role reason; do
        [[ $file == "$f" ]] || continue
        if [[ $mode == skip ]]; then
            skipped=$((skipped + 1))
            echo "skip - $file:$line ($reason)"
            continue
        fi
        script=$tmp/blocks/$n.sql
        if [[ $role != - ]]; then
            { echo "SET ROLE \"$role\";"; cat "$tmp/blocks/$n.sql"; } >"$tmp/blocks/$n.as.sql"
            script=$tmp/blocks/$n.as.sql
        fi
        if psql -X -v ON_ERROR_STOP=1 -d "$db" -f "$script" >"$tmp/out" 2>&1; then
            ran=$((ran + 1))
            label=; [[ $role != - ]] && label=" (as $role)"
            echo "ok - $file:$line$label"
        else
            label=; [[ $role != - ]] && label=" (as $role)"
            echo "not ok - $file:$line: the block failed$label"
            sed 's/^/    /' "$tmp/blocks/$n.sql"
            echo "  psql said:"
            sed 's/^/    /' "$tmp/out"
            failed=1
            break
        fi
    done <"$tmp/manifest"
    finish_file
done

echo "docs test: ${summary[*]/%/;}" | sed 's/;$//'
if ((failed)); then
    echo "docs test: FAILED"
    exit 1
fi
echo "docs test: passed"
