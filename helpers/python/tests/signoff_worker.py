"""A worker that runs one job and exits, for the sign-off kill tests
(conftest.kill_at); started armed by the test, which plays the runner.

    python signoff_worker.py plain|celery JOB_TYPE KEY EFFECT_FILE LEASE

The job's effect: a line appended to EFFECT_FILE. plain: a hand-written
psycopg worker with pg_idempotency's functions and sign-off points; celery:
the task run by IdempotentTask in this process (Celery's eager tracer, no
broker). Exit status 0: completed; 3 (plain): released (the runner
answered fail); 4: not run (another verdict)."""
import sys

import pg_idempotency as idem


def handle(key, effect):
    with open(effect, "a") as f:
        f.write(f"{key}\n")
    return {"done": key}


def plain(job_type, key, effect, lease):
    c = idem.claim(job_type, key, idem.fingerprint({"key": key}))
    if not c.runs:
        return 4
    with idem.Heartbeat(job_type, key, c.attempt, every=lease / 4):
        go = idem.signoff_point("claimed", job_type, key, c, heartbeat=True)
        if go == "continue":
            value = handle(key, effect)
    if go == "fail":   # as on a known failure: released, the handler not called
        idem.release(job_type, key, c.attempt)
        return 3
    idem.signoff_point("handled", job_type, key, c, heartbeat=True)
    idem.complete(job_type, key, c.attempt, value)
    return 0


def celery(job_type, key, effect, lease):
    from celery import Celery
    from pg_idempotency.celery import IdempotentTask

    app = Celery("signoff_worker", set_as_current=False)

    @app.task(base=IdempotentTask, name=job_type, job_type=job_type, key_arg="key",
              lease=lease, heartbeat=lease / 4)
    def job(key):
        return handle(key, effect)

    return 0 if job.apply((key,)).successful() else 4


if __name__ == "__main__":
    mode, job_type, key, effect, lease = sys.argv[1:]
    sys.exit({"plain": plain, "celery": celery}[mode](job_type, key, effect, float(lease)))
