#!/usr/bin/env bash
# Faults between the worker and the database, through a fault-injection
# proxy in the test tree (test/faults/pgproxy.py, Python standard library;
# Debian has no toxiproxy): its self-test against the server; the whole
# replay matrix through it with every claim, complete, release and
# extend_lease reply held 150 ms; the lost-reply cases (the server commits,
# the reply is dropped, the worker reconnects and retries with its delivery
# token) and a storm of 6,000 deliveries with a tenth of the claim, complete
# and COMMIT replies dropped, backends terminated and every connection reset
# now and then (needs the 0.3 API; skipped before it). Needs Debian's
# python3-psycopg, installed with apt-get when missing (as root). See
# test/faults/run.sh.
set -euo pipefail
exec test/faults/run.sh
