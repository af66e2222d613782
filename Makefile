# idempotency: PGXS build
#
#   make && make install          build and install the extension
#   make installcheck             regression, isolation and TAP tests against
#                                 a running server (PGHOST/PGPORT)
#
# The version lives in one place, idempotency.control (default_version).

EXTENSION  = idempotency
EXTVERSION = $(shell sed -n "s/^default_version[[:space:]]*=[[:space:]]*'\(.*\)'/\1/p" $(EXTENSION).control)

MODULE_big = idempotency
OBJS       = $(patsubst %.c,%.o,$(sort $(wildcard src/*.c)))
DATA       = $(sort $(wildcard $(EXTENSION)--*.sql))

# pg_regress: one file per feature under sql/ and expected/
REGRESS      = $(patsubst sql/%.sql,%,$(sort $(wildcard sql/*.sql)))
REGRESS_OPTS = --inputdir=.

# isolation specs (races) under test/isolation
ISOLATION      = $(patsubst test/isolation/specs/%.spec,%,$(sort $(wildcard test/isolation/specs/*.spec)))
ISOLATION_OPTS = --inputdir=test/isolation --load-extension=$(EXTENSION)

# TAP tests (crash, restart, load) under test/t
TAP_TESTS   = 1
PROVE_TESTS = $(sort $(wildcard test/t/*.pl))

EXTRA_CLEAN = results regression.diffs regression.out output_iso tmp_check tmp_check_iso log

PG_CONFIG ?= pg_config

# The server headers are system headers to us: CI's -Wall -Wextra -Werror
# then judges our code, not PostgreSQL's inline functions.
PG_CPPFLAGS = -isystem $(shell $(PG_CONFIG) --includedir-server)

PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

# PGXS tracks no header dependencies (unless the server was configured with
# --enable-depend): every object depends on our headers
$(OBJS): $(wildcard src/*.h)

# the replay matrix runner and the benchmarks (their own rules)
-include src/matrix/matrix.mk
-include bench/bench.mk
