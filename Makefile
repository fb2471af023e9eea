# pg_uvm_share: build, test, demo and benchmark.
#
#   make test         prereqs, lint, unit, pgtest, install, regress, integration (in that order)
#   make run          install, then run sql/demo.sql against a throwaway cluster
#   make bench        install, then the segment benchmark -> bench/segment-report.md
#   make install      build (release) and install into PostgreSQL 15
#   make lint | unit | pgtest | regress | integration   one test stage each
#   make regress-accept   copy the last regress results over tests/regress/expected
#   make gpu-suite-pack   bundle for the GPU machine -> .carry/gpu-bundle (scripts/gpu-suite)
#   make clean
#
# As root, throwaway clusters run as the OS user `postgres`; as a normal user they run as that
# user and the install step uses sudo. Clusters live under /tmp (scripts/cluster.sh).

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

PG_CONFIG ?= /usr/lib/postgresql/15/bin/pg_config
PG_BIN := $(shell $(PG_CONFIG) --bindir 2>/dev/null || echo /usr/lib/postgresql/15/bin)
PG_PKGLIBDIR := $(shell $(PG_CONFIG) --pkglibdir 2>/dev/null || echo /usr/lib/postgresql/15/lib)
PG_REGRESS ?= $(PG_PKGLIBDIR)/pgxs/src/test/regress/pg_regress
CARGO ?= cargo
CLUSTER := scripts/cluster.sh
export PG_BIN
export PG_CONFIG

# cargo from rustup, when make is started without ~/.cargo/env sourced
export PATH := $(HOME)/.cargo/bin:$(PATH)

IS_ROOT := $(shell [ "$$(id -u)" = 0 ] && echo 1)
ME := $(shell id -un)

# Throwaway clusters: directory and port of each.
REGRESS_DIR ?= /tmp/uvm-regress
REGRESS_PORT ?= 54341
IT_DIR ?= /tmp/uvm-it
IT_PORT ?= 54332
DEMO_DIR ?= /tmp/uvm-demo
DEMO_PORT ?= 54333
BENCH_DIR ?= /tmp/uvm-bench
BENCH_PORT ?= 54334
PGRX_TEST_DIR ?= /tmp/uvm-pgrx-test

BENCH_REPORT ?= bench/segment-report.md
TEST_STAGES := prereqs lint unit pgtest install regress integration

PSQL := $(PG_BIN)/psql -X -v ON_ERROR_STOP=1

.PHONY: help prereqs install lint unit pgtest regress regress-accept integration test run bench gpu-suite-pack clean

help:
	@sed -n '2,11p' Makefile | sed 's/^# \{0,1\}//'

prereqs:
	scripts/install-prereqs.sh

# cargo pgrx install writes the current version's script and copies the update scripts
# (sql/pg_uvm_share--<from>--<to>.sql), but not the frozen install scripts of earlier versions
# (sql/pg_uvm_share--<version>.sql), which CREATE EXTENSION ... VERSION '<old>' needs (the
# upgrade test, tests/regress/sql/uvm_upgrade.sql): those are copied here.
install: prereqs
	$(CARGO) pgrx install --release --pg-config $(PG_CONFIG) $(if $(IS_ROOT),,--sudo)
	@ext="$$($(PG_CONFIG) --sharedir)/extension"; \
	current="pg_uvm_share--$$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1).sql"; \
	for f in sql/pg_uvm_share--*.sql; do \
	  b=$$(basename "$$f"); \
	  case "$$b" in pg_uvm_share--*--*.sql|"$$current") continue ;; esac; \
	  echo "installing frozen install script $$b into $$ext"; \
	  $(if $(IS_ROOT),,sudo) install -m 644 "$$f" "$$ext/$$b"; \
	done

# Formatting (rustfmt.toml) and clippy with warnings denied, over every crate, target and
# feature the suites build (the pgrx tests and the GPU suite's programs included). The lints
# that hold the unsafe code to its SAFETY comments are set in Cargo.toml ([workspace.lints]).
lint:
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets --features pg_uvm_share/pg_test,pg_uvm_share_tests/gpu -- -D warnings

# Plain-Rust unit tests of the extension crate (the workspace root package only).
unit:
	$(CARGO) test -p pg_uvm_share --lib

