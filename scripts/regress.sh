#!/usr/bin/env bash
# Runs the pg_regress suites of tests/regress, each against a throwaway cluster of its own:
#
#   tests/regress/schedule           the SQL surface, errors, parallel workers (default settings),
#                                    then again with pg_uvm_share.gpu_execution = service (every
#                                    segment operation through the GPU service, on the CPU here)
#   tests/capi_consumer              the C API through the consumer extension that `make
#                                    capi-consumer` installs, after the schedule in the same
#                                    clusters: uvm_capi in both modes, uvm_capi_noload without
#                                    the preload
#   tests/regress/schedule_limits    capacity errors, with tiny pg_uvm_share.max_* settings
#   tests/regress/schedule_gpus      several GPUs, simulated by the host provider (two memfd
#                                    "GPUs" with an 8 MB budget each, a host pool of two 2 MB
#                                    pieces), in service mode
#   tests/regress/schedule_noload    CREATE EXTENSION without shared_preload_libraries
#   tests/regress/schedule_nocuda    provider = cuda without a CUDA driver (only where there is none)
#   tests/regress/schedule_strom     the plan node's battery with a stand-in for PG-Strom preloaded
#                                    (uvm_fake_strom, tests/fake_strom, which `make fake-strom`
#                                    installs: it registers a custom scan and an extensible node
#                                    named "GpuJoin", as PG-Strom 6.1 does, issue 22): strom_first
#                                    loads it before pg_uvm_share, in process mode; strom_last after
#                                    it, in service mode
#
# Usage: regress.sh BASEDIR BASEPORT   (clusters in BASEDIR-<suite>, ports BASEPORT .. BASEPORT+3, +7 and +9;
#                                      the strom suites reuse BASEPORT once the main suite is done)
set -euo pipefail
BASE=${1:-/tmp/uvm-regress}
PORT=${2:-54331}
PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
PG_BIN=${PG_BIN:-$($PG_CONFIG --bindir)}
PG_REGRESS=${PG_REGRESS:-$($PG_CONFIG --pkglibdir)/pgxs/src/test/regress/pg_regress}
cd "$(dirname "$0")/.."
[ -x "$PG_REGRESS" ] || { echo "no pg_regress at $PG_REGRESS (scripts/install-prereqs.sh installs it)" >&2; exit 1; }
# pg_regress needs libpq; a relocatable build's copy of it lies in its libdir (its pg_regress
# carries no usable RUNPATH), Debian's in the system's.
PG_LIBDIR=$($PG_CONFIG --libdir)
export LD_LIBRARY_PATH=$PG_LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# The tests start psql themselves (uvm_capi: a second session): this version's psql.
export PATH=$PG_BIN:$PATH
# The C API's tests (tests/capi_consumer) that a suite runs after its schedule.
capi_tests() {
  case "$1" in
    main | service) echo uvm_capi ;;
    noload) echo uvm_capi_noload ;;
  esac
}

failed=()
run_suite() { # name port schedule [env assignments...]
  local name=$1 port=$2 schedule=$3; shift 3
  local dir=$BASE-$name
  local tests
  tests=$(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' "tests/regress/$schedule" | xargs)
  echo "== regress suite '$name': $tests"
  # A cluster that does not start (a preloaded library's FATAL: cluster.sh prints the end of the
  # log) fails this suite; the next suites still run.
  if ! env "$@" scripts/cluster.sh start "$dir" "$port" >/dev/null; then
    echo "== regress suite '$name': the cluster in $dir did not start"
    failed+=("$name")
    return 0
  fi
  local capi ok=1
  capi=$(capi_tests "$name")
  (
    eval "$(scripts/cluster.sh env "$dir")"
    "$PG_BIN/createdb" uvm_regress
    mkdir -p "$dir/out"
    rc=0
    "$PG_REGRESS" --use-existing --bindir="$PG_BIN" --host="$PGHOST" --port="$PGPORT" --user="$PGUSER" \
      --inputdir=tests/regress --outputdir="$dir/out" --dbname=uvm_regress $tests || rc=1
    if [ -n "$capi" ]; then
      echo "== regress suite '$name': $capi (tests/capi_consumer)"
      mkdir -p "$dir/out-capi"
      "$PG_REGRESS" --use-existing --bindir="$PG_BIN" --host="$PGHOST" --port="$PGPORT" --user="$PGUSER" \
        --inputdir=tests/capi_consumer --outputdir="$dir/out-capi" --dbname=uvm_regress $capi || rc=1
    fi
    exit $rc
  ) || ok=0
  if [ $ok = 0 ]; then
    for out in "$dir/out" "$dir/out-capi"; do
      [ -s "$out/regression.diffs" ] || continue
      echo "===== $out/regression.diffs ====="
      cat "$out/regression.diffs"
    done
    echo "===== last lines of the server log ($dir/log) ====="
    tail -n 30 "$dir/log" || true
    failed+=("$name")
  fi
  scripts/cluster.sh stop "$dir" >/dev/null || true
}

run_suite main "$PORT" schedule
# The same expected output in service mode: the SQL surface does not depend on where it runs.
run_suite service "$((PORT + 7))" schedule UVM_EXTRA_CONF='pg_uvm_share.gpu_execution = service'
run_suite limits "$((PORT + 1))" schedule_limits \
  UVM_EXTRA_CONF=$'pg_uvm_share.max_segments = 3\npg_uvm_share.max_chunks = 5\npg_uvm_share.max_attachments = 16'
run_suite gpus "$((PORT + 9))" schedule_gpus \
  UVM_EXTRA_CONF=$'pg_uvm_share.simulated_devices = 2\npg_uvm_share.device_memory_limit = 8MB\npg_uvm_share.gpu_execution = service\npg_uvm_share.host_pool_size = 4MB\npg_uvm_share.host_pool_piece = 2MB'
run_suite noload "$((PORT + 2))" schedule_noload UVM_NO_PRELOAD=1
if ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 '; then
  echo "== regress suite 'nocuda' not run: this machine has a CUDA driver (the GPU suite covers it)"
else
  run_suite nocuda "$((PORT + 3))" schedule_nocuda UVM_EXTRA_CONF='pg_uvm_share.provider = cuda'
fi
# pg_uvm_share next to PG-Strom's names (the stand-in, tests/fake_strom), loaded before and after
# it: both clusters must start, and the plan node's battery gives the same expected output, in
# each execution mode once. Every other port of the block of ten is another target's (integration
# +4, demo +5, bench +6, integration-service +8, which may run at the same time), so these two
# reuse BASEPORT, one after the other: the suites run in turn and run_suite stops each cluster as
# its suite ends; the stops below make sure of it (a no-op when the cluster is down already).
scripts/cluster.sh stop "$BASE-main" >/dev/null || true
run_suite strom_first "$PORT" schedule_strom UVM_PRELOAD='uvm_fake_strom, pg_uvm_share'
scripts/cluster.sh stop "$BASE-strom_first" >/dev/null || true
run_suite strom_last "$PORT" schedule_strom UVM_PRELOAD='pg_uvm_share, uvm_fake_strom' \
  UVM_EXTRA_CONF='pg_uvm_share.gpu_execution = service'

if [ ${#failed[@]} -gt 0 ]; then
  echo "regress: FAILED suites: ${failed[*]}"
  exit 1
fi
echo "regress: all suites passed"
