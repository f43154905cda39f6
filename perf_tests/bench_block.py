#!/usr/bin/env python3
"""kfa::nn::TransformerBlock beside PyTorch's block, same shape, dtype and
device, in one call: PyTorch eager, the same module under torch.compile, and
kfa's perf_tests/bench_block, forward and forward+backward, median ms of
--reps calls after --warmup, and the speed ratios kfa/eager and kfa/compile
(anchor ms / kfa ms: above 1, kfa is faster).

The anchor is torch.nn.TransformerEncoderLayer(norm_first=True,
batch_first=True, dropout=0, GELU, d_ff = 4·d_model) for --block encoder,
or the plain-PyTorch Llama block of examples/export_pytorch_block.py
(RMSNorm, rotary, grouped-query causal attention, SwiGLU, no biases) for
--block llama; kfa's block is configured to match. Both run in training
mode: the forward keeps what the backward needs, the backward accumulates
the parameter gradients.

Shapes (--shapes, comma-separated; default gpt,science on cuda, host on cpu):
  gpt      d_model 2048, 16 heads, seqlen 4096, batch 4, bf16 (fp32 for
           both sides when bench_block has no bf16)
  science  d_model 256, 8 heads, seqlen 65536, batch 1, fp32
  host     d_model 256, 8 heads, seqlen 2048, batch 1, fp32
  tiny     d_model 64, 4 heads, seqlen 128, batch 2, fp32 (a smoke test)
  or d_model:heads:seqlen:batch:dtype, e.g. 512:8:1024:2:fp64

On the CPU both sides use --threads threads (OMP_NUM_THREADS, and
OPENBLAS_NUM_THREADS / MKL_NUM_THREADS for the BLAS under kfa's products;
torch.set_num_threads here); kfa's threads are bound as OMP_PROC_BIND /
OMP_PLACES say (spread / threads if unset), after this process's CPU
affinity is restored for the child (see bench_host.py).

  python3 perf_tests/bench_block.py --bench build/perf_tests/bench_block \\
      [--device cuda|cpu] [--shapes gpt,science] [--causal] [--block encoder|llama] \\
      [--threads N] [--warmup 3] [--reps 10] [--rounds 1] [--no-compile] [--json FILE] \\
      [--baseline OTHER_BUILD/bench_block]

--baseline times a second build of bench_block in the same rounds (an A/B
of a change beside the same PyTorch numbers): columns "base ms" and
"base/kfa" (above 1: the change made the block faster).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

# The CPUs this process may use, read before PyTorch loads its OpenMP
# runtime: with OMP_PROC_BIND set, libgomp pins the initial thread to the
# first place, and a child started afterwards would inherit that one CPU.
CPUS = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None

SHAPES = {"gpt": (2048, 16, 4096, 4, "bf16"), "science": (256, 8, 65536, 1, "fp32"),
          "host": (256, 8, 2048, 1, "fp32"), "tiny": (64, 4, 128, 2, "fp32")}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bench", default="build/perf_tests/bench_block")
    p.add_argument("--device", default=None, help="cuda if PyTorch sees a GPU, else cpu")
    p.add_argument("--shapes", default=None)
    p.add_argument("--block", default="encoder", choices=["encoder", "llama"])
    p.add_argument("--causal", action="store_true", help="causal attention (llama: always)")
    p.add_argument("--kv-heads", type=int, default=0, help="llama: key/value heads (0: heads/4)")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="cpu only")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--rounds", type=int, default=1, help="median of this many alternating rounds")
    p.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--baseline", help="a second bench_block timed in the same rounds")
    return p.parse_args()


def shape_list(text):
    out = []
    for item in text.split(","):
        if item in SHAPES:
            out.append((item,) + SHAPES[item])
        else:
            d, h, n, b, dtype = item.split(":")
            out.append((item, int(d), int(h), int(n), int(b), dtype))
    return out


def run_kfa(args, device, d, heads, kv_heads, n, b, dtype, causal, bench=None):
    """(fwd ms, fwd+bwd ms) from bench_block (args.bench unless given)."""
    cmd = [bench or args.bench, "--d-model", str(d), "--heads", str(heads), "--seqlen", str(n),
           "--batch", str(b), "--dtype", dtype, "--warmup", str(args.warmup),
           "--reps", str(args.reps)]
    if args.block == "llama":
        cmd += ["--kv-heads", str(kv_heads), "--norm", "rms_norm", "--activation", "swiglu",
                "--rotary", "--no-bias", "--d-ff", str(llama_d_ff(d))]
    if causal:
        cmd.append("--causal")
    env = dict(os.environ)
    if device == "cpu":
        env["OMP_NUM_THREADS"] = str(args.threads)
        # The BLAS under Kokkos Kernels' gemm gets the same threads.
        env["OPENBLAS_NUM_THREADS"] = str(args.threads)
        env["MKL_NUM_THREADS"] = str(args.threads)
        env.setdefault("OMP_PROC_BIND", "spread")
        env.setdefault("OMP_PLACES", "threads")
    restore = (lambda: os.sched_setaffinity(0, CPUS)) if CPUS else None
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, preexec_fn=restore)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {res.returncode}: {res.stderr.strip()}")
    for line in res.stdout.splitlines():
        if line.startswith("kfa-block "):
            fields = dict(f.split("=", 1) for f in line.split()[1:])
            if device == "cpu" and int(fields["threads"]) != args.threads:
                print(f"# warning: kfa ran {fields['threads']} threads, {args.threads} asked",
                      file=sys.stderr)
            return float(fields["fwd_ms"]), float(fields["fwd_bwd_ms"])
    raise RuntimeError(f"no kfa-block line from {' '.join(cmd)}")


def kfa_dtypes(bench):
    out = subprocess.run([bench, "--list-dtypes"], capture_output=True, text=True, check=True)
    return out.stdout.split()[1:]


def llama_d_ff(d):
    """Llama's hidden size for d_model d: 8/3·d rounded up to a multiple of 64."""
    return (8 * d // 3 + 63) // 64 * 64


def build_torch(torch, args, d, heads, kv_heads, dtype, device, causal):
    """(module, forward(module, x))."""
    if args.block == "llama":
        sys.path[:0] = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                     "examples"), os.path.dirname(os.path.abspath(__file__))]
        from export_pytorch_block import LlamaBlock
        block = LlamaBlock(d, heads, kv_heads, llama_d_ff(d), 1e-5, 10000.0)
        return block.to(device=device, dtype=dtype), lambda m, x, mask: m(x)
    block = torch.nn.TransformerEncoderLayer(d, heads, dim_feedforward=4 * d, dropout=0.0,
                                             activation="gelu", batch_first=True, norm_first=True,
                                             device=device, dtype=dtype)
    if causal:
        return block, lambda m, x, mask: m(x, src_mask=mask, is_causal=True)
    return block, lambda m, x, mask: m(x)


