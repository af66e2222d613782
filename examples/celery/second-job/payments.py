"""A second Celery job, not one of the examples': record_payment posts a
payment to the ledger (an HTTP POST to $LEDGER_URL), once per payment.

    ../.venv/bin/python -m celery -A payments worker -c 1 --prefetch-multiplier 1

Message: record_payment(payment="PAY-1", amount_cents=1250). The operation
key is the payment's reference. The request carries the header
Idempotency-Key: <payment>; a 2xx answer means posted, a 4xx means refused
(nothing was recorded: a known failure, released and retried).
"""
import json
import os
import urllib.error
import urllib.request
import zlib

from celery import Celery

from pg_idempotency.celery import IdempotentTask, KnownFailure

app = Celery("payments", broker=os.environ.get("CELERY_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//"))
app.conf.update(
    task_acks_late=True,                 # acknowledge after the body, not before
    task_reject_on_worker_lost=True,     # a killed worker's message is requeued
    worker_prefetch_multiplier=1,
    task_default_queue=os.environ.get("CELERY_QUEUE", "record_payment"),
    broker_connection_retry_on_startup=True,
)


@app.task(base=IdempotentTask, name="record_payment", key_arg="payment", lease=300,
          job_type="record_payment")
def record_payment(payment, amount_cents):
    body = json.dumps({"payment": payment, "amount_cents": amount_cents}).encode()
    req = urllib.request.Request(os.environ.get("LEDGER_URL", "http://127.0.0.1:8080/payments"),
                                 data=body, method="POST",
                                 headers={"Content-Type": "application/json", "Idempotency-Key": payment})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return {"status": resp.status}
    except urllib.error.HTTPError as err:
        if 400 <= err.code < 500:   # refused: certainly not recorded
            raise KnownFailure(f"ledger answered {err.code}") from err
        raise                       # 5xx: recorded or not, the lease decides


def payment_args(payment):
    """stands in for the application's payments table: the same arguments
    for the same payment every time"""
    return {"payment": payment, "amount_cents": 100 + zlib.crc32(payment.encode()) % 10000}
