#!/usr/bin/env bash
# Ring attention on a machine with one GPU and Open MPI, from a prebuilt CUDA
# build of kfa (KFA_ENABLE_MPI=ON, targets kfa_ring_tests and bench_ring;
# KFA_ENABLE_NCCL=ON optional):
#
#   perf_tests/run_ring_device.sh <cuda-build-dir> [bench_ring flags]
#
# 1. the ring unit tests on 2 ranks sharing the GPU (transport mpi: device
#    buffers when Open MPI is CUDA-aware, host-staged otherwise; the tests
#    also force the host-staged path);
# 2. bench_ring with P = 1 and 2 on the MPI transport, P = 2 host-staged for
#    comparison, and, when kfa was built with NCCL, P = 1 on NCCL (NCCL
#    needs one GPU per rank: P = 2 runs only where there are 2 GPUs).
# Default bench flags: --seqlen 16384 --heads 16 --head-dim 128 --causal --zigzag.
# Every step runs even when one fails; the exit status says whether all passed.
set -uo pipefail
build="${1:?usage: $0 <cuda-build-dir> [bench_ring flags]}"
shift
tests="$build/unit_tests/kfa_ring_tests"
bench="$build/perf_tests/bench_ring"
for exe in "$tests" "$bench"; do
  [ -x "$exe" ] || { echo "missing $exe: build the kfa_ring_tests and bench_ring targets" >&2; exit 2; }
done
flags=("$@")
if [ "${#flags[@]}" -eq 0 ]; then
  flags=(--seqlen 16384 --heads 16 --head-dim 128 --causal --zigzag)
fi

# Open MPI: allow root (containers), 2 ranks on one GPU share its cores.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpi=(mpirun --oversubscribe --bind-to none)
gpus=$(nvidia-smi -L 2>/dev/null | grep -c "^GPU" || true)
nccl=0
grep -q "define KFA_ENABLE_NCCL 1" "$build/include/kfa/kfa_config.hpp" 2>/dev/null && nccl=1
cuda_aware=$(ompi_info --parsable --all 2>/dev/null |
  grep -m1 "mpi_built_with_cuda_support:value" | cut -d: -f7)
echo "GPUs: ${gpus:-?}; Open MPI built with CUDA support: ${cuda_aware:-unknown}; kfa NCCL: $nccl"
nvidia-smi -L 2>/dev/null

status=0
step() {
  echo
  echo "== $1"
  shift
  echo "+ $*"
  "$@" || { echo "FAILED: $*"; status=1; }
}

step "ring unit tests, 2 ranks sharing the GPU" "${mpi[@]}" -np 2 "$tests"
for p in 1 2; do
  step "bench_ring, P = $p, MPI transport" "${mpi[@]}" -np "$p" "$bench" "${flags[@]}" --transport mpi
done
step "bench_ring, P = 2, MPI through pinned host buffers" \
  "${mpi[@]}" -np 2 "$bench" "${flags[@]}" --transport staged --no-weak
if [ "$nccl" = 1 ]; then
  step "bench_ring, P = 1, NCCL transport" "${mpi[@]}" -np 1 "$bench" "${flags[@]}" --transport nccl
  if [ "${gpus:-0}" -ge 2 ]; then
    step "bench_ring, P = 2, NCCL transport" "${mpi[@]}" -np 2 "$bench" "${flags[@]}" --transport nccl
  else
    echo
    echo "== bench_ring, P = 2, NCCL transport: skipped (NCCL needs one GPU per rank, found ${gpus:-0})"
  fi
fi
echo
[ "$status" = 0 ] && echo "all steps passed" || echo "some steps FAILED"
exit "$status"
