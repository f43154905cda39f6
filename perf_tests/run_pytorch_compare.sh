#!/usr/bin/env bash
# kfa::nn::TransformerBlock against PyTorch, forward and backward, in one
# command: compare_pytorch_block.py writes the blocks, inputs, PyTorch's and
# the fp64 oracle's outputs and gradients, compare_pytorch_block runs kfa on
# them and checks y, dx and every parameter gradient with FlashAttention's
# rule (error <= 2x PyTorch's in the same dtype + a floor); exit status 1 if
# a tensor fails.
#
#   perf_tests/run_pytorch_compare.sh <build-dir | compare_pytorch_block> [compare_pytorch_block.py args]
#
# Default script arguments: --dtype float32,bfloat16 (a dtype kfa::nn lacks
# is reported skipped) and PyTorch on cuda when it sees a GPU; the data go
# to $OUT/pytorch_compare (default: a temporary folder). PYTHON picks the
# interpreter (python3), KFA_COMPARE_FLOOR the floor in eps x max|ref| (4).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
target="${1:?usage: run_pytorch_compare.sh <build-dir | compare_pytorch_block> [script args]}"
shift
exe="$target"
[ -d "$target" ] && exe="$target/perf_tests/compare_pytorch_block"
[ -x "$exe" ] || { echo "run_pytorch_compare.sh: no executable $exe" >&2; exit 2; }
if [ -n "${OUT:-}" ]; then
  data="$OUT/pytorch_compare"
else
  data="$(mktemp -d)/pytorch_compare"
fi
mkdir -p "$data"
rm -f "$data"/*.safetensors
args=("$@")
[[ " ${args[*]-} " == *" --dtype "* ]] || args+=(--dtype float32,bfloat16)
"${PYTHON:-python3}" "$here/compare_pytorch_block.py" --out-dir "$data" "${args[@]}"
"$exe" --dir "$data" --floor "${KFA_COMPARE_FLOOR:-4}"
