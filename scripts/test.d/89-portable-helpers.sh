#!/usr/bin/env bash
# The helpers on the portable edition (issue 41), as an app on a managed
# service uses them: in a database of the host's cluster owned by a role
# that is not a superuser (LOGIN CREATEDB CREATEROLE, what a managed
# service's master user has), the portable edition installed by that role
# with the script the Python package carries (`python3 -m pg_idempotency
# portable-sql | psql -f -`); then:
#   1. the script each package carries is the one portable/build.sh makes
#      now: pip's (the venv of examples/celery/venv.sh), the installed gem's
#      (examples/sidekiq/install-gem.sh: gem build), and npm pack's (the
#      .tgz's idempotency-portable.sql);
#   2. the three helpers' own suites, as that role, with
#      IDEMPOTENCY_EDITION=portable (their fixtures then require the
#      portable edition): pytest helpers/python/tests against the installed
#      package (PG_IDEMPOTENCY_TEST_CELERY=1, as hook 81), Ruby's minitest
#      against the installed gem (GEM_HOME, no -Ilib), Node's node --test on
#      Node.js 22 (hook 80 runs them on 22 and 24 on the C edition);
#   3. one sign-off run through a real queue: the Sidekiq example
#      (examples/e2e/signoff.py sidekiq: a private redis-server, the
#      example's workers with the gem's middleware, the runner's SMTP
#      endpoint), under retry (its takeovers and fenced late completions go
#      through the most of the portable edition's code), cases 1-13 and the
#      storm (19); the runner's report must say it ran on the portable
#      edition, as that role. About 85 s of this hook; SIGNOFF_CASES (e.g.
#      1-7, hook 90's clean roots) gives the cases, SIGNOFF_POLICIES=none
#      leaves it out. Hook 82 signs off the same job on the C edition under
#      every policy.
# About 2-2.5 minutes in all (128-144 s). Creates and drops the role
# idempotency_helpers_owner and its database idempotency_portable_helpers
# (and, through the tests, their own scratch databases and roles). Installs
# when missing (root): python3-psycopg, python3-pytest, python3-celery,
# python3-venv, python3-setuptools, python3-wheel, python3-aiosmtpd, ruby,
# ruby-rubygems, ruby-pg, ruby-sidekiq, redis-server; Node.js 22 as hook 80.
set -euo pipefail
source examples/e2e/deps.sh
needs=0
e2e_debs python3-psycopg python3-pytest python3-celery python3-venv python3-setuptools python3-wheel \
    python3-aiosmtpd ruby ruby-rubygems ruby-pg ruby-sidekiq redis-server || needs=1
e2e_node examples/sqs 22 || needs=1
((needs == 0)) || exit 1
e2e_npm helpers/node

owner=idempotency_helpers_owner
db=idempotency_portable_helpers
tmp=$(mktemp -d "${TMPDIR:-/tmp}/portable-helpers.XXXXXX")
chmod 755 "$tmp"
su=$PGUSER   # scripts/test's superuser (PGUSER is the owner from step 2 on)
drop() {
    PGUSER=$su psql -X -q -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "DROP ROLE IF EXISTS $owner"
}
trap 'drop || true; rm -rf "$tmp"' EXIT
drop
psql -X -q -v ON_ERROR_STOP=1 -d postgres -c "CREATE ROLE $owner LOGIN CREATEDB CREATEROLE" \
    -c "CREATE DATABASE $db OWNER $owner"

rc=0
ok() { echo "ok - $*"; }
not_ok() { echo "not ok - $*"; rc=1; }
step() { echo "== 89-portable-helpers: $1: $((SECONDS - t0)) s"; }

# ---- the packages, built as users build them -----------------------------
t0=$SECONDS
py=$(bash examples/celery/venv.sh)
bash examples/sidekiq/install-gem.sh >/dev/null
gems=$PWD/examples/sidekiq/gems
tgz=$(cd helpers/node && "${E2E_NPM[@]}" pack --silent --pack-destination "$tmp")
mkdir "$tmp/npm" "$tmp/fresh"
tar -xzf "$tmp/$tgz" -C "$tmp/npm"
sh portable/build.sh "$tmp/fresh" >/dev/null
fresh=$tmp/fresh/idempotency-portable.sql
step "packages built"

