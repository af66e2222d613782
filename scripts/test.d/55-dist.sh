#!/usr/bin/env bash
# The release tarball as a user uses it (test/dist/run.sh): make dist, then,
# from the unpacked tarball and away from the checkout, the extension and
# the runner build, and the three helper packages install the way their
# ecosystems install things, with Debian packages and npm only: pip into a
# new venv without an index, gem build + gem install --local, npm pack + npm
# install of the .tgz. Installs when missing (root): python3-venv,
# python3-setuptools, python3-wheel, python3-psycopg, python3-celery, ruby,
# ruby-pg; a Node.js 22 or later as hook 80 does (examples/e2e/deps.sh:
# PATH's if it is 22 or later, else 24 from the npm registry).
# The test cluster is not used.
set -euo pipefail
source examples/e2e/deps.sh
needs=0
e2e_debs python3-venv python3-setuptools python3-wheel python3-psycopg python3-celery ruby ruby-pg || needs=1
e2e_node examples/sqs || needs=1
((needs == 0)) || exit 1
DIST_NPM="${E2E_NPM[*]}" exec test/dist/run.sh
