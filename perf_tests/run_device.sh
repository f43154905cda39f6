#!/usr/bin/env bash
# Single-GPU checks and the speed table, from a prebuilt CUDA build of kfa
# (targets kfa_unit_tests and bench_device), in one call on the GPU machine:
#
#   perf_tests/run_device.sh <cuda-build-dir> [bench_device.py flags]
#
# 1. the unit tests of the Cuda configurations (typed suites 0-3 are Cuda's:
#    double, float, half, bf16) and the Cuda-only tests;
# 2. perf_tests/bench_device.py (kfa beside PyTorch SDPA on the same inputs,
#    errors against an fp64 reference), default flags `--set quick`.
# Logs and the JSON table go to $OUT (or ./device-out) when set. Every step
# runs even when one fails; the exit status says whether all passed.
set -uo pipefail
build="${1:?usage: $0 <cuda-build-dir> [bench_device.py flags]}"
shift
out="${OUT:-device-out}"
mkdir -p "$out"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
flags=("$@")
[ "${#flags[@]}" -eq 0 ] && flags=(--set quick)
status=0
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw \
  --format=csv || true
echo "== unit tests (Cuda)"
"$build/unit_tests/kfa_unit_tests" --gtest_filter='*/0.*:*/1.*:*/2.*:*/3.*:*Cuda*' \
  --gtest_brief=1 2>&1 | tee "$out/unit_tests.log" | grep -E "FAILED|PASSED|tests ran|error|Failure" | head -60
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
echo "== bench_device.py ${flags[*]}"
PYTHONUNBUFFERED=1 python3 "$here/bench_device.py" --exe "$build/perf_tests/bench_device" \
  --json "$out/bench.json" "${flags[@]}" 2>&1 | tee "$out/bench.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
exit $status
