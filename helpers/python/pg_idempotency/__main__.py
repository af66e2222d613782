"""python3 -m pg_idempotency portable-sql: prints the portable edition's
plain script of this release (pg_idempotency.portable_sql()), e.g. for an
app's migrations or psql -f."""
import sys

from .portable import portable_sql

USAGE = "usage: python3 -m pg_idempotency portable-sql\n" \
        "  portable-sql  print the portable edition's plain script (docs/portable.md)\n"


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv in (["-h"], ["--help"]):
        sys.stdout.write(USAGE)
        return 0
    if argv != ["portable-sql"]:
        sys.stderr.write(USAGE)
        return 2
    sys.stdout.write(portable_sql())
    return 0


if __name__ == "__main__":
    sys.exit(main())
