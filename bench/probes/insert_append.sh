#!/usr/bin/env bash
# What do appends to a cache's tail cost INSERTs when they go through the GPU service (issue 26)?
#
# Run against a running cluster in service mode with the extension installed (psql and pgbench
# on PATH, PG* variables naming the database):
#
#   bash bench/probes/insert_append.sh [SECONDS] [CLIENTS]  > report.md
#
# Two tables of 100,000 rows (int8, int4, float8), one of them cached; pgbench's clients insert
# one row per transaction into each for SECONDS (default 8), with pg_uvm_share.map_host_tier
# on and off, twice, alternating. An INSERT into the cached table appends its row to the cache's
# tail: two writes (the records, then the stamps that make them rows: src/caches/append.rs).
# With map_host_tier on, under the host provider, the backend writes them through its own
# mapping; off, each write is a request to the GPU service, as it is under the CUDA provider
# (whose host tier backends cannot map: docs/ARCHITECTURE.md, "The host tier in every process").
# Prints a Markdown table: transactions per second, and each cached figure over the uncached
# one of the same pass.
#
# Measured on this project's 2-core VM (host provider, service mode, PostgreSQL 16, 16 clients,
# 6 s each, 2026-12-06; bench/insert-append-report.md): uncached 75-80 K tps; cached with the
# tail mapped 0.84-0.89x; cached through the service 0.20-0.21x (15.5-16.7 K tps).
set -euo pipefail
secs=${1:-8}
clients=${2:-16}
q() { psql -XAtq -v ON_ERROR_STOP=1 -c "$1"; }
PGOPTIONS="-c client_min_messages=warning" q "DROP TABLE IF EXISTS uvm_probe_ins_cached, uvm_probe_ins_plain"
q "CREATE TABLE uvm_probe_ins_cached (a int8, b int4, c float8)"
q "CREATE TABLE uvm_probe_ins_plain (a int8, b int4, c float8)"
q "INSERT INTO uvm_probe_ins_cached SELECT g, g, g FROM generate_series(1, 100000) g"
q "INSERT INTO uvm_probe_ins_plain SELECT g, g, g FROM generate_series(1, 100000) g"
q "SELECT uvm.cache_table('uvm_probe_ins_cached')" >/dev/null
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for t in cached plain; do echo "INSERT INTO uvm_probe_ins_$t VALUES (1, 2, 3.0);" > "$dir/$t.sql"; done
tps() { PGOPTIONS="-c pg_uvm_share.map_host_tier=$2" pgbench -n -c "$clients" -j 2 -T "$secs" -f "$dir/$1.sql" 2>&1 \
    | sed -n 's/^tps = \([0-9]*\).*/\1/p'; }
echo "# INSERT throughput with appends to a cache's tail ($clients clients, ${secs} s each)"
echo
echo "$(q "SELECT version()"); execution $(q "SHOW pg_uvm_share.gpu_execution"); provider $(q "SELECT value FROM uvm.device_info() WHERE property = 'provider'" 2>/dev/null || echo '?'); $(nproc) CPUs"
echo
echo "| pass | map_host_tier | uncached tps | cached tps | cached / uncached |"
echo "|---|---|---|---|---|"
for pass in 1 2; do
    for m in on off; do
        p=$(tps plain "$m")
        c=$(tps cached "$m")
        echo "| $pass | $m | $p | $c | $(awk -v c="$c" -v p="$p" 'BEGIN { printf "%.2f", c / p }') |"
    done
done
echo
echo "Cache after the run: $(q "SELECT state || ', ' || appended_rows || ' rows appended' FROM uvm.caches WHERE relation = 'uvm_probe_ins_cached'::regclass")"
q "SELECT uvm.cache_drop('uvm_probe_ins_cached')" >/dev/null
q "DROP TABLE uvm_probe_ins_cached, uvm_probe_ins_plain"
