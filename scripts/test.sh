#!/usr/bin/env bash
# Sets up the dependencies (scripts/setup_deps.sh), builds kfa with its
# tests, examples and perf tests, and runs every test with ctest.
#   KFA_BUILD_DIR  build folder (default: build/ in the repository)
#   Kokkos_ROOT    use your own Kokkos (and KokkosKernels_ROOT) instead of the cached 3.4.01
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${KFA_BUILD_DIR:-$root/build}"
deps="$("$root/scripts/setup_deps.sh")"
# shellcheck disable=SC2086
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release $deps
cmake --build "$build" -j "$(nproc)"
cd "$build"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}" OMP_PROC_BIND="${OMP_PROC_BIND:-false}"
ctest --output-on-failure "$@"
