#!/usr/bin/env python3
"""Writes two PyTorch transformer blocks, an input and PyTorch's output in
the safetensors format, for examples/pytorch_inference.cpp to load and
compare against:

  encoder_layer.safetensors      torch.nn.TransformerEncoderLayer(
                                 norm_first=True, batch_first=True, GELU)
  llama_block.safetensors        a Llama decoder layer in plain PyTorch
                                 (RMSNorm, rotary embeddings, grouped-query
                                 causal attention, SwiGLU; Hugging Face names
                                 under "model.layers.0.")
  <block>_io.safetensors         x, PyTorch's y = block(x), and in its
                                 __metadata__ the block's configuration

Every parameter is random (biases and norm weights too), from a fixed seed.
Uses the `safetensors` package when it is installed, else writes the format
itself (8-byte little-endian header length, JSON header, raw data).

    python3 examples/export_pytorch_block.py --out-dir build/examples/pytorch
    python3 examples/export_pytorch_block.py --out-dir build/examples/pytorch --dtype float32

With --check DIR it goes the other way: loads the blocks that
`pytorch_inference --save-dir DIR` wrote back from kfa into fresh PyTorch
modules (load_state_dict, strict) and checks that they reproduce y.
"""

import argparse
import json
import math
import os
import struct

import torch
import torch.nn.functional as F

DTYPES = {"float64": (torch.float64, "F64"), "float32": (torch.float32, "F32")}


