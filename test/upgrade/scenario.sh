#!/usr/bin/env bash
# test/upgrade/scenario.sh: a PostgreSQL 15 cluster holding records of every
# kind goes through a major-version upgrade the way a Debian user does it
# (pg_upgradecluster from postgresql-common), and the protocol goes on.
#
#   test/upgrade/scenario.sh NEW_MAJOR BUILD_DIR
#
# Run as root on a Debian system (a throwaway root: test/upgrade/in-root.sh)
# where postgresql-15 and postgresql-NEW_MAJOR are installed, the extension is
# installed for 15, and BUILD_DIR holds the extension built (not yet
# installed) for NEW_MAJOR. It makes clusters with pg_createcluster, so it must
# not run on a machine whose clusters matter.
#
# Steps:
#  1. two 15 clusters (main, viadump), each with database "app" (extension at
#     the default version, records of every kind: test/upgrade/records.sql)
#     and database "legacy" (extension at 0.1: test/upgrade/records-0.1.sql);
#     a snapshot of every record, job type, audit row, sequence, member and
#     grant is kept;
#  2. pg_upgradecluster -m upgrade (pg_upgrade) BEFORE the extension is
#     installed for NEW_MAJOR: must fail, naming the missing library, and
#     leave the 15 cluster working;
#  3. make install for NEW_MAJOR; pg_upgradecluster -m upgrade 15 main
#     (pg_upgrade) and pg_upgradecluster -m dump 15 viadump (pg_dump and
#     restore, Debian's default method), "legacy" in viadump first updated
#     to the default version on 15, as the README says to;
#  4. on each upgraded cluster: the snapshot is unchanged, completed keys
#     answer completed with their result, the held claim is still held, the
#     young claim is in progress, takeovers get the next attempt and the old
#     attempt is refused with ID003, the worker_role is enforced (42501),
#     released keys run; in "legacy", the 0.1 definitions work on the new
#     library, ALTER EXTENSION idempotency UPDATE goes to the default version
#     and the protocol goes on; a dump of "legacy" taken at 0.1 does not
#     restore where 0.3 is installed (why the README says to update first).
# Every check prints "ok" or "FAIL" with what was expected and what came; the
# exit status is 1 if any failed.
set -euo pipefail

NEW=${1:?usage: scenario.sh NEW_MAJOR BUILD_DIR}
BUILD_DIR=${2:?usage: scenario.sh NEW_MAJOR BUILD_DIR}
OLD=${UPGRADE_OLD_MAJOR:-15}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DEFAULT_VERSION=$(sed -n "s/^default_version[[:space:]]*=[[:space:]]*'\(.*\)'/\1/p" "$BUILD_DIR/idempotency.control")

work=$(mktemp -d /var/tmp/upgrade-scenario.XXXXXX)
chmod 755 "$work"
cp "$here"/records.sql "$here"/records-0.1.sql "$work/"
chown -R postgres:postgres "$work"

checks=0
failures=0
t_start=$SECONDS
phase() { echo "== [$((SECONDS - t_start)) s] $*"; }

cleanup() {
    local v c
    set +e
    for v in "$OLD" "$NEW"; do
        for c in main viadump; do
            [[ -d /etc/postgresql/$v/$c ]] && pg_dropcluster --stop "$v" "$c" >/dev/null 2>&1
        done
    done
    rm -rf "$work"
}
trap cleanup EXIT

# check NAME EXPECTED ACTUAL
check() {
    checks=$((checks + 1))
    if [[ $2 == "$3" ]]; then
        echo "ok   $1"
    else
        failures=$((failures + 1))
        echo "FAIL $1"
        echo "     expected: $2"
        echo "     got:      $3"
    fi
}

port_of() { pg_conftool -s "$1" "$2" show port; }

