"""A tiny queue in a directory, for the sign-off run's test job (hook 84).

    spool/queue/<enqueued ns>-<pid>-<random>.msg   a message: JSON
        {"key": ..., "args": {...}, "not_before": <unix time>}
    spool/tmp/           where a message is written before its rename
    spool/processing/<pid>/   the messages a worker has taken (rename)
    spool/effects        the job's effects: one fsync'd line "key attempt pid"
    spool/pids/<pid>     one file per worker process that ever started

The spool is $SIGNOFF_TEST_DIR/spool-$IDEMPOTENCY_SIGNOFF_RUN (the runner
exports the run's id to every command), $SIGNOFF_TEST_DIR defaulting to
$TMPDIR or /tmp: one queue per run. A message is written whole into tmp/
and renamed into queue/ (atomic); a worker takes one by renaming it into
its own processing directory (atomic: of two workers, one rename wins). No
worker takes over another's in-flight messages: a message a killed worker
held is lost, and the runner's next enqueue is the redelivery."""
import json
import os
import time
import uuid


def spool():
    base = os.environ.get("SIGNOFF_TEST_DIR") or os.environ.get("TMPDIR") or "/tmp"
    run = os.environ.get("IDEMPOTENCY_SIGNOFF_RUN")
    if not run:
        raise SystemExit("dirqueue: IDEMPOTENCY_SIGNOFF_RUN is not set (the sign-off runner sets it)")
    path = os.path.join(base, f"spool-{run}")
    for sub in ("queue", "tmp", "processing", "pids"):
        os.makedirs(os.path.join(path, sub), exist_ok=True)
    return path


def put(spool_dir, message, delay=0.0):
    """write the message atomically; it is due `delay` seconds from now"""
    message = dict(message, not_before=time.time() + delay)
    name = f"{time.time_ns():020d}-{os.getpid()}-{uuid.uuid4().hex[:8]}.msg"
    tmp = os.path.join(spool_dir, "tmp", name)
    with open(tmp, "w") as f:
        json.dump(message, f)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, os.path.join(spool_dir, "queue", name))


def take(spool_dir, mine):
    """the oldest due message, renamed into the directory `mine`: (path,
    message), or None"""
    queue = os.path.join(spool_dir, "queue")
    now = time.time()
    for name in sorted(os.listdir(queue)):
        src = os.path.join(queue, name)
        try:
            with open(src) as f:
                message = json.load(f)
        except (FileNotFoundError, ValueError):
            continue          # taken meanwhile
        if message.get("not_before", 0) > now:
            continue
        dst = os.path.join(mine, name)
        try:
            os.rename(src, dst)
        except FileNotFoundError:
            continue          # another worker's rename won
        return dst, message
    return None


def effects_file(spool_dir):
    return os.path.join(spool_dir, "effects")
