#!/usr/bin/env bash
# Lock service vs etcd 3.4 locks, one run on loopback.
#
#   examples/lock-service/bench.sh [lock-service bench options, e.g. --rounds 5]
#
# Installs etcd (Debian etcd-server, 3.4) if missing, builds the release binary and runs
# `lock-service bench`, which starts, per group size, our nodes (`lock-service serve`, one
# process each) and an etcd cluster of as many members on loopback (etcd's data in --dir,
# default /tmp; /dev/shm is faster where it exists), and prints one BENCH line per case:
# uncontended acquire+release latency p50/p99 (µs) and the throughput of one contended lock
# with 8 clients doing fenced counter increments, both services with 10 s leases kept alive.
set -euo pipefail
cd "$(dirname "$0")/../.."

if ! command -v etcd >/dev/null 2>&1; then
    apt-get update
    apt-get install -y etcd-server
fi
cargo build --release -p leda-lock-service --bin lock-service

echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'); etcd $(etcd --version | head -1)"
echo "load before: $(uptime)"
target/release/lock-service bench "$@"
echo "load after: $(uptime)"
