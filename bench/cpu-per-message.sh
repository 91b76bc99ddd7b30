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
for tool in taskset curl python3; do
    command -v "$tool" >/dev/null || { echo "needs $tool" >&2; exit 2; }
done
[ -x "$bin" ] || { echo "no gateway binary at $bin (cargo build --release)" >&2; exit 2; }

dir=$(mktemp -d /tmp/wsr-cpu-XXXXXX)
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
token=cpu-per-message-consumer-token-0123456789
cat > "$dir/gateway.toml" <<TOML
listen = "127.0.0.1:$port"
database = "$dir/gateway.db"
durability = "full"
max_stored_bytes_per_source = 0
max_messages_per_second_per_source = 0

[[tokens]]
token = "$token"
principal = "bench"
scopes = ["consume"]
TOML

taskset -c 0 "$bin" serve --config "$dir/gateway.toml" > "$dir/gateway.log" 2>&1 &
gateway=$!
trap 'kill $gateway 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do
    curl -sf "http://127.0.0.1:$port/healthz" > /dev/null && break
    kill -0 $gateway 2>/dev/null || { cat "$dir/gateway.log" >&2; exit 1; }
    sleep 0.2
done

load() {
    WSR_BENCH_TOKEN=$token taskset -c 1 "$bin" bench --url "http://127.0.0.1:$port/wsr/default" \
        -c "$connections" --mode "$mode" --consumers 2 --batch 32 "$@"
}
cpu_ticks() { awk '{print $14 + $15}' "/proc/$gateway/stat"; }
load -d 3 > /dev/null
batches_before=$(curl -s "http://127.0.0.1:$port/metrics" | grep -E '^wsr_writer_batch_size_(sum|count)' | awk '{print $2}' | paste -sd' ')
before=$(cpu_ticks)
load -d 10 --json > "$dir/bench.json"
after=$(cpu_ticks)
batches_after=$(curl -s "http://127.0.0.1:$port/metrics" | grep -E '^wsr_writer_batch_size_(sum|count)' | awk '{print $2}' | paste -sd' ')
kill $gateway
wait $gateway 2>/dev/null || true
trap - EXIT

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
