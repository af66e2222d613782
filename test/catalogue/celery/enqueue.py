"""enqueue.py KEY [--other]: one refund task for KEY (tasks.py's broker, a
directory); --other: the same key with other arguments (case 11)."""
import sys

from tasks import refund

if __name__ == "__main__":
    if len(sys.argv) not in (2, 3) or (len(sys.argv) == 3 and sys.argv[2] != "--other"):
        sys.exit("usage: enqueue.py KEY [--other]")
    refund.apply_async(kwargs={"key": sys.argv[1], "variant": "other" if len(sys.argv) == 3 else "same"})
