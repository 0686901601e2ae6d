#!/usr/bin/env bash
# The distributed sort against an OpenMPI C program doing the same (thesis §5,
# spec §14.4), plus the communication-only time for one vector to one process.
#
#   examples/sort/bench.sh            # from anywhere; installs OpenMPI with apt
#   REPS=5 SIZES="48000 192000" PROCS="2 4" examples/sort/bench.sh
#   REPS=5 SIZES=" " examples/sort/bench.sh   # the send rows only
#
# Prints, medians of REPS alternating runs (ours, mpi, ours, ...) after a warm-up:
#   BENCH sort-<n>-p<p> unit=s better=lower ours=… mpi=…
#   BENCH send-<size> unit=s better=lower ours=… ours_tcp=… mpi=… mpi_tcp=…
# `ours` uses leda-net's defaults (on one host the receiver reads a large binary from
# the sender's memory, `process_vm_readv`), `ours_tcp` turns that off
# (`LEDA_PEER_MEMORY=0`: every byte through the socket); `mpi` uses OpenMPI's defaults
# (shared memory between processes of one host, with the same single-copy mechanism
# where the host allows it), `mpi_tcp` forces its TCP transport (`--mca btl tcp,self`).
# Like for like: ours against mpi, ours_tcp against mpi_tcp.
# Not run in CI (it needs apt and several minutes).
set -euo pipefail
cd "$(dirname "$0")/../.."

REPS=${REPS:-3}
SIZES=${SIZES:-"48000 192000"}
PROCS=${PROCS:-"2 4"}
SEND_SIZES=${SEND_SIZES:-"1536000 12288000"}
SEND_ROUNDS=${SEND_ROUNDS:-10}

if ! command -v mpicc >/dev/null || ! command -v mpirun >/dev/null; then
  apt-get update
  DEBIAN_FRONTEND=noninteractive apt-get install -y openmpi-bin libopenmpi-dev
fi

cargo build --release --locked -p leda-sort --bin leda-sort
TARGET=${CARGO_TARGET_DIR:-target}
OURS=$TARGET/release/leda-sort
MPI=$TARGET/release/sort_mpi
# The same kernel source and flags as build.rs gives the cc crate (-O2, -fPIC).
mpicc -O2 -fPIC -Iexamples/sort/csrc -o "$MPI" \
  examples/sort/mpi/sort_mpi.c examples/sort/csrc/selection_sort.c

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --bind-to none)
# Containers often forbid the cross-process copy (CMA) of the shared-memory transport.
if ! "${MPIRUN[@]}" -np 2 "$MPI" send 8 1 0 >/dev/null 2>&1; then
  MPIRUN+=(--mca btl_vader_single_copy_mechanism none)
fi

median() { sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }

ours_sort() { "$OURS" run --np "$2" --length "$1" --spawn | awk '$1=="leda"{print $5}'; }
mpi_sort() { "${MPIRUN[@]}" -np $(($2 + 1)) "$MPI" sort "$1" | awk '$1=="mpi"{print $5}'; }
ours_send() { "$OURS" send --bytes "$1" --rounds "$SEND_ROUNDS" --spawn | awk '{print $3}'; }
ours_tcp_send() { LEDA_PEER_MEMORY=0 ours_send "$1"; }
mpi_send() { "${MPIRUN[@]}" -np 2 "$MPI" send "$1" "$SEND_ROUNDS" 2 | awk '{print $3}'; }
mpi_tcp_send() {
  "${MPIRUN[@]}" --mca btl tcp,self -np 2 "$MPI" send "$1" "$SEND_ROUNDS" 2 | awk '{print $3}'
}

echo "# $(nproc) CPU(s), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); load: $(cut -d' ' -f1-3 /proc/loadavg)"

# Warm-up (page cache, binaries): one small run of each.
ours_sort 4800 2 >/dev/null
mpi_sort 4800 2 >/dev/null

for n in $SIZES; do
  for p in $PROCS; do
    o=() m=()
    for _ in $(seq "$REPS"); do
      o+=("$(ours_sort "$n" "$p")")
      m+=("$(mpi_sort "$n" "$p")")
    done
    echo "BENCH sort-$n-p$p unit=s better=lower ours=$(printf '%s\n' "${o[@]}" | median) mpi=$(printf '%s\n' "${m[@]}" | median)"
  done
done

for b in $SEND_SIZES; do
  name=$(awk -v b="$b" 'BEGIN { if (b >= 1e6) printf "%gMB", b / 1024000; else printf "%gKB", b / 1024 }')
  ours_send "$b" >/dev/null
  mpi_send "$b" >/dev/null
  o=() ot=() m=() t=()
  for _ in $(seq "$REPS"); do
    o+=("$(ours_send "$b")")
    ot+=("$(ours_tcp_send "$b")")
    m+=("$(mpi_send "$b")")
    t+=("$(mpi_tcp_send "$b")")
  done
  echo "BENCH send-$name unit=s better=lower ours=$(printf '%s\n' "${o[@]}" | median) ours_tcp=$(printf '%s\n' "${ot[@]}" | median) mpi=$(printf '%s\n' "${m[@]}" | median) mpi_tcp=$(printf '%s\n' "${t[@]}" | median)"
done
