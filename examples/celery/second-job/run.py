"""run.py: the second Celery job (record_payment, an HTTP POST to a ledger)
signed off through its real queue, as a user signs off their own job:

    PY examples/celery/second-job/run.py [--policy retry] [--keep]

PY: the python examples/celery/venv.sh prints. It starts what a user already
has running: a rabbitmq-server on 127.0.0.1 (the Celery e2e adapter's,
examples/celery/e2e.py) and the ledger (ledger.py serve), then per policy
runs matrix/idempotency-matrix --job second-job/signoff.job with
CELERY_BROKER_URL, CELERY_QUEUE (a queue per policy), LEDGER_URL and
LEDGER_LOG in the environment the job file's commands see. The runner
knows neither the job nor this driver.

Checks, one "ok"/"not ok" line per policy: the runner exits 0, every case
of its JSON report passes with the effects counted by the job file's
command (the ledger), and the ledger received at least one payment. The
last line is "signoff record_payment: N passed, N failed".
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, os.path.join(ROOT, "examples", "e2e"))
import signoff  # noqa: E402  (examples/e2e/signoff.py: the broker adapter, the report check)


def lines(path):
    with open(path) as f:
        return sum(1 for _ in f)


def main(argv=None):
    ap = argparse.ArgumentParser(description="sign off record_payment through Celery")
    ap.add_argument("--policy", default="retry")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args(argv)
    job = os.path.join(HERE, "signoff.job")
    if not os.access(signoff.RUNNER, os.X_OK):
        subprocess.run(["make", "--no-print-directory", "-s", "-C", os.path.dirname(signoff.RUNNER)],
                       check=True, stdout=subprocess.DEVNULL)
    adapter = signoff.load_adapter("celery")
    tmp = tempfile.mkdtemp(prefix="signoff-record-payment-")
    os.chmod(tmp, 0o755)
    log = os.path.join(tmp, "ledger.log")
    port_file = os.path.join(tmp, "ledger.port")
    out = open(os.path.join(tmp, "ledger.out"), "w")
    ledger = subprocess.Popen(["/usr/bin/python3", os.path.join(HERE, "ledger.py"), "serve", log,
                               "--port-file", port_file],
                              stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    passed = failed = 0
    t0 = time.time()
    try:
        deadline = time.time() + 30
        while not os.path.exists(port_file):
            if ledger.poll() is not None or time.time() > deadline:
                raise SystemExit(f"run.py: the ledger did not start; see {out.name}")
            time.sleep(0.05)
        with open(port_file) as f:
            port = int(f.read())
        adapter.start_broker(tmp)
        print(f"== record_payment on {adapter.title}: {os.path.relpath(job, ROOT)} signed off "
              f"through the real queue ({adapter.broker_desc}), ledger on 127.0.0.1:{port}", flush=True)
        for policy in args.policy.split(","):
            adapter.begin(policy)
            env = dict(adapter._env(), CELERY_QUEUE=f"record_payment_signoff_{policy}",
                       LEDGER_URL=f"http://127.0.0.1:{port}/payments", LEDGER_LOG=log)
            report = os.path.join(tmp, f"{policy}.json")
            before = lines(log)
            tp = time.time()
            p = subprocess.run([signoff.RUNNER, "--job", job, "--policy", policy, "--json", report,
                                "--html", os.path.join(tmp, f"{policy}.html")],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            seconds = time.time() - tp
            print(p.stdout, end="", flush=True)
            ok, text = signoff.check_report(report)
            posted = lines(log) - before
            if p.returncode != 0:
                ok, text = False, f"runner exit {p.returncode}; {text}"
            elif ok and posted == 0:
                ok, text = False, "the ledger received no payment"
            print(f"{'ok' if ok else 'not ok'} - record_payment {policy}: {text}, "
                  f"{posted} payments at the ledger, {seconds:.1f} s", flush=True)
            if ok:
                passed += 1
            else:
                failed += 1
                args.keep = True
    finally:
        adapter.stop_broker()
        if ledger.poll() is None:
            ledger.terminate()
            try:
                ledger.wait(10)
            except subprocess.TimeoutExpired:
                ledger.kill()
                ledger.wait()
        out.close()
        if args.keep:
            print(f"kept: {tmp} (reports, ledger.log, the broker's log)")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"record_payment: {time.time() - t0:.1f} s in all")
    print(f"signoff record_payment: {passed} passed, {failed} failed")
    return 0 if failed == 0 and passed > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
