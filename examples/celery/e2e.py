#!/usr/bin/python3
"""The end-to-end scenarios (examples/e2e/scenarios.py) through Celery 5.2
and RabbitMQ: a private rabbitmq-server on 127.0.0.1 (random ports), two
Celery workers (prefork, one child each, acks_late, reject_on_worker_lost),
kill -9 of the child that runs the task, at exact points. The workers work
as a role with only the worker grants (PGOPTIONS="-c role=..."), so that
Celery's own scenarios can take a grant away: grant-revoked-backoff, a
claim refused with 42501 is retried with a growing backoff and sent once
the grant is back; fingerprint-args-kwargs, the fingerprint is the same for
positional and keyword arguments, and other data under the same key fails
at once (ID002), without retries. The seed's cases are the sign-off's
(examples/e2e/signoff.py celery).

    py=$(examples/celery/venv.sh)    # the helper package, pg-idempotency
    $py examples/celery/e2e.py [--policy hold,retry,skip] [--only NAMES] [--keep]

Run with the python of a virtual environment where the package
pg-idempotency (helpers/python) is installed, as venv.sh installs it: the
workers and the sweeper are started with the same python (sys.executable).
Needs Debian's python3-celery, python3-psycopg and rabbitmq-server, and a
PostgreSQL with the extension from libpq's environment (PGHOST, PGPORT, ...).
The last line is "N passed, N failed".
"""
import os
import signal
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "e2e"))
sys.path.insert(0, HERE)
import harness  # noqa: E402
import scenarios  # noqa: E402

try:
    import pg_idempotency  # noqa: E402,F401 -- tasks.py imports pg_idempotency.celery
except ImportError:
    raise SystemExit(f"{sys.executable} has no pg_idempotency: install the package with "
                     "examples/celery/venv.sh and run this with the python it prints")

RABBIT = "/usr/lib/rabbitmq/bin/rabbitmq-server"
ROLE = "idempotency_e2e_celery_worker"   # the workers' role (cluster-wide; dropped at the end)
# claim_operation's signature, as installed: (text, text, text, text) up to
# 0.2, (text, text, text, text, text, boolean) from 0.3 on
CLAIM = "idempotency.claim_operation(text, text, text, text, text, boolean)"


def claim_signature(db):
    row = db.execute("SELECT p.oid::regprocedure::text FROM pg_proc p "
                     "WHERE p.proname = 'claim_operation' "
                     "AND p.pronamespace = 'idempotency'::regnamespace "
                     "ORDER BY p.pronargs DESC LIMIT 1").fetchone()
    return row[0] if row else CLAIM


