"""A second Celery job, not one of the examples': record_payment posts a
payment to the ledger (an HTTP POST to $LEDGER_URL), once per payment.

    ../.venv/bin/python -m celery -A payments worker -c 1 --prefetch-multiplier 1

Message: record_payment(payment="PAY-1", amount_cents=1250). The operation
key is the payment's reference. The request carries the header
Idempotency-Key: <payment>. The ledger's answers:
- 2xx: posted;
- 503 or 429 (busy, try later), or no connection: refused for now, nothing
  was recorded: a known failure (released, retried after a backoff);
- any other 4xx (422: the ledger will never take this payment): refused for
  good: the operation ends, completed with the refusal as its result (a
  retry would only be refused again);
- any other 5xx, or no answer within $LEDGER_TIMEOUT seconds (default 10):
  recorded or not, the caller cannot know: the error propagates, the claim
  waits for its lease and the policy decides.
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
    # every connect and read: without it a ledger that takes the payment and
    # never answers holds the worker (and its claim) for ever
    timeout = float(os.environ.get("LEDGER_TIMEOUT") or 10)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return {"status": resp.status}
    except urllib.error.HTTPError as err:
        if err.code in (429, 503):      # refused for now: certainly not recorded
            raise KnownFailure(f"ledger answered {err.code}") from err
        if 400 <= err.code < 500:       # refused for good: ends here
            return {"status": err.code, "refused": err.read().decode(errors="replace")[:200]}
        raise                           # other 5xx: recorded or not, the lease decides
    except urllib.error.URLError as err:
        if isinstance(err.reason, ConnectionRefusedError):   # nothing listens: not recorded
            raise KnownFailure(f"ledger: {err.reason}") from err
        raise                           # a timeout among them: recorded or not
    except ConnectionRefusedError as err:
        raise KnownFailure(f"ledger: {err}") from err
    # socket.timeout / TimeoutError (no answer in time) propagate as they are


def payment_args(payment):
    """stands in for the application's payments table: the same arguments
    for the same payment every time"""
    return {"payment": payment, "amount_cents": 100 + zlib.crc32(payment.encode()) % 10000}
