#!/usr/bin/env bash
# The thesis' CEP table (§14.2) as a sweep on this machine, against the COST baselines.
# Rust handlers: the whole graph in one process (`local`), scenario 1 (each source in a
# process of its own, every processing stage in one more) and scenario 2 (as 1, with
# correlate in a process of its own), at two thread settings (one and two per CPU) and
# the thesis' instance ratios (persist/filter/correlate = T/4,T/4,T/2 and T/2,T/2,T/2)
# and 1,1,T.
# Each is compared with `seq` (one thread, the same work, no framework) in the same
# run: one warm-up of each, then REPS alternating runs. Lua handlers: `lua` (local, one
# thread per CPU; LUA_FULL=1 adds scenarios 1 and 2) against `lua_seq` (the same Lua
# functions in one Lua state, one thread), LUA_REPS alternating runs.
# A configuration whose alarms differ from its baseline's fails the bench (results are
# defined by event time), as does a run that reports no time. Lines (medians, with each side's min and max):
#   BENCH cep-<scenario>-<threads>t-<p>p<f>f<c>c unit=s better=lower ours=... ours_min=... ours_max=... seq=... seq_min=... seq_max=... speedup=<seq/ours medians>
#   BENCH cep-lua<scenario>-... unit=s better=lower ours=... lua_seq=... (same fields)
# Environment: LINES (default 1000000), THREADS (default "nproc 2*nproc"), REPS
# (default 5), SCENARIOS (default "local 1 2"), LUA=0 / RUST=0 to skip the Lua / Rust
# rows, LUA_REPS (default 3), LUA_FULL, WORK (scratch dir).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
lines="${LINES:-1000000}"
cpus="$(nproc)"
threads="${THREADS:-$cpus $((2 * cpus))}"
reps="${REPS:-5}"
work="${WORK:-$(mktemp -d)}"
[ -n "${WORK:-}" ] || trap 'rm -rf "$work"' EXIT
cargo build -q --release --manifest-path "$root/Cargo.toml" -p leda-cep
bin="${CARGO_TARGET_DIR:-$root/target}/release/leda-cep"
echo "# machine: $cpus CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# input: $lines lines over 3 files (seed 42), window 1000; $(date -u +%FT%TZ)"
"$bin" gen --out "$work/logs" --lines "$lines" --seed 42 >/dev/null

secs() { # run leda-cep with "$@"; print the seconds it reports (fail without them)
  local t
  t="$("$bin" "$@" --logs "$work/logs" --window 1000 | sed -n 's/^[^:]*: \([0-9.]*\) s,.*/\1/p')"
  [ -n "$t" ] || { echo "bench: leda-cep $* reported no time" >&2; exit 1; }
  echo "$t"
}
stats() { # name, values...: "name=median name_min=min name_max=max"
  local name="$1"
  shift
  printf '%s\n' "$@" | sort -g | awk -v n="$name" '{a[NR]=$1} END {
    m = (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2)
    printf "%s=%s %s_min=%s %s_max=%s", n, m, n, a[1], n, a[NR] }'
}
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2)}'; }

bench() { # label, repetitions, peer name, peer command, --, leda-cep arguments for "ours"
  local label="$1" n="$2" peer="$3" peer_cmd="$4"
  shift 5
  secs "$@" --out "$work/out" >/dev/null
  secs "$peer_cmd" --out "$work/peer" >/dev/null
  local ours=() theirs=()
  for _ in $(seq "$n"); do
    ours+=("$(secs "$@" --out "$work/out")")
    theirs+=("$(secs "$peer_cmd" --out "$work/peer")")
  done
  if ! cmp -s <(sort "$work/out/alarms.log") <(sort "$work/peer/alarms.log"); then
    echo "bench: $label: alarms differ from the sequential program's" >&2
    exit 1
  fi
  local mo mp
  mo="$(median "${ours[@]}")"
  mp="$(median "${theirs[@]}")"
  echo "BENCH $label unit=s better=lower $(stats ours "${ours[@]}") $(stats "$peer" "${theirs[@]}") speedup=$(awk -v a="$mp" -v b="$mo" 'BEGIN {printf "%.2f", a / b}')"
}

if [ "${RUST:-1}" != 0 ]; then
  for t in $threads; do
    # The thesis' two ratios, and correlate (the O(w^2) stage) on every thread.
    settings="$((t / 4 > 0 ? t / 4 : 1)) $((t / 4 > 0 ? t / 4 : 1)) $((t / 2 > 0 ? t / 2 : 1))"
    [ "$t" -ge 4 ] && settings="$settings,$((t / 2)) $((t / 2)) $((t / 2))"
    [ "$t" -ge 2 ] && settings="$settings,1 1 $t"
    IFS=, read -ra inst_settings <<<"$settings"
    for inst in "${inst_settings[@]}"; do
      read -r p f c <<<"$inst"
      for sc in ${SCENARIOS:-local 1 2}; do
        bench "cep-$sc-${t}t-${p}p${f}f${c}c" "$reps" seq seq -- run --scenario "$sc" --threads "$t" --persist "$p" --filter "$f" --correlate "$c"
      done
    done
  done
fi
# Lua handlers (interpreted O(w^2) correlate, ~20x slower than Rust): one thread per
# CPU, correlate on every thread.
if [ "${LUA:-1}" != 0 ]; then
  scenarios="local"
  [ "${LUA_FULL:-0}" = 1 ] && scenarios="local 1 2"
  for sc in $scenarios; do
    bench "cep-lua$sc-${cpus}t-1p1f${cpus}c" "${LUA_REPS:-3}" lua_seq lua-seq -- lua --scenario "$sc" --threads "$cpus" --persist 1 --filter 1 --correlate "$cpus"
  done
fi
