#!/usr/bin/env bash
# test/fuzz/sqlsmith.sh: random SQL (Debian's sqlsmith) against a database
# with the extension installed, then the server log is checked.
#
#   PGHOST=... PGPORT=... PGUSER=postgres SERVER_LOG=/path/server.log \
#       test/fuzz/sqlsmith.sh [--max-queries N] [--seed N]
#
# sqlsmith only calls functions that return a scalar, so the database
# (sqlsmith_fuzz, created anew and dropped at the end) gets thin SQL
# wrappers around every function of the extension (schema smith) next to
# the extension's own objects, a few job types of each policy and some
# records. sqlsmith runs as a plain role (smith) that may execute the
# extension's functions and read its tables, with statement_timeout = 1s,
# so random calls of pg_sleep() and the like end quickly and nothing it
# generates can harm the server's other databases.
#
# Fails if the server log, from where this run began, has a PANIC, an
# assertion failure (TRAP), a backend "terminated by signal", or an XX000
# (internal error) raised by the extension's own C files; XX000s raised by
# PostgreSQL's own functions on sqlsmith's nonsense are counted, not failed.
# Without SERVER_LOG (or if the file cannot be read) a crash is still caught:
# the server must be up and its pg_postmaster_start_time() unchanged.
# The last line is "sqlsmith: N passed, N failed".
set -uo pipefail

max_queries=5000
seed=$((RANDOM * 32768 + RANDOM))   # sqlsmith takes an int
while (($#)); do
    case $1 in
        --max-queries) max_queries=$2; shift 2 ;;
        --seed) seed=$2; shift 2 ;;
        *) echo "test/fuzz/sqlsmith.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done

die() { echo "test/fuzz/sqlsmith.sh: error: $*" >&2; echo "sqlsmith: 0 passed, 1 failed"; exit 2; }

if ! command -v sqlsmith >/dev/null; then
    if [[ $(id -u) == 0 && ${SQLSMITH_INSTALL:-1} != 0 ]]; then
        echo "== installing sqlsmith (Debian package)"
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -q sqlsmith >/dev/null ||
            die "apt-get install sqlsmith failed"
    else
        die "sqlsmith not found: apt-get install -y sqlsmith"
    fi
fi

db=sqlsmith_fuzz
psql_su() { psql -X -q -v ON_ERROR_STOP=1 "$@"; }
cleanup() {
    psql_su -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1
    psql_su -d postgres -c "DROP ROLE IF EXISTS smith" >/dev/null 2>&1
}
trap cleanup EXIT
cleanup

started=$(psql -X -At -d postgres -c 'SELECT pg_postmaster_start_time()') || die "cannot reach the server"
log_offset=0
if [[ -n ${SERVER_LOG:-} && -r ${SERVER_LOG:-} ]]; then
    log_offset=$(stat -c %s "$SERVER_LOG")
fi

psql_su -d postgres <<EOF || die "setting up the database failed"
CREATE ROLE smith LOGIN;
ALTER ROLE smith SET statement_timeout = '1s';
ALTER ROLE smith SET log_error_verbosity = 'verbose';
ALTER ROLE smith SET track_functions = 'all';
CREATE DATABASE $db;
EOF
psql_su -d "$db" -o /dev/null <<'EOF' || die "setting up the extension failed"
CREATE EXTENSION idempotency;
INSERT INTO idempotency.job_types (job_type, lease, stale_policy, max_attempts, retention) VALUES
    ('hold', '1 second', 'hold', NULL, '1 second'),
    ('retry', '1 second', 'retry', 2, NULL),
    ('skip', '1 second', 'skip', NULL, '1 second'),
    ('lookup', '10 minutes', 'lookup', NULL, NULL);
SELECT idempotency.claim_operation(jt, 'ORD-' || k, 'fp' || (k % 3), 'seed')
FROM unnest(ARRAY['hold', 'retry', 'skip', 'lookup']) jt, generate_series(1, 20) k;
SELECT idempotency.complete_operation(jt, 'ORD-' || k, 1, jsonb_build_object('k', k))
FROM unnest(ARRAY['hold', 'retry', 'skip', 'lookup']) jt, generate_series(1, 10) k;
UPDATE idempotency.operations SET claimed_at = claimed_at - interval '1 hour',
    heartbeat_at = heartbeat_at - interval '1 hour' WHERE operation_key LIKE 'ORD-1_';

