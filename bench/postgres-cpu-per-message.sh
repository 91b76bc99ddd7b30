#!/usr/bin/env bash
# The CPU per acknowledged message of a gateway on PostgreSQL, split between the gateway and
# the PostgreSQL backends serving its database, with both on CPU 0 and the load on CPU 1:
#
#   bench/postgres-cpu-per-message.sh [BINARY] [CONNECTIONS] [ADMIN_URL]
#
# BINARY defaults to target/release/wsr-gateway, CONNECTIONS to 64, ADMIN_URL to
# postgres://postgres@127.0.0.1:5432/test (a local server: its processes are pinned, and their
# affinity restored at the end). A fresh database (made and dropped here) and gateway
# (durability full, no per-source quotas) are warmed up for 3 s with the durable `response`
# load, then loaded for 10 s. The split is what a profile cannot tell on its own: when this
# machine's speed moves between runs, both shares move with it, so compare two builds by
# their backend/gateway ratio as well as by msgs/s, alternating runs. PostgreSQL's shared
# processes (WAL writer, checkpointer) are not counted, as in `wsr-compare`. Needs two CPUs,
# taskset, psql, curl and python3.
set -euo pipefail

bin=${1:-target/release/wsr-gateway}
connections=${2:-64}
admin=${3:-postgres://postgres@127.0.0.1:5432/test}
mode=response
source "$(dirname "$0")/fixture.sh"
fixture_needs taskset psql curl python3

database=wsr_cpu_$$
psql -q "$admin" -c "CREATE DATABASE $database" > /dev/null
# The admin URL with its database replaced.
url=$(python3 - "$admin" "$database" <<'PY'
import sys, urllib.parse as u
admin = u.urlsplit(sys.argv[1])
print(u.urlunsplit(admin._replace(path="/" + sys.argv[2])))
PY
)
declare -A affinity
for pid in $(pgrep -x postgres); do
    affinity[$pid]=$(taskset -pc "$pid" | awk '{print $NF}')
    taskset -pc 0 "$pid" > /dev/null
done
cleanup() {
    for pid in "${!affinity[@]}"; do
        taskset -pc "${affinity[$pid]}" "$pid" > /dev/null 2>&1 || true
    done
    psql -q "$admin" -c "DROP DATABASE IF EXISTS $database WITH (FORCE)" > /dev/null || true
}
fixture_config postgres-cpu "$url"
fixture_serve taskset -c 0
trap 'kill $gateway 2>/dev/null || true; cleanup' EXIT
load_launcher="taskset -c 1"

backend_ticks() {
    local sum=0
    for pid in $(psql -Atq "$admin" -c \
            "SELECT pid FROM pg_stat_activity WHERE datname = '$database'"); do
        sum=$((sum + $(fixture_cpu_ticks "$pid")))
    done
    echo $sum
}
fixture_load -d 3 > /dev/null
batches_before=$(fixture_batches)
gateway_before=$(fixture_cpu_ticks "$gateway")
backends_before=$(backend_ticks)
fixture_load -d 10 --json > "$dir/bench.json"
gateway_after=$(fixture_cpu_ticks "$gateway")
backends_after=$(backend_ticks)
batches_after=$(fixture_batches)
fixture_stop
trap cleanup EXIT

python3 - "$dir/bench.json" "$(getconf CLK_TCK)" "$gateway_before" "$gateway_after" \
    "$backends_before" "$backends_after" "$batches_before" "$batches_after" <<'PY'
import json, sys
bench, hz = json.load(open(sys.argv[1])), int(sys.argv[2])
g0, g1, b0, b1 = map(int, sys.argv[3:7])
(sum0, count0), (sum1, count1) = (map(float, a.split()) for a in sys.argv[7:9])
acked = bench["acked"]
gateway_us = (g1 - g0) * 1e6 / hz / acked
backends_us = (b1 - b0) * 1e6 / hz / acked
per_commit = (sum1 - sum0) / max(count1 - count0, 1)
print(f"{bench['msgs_per_s']:.0f} msgs/s, p50 {bench['p50_ms']:.2f} ms, "
      f"p99 {bench['p99_ms']:.2f} ms; "
      f"CPU per message: gateway {gateway_us:.1f} us + backends {backends_us:.1f} us "
      f"= {gateway_us + backends_us:.1f} us (backends/gateway {backends_us / gateway_us:.2f}); "
      f"{per_commit:.1f} jobs per commit ({acked} acked)")
PY
echo "gateway log and bench output: $dir"
