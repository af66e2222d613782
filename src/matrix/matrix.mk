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
MATRIX_CPPFLAGS = -I$(shell $(PG_CONFIG) --includedir)
MATRIX_LIBS    = -L$(shell $(PG_CONFIG) --libdir) -lpq
MATRIX_ARGS   ?=

all: $(MATRIX_PROGRAM)

$(MATRIX_PROGRAM): $(MATRIX_SRCS) $(MATRIX_HDRS) src/matrix/matrix.mk
	$(CC) $(CFLAGS) $(MATRIX_CPPFLAGS) -o $@ $(MATRIX_SRCS) $(LDFLAGS) $(MATRIX_LIBS)

.PHONY: matrix
matrix: $(MATRIX_PROGRAM)
	./$(MATRIX_PROGRAM) $(MATRIX_ARGS)

EXTRA_CLEAN += $(MATRIX_PROGRAM)
