#!/usr/bin/python3
"""The end-to-end scenarios (examples/e2e/scenarios.py) through Sidekiq (6.4,
7.3, 8.1) and Redis: a private redis-server on 127.0.0.1 (random port), two
Sidekiq processes (default fetch, concurrency 1), kill -9 of the process
that runs the job, at exact points. The seed's cases are the sign-off's
(examples/e2e/signoff.py sidekiq).

    /usr/bin/python3 examples/sidekiq/e2e.py [--policy hold,retry,skip] [--only NAMES] [--keep]

Needs Debian's ruby-sidekiq, ruby-pg, redis-server and python3-psycopg, the
gem pg-idempotency (helpers/ruby) installed into examples/sidekiq/gems by
examples/sidekiq/install-gem.sh (the workers, publish.rb and sweeper.rb run
with GEM_HOME set to it), and a PostgreSQL with the extension from libpq's
environment (PGHOST, PGPORT, ...).
The last line is "N passed, N failed".
"""
import json
import os
import signal
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# GEM_HOME of the example's ruby processes: install-gem.sh puts the gem
# pg-idempotency there (the default gem paths, Debian's, stay searched)
GEM_HOME = os.path.join(HERE, "gems")
sys.path.insert(0, os.path.join(HERE, "..", "e2e"))
import harness  # noqa: E402
import scenarios  # noqa: E402


def _versions():
    """what this machine runs, e.g. 'Sidekiq 7.3.2 + Redis 8.0.2'"""
    def out(argv):
        try:
            return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                  cwd=HERE, env=dict(os.environ, RUBYOPT="-W0")).stdout
        except OSError:
            return ""
    sk = out(["ruby", "-e", 'require "sidekiq"; print Sidekiq::VERSION']).strip() or "?"
    rs = next((w[2:] for w in out(["redis-server", "--version"]).split() if w.startswith("v=")), "?")
    return f"Sidekiq {sk} + Redis {rs}"


class Sidekiq(harness.Adapter):
    name = "sidekiq"
    title = _versions()
    redelivery = "never"
    # the runner's case 12 on signoff.job holds a job at claimed for two
    # leases and sees the duplicate judged in_progress; the duplicate's way
    # back (perform_in, then a delivery that is answered) is
    # stuck-transaction's here
    left_out = {"heartbeat-long-job": "signoff.job's case 12 (the heartbeat, the duplicate in_progress); "
                "the re-enqueued duplicate coming back: stuck-transaction"}
    notes = [
        "Sidekiq (default fetch): a kill -9 loses the job the process was running, for good: "
        "no redelivery, only the stale claim remains, and the sweeper (idempotency.stale_claims()) "
        "finds it after the lease: hold hands it to a person, retry and skip re-enqueue it and the "
        "claim applies the policy. in_progress re-enqueues the job with perform_in(lease). "
        "ruby-gitlab-sidekiq-fetcher (reliable fetch; Sidekiq 6 only: Sidekiq 7 ignores Debian's 0.9.0) "
        "would bring the job back, after up to an hour with its default timings.",
    ]

    def start_broker(self, tmp):
        spec = os.path.join(GEM_HOME, "specifications")
        if not (os.path.isdir(spec) and any(f.startswith("pg-idempotency-") for f in os.listdir(spec))):
            raise SystemExit(f"the gem pg-idempotency is not installed in {GEM_HOME}: "
                             "run examples/sidekiq/install-gem.sh first")
        self.port = harness.free_port()
        self.log = open(os.path.join(tmp, "redis.log"), "w")
        self.broker = subprocess.Popen(
            ["redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
             "--appendonly", "no", "--dir", tmp], stdout=self.log, stderr=subprocess.STDOUT,
            start_new_session=True)
        deadline = time.time() + 30
        while True:
            if self.broker.poll() is not None:
                raise SystemExit(f"redis-server exited with {self.broker.returncode} (log {tmp}/redis.log)")
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.5).close()
                break
            except OSError:
                if time.time() > deadline:
                    raise SystemExit("redis-server did not accept connections in 30 s")
                time.sleep(0.05)
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.broker_desc = f"redis-server on 127.0.0.1:{self.port}"

    def stop_broker(self):
        b = getattr(self, "broker", None)
        if b:
            b.terminate()
            try:
                b.wait(10)
            except subprocess.TimeoutExpired:
                b.kill()
                b.wait()
            self.log.close()

    def begin(self, policy):
        self.queue = f"send_confirmation_e2e_{policy}"

    def _env(self, env=None):
        # the broker and the queue only: the job type and the lease are the
        # workers' (harness.Run.env() gives the test's; the sign-off run,
        # examples/e2e/signoff.py, maps send_confirmation to its own).
        # Deprecation warnings (redis-rb 4.8 about Sidekiq 6.4's calls): off
        return dict(env or os.environ, GEM_HOME=GEM_HOME, REDIS_URL=self.url, SIDEKIQ_QUEUE=self.queue,
                    SIDEKIQ_POLL="0.5", RUBYOPT="-W0")

    def worker_command(self):
        return (["sidekiq", "-r", "./worker.rb", "-c", "1", "-q", self.queue, "-t", "5"],
                HERE, self._env())

    def publish(self, key, copies=1, other=False):
        argv = ["ruby", "publish.rb", key, str(copies)] + (["someone-else@example.test"] if other else [])
        subprocess.run(argv, cwd=HERE, env=self._env(), check=True)

    # lost-message-sweeper: the default fetch loses the job of a killed
    # process: harness.Adapter.lose's kill -9 is all it takes

    # fingerprint-mismatch: retrying cannot heal ID002, so the middleware
    # sends the job to Sidekiq's dead set at once (no retry set)
    refused_action = "dead"

    def check_refused(self, r, key):
        deadline = time.time() + harness.WAIT
        while time.time() < deadline:
            out = subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", str(self.port), "ZRANGE",
                                  "dead", "0", "-1"], check=True, stdout=subprocess.PIPE,
                                 text=True).stdout
            jobs = [j for j in out.splitlines() if f'"{key}","someone-else@example.test"' in j]
            if jobs:
                retried = subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", str(self.port), "ZRANGE",
                                          "retry", "0", "-1"], check=True, stdout=subprocess.PIPE,
                                         text=True).stdout
                if f'"{key}","someone-else@example.test"' in retried:
                    raise harness.Failed(f"{key}: the refused job is in the retry set too")
                job = json.loads(jobs[0])
                missing = [f for f in ("error_class", "error_message", "failed_at") if f not in job]
                if missing or job.get("retry_count") != 0:
                    raise harness.Failed(f"{key}: the dead job lacks Sidekiq's fields: {jobs[0]}")
                # checked: take it out, as a person would after reading it
                subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", str(self.port), "ZREM", "dead",
                                *jobs], check=True, stdout=subprocess.DEVNULL)
                return (f"the refused job went to Sidekiq's dead set at once, not to the retry set "
                        f"({job['error_class']}: {job['error_message'].strip().splitlines()[0]})")
            time.sleep(0.05)
        raise harness.Failed(f"{key}: the refused job is not in the dead set")

    def sweep(self, env):
        return subprocess.run(["ruby", "sweeper.rb"], cwd=HERE, env=self._env(env), check=True,
                              stdout=subprocess.PIPE, text=True).stdout


if __name__ == "__main__":
    sys.exit(scenarios.main(Sidekiq()))
