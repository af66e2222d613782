#!/usr/bin/env bash
# test/portable/editions.sh: moving between editions (issue 41), on the
# running cluster (PGHOST/PGPORT, a superuser as PGUSER) where the C
# extension is installed:
#
#   1. the portable edition as a plain script, installed by the database's
#      owner (not a superuser), twice: the second run changes no catalog row
#      and no record; over a newer portable install it refuses (55000) and
#      changes nothing;
#   2. records in every state (a claim in flight with a delivery token, a
#      completion with its result, a release, a skip, a person's decision in
#      the audit), a worker role with the README's grants;
#   3. portable/to-c.sql: the same records and audit row, byte for byte,
#      the grants, edition() 'c'; the claim in flight is retried with its
#      delivery token (the same verdict and attempt: both editions store the
#      same digest) and completed by its attempt, as the worker role;
#   4. portable/to-portable.sql: back, the same again, and the audit's ids
#      go on where they were;
#   5. a view of the application over the records stops a move, and nothing
#      changes (2BP01).
# Exits non-zero at the first difference, saying which.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
src=$(cd "$here/../.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/editions.XXXXXX")
trap 'rm -rf "$work"' EXIT
chmod 755 "$work"
sh "$src/portable/build.sh" "$work" >/dev/null
chmod 644 "$work"/*.sql
body=$(ls "$work"/idempotency--*.sql)
db=regress_editions
failed=0

export PGOPTIONS="${PGOPTIONS:-} -c client_min_messages=warning"
psqlq() { psql -X -q -v ON_ERROR_STOP=1 "$@"; }
as_su() { psqlq -d "$db" "$@"; }
as_owner() { PGUSER=regress_editions_owner psqlq -d "$db" "$@"; }
as_worker() { PGUSER=regress_editions_worker psqlq -d "$db" "$@"; }
check() {  # check WHAT GOT WANT
    if [[ "$2" == "$3" ]]; then echo "ok - $1"; else echo "not ok - $1: got '$2', want '$3'"; failed=1; fi
}
# every record, job type and audit row, as text, and the sequence
snapshot() {
    as_su -At -c "SELECT md5(string_agg(t, E'\n' ORDER BY t)) FROM (
        SELECT 'j ' || j::text AS t FROM idempotency.job_types j
        UNION ALL SELECT 'o ' || o::text FROM idempotency.operations o
        UNION ALL SELECT 'r ' || r::text FROM idempotency.resolutions r
        UNION ALL SELECT 's ' || s.last_value || ' ' || s.is_called FROM idempotency.resolutions_id_seq s) x"
}
catalog() {
    as_su -At -c "SELECT md5(string_agg(t, E'\n' ORDER BY t)) FROM (
        SELECT p.oid::regprocedure::text || p.prosrc || coalesce(p.proacl::text, '') || coalesce(p.proconfig::text, '')
               || coalesce(obj_description(p.oid, 'pg_proc'), '') AS t
        FROM pg_proc p WHERE p.pronamespace = 'idempotency'::regnamespace
        UNION ALL SELECT c.oid::regclass::text || c.relkind::text || coalesce(c.relacl::text, '') || coalesce(obj_description(c.oid, 'pg_class'), '')
        FROM pg_class c WHERE c.relnamespace = 'idempotency'::regnamespace
        UNION ALL SELECT a.attrelid::regclass::text || a.attname || format_type(a.atttypid, a.atttypmod) || a.attnum
        FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
        WHERE c.relnamespace = 'idempotency'::regnamespace AND a.attnum > 0) x"
}

psqlq -d postgres -c "DROP DATABASE IF EXISTS $db" -c "DROP ROLE IF EXISTS regress_editions_owner" \
      -c "DROP ROLE IF EXISTS regress_editions_worker" \
      -c "CREATE ROLE regress_editions_owner LOGIN" -c "CREATE ROLE regress_editions_worker LOGIN" \
      -c "CREATE DATABASE $db OWNER regress_editions_owner" >/dev/null

# 1. the plain script by the owner, twice
as_owner -f "$work/idempotency-portable.sql" >/dev/null
check "plain script installed by the database's owner" "$(as_su -At -c 'SELECT edition FROM idempotency.edition()')" portable
check "its objects belong to the owner" \
      "$(as_su -At -c "SELECT count(*) FROM pg_proc WHERE pronamespace = 'idempotency'::regnamespace AND proowner <> 'regress_editions_owner'::regrole")" 0
as_owner -c "INSERT INTO idempotency.job_types (job_type, lease, stale_policy, max_attempts, worker_role)
             VALUES ('send', '1 minute', 'hold', NULL, 'regress_editions_worker'), ('charge', '1 minute', 'retry', 3, NULL),
                    ('digest', '1 minute', 'skip', NULL, NULL)"
as_owner -c "GRANT USAGE ON SCHEMA idempotency TO regress_editions_worker" \
         -c "GRANT EXECUTE ON FUNCTION idempotency.claim_operation(text, text, text, text, text, boolean),
                 idempotency.complete_operation(text, text, integer, jsonb), idempotency.release_operation(text, text, integer),
                 idempotency.extend_lease(text, text, integer), idempotency.edition() TO regress_editions_worker"
before_cat=$(catalog); before=$(snapshot)
as_owner -f "$work/idempotency-portable.sql" >/dev/null
check "the plain script run again changes no catalog row" "$(catalog)" "$before_cat"
check "the plain script run again changes no record" "$(snapshot)" "$before"

# 1b. this script over a newer portable install: refused (55000), nothing changed
before_cat=$(catalog); before=$(snapshot)
as_su -c "ALTER FUNCTION idempotency.edition() RENAME TO edition_real" \
      -c "CREATE FUNCTION idempotency.edition(OUT edition text, OUT version text) LANGUAGE sql AS \$\$ SELECT 'portable'::text, '999.0'::text \$\$" >/dev/null
if out=$(as_owner -v VERBOSITY=verbose -f "$work/idempotency-portable.sql" 2>&1); then
    echo "not ok - the plain script went ahead over a newer install"; failed=1
else
    check "the plain script over a newer install refuses with 55000" "$(grep -o 'ERROR:  55000' <<<"$out" | head -n 1)" "ERROR:  55000"
fi
as_su -c "DROP FUNCTION idempotency.edition()" -c "ALTER FUNCTION idempotency.edition_real() RENAME TO edition" >/dev/null
check "... and nothing changed" "$(snapshot) $(catalog)" "$before $before_cat"

# 2. records in every state
as_worker -c "SELECT idempotency.complete_operation('send', 'done', (SELECT attempt FROM idempotency.claim_operation('send', 'done')), '{\"id\": \"m-1\"}')" >/dev/null
check "a claim in flight, with a delivery token" \
      "$(as_worker -At -c "SELECT verdict || ' ' || attempt FROM idempotency.claim_operation('send', 'flight', 'fp-1', 'w1', 'delivery-1')")" "run 1"
as_worker -c "SELECT idempotency.release_operation('send', 'released', (SELECT attempt FROM idempotency.claim_operation('send', 'released')))" >/dev/null
as_su -c "SELECT * FROM idempotency.claim_operation('charge', 'stale')" \
      -c "SELECT * FROM idempotency.claim_operation('digest', 'skipped')" \
      -c "UPDATE idempotency.operations SET heartbeat_at = heartbeat_at - interval '2 minutes' WHERE operation_key IN ('stale', 'skipped')" \
      -c "SELECT * FROM idempotency.claim_operation('digest', 'skipped')" \
      -c "SELECT idempotency.resolve_operation('charge', 'stale', 'completed', 'checked at the provider')" >/dev/null

# 3. to the C extension
before=$(snapshot)
as_su -f "$src/portable/to-c.sql" >/dev/null
check "to-c.sql: the C edition answers" "$(as_su -At -c 'SELECT edition FROM idempotency.edition()')" c
check "to-c.sql: every job type, record and audit row kept" "$(snapshot)" "$before"
check "to-c.sql: the claim in flight, retried with its delivery token, gets its own claim back" \
      "$(as_worker -At -c "SELECT verdict || ' ' || attempt FROM idempotency.claim_operation('send', 'flight', 'fp-1', 'w1', 'delivery-1')")" "run 1"
check "to-c.sql: another delivery of it is in_progress" \
      "$(as_worker -At -c "SELECT verdict FROM idempotency.claim_operation('send', 'flight', 'fp-1', 'w2', 'delivery-2')")" in_progress
as_worker -c "SELECT idempotency.complete_operation('send', 'flight', 1, '{\"id\": \"m-2\"}')" >/dev/null
check "to-c.sql: the worker completed its claim by its attempt" \
      "$(as_su -At -c "SELECT status || ' ' || attempt FROM idempotency.operations WHERE operation_key = 'flight'")" "completed 1"
check "to-c.sql: a person's decision is audited after the others" \
      "$(as_su -At -c "SELECT count(*) FROM idempotency.resolutions")" 1

# 4. back to the portable edition
as_su -c "SELECT * FROM idempotency.claim_operation('send', 'held')" \
      -c "UPDATE idempotency.operations SET heartbeat_at = heartbeat_at - interval '2 minutes' WHERE operation_key = 'held'" >/dev/null
as_worker -At -c "SELECT verdict FROM idempotency.claim_operation('send', 'flight2', NULL, 'w1', 'delivery-3')" >/dev/null
before=$(snapshot)
as_su -v body="$body" -f "$src/portable/to-portable.sql" >/dev/null
check "to-portable.sql: the portable edition answers" "$(as_su -At -c 'SELECT edition FROM idempotency.edition()')" portable
check "to-portable.sql: every job type, record and audit row kept" "$(snapshot)" "$before"
check "to-portable.sql: the claim in flight, retried with its delivery token, gets its own claim back" \
      "$(as_worker -At -c "SELECT verdict || ' ' || attempt FROM idempotency.claim_operation('send', 'flight2', NULL, 'w1', 'delivery-3')")" "run 1"
as_su -c "SELECT idempotency.resolve_operation('send', 'held', 'retry', 'not sent')" >/dev/null
check "to-portable.sql: the audit's ids go on" \
      "$(as_su -At -c "SELECT string_agg(id::text, ',' ORDER BY id) FROM idempotency.resolutions")" "1,2"

# 5. an application's view over the records stops a move; nothing changes
as_su -c "CREATE VIEW public.my_stats AS SELECT count(*) FROM idempotency.operations" >/dev/null
before=$(snapshot); before_cat=$(catalog)
if out=$(as_su -v VERBOSITY=verbose -f "$src/portable/to-c.sql" 2>&1); then
    echo "not ok - to-c.sql went ahead over a view that depends on the records"; failed=1
else
    check "a dependent view stops to-c.sql with 2BP01" "$(grep -o 'ERROR:  2BP01' <<<"$out" | head -n 1)" "ERROR:  2BP01"
fi
check "... and nothing changed" "$(snapshot) $(catalog)" "$before $before_cat"
check "... the portable edition still answers" "$(as_su -At -c 'SELECT edition FROM idempotency.edition()')" portable

psqlq -d postgres -c "DROP DATABASE $db" -c "DROP ROLE regress_editions_owner" -c "DROP ROLE regress_editions_worker" >/dev/null
exit $failed