-- scalar wrappers: what sqlsmith can call
CREATE SCHEMA smith;
CREATE FUNCTION smith.claim(job_type text, operation_key text, fingerprint text, worker text) RETURNS text
    LANGUAGE sql AS $$ SELECT c::text FROM idempotency.claim_operation(job_type, operation_key, fingerprint, worker) c $$;
CREATE FUNCTION smith.claim_attempt(job_type text, operation_key text) RETURNS integer
    LANGUAGE sql AS $$ SELECT c.attempt FROM idempotency.claim_operation(job_type, operation_key) c $$;
CREATE FUNCTION smith.claim_result(job_type text, operation_key text) RETURNS jsonb
    LANGUAGE sql AS $$ SELECT c.result FROM idempotency.claim_operation(job_type, operation_key) c $$;
CREATE FUNCTION smith.complete(job_type text, operation_key text, attempt integer, result jsonb) RETURNS text
    LANGUAGE sql AS $$ SELECT idempotency.complete_operation(job_type, operation_key, attempt, result)::text $$;
CREATE FUNCTION smith.release(job_type text, operation_key text, attempt integer) RETURNS text
    LANGUAGE sql AS $$ SELECT idempotency.release_operation(job_type, operation_key, attempt)::text $$;
CREATE FUNCTION smith.extend(job_type text, operation_key text, attempt integer) RETURNS timestamptz
    LANGUAGE sql AS $$ SELECT idempotency.extend_lease(job_type, operation_key, attempt) $$;
CREATE FUNCTION smith.resolve(job_type text, operation_key text, resolution text, note text) RETURNS text
    LANGUAGE sql AS $$ SELECT idempotency.resolve_operation(job_type, operation_key, resolution, note)::text $$;
CREATE FUNCTION smith.purge(batch_size integer) RETURNS bigint
    LANGUAGE sql AS $$ SELECT idempotency.purge_operations(batch_size) $$;
CREATE FUNCTION smith.stale(job_type text) RETURNS bigint
    LANGUAGE sql AS $$ SELECT count(*) FROM idempotency.stale_claims(job_type) $$;
-- the same with the job types and keys that exist, so that random
-- integers and strings reach records
CREATE FUNCTION smith.claim_n(policy integer, k integer) RETURNS text
    LANGUAGE sql AS $$ SELECT c::text FROM idempotency.claim_operation(
        (ARRAY['hold', 'retry', 'skip', 'lookup'])[1 + abs(policy % 4)], 'ORD-' || k) c $$;
CREATE FUNCTION smith.complete_n(policy integer, k integer, attempt integer, result jsonb) RETURNS text
    LANGUAGE sql AS $$ SELECT idempotency.complete_operation(
        (ARRAY['hold', 'retry', 'skip', 'lookup'])[1 + abs(policy % 4)], 'ORD-' || k, attempt, result)::text $$;
CREATE FUNCTION smith.release_n(policy integer, k integer, attempt integer) RETURNS text
    LANGUAGE sql AS $$ SELECT idempotency.release_operation(
        (ARRAY['hold', 'retry', 'skip', 'lookup'])[1 + abs(policy % 4)], 'ORD-' || k, attempt)::text $$;
CREATE FUNCTION smith.extend_n(policy integer, k integer, attempt integer) RETURNS timestamptz
    LANGUAGE sql AS $$ SELECT idempotency.extend_lease(
        (ARRAY['hold', 'retry', 'skip', 'lookup'])[1 + abs(policy % 4)], 'ORD-' || k, attempt) $$;
CREATE FUNCTION smith.resolve_n(policy integer, k integer, resolution text) RETURNS text
    LANGUAGE sql AS $$ SELECT idempotency.resolve_operation(
        (ARRAY['hold', 'retry', 'skip', 'lookup'])[1 + abs(policy % 4)], 'ORD-' || k, resolution)::text $$;

-- sqlsmith picks a routine at random among some 3000: 20 copies of each
-- wrapper make one of the extension's functions come up in about one
-- expression in ten instead of one in a thousand
DO $$
DECLARE
    p record;