class Celery(harness.Adapter):
    name = "celery"
    title = "Celery 5.2 + RabbitMQ 3.10"
    redelivery = "at once"
    notes = [
        "Celery + RabbitMQ: with task_acks_late and task_reject_on_worker_lost the message of a "
        "killed pool process is requeued as soon as the worker's main process notices the death "
        "(billiard checks its children every few seconds: here up to ~5 s, so after a 2 s lease "
        "the redelivery usually meets a stale claim; a redelivery inside the lease gets "
        "in_progress and is retried after the lease with self.retry(countdown=lease)). "
        "A kill -9 of the whole worker drops its AMQP connection and RabbitMQ requeues at once. "
        "With Redis as the broker, kombu restores unacknowledged messages only about every "
        "100 s, whatever visibility_timeout says.",
        "A claim that fails with an error that can heal (here 42501) is retried with "
        "self.retry (published again before the ack) after 1, 2, 4 ... s (at most 60 s, with "
        "jitter); the caller's bugs (ID002, 22xxx) fail at once.",
    ]

    def __init__(self):
        self.own_scenarios = [
            ("grant-revoked-backoff", "the worker lost its grant (42501), then got it back: retried "
             "with a growing backoff, sent once", self.grant_revoked_backoff, "once"),
            ("fingerprint-args-kwargs", "same order positionally, then with other data: same "
             "fingerprint; other data: ID002, not retried", self.fingerprint_args_kwargs, "once"),
        ]

    def setup_db(self, db, job_type):
        with db.cursor() as c:
            c.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (ROLE,))
            if not c.fetchone():
                c.execute(f"CREATE ROLE {ROLE} NOLOGIN")
            # the worker grants of README.md (Roles and grants)
            c.execute(f"GRANT USAGE ON SCHEMA idempotency TO {ROLE}")
            self.claim = claim_signature(c)
            c.execute(f"GRANT EXECUTE ON FUNCTION {self.claim}, "
                      "idempotency.complete_operation(text, text, integer, jsonb), "
                      "idempotency.release_operation(text, text, integer), "
                      f"idempotency.extend_lease(text, text, integer) TO {ROLE}")
        self.role_made = True

    def drop_role(self):
        import psycopg
        with psycopg.connect(autocommit=True) as db:
            db.execute(f"DROP OWNED BY {ROLE}")   # its grants in this database
            db.execute(f"DROP ROLE {ROLE}")

    def grant_revoked_backoff(self, r, key):
        # a grant that is missing (a deploy before the migration, a mistake):
        # the claim fails with 42501; the task must not be acknowledged away
        # but retried, later and later, until it works
        keys = [key]
        r.db.execute(f"REVOKE EXECUTE ON FUNCTION {self.claim} FROM {ROLE}")
        try:
            self.publish(key)
            r.wait_events(keys, lambda evs: len(evs) >= 3, "three refused claims")
            if r.emails(key) or r.record(key) != "none":
                raise harness.Failed(f"{key}: sent or recorded without the grant")
        finally:
            r.db.execute(f"GRANT EXECUTE ON FUNCTION {self.claim} TO {ROLE}")
        evs = r.settle(keys, 1)
        errors = [e for e in evs if e["verdict"] == "claim error"]
        delays = []
        for n, e in enumerate(errors):
            d = min(60.0, 2.0 ** n)   # the helper's backoff 1 s, backoff_max 60 s
            if e.get("retries") != n or not d / 2 <= e.get("retry_in", -1) <= d:
                raise harness.Failed(f"{key}: try {n}: retries {e.get('retries')}, retry in "
                                     f"{e.get('retry_in')} s; expected retries {n}, {d / 2}-{d} s")
            delays.append(f"{e['retry_in']:.1f}")
        shown = scenarios.expect(r, keys, 1, "completed #1", r"claim error \(42501, retry\), run",
                                 "claim error (42501, retry) ×3 or more, run")
        return f"{shown}; {len(errors)} refused claims, retried after {', '.join(delays)} s"

    def fingerprint_args_kwargs(self, r, key):
        # the fingerprint is taken over the arguments by name: the same order
        # published with keywords and positionally agree
        keys = [key]
        order = self.tasks.confirmation_args(key)
        self.publish(key)
        r.settle(keys, 1)
        self.tasks.send_confirmation.apply_async(args=(order["order"], order["email"]), queue=self.queue)
        r.settle(keys, 2)
        # the same key with other data: the caller's bug, no retry helps
        self.tasks.send_confirmation.apply_async(
            kwargs=dict(order, email="someone-else@example.test"), queue=self.queue)
        r.wait_events(keys, lambda evs: any(e["verdict"] == "claim error" for e in evs), "the refused claim")
        time.sleep(1.5)   # a retry would come within 1 s (backoff 1 s, jitter)
        return scenarios.expect(r, keys, 1, "completed #1", r"run, completed, claim error \(ID002, fail\)")

    def start_broker(self, tmp):
        self.tmp = tmp
        d = os.path.join(tmp, "rabbitmq")
        os.makedirs(d)
        with open(os.path.join(d, "enabled_plugins"), "w") as f:
            f.write("[].\n")
        self.port, dist, self.epmd = harness.free_port(), harness.free_port(), harness.free_port()
        self.renv = dict(os.environ, HOME=d, RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
                         RABBITMQ_NODE_PORT=str(self.port), RABBITMQ_DIST_PORT=str(dist),
                         RABBITMQ_NODENAME=f"e2e{self.port}@localhost",
                         RABBITMQ_MNESIA_BASE=f"{d}/mnesia", RABBITMQ_LOG_BASE=f"{d}/log",
                         RABBITMQ_ENABLED_PLUGINS_FILE=f"{d}/enabled_plugins",
                         RABBITMQ_CONFIG_FILE=f"{d}/rabbitmq", RABBITMQ_ADVANCED_CONFIG_FILE=f"{d}/advanced.config",
                         RABBITMQ_PID_FILE=f"{d}/pid", RABBITMQ_LOGS="-",
                         RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}",
                         ERL_EPMD_ADDRESS="127.0.0.1", ERL_EPMD_PORT=str(self.epmd))
        self.rlog = open(os.path.join(tmp, "rabbitmq.log"), "w")
        self.broker = subprocess.Popen([RABBIT], cwd=d, env=self.renv, stdout=self.rlog,
                                       stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + 90
        while True:
            if self.broker.poll() is not None:
                raise SystemExit(f"rabbitmq-server exited with {self.broker.returncode} (log {tmp}/rabbitmq.log)")
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.5).close()
                break
            except OSError:
                if time.time() > deadline:
                    raise SystemExit("rabbitmq-server did not accept connections in 90 s")
                time.sleep(0.2)
        with open(f"{d}/pid") as f:
            self.beam = int(f.read().strip())
        self.url = f"amqp://guest:guest@127.0.0.1:{self.port}//"
        self.broker_desc = f"rabbitmq-server on 127.0.0.1:{self.port}"
        os.environ["CELERY_BROKER_URL"] = self.url
        import tasks
        self.tasks = tasks

    def stop_broker(self):
        if getattr(self, "role_made", False):
            try:
                self.drop_role()
            except Exception as err:   # the broker must stop anyway
                print(f"could not drop role {ROLE}: {err}", file=sys.stderr)
        b = getattr(self, "broker", None)
        if not b:
            return
        if hasattr(self, "tasks"):
            self.tasks.app.pool.force_close_all()
        beam = getattr(self, "beam", None)
        if beam:
            try:
                os.kill(beam, signal.SIGTERM)
            except ProcessLookupError:
                pass
        try:
            b.wait(30)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(b.pid, signal.SIGKILL)   # the wrapper and anything left of the node
        except ProcessLookupError:
            pass
        b.wait()
        # epmd was started by the node, on our private port: stop it
        subprocess.run(["epmd", "-kill"], env=self.renv, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        self.rlog.close()

    def begin(self, policy):
        self.queue = f"send_confirmation_e2e_{policy}"

    def _env(self, env=None):
        return dict(env or os.environ, CELERY_BROKER_URL=self.url, CELERY_QUEUE=self.queue)

    def worker_command(self):
        self.n = getattr(self, "n", 0) + 1
        env = self._env()
        env["PGOPTIONS"] = (env.get("PGOPTIONS", "") + f" -c role={ROLE}").strip()
        # not --without-heartbeat: without the worker heartbeat's 2 s timer,
        # Celery 5.2's event loop runs a countdown (self.retry) up to ~5 s late
        # (measured: countdown 0.5 s ran after 5.0 s; with it, after 1-2 s)
        return ([sys.executable, "-m", "celery", "-A", "tasks", "worker", "-P", "prefork", "-c", "1",
                 "--prefetch-multiplier", "1", "-n", f"e2e{self.n}@%h", "--without-gossip",
                 "--without-mingle", "-l", "info"], HERE, env)

    def publish(self, key, copies=1, other=False):
        kwargs = self.tasks.confirmation_args(key)
        if other:
            kwargs["email"] = "someone-else@example.test"
        for _ in range(copies):
            self.tasks.send_confirmation.apply_async(kwargs=kwargs, queue=self.queue)

    # lost-message-sweeper: the provider fails with an unexpected error; the helper leaves
    # the claim to its lease and Celery acknowledges the failed task
    # (task_acks_on_failure_or_timeout, the default): the message is gone
    lost_rx = r"run \(failed\)"
    lost_text = "run (failed)"
    refused_action = "fail"   # fingerprint-mismatch: the task fails at once, no retry

    def lose(self, r, key):
        r.crash(key)
        self.publish(key)
        r.wait_events([key], lambda evs: any(e["action"] == "failed" for e in evs),
                      "the failed task")

    def sweep(self, env):
        return subprocess.run([sys.executable, "sweeper.py"], cwd=HERE, env=self._env(env), check=True,
                              stdout=subprocess.PIPE, text=True).stdout


if __name__ == "__main__":
    sys.exit(scenarios.main(Celery()))
