// Host attention throughput: kfa's host kernels (and, with --portable, the
// portable TeamPolicy kernels in the same run) on the default host execution
// space, with the threads OMP_NUM_THREADS gives Kokkos. One line per case:
//   kfa-host <type> d=<d> seqlen=<n> <dense|causal> <fwd|fwd+bwd> <GFLOP/s> [portable <GFLOP/s>]
// FLOPs counted as FlashAttention does: forward 4·b·h·n²·d (half causal),
// forward+backward 3.5 times that. perf_tests/bench_host.py runs it beside
// PyTorch's CPU SDPA.
//   bench_host [--type float|double|all] [--head-dim 64,128] [--seqlen 512,...]
//              [--mask dense|causal|both] [--batch 1] [--heads 16] [--repeat 3]
//              [--pass fwd|fwd+bwd|both] [--portable] [--cpu-time]
// --cpu-time times by the process's CPU time instead of the wall clock: with
// one thread on a machine shared with other work it leaves out the time the
// thread waits for a core (with more threads it counts their spinning too).

#include "bench_fill.hpp"

#include <kfa/kfa.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct Args {
  std::string type = "all", mask = "both", pass = "both";
  std::vector<int> head_dims = {64, 128}, seqlens = {512, 1024, 2048, 4096, 8192};
  int batch = 1, heads = 16, repeat = 3;
  bool portable = false, cpu_time = false;
};

std::vector<int> int_list(const std::string& s) {
  std::vector<int> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) out.push_back(std::stoi(item));
  return out;
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_host: %s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--type") a.type = next();
    else if (arg == "--head-dim") a.head_dims = int_list(next());
    else if (arg == "--seqlen") a.seqlens = int_list(next());
    else if (arg == "--mask") a.mask = next();
    else if (arg == "--pass") a.pass = next();
    else if (arg == "--batch") a.batch = std::stoi(next());
    else if (arg == "--heads") a.heads = std::stoi(next());
    else if (arg == "--repeat") a.repeat = std::stoi(next());
    else if (arg == "--portable") a.portable = true;
    else if (arg == "--cpu-time") a.cpu_time = true;
    else {
      std::fprintf(stderr, "bench_host: unknown argument %s\n", arg.c_str());
      std::exit(2);
    }
  }
  return a;
}

bool g_cpu_time = false;

double now_seconds() {
  if (g_cpu_time) return double(std::clock()) / CLOCKS_PER_SEC;
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

/// Best of `repeat` timed runs of f, after one warm-up run.
template <class F>
double best_seconds(int repeat, F&& f) {
  f();
  double best = 1e300;
  for (int r = 0; r < repeat; ++r) {
    const double t0 = now_seconds();
    f();
    best = std::min(best, now_seconds() - t0);
  }
  return best;
}

template <class T>
void run_type(const Args& a, const char* name) {
  using Space = Kokkos::DefaultHostExecutionSpace;
  using V4 = Kokkos::View<T****, Kokkos::LayoutRight, Space::memory_space>;
  using L3 = Kokkos::View<kfa::accumulator_t<T>***, Kokkos::LayoutRight, Space::memory_space>;
  const Space space;
  for (const int d : a.head_dims)
    for (const int n : a.seqlens) {
      V4 q("q", a.batch, n, a.heads, d), k("k", a.batch, n, a.heads, d),
          v("v", a.batch, n, a.heads, d), o("o", a.batch, n, a.heads, d),
          d_o("do", a.batch, n, a.heads, d), dq("dq", a.batch, n, a.heads, d),
          dk("dk", a.batch, n, a.heads, d), dv("dv", a.batch, n, a.heads, d);
      L3 lse("lse", a.batch, a.heads, n);
      fill_uniform<Space>({q, k, v, d_o});
      for (const bool causal : {false, true}) {
        if ((causal && a.mask == "dense") || (!causal && a.mask == "causal")) continue;
        const double fwd_flops = 4.0 * a.batch * a.heads * double(n) * n * d * (causal ? 0.5 : 1);
        for (const bool backward : {false, true}) {
          if ((backward && a.pass == "fwd") || (!backward && a.pass == "fwd+bwd")) continue;
          auto gflops = [&](bool host_tiled) {
            kfa::AttentionOptions opt;
            opt.causal = causal;
            opt.kernel_policy.host_tiled = host_tiled;
            const double s = best_seconds(a.repeat, [&] {
              kfa::flash_attention_forward(space, q, k, v, o, lse, opt);
              if (backward)
                kfa::flash_attention_backward(space, q, k, v, o, lse, d_o, dq, dk, dv, opt);
              space.fence();
            });
            return fwd_flops * (backward ? 3.5 : 1.0) / s / 1e9;
          };
          std::printf("kfa-host %s d=%d seqlen=%d %s %s %.1f", name, d, n,
                      causal ? "causal" : "dense", backward ? "fwd+bwd" : "fwd", gflops(true));
          if (a.portable) std::printf(" portable %.1f", gflops(false));
          std::printf("\n");
          std::fflush(stdout);
        }
      }
    }
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  g_cpu_time = a.cpu_time;
  Kokkos::ScopeGuard guard(argc, argv);
  std::printf("# threads %d, batch %d, heads %d, best of %d\n",
              Kokkos::DefaultHostExecutionSpace().concurrency(), a.batch, a.heads, a.repeat);
  if (a.type == "float" || a.type == "all") run_type<float>(a, "float");
  if (a.type == "double" || a.type == "all") run_type<double>(a, "double");
  return 0;
}
