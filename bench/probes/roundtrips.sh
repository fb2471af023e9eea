#!/usr/bin/env bash
# Round trips of empty requests through the GPU service (uvm.bench_roundtrip, each request timed
# in its backend) from several sessions at once, as the GPU suite's "round trips" step does for
# 1 and 32 sessions, on any cluster (the host provider too: a Ping runs on the service's main
# thread and touches no GPU). Issue 25, point 5; see Channel::spin_for_reply.
#
#   bench/probes/roundtrips.sh [REQUESTS] [SESSIONS...]      (default: 2000; 1 2 4 8 16 32)
#
# The cluster is named by the PG* environment (PGHOST, PGPORT, PGDATABASE, PGUSER) and must run
# with pg_uvm_share.gpu_execution = service. Every session warms up (100 requests), then all
# start at one moment (pg_sleep_until) and send REQUESTS each. One line per session count: the
# largest of the sessions' medians (what the GPU suite judges), the median of their medians,
# the largest and the median of their p99s, in µs. LABEL (environment) names the build measured
# in the header (default: this checkout's commit).
set -euo pipefail
req=${1:-2000}
shift || true
if [ "$#" -gt 0 ]; then counts=("$@"); else counts=(1 2 4 8 16 32); fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mode=$(psql -XAtq -c "SELECT value FROM uvm.device_info() WHERE property = 'execution'")
echo "# $(date -u +%FT%TZ) ${LABEL:-$(git rev-parse --short HEAD 2>/dev/null || echo '?')}, $(nproc) CPUs, execution $mode, $req requests a session"
printf '%8s %12s %12s %10s %10s\n' sessions max_median med_median max_p99 med_p99
for n in "${counts[@]}"; do
    at=$(psql -XAtq -c "SELECT clock_timestamp() + interval '2 s' + $n * interval '50 ms'")
    for k in $(seq "$n"); do
        psql -XAtq -F ' ' -c "SELECT uvm.bench_roundtrip(100)" -c "SELECT pg_sleep_until('$at')" \
            -c "SELECT median_us, p99_us FROM uvm.bench_roundtrip($req)" | tail -1 > "$tmp/$k" &
    done
    wait
    cat "$tmp"/* | python3 -c '
import statistics, sys
rows = [tuple(map(float, l.split())) for l in sys.stdin if l.strip()]
meds, p99s = [r[0] for r in rows], [r[1] for r in rows]
print(f"{len(rows):8d} {max(meds):12.1f} {statistics.median(meds):12.1f} {max(p99s):10.1f} {statistics.median(p99s):10.1f}")'
    rm -f "$tmp"/*
done
