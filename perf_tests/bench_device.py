#!/usr/bin/env python3
"""GPU harness: kfa against PyTorch SDPA on the same inputs, in one run.

For each config it draws q, k, v, dO with PyTorch on the GPU, runs kfa through
the bench_device executable (same inputs, written to /dev/shm), times
PyTorch's flash and cuDNN backends (bf16/fp16), efficient backend (fp32) or
math backend (fp64) with CUDA events, checks kfa's O, lse, dQ, dK, dV against
an fp64 reference on a slice of the problem (and reports PyTorch's own error
on the same slice: max-abs, and the ratio of root-mean-square errors), and
prints a table of TFLOP/s and ratios.

  python3 perf_tests/bench_device.py --exe build-cuda/perf_tests/bench_device [--set quick|full]

FLOP counts: 4·B·H·N²·D forward, 2.5x that backward, 3.5x forward+backward,
halved when causal. Times are medians after warm-up of GPU time between
CUDA events, recorded behind a kernel that keeps the GPU busy while the
host enqueues the work (for kfa and PyTorch alike), forward, backward and
forward+backward timed in turn (--timing interleaved) so that all three
see the same clocks; the anchors' backward alone is autograd's through one
retained forward graph.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
          "fp64": torch.float64}


def configs(which):
    """(dtype, batch, seqlen, heads, head_dim, causal[, heads_kv]): batch·seqlen = 16k
    tokens and heads·head_dim = 2048 for 16-bit types, as in the issue's anchor table;
    heads_kv < heads: grouped-query attention (the full set's last rows)."""
    out = []
    if which == "quick":
        for causal in (False, True):
            out.append(("bf16", 2, 8192, 16, 128, causal))
        out.append(("bf16", 16, 1024, 16, 128, False))
        out.append(("fp16", 2, 8192, 16, 128, False))
        for causal in (False, True):
            out.append(("bf16", 2, 8192, 32, 64, causal))
        for d in (64, 128):
            out.append(("fp32", 4, 4096, 2048 // d, d, False))
            out.append(("fp64", 8, 2048, 2048 // d, d, False))
        return out
    for dtype in ("bf16", "fp16"):
        for d in (64, 128, 256):
            seqlens = (512, 1024, 2048, 4096, 8192, 16384) if (dtype == "bf16" and d == 128) \
                else (2048, 8192)
            for n in seqlens:
                for causal in (False, True):
                    out.append((dtype, 16384 // n, n, 2048 // d, d, causal))
    for d in (64, 128):
        out.append(("fp32", 4, 4096, 2048 // d, d, False))
        out.append(("fp64", 8, 2048, 2048 // d, d, False))
    for causal in (False, True):  # Llama-style groups: 8 and 16 query heads per k/v head
        out.append(("bf16", 2, 8192, 16, 128, causal, 2))
        out.append(("bf16", 2, 8192, 32, 64, causal, 2))
    return out


def cuda_times_ms(fns, warmup=3, iters=10, interleaved=False):
    """Median ms of each of fns, GPU time between CUDA events: iters of the first,
    then of the second, ... or, interleaved, one of each in turn (so that a
    drift of the clocks over the run falls on all alike)."""
    def once(fn):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        # ~1 ms of a spinning kernel first: the GPU is still busy while the
        # host enqueues fn's work, so host-side costs that the GPU does not
        # wait for (cuDNN's graph lookup) stay out of the time, as in
        # bench_device's.
        torch.cuda._sleep(2_000_000)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)
    times = [[] for _ in fns]
    if interleaved:
        for _ in range(warmup):
            for fn in fns:
                fn()
        torch.cuda.synchronize()
        for _ in range(iters):
            for i, fn in enumerate(fns):
                times[i].append(once(fn))
    else:
        for i, fn in enumerate(fns):
            for _ in range(warmup):
                fn()
            torch.cuda.synchronize()
            times[i] = [once(fn) for _ in range(iters)]
    return [sorted(t)[len(t) // 2] for t in times]


def write(t, path):
    t = t.contiguous().cpu()
    if t.dtype in (torch.bfloat16, torch.float16):
        t = t.view(torch.int16)
    t.numpy().tofile(path)


def read(path, shape, dtype):
    import numpy as np
    if dtype in (torch.bfloat16, torch.float16):
        raw = torch.from_numpy(np.fromfile(path, dtype=np.int16)).view(dtype)
    else:
        raw = torch.from_numpy(np.fromfile(path, dtype=np.float32 if dtype == torch.float32
                                           else np.float64))
    return raw.reshape(shape).cuda()


def sdpa(q, k, v, causal):
    """SDPA on [B][H][N][D] inputs, k and v with fewer heads for grouped-query attention."""
    if k.shape[1] == q.shape[1]:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)


def sdpa_time(backend, q, k, v, do, causal, interleaved=False):
    """(fwd, bwd, fwd+bwd) median ms of SDPA with one backend; inputs [B][N][H][D].
    The backward alone is autograd's through one retained forward graph."""
    qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_(True) for x in (q, k, v))
    dot = do.transpose(1, 2)
    try:
        with sdpa_kernel(backend):
            out = sdpa(qt, kt, vt, causal)

            def bwd():
                torch.autograd.grad(out, (qt, kt, vt), dot, retain_graph=True)

            def fwd_bwd():
                qt.grad = kt.grad = vt.grad = None
                sdpa(qt, kt, vt, causal).backward(dot)
            return tuple(cuda_times_ms([lambda: sdpa(qt, kt, vt, causal), bwd, fwd_bwd],
                                       interleaved=interleaved))
    except RuntimeError as e:
        return None, None, None


def slice_heads(q, k):
    """Heads of the checked slice: 2 query heads and theirs k/v heads, or with grouped-query
    attention the first k/v head and its group of query heads."""
    group = q.shape[2] // k.shape[2]
    return (2, 2) if group == 1 else (group, 1)


def reference_slice(q, k, v, do, causal, nb=1):
    """fp64 O, lse, dQ, dK, dV on batch [:nb] and the heads of slice_heads (bottom-right
    causal = top-left here since seqlen_q == seqlen_k)."""
    nh, nkv = slice_heads(q, k)
    qs, dos = (x[:nb, :, :nh].double().transpose(1, 2).detach().requires_grad_(True)
               for x in (q, do))
    ks, vs = (x[:nb, :, :nkv].double().transpose(1, 2).detach().requires_grad_(True)
              for x in (k, v))
    dos = dos.detach()
    scale = 1.0 / math.sqrt(q.shape[-1])
    kr, vr = (x.repeat_interleave(nh // nkv, dim=1) for x in (ks, vs))
    s = qs @ kr.transpose(-1, -2) * scale
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1), -math.inf)
    lse = torch.logsumexp(s, dim=-1)
    o = torch.softmax(s, dim=-1) @ vr
    o.backward(dos)
    t = lambda x: x.transpose(1, 2).detach()
    return t(o), lse.detach(), t(qs.grad), t(ks.grad), t(vs.grad)


def max_err(a, b):
    return (a.double() - b.double()).abs().max().item()


def rms_err(a, b):
    """Root-mean-square error: where the output's own rounding dominates (a
    16-bit O), the max error of one slice is decided by a few elements' side
    of a rounding boundary, the mean square by all of them."""
    return (a.double() - b.double()).square().mean().sqrt().item()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--exe", required=True)
    p.add_argument("--set", default="quick", choices=("quick", "full"))
    p.add_argument("--dir", default="/dev/shm/kfa_bench")
    p.add_argument("--no-bwd", action="store_true")
    p.add_argument("--dtypes", default="bf16,fp16,fp32,fp64", help="types to run")
    p.add_argument("--seqlens", default="", help="comma-separated seqlens to keep (default: all)")
    p.add_argument("--head-dims", default="", help="comma-separated head dims to keep (default: all)")
    p.add_argument("--json", default="")
    p.add_argument("--timing", default="interleaved", choices=("sequential", "interleaved"),
                   help="kfa and the anchors: one each of forward, backward, forward+backward "
                        "in turn (default), or all forwards, then all backwards, then all pairs "
                        "(the harness before RESULTS run 88; the parts then run at the higher "
                        "clocks of a card that was idle before, the pair at the lower ones of "
                        "a card under sustained load)")
    p.add_argument("--fp32-matmul", default="ieee", choices=("ieee", "split_tf32", "tf32"),
                   help="AttentionOptions::fp32_matmul of kfa's fp32 forward and backward")
    p.add_argument("--fwd-variants", default="",
                   help="comma-separated extra forward variants of bench_device, each "
                        "'name' or 'dtype:name' (e.g. bf16:policy,fp32:split_tf32,fp64:m8n8k4), "
                        "timed beside the default and checked against the reference")
    p.add_argument("--bwd-variants", default="",
                   help="comma-separated backward variants of bench_device (after the library's "
                        "forward), 'name' or 'dtype:name' (e.g. fp64:w8), timed beside the "
                        "default and their dQ, dK, dV checked against the reference")
    args = p.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    dev = torch.cuda.get_device_name()
    print(f"# {dev}, torch {torch.__version__}, set {args.set}", flush=True)
    rows = []
    for (dt, B, N, H, D, causal, *gqa) in configs(args.set):
        Hkv = gqa[0] if gqa else H
        if dt not in args.dtypes.split(","):
            continue
        if args.seqlens and str(N) not in args.seqlens.split(","):
            continue
        if args.head_dims and str(D) not in args.head_dims.split(","):
            continue
        dtype = DTYPES[dt]
        torch.manual_seed(1234)
        q, do = (torch.randn(B, N, H, D, device="cuda", dtype=dtype) for _ in range(2))
        k, v = (torch.randn(B, N, Hkv, D, device="cuda", dtype=dtype) for _ in range(2))
        nh, nkv = slice_heads(q, k)
        for name, t in (("q", q), ("k", k), ("v", v), ("do", do)):
            write(t, f"{args.dir}/{name}.bin")
        heavy = B * H * N * N * D > 2 ** 36
        cmd = [args.exe, "--dtype", dt, "--batch", str(B), "--seqlen", str(N), "--heads", str(H),
               *(["--heads-kv", str(Hkv)] if Hkv != H else []), "--head-dim", str(D), "--dir", args.dir, "--iters", "5" if heavy else "10",
               "--warmup", "1" if heavy else "2"] + (["--causal"] if causal else []) + \
              (["--no-bwd"] if args.no_bwd else []) + ["--fp32-matmul", args.fp32_matmul,
                                                        "--timing", args.timing]
        t0 = time.time()
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            print(f"kfa failed on {dt} B{B} N{N} H{H} D{D} causal={causal}: {res.stderr.strip()}",
                  flush=True)
            continue
        kfa_t = json.loads(res.stdout.strip().splitlines()[-1])
        if not rows:
            print(f"kfa 16-bit forward on wgmma (sm_90a code): {'yes' if kfa_t.get('wgmma') else 'no'}",
                  flush=True)
        lse_dtype = torch.float64 if dt == "fp64" else torch.float32
        o = read(f"{args.dir}/o_kfa.bin", (B, N, H, D), dtype)
        lse = read(f"{args.dir}/lse_kfa.bin", (B, H, N), lse_dtype)
        ref = reference_slice(q, k, v, do, causal)
        errs = {"o": max_err(o[:1, :, :nh], ref[0]), "lse": max_err(lse[:1, :nh], ref[1])}
        rms = {"o": rms_err(o[:1, :, :nh], ref[0])}
        # dQ has the query heads, dK and dV the k/v heads.
        grad_heads = {"dq": (H, nh), "dk": (Hkv, nkv), "dv": (Hkv, nkv)}
        if not args.no_bwd:
            for i, g in enumerate(("dq", "dk", "dv")):
                kg = read(f"{args.dir}/{g}_kfa.bin", (B, N, grad_heads[g][0], D), dtype)
                errs[g] = max_err(kg[:1, :, :grad_heads[g][1]], ref[2 + i])
                rms[g] = rms_err(kg[:1, :, :grad_heads[g][1]], ref[2 + i])
        # Extra forward variants: timed, and their own O checked against the reference.
        variants, variant_errs, variant_bwd = {}, {}, {}
        if args.fwd_variants:
            for entry in args.fwd_variants.split(","):
                # "name" runs on every type, "dtype:name" on that type only.
                vdt, _, var = entry.rpartition(":")
                if vdt and vdt != dt:
                    continue
                # Variants of the library's choices, forward and backward:
                # "no_wgmma" runs the mma.sync kernels where it would take the
                # Hopper ones, "ungrouped" the league order before RESULTS v17
                # (every (batch, head) side by side), "group<T>" groups of
                # about T teams (the library: 256). Others are forward
                # variants of bench_device.
                choices = {"no_wgmma": ["--no-wgmma"], "ungrouped": ["--league-group", "0"]}
                if var.startswith("group") and var[5:].isdigit():
                    choices[var] = ["--league-group", var[5:]]
                extra = choices.get(var, ["--no-bwd", "--fwd-variant", var])
                vr = subprocess.run(cmd + extra, capture_output=True, text=True)
                if vr.returncode != 0:
                    print(f"variant {var} failed: {vr.stderr.strip()}", flush=True)
                    continue
                vt = json.loads(vr.stdout.strip().splitlines()[-1])
                variants[var] = vt["fwd_ms"]
                if var in choices:
                    variant_bwd[var] = vt["bwd_ms"]
                vo = read(f"{args.dir}/o_kfa.bin", (B, N, H, D), dtype)
                vl = read(f"{args.dir}/lse_kfa.bin", (B, H, N), lse_dtype)
                variant_errs[var] = (max_err(vo[:1, :, :nh], ref[0]),
                                     max_err(vl[:1, :nh], ref[1]))
        # Backward variants: timed, and their own dQ, dK, dV checked.
        bwd_variants = {}
        if args.bwd_variants and not args.no_bwd:
            for entry in args.bwd_variants.split(","):
                vdt, _, var = entry.rpartition(":")
                if vdt and vdt != dt:
                    continue
                vr = subprocess.run(cmd + ["--bwd-variant", var], capture_output=True, text=True)
                if vr.returncode != 0:
                    print(f"bwd variant {var} failed: {vr.stderr.strip()}", flush=True)
                    continue
                vt = json.loads(vr.stdout.strip().splitlines()[-1])
                verr = {}
                for i, g in enumerate(("dq", "dk", "dv")):
                    kg = read(f"{args.dir}/{g}_kfa.bin", (B, N, grad_heads[g][0], D), dtype)
                    verr[g] = max_err(kg[:1, :, :grad_heads[g][1]], ref[2 + i])
                bwd_variants[var] = (vt["bwd_ms"], vt["fwd_bwd_ms"], verr)
        # PyTorch's own error on the same slice, with its fast backend for this type.
        anchors = {}
        if dtype in (torch.bfloat16, torch.float16):
            backends = (("fa2", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION))
        elif dtype == torch.float32:
            torch.backends.cuda.matmul.allow_tf32 = False
            backends = (("efficient", SDPBackend.EFFICIENT_ATTENTION),)
        else:
            backends = (("math", SDPBackend.MATH),)
        for name, be in backends:
            anchors[name] = sdpa_time(be, q, k, v, do, causal, args.timing == "interleaved")
        with sdpa_kernel(backends[0][1]):
            qs = q[:1, :, :nh].transpose(1, 2).detach().requires_grad_(True)
            ks, vs = (x[:1, :, :nkv].transpose(1, 2).detach().requires_grad_(True)
                      for x in (k, v))
            ot = sdpa(qs, ks, vs, causal)
            ot.backward(do[:1, :, :nh].transpose(1, 2))
            terr = {"o": max_err(ot.transpose(1, 2), ref[0]),
                    "dq": max_err(qs.grad.transpose(1, 2), ref[2]),
                    "dk": max_err(ks.grad.transpose(1, 2), ref[3]),
                    "dv": max_err(vs.grad.transpose(1, 2), ref[4])}
            trms = {"o": rms_err(ot.transpose(1, 2), ref[0]),
                    "dq": rms_err(qs.grad.transpose(1, 2), ref[2]),
                    "dk": rms_err(ks.grad.transpose(1, 2), ref[3]),
                    "dv": rms_err(vs.grad.transpose(1, 2), ref[4])}
        flops = 4.0 * B * H * N * N * D * (0.5 if causal else 1.0)
        tf = lambda ms, mult=1.0: flops * mult / (ms * 1e-3) / 1e12 if ms and ms > 0 else float("nan")
        row = {"dtype": dt, "B": B, "N": N, "H": H, "Hkv": Hkv, "D": D, "causal": causal,
               "kfa_fwd": tf(kfa_t["fwd_ms"]), "kfa_bwd": tf(kfa_t["bwd_ms"], 2.5),
               "kfa_fwd_bwd": tf(kfa_t["fwd_bwd_ms"], 3.5),
               "kfa_pair_fenced": tf(kfa_t.get("pair_fenced_ms", -1), 3.5), "err": errs, "torch_err": terr,
               "err_rms": rms, "torch_err_rms": trms, "seconds": time.time() - t0}
        for var, ms in variants.items():
            row[f"kfa_fwd_{var}"] = tf(ms)
            row[f"err_{var}"] = max(variant_errs[var])
            row[f"err_o_{var}"], row[f"err_lse_{var}"] = variant_errs[var]
        for var, ms in variant_bwd.items():
            row[f"kfa_bwd_{var}"] = tf(ms, 2.5)
        for var, (b_ms, fb_ms, verr) in bwd_variants.items():
            row[f"kfa_bwd_{var}"] = tf(b_ms, 2.5)
            row[f"kfa_fwd_bwd_{var}"] = tf(fb_ms, 3.5)
            row[f"err_bwd_{var}"] = verr
        for name, (f_ms, b_ms, fb_ms) in anchors.items():
            row[f"{name}_fwd"] = tf(f_ms)
            row[f"{name}_bwd"] = tf(b_ms, 2.5)
            row[f"{name}_fwd_bwd"] = tf(fb_ms, 3.5)
        rows.append(row)
        a0 = backends[0][0]
        print(f"{dt:4s} B{B:<2d} N{N:<5d} H{H:<2d}{f'/{Hkv}' if Hkv != H else ''} D{D:<3d} "
              f"{'causal' if causal else 'full  '} | "
              f"kfa fwd {row['kfa_fwd']:7.2f} bwd {row['kfa_bwd']:7.2f} f+b {row['kfa_fwd_bwd']:7.2f} "
              f"(fenced {row['kfa_pair_fenced']:7.2f}) | "
              + " ".join(f"{n} fwd {row[n + '_fwd']:7.2f} bwd {row[n + '_bwd']:7.2f} "
                         f"f+b {row[n + '_fwd_bwd']:7.2f}"
                         for n in anchors if row.get(n + '_fwd') is not None)
              + f" | fwd ratio vs {a0} {row['kfa_fwd'] / row[a0 + '_fwd']:.3f}"
              + "".join(f" | fwd {var} {row['kfa_fwd_' + var]:7.2f} (err o {row['err_o_' + var]:.1e} lse {row['err_lse_' + var]:.1e})"
                        for var in variants)
              + "".join(f" | bwd {var} {row['kfa_bwd_' + var]:7.2f}" for var in variant_bwd)
              + "".join(f" | bwd {var} {row['kfa_bwd_' + var]:7.2f} f+b "
                        f"{row['kfa_fwd_bwd_' + var]:7.2f} (err dq {e['dq']:.1e} dk {e['dk']:.1e} "
                        f"dv {e['dv']:.1e})"
                        for var, e in ((v, row['err_bwd_' + v]) for v in bwd_variants))
              + f" | err kfa o {errs['o']:.2e} torch o {terr['o']:.2e}"
              + (f" kfa dq {errs['dq']:.2e} torch dq {terr['dq']:.2e} kfa dk {errs['dk']:.2e} "
                 f"dv {errs['dv']:.2e}" if 'dq' in errs else "")
              + " | rms kfa/torch " + " ".join(f"{g} {rms[g] / trms[g]:.2f}" for g in rms
                                               if trms.get(g)),
              flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
