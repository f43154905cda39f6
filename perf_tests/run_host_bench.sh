#!/usr/bin/env bash
# kfa's host kernels beside PyTorch's CPU SDPA on a machine that has PyTorch
# but no Kokkos or compiler: runs inside the bundle perf_tests/host_bundle.sh
# makes (bench_host, the libraries it needs with their own loader,
# bench_host.py, this script as run_host.sh).
#
#   OUT=<folder> bash <bundle>/run_host.sh
#
# Writes the table to $OUT/host_bench.txt (stderr to host_bench.err): one
# thread, then KFA_HOST_BENCH_THREADS (16) threads bound close to cores;
# fp32 and fp64, head_dim 64 and 128, causal and not, forward and
# forward+backward, batch 1, 16 heads; seqlen 512 and 2048, then 8192 at
# the full thread count (forward first). A stage still running when
# KFA_HOST_BENCH_SECONDS (390) have passed is stopped (its rows are lost) and
# the rest are skipped. KFA_HOST_BENCH_QUICK=1 runs a
# tiny set instead (a check that the bundle runs).
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${OUT:?set OUT to the output folder}"
threads="${KFA_HOST_BENCH_THREADS:-16}"
python="${PYTHON:-python3}"
budget="${KFA_HOST_BENCH_SECONDS:-390}"
table="$out/host_bench.txt"
mkdir -p "$out"
: > "$table"
start=$SECONDS
export OMP_PROC_BIND=close OMP_PLACES=cores

{
  echo "# $(date -u +%FT%TZ) $(uname -n)"
  echo "# $(grep -m1 'model name' /proc/cpuinfo) ($(nproc) CPUs)"
  echo "# $("$python" -c 'import torch; print("torch", torch.__version__, torch.backends.cpu.get_cpu_capability())' 2>&1 | tail -1)"
  echo "# bench_host: $(cat "$here/BUILD" 2>/dev/null)"
} | tee -a "$table"

stage() {
  local left=$((budget - (SECONDS - start)))
  if [ "$left" -le 15 ]; then
    echo "# skipped (time budget): $*" | tee -a "$table"
    return
  fi
  echo "# bench_host.py $* (${left}s left)" | tee -a "$table"
  timeout "$left" "$python" "$here/bench_host.py" --bench "$here/bench_host.sh" "$@" \
    2>>"$out/host_bench.err" | tee -a "$table"
  echo "# stage took $((SECONDS - start))s since start" | tee -a "$table"
}

if [ "${KFA_HOST_BENCH_QUICK:-0}" = 1 ]; then
  stage --threads 1,2 --seqlen 256 --heads 2 --repeat 1
else
  # One call per thread count and type, fp32 first (the issue's targets):
  # a stage cut by the budget loses only its own rows.
  for type in float double; do
    stage --type "$type" --threads 1 --seqlen 512,2048 --repeat 2
    stage --type "$type" --threads "$threads" --seqlen 512,2048 --repeat 3
  done
  for pass in fwd fwd+bwd; do
    for type in float double; do
      stage --type "$type" --threads "$threads" --seqlen 8192 --pass "$pass" --repeat 1
    done
  done
fi
echo "# done in $((SECONDS - start))s" | tee -a "$table"
