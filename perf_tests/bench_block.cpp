// Time of kfa::nn::TransformerBlock's forward and forward+backward on the
// default execution space: median of --reps calls after --warmup, each
// between two fences. One line per run:
//   kfa-block space=<name> threads=<n> dtype=<t> d_model=... heads=... kv_heads=...
//     d_ff=... seqlen=... batch=... norm=... activation=... causal=0|1 rotary=0|1
//     bias=0|1 fwd_ms=<ms> fwd_bwd_ms=<ms>
// The forward saves what the backward needs (training mode, no dropout);
// the backward accumulates into the parameter gradients, as PyTorch's does.
// perf_tests/bench_block.py runs it beside PyTorch eager and torch.compile.
//   bench_block [--d-model 256] [--heads 8] [--kv-heads 0 (= heads)] [--d-ff 0 (= 4·d_model)]
//               [--seqlen 2048] [--batch 1] [--dtype fp32|fp64|bf16|fp16] [--norm layer_norm|rms_norm]
//               [--activation gelu|gelu_tanh|swiglu] [--causal] [--rotary] [--no-bias]
//               [--pass fwd|fwd+bwd|both] [--warmup 2] [--reps 10]
//   bench_block --list-dtypes      (prints the dtypes this build times)

#include "bench_fill.hpp"

#include <kfa/nn.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

using Space = Kokkos::DefaultExecutionSpace;

struct Args {
  int d_model = 256, heads = 8, kv_heads = 0, d_ff = 0, seqlen = 2048, batch = 1;
  std::string dtype = "fp32", norm = "layer_norm", activation = "gelu", pass = "both";
  bool causal = false, rotary = false, bias = true, list_dtypes = false;
  int warmup = 2, reps = 10;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_block: %s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--d-model") a.d_model = std::stoi(next());
    else if (arg == "--heads") a.heads = std::stoi(next());
    else if (arg == "--kv-heads") a.kv_heads = std::stoi(next());
    else if (arg == "--d-ff") a.d_ff = std::stoi(next());
    else if (arg == "--seqlen") a.seqlen = std::stoi(next());
    else if (arg == "--batch") a.batch = std::stoi(next());
    else if (arg == "--dtype") a.dtype = next();
    else if (arg == "--norm") a.norm = next();
    else if (arg == "--activation") a.activation = next();
    else if (arg == "--pass") a.pass = next();
    else if (arg == "--warmup") a.warmup = std::stoi(next());
    else if (arg == "--reps") a.reps = std::stoi(next());
    else if (arg == "--causal") a.causal = true;
    else if (arg == "--rotary") a.rotary = true;
    else if (arg == "--no-bias") a.bias = false;
    else if (arg == "--list-dtypes") a.list_dtypes = true;
    else {
      std::fprintf(stderr, "bench_block: unknown argument %s\n", arg.c_str());
      std::exit(2);
    }
  }
  if (a.kv_heads == 0) a.kv_heads = a.heads;
  if (a.d_ff == 0) a.d_ff = 4 * a.d_model;
  const bool norm_ok = a.norm == "layer_norm" || a.norm == "rms_norm";
  const bool act_ok = a.activation == "gelu" || a.activation == "gelu_tanh" ||
                      a.activation == "swiglu";
  if (!norm_ok || !act_ok || (a.pass != "fwd" && a.pass != "fwd+bwd" && a.pass != "both") ||
      a.reps < 1) {
    std::fprintf(stderr, "bench_block: bad --norm, --activation, --pass or --reps\n");
    std::exit(2);
  }
  return a;
}

kfa::nn::TransformerBlockOptions block_options(const Args& a) {
  kfa::nn::TransformerBlockOptions o;
  o.attention.d_model = a.d_model;
  o.attention.heads = a.heads;
  o.attention.kv_heads = a.kv_heads;
  o.attention.rotary = a.rotary;
  o.attention.attention.causal = a.causal;
  o.d_ff = a.d_ff;
  o.norm = a.norm == "rms_norm" ? kfa::nn::Norm::rms_norm : kfa::nn::Norm::layer_norm;
  o.activation = a.activation == "swiglu"      ? kfa::nn::Activation::swiglu
                 : a.activation == "gelu_tanh" ? kfa::nn::Activation::gelu_tanh
                                               : kfa::nn::Activation::gelu;
  o.bias = a.bias;
  return o;
}

/// Median milliseconds of `reps` calls of f after `warmup`, each between
/// fences of `space`.
template <class F>
double median_ms(const Space& space, int warmup, int reps, F&& f) {
  for (int r = 0; r < warmup; ++r) f();
  space.fence();
  std::vector<double> ms;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    space.fence();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                     .count());
  }
  std::sort(ms.begin(), ms.end());
  return ms.size() % 2 ? ms[ms.size() / 2] : 0.5 * (ms[ms.size() / 2 - 1] + ms[ms.size() / 2]);
}

template <class T>
void run(const Args& a) {
  using View3 = Kokkos::View<T***, Kokkos::LayoutRight, Space::memory_space>;
  const Space space;
  kfa::nn::TransformerBlock<Space, T> block(block_options(a));
  View3 x("x", a.batch, a.seqlen, a.d_model), y("y", a.batch, a.seqlen, a.d_model);
  View3 dy("dy", a.batch, a.seqlen, a.d_model), dx("dx", a.batch, a.seqlen, a.d_model);
  fill_uniform<Space>({x, dy});
  typename kfa::nn::TransformerBlock<Space, T>::context_type context;
  double fwd = 0, fwd_bwd = 0;
  if (a.pass != "fwd+bwd")
    fwd = median_ms(space, a.warmup, a.reps, [&] { block.forward(space, x, y, context); });
  if (a.pass != "fwd") {
    fwd_bwd = median_ms(space, a.warmup, a.reps, [&] {
      block.forward(space, x, y, context);
      block.backward(space, dy, dx, context);
    });
  }
  std::printf("kfa-block space=%s threads=%d dtype=%s d_model=%d heads=%d kv_heads=%d d_ff=%d "
              "seqlen=%d batch=%d norm=%s activation=%s causal=%d rotary=%d bias=%d "
              "fwd_ms=%.4f fwd_bwd_ms=%.4f\n",
              Space::name(), Kokkos::DefaultHostExecutionSpace().concurrency(), a.dtype.c_str(),
              a.d_model, a.heads, a.kv_heads, a.d_ff, a.seqlen, a.batch, a.norm.c_str(),
              a.activation.c_str(), int(a.causal), int(a.rotary), int(a.bias), fwd, fwd_bwd);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  if (a.list_dtypes) {
    std::printf("kfa-block-dtypes fp32 fp64 bf16 fp16\n");
    return 0;
  }
  Kokkos::ScopeGuard guard(argc, argv);
  try {
    if (a.dtype == "fp32") run<float>(a);
    else if (a.dtype == "fp64") run<double>(a);
    else if (a.dtype == "bf16") run<kfa::bfloat16>(a);
    else if (a.dtype == "fp16") run<kfa::half>(a);
    else {
      std::fprintf(stderr, "bench_block: dtype %s is not timed by this build (--list-dtypes)\n",
                   a.dtype.c_str());
      return 3;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_block: %s\n", e.what());
    return 1;
  }
  return 0;
}
