#!/bin/bash
# One device call over a folder of prebuilt CUDA binaries (built here, carried
# to the GPU machine): put kfa_unit_tests.xz, bench_device.xz (optionally
# bench_device_old.xz of the build before, bench_team_attention.xz) and
# bench_variants.py, bench_device.py, compute_sanitizer.sh in one folder with
# this script as run.sh, then on the GPU machine:
#   OUT=<results> bash <folder>/run.sh
# Steps, each skippable: the Cuda unit tests in TEST_SHARDS (4) shards
# (TEST_FILTER, TEST_TIMEOUT; SKIP_TESTS), the >2^31-element tests (SKIP_LARGE),
# bench_variants.py (VARIANT_FLAGS, VAR_TIMEOUT; SKIP_VARIANTS), the quick
# dense table of the old and the new build (DENSE_DTYPES; SKIP_DENSE);
# opt-in: FP32_VARIANTS=1 (fp32/fp64 softcap, dropout and window rows beside
# dense), SANITIZE=<tools> (compute_sanitizer.sh), TEAM_BENCH=1,
# HOST_BENCH=<seconds> with a host bundle (perf_tests/host_bundle.sh) in
# .device/carry/host, and for kfa::nn::TransformerBlock:
# kfa_nn_tests.xz when present (NN_FILTER, NN_TIMEOUT; SKIP_NN_TESTS),
# PYTORCH_COMPARE=1 (compare_pytorch_block.xz with run_pytorch_compare.sh,
# compare_pytorch_block.py and examples/export_pytorch_block.py in the
# folder; COMPARE_FLAGS go to the script, e.g. --dtype float32) and
# BLOCK_BENCH=1 (bench_block.xz with bench_block.py and
# export_pytorch_block.py; BLOCK_FLAGS, e.g. --causal or --block llama;
# BLOCK_TIMEOUT).

set -uo pipefail
C="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT=${OUT:-/tmp/out}
mkdir -p /tmp/bin
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv
for f in $C/*.xz; do [ -e "$f" ] && xz -dc "$f" > /tmp/bin/$(basename "$f" .xz) && chmod +x /tmp/bin/$(basename "$f" .xz); done
ls -la /tmp/bin
if [ -z "${SKIP_TESTS:-}" ] && [ -x /tmp/bin/kfa_unit_tests ]; then
  shards=${TEST_SHARDS:-4}
  echo "== unit tests, $shards shards"
  F="${TEST_FILTER:-*/0.*:*/1.*:*/2.*:*/3.*:*Cuda*:Varlen.*:KernelChoice.*:NonFinite.*}"
  t0=$SECONDS
  for ((i = 0; i < shards; ++i)); do
    GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i timeout ${TEST_TIMEOUT:-300} /tmp/bin/kfa_unit_tests \
      --gtest_filter="$F" --gtest_brief=1 > $OUT/unit_tests_$i.log 2>&1 &
  done
  wait
  echo "shards took $((SECONDS - t0)) s"
  cat $OUT/unit_tests_*.log | grep -E "FAILED|PASSED|tests ran|Failure|rror|SKIPPED \]" | sort | uniq -c | head -80
  if [ -z "${SKIP_LARGE:-}" ]; then
    echo "== large tensors"
    t0=$SECONDS
    KFA_TEST_LARGE=1 timeout 200 /tmp/bin/kfa_unit_tests --gtest_filter='LargeTensors.*' > $OUT/large.log 2>&1
    echo "rc=$? took $((SECONDS - t0)) s"; grep -E "OK|FAILED|Failure|differs|zero|rror" $OUT/large.log | head -30
  fi
fi
if [ -z "${SKIP_VARIANTS:-}" ] && [ -x /tmp/bin/bench_device ]; then
  echo "== variants ${VARIANT_FLAGS:-}"
  PYTHONUNBUFFERED=1 timeout ${VAR_TIMEOUT:-300} python3 $C/bench_variants.py --exe /tmp/bin/bench_device \
    --json $OUT/variants.json ${VARIANT_FLAGS:-} 2>&1 | tee $OUT/variants.log | grep -v Warning
