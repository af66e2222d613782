"""signoff.py: an example job signed off through its real queue, the way a
user signs off their own (idempotency-matrix --job FILE, docs/signoff.md).

    PY examples/e2e/signoff.py QUEUE [--job FILE] [--policy hold,retry,skip] [--cases LIST] [--keep]

e.g. examples/e2e/signoff.py sidekiq --job examples/sidekiq/second-job/signoff.job --policy retry

QUEUE is celery, sidekiq or sqs. The driver starts what a user already has
running: the queue's broker on 127.0.0.1 (the adapter of examples/QUEUE/e2e.py
starts it, as for the end-to-end test) and, for a job file that counts its
effects with a command of its own, the receiving ends of the effects
(sink.py: an SMTP and an HTTP server that count by key). The example job
files do not need them: they say effect = smtp or effect = http, and the
runner's own endpoint receives, counts and fails the effects on cue
(cases 14-18); their worker commands point the apps at it
($IDEMPOTENCY_SIGNOFF_SMTP, $IDEMPOTENCY_SIGNOFF_HTTP). Then, once per
policy, with a fresh queue (the adapter's begin(policy)), the policies side
by side (each waits for its leases while the others run), it runs

    matrix/idempotency-matrix --job examples/QUEUE/signoff.job --policy P [--cases LIST] --json ... --html ...

with the broker's and the sinks' settings in the environment the job file's
commands see (the adapter's _env(): CELERY_BROKER_URL, REDIS_URL, the SQS
endpoint, the queue's name ...; SMTP_HOST, SMTP_PORT and MAIL_SINK_LOG;
HTTP_SINK_URL and HTTP_SINK_LOG), and TMPDIR set to the driver's own
temporary directory (the runner's socket and kept worker logs go there).
The job file is what a user writes: it does not know this driver, and the
runner does not know the example.

Checks, one "ok"/"not ok" line per policy: the runner exits 0; its JSON
report has every case passing, with the effects counted by the runner's
endpoint ("smtp endpoint", "http endpoint") or by the job file's effects
command (a sink), not by the handled reports; and where a sink counted,
the sinks received at least one effect of the policy's run (keys
signoff-RUN-POLICY-...). The per-policy time is printed. The runners' text
reports are printed, one policy after another, once all have ended. The
last line is "signoff QUEUE: N passed, N failed"; exit 0 when none failed.

--dsn-only: the runner is given the database as --dsn alone (a URI made
from libpq's PG* variables of the driver's environment: postgresql://USER
[:PASSWORD]@/DATABASE?host=...&port=...), and no PG* variable is in its
environment: the workers and the commands reach the database through what
the runner hands them (libpq's variables of its --dsn), with every
helper's and example's defaults. The report's hello must name that
database.

Run with the python the example's e2e test uses (the Celery venv's, for
Celery; /usr/bin/python3 otherwise). Needs python3-aiosmtpd and psycopg, a
PostgreSQL with the extension from libpq's environment, and
matrix/idempotency-matrix (built here with make -C matrix when missing).
"""
import argparse
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import harness  # noqa: E402
import sink  # noqa: E402

# IDEMPOTENCY_MATRIX: another runner (test/signoff/stress.sh runs a copy)
RUNNER = os.environ.get("IDEMPOTENCY_MATRIX") or os.path.join(ROOT, "matrix", "idempotency-matrix")


def load_adapter(queue):
    """the harness.Adapter subclass of examples/QUEUE/e2e.py, constructed"""
    d = os.path.join(ROOT, "examples", queue)
    path = os.path.join(d, "e2e.py")
    if not os.path.exists(path):
        raise SystemExit(f"signoff.py: no {path}")
    sys.path.insert(0, d)
    spec = importlib.util.spec_from_file_location(f"e2e_{queue}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    classes = [v for v in vars(mod).values()
               if isinstance(v, type) and issubclass(v, harness.Adapter) and v is not harness.Adapter]
    if len(classes) != 1:
        raise SystemExit(f"signoff.py: {path} must define one harness.Adapter, has {len(classes)}")
    return classes[0]()


