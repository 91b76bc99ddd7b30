#!/usr/bin/env bash
# The gateway's user-space instructions per acknowledged message, counted by valgrind's
# callgrind: unlike CPU time, the count repeats within about 1% for the same build whatever
# else the machine is doing, so two builds can be compared by one run each (kernel time —
# sockets, fsync, page copies — is not in it; `wsr-compare --pin` measures that).
#
#   bench/instructions-per-message.sh [BINARY] [MODE]
#
# BINARY defaults to target/release/wsr-gateway, MODE to `response` (any `bench --mode`;
# `e2e` adds two consumers fetching batches of 32). A fresh gateway (SQLite, durability
# full, no per-source quotas) runs under callgrind; `wsr-gateway bench` warms it up for 4 s,
# the counters are zeroed, 15 s of load (16 workers) are counted, and the total over the
# acknowledged messages is printed with the profile's path, for `callgrind_annotate`.
set -euo pipefail

bin=${1:-target/release/wsr-gateway}
mode=${2:-response}
for tool in valgrind callgrind_control curl python3; do
    command -v "$tool" >/dev/null || { echo "needs $tool" >&2; exit 2; }
done
[ -x "$bin" ] || { echo "no gateway binary at $bin (cargo build --release)" >&2; exit 2; }

dir=$(mktemp -d /tmp/wsr-instructions-XXXXXX)
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
token=instructions-consumer-token-0123456789
cat > "$dir/gateway.toml" <<EOF
listen = "127.0.0.1:$port"
database = "$dir/gateway.db"
durability = "full"
max_stored_bytes_per_source = 0
max_messages_per_second_per_source = 0

[[tokens]]
token = "$token"
principal = "bench"
scopes = ["consume"]
EOF

valgrind --tool=callgrind --callgrind-out-file="$dir/callgrind.out" --dump-instr=no \
    "$bin" serve --config "$dir/gateway.toml" > "$dir/gateway.log" 2>&1 &
gateway=$!
trap 'kill $gateway 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do
    curl -sf "http://127.0.0.1:$port/healthz" > /dev/null && break
    kill -0 $gateway 2>/dev/null || { cat "$dir/gateway.log" >&2; exit 1; }
    sleep 1
done

load() {
    WSR_BENCH_TOKEN=$token "$bin" bench --url "http://127.0.0.1:$port/wsr/default" \
        -c 16 --mode "$mode" --consumers 2 --batch 32 "$@"
}
load -d 4 > /dev/null
callgrind_control -z $gateway > /dev/null 2>&1
load -d 15 --json > "$dir/bench.json"
callgrind_control -d $gateway > /dev/null 2>&1
kill $gateway
wait $gateway 2>/dev/null || true
trap - EXIT

python3 - "$dir" <<'EOF'
import glob, json, sys
d = sys.argv[1]
acked = json.load(open(f"{d}/bench.json"))["acked"]
dumps = sorted(glob.glob(f"{d}/callgrind.out.*"), key=lambda p: int(p.rsplit(".", 1)[1]))
total = next(int(l.split()[1]) for l in open(dumps[0]) if l.startswith(("summary:", "totals:")))
print(f"{total / acked:,.0f} instructions per acked message ({total:,} over {acked} messages)")
print(f"profile: {dumps[0]}")
EOF