# q VERSION CLUSTER DB ROLE SQL: the rows (unaligned, |-separated), or
# "error SQLSTATE" if the statement failed (ROLE empty: the superuser)
q() {
    local port out rc=0
    port=$(port_of "$1" "$2")
    out=$( { echo '\set VERBOSITY sqlstate'
             echo 'SET client_min_messages = warning;'
             [[ -n $4 ]] && echo "SET ROLE $4;"
             echo "$5"; } |
          (cd "$work" && runuser -u postgres -- psql -XAtq -v ON_ERROR_STOP=1 \
              -h /var/run/postgresql -p "$port" -d "$3" 2>&1)) || rc=$?
    if ((rc)); then
        local state
        state=$(grep -oE 'ERROR:  [0-9A-Z]{5}' <<<"$out" | head -n 1 | cut -c9-)
        echo "error ${state:-?} (${out//$'\n'/ })"
        return 0
    fi
    printf '%s\n' "$out"
}
# err VERSION CLUSTER DB ROLE SQL: the SQLSTATE it failed with, or "no error"
err() {
    local out
    out=$(q "$@")
    if [[ $out == error\ * ]]; then
        out=${out#error }
        echo "${out%% *}"
    else
        echo "no error (${out//$'\n'/ })"
    fi
}

# psql_file VERSION CLUSTER DB FILE: run a script, its output to the log
psql_file() {
    local port
    port=$(port_of "$1" "$2")
    (cd "$work" && runuser -u postgres -- psql -XAtq -v ON_ERROR_STOP=1 \
        -h /var/run/postgresql -p "$port" -d "$3" -f "$4") >"$work/$2-$3-records.log" 2>&1 || {
        cat "$work/$2-$3-records.log"
        echo "FAIL making the records in $2/$3 (output above)"
        exit 1
    }
}

# snapshot VERSION CLUSTER DB: every record, job type and audit row, the
# audit's sequence, the extension's members (types aside: 17+ also records
# the tables' row and array types) with their comments, every grant to
# someone other than the owner, and the roles' memberships
snapshot() {
    local port
    port=$(port_of "$1" "$2")
    runuser -u postgres -- psql -XAtq -v ON_ERROR_STOP=1 -h /var/run/postgresql -p "$port" -d "$3" <<'EOF'
\echo -- operations
COPY (SELECT job_type, operation_key, status, attempt, claimed_at, heartbeat_at, completed_at,
             claimed_by, fingerprint, result
      FROM idempotency.operations ORDER BY job_type, operation_key) TO STDOUT;
\echo -- job_types
COPY (SELECT * FROM idempotency.job_types ORDER BY job_type) TO STDOUT;
\echo -- resolutions
COPY (SELECT * FROM idempotency.resolutions ORDER BY id) TO STDOUT;
\echo -- sequence
SELECT s.last_value, s.is_called FROM idempotency.resolutions_id_seq s;
\echo -- members
SELECT pg_describe_object(classid, objid, objsubid) || ' | ' ||
       coalesce(obj_description(objid, classid::regclass::name), '(no comment)')
FROM pg_depend
WHERE refclassid = 'pg_extension'::regclass AND deptype = 'e'
  AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idempotency')
  AND classid <> 'pg_type'::regclass
ORDER BY 1;
\echo -- grants
SELECT o.kind || ' ' || o.name || ' | ' || coalesce(g.rolname, 'PUBLIC') || ' ' || a.privilege_type
       || CASE WHEN a.is_grantable THEN ' (grantable)' ELSE '' END
FROM (SELECT 'function', oid::regprocedure::text, proacl, proowner FROM pg_proc
      WHERE pronamespace = 'idempotency'::regnamespace
      UNION ALL
      SELECT 'relation', oid::regclass::text, relacl, relowner FROM pg_class
      WHERE relnamespace = 'idempotency'::regnamespace
      UNION ALL
      SELECT 'schema', nspname, nspacl, nspowner FROM pg_namespace WHERE nspname = 'idempotency'
     ) o(kind, name, acl, owner),
     LATERAL aclexplode(o.acl) a
     LEFT JOIN pg_roles g ON g.oid = a.grantee
WHERE a.grantee <> o.owner
ORDER BY 1;
\echo -- roles
SELECT r.rolname || ' member of ' || m.rolname FROM pg_auth_members am
JOIN pg_roles r ON r.oid = am.member JOIN pg_roles m ON m.oid = am.roleid
WHERE r.rolname LIKE 'upg\_%' ORDER BY 1;
EOF
}

# compare NAME BEFORE AFTER: the snapshots must be equal
compare() {
    checks=$((checks + 1))
    if diff -u "$2" "$3" >"$work/diff" 2>&1; then
        echo "ok   $1 ($(grep -vc '^--' "$2") lines)"
    else
        failures=$((failures + 1))
        echo "FAIL $1: expected the snapshot before the upgrade (-), got (+):"
        sed 's/^/     /' "$work/diff"
    fi
}

phase "PostgreSQL $OLD ($("/usr/lib/postgresql/$OLD/bin/postgres" --version)) -> $NEW ($("/usr/lib/postgresql/$NEW/bin/postgres" --version)); extension default version $DEFAULT_VERSION"

# --- 1. the old clusters, with records --------------------------------------
for c in main viadump; do
    phase "pg_createcluster $OLD $c"
    pg_createcluster "$OLD" "$c" >/dev/null
    # Unix socket only: the root shares the host's network (pg_upgradecluster
    # copies postgresql.conf to the new cluster)
    echo "listen_addresses = ''" >>"/etc/postgresql/$OLD/$c/postgresql.conf"
    pg_ctlcluster "$OLD" "$c" start
    runuser -u postgres -- createdb -h /var/run/postgresql -p "$(port_of "$OLD" "$c")" app
    runuser -u postgres -- createdb -h /var/run/postgresql -p "$(port_of "$OLD" "$c")" legacy
    psql_file "$OLD" "$c" app "$work/records.sql"
    psql_file "$OLD" "$c" legacy "$work/records-0.1.sql"
    snapshot "$OLD" "$c" app >"$work/$c-app.before"
    snapshot "$OLD" "$c" legacy >"$work/$c-legacy.before"
done
check "the old cluster is $OLD" "$OLD" "$(q "$OLD" main app '' 'SHOW server_version_num' | cut -c1-2)"
check "app on $OLD: extension at the default version" "$DEFAULT_VERSION" \
    "$(q "$OLD" main app '' "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'")"
check "legacy on $OLD: extension at 0.1" "0.1" \
    "$(q "$OLD" main legacy '' "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'")"
check "app on $OLD: a record of every kind" \
    "a_invoice AI-1 completed 1,a_invoice AI-2 claimed 1,charge CH-1 claimed 1,charge CH-2 completed 2,charge_lookup LK-1 claimed 1,nightly_report NR-1 claimed 1,post_slack SL-1 skipped 1,send_confirmation ORD-1001 completed 1,send_confirmation ORD-1002 claimed 1,send_confirmation ORD-1003 released 1,send_confirmation ORD-1004 completed 1,send_confirmation ORD-1005 released 1" \
    "$(q "$OLD" main app '' "SELECT string_agg(concat_ws(' ', job_type, operation_key, status, attempt), ',' ORDER BY job_type, operation_key) FROM idempotency.operations")"
check "app on $OLD: the held claim answers held" "held|1" \
    "$(q "$OLD" main app upg_worker "SELECT verdict, attempt FROM idempotency.claim_operation('send_confirmation', 'ORD-1002', 'fp-1002')")"
check "app on $OLD: two resolutions in the audit" "1 ORD-1004 completed,2 ORD-1005 retry" \
    "$(q "$OLD" main app '' "SELECT string_agg(concat_ws(' ', id, operation_key, resolution), ',' ORDER BY id) FROM idempotency.resolutions")"

# --- 2. without the extension for the new major, the upgrade must refuse ----
phase "pg_upgradecluster -m upgrade -v $NEW $OLD main, the extension not installed for $NEW"
rc=0
pg_upgradecluster -m upgrade -v "$NEW" "$OLD" main >"$work/refused.log" 2>&1 || rc=$?
check "pg_upgradecluster without the extension for $NEW fails" "fails" "$( ((rc)) && echo fails || echo "exit 0")"
check "... and says a loadable library is missing" "yes" \
    "$(grep -q 'loadable libraries' "$work/refused.log" && echo yes || { echo "no:"; tail -n 20 "$work/refused.log"; })"
libs=$(find /var/log/postgresql -name loadable_libraries.txt 2>/dev/null | head -n 1)
if [[ -n $libs ]]; then
    check "... naming idempotency" "yes" "$(grep -q idempotency "$libs" && echo yes || cat "$libs")"
fi
check "... and leaves no $NEW cluster behind" "no" "$([[ -d /etc/postgresql/$NEW/main ]] && echo yes || echo no)"
pg_ctlcluster "$OLD" main status >/dev/null 2>&1 || pg_ctlcluster "$OLD" main start
check "the $OLD cluster still answers afterwards" 'completed|1|{"message_id": "m-8812"}' \
    "$(q "$OLD" main app upg_worker "SELECT * FROM idempotency.claim_operation('send_confirmation', 'ORD-1001', 'fp-1001')")"
snapshot "$OLD" main app >"$work/main-app.after-refusal"
compare "app on $OLD unchanged by the refused upgrade" "$work/main-app.before" "$work/main-app.after-refusal"

# --- 3. install the extension for the new major, upgrade ---------------------
phase "make install for $NEW"
make -C "$BUILD_DIR" --no-print-directory -s install with_llvm=no \
    PG_CONFIG="/usr/lib/postgresql/$NEW/bin/pg_config" >"$work/install.log" 2>&1 ||
    { cat "$work/install.log"; echo "FAIL make install for $NEW"; exit 1; }

# The dump method creates the extension at the newest version installed for
# the new major (pg_dump writes CREATE EXTENSION without VERSION), so a
# database on an older extension version is updated on the old cluster first
# (README, "Major-version upgrade"): 0.3 changed claim_operation's
# signature, and an old dump's GRANT on claim_operation(text, text, text,
# text) names a function 0.3 does not have. Keep such a dump to show that.
port=$(port_of "$OLD" viadump)
runuser -u postgres -- "/usr/lib/postgresql/$OLD/bin/pg_dump" -h /var/run/postgresql -p "$port" \
    -d legacy -f "$work/legacy-0.1.sql"
check "viadump: legacy on $OLD updated first (ALTER EXTENSION idempotency UPDATE)" "$DEFAULT_VERSION" \
    "$(q "$OLD" viadump legacy '' "ALTER EXTENSION idempotency UPDATE; SELECT extversion FROM pg_extension WHERE extname = 'idempotency'")"
snapshot "$OLD" viadump legacy >"$work/viadump-legacy.updated-before"
check "viadump: ... the worker's grant moved to the new signature" "1" \
    "$(grep -c '^function idempotency.claim_operation(text,text,text,text,text,boolean) | upg_worker EXECUTE$' "$work/viadump-legacy.updated-before")"

declare -A took=()
for c in main viadump; do
    method=upgrade
    [[ $c == viadump ]] && method=dump
    phase "pg_upgradecluster -m $method -v $NEW $OLD $c"
    t0=$SECONDS
    rc=0
    pg_upgradecluster -m "$method" -v "$NEW" "$OLD" "$c" >"$work/upgrade-$c.log" 2>&1 || rc=$?
    took[$c]=$((SECONDS - t0))
    if ((rc)); then
        cat "$work/upgrade-$c.log"
        # pg_upgrade's own logs (pg_upgradecluster keeps them on failure)
        find /var/log/postgresql -path '*pg_upgradecluster*' -name '*.log' 2>/dev/null |
            while IFS= read -r f; do
                if grep -q 'error' "$f"; then
                    echo "--- errors in $f"; grep -B 3 -A 30 -m 3 'error' "$f"
                else
                    echo "--- last lines of $f"; tail -n 15 "$f"
                fi
            done
        if grep -rqs 'unrecognized parameter "pg_attver"' /var/log/postgresql; then
            echo "     (PostgreSQL's version skew, not this extension's: the $OLD cluster's minor"
            echo "     marks every table column with pg_attver, which this $NEW minor cannot restore;"
            echo "     a newer $NEW minor is needed)"
        fi
        check "pg_upgradecluster -m $method $OLD $c" "exit 0" "exit $rc (log above)"
        continue
    fi
    check "pg_upgradecluster -m $method $OLD $c (${took[$c]} s)" "exit 0" "exit 0"
    pg_ctlcluster "$NEW" "$c" status >/dev/null 2>&1 || pg_ctlcluster "$NEW" "$c" start
done

# --- 4. the protocol goes on --------------------------------------------------
for c in main viadump; do
    [[ -d /etc/postgresql/$NEW/$c ]] || continue
    method=upgrade
    [[ $c == viadump ]] && method=dump
    phase "checks on $NEW/$c (pg_upgradecluster -m $method)"
    w() { q "$NEW" "$c" app upg_worker "$1"; }
    we() { err "$NEW" "$c" app "${2:-upg_worker}" "$1"; }
    check "[$c] the upgraded cluster is $NEW" "$NEW" "$(q "$NEW" "$c" app '' 'SHOW server_version_num' | cut -c1-2)"
    check "[$c] app: extension still at $DEFAULT_VERSION" "$DEFAULT_VERSION" \
        "$(q "$NEW" "$c" app '' "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'")"
    check "[$c] app: idempotency.edition() answers c $DEFAULT_VERSION" "c|$DEFAULT_VERSION" \
        "$(q "$NEW" "$c" app '' "SELECT edition, version FROM idempotency.edition()")"
    snapshot "$NEW" "$c" app >"$work/$c-app.after"
    compare "[$c] app: records, job types, audit, sequence, members, grants and roles as before" \
        "$work/$c-app.before" "$work/$c-app.after"

    check "[$c] completed key: completed with its result" 'completed|1|{"message_id": "m-8812"}' \
        "$(w "SELECT * FROM idempotency.claim_operation('send_confirmation', 'ORD-1001', 'fp-1001')")"
    check "[$c] completed key with another payload: ID002" "ID002" \
        "$(we "SELECT * FROM idempotency.claim_operation('send_confirmation', 'ORD-1001', 'fp-other')")"
    check "[$c] completed by a takeover (attempt 2): completed with its result" \
        'completed|2|{"amount": 4200, "charge_id": "ch_2"}' \
        "$(w "SELECT * FROM idempotency.claim_operation('charge', 'CH-2')")"
    check "[$c] completed by a person: completed" "completed|1" \
        "$(w "SELECT verdict, attempt FROM idempotency.claim_operation('send_confirmation', 'ORD-1004')")"
    check "[$c] the held claim is still held" "held|1" \
        "$(w "SELECT verdict, attempt FROM idempotency.claim_operation('send_confirmation', 'ORD-1002', 'fp-1002')")"
    check "[$c] stale_claims() lists the stale claims" \
        "charge CH-1 1 retry,charge_lookup LK-1 1 lookup,send_confirmation ORD-1002 1 hold" \
        "$(q "$NEW" "$c" app upg_operator "SELECT string_agg(concat_ws(' ', job_type, operation_key, attempt, stale_policy), ',' ORDER BY job_type, operation_key) FROM idempotency.stale_claims()")"
    check "[$c] the young claim is in progress" "in_progress|1" \
        "$(w "SELECT verdict, attempt FROM idempotency.claim_operation('nightly_report', 'NR-1', 'fp-nr-1')")"
    check "[$c] its worker's heartbeat is accepted" "t" \
        "$(w "SELECT idempotency.extend_lease('nightly_report', 'NR-1', 1) > now()")"
    check "[$c] skipped stays skipped" "skipped|1" \
        "$(w "SELECT verdict, attempt FROM idempotency.claim_operation('post_slack', 'SL-1')")"

    # a takeover under retry: the next attempt; the dead worker's is fenced off
    check "[$c] stale claim under retry: taken over with attempt 2" "run|2" \
        "$(w "SELECT verdict, attempt FROM idempotency.claim_operation('charge', 'CH-1', 'fp-ch-1', 'new-host/pid-1')")"
    check "[$c] the old attempt 1 is refused: ID003" "ID003" \
        "$(we "SELECT idempotency.complete_operation('charge', 'CH-1', 1)")"
    check "[$c] ... and cannot release it either: ID003" "ID003" \
        "$(we "SELECT idempotency.release_operation('charge', 'CH-1', 1)")"
    check "[$c] the new attempt completes" "" \
        "$(w "SELECT idempotency.complete_operation('charge', 'CH-1', 2, '{\"charge_id\": \"ch_1\"}')")"
    check "[$c] ... and the key answers completed" 'completed|2|{"charge_id": "ch_1"}' \
        "$(w "SELECT * FROM idempotency.claim_operation('charge', 'CH-1', 'fp-ch-1')")"
    check "[$c] stale claim under lookup: verify with attempt 2" "verify|2" \
        "$(w "SELECT verdict, attempt FROM idempotency.claim_operation('charge_lookup', 'LK-1')")"
    check "[$c] ... its old attempt 1 refused: ID003" "ID003" \
        "$(we "SELECT idempotency.extend_lease('charge_lookup', 'LK-1', 1)")"

    # the held claim: a person resolves it, the next delivery takes it over
    check "[$c] a person resolves the held claim (retry)" "" \
        "$(q "$NEW" "$c" app upg_operator "SELECT idempotency.resolve_operation('send_confirmation', 'ORD-1002', 'retry', 'after the upgrade')")"
    check "[$c] ... recorded as the audit's third decision" "3|ORD-1002|retry|upg_operator" \
        "$(q "$NEW" "$c" app '' "SELECT id, operation_key, resolution, resolved_by FROM idempotency.resolutions ORDER BY id DESC LIMIT 1")"
    check "[$c] the held key runs again with attempt 2" "run|2" \
        "$(w "SELECT verdict, attempt FROM idempotency.claim_operation('send_confirmation', 'ORD-1002', 'fp-1002')")"
    check "[$c] the held claim's old attempt 1 is refused: ID003" "ID003" \
        "$(we "SELECT idempotency.complete_operation('send_confirmation', 'ORD-1002', 1)")"
    check "[$c] released key: runs with attempt 2" "run|2" \
        "$(w "SELECT verdict, attempt FROM idempotency.claim_operation('send_confirmation', 'ORD-1003')")"
    check "[$c] key released by a person before the upgrade: runs with attempt 2" "run|2" \
        "$(w "SELECT verdict, attempt FROM idempotency.claim_operation('send_confirmation', 'ORD-1005')")"
    check "[$c] ... its old attempt 1 refused: ID003" "ID003" \
        "$(we "SELECT idempotency.complete_operation('send_confirmation', 'ORD-1005', 1)")"
    check "[$c] a new key runs with attempt 1" "run|1" \
        "$(w "SELECT verdict, attempt FROM idempotency.claim_operation('send_confirmation', 'ORD-2001', 'fp-2001')")"

    # the job type with a worker_role
    check "[$c] worker_role kept" "upg_tenant_a" \
        "$(q "$NEW" "$c" app '' "SELECT worker_role FROM idempotency.job_types WHERE job_type = 'a_invoice'")"
    check "[$c] another tenant's worker is refused: 42501" "42501" \
        "$(we "SELECT * FROM idempotency.claim_operation('a_invoice', 'AI-1')" upg_tenant_b_worker)"
    check "[$c] ... also on complete: 42501" "42501" \
        "$(we "SELECT idempotency.complete_operation('a_invoice', 'AI-2', 1)" upg_tenant_b_worker)"
    check "[$c] ... and a worker with no worker_role: 42501" "42501" \
        "$(we "SELECT * FROM idempotency.claim_operation('a_invoice', 'AI-1')" upg_worker)"
    check "[$c] the tenant's own worker (a member): completed with its result" 'completed|1|{"invoice": "INV-7"}' \
        "$(q "$NEW" "$c" app upg_tenant_a_worker "SELECT * FROM idempotency.claim_operation('a_invoice', 'AI-1')")"
    check "[$c] ... its young claim in progress" "in_progress|1" \
        "$(q "$NEW" "$c" app upg_tenant_a_worker "SELECT verdict, attempt FROM idempotency.claim_operation('a_invoice', 'AI-2')")"
    check "[$c] ... and completes it" "" \
        "$(q "$NEW" "$c" app upg_tenant_a_worker "SELECT idempotency.complete_operation('a_invoice', 'AI-2', 1)")"
    check "[$c] ALTER EXTENSION UPDATE at $DEFAULT_VERSION changes nothing" "$DEFAULT_VERSION" \
        "$(q "$NEW" "$c" app '' "ALTER EXTENSION idempotency UPDATE; SELECT extversion FROM pg_extension WHERE extname = 'idempotency'")"

    # legacy: the extension still at 0.1 on 15. pg_upgrade keeps the version,
    # and ALTER EXTENSION UPDATE runs on the new major; a dump and restore
    # recreates the extension at the newest version installed for the new
    # major (pg_dump writes CREATE EXTENSION without VERSION) and loads the
    # records into it
    l() { q "$NEW" "$c" legacy "$@"; }
    if [[ $method == upgrade ]]; then
        check "[$c] legacy: extension still at 0.1" "0.1" \
            "$(l '' "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'")"
        snapshot "$NEW" "$c" legacy >"$work/$c-legacy.after"
        compare "[$c] legacy (0.1): records, job types, audit, members, grants as before" \
            "$work/$c-legacy.before" "$work/$c-legacy.after"
        check "[$c] legacy 0.1 on $NEW's library: completed key answers completed" 'completed|1|{"message_id": "m-legacy"}' \
            "$(l upg_worker "SELECT * FROM idempotency.claim_operation('send_confirmation', 'L-1', 'fp-l-1')")"
        check "[$c] legacy: ALTER EXTENSION idempotency UPDATE from 0.1" "$DEFAULT_VERSION" \
            "$(l '' "ALTER EXTENSION idempotency UPDATE; SELECT extversion FROM pg_extension WHERE extname = 'idempotency'")"
        # 0.4 -> 0.5 gave edition() claim_operation's grants
        check "[$c] legacy updated: idempotency.edition() answers the worker c $DEFAULT_VERSION" "c|$DEFAULT_VERSION" \
            "$(l upg_worker "SELECT edition, version FROM idempotency.edition()")"
    else
        check "[$c] legacy (updated to $DEFAULT_VERSION on $OLD): restored at $DEFAULT_VERSION" "$DEFAULT_VERSION" \
            "$(l '' "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'")"
        snapshot "$NEW" "$c" legacy >"$work/$c-legacy.after"
        compare "[$c] legacy: records, job types, audit, members, grants as on $OLD after its update" \
            "$work/$c-legacy.updated-before" "$work/$c-legacy.after"
        check "[$c] legacy: ALTER EXTENSION UPDATE then changes nothing" "$DEFAULT_VERSION" \
            "$(l '' "ALTER EXTENSION idempotency UPDATE; SELECT extversion FROM pg_extension WHERE extname = 'idempotency'")"
        # what the README warns of: the dump taken at 0.1, restored here,
        # stops at its GRANT on the old signature (psql -v ON_ERROR_STOP=1,
        # as postgresql-common's pg_dumpcluster runs it)
        q "$NEW" "$c" postgres '' "CREATE DATABASE legacy_at_01" >/dev/null
        rc=0
        out=$(cd "$work" && runuser -u postgres -- psql -XAtq -v ON_ERROR_STOP=1 -h /var/run/postgresql \
            -p "$(port_of "$NEW" "$c")" -d legacy_at_01 -f "$work/legacy-0.1.sql" 2>&1) || rc=$?
        check "[$c] a dump taken at 0.1, restored where $DEFAULT_VERSION is installed: stops at the old GRANT" \
            "stopped: function idempotency.claim_operation(text, text, text, text) does not exist" \
            "$( ((rc)) && echo "stopped: $(grep -o 'function idempotency.claim_operation([^)]*) does not exist' <<<"$out" | head -n 1)" || echo "exit 0")"
        q "$NEW" "$c" postgres '' "DROP DATABASE legacy_at_01" >/dev/null
    fi
    # after the update: the same records; job_types gains worker_role (NULL)
    snapshot "$NEW" "$c" legacy >"$work/$c-legacy.updated"
    check "[$c] legacy: records, audit and sequence as before, at $DEFAULT_VERSION" \
        "$(sed -n '/^-- operations/,/^-- job_types/p;/^-- resolutions/,/^-- members/p' "$work/$c-legacy.before")" \
        "$(sed -n '/^-- operations/,/^-- job_types/p;/^-- resolutions/,/^-- members/p' "$work/$c-legacy.updated")"
    check "[$c] legacy: job types kept, worker_role NULL" \
        "charge|00:00:01|retry|3||,charge_lookup|00:00:01|lookup|3||,nightly_report|01:00:00|hold|||,post_slack|00:00:01|skip|||,send_confirmation|00:00:01|hold|||" \
        "$(l '' "SELECT string_agg(format('%s|%s|%s|%s|%s|%s', job_type, lease, stale_policy, max_attempts, retention, worker_role), ',' ORDER BY job_type) FROM idempotency.job_types")"
    check "[$c] legacy after the update: completed key" 'completed|1|{"message_id": "m-legacy"}' \
        "$(l upg_worker "SELECT * FROM idempotency.claim_operation('send_confirmation', 'L-1', 'fp-l-1')")"
    check "[$c] legacy: the held claim is still held" "held|1" \
        "$(l upg_worker "SELECT verdict, attempt FROM idempotency.claim_operation('send_confirmation', 'L-2')")"
    check "[$c] legacy: the young claim is in progress" "in_progress|1" \
        "$(l upg_worker "SELECT verdict, attempt FROM idempotency.claim_operation('nightly_report', 'L-5')")"
    check "[$c] legacy: skipped stays skipped" "skipped|1" \
        "$(l upg_worker "SELECT verdict, attempt FROM idempotency.claim_operation('post_slack', 'L-6')")"
    check "[$c] legacy: stale claim under lookup: verify with attempt 2" "verify|2" \
        "$(l upg_worker "SELECT verdict, attempt FROM idempotency.claim_operation('charge_lookup', 'L-7')")"
    check "[$c] legacy: resolved retry runs with attempt 2" "run|2" \
        "$(l upg_worker "SELECT verdict, attempt FROM idempotency.claim_operation('send_confirmation', 'L-3')")"
    check "[$c] legacy: stale claim under retry taken over with attempt 2" "run|2" \
        "$(l upg_worker "SELECT verdict, attempt FROM idempotency.claim_operation('charge', 'L-4')")"
    check "[$c] legacy: its old attempt 1 refused: ID003" "ID003" \
        "$(err "$NEW" "$c" legacy upg_worker "SELECT idempotency.complete_operation('charge', 'L-4', 1)")"
    check "[$c] legacy: worker_role now applies" "42501" \
        "$(err "$NEW" "$c" legacy '' "UPDATE idempotency.job_types SET worker_role = 'upg_tenant_a' WHERE job_type = 'charge'; SET ROLE upg_worker; SELECT idempotency.complete_operation('charge', 'L-4', 2)")"
done

phase "done: $checks checks, $failures failed; upgrade took: -m upgrade ${took[main]:-?} s, -m dump ${took[viadump]:-?} s"
((failures == 0))
