"""The sweeper: records of send_confirmation that no message will bring to a
worker any more. Run it every few minutes (cron, or celery beat):

    .venv/bin/python sweeper.py      # in examples/celery (tasks.py needs pg_idempotency)

1. Stale claims (idempotency.stale_claims()): the task was acknowledged
   without completing (an unknown error), the queue was purged, ...
     policy hold                -> hand it to a person: print it (page, ticket);
                                   nothing is re-sent until the person calls
                                   idempotency.resolve_operation(...)
     policy retry, skip, lookup -> re-enqueue the task; the claim applies the policy
2. Released records that nobody claimed for a lease: this is how a person's
   resolve_operation(..., 'retry') on a held or skipped record reaches a
   worker (the held message was acknowledged: no delivery would come), and
   how a release whose retry message was lost is sent after all. Re-enqueued;
   the next claim runs attempt + 1. A released record is listed again at every
   sweep until a worker claims it; the extra copies get `completed`.

The role needs EXECUTE on idempotency.stale_claims(text) and SELECT on
idempotency.operations and idempotency.job_types (the operator grants).
"""
import os

import psycopg

from tasks import confirmation_args, send_confirmation

# released, and untouched for a lease: no worker is on it (a claim would have
# made it claimed again; a worker's own retry after a known failure comes
# within half a lease)
RELEASED = """SELECT o.operation_key, o.attempt
                FROM idempotency.operations o
                JOIN idempotency.job_types j USING (job_type)
               WHERE o.job_type = %s AND o.status = 'released'
                 AND o.heartbeat_at + j.lease <= clock_timestamp()
               ORDER BY o.heartbeat_at"""

job_type = os.environ.get("JOB_TYPE", "send_confirmation")
with psycopg.connect(autocommit=True) as db:
    rows = db.execute("SELECT operation_key, attempt, stale_policy::text, claimed_by, stale_for::text "
                      "FROM idempotency.stale_claims(%s)", (job_type,)).fetchall()
    released = db.execute(RELEASED, (job_type,)).fetchall()
for key, attempt, policy, claimed_by, stale_for in rows:
    if policy == "hold":
        print(f"for a person: {job_type} {key} attempt {attempt} (claimed by {claimed_by}, stale for "
              f"{stale_for}); decide with SELECT idempotency.resolve_operation('{job_type}', '{key}', "
              f"'completed' | 'retry', 'note')")
    else:
        send_confirmation.apply_async(kwargs=confirmation_args(key))
        print(f"re-enqueued: {job_type} {key} attempt {attempt} (policy {policy})")
for key, attempt in released:
    send_confirmation.apply_async(kwargs=confirmation_args(key))
    print(f"re-enqueued: {job_type} {key} attempt {attempt} (released)")
print(f"sweeper: {len(rows)} stale claim(s), {len(released)} released record(s)")