fi
if [ -z "${SKIP_DENSE:-}" ] && [ -x /tmp/bin/bench_device_old ]; then
  for exe in bench_device_old bench_device; do
    echo "== dense $exe"
    PYTHONUNBUFFERED=1 timeout 200 python3 $C/bench_device.py --exe /tmp/bin/$exe --set quick --dtypes ${DENSE_DTYPES:-bf16} \
      --json $OUT/dense_$exe.json 2>&1 | tail -25
  done
fi
if [ -n "${FP32_VARIANTS:-}" ] && [ -x /tmp/bin/bench_device ]; then
  # fp32 and fp64 variants against the same type's dense rate (random inputs,
  # B 2, N 4096, H 16, d 128, causal): the issue's ">= 0.8x dense" check.
  echo "== fp32/fp64 variants"
  for dt in fp32 fp64; do
    for v in "" "--softcap 30" "--dropout 0.1" "--window 1024,0"; do
      printf '%s %-14s ' "$dt" "${v:-dense}"
      timeout 60 /tmp/bin/bench_device --dtype $dt --batch 2 --seqlen 4096 --heads 16 --head-dim 128 \
        --causal --random --iters 10 --warmup 2 $v 2>&1 | grep -o '"fwd_ms.*"fwd_bwd_ms": [0-9.e+-]*' || echo failed
    done
  done
fi
if [ -n "${SANITIZE:-}" ] && [ -x /tmp/bin/kfa_unit_tests ]; then
  echo "== compute-sanitizer ${SANITIZE}"
  OUT=$OUT/sanitizer timeout ${SAN_TIMEOUT:-200} bash $C/compute_sanitizer.sh /tmp/bin/kfa_unit_tests "$SANITIZE"
  tail -n 30 $OUT/sanitizer/*.log | grep -E "ERROR|Invalid|RACE|Hazard|SUMMARY|at 0x|by thread" | head -30
fi
if [ -n "${HOST_BENCH:-}" ] && [ -d .device/carry/host ]; then
  echo "== host bench"
  OUT=$OUT/host KFA_HOST_BENCH_SECONDS=${HOST_BENCH} bash .device/carry/host/run_host.sh 2>&1 | tail -80
fi
if [ -n "${TEAM_BENCH:-}" ] && [ -x /tmp/bin/bench_team_attention ]; then
  echo "== team attention"
  for st in "" "--stage"; do
    timeout 120 /tmp/bin/bench_team_attention --type float --problems 100000 --shapes 8x4,4x8,1x32 $st --repeat 5 2>&1 | tail -8
  done
  timeout 60 /tmp/bin/bench_team_attention --type float --problems 100000 --nq 1 --nk 64 --shapes 1x32 --repeat 5 2>&1 | tail -3
fi
if [ -z "${SKIP_NN_TESTS:-}" ] && [ -x /tmp/bin/kfa_nn_tests ]; then
  echo "== kfa::nn tests ${NN_FILTER:-}"
  t0=$SECONDS
  timeout ${NN_TIMEOUT:-240} /tmp/bin/kfa_nn_tests --gtest_filter="${NN_FILTER:-*}" --gtest_brief=1 \
    > $OUT/nn_tests.log 2>&1
  echo "rc=$? took $((SECONDS - t0)) s"
  grep -E "FAILED|PASSED|tests ran|Failure|rror|SKIPPED \]" $OUT/nn_tests.log | sort | uniq -c | head -60
fi
if [ -n "${PYTORCH_COMPARE:-}" ] && [ -x /tmp/bin/compare_pytorch_block ]; then
  echo "== kfa::nn::TransformerBlock against PyTorch (forward and gradients)"
  OUT=$OUT timeout ${COMPARE_TIMEOUT:-300} bash $C/run_pytorch_compare.sh /tmp/bin/compare_pytorch_block \
    ${COMPARE_FLAGS:-} > $OUT/pytorch_compare.log 2>&1
  echo "rc=$?"; grep -E "^== |FAILED|skipped|^ok" $OUT/pytorch_compare.log | cut -c1-160
fi
if [ -n "${BLOCK_BENCH:-}" ] && [ -x /tmp/bin/bench_block ]; then
  echo "== block bench ${BLOCK_FLAGS:-}"
  PYTHONUNBUFFERED=1 timeout ${BLOCK_TIMEOUT:-540} python3 $C/bench_block.py --bench /tmp/bin/bench_block \
    --shapes gpt,science --json $OUT/block.json ${BLOCK_FLAGS:-} 2>&1 | tee $OUT/block.log | grep -v Warning
fi
