#!/usr/bin/env bash
# The gateway's CPU per acknowledged message and the writer's jobs per commit, measured with
# the gateway on CPU 0 and the load on CPU 1 (so the load never takes the gateway's CPU):
#
#   bench/cpu-per-message.sh [BINARY] [MODE] [CONNECTIONS]
#
# BINARY defaults to target/release/wsr-gateway, MODE to `response` (any `bench --mode`; `e2e`
# adds two consumers fetching batches of 32), CONNECTIONS to 16. A fresh gateway (SQLite,
# durability full, no per-source quotas) is warmed up for 3 s, then loaded for 10 s; the
# gateway's CPU (user + system, from /proc) over those 10 s is divided by the messages acked.
# Unlike `instructions-per-message.sh` it counts the kernel's share (fsync, sockets, thread
# switches) — and moves with whatever else the machine runs: compare two builds by alternating
# runs. Needs two CPUs, taskset, curl and python3.
set -euo pipefail

bin=${1:-target/release/wsr-gateway}
mode=${2:-response}
connections=${3:-16}
source "$(dirname "$0")/fixture.sh"
fixture_needs taskset curl python3
fixture_config cpu
fixture_serve taskset -c 0
load_launcher="taskset -c 1"
fixture_load -d 3 > /dev/null
batches_before=$(fixture_batches)
before=$(fixture_cpu_ticks "$gateway")
fixture_load -d 10 --json > "$dir/bench.json"
after=$(fixture_cpu_ticks "$gateway")
batches_after=$(fixture_batches)
fixture_stop

python3 - "$dir/bench.json" "$before" "$after" "$(getconf CLK_TCK)" "$batches_before" "$batches_after" <<'PY'
import json, sys
bench, before, after, hz = json.load(open(sys.argv[1])), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
(sum0, count0), (sum1, count1) = (map(float, a.split()) for a in sys.argv[5:7])
acked = bench["acked"]
cpu_us = (after - before) * 1e6 / hz / acked
per_commit = (sum1 - sum0) / max(count1 - count0, 1)
print(f"{bench['msgs_per_s']:.0f} msgs/s, gateway CPU {cpu_us:.1f} us/msg, "
      f"{per_commit:.1f} jobs per commit, p50 {bench['p50_ms']:.2f} ms, p99 {bench['p99_ms']:.2f} ms "
      f"({acked} acked)")
PY
echo "gateway log and bench output: $dir"
