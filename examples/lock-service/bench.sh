#!/usr/bin/env bash
# Lock service vs etcd 3.4 locks, one run on loopback.
#
#   examples/lock-service/bench.sh [lock-service bench options, e.g. --rounds 5]
#
# Installs etcd (Debian etcd-server) if missing, starts one etcd member on 127.0.0.1:23790
# with its data in /dev/shm when available (our service keeps no disk state either), builds
# the release binary and runs `lock-service bench`, which prints one BENCH line per case:
# uncontended acquire+release latency p50/p99 (µs) and the throughput of one contended lock
# with 8 clients, for our service with 3 and 5 nodes (one process per node) and Ricart–Agrawala,
# Suzuki–Kasami and Naimi–Tréhel, next to etcd's v3 lock API (JSON gateway, keep-alive HTTP).
set -euo pipefail
cd "$(dirname "$0")/../.."

if ! command -v etcd >/dev/null 2>&1; then
    apt-get update
    apt-get install -y etcd-server
fi
cargo build --release -p leda-lock-service --bin lock-service

base=/dev/shm
[ -d "$base" ] && [ -w "$base" ] || base=${TMPDIR:-/tmp}
data=$(mktemp -d "$base/leda-etcd.XXXXXX")
etcd --name bench --data-dir "$data/member" \
    --listen-client-urls http://127.0.0.1:23790 --advertise-client-urls http://127.0.0.1:23790 \
    --listen-peer-urls http://127.0.0.1:23800 --initial-advertise-peer-urls http://127.0.0.1:23800 \
    --initial-cluster bench=http://127.0.0.1:23800 >"$data/etcd.log" 2>&1 &
etcd_pid=$!
cleanup() {
    kill "$etcd_pid" 2>/dev/null || true
    wait "$etcd_pid" 2>/dev/null || true
    rm -rf "$data"
}
trap cleanup EXIT

for _ in $(seq 100); do
    if (exec 3<>/dev/tcp/127.0.0.1/23790) 2>/dev/null; then break; fi
    sleep 0.1
done

echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'); etcd $(etcd --version | head -1)"
echo "load before: $(uptime)"
target/release/lock-service bench --etcd 127.0.0.1:23790 "$@"
echo "load after: $(uptime)"
