#!/usr/bin/env bash
# Builds the unit tests and the ring tests with AddressSanitizer and
# UndefinedBehaviorSanitizer (a build folder of their own) and runs them:
# the unit tests, then the ring tests at 1, 2 and 3 ranks and the rank-failure
# tests. Any sanitizer report fails the run.
#   KFA_SANITIZE_DIR  build folder (default: build-sanitize/ in the repository)
#   KFA_BUILD_JOBS    parallel compile jobs (default: nproc)
# Extra arguments go to ctest (e.g. -R kfa_unit_tests).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${KFA_SANITIZE_DIR:-$root/build-sanitize}"
deps="$("$root/scripts/setup_deps.sh")"
flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g"
start=$(date +%s)
# shellcheck disable=SC2086
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo $deps \
  -DKFA_ENABLE_BENCHMARKS=OFF -DKFA_ENABLE_EXAMPLES=OFF \
  -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined"
targets=(kfa_unit_tests)
if grep -q "KFA_ENABLE_MPI:BOOL=ON" "$build/CMakeCache.txt"; then
  targets+=(kfa_ring_tests kfa_ring_failure)
fi
cmake --build "$build" -j "${KFA_BUILD_JOBS:-$(nproc)}" --target "${targets[@]}"
built=$(date +%s)
cd "$build"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}" OMP_PROC_BIND="${OMP_PROC_BIND:-false}"
# Open MPI's own allocations outlive MPI_Finalize: leak checking is off.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}"
# Only what was built: the unit tests, the ring tests at 1-3 ranks, the
# rank-failure tests.
ctest --output-on-failure -R '^(kfa_unit_tests|ring_)' -E 'ring_np4' "$@"
echo "sanitize.sh: build $((built - start)) s, tests $(($(date +%s) - built)) s"
