#!/usr/bin/env python3
"""GPU harness for the attention variants: kfa beside its anchors, in one run.

Each row runs kfa (bench_device with the variant's flags) and the anchor the
issue names on the same inputs: FlexAttention (torch.compile(flex_attention)
with a block mask) for windows, softcap, ALiBi, a user score modifier and a
document mask; SDPA flash for dropout; SDPA flash and cuDNN for the dense
reference and odd head dims. Packed rows run kfa's varlen entry points on
the documents (bench_device --packed) beside FlexAttention's document mask
on the same packed tensor, and, for many short sequences, beside SDPA on the
sequences padded to the longest (efficient attention with a key-padding mask;
the padding and unpadding copies are not timed). O, dQ, dK and dV of kfa and of the anchor are
checked against an fp64 reference of the same variant on batch 0, heads 0-1
(max-abs error; dropout rows are timed only: its mask is kfa's own, which the
unit tests check). Document rows check the first documents up to 4096 rows.

  python3 perf_tests/bench_variants.py --exe build-cuda/perf_tests/bench_device

Times are medians of GPU time between CUDA events (as bench_device.py takes
them), forward and forward+backward. FLOPs are not compared: the ratio column
is anchor time / kfa time on the same shape (> 1: kfa is faster).
"""
import argparse
import json
import math
import os
import subprocess
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_device import cuda_times_ms, max_err, read, write  # noqa: E402

try:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    flex = torch.compile(flex_attention, dynamic=False)
except ImportError:  # an older PyTorch: the FlexAttention columns stay empty
    flex = None

REL_RADIUS = 128


def document_ids(lengths, device):
    return torch.cat([torch.full((n,), i, dtype=torch.int32, device=device)
                      for i, n in enumerate(lengths)])


def rows(args):
    """(name, shape (B, N, H, D), causal, kfa flags, variant description, anchors)."""
    big = (2, 8192, 16, 128)
    gen = torch.Generator().manual_seed(7)
    doc_lengths = [int(x) for x in torch.randint(512, 1700, (16,), generator=gen)]
    short_lengths = [int(x) for x in torch.randint(16, 129, (4096,), generator=gen)]
    out = [
        ("dense causal", big, True, [], {}, ("cudnn", "flash", "flex")),
        ("window 1024 back, causal", big, True, ["--window", "1024,-1"], {"window": 1024},
         ("flex",)),
        ("softcap 30, causal", big, True, ["--softcap", "30"], {"softcap": 30.0}, ("flex",)),
        ("dropout 0.1, causal", big, True, ["--dropout", "0.1"], {"dropout": 0.1},
         ("flash",)),
        ("ALiBi, causal", big, True, ["--mod", "alibi"], {"alibi": True}, ("flex",)),
        ("relative bias (score mod), causal", big, True, ["--mod", "relbias"], {"relbias": True},
         ("flex",)),
        ("16 documents of 0.5-1.7k, causal", (1, sum(doc_lengths), 16, 128), True,
         ["--mod", "document"], {"documents": doc_lengths}, ("flex",)),
        ("head_dim 96, not causal", (1, 4096, 16, 96), False, [], {}, ("cudnn", "flash")),
    ] + [
        (f"head_dim {d}, not causal", (1, 4096, 16, d), False, [], {}, ("cudnn", "flash"))
        for d in (32, 80, 160, 192)
    ] + [
        ("16 documents of 0.5-1.7k, packed (varlen), causal", (1, sum(doc_lengths), 16, 128),
         True, ["--packed", "16"], {"documents": doc_lengths, "packed": True}, ("flex",)),
        (f"{len(short_lengths)} sequences of 16-128 (varlen), d 64", (1, sum(short_lengths), 8, 64),
         False, ["--packed", str(len(short_lengths))],
         {"documents": short_lengths, "packed": True}, ("flex", "padded")),
        # The compiled head dim at the odd head dims' shape: what padding costs.
        ("head_dim 128, not causal (reference)", (1, 4096, 16, 128), False, [], {},
         ("cudnn", "flash")),
        # Variants at head_dim 256 (the product-split backward).
        ("softcap 30, d 256, causal", (1, 4096, 16, 256), True, ["--softcap", "30"],
         {"softcap": 30.0}, ("flex",)),
        ("dropout 0.1, d 256, causal", (1, 4096, 16, 256), True, ["--dropout", "0.1"],
         {"dropout": 0.1}, ("flash",)),
        # The mma.sync kernels (what GPUs without Hopper code run).
        ("dropout 0.1, causal, mma.sync", big, True, ["--dropout", "0.1", "--no-wgmma"],
         {"dropout": 0.1}, ("flash",)),
    ]
    if args.rows:
        keep = [int(x) for x in args.rows.split(",")]
        out = [r for i, r in enumerate(out) if i in keep]
    return out


