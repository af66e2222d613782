"""enqueue.py KEY [--other]: one message for KEY into the test queue
(dirqueue.py). The arguments are {"key": KEY, "variant": "same"}, or
"other" with --other (the same key with other arguments: case 11)."""
import sys

import dirqueue

if __name__ == "__main__":
    if len(sys.argv) not in (2, 3) or (len(sys.argv) == 3 and sys.argv[2] != "--other"):
        sys.exit("usage: enqueue.py KEY [--other]")
    key = sys.argv[1]
    variant = "other" if len(sys.argv) == 3 else "same"
    dirqueue.put(dirqueue.spool(), {"key": key, "args": {"key": key, "variant": variant}})
