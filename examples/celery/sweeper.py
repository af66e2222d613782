"""Stale claims whose message RabbitMQ will not bring back (the task failed
with an unknown error and was acknowledged, the queue was purged, ...).
Run it every few minutes (cron, or celery beat):

    /usr/bin/python3 sweeper.py

For each claim whose lease ran out (idempotency.stale_claims()):
  policy hold                -> hand it to a person: print it (page, ticket);
                                nothing is re-sent until someone calls
                                idempotency.resolve_operation(...)
  policy retry, skip, lookup -> re-enqueue the task; the claim applies the policy
"""
import os

import psycopg

from tasks import confirmation_args, send_confirmation

job_type = os.environ.get("JOB_TYPE", "send_confirmation")
with psycopg.connect(autocommit=True) as db:
    rows = db.execute("SELECT operation_key, attempt, stale_policy::text, claimed_by, stale_for::text "
                      "FROM idempotency.stale_claims(%s)", (job_type,)).fetchall()
for key, attempt, policy, claimed_by, stale_for in rows:
    if policy == "hold":
        print(f"for a person: {job_type} {key} attempt {attempt} (claimed by {claimed_by}, stale for "
              f"{stale_for}); decide with SELECT idempotency.resolve_operation('{job_type}', '{key}', "
              f"'completed' | 'retry', 'note')")
    else:
        send_confirmation.apply_async(kwargs=confirmation_args(key))
        print(f"re-enqueued: {job_type} {key} attempt {attempt} (policy {policy})")
print(f"sweeper: {len(rows)} stale claim(s)")
