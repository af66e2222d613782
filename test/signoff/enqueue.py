"""enqueue.py KEY [--other] [--stop-runner-after-in-progress SECONDS]: one
message for KEY into the test queue (dirqueue.py). The arguments are
{"key": KEY, "variant": "same"}, or "other" with --other (the same key with
other arguments: case 11).

--stop-runner-after-in-progress SECONDS: a runner descheduled after the
verdict in_progress (a loaded machine), not a broken job: a message for a
key enqueued before waits, once it is in the queue, until a worker was
judged in_progress on the key (worker.py leaves a marker), then stops the
runner (SIGSTOP; the runner is the parent of this command's process group
leader) and has a process of its own session resume it (SIGCONT) SECONDS
later. The runner is inside the enqueue command when it stops, so it has
read nothing yet: meanwhile the claim's lease runs out and the worker's own
in_progress retry is judged by the policy (7a, 7b must settle as 5, 6)."""
import os
import signal
import subprocess
import sys
import time

import dirqueue


def runner_pid():
    """the runner: the parent of this command's process group leader"""
    with open(f"/proc/{os.getpgid(0)}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def usage():
    sys.exit("usage: enqueue.py KEY [--other] [--stop-runner-after-in-progress SECONDS]")


if __name__ == "__main__":
    args = sys.argv[1:]
    if not args:
        usage()
    key = args.pop(0)
    variant = "same"
    stop = None
    while args:
        a = args.pop(0)
        if a == "--other":
            variant = "other"
        elif a == "--stop-runner-after-in-progress" and args:
            stop = float(args.pop(0))
        else:
            usage()
    spool = dirqueue.spool()
    again = False
    if stop is not None:
        marker = os.path.join(spool, "enqueued", key)
        os.makedirs(os.path.dirname(marker), exist_ok=True)
        again = os.path.exists(marker)
        open(marker, "w").close()
    dirqueue.put(spool, {"key": key, "args": {"key": key, "variant": variant}})
    if again and not os.path.exists(os.path.join(spool, "stopped", key)):
        judged = os.path.join(spool, "in_progress", key)
        t0 = time.time()
        while not os.path.exists(judged) and time.time() - t0 < 20:
            time.sleep(0.005)
        if os.path.exists(judged):
            os.makedirs(os.path.join(spool, "stopped"), exist_ok=True)
            open(os.path.join(spool, "stopped", key), "w").close()
            pid = runner_pid()
            subprocess.Popen(["sh", "-c", f"sleep {stop}; kill -CONT {pid}"], start_new_session=True,
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            os.kill(pid, signal.SIGSTOP)
