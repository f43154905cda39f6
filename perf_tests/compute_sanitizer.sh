#!/usr/bin/env bash
# NVIDIA compute-sanitizer over the Cuda unit tests of a CUDA build, every
# kernel family included (wgmma with TMA and bulk reductions, mma.sync, the
# exact fp32 and fp64 kernels, the padded head dims, the portable kernel),
# one tool after another, one process per test (or, with SHARDS=n, the
# tests split into n processes by gtest's sharding: the tool instruments a
# process's kernels once, which dominates short tests), JOBS processes at a
# time:
#
#   perf_tests/compute_sanitizer.sh <kfa_unit_tests> [tools]   # default: all four
#
# memcheck, synccheck and initcheck run the tests that name a kernel family
# (CUDA_SANITIZER_FILTER to change it); racecheck, which serialises every
# shared-memory access and is about 100x slower, the tests that name CUDA
# (RACECHECK_FILTER). A tool that reports an error, a test that fails under
# it, or a test still running after SANITIZER_SECONDS (per tool; default no
# limit) fails the run. Logs go to $OUT (or ./sanitizer-out), one per tool
# and test (or shard), with a summary line per test (shard) in
# <tool>.summary.
set -uo pipefail
tests="${1:?usage: $0 <kfa_unit_tests> [memcheck,racecheck,synccheck,initcheck]}"
tools="${2:-memcheck,synccheck,initcheck,racecheck}"
out="${OUT:-sanitizer-out}"
jobs_at_once="${JOBS:-$(( $(nproc) > 2 ? $(nproc) * 3 / 4 : 1 ))}"
limit="${SANITIZER_SECONDS:-0}"
mkdir -p "$out"
sanitizer="${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}"
filter="${CUDA_SANITIZER_FILTER:-*Cuda*.*:KernelChoice.*:Varlen.*:FlashForward/3.*:FlashBackward/3.*:FlashForward/1.*:FlashBackward/0.*}"
race_filter="${RACECHECK_FILTER:-*Cuda*.*}"

# One test per line, as gtest names them (typed tests: Suite/N.Test).
list_tests() {
  "$tests" --gtest_list_tests --gtest_filter="$1" 2>/dev/null |
    awk '/^[^ ]/ { suite = $1 } /^  / { print suite $1 }'
}

status=0
"$sanitizer" --version | tail -1
for tool in ${tools//,/ }; do
  f="$filter"
  extra=()
  case "$tool" in
    racecheck) f="$race_filter"; extra=(--racecheck-report=hazard) ;;
  esac
  shards="${SHARDS:-0}"
  if [ "$shards" -gt 0 ]; then
    names=()
    for ((i = 0; i < shards; ++i)); do names+=("shard$i"); done
  else
    mapfile -t names < <(list_tests "$f")
  fi
  start=$SECONDS
  summary="$out/$tool.summary"
  : > "$summary"
  for name in "${names[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$jobs_at_once" ]; do sleep 0.5; done
    left=0
    if [ "$limit" -gt 0 ]; then
      left=$(( limit - (SECONDS - start) ))
      if [ "$left" -lt 5 ]; then
        echo "NOT clean $name: not started (SANITIZER_SECONDS)" >> "$summary"
        continue
      fi
    fi
    (
      log="$out/$tool.${name//\//_}.log"
      if [ "$shards" -gt 0 ]; then
        export GTEST_TOTAL_SHARDS="$shards" GTEST_SHARD_INDEX="${name#shard}"
        gtest_filter="$f"
      else
        gtest_filter="$name"
      fi
      # Tests that catch CUDA errors would hide a report behind a pass: the
      # tool's own exit code (--error-exitcode) counts.
      # (timeout 0: no limit.)
      began=$SECONDS
      timeout "$left" "$sanitizer" --tool "$tool" --error-exitcode 86 --print-limit 20 \
        "${extra[@]}" "$tests" --gtest_filter="$gtest_filter" > "$log" 2>&1
      rc=$?
      report=$(grep -hE "ERROR SUMMARY|RACECHECK SUMMARY" "$log" | tail -1)
      [ "$rc" -eq 124 ] && report="timed out"
      ran=$(grep -c '^\[       OK \]' "$log")
      failed_tests=$(grep -c '^\[  FAILED  \] .* ([0-9]* ms)$' "$log")
      skipped=$(grep -c '^\[  SKIPPED \] .* ([0-9]* ms)$' "$log")
      if [ "$failed_tests" -gt 0 ]; then verdict="$failed_tests failed"
      elif grep -q '^\[  PASSED  \]' "$log"; then verdict="$ran passed, $skipped skipped"
      else verdict="no verdict"; fi
      [ "$shards" -gt 0 ] || { [ "$skipped" -gt 0 ] && verdict=skipped; }
      clean="NOT clean"
      if [ "$rc" -eq 0 ] && [[ "$verdict" =~ passed|skipped ]] &&
         [[ "$report" =~ (SUMMARY:\ 0\ errors|\ 0\ hazards) ]]; then
        clean=clean
      fi
      echo "$clean $name: exit $rc, ${report:-no summary}, $verdict, $((SECONDS - began)) s" >> "$summary"
    ) &
  done
  wait
  failed=$(grep -c "^NOT clean" "$summary")
  echo "$tool: ${#names[@]} $([ "$shards" -gt 0 ] && echo shards || echo tests)," \
    "$((SECONDS - start)) s, $failed not clean (JOBS=$jobs_at_once)"
  grep "^NOT clean" "$summary" | sort | sed 's/^/  /'
  [ "$failed" -eq 0 ] || status=1
done
exit $status