BEGIN
    FOR p IN SELECT oid, proname FROM pg_proc WHERE pronamespace = 'smith'::regnamespace LOOP
        FOR i IN 1 .. 20 LOOP
            EXECUTE replace(pg_get_functiondef(p.oid), 'smith.' || p.proname || '(',
                            'smith.' || p.proname || '_' || i || '(');
        END LOOP;
    END LOOP;
END
$$;

GRANT USAGE ON SCHEMA idempotency, smith TO smith;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA idempotency TO smith;
GRANT SELECT ON ALL TABLES IN SCHEMA idempotency TO smith;
EOF

echo "== sqlsmith --max-queries=$max_queries --seed=$seed, as role smith, database $db"
out=$(mktemp)
start=$(date +%s)
timeout 600 sqlsmith --target="host=$PGHOST port=$PGPORT user=smith dbname=$db" \
    --max-queries="$max_queries" --seed="$seed" --exclude-catalog --verbose >"$out" 2>&1
rc=$?
secs=$(($(date +%s) - start))
echo "== sqlsmith exited $rc after $secs s"
tail -n 25 "$out"

passed=0 failed=0
check() {   # check CONDITION-EXIT-STATUS NAME
    if [[ $1 == 0 ]]; then passed=$((passed + 1)); echo "ok - $2"; else failed=$((failed + 1)); echo "not ok - $2"; fi
}
check $((rc == 0 ? 0 : 1)) "sqlsmith ran $max_queries queries to the end (seed $seed)"

# how many of the generated queries call the extension (a dry run of the
# same seed generates the same queries), and how many calls of its C
# functions returned (pg_stat_user_functions counts calls that returned)
dry=$(timeout 300 sqlsmith --target="host=$PGHOST port=$PGPORT user=smith dbname=$db" \
    --max-queries="$max_queries" --seed="$seed" --exclude-catalog --dry-run 2>/dev/null |
    awk 'BEGIN { RS = ";" } /(smith|idempotency)\.[a-z_0-9]+\(/ { n++ } END { print n + 0 }')
calls=$(psql -X -At -d "$db" -c "SELECT string_agg(funcname || ' ' || calls, ', ' ORDER BY funcname) FROM pg_stat_user_functions WHERE schemaname = 'idempotency'" 2>/dev/null)
echo "== $dry of the $max_queries queries call the extension's functions (through the wrappers)"
echo "== calls of the extension's functions that returned: ${calls:-none}"

now_started=$(psql -X -At -d postgres -c 'SELECT pg_postmaster_start_time()' 2>/dev/null || echo down)
check $([[ $now_started == "$started" ]] && echo 0 || echo 1) "the server stayed up, never restarted (start time $started)"

if [[ -n ${SERVER_LOG:-} && -r ${SERVER_LOG:-} ]]; then
    new=$(mktemp)
    tail -c +$((log_offset + 1)) "$SERVER_LOG" >"$new"
    crashes=$(grep -cE 'PANIC|TRAP:|terminated by signal|was terminated by exception' "$new" || true)
    check $((crashes == 0 ? 0 : 1)) "no PANIC, TRAP or crashed backend in the server log ($crashes)"
    # XX000 errors and where they were raised (log_error_verbosity = verbose)
    ours=$(awk '/ERROR:  XX000:/ { x = 1; next } x && /LOCATION:/ { if ($0 ~ /(claim|complete|admin|idempotency)\.c:/) n++; x = 0 } END { print n + 0 }' "$new")
    all=$(grep -c 'ERROR:  XX000:' "$new" || true)
    check $((ours == 0 ? 0 : 1)) "no internal error (XX000) raised by the extension ($ours; $all raised by PostgreSQL itself)"
    if ((ours > 0)); then
        grep -A3 'ERROR:  XX000:' "$new" | grep -B1 -A2 -E '(claim|complete|admin|idempotency)\.c:' | head -n 40
    fi
    errors=$(grep -c 'ERROR:  ' "$new" || true)
    echo "== $errors errors in the server log during the run (sqlsmith's queries are mostly nonsense)"
    grep -oE 'ERROR:  (ID00[0-9]|22[0-9A-Z]{3}|25006)' "$new" | sort | uniq -c | sort -rn | head -n 12 |
        sed 's/^/   /'
    rm -f "$new"
else
    echo "== no SERVER_LOG to read: only the server's start time was checked"
fi
rm -f "$out"
echo "sqlsmith: $passed passed, $failed failed"
((failed == 0))
