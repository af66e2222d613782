#!/usr/bin/env bash
# examples/celery/venv.sh [DIR]: install the helper package pg-idempotency
# (helpers/python) from this checkout into a virtual environment, as a
# user's app installs it: DIR, by default examples/celery/.venv. The
# environment sees Debian's Python packages (--system-site-packages:
# python3-psycopg, python3-celery), which are its dependencies: pip uses no
# index and checks no dependency (--no-deps: Debian 13's kombu declares the
# PyPI package tzdata, which Debian provides as its system tzdata and pip
# cannot see, so resolving them failed there); the imports are checked
# instead. The package is installed again at every run (a checkout's edits take
# effect). Needs python3-venv, python3-setuptools, python3-wheel. Prints the
# environment's python.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
venv=${1:-$root/examples/celery/.venv}
if ! "$venv/bin/python" -c '' 2>/dev/null; then
    rm -rf "$venv"
    /usr/bin/python3 -m venv --system-site-packages "$venv"
fi
"$venv/bin/pip" install --quiet --disable-pip-version-check --no-index --no-build-isolation --no-deps \
    "$root/helpers/python" >&2
"$venv/bin/python" -c 'import psycopg, celery, pg_idempotency, pg_idempotency.celery, sys; print(f"pg-idempotency {pg_idempotency.__version__} in {sys.prefix}", file=sys.stderr)'
echo "$venv/bin/python"
