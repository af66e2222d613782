"""wrapped.py MODE [worker.py's arguments]: test/signoff/worker.py (the plain
functions) run as a wrapper would run it, for hook 84's checks of the point
hello's field wrapper (test/signoff/run.sh, step 13):

  named   inside pg_idempotency.signoff_wrapper("RefundConsumer"): a wrapper
          of one's own names itself, and the report names it
  old     the hello line without the field (a helper from before it): the
          report says "wrapper not reported"
  bad     the field a number, not a name: the report says so, the run goes on
"""
import contextlib
import json
import os
import runpy
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "helpers", "python"))
import pg_idempotency as idem  # noqa: E402

mode = sys.argv.pop(1)
if mode not in ("named", "old", "bad"):
    sys.exit(f"wrapped.py: unknown mode {mode!r} (named, old or bad)")
sys.argv[0] = os.path.join(here, "worker.py")
if mode != "named":
    made = idem.signoff_hello_message

    def changed(**fields):
        line = json.loads(made(**fields))
        if mode == "old":
            del line["wrapper"]
        else:
            line["wrapper"] = 42
        return json.dumps(line) + "\n"

    idem.signoff_hello_message = changed
with idem.signoff_wrapper("RefundConsumer") if mode == "named" else contextlib.nullcontext():
    runpy.run_path(sys.argv[0], run_name="__main__")