def score_transform(var, n, heads, device, rel):
    """The variant as a function of fp64 scores [B][H][N][N] (bottom-right = top-left here)."""
    i = torch.arange(n, device=device)[:, None]
    j = torch.arange(n, device=device)[None, :]

    def apply(s, h0=0):
        if "softcap" in var:
            s = var["softcap"] * torch.tanh(s / var["softcap"])
        if var.get("alibi"):
            slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)],
                                  dtype=torch.float32, device=device).double()
            sl = slopes[h0:h0 + s.shape[1]][None, :, None, None]
            s = s - sl * (i - j).abs()
        if var.get("relbias"):
            r = (j - i).clamp(-REL_RADIUS, REL_RADIUS) + REL_RADIUS
            s = s + rel[h0:h0 + s.shape[1]].double()[:, r]
        if "documents" in var:
            doc = document_ids(var["documents"], device)
            s = s.masked_fill(doc[:, None] != doc[None, :], -math.inf)
        if "window" in var:
            s = s.masked_fill(i - j > var["window"], -math.inf)
        return s
    return apply


def flex_mods(var, heads, device, rel, is_causal=True):
    """(score_mod, mask_mod) for FlexAttention."""
    causal = lambda b, h, q, kv: q >= kv
    mask_mod, score_mod = causal, None
    if "window" in var:
        w = var["window"]
        mask_mod = lambda b, h, q, kv: (q >= kv) & (q - kv <= w)
    if "documents" in var:
        doc = document_ids(var["documents"], device)
        if is_causal:
            mask_mod = lambda b, h, q, kv: (q >= kv) & (doc[q] == doc[kv])
        else:
            mask_mod = lambda b, h, q, kv: doc[q] == doc[kv]
    if "softcap" in var:
        cap = var["softcap"]
        score_mod = lambda s, b, h, q, kv: cap * torch.tanh(s / cap)
    if var.get("alibi"):
        slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)],
                              dtype=torch.float32, device=device)
        score_mod = lambda s, b, h, q, kv: s - slopes[h] * (q - kv).abs()
    if var.get("relbias"):
        score_mod = lambda s, b, h, q, kv: s + rel[h, (kv - q).clamp(-REL_RADIUS, REL_RADIUS)
                                                   + REL_RADIUS]
    return score_mod, mask_mod


def reference(q, k, v, do, causal, transform):
    """fp64 O, dQ, dK, dV on batch 0, heads 0-1 (inputs [B][N][H][D])."""
    qs, ks, vs = (x[:1, :, :2].double().transpose(1, 2).detach().requires_grad_(True)
                  for x in (q, k, v))
    dos = do[:1, :, :2].double().transpose(1, 2)
    s = qs @ ks.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1), -math.inf)
    o = torch.softmax(transform(s), dim=-1) @ vs
    o.backward(dos)
    t = lambda x: x.transpose(1, 2).detach()
    return t(o), t(qs.grad), t(ks.grad), t(vs.grad)


def errors(outs, ref):
    """Max-abs errors of (O, dQ, dK, dV) on the reference's slice."""
    return [max_err(a[:1, :, :2], r) for a, r in zip(outs, ref)]


