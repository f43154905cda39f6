#!/usr/bin/env python3
"""kfa's host kernels beside PyTorch's CPU SDPA, same shapes, same thread count.

Runs build/perf_tests/bench_host with OMP_NUM_THREADS=<threads>, times
torch.nn.functional.scaled_dot_product_attention on the CPU with
torch.set_num_threads(<threads>) in this process, and prints GFLOP/s and the
ratio kfa / PyTorch per case (FLOPs counted as bench_host counts them).
With --rounds N both are timed N times, alternating, and the medians are
printed (for machines shared with other work). kfa's threads are bound as
OMP_PROC_BIND / OMP_PLACES in the environment say (spread / threads if
unset).

  python3 perf_tests/bench_host.py --bench build/perf_tests/bench_host \
      --threads 1,16 [--type float,double] [--head-dim 64,128] \
      [--seqlen 512,1024,2048,4096,8192] [--heads 16] [--repeat 3] [--rounds 1] \
      [--portable]
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

# The CPUs this process may use, read before PyTorch loads its OpenMP
# runtime: with OMP_PROC_BIND set, libgomp pins the initial thread to the
# first place, and a child started afterwards would inherit that one CPU.
CPUS = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bench", default="build/perf_tests/bench_host")
    p.add_argument("--threads", default=str(os.cpu_count()))
    p.add_argument("--type", default="float,double")
    p.add_argument("--head-dim", default="64,128")
    p.add_argument("--seqlen", default="512,1024,2048,4096,8192")
    p.add_argument("--mask", default="both", choices=["dense", "causal", "both"])
    p.add_argument("--pass", dest="passes", default="both", choices=["fwd", "fwd+bwd", "both"])
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--rounds", type=int, default=1, help="median of this many alternating runs")
    p.add_argument("--portable", action="store_true", help="also time kfa's portable kernels")
    return p.parse_args()


def run_kfa(args, threads, dtype):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    env.setdefault("OMP_PROC_BIND", "spread")
    env.setdefault("OMP_PLACES", "threads")
    cmd = [args.bench, "--type", dtype, "--head-dim", args.head_dim, "--seqlen", args.seqlen,
           "--mask", args.mask, "--pass", args.passes, "--heads", str(args.heads),
           "--batch", str(args.batch), "--repeat", str(args.repeat)]
    if args.portable:
        cmd.append("--portable")
    restore = (lambda: os.sched_setaffinity(0, CPUS)) if CPUS else None
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True,
                         preexec_fn=restore).stdout
    results = {}
    for line in out.splitlines():
        f = line.split()
        if line.startswith("# threads"):
            got = int(line.split()[2].rstrip(","))
            if got != threads:
                print(f"# warning: kfa ran {got} threads, {threads} asked", file=sys.stderr)
        if not f or f[0] != "kfa-host":
            continue
        key = (f[1], int(f[2][2:]), int(f[3][7:]), f[4], f[5])
        results[key] = (float(f[6]), float(f[8]) if len(f) > 8 else None)
    return results


def time_torch(torch, dtype, d, n, causal, backward, args):
    shape = (args.batch, args.heads, n, d)
    g = torch.Generator().manual_seed(1234)
    q, k, v, do = (torch.rand(shape, generator=g, dtype=dtype) * 2 - 1 for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_(backward)
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def step():
        if backward:
            o = sdpa(q, k, v, is_causal=causal)
            o.backward(do)
        else:
            with torch.no_grad():
                sdpa(q, k, v, is_causal=causal)

    step()
    best = float("inf")
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        step()
        best = min(best, time.perf_counter() - t0)
    flops = 4.0 * args.batch * args.heads * n * n * d * (0.5 if causal else 1.0)
    return flops * (3.5 if backward else 1.0) / best / 1e9


def main():
    args = parse_args()
    try:
        import torch
    except ImportError:
        torch = None
        print("# PyTorch not found: kfa numbers only", file=sys.stderr)
    header = "threads type     d  seqlen mask   pass     kfa GF/s  torch GF/s  kfa/torch"
    if args.portable:
        header += "  portable GF/s"
    print(header)
    median = statistics.median
    for threads in (int(t) for t in args.threads.split(",")):
        if torch is not None:
            torch.set_num_threads(threads)
        for dtype in args.type.split(","):
            kfa_runs, torch_runs = [], {}
            for _ in range(args.rounds):
                kfa_runs.append(run_kfa(args, threads, dtype))
                for (name, d, n, mask, pas) in kfa_runs[-1]:
                    if torch is not None:
                        torch_runs.setdefault((name, d, n, mask, pas), []).append(
                            time_torch(torch, getattr(torch, name), d, n, mask == "causal",
                                       pas == "fwd+bwd", args))
            for key in kfa_runs[0]:
                name, d, n, mask, pas = key
                gf = median(run[key][0] for run in kfa_runs)
                tg = median(torch_runs[key]) if key in torch_runs else None
                line = f"{threads:7d} {name:6s} {d:4d} {n:7d} {mask:6s} {pas:8s} {gf:9.1f}"
                if tg:
                    ratio = median(run[key][0] / t for run, t in zip(kfa_runs, torch_runs[key]))
                    line += f" {tg:11.1f} {ratio:10.2f}"
                else:
                    line += f" {'-':>11s} {'-':>10s}"
                if args.portable:
                    line += f" {median(run[key][1] for run in kfa_runs):14.1f}"
                print(line, flush=True)

if __name__ == "__main__":
    main()