def save_file(tensors, path, metadata):
    """safetensors.torch.save_file, or the same bytes written here."""
    try:
        from safetensors.torch import save_file as st_save
    except ImportError:
        st_save = None
    tensors = {k: v.detach().contiguous() for k, v in tensors.items()}
    if st_save is not None:
        st_save(tensors, path, metadata=metadata)
        return
    header, blobs, offset = {"__metadata__": metadata}, [], 0
    for name, t in tensors.items():
        blob = t.cpu().numpy().astype(t.cpu().numpy().dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": DTYPES[str(t.dtype).replace("torch.", "")][1],
                        "shape": list(t.shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def load_file(path):
    """(tensors, metadata) of a safetensors file, read here (no package needed)."""
    with open(path, "rb") as f:
        length = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(length))
        data = f.read()
    metadata = header.pop("__metadata__", {})
    types = {"F64": torch.float64, "F32": torch.float32}
    tensors = {}
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        tensors[name] = torch.frombuffer(bytearray(data[begin:end]),
                                         dtype=types[entry["dtype"]]).reshape(entry["shape"])
    return tensors, metadata


def randomize(module, generator):
    """Every parameter random: weights ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)),
    biases ~ U(-0.2, 0.2), norm weights ~ 1 + U(-0.2, 0.2)."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            u = torch.rand(p.shape, generator=generator, dtype=torch.float64) * 2 - 1
            if "norm" in name:
                p.copy_(1 + 0.2 * u)
            elif p.dim() == 1:
                p.copy_(0.2 * u)
            else:
                p.copy_(u / math.sqrt(p.shape[1]))


class RMSNorm(torch.nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class LlamaAttention(torch.nn.Module):
    def __init__(self, d, heads, kv_heads, base):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.base = heads, kv_heads, d // heads, base
        self.q_proj = torch.nn.Linear(d, heads * self.head_dim, bias=False)
        self.k_proj = torch.nn.Linear(d, kv_heads * self.head_dim, bias=False)
        self.v_proj = torch.nn.Linear(d, kv_heads * self.head_dim, bias=False)
        self.o_proj = torch.nn.Linear(heads * self.head_dim, d, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        # Hugging Face's rotary embedding: half-split pairs, angles in fp64 here.
        f64 = {"dtype": torch.float64, "device": x.device}
        inv_freq = 1.0 / (self.base ** (torch.arange(0, self.head_dim, 2, **f64) / self.head_dim))
        angles = torch.outer(torch.arange(s, **f64), inv_freq)
        emb = torch.cat((angles, angles), dim=-1)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.heads // self.kv_heads
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(o.transpose(1, 2).reshape(b, s, -1))


class LlamaMLP(torch.nn.Module):
    def __init__(self, d, d_ff):
        super().__init__()
        self.gate_proj = torch.nn.Linear(d, d_ff, bias=False)
        self.up_proj = torch.nn.Linear(d, d_ff, bias=False)
        self.down_proj = torch.nn.Linear(d_ff, d, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaBlock(torch.nn.Module):
    def __init__(self, d, heads, kv_heads, d_ff, eps, base):
        super().__init__()
        self.self_attn = LlamaAttention(d, heads, kv_heads, base)
        self.mlp = LlamaMLP(d, d_ff)
        self.input_layernorm = RMSNorm(d, eps)
        self.post_attention_layernorm = RMSNorm(d, eps)

    def forward(self, x):
        h = x + self.self_attn(self.input_layernorm(x))
        return h + self.mlp(self.post_attention_layernorm(h))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", default=".")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float64")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seqlen", type=int, default=37)
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2, help="Llama block only")
    parser.add_argument("--d-ff", type=int, default=96)
    parser.add_argument("--check", metavar="DIR",
                        help="load the blocks kfa saved in DIR and compare with --out-dir's y")
    args = parser.parse_args()
    dtype = DTYPES[args.dtype][0]
    os.makedirs(args.out_dir, exist_ok=True)
    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    eps = 1e-5
    common = {"dtype": args.dtype, "d_model": str(args.d_model), "heads": str(args.heads),
              "d_ff": str(args.d_ff), "norm_eps": repr(eps), "format": "pt"}

    encoder = torch.nn.TransformerEncoderLayer(
        args.d_model, args.heads, dim_feedforward=args.d_ff, dropout=0.0, activation="gelu",
        batch_first=True, norm_first=True, layer_norm_eps=eps, dtype=dtype)
    llama = LlamaBlock(args.d_model, args.heads, args.kv_heads, args.d_ff, eps, 10000.0).to(dtype)
    blocks = {
        "encoder_layer": (encoder, "", dict(common, names="pytorch", norm="layer_norm",
                                             activation="gelu", bias="1", kv_heads=str(args.heads),
                                             fused_qkv="1", rotary="0", causal="0")),
        "llama_block": (llama, "model.layers.0.",
                        dict(common, names="llama", norm="rms_norm", activation="swiglu",
                             bias="0", kv_heads=str(args.kv_heads), fused_qkv="0", rotary="1",
                             rope_base="10000", causal="1")),
    }
    if args.check:
        status = 0
        for name, (block, prefix, _) in blocks.items():
            weights, _ = load_file(os.path.join(args.check, name + ".safetensors"))
            io, _ = load_file(os.path.join(args.out_dir, name + "_io.safetensors"))
            block.load_state_dict({k[len(prefix):]: v for k, v in weights.items()}, strict=True)
            block.eval()
            with torch.no_grad():
                diff = (block(io["x"].to(dtype)) - io["y"].to(dtype)).abs().max().item()
            print(f"{name}: saved by kfa, loaded by PyTorch (strict): max |y - y0| = {diff:.3g}")
            status |= diff != 0
        raise SystemExit(status)
    for name, (block, prefix, metadata) in blocks.items():
        randomize(block, generator)
        block.eval()
        x = torch.randn(args.batch, args.seqlen, args.d_model, generator=generator,
                        dtype=torch.float64).to(dtype)
        with torch.no_grad():
            y = block(x)
        weights = {prefix + k: v for k, v in block.state_dict().items()}
        path = os.path.join(args.out_dir, name + ".safetensors")
        save_file(weights, path, {"format": "pt"})
        save_file({"x": x, "y": y}, os.path.join(args.out_dir, name + "_io.safetensors"),
                  dict(metadata, prefix=prefix))
        print(f"{name}: {len(weights)} tensors ({args.dtype}) -> {path}; "
              f"x, y {list(x.shape)} max|y| {y.abs().max().item():.3g}")


if __name__ == "__main__":
    main()
