#!/usr/bin/env bash
# test/citus/repro.sh: reproduce issue 11 ("Correct on Citus") as it stands:
# the extension installed on a Citus cluster the way a new user would
# distribute it, and the verdicts it gives. It documents the current state:
# by hand it is EXPECTED to show wrong verdicts, and exits 0 when it ran to
# the end (whatever it found); 1 when it could not run. REPRO_STRICT=1: exit
# 1 also when a case answers otherwise than one node would (hook 93, with
# REPRO_DISTRIBUTE=function).
#
#   test/citus/repro.sh            (root: runs `scripts/citus install` first)
#   REPRO_DISTRIBUTE=function test/citus/repro.sh
#                                  (idempotency.distribute() instead of the
#                                  steps by hand; checks that a second call
#                                  refuses with 55000)
#
# Steps: a throwaway cluster (test/citus/cluster.sh: coordinator + 2
# workers); CREATE EXTENSION idempotency on the coordinator (Citus creates it
# on the workers too); job types and records of every status written BEFORE
# distribution; then, on the coordinator, what the issue describes:
#   create_reference_table('idempotency.job_types')   -- refused: triggers;
#       again with SET citus.enable_unsafe_triggers = on, which is accepted
#   create_distributed_table('idempotency.operations', 'operation_key')
#   create_reference_table('idempotency.resolutions')
#   create_distributed_function(<claim, complete, release, extend>,
#       'operation_key', colocate_with := 'idempotency.operations')
# and then test/citus/repro.py, which runs each case twice: in autocommit
# (each call in its own statement: Citus pushes the call down to the worker
# holding the key) and inside BEGIN ... COMMIT (by hand, without
# force_delegation, Citus runs the function on the coordinator; with
# distribute() it is delegated too). It prints, per case, what one node answers and what Citus
# answered. Needs python3-psycopg (apt-get install python3-psycopg).
# The idempotency build installed is whatever `make install` put in place
# (scripts/test does it; as root: make install with_llvm=no).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)

if ((EUID == 0)); then
    "$root/scripts/citus" install
else
    "$root/scripts/citus" check
fi
python=/usr/bin/python3    # Debian's, which sees Debian's modules
"$python" -c 'import psycopg' 2>/dev/null || {
    echo "repro: python3-psycopg is missing: apt-get install python3-psycopg" >&2
    exit 1
}

# shellcheck source=test/citus/cluster.sh
source "$here/cluster.sh"
citus_cluster_start

[[ -f $("$PG_CONFIG" --sharedir)/extension/idempotency.control ]] || {
    echo "repro: idempotency is not installed: make install with_llvm=no (root)" >&2
    exit 1
}

echo "== install, and records written before distribution"
# roles on one worker only, so that role OIDs differ between the nodes (as they do
# on any cluster whose nodes did not create the same roles in the same order)
for i in 1 2 3; do
    citus_psql w1 -c "SET citus.enable_create_role_propagation = off" -c "CREATE ROLE w1_only_$i" 2>/dev/null
done
for i in 1 2 3 4 5 6 7; do
    citus_psql w2 -c "SET citus.enable_create_role_propagation = off" -c "CREATE ROLE w2_only_$i" 2>/dev/null
done
citus_psql coord -e <<'EOF'
CREATE EXTENSION idempotency;
SELECT extname, extversion FROM pg_extension WHERE extname = 'idempotency';
CREATE ROLE mailer;
CREATE ROLE alice LOGIN IN ROLE mailer;
-- a worker_role whose name must be quoted (the role is compared by name)
CREATE ROLE "Mail Team";
GRANT "Mail Team" TO alice;
-- outsider: may call the functions, is not a member of mailer
CREATE ROLE outsider LOGIN;
GRANT USAGE ON SCHEMA idempotency TO outsider;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA idempotency TO outsider;
GRANT USAGE ON SCHEMA idempotency TO mailer;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA idempotency TO mailer;
INSERT INTO idempotency.job_types (job_type, lease, stale_policy, worker_role)
VALUES ('pre', '10 minutes', 'hold', NULL), ('pre_roled', '10 minutes', 'hold', 'mailer'),
       ('pre_quoted', '10 minutes', 'hold', '"Mail Team"');
SELECT * FROM idempotency.claim_operation('pre', 'done-before');
SELECT idempotency.complete_operation('pre', 'done-before', 1, '{"before": true}');
SELECT * FROM idempotency.claim_operation('pre', 'released-before');
SELECT idempotency.release_operation('pre', 'released-before', 1);
SELECT * FROM idempotency.claim_operation('pre', 'claimed-before');
-- the other statuses: skipped, a held (stale) claim, a resolved one (an audit row)
INSERT INTO idempotency.job_types (job_type, lease, stale_policy)
VALUES ('pre_skip', '1 second', 'skip'), ('pre_hold', '1 second', 'hold');
SELECT * FROM idempotency.claim_operation('pre_skip', 'skipped-before');
SELECT * FROM idempotency.claim_operation('pre_hold', 'held-before');
SELECT * FROM idempotency.claim_operation('pre_hold', 'resolved-before');
SELECT pg_sleep(1.2);
SELECT * FROM idempotency.claim_operation('pre_skip', 'skipped-before');
SELECT * FROM idempotency.claim_operation('pre_hold', 'held-before');
SELECT idempotency.resolve_operation('pre_hold', 'resolved-before', 'completed', 'repro: before distribution');
SELECT status, count(*) FROM idempotency.operations GROUP BY 1 ORDER BY 1;
EOF

