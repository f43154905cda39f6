#!/usr/bin/env bash
# Sets up the dependencies, builds kfa and runs the main example on the host
# (OpenMP): flash vs standard attention, forward and backward, with the max
# error between them, the time and the peak extra memory of each.
#   scripts/demo.sh [basic_attention flags, e.g. --seqlen 8192 --causal]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${KFA_BUILD_DIR:-$root/build}"
deps="$("$root/scripts/setup_deps.sh")"
# shellcheck disable=SC2086
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release $deps > /dev/null
cmake --build "$build" -j "$(nproc)" --target basic_attention
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(nproc)}" OMP_PROC_BIND="${OMP_PROC_BIND:-false}"
echo
"$build/examples/basic_attention" "$@"
