#!/usr/bin/env bash
# The catalog test: a fresh install (CREATE EXTENSION idempotency, the
# default version's consolidated script idempotency--V.sql) and 0.1 updated
# to V (ALTER EXTENSION idempotency UPDATE, through every upgrade script)
# must have the same catalog: functions (bodies, settings, grants,
# comments), columns (types, defaults, order), indexes, constraints,
# triggers, views, enum labels, extension members, extconfig, initial
# privileges, comments and dependencies (test/catalog/catalog.sql, canonical
# text), and the same pg_dump --schema-only --binary-upgrade. A difference
# fails and is printed. A self-test installs changed copies of the script
# (a comment, a REVOKE, a default, a setting...) as version 'V.selftest' for
# a moment and must see each. A few seconds. See test/catalog/run.sh.
set -euo pipefail
exec test/catalog/run.sh
