#!/usr/bin/python3
"""The end-to-end scenarios (examples/e2e/scenarios.py) through SQS: a local
fauxqs on 127.0.0.1 (random port), two sqs-consumer workers (node
worker.mjs), kill -9 at exact points. The seed's cases are the sign-off's
(examples/e2e/signoff.py sqs: signoff.job, and signoff-batch.job for the
batch handler).

    /usr/bin/python3 examples/sqs/e2e.py [--batch] [--policy hold,retry,skip] [--only NAMES] [--keep]

--batch: the workers use sqs-consumer's handleMessageBatch with
idempotentBatch (SQS_BATCH=1: receives of up to 10 messages, one
claim_operations and one complete_operations per receive); job types
send_confirmation_e2e_sqs_batch_<policy>, and batch-mixed-receive (a
receive of 10 messages with mixed verdicts).

Needs `npm ci` in examples/sqs, Debian's python3-psycopg, and a PostgreSQL
with the extension installed, from libpq's environment (PGHOST, PGPORT, ...).
The last line is "N passed, N failed".
"""
import collections
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "e2e"))
import harness  # noqa: E402
import scenarios  # noqa: E402

VISIBILITY = int(float(harness.LEASE)) + 2   # worker.mjs: the lease + 2 s


class Sqs(harness.Adapter):
    name = "sqs"
    title = "SQS (fauxqs 2.4, sqs-consumer 15, Node.js)"
    redelivery = "visibility"
    notes = [
        f"SQS: a killed consumer's message becomes visible again when its visibility timeout "
        f"({VISIBILITY} s, longer than the lease, kept up by sqs-consumer's heartbeat while the "
        f"handler runs) runs out, so the redelivery meets a stale claim and the policy decides at "
        f"once. in_progress keeps the message and makes it visible again after the lease "
        f"(ChangeMessageVisibility).",
    ]

    def __init__(self, batch=False):
        self.batch = batch
        if batch:
            self.name = "sqs_batch"
            self.title = "SQS (fauxqs 2.4, sqs-consumer 15 handleMessageBatch, Node.js)"
            self.notes = self.notes + [
                "SQS batch: the workers receive up to 10 messages at once (sqs-consumer's "
                "handleMessageBatch with idempotentBatch): one claim_operations and one "
                "complete_operations per receive; postponements in one ChangeMessageVisibilityBatch.",
            ]
            self.own_scenarios = [
                ("batch-mixed-receive", "a receive of 10: 8 new orders, one of them twice, one sent before",
                 self.batch_mixed_receive, "once"),
            ]
            # the sweeper is the same program in both modes, and what a batch
            # worker does with the message it re-enqueues (a stale claim, a
            # released record) is the runner's cases 5, 6 and 10 on
            # signoff-batch.job; the heartbeat is its case 12 there, and a
            # postponed copy coming back completed is batch-mixed-receive's
            both = "the single handler's run covers it; the batch worker's side is signoff-batch.job's "
            self.left_out = {"sweeper-retry": both + "case 10 (a released record runs)",
                             "lost-message-sweeper": both + "cases 5, 6 and 13",
                             "heartbeat-long-job": both + "case 12; the postponed copy: batch-mixed-receive"}

    def _env(self, env=None):
        e = dict(env or os.environ)
        e.update(QUEUE_URL=self.queue_url, SQS_ENDPOINT=self.endpoint,
                 AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED="true")
        if self.batch:
            e["SQS_BATCH"] = "1"
        return e

    def start_broker(self, tmp):
        env = dict(os.environ, VISIBILITY_TIMEOUT=str(VISIBILITY),
                   AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED="true")
        self.log = open(os.path.join(tmp, "broker.log"), "w")
        self.broker = subprocess.Popen(["node", "broker.mjs"], cwd=HERE, env=env,
                                       stdout=subprocess.PIPE, stderr=self.log, text=True,
                                       start_new_session=True)
        line = self.broker.stdout.readline()
        if not line.startswith("QUEUE_URL="):
            raise SystemExit(f"broker.mjs did not start: {line!r} (log {tmp}/broker.log)")
        kv = dict(part.split("=", 1) for part in line.split())
        self.queue_url, self.endpoint = kv["QUEUE_URL"], kv["SQS_ENDPOINT"]
        self.broker_desc = f"fauxqs on {self.endpoint}, visibility timeout {VISIBILITY} s"

    def begin(self, policy):
        """a fresh queue per policy: a message a failed scenario left behind
        cannot reach the next policy's workers"""
        env = dict(self._env(), VISIBILITY_TIMEOUT=str(VISIBILITY))
        self.queue_url = subprocess.run(
            ["node", "create-queue.mjs", f"send_confirmation_{policy}"], cwd=HERE, env=env,
            check=True, stdout=subprocess.PIPE, text=True).stdout.strip()

    def stop_broker(self):
        b = getattr(self, "broker", None)
        if b and b.poll() is None:
            b.terminate()
            try:
                b.wait(10)
            except subprocess.TimeoutExpired:
                b.kill()
                b.wait()
        if b:
            self.log.close()

    def workers_restarted(self):
        # a stopped worker's long poll (waitTimeSeconds 1 in worker.mjs) stays
        # open in fauxqs for up to 1 s after the process is gone, and a
        # message published meanwhile would be received by it: in flight for
        # a visibility timeout, then received again (receive count 2)
        time.sleep(1.5)

    def worker_command(self):
        return ["node", "worker.mjs"], HERE, self._env()

    def publish(self, key, copies=1, other=False):
        argv = ["node", "publish.mjs", key, str(copies)] + (["someone-else@example.test"] if other else [])
        subprocess.run(argv, cwd=HERE, env=self._env(), check=True)

    def queue_state(self, *args):
        return subprocess.run(["node", "queue-state.mjs", *args], cwd=HERE, env=self._env(),
                              check=True, stdout=subprocess.PIPE, text=True).stdout.strip()

    # lost-message-sweeper: the worker dies after the claim and its message is deleted
    # (here PurgeQueue, which takes in-flight messages too; in production:
    # expired after the retention period, or dead-lettered)
    lost_rx = r"run \(killed\), queue purged"
    lost_text = "run (killed), queue purged"

    def lose(self, r, key):
        r.pause(key, "before")
        self.publish(key)
        r.kill9(key, r.wait_paused(key, "before"))
        t = time.time()
        state = self.queue_state("purge")
        if state != "visible 0 in-flight 0 delayed 0":
            raise harness.Failed(f"{key}: after PurgeQueue: {state}")
        r.note(key, "queue purged", t)

    def check_refused(self, r, key):
        # fingerprint-mismatch: the refused message was not deleted: in flight until its
        # visibility timeout, then received again (DLQ after maxReceiveCount)
        state = self.queue_state()
        if state != "visible 0 in-flight 1 delayed 0":
            raise harness.Failed(f"{key}: after the refused claim: {state}, expected the message in flight")
        # checked: take it out (PurgeQueue), so that its receives (every
        # visibility timeout, ID002 again) do not meet the later scenarios' faults
        self.queue_state("purge")
        return f"after the refused claim the queue holds it: {state}"

    def sweep(self, env):
        return subprocess.run(["node", "sweeper.mjs"], cwd=HERE, env=self._env(env), check=True,
                              stdout=subprocess.PIPE, text=True).stdout


    # batch-mixed-receive (--batch): ten messages in one SendMessageBatch, so
    # that one receive of a batch worker gets them all: ORD-B1-01..08 (new;
    # 08 twice, byte for byte) and ORD-B1-09 (sent before). One
    # claim_operations answers run ×8, in_progress (08's second copy: two
    # deliveries of one key), completed (09); one complete_operations; the
    # in_progress copy is postponed and answered completed later.
    B1_NEW = [f"ORD-B1-{i:02d}" for i in range(1, 9)]
    B1_DONE = "ORD-B1-09"

    def batch_mixed_receive(self, r, _key):
        keys = self.B1_NEW + [self.B1_DONE]
        self.publish(self.B1_DONE)
        r.settle([self.B1_DONE], 1)
        before = len(r.events(keys))
        subprocess.run(["node", "publish-batch.mjs", *self.B1_NEW, self.B1_NEW[-1], self.B1_DONE],
                       cwd=HERE, env=self._env(), check=True)
        # 1 (09 before) + 8 completed + 09 acknowledged + the copy, completed later
        r.settle(keys, 11)
        evs = r.events(keys)[before:]
        receives = collections.defaultdict(list)   # verdict -> keys, in the receive of 10
        first = [e for e in evs if e["action"] in ("work", "ack", "retry")]
        big = [e for e in first if e.get("batch") == 10]
        if len(big) != 10 or len({e["pid"] for e in big}) != 1:
            raise harness.Failed("the ten messages were not claimed in one receive of 10: batch sizes "
                                 + ", ".join(str(e.get("batch")) for e in first))
        for e in big:
            receives[e["verdict"]].append(e["key"])
        counts = ", ".join(f"{v} ×{len(receives[v])}" if len(receives[v]) > 1 else v
                           for v in ("run", "in_progress", "completed") if receives[v])
        later = [e for e in first if e not in big]
        got = f"one receive: {counts}; the copy later: " + ", ".join(e["verdict"] for e in later)
        want = "one receive: run ×8, in_progress, completed; the copy later: completed"
        if receives["in_progress"] != [self.B1_NEW[-1]] or receives["completed"] != [self.B1_DONE]:
            raise harness.Failed(f"in_progress {receives['in_progress']}, completed {receives['completed']}")
        records = [r.record(k) for k in keys]
        emails = sum(r.emails(k) for k in keys)
        if got != want or emails != 9 or records != ["completed #1"] * 9:
            raise harness.Failed(f"{got}; {emails} emails; records {', '.join(records)}; expected {want}; "
                                 f"9 emails; 9 × completed #1")
        return (f"{got}; 9 emails, 9 × completed #1; the postponed copy answered "
                f"{later[0]['verdict']} {later[0]['t'] - big[0]['t']:.1f} s later")


if __name__ == "__main__":
    argv = sys.argv[1:]
    batch = "--batch" in argv
    sys.exit(scenarios.main(Sqs(batch=batch), [a for a in argv if a != "--batch"]))