class Sink:
    """sink.py serve KIND, in a process of its own"""

    def __init__(self, tmp, kind):
        self.kind = kind
        self.log = os.path.join(tmp, f"{kind}-sink.log")
        port_file = os.path.join(tmp, f"{kind}-sink.port")
        self.out = open(os.path.join(tmp, f"{kind}-sink.out"), "w")
        self.proc = subprocess.Popen(
            ["/usr/bin/python3", sink.__file__, "serve", kind, self.log, "--port-file", port_file],
            stdout=self.out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + 30
        while not os.path.exists(port_file):
            if self.proc.poll() is not None or time.time() > deadline:
                self.stop()
                raise SystemExit(f"signoff.py: the {kind} sink did not start; see {self.out.name}")
            time.sleep(0.05)
        with open(port_file) as f:
            self.port = int(f.read())

    def env(self):
        if self.kind == "smtp":
            return {"SMTP_HOST": "127.0.0.1", "SMTP_PORT": str(self.port), "MAIL_SINK_LOG": self.log}
        return {"HTTP_SINK_URL": f"http://127.0.0.1:{self.port}", "HTTP_SINK_LOG": self.log}

    def effects(self, part):
        """the effects received under keys that contain part"""
        return sum(1 for k in sink.keys(self.log) if part in k)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.out.close()


def dsn_from_environment():
    """--dsn-only: the driver's PG* variables as one URI (libpq's own
    defaults for what is unset), percent-encoded"""
    from urllib.parse import quote, urlencode
    e = os.environ
    user = quote(e.get("PGUSER", ""), safe="")
    password = e.get("PGPASSWORD")
    auth = user + (":" + quote(password, safe="") if password else "")
    query = {k: e[v] for k, v in (("host", "PGHOST"), ("port", "PGPORT"), ("sslmode", "PGSSLMODE"),
                                  ("options", "PGOPTIONS")) if e.get(v)}
    return (f"postgresql://{auth + '@' if auth else ''}/{quote(e.get('PGDATABASE', ''), safe='')}"
            + (f"?{urlencode(query)}" if query else ""))


def check_report(path, database=None):
    """(ok, text): every case passes, effects counted by the command; with
    database, every worker's hello named it"""
    try:
        with open(path) as f:
            r = json.load(f)
    except (OSError, ValueError) as err:
        return False, f"no JSON report: {err}"
    source = r.get("signoff", {}).get("effects_source")
    if source not in ("smtp endpoint", "http endpoint", "command"):
        return False, (f"effects counted by {source!r}, not by the run's endpoint (effect = smtp|http) "
                       "nor by the job file's command (a sink)")
    cases = [(p["policy"], c) for p in r.get("policies", []) for c in p.get("cases", [])]
    if not cases:
        return False, "the report has no case"
    bad = [f"{p}:{c['case']}" for p, c in cases if not c.get("pass")]
    if bad:
        return False, "failing cases " + " ".join(bad)
    said = sorted({str(h.get("database")) for h in r["signoff"].get("helpers", [])})
    if database is not None and said != [database]:
        return False, f"the workers' hellos name the databases {said}, not {database!r} alone"
    at = f", every worker on {database} (--dsn alone)" if database is not None else ""
    return True, f"{len(cases)} cases pass, effects counted by the {source}{at}"


def main(argv=None):
    ap = argparse.ArgumentParser(description="sign off an example job through its real queue")
    ap.add_argument("queue", choices=["celery", "sidekiq", "sqs"])
    ap.add_argument("--job", help="the job file (default examples/QUEUE/signoff.job)")
    ap.add_argument("--policy", default="hold,retry,skip")
    ap.add_argument("--cases", help="the runner's --cases (default: all the job's cases)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    ap.add_argument("--dsn-only", action="store_true",
                    help="give the runner --dsn and no PG* variable in its environment")
    args = ap.parse_args(argv)
    # a SIGTERM (scripts/test stopping the hook) ends the run through the
    # finally below, so the broker and the sinks are stopped too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    job = os.path.abspath(args.job or os.path.join(ROOT, "examples", args.queue, "signoff.job"))
    if not os.access(RUNNER, os.X_OK):
        subprocess.run(["make", "--no-print-directory", "-s", "-C", os.path.dirname(RUNNER)],
                       check=True, stdout=subprocess.DEVNULL)
    adapter = load_adapter(args.queue)
    tmp = tempfile.mkdtemp(prefix=f"signoff-{args.queue}-")
    os.chmod(tmp, 0o755)
    passed = failed = 0
    t0 = time.time()
    sinks = []
    try:
        sinks = [Sink(tmp, "smtp"), Sink(tmp, "http")]
        tb = time.time()
        adapter.start_broker(tmp)
        if args.dsn_only:
            print("== the runner gets the database as --dsn alone (a URI), no PG* variable in its environment",
                  flush=True)
        print(f"== {adapter.title}: {os.path.relpath(job, ROOT)} signed off through the real queue; "
              f"broker up in {time.time() - tb:.1f} s ({adapter.broker_desc}), "
              f"sinks: SMTP on 127.0.0.1:{sinks[0].port}, HTTP on 127.0.0.1:{sinks[1].port}", flush=True)
        # the policies side by side, each on its own queue (a runner of its
        # own, its own job types, endpoints and keys): most of a policy's
        # time is waiting for leases, and three waits in a row were 2/3
        # of a sign-off's time
        runs = []
        for policy in args.policy.split(","):
            adapter.begin(policy)
            env = adapter._env()
            for s in sinks:
                env.update(s.env())
            # the runner's directory (socket, worker logs) inside ours: kept
            # or removed with it, out of reach of a clean-up of /tmp by others
            env["TMPDIR"] = tmp
            report = os.path.join(tmp, f"{policy}.json")
            out = open(os.path.join(tmp, f"{policy}.out"), "w+")
            cases = ["--cases", args.cases] if args.cases else []
            if args.dsn_only:
                # the database in --dsn only: nothing of libpq's in the
                # environment the runner, its workers and commands start with
                for name in [n for n in env if n.startswith("PG")]:
                    del env[name]
                cases += ["--dsn", dsn_from_environment()]
            p = subprocess.Popen([RUNNER, "--job", job, "--policy", policy, *cases, "--json", report,
                                  "--html", os.path.join(tmp, f"{policy}.html")],
                                 env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
            runs.append({"policy": policy, "p": p, "out": out, "report": report,
                         "t0": time.time(), "seconds": None})
        try:
            while any(r["seconds"] is None for r in runs):
                for r in runs:
                    if r["seconds"] is None and r["p"].poll() is not None:
                        r["seconds"] = time.time() - r["t0"]
                time.sleep(0.2)
        except BaseException:
            # SIGTERM or Ctrl-C: the runners kill their workers and delete
            # their job types and records on SIGTERM; wait for that
            for r in runs:
                if r["p"].poll() is None:
                    r["p"].terminate()
            for r in runs:
                try:
                    r["p"].wait(60)
                except subprocess.TimeoutExpired:
                    r["p"].kill()
                    r["p"].wait()
            raise
        for r in runs:
            policy, p = r["policy"], r["p"]
            r["out"].seek(0)
            print(r["out"].read(), end="", flush=True)
            r["out"].close()
            ok, text = check_report(r["report"], os.environ.get("PGDATABASE") or os.environ.get("PGUSER")
                                    if args.dsn_only else None)
            # the run's keys name its policy (signoff-RUN-POLICY-CASE-N)
            sent = sum(s.effects(f"-{policy}-") for s in sinks)
            if p.returncode != 0:
                ok, text = False, f"runner exit {p.returncode}; {text}"
            elif ok and text.endswith("command") and sent == 0:
                ok, text = False, "the sinks received no effect"
            at_sinks = f", {sent} effects at the sinks" if text.endswith("command") else ""
            print(f"{'ok' if ok else 'not ok'} - {args.queue} {policy}: {text}{at_sinks}, "
                  f"{r['seconds']:.1f} s", flush=True)
            if ok:
                passed += 1
            else:
                failed += 1
                args.keep = True
    finally:
        adapter.stop_broker()
        for s in sinks:
            s.stop()
        if args.keep:
            print(f"kept: {tmp} (reports, the sinks' logs, the broker's log, the runner's worker logs)")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"{adapter.title}: {time.time() - t0:.1f} s in all")
    print(f"signoff {args.queue}: {passed} passed, {failed} failed")
    return 0 if failed == 0 and passed > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
