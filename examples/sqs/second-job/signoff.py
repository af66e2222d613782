#!/usr/bin/python3
"""signoff.py: the second SQS job (notify_shipment: one webhook POST per
shipment, worker.mjs) signed off through its real queue, the way a user
signs off a job of their own (idempotency-matrix --job, docs/signoff.md).

    /usr/bin/python3 examples/sqs/second-job/signoff.py [--policy retry] [--keep]

Starts what a user already has running: a local SQS (../broker.mjs: fauxqs
on 127.0.0.1, the queue notify_shipment) and the webhook's receiving end
(counter.py: HTTP on 127.0.0.1, one fsync'd line per POST); then runs

    matrix/idempotency-matrix --job signoff.job --policy P --json ... --html ...

with QUEUE_URL, SQS_ENDPOINT, WEBHOOK_URL and WEBHOOK_LOG in the environment
the job file's commands see. Neither the job file nor the runner knows this
driver. Checks, one "ok"/"not ok" line per policy: the runner exits 0, its
JSON report has every case passing with the effects counted by the job
file's command (the counter), and the counter received at least one POST.
The last line is "signoff notify_shipment: N passed, N failed".

Needs `npm ci` in examples/sqs (worker.mjs uses its node_modules), a
PostgreSQL with the extension from libpq's environment, and
matrix/idempotency-matrix (built with make -C matrix when missing).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SQS = os.path.dirname(HERE)
ROOT = os.path.dirname(os.path.dirname(SQS))
RUNNER = os.path.join(ROOT, "matrix", "idempotency-matrix")
NODE_ENV = {"AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED": "true"}


def stop(proc):
    if proc and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def start_broker(tmp, queue):
    log = open(os.path.join(tmp, "broker.log"), "w")
    proc = subprocess.Popen(["node", "broker.mjs"], cwd=SQS, stdout=subprocess.PIPE, stderr=log, text=True,
                            env=dict(os.environ, QUEUE_NAME=queue, VISIBILITY_TIMEOUT="30", **NODE_ENV),
                            start_new_session=True)
    line = proc.stdout.readline()
    if not line.startswith("QUEUE_URL="):
        stop(proc)
        raise SystemExit(f"signoff.py: broker.mjs did not start: {line!r} (log {log.name})")
    return proc, dict(part.split("=", 1) for part in line.split())


def start_counter(tmp):
    log = os.path.join(tmp, "webhook.log")
    port_file = os.path.join(tmp, "webhook.port")
    out = open(os.path.join(tmp, "counter.out"), "w")
    proc = subprocess.Popen(["/usr/bin/python3", os.path.join(HERE, "counter.py"), "serve", log,
                             "--port-file", port_file], stdout=out, stderr=subprocess.STDOUT,
                            start_new_session=True)
    deadline = time.time() + 30
    while not os.path.exists(port_file):
        if proc.poll() is not None or time.time() > deadline:
            stop(proc)
            raise SystemExit(f"signoff.py: counter.py did not start; see {out.name}")
        time.sleep(0.05)
    with open(port_file) as f:
        port = int(f.read())
    return proc, {"WEBHOOK_URL": f"http://127.0.0.1:{port}/shipments", "WEBHOOK_LOG": log}


def calls(log):
    try:
        with open(log) as f:
            return sum(1 for _ in f)
    except FileNotFoundError:
        return 0


def check_report(path):
    """(ok, text): every case passes, effects counted by the command"""
    try:
        with open(path) as f:
            r = json.load(f)
    except (OSError, ValueError) as err:
        return False, f"no JSON report: {err}"
    source = r.get("signoff", {}).get("effects_source")
    if source != "command":
        return False, f"effects counted by {source!r}, not by the job file's command (the counter)"
    cases = [(p["policy"], c) for p in r.get("policies", []) for c in p.get("cases", [])]
    if not cases:
        return False, "the report has no case"
    bad = [f"{p}:{c['case']}" for p, c in cases if not c.get("pass")]
    if bad:
        return False, "failing cases " + " ".join(bad)
    return True, f"{len(cases)} cases pass"


def main(argv=None):
    ap = argparse.ArgumentParser(description="sign off notify_shipment through its real queue")
    ap.add_argument("--policy", default="retry")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args(argv)
    if not os.access(RUNNER, os.X_OK):
        subprocess.run(["make", "--no-print-directory", "-s", "-C", os.path.dirname(RUNNER)],
                       check=True, stdout=subprocess.DEVNULL)
    tmp = tempfile.mkdtemp(prefix="signoff-notify_shipment-")
    os.chmod(tmp, 0o755)
    t0 = time.time()
    passed = failed = 0
    broker = counter = None
    try:
        counter, counter_env = start_counter(tmp)
        for policy in args.policy.split(","):
            # a broker (and queue) per policy: nothing one policy left in
            # the queue reaches the next one's workers
            broker, broker_env = start_broker(tmp, f"notify_shipment_{policy}")
            # TMPDIR: the runner's directory (socket, worker logs) inside ours
            env = dict(os.environ, **NODE_ENV, **broker_env, **counter_env, TMPDIR=tmp)
            report = os.path.join(tmp, f"{policy}.json")
            before = calls(counter_env["WEBHOOK_LOG"])
            tp = time.time()
            p = subprocess.run([RUNNER, "--job", os.path.join(HERE, "signoff.job"), "--policy", policy,
                                "--json", report, "--html", os.path.join(tmp, f"{policy}.html")],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            seconds = time.time() - tp
            stop(broker)
            broker = None
            print(p.stdout, end="", flush=True)
            ok, text = check_report(report)
            made = calls(counter_env["WEBHOOK_LOG"]) - before
            if p.returncode != 0:
                ok, text = False, f"runner exit {p.returncode}; {text}"
            elif ok and made == 0:
                ok, text = False, "the counter received no POST"
            print(f"{'ok' if ok else 'not ok'} - notify_shipment {policy}: {text}, "
                  f"{made} POSTs counted, {seconds:.1f} s", flush=True)
            if ok:
                passed += 1
            else:
                failed += 1
                args.keep = True
    finally:
        stop(broker)
        stop(counter)
        if args.keep:
            print(f"kept: {tmp} (reports, webhook.log, broker.log, the runner's worker logs)")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"notify_shipment: {time.time() - t0:.1f} s in all")
    print(f"signoff notify_shipment: {passed} passed, {failed} failed")
    return 0 if failed == 0 and passed > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