def anchor_run(kind, q, k, v, do, causal, var, block_mask, score_mod):
    """(fwd ms, fwd+bwd ms, (O, dQ, dK, dV)) of one anchor; inputs [B][N][H][D]."""
    qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_(True) for x in (q, k, v))
    dot = do.transpose(1, 2)
    p = var.get("dropout", 0.0)
    if kind == "flex":
        call = lambda: flex(qt, kt, vt, score_mod=score_mod, block_mask=block_mask)
        ctx = None
    elif kind == "padded":
        return padded_run(q, k, v, do, causal, var["documents"])
    else:
        backend = SDPBackend.CUDNN_ATTENTION if kind == "cudnn" else SDPBackend.FLASH_ATTENTION
        call = lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, dropout_p=p)
        ctx = backend

    def fwd_bwd():
        qt.grad = kt.grad = vt.grad = None
        call().backward(dot)

    def timed():
        out = call()
        ms = cuda_times_ms([call, fwd_bwd], interleaved=True)
        fwd_bwd()
        t = lambda x: x.transpose(1, 2).detach()
        return ms[0], ms[1], (t(out), t(qt.grad), t(kt.grad), t(vt.grad))
    try:
        if ctx is None:
            return timed()
        with sdpa_kernel(ctx):
            return timed()
    except Exception as e:  # a backend that refuses the shape or fails to compile
        print(f"  {kind}: not run ({str(e).splitlines()[0][:100]})", flush=True)
        return None


def padded_run(q, k, v, do, causal, lengths):
    """SDPA on the packed sequences padded to the longest: [S][H][L][D] with a
    key-padding mask (efficient attention, which takes a mask); the copies
    in and out of the padded layout are not timed."""
    dev, (_, n, h, d) = q.device, q.shape
    s, longest = len(lengths), max(lengths)
    lens = torch.tensor(lengths, device=dev)
    starts = torch.cumsum(lens, 0) - lens
    pos = torch.arange(longest, device=dev)
    valid = pos[None, :] < lens[:, None]                        # [S][L]
    rows = (starts[:, None] + pos[None, :]).clamp(max=n - 1)    # [S][L]
    pad = lambda x: (x[0][rows] * valid[..., None, None]).transpose(1, 2).contiguous()
    qp, kp, vp = (pad(x).detach().requires_grad_(True) for x in (q, k, v))
    dop = pad(do)
    mask = valid[:, None, None, :]
    if causal:
        mask = mask & torch.ones(longest, longest, dtype=torch.bool, device=dev).tril()
    call = lambda: F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask)

    def fwd_bwd():
        qp.grad = kp.grad = vp.grad = None
        call().backward(dop)

    def unpad(x):  # [S][H][L][D] -> [1][N][H][D]
        out = torch.zeros(1, n, h, d, dtype=x.dtype, device=dev)
        out[0][rows[valid]] = x.transpose(1, 2)[valid]
        return out
    try:
        with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
            out = call()
            ms = cuda_times_ms([call, fwd_bwd], interleaved=True)
            fwd_bwd()
    except Exception as e:
        print(f"  padded: not run ({str(e).splitlines()[0][:100]})", flush=True)
        return None
    return ms[0], ms[1], tuple(unpad(x.detach()) for x in (out, qp.grad, kp.grad, vp.grad))


def doc_prefix(var, n_ref):
    """The documents inside the first n_ref rows."""
    rows = 0
    for length in var["documents"]:
        if rows >= n_ref:
            return
        rows += length
        yield length