# 1. each package carries the script of this checkout's portable/*.sql
"$py" -m pg_idempotency portable-sql >"$tmp/python.sql"
GEM_HOME=$gems ruby -rpg_idempotency -e 'puts PgIdempotency.portable_sql' >"$tmp/ruby.sql"
for lang in python ruby npm; do
    got=$tmp/$lang.sql
    [[ $lang == npm ]] && got=$tmp/npm/package/idempotency-portable.sql
    if cmp -s "$got" "$fresh"; then
        ok "the $lang package carries portable/build.sh's idempotency-portable.sql ($(wc -l <"$fresh") lines)"
    else
        not_ok "the $lang package's script ($got) is not portable/build.sh's"
    fi
done

# the database's owner installs the portable edition with the printed script
t0=$SECONDS
if PGUSER=$owner psql -X -q -v ON_ERROR_STOP=1 -d "$db" -c 'SET client_min_messages = warning' \
        -f "$tmp/python.sql" >"$tmp/install.log" 2>&1 &&
    [[ $(PGUSER=$owner psql -X -At -d "$db" -c "SELECT edition || ' ' || version FROM idempotency.edition()") == portable\ * ]]; then
    ok "python3 -m pg_idempotency portable-sql | psql -f -, as $owner (not a superuser): edition() answers portable"
else
    not_ok "the portable edition did not install as $owner"
    sed 's/^/    /' "$tmp/install.log"
    exit 1
fi

# ---- 2. the helpers' own suites on it ------------------------------------
export PGUSER=$owner PGDATABASE=$db IDEMPOTENCY_EDITION=portable
t0=$SECONDS
if PG_IDEMPOTENCY_TEST_CELERY=1 "$py" -m pytest -p no:cacheprovider -q helpers/python/tests; then
    ok "Python: pytest helpers/python/tests on the portable edition"
else
    not_ok "Python: pytest helpers/python/tests on the portable edition"
fi
step "Python"
t0=$SECONDS
if (cd helpers/ruby && GEM_HOME=$gems RUBYOPT=-W0 ruby -Itest test/run.rb); then
    ok "Ruby: the installed gem's minitest suite on the portable edition"
else
    not_ok "Ruby: the installed gem's minitest suite on the portable edition"
fi
step "Ruby"
t0=$SECONDS
if (cd helpers/node && node --test test/*.test.mjs >"$tmp/node.log" 2>&1); then
    counts=$(awk '/^# (pass|skipped) / { printf "%s%s %s", sep, $3, ($2 == "pass" ? "passed" : "skipped"); sep = ", " }' "$tmp/node.log")
    ok "Node.js $(node --version): node --test on the portable edition ($counts)"
else
    not_ok "Node.js $(node --version): node --test on the portable edition"
    grep -E '^not ok|^# (tests|pass|fail|skipped)' "$tmp/node.log" | sed 's/^/    /'
fi
step "Node.js"

# ---- 3. one sign-off through a real queue --------------------------------
if [[ ${SIGNOFF_POLICIES:-} == none ]]; then
    echo "== 89-portable-helpers: sign-off left out (SIGNOFF_POLICIES=none)"
else
    t0=$SECONDS
    cases=${SIGNOFF_CASES:-1-13,19}
    if /usr/bin/python3 examples/e2e/signoff.py sidekiq --policy retry --cases "$cases" | tee "$tmp/signoff.log" &&
        grep -q "^Sign-off run: .* (portable edition) on PostgreSQL" "$tmp/signoff.log" &&
        grep -q "database $db, user $owner;" "$tmp/signoff.log"; then
        ok "the Sidekiq example signed off on the portable edition as $owner, retry, cases $cases"
    else
        not_ok "the Sidekiq example's sign-off on the portable edition (retry, cases $cases)"
    fi
    step "sign-off"
fi
exit $rc
