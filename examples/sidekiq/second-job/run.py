#!/usr/bin/python3
"""run.py: sign off notify_warehouse (worker.rb), a job the examples' tests
do not have, through Sidekiq, the way a user would: a private redis-server
and the counting server (counter.py) on 127.0.0.1, then

    matrix/idempotency-matrix --job signoff.job --json ...   (policy retry)

with REDIS_URL, WAREHOUSE_URL and WAREHOUSE_LOG in its environment. Checks:
the runner exits 0, every case of its JSON report passes, the effects were
counted by the job file's command (counter.py), and the server got calls.
Needs the gem pg-idempotency in ../gems (../install-gem.sh), Debian's
ruby-sidekiq, ruby-pg, redis-server, a PostgreSQL with the extension from
libpq's environment. The last line is "second job: ok" or "second job: not ok".
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
RUNNER = os.path.join(ROOT, "matrix", "idempotency-matrix")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what, ready, proc):
    deadline = time.time() + 30
    while not ready():
        if proc.poll() is not None or time.time() > deadline:
            raise SystemExit(f"run.py: {what} did not start")
        time.sleep(0.05)


def reachable(port):
    try:
        socket.create_connection(("127.0.0.1", port), 0.5).close()
        return True
    except OSError:
        return False


def main():
    if not os.access(RUNNER, os.X_OK):
        subprocess.run(["make", "--no-print-directory", "-s", "-C", os.path.dirname(RUNNER)], check=True)
    tmp = tempfile.mkdtemp(prefix="signoff-second-job-")
    os.chmod(tmp, 0o755)
    procs = []
    ok = False
    try:
        port = free_port()
        procs.append(subprocess.Popen(
            ["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no",
             "--dir", tmp], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True))
        wait_for("redis-server", lambda: reachable(port), procs[-1])
        log, port_file = os.path.join(tmp, "warehouse.log"), os.path.join(tmp, "warehouse.port")
        procs.append(subprocess.Popen(["/usr/bin/python3", os.path.join(HERE, "counter.py"), "serve", log,
                                       "--port-file", port_file], start_new_session=True))
        wait_for("counter.py", lambda: os.path.exists(port_file), procs[-1])
        with open(port_file) as f:
            http_port = int(f.read())
        env = dict(os.environ, GEM_HOME=os.path.join(os.path.dirname(HERE), "gems"), RUBYOPT="-W0",
                   REDIS_URL=f"redis://127.0.0.1:{port}/0",
                   WAREHOUSE_URL=f"http://127.0.0.1:{http_port}/orders", WAREHOUSE_LOG=log,
                   TMPDIR=tmp)   # the runner's worker logs, kept on failure, with ours
        report = os.path.join(tmp, "report.json")
        t = time.time()
        p = subprocess.run([RUNNER, "--job", os.path.join(HERE, "signoff.job"), "--json", report], env=env)
        seconds = time.time() - t
        try:
            with open(report) as f:
                r = json.load(f)
        except (OSError, ValueError) as err:
            r, why = {}, f"no JSON report: {err}"
        cases = [c for pol in r.get("policies", []) for c in pol.get("cases", [])]
        bad = [c["case"] for c in cases if not c.get("pass")]
        with open(log) as f:
            calls = sum(1 for _ in f)
        source = r.get("signoff", {}).get("effects_source")
        if p.returncode != 0:
            why = f"runner exit {p.returncode}" + (f", failing cases {' '.join(bad)}" if bad else "")
        elif not cases or bad:
            why = f"{len(cases)} cases, failing: {' '.join(bad) or '-'}"
        elif source != "command":
            why = f"effects counted by {source!r}, not by counter.py"
        elif calls == 0:
            why = "the warehouse got no call"
        else:
            ok, why = True, f"{len(cases)} cases pass"
        print(f"{'ok' if ok else 'not ok'} - notify_warehouse retry: {why}, {calls} HTTP calls counted, "
              f"{seconds:.1f} s")
    finally:
        for proc in procs:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if ok:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"kept: {tmp} (warehouse.log, report.json, the runner's worker logs)")
    print(f"second job: {'ok' if ok else 'not ok'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