def time_torch(torch, module, forward, x, dy, mask, device, args, backward):
    """Median ms of one forward (keeping the graph) or forward+backward."""
    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    def step():
        y = forward(module, x, mask)
        if backward:
            y.backward(dy)

    for _ in range(args.warmup):
        step()
    sync()
    ms = []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        step()
        sync()
        ms.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ms)


def main():
    args = parse_args()
    import torch
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    shapes = shape_list(args.shapes or ("gpt,science" if device == "cuda" else "host"))
    if device == "cpu":
        torch.set_num_threads(args.threads)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    available = kfa_dtypes(args.bench)
    causal = args.causal or args.block == "llama"
    where = torch.cuda.get_device_name() if device == "cuda" else f"cpu, {args.threads} threads"
    print(f"# {args.block} block, {'causal' if causal else 'not causal'}, on {where}; PyTorch "
          f"{torch.__version__}; median of {args.reps} after {args.warmup} warm-up, "
          f"{args.rounds} round(s); ratios = anchor ms / kfa ms (above 1: kfa faster)")
    print(f"{'shape':24s} {'dtype':5s} {'pass':8s} {'eager ms':>10s} {'compile ms':>10s} "
          f"{'kfa ms':>10s} {'kfa/eager':>9s} {'kfa/compile':>11s}"
          + (f" {'base ms':>10s} {'base/kfa':>8s}" if args.baseline else ""), flush=True)
    results = []
    for name, d, heads, n, b, dtype in shapes:
        if dtype not in available:
            print(f"# {name}: bench_block has no {dtype} ({' '.join(available)}); fp32 on "
                  "both sides", flush=True)
            dtype = "fp32"
        kv_heads = (args.kv_heads or max(1, heads // 4)) if args.block == "llama" else heads
        tdtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
                  "fp64": torch.float64}[dtype]
        g = torch.Generator(device="cpu").manual_seed(1234)
        x = (torch.rand(b, n, d, generator=g) * 2 - 1).to(device=device, dtype=tdtype)
        dy = (torch.rand(b, n, d, generator=g) * 2 - 1).to(device=device, dtype=tdtype)
        x.requires_grad_(True)
        mask = torch.nn.Transformer.generate_square_subsequent_mask(
            n, device=device, dtype=tdtype) if causal and args.block == "encoder" else None
        module, forward = build_torch(torch, args, d, heads, kv_heads, tdtype, device, causal)
        module.train()
        compiled = None
        if not args.no_compile:
            compiled = torch.compile(module)
        rounds = {"kfa": [], "eager": [], "compile": [], "base": []}
        for _ in range(args.rounds):
            if device == "cuda":
                torch.cuda.empty_cache()
            rounds["kfa"].append(run_kfa(args, device, d, heads, kv_heads, n, b, dtype, causal))
            if args.baseline:
                rounds["base"].append(run_kfa(args, device, d, heads, kv_heads, n, b, dtype,
                                              causal, args.baseline))
            rounds["eager"].append(tuple(time_torch(torch, module, forward, x, dy, mask, device,
                                                    args, bwd) for bwd in (False, True)))
            if compiled is not None:
                try:
                    rounds["compile"].append(tuple(
                        time_torch(torch, compiled, forward, x, dy, mask, device, args, bwd)
                        for bwd in (False, True)))
                except Exception as e:  # noqa: BLE001 (a compiler failure is reported, not fatal)
                    print(f"# {name}: torch.compile failed: {type(e).__name__}: {e}"[:300],
                          file=sys.stderr)
                    compiled = None
        for i, pas in enumerate(("fwd", "fwd+bwd")):
            med = {k: statistics.median(r[i] for r in v) if v else None
                   for k, v in rounds.items()}
            def ratio(anchor):
                return med[anchor] / med["kfa"] if med[anchor] else None
            cell = lambda v, w, f: f"{v:{w}{f}}" if v is not None else f"{'-':>{w}s}"
            label = f"{d}x{heads}h N{n} B{b}"
            print(f"{label:24s} {dtype:5s} {pas:8s} {cell(med['eager'], 10, '.3f')} "
                  f"{cell(med['compile'], 10, '.3f')} {cell(med['kfa'], 10, '.3f')} "
                  f"{cell(ratio('eager'), 9, '.2f')} {cell(ratio('compile'), 11, '.2f')}"
                  + (f" {cell(med['base'], 10, '.3f')} {cell(ratio('base'), 8, '.2f')}"
                     if args.baseline else ""), flush=True)
            results.append(dict(shape=name, d_model=d, heads=heads, kv_heads=kv_heads, seqlen=n,
                                batch=b, dtype=dtype, block=args.block, causal=causal,
                                device=device, threads=args.threads if device == "cpu" else None,
                                **{"pass": pas}, eager_ms=med["eager"], compile_ms=med["compile"],
                                kfa_ms=med["kfa"], baseline_ms=med["base"]))
        del module, compiled, x, dy
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
