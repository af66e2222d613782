#!/usr/bin/env bash
# The whole replay matrix (every policy, every case) through PgBouncer in
# transaction pooling mode on 127.0.0.1 and a random port: no session state,
# no session advisory locks. pgbouncer is installed with apt-get when it is
# missing (as root). See test/pooler/run.sh.
set -euo pipefail
exec test/pooler/run.sh
