#!/usr/bin/python3
"""The seed's replay matrix through Celery 5.2 and RabbitMQ: a private
rabbitmq-server on 127.0.0.1 (random ports), two Celery workers (prefork,
one child each, acks_late, reject_on_worker_lost), kill -9 of the child that
runs the task, at exact points.

    /usr/bin/python3 examples/celery/e2e.py [--policy hold,retry,skip] [--keep]

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
import replay  # noqa: E402

RABBIT = "/usr/lib/rabbitmq/bin/rabbitmq-server"


class Celery(replay.Adapter):
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
    ]

    def start_broker(self, tmp):
        self.tmp = tmp
        d = os.path.join(tmp, "rabbitmq")
        os.makedirs(d)
        with open(os.path.join(d, "enabled_plugins"), "w") as f:
            f.write("[].\n")
        self.port, dist, self.epmd = replay.free_port(), replay.free_port(), replay.free_port()
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
        return (["/usr/bin/python3", "-m", "celery", "-A", "tasks", "worker", "-P", "prefork", "-c", "1",
                 "--prefetch-multiplier", "1", "-n", f"e2e{self.n}@%h", "--without-gossip",
                 "--without-mingle", "--without-heartbeat", "-l", "info"], HERE, self._env())

    def publish(self, key, copies=1):
        for _ in range(copies):
            self.tasks.send_confirmation.apply_async(kwargs=self.tasks.confirmation_args(key), queue=self.queue)

    def sweep(self, env):
        return subprocess.run(["/usr/bin/python3", "sweeper.py"], cwd=HERE, env=self._env(env), check=True,
                              stdout=subprocess.PIPE, text=True).stdout


if __name__ == "__main__":
    sys.exit(replay.main(Celery()))
