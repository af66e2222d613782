#!/usr/bin/env bash
# Moving between the editions (issue 41): the portable edition installed as
# a plain script by the database's owner (twice: nothing changes), then
# portable/to-c.sql and portable/to-portable.sql on a database holding
# records in every state, a claim in flight, an audit row and a worker
# role's grants: nothing lost, the claim in flight completed by its attempt
# after each move. A few seconds. See test/portable/editions.sh.
set -euo pipefail
exec test/portable/editions.sh
