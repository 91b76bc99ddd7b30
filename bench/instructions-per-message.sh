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
source "$(dirname "$0")/fixture.sh"
fixture_needs valgrind callgrind_control curl python3
fixture_config instructions
fixture_serve valgrind --tool=callgrind --callgrind-out-file="$dir/callgrind.out" \
    --dump-instr=no
fixture_load -d 4 > /dev/null
callgrind_control -z $gateway > /dev/null 2>&1
fixture_load -d 15 --json > "$dir/bench.json"
callgrind_control -d $gateway > /dev/null 2>&1
fixture_stop

python3 - "$dir" <<'EOF'
import glob, json, sys
d = sys.argv[1]
acked = json.load(open(f"{d}/bench.json"))["acked"]
dumps = sorted(glob.glob(f"{d}/callgrind.out.*"), key=lambda p: int(p.rsplit(".", 1)[1]))
total = next(int(l.split()[1]) for l in open(dumps[0]) if l.startswith(("summary:", "totals:")))
print(f"{total / acked:,.0f} instructions per acked message ({total:,} over {acked} messages)")
print(f"profile: {dumps[0]}")
EOF
