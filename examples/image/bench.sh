#!/usr/bin/env bash
# Benchmark of the image pipeline (not run in CI).
#
#   examples/image/bench.sh [COUNT_1M] [COUNT_8M] [ROUNDS]
#
# Generates COUNT_1M 1-megapixel and COUNT_8M 8-megapixel synthetic JPEGs (a count of
# 0 skips that size), then, for
# each size, after one warm-up pass of everything, runs ROUNDS alternating rounds of:
#   ours   leda-image --layout 1|2|3 --threads $(nproc)   (threads per process)
#   seq    leda-image baseline seq        (one thread, same filter code)
#   rayon  leda-image baseline rayon      (par_iter over images, same filter code)
#   imagemagick  convert -statistic median 3x3 -contrast-stretch 0.5%x0.5%
#                -resize 50% per image, 2-way parallel (xargs -P 2)
# and prints, per size and layout, the medians in images/s (wall clock, process
# start and daemon start-up included) and in CPU milliseconds per image (user + system,
# all processes and children):
#   BENCH image-<res>-layout<k> unit=images/s better=higher ours=... seq=... rayon=... imagemagick=...
#   BENCH image-<res>-layout<k>-cpu unit=cpu-ms/image better=lower ours=... seq=... ...
set -euo pipefail
cd "$(dirname "$0")/../.."

N1M=${1:-60}
N8M=${2:-8}
ROUNDS=${3:-3}
THREADS=${THREADS:-$(nproc)}
WORK=${BENCH_DIR:-/tmp/leda-image-bench}

if ! convert -version 2>/dev/null | grep -q 'Version: ImageMagick' || [ ! -x /usr/bin/time ]; then
  apt-get update -qq && apt-get install -y -qq imagemagick time >/dev/null
fi
convert -version | grep -q 'Version: ImageMagick' || { echo "ImageMagick missing" >&2; exit 1; }
cargo build --release -p leda-image >&2
BIN=target/release/leda-image

echo "# machine: $(nproc) CPU(s), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); $(convert -version | head -1)" >&2
echo "# load before: $(uptime)" >&2

now() { date +%s.%N; }

# run_one NAME INPUT OUT: runs one configuration, prints "images/s cpu-ms/image"
# (wall clock; user + system CPU time of the process and all its children).
run_one() {
  local name=$1 input=$2 out=$3 count t0 t1 cpu
  count=$(ls "$input" | wc -l)
  rm -rf "$out"
  mkdir -p "$out/half"
  cpu=$(mktemp)
  t0=$(now)
  case $name in
    layout*) /usr/bin/time -f "%U %S" -o "$cpu" "$BIN" --input "$input" --output "$out" \
               --layout "${name#layout}" --threads "$THREADS" --no-progress >/dev/null ;;
    seq) /usr/bin/time -f "%U %S" -o "$cpu" "$BIN" baseline seq --input "$input" --output "$out" >/dev/null ;;
    rayon) /usr/bin/time -f "%U %S" -o "$cpu" "$BIN" baseline rayon --threads "$THREADS" \
             --input "$input" --output "$out" >/dev/null ;;
    imagemagick)
      /usr/bin/time -f "%U %S" -o "$cpu" sh -c 'ls "$1" | xargs -P 2 -I{} sh -c \
        '"'"'convert "$1/$3" -statistic median 3x3 -contrast-stretch 0.5%x0.5% -quality 85 \
           -write "$2/$3" -resize 50% "$2/half/$3"'"'"' _ "$1" "$2" {}' _ "$input" "$out" ;;
  esac
  t1=$(now)
  echo "$count $t0 $t1 $(tail -1 "$cpu")" | awk '{ printf "%.3f %.1f\n", $1 / ($3 - $2), 1000 * ($4 + $5) / $1 }'
  rm -f "$cpu"
}

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.3f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

CONFIGS="layout1 layout2 layout3 seq rayon imagemagick"
for res in 1m 8m; do
  count=$N1M
  [ "$res" = 8m ] && count=$N8M
  if [ "$count" -le 0 ]; then echo "# $res skipped (count 0)" >&2; continue; fi
  input="$WORK/in-$res"
  if [ "$(ls "$input" 2>/dev/null | wc -l)" != "$count" ]; then
    rm -rf "$input"
    "$BIN" generate --output "$input" --count "$count" --resolution "$res" >&2
  fi
  declare -A results=() cpus=()
  for c in $CONFIGS; do run_one "$c" "$input" "$WORK/out-$c" >/dev/null; done  # warm-up
  for r in $(seq "$ROUNDS"); do
    for c in $CONFIGS; do
      read -r v ms < <(run_one "$c" "$input" "$WORK/out-$c")
      results[$c]="${results[$c]:-} $v"
      cpus[$c]="${cpus[$c]:-} $ms"
      echo "# $res round $r $c: $v images/s, $ms CPU ms/image" >&2
    done
  done
  declare -A med=() cmed=()
  for c in $CONFIGS; do
    med[$c]=$(echo "${results[$c]}" | tr ' ' '\n' | grep . | median)
    cmed[$c]=$(echo "${cpus[$c]}" | tr ' ' '\n' | grep . | median)
  done
  for k in 1 2 3; do
    echo "BENCH image-$res-layout$k unit=images/s better=higher ours=${med[layout$k]} seq=${med[seq]} rayon=${med[rayon]} imagemagick=${med[imagemagick]}"
  done
  # CPU time per image does not depend on what else the machine runs: on a loaded
  # machine it says more about efficiency than images/s does.
  for k in 1 2 3; do
    echo "BENCH image-$res-layout$k-cpu unit=cpu-ms/image better=lower ours=${cmed[layout$k]} seq=${cmed[seq]} rayon=${cmed[rayon]} imagemagick=${cmed[imagemagick]}"
  done
  unset results cpus med cmed
done
echo "# load after: $(uptime)" >&2
