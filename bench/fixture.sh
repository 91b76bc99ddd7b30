# The fresh gateway the per-message scripts measure (`instructions-per-message.sh`,
# `cpu-per-message.sh`, ...), sourced by them: a SQLite store (or a PostgreSQL database the
# script made) with `durability = "full"`, no per-source quotas and a consumer token for
# `e2e`, on a free port, loaded by `wsr-gateway bench` with 16 workers unless $connections
# says otherwise.
#
#   fixture_needs TOOL...            exits 2 unless each TOOL is on PATH and $bin runs
#   fixture_config NAME [DATABASE]   writes $dir/gateway.toml (on DATABASE, a postgres://
#                                    URL, if given); sets $dir, $port, $token
#   fixture_serve LAUNCHER...        runs `LAUNCHER... $bin serve` on it and waits for
#                                    /healthz; sets $gateway
#   fixture_load BENCH_ARGS...       `$load_launcher $bin bench` against it in mode $mode
#   fixture_stop                     stops it
#   fixture_cpu_ticks PID            a process's CPU so far (user + system, in clock ticks)
#   fixture_batches                  the writer's jobs and commits so far: "jobs commits"

fixture_needs() {
    for tool in "$@"; do
        command -v "$tool" >/dev/null || { echo "needs $tool" >&2; exit 2; }
    done
    [ -x "$bin" ] || { echo "no gateway binary at $bin (cargo build --release)" >&2; exit 2; }
}

fixture_config() {
    local name=$1
    local database=${2:-}
    dir=$(mktemp -d "/tmp/wsr-$name-XXXXXX")
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    token=$name-consumer-token-0123456789
    cat > "$dir/gateway.toml" <<TOML
listen = "127.0.0.1:$port"
database = "${database:-$dir/gateway.db}"
durability = "full"
max_stored_bytes_per_source = 0
max_messages_per_second_per_source = 0

[[tokens]]
token = "$token"
principal = "bench"
scopes = ["consume"]
TOML
}

fixture_serve() {
    "$@" "$bin" serve --config "$dir/gateway.toml" > "$dir/gateway.log" 2>&1 &
    gateway=$!
    trap 'kill $gateway 2>/dev/null || true' EXIT
    for _ in $(seq 1 240); do
        curl -sf "http://127.0.0.1:$port/healthz" > /dev/null && return 0
        kill -0 $gateway 2>/dev/null || { cat "$dir/gateway.log" >&2; exit 1; }
        sleep 0.5
    done
    echo "the gateway did not answer /healthz; its log: $dir/gateway.log" >&2
    exit 1
}

fixture_load() {
    WSR_BENCH_TOKEN=$token ${load_launcher:-} "$bin" bench \
        --url "http://127.0.0.1:$port/wsr/default" -c "${connections:-16}" --mode "$mode" \
        --consumers 2 --batch 32 "$@"
}

fixture_stop() {
    kill $gateway
    wait $gateway 2>/dev/null || true
    trap - EXIT
}

fixture_cpu_ticks() {
    awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0
}

fixture_batches() {
    curl -s "http://127.0.0.1:$port/metrics" | grep -E '^wsr_writer_batch_size_(sum|count)' \
        | awk '{print $2}' | paste -sd' '
}
