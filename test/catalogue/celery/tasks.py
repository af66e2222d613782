"""tasks.py: the catalogue's refund job in Python on the wrapper instead of
the plain functions (test/catalogue/README.md): a Celery task with
pg_idempotency.celery's IdempotentTask, on kombu's filesystem transport (a
broker that is a directory: no server), one directory per sign-off run
under $SIGNOFF_TEST_DIR (else $TMPDIR). The effect is the same line in the
same effects file as python/worker.py's, counted by ../signoff/effects.sh.

    python3 -m celery -A tasks worker -P solo -c 1 --without-gossip --without-mingle
    python3 enqueue.py KEY [--other]
"""
import os
import sys
import time
import uuid
from pathlib import Path

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "..", "helpers", "python"))
sys.path.insert(0, os.path.join(here, "..", "..", "signoff"))

from celery import Celery  # noqa: E402
from kombu.transport import TRANSPORT_ALIASES, filesystem  # noqa: E402
from queue import Empty  # noqa: E402

from kombu.utils.encoding import bytes_to_str  # noqa: E402
from kombu.utils.json import dumps, loads  # noqa: E402

import urllib.error  # noqa: E402
import urllib.request  # noqa: E402

import dirqueue  # noqa: E402
from pg_idempotency.celery import IdempotentTask, KnownFailure, PermanentFailure  # noqa: E402

# with IDEMPOTENCY_SIGNOFF_HTTP (effect = http) the refund is a POST to the
# provider, whose answers the task tells apart as docs/signoff.md says: 503
# or a refused connection a KnownFailure, 422 a PermanentFailure (the
# operation ends, the task fails: state FAILURE, not retried), no answer
# within 5 s an unknown outcome (raised)
HTTP = os.environ.get("IDEMPOTENCY_SIGNOFF_HTTP")


def refund_at(op_key):
    req = urllib.request.Request(f"{HTTP}/refunds/{op_key}", data=b'{"amount_cents": 1250}', method="POST",
                                 headers={"Idempotency-Key": op_key, "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5.0) as resp:
            return {"status": resp.status}
    except urllib.error.HTTPError as err:
        if err.code == 422:
            raise PermanentFailure(f"provider answered {err.code}") from err
        raise KnownFailure(f"provider answered {err.code}") from err
    except urllib.error.URLError as err:
        if isinstance(err.reason, ConnectionRefusedError):
            raise KnownFailure(f"provider unreachable: {err.reason}") from err
        raise


def broker_dir():
    base = os.environ.get("SIGNOFF_TEST_DIR") or os.environ.get("TMPDIR") or "/tmp"
    path = os.path.join(base, "celery-" + os.environ.get("IDEMPOTENCY_SIGNOFF_RUN", "none"))
    os.makedirs(os.path.join(path, "processed"), exist_ok=True)
    return path


class AtomicChannel(filesystem.Channel):
    """kombu's filesystem transport writes a message file in place, so a
    worker polling the directory can read it half written (an empty file:
    JSONDecodeError, and the worker stops: seen when a worker outlived its
    case while enqueue.py wrote). Written aside, under a name the queue does
    not match, and renamed into place: a reader sees all of it or nothing."""

    def _put(self, queue, payload, **kwargs):
        part = os.path.join(self.data_folder_out, ".part-" + uuid.uuid4().hex)
        real = Path(self.data_folder_out).joinpath(
            "{}_{}.{}.msg".format(int(round(time.monotonic() * 1000)), uuid.uuid4(), queue))
        with open(part, "wb") as f:
            f.write(dumps(payload).encode())
        os.rename(part, real)


    def _get(self, queue):
        """kombu's _get moves a message file into a folder every worker
        shares and reads it from there even when its own move failed
        (another worker took the file first): two workers polling one queue
        may both read a message, or one finds it gone (ChannelError "Cannot
        read file ... from queue", and the worker stops: seen under load in
        case 7b, test/signoff/stress.sh). Taken by a rename to a name of this
        process's own, as test/signoff/dirqueue.py takes a message: of two
        workers one rename wins, the other goes on to the next file."""
        suffix = "." + queue + ".msg"
        for name in sorted(os.listdir(self.data_folder_in)):
            if not name.endswith(suffix) or name.startswith("."):
                continue
            taken = os.path.join(self.data_folder_in, f".taken-{os.getpid()}-{name}.t")
            try:
                os.rename(os.path.join(self.data_folder_in, name), taken)
            except FileNotFoundError:
                continue                    # another worker took it
            with open(taken, "rb") as f:
                payload = f.read()
            os.remove(taken)
            return loads(bytes_to_str(payload))
        raise Empty()


class AtomicTransport(filesystem.Transport):
    Channel = AtomicChannel


TRANSPORT_ALIASES["atomicfs"] = __name__ + ":AtomicTransport"
app = Celery("catalogue_refund", broker="atomicfs://")
app.conf.update(
    broker_transport_options={"data_folder_in": broker_dir(), "data_folder_out": broker_dir(),
                              "processed_folder": os.path.join(broker_dir(), "processed"),
                              "polling_interval": 0.05},
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)


@app.task(base=IdempotentTask, name="refund", key_arg="key", lease=300, job_type="catalogue_refund")
def refund(key, variant):
    if HTTP:
        return refund_at(key)
    spool = dirqueue.spool()
    fd = os.open(dirqueue.effects_file(spool), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{key} celery {os.getpid()}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    return {"refunded": True}
