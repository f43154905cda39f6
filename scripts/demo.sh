#!/usr/bin/env bash
# Sets up the dependencies, builds kfa and runs the main example on the host
# (OpenMP): flash vs standard attention, forward and backward, with the max
# error between them, the time and the peak extra memory of each. Then ring
# attention on 2 MPI ranks (one thread each): the sequence split over the
# ranks, with the max error against single-rank attention and the time of
# each rank.
#   scripts/demo.sh [basic_attention flags, e.g. --seqlen 8192 --causal]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${KFA_BUILD_DIR:-$root/build}"
deps="$("$root/scripts/setup_deps.sh")"
# shellcheck disable=SC2086
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release $deps > /dev/null
cmake --build "$build" -j "$(nproc)" --target basic_attention ring_attention
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(nproc)}" OMP_PROC_BIND="${OMP_PROC_BIND:-false}"
echo
"$build/examples/basic_attention" "$@"

echo
# Open MPI refuses to run as root without these, and more ranks than cores
# without --oversubscribe.
mpi_flags=()
if mpirun --version 2>/dev/null | grep -q "Open MPI"; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  mpi_flags=(--oversubscribe -x OMP_NUM_THREADS=1 -x OMP_PROC_BIND)
fi
OMP_NUM_THREADS=1 mpirun -np 2 "${mpi_flags[@]}" "$build/examples/ring_attention" \
  --seqlen 4096 --heads 4 --head-dim 64 --causal --zigzag --repeat 1
