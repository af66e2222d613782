# idempotency: PGXS build
#
#   make && make install          build and install the extension
#   make installcheck             regression, isolation and TAP tests against
#                                 a running server (PGHOST/PGPORT)
#   make dist                     the release tarball idempotency-VERSION.tar.gz
#                                 (git archive of HEAD; PGXN's layout)
#
# This builds the extension only: no client, and no libpq headers needed.
# The replay matrix runner, a libpq client, is its own PGXS program in
# matrix/: make -C matrix (see matrix/Makefile). No target here builds it.
#
# Out-of-tree (VPATH) builds work, as Debian's pg_buildext does them, one
# build directory per PostgreSQL major:
#   mkdir build-15 && make -C build-15 -f $PWD/Makefile VPATH=$PWD PG_CONFIG=...
# so every file list below is found under $(ext_srcdir), the source directory,
# and written relative to it.
#
# The version lives in one place, idempotency.control (default_version).

# the source directory: VPATH if given (pg_buildext passes it), else this
# Makefile's directory ("." in-tree). PGXS's own $(srcdir) is only set once
# $(PGXS) is included, after these lists.
ifdef VPATH
ext_srcdir := $(patsubst %/,%,$(VPATH))
else
ext_srcdir := $(patsubst %/,%,$(dir $(lastword $(MAKEFILE_LIST))))
endif

EXTENSION  = idempotency
EXTVERSION = $(shell sed -n "s/^default_version[[:space:]]*=[[:space:]]*'\(.*\)'/\1/p" $(ext_srcdir)/$(EXTENSION).control)

# relative to $(ext_srcdir): "src/admin.c" -> "src/admin.o" (VPATH finds the source)
src_files = $(patsubst $(ext_srcdir)/%,%,$(sort $(wildcard $(addprefix $(ext_srcdir)/,$(1)))))

MODULE_big = idempotency
OBJS       = $(patsubst %.c,%.o,$(call src_files,src/*.c))
# PGXS installs DATA from $(srcdir)
DATA       = $(call src_files,$(EXTENSION)--*.sql)

# pg_regress: one file per feature under sql/ and expected/
REGRESS      = $(patsubst sql/%.sql,%,$(call src_files,sql/*.sql))
REGRESS_OPTS = --inputdir=$(ext_srcdir)

# isolation specs (races) under test/isolation
ISOLATION      = $(patsubst test/isolation/specs/%.spec,%,$(call src_files,test/isolation/specs/*.spec))
ISOLATION_OPTS = --inputdir=$(patsubst ./%,%,$(ext_srcdir)/test/isolation) --load-extension=$(EXTENSION)

# TAP tests (crash, restart, load) under test/t; prove runs in $(srcdir)
TAP_TESTS   = 1
PROVE_TESTS = $(call src_files,test/t/*.pl)

EXTRA_CLEAN = results regression.diffs regression.out output_iso tmp_check tmp_check_iso log test/unit/test_protocol

PG_CONFIG ?= pg_config

# The server headers are system headers to us: CI's -Wall -Wextra -Werror
# then judges our code, not PostgreSQL's inline functions.
PG_CPPFLAGS = -isystem $(shell $(PG_CONFIG) --includedir-server)

PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

# PGXS tracks no header dependencies (unless the server was configured with
# --enable-depend): every object depends on our headers
$(OBJS): $(wildcard $(ext_srcdir)/src/*.h)

# in-tree: the build directory is the source directory
in_tree := $(if $(filter $(abspath $(ext_srcdir)),$(CURDIR)),yes)

ifneq ($(in_tree),yes)
# a VPATH build writes src/*.o (and src/*.bc) under the build directory,
# which PGXS's compile rules do not create
$(OBJS) $(OBJS:.o=.bc): | vpath-objdir
.PHONY: vpath-objdir
vpath-objdir:
	@mkdir -p src
endif

# the release tarball: what git has committed at HEAD (uncommitted changes
# are not in it), under idempotency-VERSION/ as PGXN expects. META.json's
# versions must be the control file's default_version as a semantic
# version (PGXN's rule): 0.2 -> 0.2.0
.PHONY: dist
dist:
	@want=$$(echo '$(EXTVERSION)' | sed 's/^[0-9]*\.[0-9]*$$/&.0/'); \
	for v in $$(sed -n '/"meta-spec"/,/}/d; s/^ *"version" *: *"\([^"]*\)".*/\1/p' $(ext_srcdir)/META.json); do \
		if [ "$$v" != "$$want" ]; then \
			echo "dist: error: META.json has version '$$v'; idempotency.control's default_version '$(EXTVERSION)' makes it '$$want'" >&2; exit 1; fi; done
	@git -C $(ext_srcdir) diff --quiet HEAD -- || echo "dist: warning: uncommitted changes are not in the tarball (git archive HEAD)" >&2
	git -C $(ext_srcdir) archive --format=tar.gz --prefix=$(EXTENSION)-$(EXTVERSION)/ -o $(CURDIR)/$(EXTENSION)-$(EXTVERSION).tar.gz HEAD
	@echo "dist: $(EXTENSION)-$(EXTVERSION).tar.gz"

# the benchmarks (their own rules, written for in-tree builds; a VPATH
# build, e.g. pg_buildext's per-major build-N/, does not include them)
ifeq ($(in_tree),yes)
-include bench/bench.mk
endif

# No two files of src/ call each other, not even through others: the
# edges are the symbols each object uses that another defines (nm), and
# tsort fails on a loop (scripts/check-layout.sh; hook 49 runs it).
.PHONY: check-layout
check-layout: $(OBJS)
	$(ext_srcdir)/scripts/check-layout.sh src $(notdir $(OBJS))

# The protocol's decisions (src/protocol.c, plain C) unit-tested without a
# server: every policy x record state x call combination. Built with the
# system compiler alone, no PostgreSQL header; UNIT_BIN puts the binary
# elsewhere (scripts/test.d's hook builds it in a temporary directory).
UNIT_BIN    ?= test/unit/test_protocol
UNIT_CFLAGS ?= -std=c99 -pedantic -Wall -Wextra -Werror -O2
.PHONY: unit
unit: $(UNIT_BIN)
	$(UNIT_BIN)

$(UNIT_BIN): $(ext_srcdir)/test/unit/test_protocol.c $(ext_srcdir)/src/protocol.c $(ext_srcdir)/src/protocol.h
	@mkdir -p $(dir $@)
	$(CC) $(UNIT_CFLAGS) -I$(ext_srcdir)/src -o $@ $(ext_srcdir)/test/unit/test_protocol.c $(ext_srcdir)/src/protocol.c
