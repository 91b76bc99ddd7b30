#!/usr/bin/env bash
# The gateway's system calls per acknowledged message, by call, counted by `strace -c -f`:
# the kernel's share of the CPU per message (WAL page writes, fsyncs, file locks, socket reads
# and writes, wake-ups), which `instructions-per-message.sh` does not see and which
# `cpu-per-message.sh` only shows as a total that moves with whatever else the machine runs.
# A count, not a time: two builds compare by one run each, though counts that depend on how
# requests batch (pwrite64, fsync, fcntl: per commit) move with the load's timing.
#
#   bench/syscalls-per-message.sh [BINARY] [MODE] [CONNECTIONS]
#
# BINARY defaults to target/release/wsr-gateway, MODE to `response` (any `bench --mode`; `e2e`
# adds two consumers fetching batches of 32), CONNECTIONS to 16. A fresh gateway (SQLite,
# durability full, no per-source quotas) on CPU 0 is warmed up for 3 s, then traced over 10 s
# of load from CPU 1; strace slows every call, so msgs/s here is far below an untraced run's.
# Needs two CPUs, strace, taskset, curl and python3.
set -euo pipefail

bin=${1:-target/release/wsr-gateway}
mode=${2:-response}
connections=${3:-16}
source "$(dirname "$0")/fixture.sh"
fixture_needs strace taskset curl python3
fixture_config syscalls
fixture_serve taskset -c 0
load_launcher="taskset -c 1"
fixture_load -d 3 > /dev/null
# Attached before the load starts and detached (SIGINT) after it ended: every call the
# counted messages cost is in, plus a second or so of idle timers either side.
taskset -c 1 strace -q -c -f -p "$gateway" -o "$dir/strace.txt" &
tracer=$!
sleep 1
fixture_load -d 10 --json > "$dir/bench.json"
kill -INT $tracer
wait $tracer 2>/dev/null || true
fixture_stop

python3 - "$dir" <<'EOF'
import json, sys
d = sys.argv[1]
bench = json.load(open(f"{d}/bench.json"))
acked = bench["acked"]
calls = []
for line in open(f"{d}/strace.txt"):
    parts = line.split()
    # "% time  seconds  usecs/call  calls  [errors]  syscall"
    if len(parts) >= 5 and parts[0][0].isdigit() and parts[-1] != "total":
        calls.append((int(parts[3]), parts[-1]))
total = sum(n for n, _ in calls)
print(f"{total / acked:.2f} system calls per acked message ({total} over {acked} messages, "
      f"{bench['msgs_per_s']:.0f} msgs/s traced)")
for n, name in sorted(calls, reverse=True):
    if n / acked >= 0.01:
        print(f"  {name:<16} {n / acked:6.2f}")
print(f"strace summary: {d}/strace.txt")
EOF
