#!/usr/bin/env bash
# The thesis' CEP table (§14.2) as a sweep on this machine: scenario 1 vs 2, two
# thread settings, two instance settings (the thesis' ratios: persist/filter/
# correlate = T/4,T/4,T/2 and T/2,T/2,T/2), Rust handlers; Lua handlers in both
# scenarios (second instance setting unless LUA_FULL=1). Each configuration is compared with `seq` (one
# thread, same work, no framework; the COST baseline) in the same run: one warm-up
# of each, then REPS alternating runs; medians are printed (a configuration whose
# alarms differ from seq's fails the bench: results are defined by event time):
#   BENCH cep-<scenario>-<threads>t-<persist>p<filter>f<correlate>c unit=s better=lower ours=... seq=...
# (scenario "lua1"/"lua2" for the Lua handlers).
# Environment: LINES (default 1000000), THREADS (default "4 8"), REPS (default 3),
# LUA=0 / RUST=0 to skip the Lua / Rust rows, LUA_REPS (default 1), LUA_FULL, WORK (scratch dir).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
lines="${LINES:-1000000}"
threads="${THREADS:-4 8}"
reps="${REPS:-3}"
work="${WORK:-$(mktemp -d)}"
cargo build -q --release --manifest-path "$root/Cargo.toml" -p leda-cep
bin="${CARGO_TARGET_DIR:-$root/target}/release/leda-cep"
echo "# machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# input: $lines lines over 3 files (seed 42), window 1000, $reps runs after 1 warm-up"
"$bin" gen --out "$work/logs" --lines "$lines" --seed 42 >/dev/null

secs() { # run leda-cep with "$@"; print the seconds it reports
  "$bin" "$@" --logs "$work/logs" --window 1000 | sed -n 's/^[^:]*: \([0-9.]*\) s,.*/\1/p'
}
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

bench() { # label, repetitions, then leda-cep arguments for "ours"
  local label="$1" n="$2"; shift 2
  secs "$@" --out "$work/out" >/dev/null
  secs seq --out "$work/seq" >/dev/null
  local ours=() seq=()
  for _ in $(seq "$n"); do
    ours+=("$(secs "$@" --out "$work/out")")
    seq+=("$(secs seq --out "$work/seq")")
  done
  # Results are defined by event time: the same alarms as the sequential program.
  if ! cmp -s <(sort "$work/out/alarms.log") <(sort "$work/seq/alarms.log"); then
    echo "bench: $label: alarms differ from the sequential program's" >&2
    exit 1
  fi
  echo "BENCH $label unit=s better=lower ours=$(printf '%s\n' "${ours[@]}" | median) seq=$(printf '%s\n' "${seq[@]}" | median)"
}

for t in $threads; do
  for inst in "$((t / 4 > 0 ? t / 4 : 1)) $((t / 4 > 0 ? t / 4 : 1)) $((t / 2))" "$((t / 2)) $((t / 2)) $((t / 2))"; do
    [ "${RUST:-1}" != 0 ] || continue
    read -r p f c <<<"$inst"
    for sc in 1 2; do
      bench "cep-$sc-${t}t-${p}p${f}f${c}c" "$reps" run --scenario "$sc" --threads "$t" --persist "$p" --filter "$f" --correlate "$c"
    done
  done
  # Lua handlers, both scenarios (interpreted O(w^2) correlate, ~20x slower): the
  # second instance setting only (LUA_FULL=1: both), LUA_REPS runs (default 1).
  if [ "${LUA:-1}" != 0 ]; then
    h=$((t / 2))
    settings="$h $h $h"
    [ "${LUA_FULL:-0}" = 1 ] && settings="$((t / 4 > 0 ? t / 4 : 1)) $((t / 4 > 0 ? t / 4 : 1)) $h,$settings"
    IFS=, read -ra lua_settings <<<"$settings"
    for inst in "${lua_settings[@]}"; do
      read -r p f c <<<"$inst"
      for sc in 1 2; do
        bench "cep-lua$sc-${t}t-${p}p${f}f${c}c" "${LUA_REPS:-1}" lua --scenario "$sc" --threads "$t" --persist "$p" --filter "$f" --correlate "$c"
      done
    done
  fi
done
[ -n "${WORK:-}" ] || rm -rf "$work"
