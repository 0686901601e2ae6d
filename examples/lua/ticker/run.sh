#!/usr/bin/env bash
# The stock ticker (thesis Listing 5.1) against a local quote page, for SECONDS
# seconds (default 12): starts the page server, runs the ticker, stops both.
# Usage: examples/lua/ticker/run.sh [SECONDS]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
secs="${1:-12}"
cargo build -q --manifest-path "$root/Cargo.toml" -p leda-cli --bin leda
leda="${CARGO_TARGET_DIR:-$root/target}/debug/leda"
out="$(mktemp)"
"$leda" run "$here/quotes.lua" 0 >"$out" &
server=$!
trap 'kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; rm -f "$out"' EXIT
for _ in $(seq 50); do
  url="$(head -n1 "$out")"
  [ -n "$url" ] && break
  sleep 0.1
done
[ -n "$url" ] || { echo "quote server did not start" >&2; exit 1; }
echo "quote page: $url (mean of the last five quotes, once per second)"
echo "ticker: collecting the first five quotes (5 s), then one line per second" >&2
timeout --foreground "$secs" "$leda" run "$here/ticker.lua" "$url" || [ $? -eq 124 ]
