# src/matrix/matrix.mk: the replay matrix runner (included by the Makefile)
#
#   make idempotency-matrix      build the runner (a libpq client, not part
#                                of the extension); `make` builds it too
#   make matrix                  run it against PGHOST/PGPORT/... (or
#                                MATRIX_ARGS='--dsn ...'); see README
#
# It is compiled with the server's CFLAGS, so CI's PG_CFLAGS
# (-Wall -Wextra -Werror) apply to it as to the extension.

MATRIX_PROGRAM = idempotency-matrix
MATRIX_SRCS    = $(sort $(wildcard src/matrix/*.c))
MATRIX_HDRS    = $(wildcard src/matrix/*.h)
MATRIX_INCDIR  = $(shell $(PG_CONFIG) --includedir)
# the runner's --version is the project's: idempotency.control's default_version
MATRIX_VERSION := $(shell sed -n "s/^default_version *= *'\(.*\)'/\1/p" idempotency.control)
MATRIX_CPPFLAGS = -I$(MATRIX_INCDIR) -DMATRIX_VERSION='"$(MATRIX_VERSION)"'
MATRIX_LIBS    = -L$(shell $(PG_CONFIG) --libdir) -lpq
MATRIX_ARGS   ?=

all: $(MATRIX_PROGRAM)

# a missing libpq-dev is named, not left to the compiler's "libpq-fe.h: No such file"
$(MATRIX_PROGRAM): $(MATRIX_SRCS) $(MATRIX_HDRS) src/matrix/matrix.mk idempotency.control
	@test -f '$(MATRIX_INCDIR)/libpq-fe.h' || { \
		echo "$(MATRIX_PROGRAM): error: the libpq headers are not installed ($(MATRIX_INCDIR)/libpq-fe.h not found): install libpq-dev (Debian; scripts/deps does)" >&2; \
		exit 1; }
	$(CC) $(CFLAGS) $(MATRIX_CPPFLAGS) -o $@ $(MATRIX_SRCS) $(LDFLAGS) $(MATRIX_LIBS)

.PHONY: matrix
matrix: $(MATRIX_PROGRAM)
	./$(MATRIX_PROGRAM) $(MATRIX_ARGS)

EXTRA_CLEAN += $(MATRIX_PROGRAM)
