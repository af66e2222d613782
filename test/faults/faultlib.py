"""Helpers shared by the fault tests: start and drive test/faults/pgproxy.py,
connection strings for the server directly and through the proxy, and a
small TAP-like reporter. Python 3 standard library only (psycopg is imported
by the tests themselves)."""

import ctypes
import os
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PGPROXY = os.path.join(HERE, 'pgproxy.py')

# the bound of every wait in these tests: a connection attempt, a call, the
# proxy's start. Generous: a loaded 2-core machine must never hit it.
CONNECT_TIMEOUT = 10


def _die_with_parent():
    """In the proxy's child process: SIGTERM when the test process dies, so
    that no proxy outlives a killed test (prctl PR_SET_PDEATHSIG)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def exit_on_sigterm():
    """SIGTERM and SIGHUP end a test like Ctrl-C: the with blocks clean up."""
    def handler(signum, frame):
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGHUP, handler)


def server():
    """(host, port, user, dbname) of the server under test, from libpq's environment."""
    return (os.environ.get('PGHOST', '/var/run/postgresql'), int(os.environ.get('PGPORT', '5432')),
            os.environ.get('PGUSER', 'postgres'), os.environ.get('PGDATABASE', 'postgres'))


def direct_dsn(**extra):
    host, port, user, db = server()
    kv = dict(host=host, port=port, user=user, dbname=db, connect_timeout=CONNECT_TIMEOUT)
    kv.update(extra)
    return ' '.join('%s=%s' % (k, v) for k, v in kv.items())


class Proxy:
    """test/faults/pgproxy.py in a child process, in front of the server
    (or of `upstream`, a (host, port) pair)."""

    def __init__(self, upstream=None, workdir=None):
        host, port, self.user, self.dbname = server()
        self.upstream = upstream or (host, port)
        self._tmp = None
        if workdir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix='pgproxy.')
            workdir = self._tmp.name
        self.control = os.path.join(workdir, 'pgproxy-%d.sock' % id(self))
        self.log = open(os.path.join(workdir, 'pgproxy-%d.log' % id(self)), 'w+')
        self.proc = subprocess.Popen(
            [sys.executable, PGPROXY, 'serve', '--listen-port', '0',
             '--upstream-host', str(self.upstream[0]), '--upstream-port', str(self.upstream[1]),
             '--control', self.control],
            stdout=subprocess.PIPE, stderr=self.log, text=True, preexec_fn=_die_with_parent)
        line = self.proc.stdout.readline().strip()     # 'ready PORT', or '' if it died
        if not line.startswith('ready '):
            self.stop()
            raise RuntimeError('pgproxy did not start: %r; log: %s' % (line, self.log_text()))
        self.port = int(line.split()[1])

    def dsn(self, **extra):
        kv = dict(host='127.0.0.1', port=self.port, user=self.user, dbname=self.dbname,
                  connect_timeout=CONNECT_TIMEOUT)
        kv.update(extra)
        return ' '.join('%s=%s' % (k, v) for k, v in kv.items())

    def ctl_answer(self, command):
        """The answer line of `pgproxy.py ctl` (through the command line, as a
        shell script would use it) and its exit status."""
        r = subprocess.run([sys.executable, PGPROXY, 'ctl', self.control, command],
                           capture_output=True, text=True, timeout=30)
        return r.stdout.strip(), r.returncode

    def ctl(self, command):
        answer, rc = self.ctl_answer(command)
        if rc != 0 or not answer.startswith('ok'):
            raise RuntimeError('pgproxy ctl %r: %s (exit %d)' % (command, answer, rc))
        return answer

    def stats(self):
        answer = self.ctl('stats')
        return {k: int(v) for k, v in (w.split('=') for w in answer.split()[1:])}

    def log_text(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()
        self.log.close()
        if self._tmp:
            self._tmp.cleanup()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


class Tap:
    """ok / not ok lines and a summary line 'NAME: N passed, N failed'."""

    def __init__(self, name):
        self.name = name
        self.passed = self.failed = 0
        self.n = 0

    def ok(self, cond, desc, detail=None):
        self.n += 1
        if cond:
            self.passed += 1
            print('ok %d - %s' % (self.n, desc), flush=True)
        else:
            self.failed += 1
            print('not ok %d - %s' % (self.n, desc), flush=True)
            if detail is not None:
                for line in str(detail).splitlines():
                    print('#   ' + line, flush=True)
        return bool(cond)

    def note(self, text):
        for line in str(text).splitlines():
            print('# ' + line, flush=True)

    def run(self, name, fn, *args):
        """Run one group of checks; an exception is one failure."""
        try:
            fn(*args)
        except Exception as e:                  # noqa: BLE001: report and go on
            import traceback
            self.ok(False, '%s: raised %s: %s' % (name, type(e).__name__, e), traceback.format_exc())

    def done(self):
        print('%s: %d passed, %d failed' % (self.name, self.passed, self.failed), flush=True)
        return 0 if self.failed == 0 and self.passed > 0 else 1


def wait_until(cond, timeout=10.0, step=0.05):
    """Poll cond() until it is true or timeout seconds passed; returns its last value."""
    end = time.monotonic() + timeout
    while True:
        v = cond()
        if v or time.monotonic() > end:
            return v
        time.sleep(step)
