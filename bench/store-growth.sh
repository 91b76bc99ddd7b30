#!/usr/bin/env bash
# Issue 35's "1 M-message store within 10 % of empty": durable `response` msgs/s on a fresh
# store and on one prefilled with 100 000 groups of 10 delivered messages (`wsr-gateway
# prefill`), each measured as `cpu-per-message.sh` does (gateway on CPU 0, `wsr-gateway bench`
# from CPU 1, 3 s warm-up, 10 s counted), the two alternated twice.
#
#   bench/store-growth.sh [BINARY] [CONNECTIONS]
#
# BINARY defaults to target/release/wsr-gateway, CONNECTIONS to 64. Needs two CPUs, taskset,
# curl and python3, and about 2 GB of disk under /tmp.
set -euo pipefail

bin=${1:-target/release/wsr-gateway}
connections=${2:-64}
mode=response
source "$(dirname "$0")/fixture.sh"
fixture_needs taskset curl python3
load_launcher="taskset -c 1"
prefilled=""

measure() { # empty | full
    fixture_config growth
    if [ "$1" = full ]; then
        if [ -z "$prefilled" ]; then
            "$bin" prefill --config "$dir/gateway.toml" --groups 100000 --per-group 10 \
                | tail -1
            prefilled=$dir
        else
            cp "$prefilled"/gateway.db "$prefilled"/gateway.db-wal "$dir"/ 2>/dev/null \
                || cp "$prefilled"/gateway.db "$dir"/
        fi
    fi
    fixture_serve taskset -c 0
    fixture_load -d 3 > /dev/null
    fixture_load -d 10 --json > "$dir/bench.json"
    fixture_stop
    python3 - "$1" "$dir" <<'PY'
import json, os, sys
store, d = sys.argv[1], sys.argv[2]
b = json.load(open(f"{d}/bench.json"))
size = os.path.getsize(f"{d}/gateway.db") / 1e6
print(f"{store:>5}: {b['msgs_per_s']:.0f} msgs/s, p99 {b['p99_ms']:.2f} ms "
      f"(database {size:.0f} MB)")
PY
    [ "$dir" = "$prefilled" ] || rm -rf "$dir"
}

for _ in 1 2; do
    measure empty
    measure full
done
rm -rf "$prefilled"
