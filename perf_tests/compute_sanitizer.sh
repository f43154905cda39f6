#!/usr/bin/env bash
# NVIDIA compute-sanitizer over the Cuda unit tests of a CUDA build, every
# kernel family included (wgmma with TMA and bulk reductions, mma.sync, the
# exact fp32 and fp64 kernels, the portable kernel), one tool after another:
#
#   perf_tests/compute_sanitizer.sh <kfa_unit_tests> [tools]   # default: all four
#
# memcheck, synccheck and initcheck run the tests that name a kernel family
# (CUDA_SANITIZER_FILTER to change it); racecheck, which serialises every
# shared-memory access and is about 100x slower, runs one test per family
# (RACECHECK_FILTER). A tool that reports an error, or a test that fails
# under it, fails the run. Logs go to $OUT (or ./sanitizer-out).
set -uo pipefail
tests="${1:?usage: $0 <kfa_unit_tests> [memcheck,racecheck,synccheck,initcheck]}"
tools="${2:-memcheck,synccheck,initcheck,racecheck}"
out="${OUT:-sanitizer-out}"
mkdir -p "$out"
sanitizer="${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}"
filter="${CUDA_SANITIZER_FILTER:-KernelChoice.*:Varlen.*:*Cuda*.*:FlashForward/3.*:FlashBackward/3.*:FlashForward/1.*:FlashBackward/0.*}"
race_filter="${RACECHECK_FILTER:-FlashForwardCuda.HopperWgmmaTma:FlashBackwardCuda.HopperWgmma:FlashForwardCuda.Fp32Fp64TensorCoreTileShapes}"
status=0
for tool in ${tools//,/ }; do
  f="$filter"
  extra=()
  case "$tool" in
    racecheck) f="$race_filter"; extra=(--racecheck-report=all) ;;
    initcheck) extra=(--track-unused-memory=no) ;;
  esac
  start=$SECONDS
  # Tests that catch CUDA errors would hide a report behind a pass: the tool's
  # own exit code (--error-exitcode) counts.
  "$sanitizer" --tool "$tool" --error-exitcode 86 --print-limit 20 "${extra[@]}" \
    "$tests" --gtest_filter="$f" --gtest_brief=1 > "$out/$tool.log" 2>&1
  rc=$?
  summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$out/$tool.log" | tail -1)
  echo "$tool: exit $rc, $((SECONDS - start)) s, ${summary:-no summary}; tests: $(grep -cE '^\[       OK|^\[  PASSED' "$out/$tool.log") passed lines, $(grep -c 'FAILED' "$out/$tool.log") failed lines"
  [ "$rc" -eq 0 ] || status=1
done
exit $status