if [[ ${REPRO_DISTRIBUTE:-by-hand} == function ]]; then
    echo "== distribute() in a transaction that ran a parallel query: 25001, nothing changed"
    snapshot() {
        citus_psql coord -At -c "SELECT string_agg(status || ':' || n, ' ') FROM (SELECT status, count(*) n FROM idempotency.operations GROUP BY 1 ORDER BY 1) s" \
            -c "SELECT count(*) FROM pg_dist_partition WHERE logicalrelid::text LIKE 'idempotency.%'" \
            -c "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'idempotency.job_types'::regclass AND NOT tgisinternal" | paste -sd'|'
    }
    before=$(snapshot)
    out=$(printf '%s\n' "CREATE TABLE public.parallel_probe (k text, v int);" \
                "SELECT create_distributed_table('public.parallel_probe', 'k');" \
                "\\set VERBOSITY sqlstate" "BEGIN;" "SELECT count(*) FROM public.parallel_probe;" \
                "SELECT idempotency.distribute();" | citus_psql coord -At -v ON_ERROR_STOP=1 2>&1 || true)
    echo "$out"
    [[ $out == *25001* ]] || { echo "repro: distribute() after a parallel query did not refuse with 25001" >&2; exit 1; }
    after=$(snapshot)
    echo "records | Citus tables of the extension | guard triggers: before $before, after $after"
    [[ $before == "$after" && $after == *"|0|2" ]] || { echo "repro: the refused distribute() changed something" >&2; exit 1; }
    citus_psql coord -q -c "DROP TABLE public.parallel_probe"
    echo "== distribute with idempotency.distribute()"
    citus_psql coord -e -v ON_ERROR_STOP=1 -c "SELECT idempotency.distribute()"
    out=$(citus_psql coord -v VERBOSITY=sqlstate -c "\\set VERBOSITY sqlstate" -c "SELECT idempotency.distribute()" 2>&1 || true)
    echo "again: $out"
    [[ $out == *55000* ]] || { echo "repro: a second distribute() did not refuse with 55000" >&2; exit 1; }
    citus_psql coord -c "SELECT logicalrelid, partmethod, partkey IS NOT NULL AS has_key, colocationid FROM pg_dist_partition ORDER BY 1"
    REPRO_DISTRIBUTE=function "$python" "$here/repro.py" || exit
    [[ ${REPRO_MATRIX:-0} == 1 ]] || exit 0

    # the replay matrix runner through the coordinator (hook 93): every
    # cell, as a role with the README's grants made after distribute() and
    # copied to the workers by distribute_grants()
    echo "== the replay matrix through the coordinator"
    make -s -C "$root/matrix"
    citus_psql coord -q -v ON_ERROR_STOP=1 <<'EOF'
CREATE ROLE matrix_runner LOGIN;
CREATE SCHEMA matrix AUTHORIZATION matrix_runner;
GRANT USAGE ON SCHEMA idempotency TO matrix_runner;
GRANT EXECUTE ON FUNCTION idempotency.claim_operation(text, text, text, text, text, boolean),
    idempotency.complete_operation(text, text, integer, jsonb), idempotency.release_operation(text, text, integer),
    idempotency.extend_lease(text, text, integer), idempotency.stale_claims(text) TO matrix_runner;
GRANT SELECT, INSERT, DELETE ON idempotency.job_types TO matrix_runner;
GRANT SELECT, DELETE ON idempotency.operations TO matrix_runner;
SELECT idempotency.distribute_grants();
EOF
    status=0
    "$root/matrix/idempotency-matrix" --dsn "user=matrix_runner options='-c search_path=matrix'" -q || status=1
    left=$(citus_psql coord -At -c "SELECT count(*) FROM idempotency.operations WHERE job_type LIKE 'idempotency_matrix_%'")
    [[ $left == 0 ]] || { echo "repro: the matrix left $left records behind" >&2; status=1; }
    exit $status
fi

echo "== distribute as the issue describes"
citus_psql coord -e -c "SELECT create_reference_table('idempotency.job_types')" 2>&1 || true
citus_psql coord -e <<'EOF'
SET citus.enable_unsafe_triggers = on;
SELECT create_reference_table('idempotency.job_types');
SELECT create_distributed_table('idempotency.operations', 'operation_key');
SELECT create_reference_table('idempotency.resolutions');
SELECT create_distributed_function('idempotency.claim_operation(text,text,text,text,text,boolean)',
                                   'operation_key', colocate_with := 'idempotency.operations');
SELECT create_distributed_function('idempotency.complete_operation(text,text,integer,jsonb)',
                                   'operation_key', colocate_with := 'idempotency.operations');
SELECT create_distributed_function('idempotency.release_operation(text,text,integer)',
                                   'operation_key', colocate_with := 'idempotency.operations');
SELECT create_distributed_function('idempotency.extend_lease(text,text,integer)',
                                   'operation_key', colocate_with := 'idempotency.operations');
SELECT logicalrelid, partmethod, partkey IS NOT NULL AS has_key, colocationid FROM pg_dist_partition ORDER BY 1;
EOF

"$python" "$here/repro.py"