# #[pg_test]s in a temporary cluster that cargo-pgrx creates (it installs a test build of the
# extension first). As root the cluster must run as `postgres`, with its data directory under
# a directory that user can write. As a normal user: plain, unless PostgreSQL's lib directory is
# not writable (Debian packages), then as yourself through sudo so the install can use sudo.
pgtest:
ifeq ($(IS_ROOT),1)
	rm -rf $(PGRX_TEST_DIR)
	mkdir -p $(PGRX_TEST_DIR)
	chown postgres: $(PGRX_TEST_DIR)
	$(CARGO) pgrx test pg15 --runas postgres --pgdata $(PGRX_TEST_DIR)/data
else
	if [ -w "$(PG_PKGLIBDIR)" ]; then \
	  $(CARGO) pgrx test pg15; \
	else \
	  rm -rf $(PGRX_TEST_DIR)-$(ME) && mkdir -p $(PGRX_TEST_DIR)-$(ME) && \
	  $(CARGO) pgrx test pg15 --runas $(ME) --pgdata $(PGRX_TEST_DIR)-$(ME)/data; \
	fi
endif

# pg_regress suites, each against a throwaway cluster of its own (scripts/regress.sh): the
# SQL surface (tests/regress/schedule), capacity limits, and loading without the preload.
regress:
	scripts/regress.sh $(REGRESS_DIR) $(REGRESS_PORT)

# After reviewing a regress run's diffs: take its results as the expected output.
regress-accept:
	@ls $(REGRESS_DIR)-*/out/results/*.out >/dev/null 2>&1 || { echo "no results in $(REGRESS_DIR)-*/out/results: run make regress first" >&2; exit 1; }
	cp -v $(REGRESS_DIR)-*/out/results/*.out tests/regress/expected/

# Integration tests (tests/integration) against a throwaway cluster with the extension created.
# One test at a time per binary; binaries run in name order, the crash test (zz_crash) last.
integration:
	$(CARGO) test -p pg_uvm_share_tests --no-run
	@trap '$(CLUSTER) stop $(IT_DIR)' EXIT; \
	$(CLUSTER) start $(IT_DIR) $(IT_PORT); \
	eval "$$($(CLUSTER) env $(IT_DIR))"; \
	$(PSQL) -q -d postgres -c 'CREATE EXTENSION pg_uvm_share'; \
	if ! $(CARGO) test -p pg_uvm_share_tests --no-fail-fast -- --test-threads=1; then \
	  echo "===== last lines of the server log ($(IT_DIR)/log) ====="; \
	  tail -n 40 $(IT_DIR)/log || true; \
	  exit 1; \
	fi

test:
	@start=$$(date +%s); \
	for stage in $(TEST_STAGES); do \
	  echo "===== make test: $$stage ====="; \
	  if ! $(MAKE) --no-print-directory $$stage; then \
	    echo "make test: FAILED at stage '$$stage' ($$(( $$(date +%s) - start )) s)"; \
	    exit 1; \
	  fi; \
	done; \
	echo "make test: PASSED: $(TEST_STAGES) ($$(( $$(date +%s) - start )) s)"

run: prereqs install
	@trap '$(CLUSTER) stop $(DEMO_DIR)' EXIT; \
	$(CLUSTER) start $(DEMO_DIR) $(DEMO_PORT); \
	eval "$$($(CLUSTER) env $(DEMO_DIR))"; \
	$(PSQL) -d postgres -f sql/demo.sql

bench: prereqs install
	$(CARGO) build --release -p pg_uvm_share_tests --bin uvm_bench
	@trap '$(CLUSTER) stop $(BENCH_DIR)' EXIT; \
	$(CLUSTER) start $(BENCH_DIR) $(BENCH_PORT); \
	eval "$$($(CLUSTER) env $(BENCH_DIR))"; \
	$(PSQL) -q -d postgres -c 'CREATE EXTENSION pg_uvm_share'; \
	$(CARGO) run --release -p pg_uvm_share_tests --bin uvm_bench -- $(BENCH_REPORT)

# The GPU suite's bundle: release extension, GPU test and bench programs, Debian's PostgreSQL 15
# packages. On the GPU machine, carry .carry/gpu-bundle and run `scripts/gpu-suite run` (report: $$OUT).
gpu-suite-pack:
	scripts/gpu-suite pack

clean:
	for d in $(REGRESS_DIR)-main $(REGRESS_DIR)-limits $(REGRESS_DIR)-noload $(REGRESS_DIR)-nocuda $(IT_DIR) $(DEMO_DIR) $(BENCH_DIR); do $(CLUSTER) stop $$d || true; rm -rf $$d; done
	rm -rf $(PGRX_TEST_DIR) $(PGRX_TEST_DIR)-$(ME) tests/regress/results tests/regress/regression.diffs tests/regress/regression.out
	$(CARGO) clean