def reference_rows(var, n):
    """Rows the fp64 reference covers: all, or with documents the first
    whole documents up to 4096 rows (documents see only themselves)."""
    if "documents" not in var:
        return n
    rows = 0
    for length in var["documents"]:
        if rows + length > 4096 and rows > 0:
            break
        rows += length
    return rows


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--exe", required=True)
    p.add_argument("--dir", default="/dev/shm/kfa_variants")
    p.add_argument("--rows", default="", help="comma-separated row indices (default: all)")
    p.add_argument("--no-wgmma", action="store_true", help="kfa on the mma.sync kernels")
    p.add_argument("--json", default="")
    args = p.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    dev = "cuda"
    results = []
    print(f"{torch.cuda.get_device_name()}, PyTorch {torch.__version__}", flush=True)
    for name, (B, N, H, D), causal, flags, var, anchors in rows(args):
        torch.manual_seed(0)
        q, k, v, do = (torch.randn(B, N, H, D, device=dev, dtype=torch.bfloat16)
                       for _ in range(4))
        rel = (torch.rand(H, 2 * REL_RADIUS + 1, device=dev) * 3 - 1.5)
        for t, f in ((q, "q"), (k, "k"), (v, "v"), (do, "do")):
            write(t, f"{args.dir}/{f}.bin")
        write(rel, f"{args.dir}/rel.bin")
        if "documents" in var:
            write(document_ids(var["documents"], dev).reshape(1, N), f"{args.dir}/doc.bin")
        if "packed" in var:
            lens = torch.tensor([0] + var["documents"], dtype=torch.int32)
            write(torch.cumsum(lens, 0, dtype=torch.int32), f"{args.dir}/cu.bin")
        cmd = [args.exe, "--dtype", "bf16", "--batch", str(B), "--seqlen", str(N), "--heads",
               str(H), "--head-dim", str(D), "--dir", args.dir, "--timing", "interleaved",
               "--iters", "10"] + (["--causal"] if causal else []) + flags
        if args.no_wgmma:
            cmd.append("--no-wgmma")
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            print(f"{name}: kfa failed: {r.stderr.strip()}", flush=True)
            continue
        kt = json.loads(r.stdout.strip().splitlines()[-1])
        row = {"row": name, "shape": [B, N, H, D], "causal": causal,
               "kfa_fwd_ms": kt["fwd_ms"], "kfa_fwd_bwd_ms": kt["fwd_bwd_ms"]}
        check = "dropout" not in var
        if check:
            shape4 = (B, N, H, D)
            kouts = [read(f"{args.dir}/{f}_kfa.bin", shape4, torch.bfloat16)
                     for f in ("o", "dq", "dk", "dv")]
            n_ref = reference_rows(var, N)
            ref_var = dict(var)
            if "documents" in var:
                ref_var["documents"] = var["documents"][:sum(1 for _ in doc_prefix(var, n_ref))]
            ref = reference(q[:, :n_ref], k[:, :n_ref], v[:, :n_ref], do[:, :n_ref], causal,
                            score_transform(ref_var, n_ref, H, dev, rel))
            row["kfa_err"] = errors([x[:, :n_ref] for x in kouts], ref)
        score_mod, mask_mod = flex_mods(var, H, dev, rel, causal) if flex else (None, None)
        block_mask = None
        if flex and "flex" in anchors and (causal or "documents" in var):
            try:  # compiled: long packed rows' masks are never materialised whole
                block_mask = create_block_mask(mask_mod, None, None, N, N, device=dev,
                                               _compile=N > 32768)
            except Exception as e:
                print(f"  flex block mask: not built ({str(e).splitlines()[0][:100]})",
                      flush=True)
                anchors = tuple(a for a in anchors if a != "flex")
        line = (f"{name:36s} B{B} N{N} H{H} D{D}: kfa {kt['fwd_ms']:8.3f} / "
                f"{kt['fwd_bwd_ms']:8.3f} ms")
        for a in anchors:
            res = anchor_run(a, q, k, v, do, causal, var, block_mask, score_mod)
            if res is None:
                continue
            fms, fbms, outs = res
            row[f"{a}_fwd_ms"], row[f"{a}_fwd_bwd_ms"] = fms, fbms
            line += (f" | {a} {fms:8.3f} / {fbms:8.3f} ({fms / kt['fwd_ms']:.2f}x / "
                     f"{fbms / kt['fwd_bwd_ms']:.2f}x)")
            if check:
                row[f"{a}_err"] = errors([x[:, :n_ref] for x in outs], ref)
        print(line, flush=True)
        if check:
            errs = "  err O/dQ/dK/dV: kfa " + " ".join(f"{e:.2e}" for e in row["kfa_err"])
            for a in anchors:
                if f"{a}_err" in row:
                    errs += f" | {a} " + " ".join(f"{e:.2e}" for e in row[f"{a}_err"])
            print(errs, flush=True)
        results.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
