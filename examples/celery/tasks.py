"""The send_confirmation job on Celery with RabbitMQ.

    examples/celery/.venv/bin/python -m celery -A tasks worker -c 1 --prefetch-multiplier 1

(examples/celery/venv.sh installs the helper package, pg-idempotency, there.)

Message: send_confirmation(order="ORD-1001", email="..."). The operation key
is the order reference (it names the effect), not the Celery task id.
"""
import json
import os
import time

from celery import Celery

import mail_provider
from pg_idempotency.celery import IdempotentTask, KnownFailure

app = Celery("tasks", broker=os.environ.get("CELERY_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//"))
app.conf.update(
    task_acks_late=True,                 # acknowledge after the body, not before
    task_reject_on_worker_lost=True,     # a killed worker's message is requeued
    worker_prefetch_multiplier=1,
    task_default_queue=os.environ.get("CELERY_QUEUE", "send_confirmation"),
    broker_connection_retry_on_startup=True,
)
LEASE = float(os.environ.get("LEASE_SECONDS", "600"))   # as in idempotency.job_types


class Task(IdempotentTask):
    def on_verdict(self, event):
        super().on_verdict(event)
        if os.environ.get("E2E_EVENTS"):   # the end-to-end test reads these
            with open(os.environ["E2E_EVENTS"], "a") as f:
                f.write(json.dumps({**event, "pid": os.getpid(), "t": time.time()}) + "\n")


HEARTBEAT = float(os.environ["HEARTBEAT_SECONDS"]) if os.environ.get("HEARTBEAT_SECONDS") else None
# seconds a claim may wait for another transaction's uncommitted claim of the
# key; 0: not at all (in_progress at once)
CLAIM_WAIT = float(os.environ.get("CLAIM_WAIT_SECONDS", "0"))


@app.task(base=Task, name="send_confirmation", key_arg="order", lease=LEASE, heartbeat=HEARTBEAT,
          claim_wait=CLAIM_WAIT, job_type=os.environ.get("JOB_TYPE", "send_confirmation"))
def send_confirmation(order, email):
    try:
        return mail_provider.send(email, f"Your order {order}", key=order)
    except mail_provider.Refused as err:   # certainly not sent: release, retry after a backoff
        raise KnownFailure(str(err)) from err
    except mail_provider.RefusedForGood as err:
        # certainly not sent, and never will be (say no such mailbox): the
        # operation ends here, the refusal its result; retrying it would only
        # ask again and again. Any other error (no reply in time: sent or
        # not?) propagates and leaves the claim to its lease: the policy decides
        return {"accepted": False, "refused": str(err)}


def confirmation_args(order):
    """stands in for the application's orders table: the message of an order,
    built the same way by the publisher and by the sweeper"""
    return {"order": order, "email": f"customer-{order.lower()}@example.test"}
