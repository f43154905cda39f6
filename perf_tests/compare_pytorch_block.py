#!/usr/bin/env python3
"""Writes the PyTorch side of the gradient comparison that
perf_tests/compare_pytorch_block.cpp checks kfa::nn::TransformerBlock
against: for each case and dtype one safetensors file
<out-dir>/<case>_<dtype>.safetensors holding

  the block's weights      (PyTorch's or Hugging Face Llama names, in dtype)
  x, dy                    the input and a random upstream gradient (dtype)
  ref.y, ref.dx,           the fp64 oracle: the same block, weights, x and dy
  ref.grad.<weight name>   (the dtype's values upcast), run in fp64 on the CPU
  torch.y, torch.dx,       PyTorch in dtype on --device (the "plain
  torch.grad.<name>        implementation in the same precision")

and in its __metadata__ the block's configuration. Cases (awkward shapes:
d_model 96, 6 heads, seqlen 77, batch 2 by default):

  encoder          torch.nn.TransformerEncoderLayer(norm_first=True,
                   batch_first=True, activation="gelu", dropout=0)
  encoder_causal   the same with a causal mask (is_causal=True)
  llama            a Llama decoder layer in plain PyTorch (RMSNorm,
                   half-split rotary, 6 query heads over 2 key/value heads,
                   causal, SwiGLU, no biases; examples/export_pytorch_block.py)

Every parameter is random (biases and norm weights too). The fp64 oracle is
computed from the values rounded to dtype, so kfa, PyTorch-in-dtype and the
oracle see the same inputs.

    python3 perf_tests/compare_pytorch_block.py --out-dir DIR \\
        [--dtype float32,bfloat16] [--device cpu|cuda] [--case encoder,llama]

perf_tests/run_pytorch_compare.sh runs this and the C++ check in one command.
"""

import argparse
import copy
import json
import os
import struct
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
# The blocks and their initialisation are the export example's (in a bundle
# the two scripts sit side by side).
sys.path[:0] = [os.path.join(HERE, "..", "examples"), HERE]
from export_pytorch_block import LlamaBlock, randomize  # noqa: E402

DTYPES = {"float64": (torch.float64, "F64"), "float32": (torch.float32, "F32"),
          "bfloat16": (torch.bfloat16, "BF16"), "float16": (torch.float16, "F16")}
CASES = ("encoder", "encoder_causal", "llama")


def save_file(tensors, path, metadata):
    """The safetensors format, written here for every dtype (little-endian
    host assumed): 8-byte header length, JSON header, raw data."""
    header, blobs, offset = {"__metadata__": metadata}, [], 0
    for name, t in tensors.items():
        t = t.detach().cpu().contiguous()
        blob = t.reshape(-1).view(torch.uint8).numpy().tobytes()
        code = DTYPES[str(t.dtype).replace("torch.", "")][1]
        header[name] = {"dtype": code, "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path + ".partial", "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)
    os.replace(path + ".partial", path)


def build(case, args, dtype):
    """(module, weight prefix, metadata, forward(module, x)) of one case."""
    eps = 1e-5
    meta = {"d_model": args.d_model, "heads": args.heads, "d_ff": args.d_ff, "norm_eps": repr(eps)}
    if case.startswith("encoder"):
        causal = case == "encoder_causal"
        block = torch.nn.TransformerEncoderLayer(
            args.d_model, args.heads, dim_feedforward=args.d_ff, dropout=0.0,
            activation="gelu", batch_first=True, norm_first=True, layer_norm_eps=eps,
            dtype=dtype)
        meta.update(names="pytorch", norm="layer_norm", activation="gelu", bias=1,
                    kv_heads=args.heads, fused_qkv=1, rotary=0, causal=int(causal))

        def forward(module, x):
            if not causal:
                return module(x)
            mask = torch.nn.Transformer.generate_square_subsequent_mask(
                x.shape[1], device=x.device, dtype=x.dtype)
            return module(x, src_mask=mask, is_causal=True)
        return block, "", meta, forward
    block = LlamaBlock(args.d_model, args.heads, args.kv_heads, args.d_ff, eps, 10000.0).to(dtype)
    meta.update(names="llama", norm="rms_norm", activation="swiglu", bias=0,
                kv_heads=args.kv_heads, fused_qkv=0, rotary=1, rope_base=10000, causal=1)
    return block, "model.layers.0.", meta, lambda module, x: module(x)


def forward_backward(module, forward, x, dy):
    """y, dx and every parameter's gradient (by state_dict name) of one
    training-mode forward and backward."""
    module.train()
    module.zero_grad(set_to_none=True)
    x = x.detach().clone().requires_grad_(True)
    y = forward(module, x)
    y.backward(dy)
    grads = {name: p.grad.detach() for name, p in module.named_parameters()}
    return y.detach(), x.grad.detach(), grads


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out-dir", required=True)
    p.add_argument("--dtype", default="float32", help="comma-separated: " + ",".join(DTYPES))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                   help="where PyTorch runs in --dtype (the oracle runs on the CPU in fp64)")
    p.add_argument("--case", default=",".join(CASES))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seqlen", type=int, default=77)
    p.add_argument("--d-model", type=int, default=96)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--kv-heads", type=int, default=2, help="the Llama block's")
    p.add_argument("--d-ff", type=int, default=160)
    args = p.parse_args()
    # PyTorch's plain fp32 is what the rule compares against: no TF32 products.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    os.makedirs(args.out_dir, exist_ok=True)
    for case in args.case.split(","):
        if case not in CASES:
            p.error(f"unknown case {case} (cases: {', '.join(CASES)})")
        for dtype_name in args.dtype.split(","):
            dtype = DTYPES[dtype_name][0]
            generator = torch.Generator().manual_seed(args.seed)
            block64, prefix, meta, forward = build(case, args, torch.float64)
            randomize(block64, generator)
            shape = (args.batch, args.seqlen, args.d_model)
            x = torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype)
            dy = torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype)
            # The tested precision's values, and the oracle on exactly them.
            block = copy.deepcopy(block64).to(dtype)
            oracle = copy.deepcopy(block).to(torch.float64)
            ref = forward_backward(oracle, forward, x.double(), dy.double())
            got = forward_backward(block.to(args.device), forward, x.to(args.device),
                                   dy.to(args.device))
            tensors = {prefix + k: v for k, v in block.state_dict().items()}
            tensors.update(x=x, dy=dy)
            for tag, (y, dx, grads) in (("ref", ref), ("torch", got)):
                tensors[tag + ".y"], tensors[tag + ".dx"] = y, dx
                tensors.update({f"{tag}.grad.{prefix}{k}": g for k, g in grads.items()})
            meta_all = {k: str(v) for k, v in meta.items()}
            meta_all.update(case=case, dtype=dtype_name, prefix=prefix, format="pt",
                            torch_version=torch.__version__, torch_device=args.device,
                            batch=str(args.batch), seqlen=str(args.seqlen))
            path = os.path.join(args.out_dir, f"{case}_{dtype_name}.safetensors")
            save_file(tensors, path, meta_all)
            err = max((a.double().cpu() - b).abs().max().item() for a, b in zip(got[:2], ref[:2]))
            print(f"{case} {dtype_name} ({args.device}): {len(grads)} parameter gradients, "
                  f"PyTorch's max error on y and dx {err:.3g} -> {path}", flush=True)


if __name__ == "__main__":
    main()
