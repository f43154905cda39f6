#!/usr/bin/env bash
# GPU time of every kfa kernel in one forward, backward and forward+backward
# pass of bench_device (random inputs), from Nsight Compute:
#
#   perf_tests/kernel_times.sh <bench_device> [bench_device flags]
#   e.g. perf_tests/kernel_times.sh build/perf_tests/bench_device --dtype bf16 \
#          --batch 8 --seqlen 2048 --heads 16 --head-dim 128
#
# Prints one line per launch: the kernel (functor) name and its duration.
# The full ncu report goes to $OUT/kernel_times.txt (or ./device-out).
set -uo pipefail
exe="${1:?usage: $0 <bench_device> [bench_device flags]}"
shift
out="${OUT:-device-out}"
mkdir -p "$out"
timeout 300 ncu --clock-control none --metrics gpu__time_duration.sum "$exe" --random --iters 1 \
  --warmup 0 "$@" > "$out/kernel_times.txt" 2>&1
awk '/^  [a-zA-Z].*\(/ {
       n = $0
       if (match(n, /team_kernel<kfa::[A-Za-z0-9_]*/)) n = substr(n, RSTART + 17, RLENGTH - 17)
       else if (match(n, /ParallelFor<[^<,(]*/)) n = substr(n, RSTART + 12, RLENGTH - 12)
     }
     /gpu__time_duration.sum/ { print n, $(NF - 1), $NF }' "$out/kernel_times.txt" |
  grep -v "fill_random\|ViewValueFunctor\|probe\|run<\|query_cuda_kernel_arch\|init_lock_arrays\|^void  "
