#!/usr/bin/env bash
# Bad input, property-tested: random sequences of every call checked against
# a model of the contract after every step (test/fuzz/state_machine.py), and
# extreme values (test/fuzz/extremes.py). Needs Debian's python3-psycopg,
# installed with apt-get when missing (as root). IDEMPOTENCY_LONG=1 runs
# ten times as many sequences.
set -euo pipefail
python=/usr/bin/python3    # Debian's, which sees Debian's modules
if ! "$python" -c 'import psycopg' 2>/dev/null; then
    if ((EUID == 0)); then
        echo "== installing python3-psycopg (Debian package)"
        apt_opts=(-o DPkg::Lock::Timeout=600 -o Dpkg::Use-Pty=0)
        export DEBIAN_FRONTEND=noninteractive
        # a stale package index: update once and retry
        apt-get "${apt_opts[@]}" install -y -q python3-psycopg >/dev/null ||
            { apt-get "${apt_opts[@]}" update -qq && apt-get "${apt_opts[@]}" install -y -q python3-psycopg >/dev/null; }
    else
        echo "71-fuzz: python3-psycopg is missing; install it with: sudo apt-get install -y python3-psycopg" >&2
        exit 1
    fi
fi
sequences=20
[[ -n ${IDEMPOTENCY_LONG:-} && ${IDEMPOTENCY_LONG} != 0 ]] && sequences=200
rc=0
echo "== the state machine against its model ($sequences sequences of 300 steps)"
"$python" test/fuzz/state_machine.py --sequences "$sequences" || rc=1
echo "== extreme values"
"$python" test/fuzz/extremes.py || rc=1
exit $rc
