// Flash vs standard (materialised) attention on the default execution space:
// forward and backward, seqlen 512..8192, head_dim 64 and 128, causal and not.
// Reports FLOP/s (4·B·H·Sq·Sk·D forward, 2.5x that backward, halved when
// causal) and the peak extra memory Kokkos allocated during a call, then a
// table of flash/standard ratios measured in the same run.
//
//   bench_attention [--benchmark_filter=...] [google benchmark flags]

#include <kfa/kfa.hpp>
#include <kfa/memory_tracker.hpp>

#include <Kokkos_Core.hpp>
#include <Kokkos_Random.hpp>

#include <benchmark/benchmark.h>

#include <cstdio>
#include <map>
#include <string>

#if KFA_ENABLE_MPI
#include <mpi.h>
#endif

namespace {

using Space = Kokkos::DefaultExecutionSpace;
using T = float;
using View4 = Kokkos::View<T****, Kokkos::LayoutRight, Space::memory_space>;
using View3 = Kokkos::View<float***, Kokkos::LayoutRight, Space::memory_space>;

enum class Impl { flash, standard };
enum class Pass { forward, backward };

struct Problem {
  View4 q, k, v, o, d_o, dq, dk, dv;
  View3 lse;
  Problem(int batch, int seqlen, int heads, int head_dim)
      : q("q", batch, seqlen, heads, head_dim),
        k("k", batch, seqlen, heads, head_dim),
        v("v", batch, seqlen, heads, head_dim),
        o("o", batch, seqlen, heads, head_dim),
        d_o("d_o", batch, seqlen, heads, head_dim),
        dq("dq", batch, seqlen, heads, head_dim),
        dk("dk", batch, seqlen, heads, head_dim),
        dv("dv", batch, seqlen, heads, head_dim),
        lse("lse", batch, heads, seqlen) {
    Kokkos::Random_XorShift64_Pool<Space> pool(12345);
    Kokkos::fill_random(q, pool, -1.f, 1.f);
    Kokkos::fill_random(k, pool, -1.f, 1.f);
    Kokkos::fill_random(v, pool, -1.f, 1.f);
    Kokkos::fill_random(d_o, pool, -1.f, 1.f);
  }
};

kfa::Experimental::MemoryTracker* g_tracker = nullptr;

void bench(benchmark::State& state, Impl impl, Pass pass, bool causal) {
  const int seqlen = static_cast<int>(state.range(0));
  const int head_dim = static_cast<int>(state.range(1));
  const int batch = 1, heads = 4;
  Problem p(batch, seqlen, heads, head_dim);
  kfa::AttentionOptions options;
  options.causal = causal;
  const Space space;
  auto forward = [&] {
    if (impl == Impl::flash)
      kfa::flash_attention_forward(space, p.q, p.k, p.v, p.o, p.lse, options);
    else
      kfa::standard_attention_forward(space, p.q, p.k, p.v, p.o, p.lse, options);
  };
  auto backward = [&] {
    if (impl == Impl::flash)
      kfa::flash_attention_backward(space, p.q, p.k, p.v, p.o, p.lse, p.d_o, p.dq, p.dk, p.dv,
                                    options);
    else
      kfa::standard_attention_backward(space, p.q, p.k, p.v, p.o, p.lse, p.d_o, p.dq, p.dk,
                                       p.dv, options);
  };
  forward();  // warm-up, and the o/lse the backward pass needs
  if (pass == Pass::backward) backward();
  space.fence();
  g_tracker->reset();
  for (auto _ : state) {
    if (pass == Pass::forward)
      forward();
    else
      backward();
    space.fence();
  }
  double flops = 4.0 * batch * heads * double(seqlen) * seqlen * head_dim;
  if (pass == Pass::backward) flops *= 2.5;
  if (causal) flops *= 0.5;
  state.counters["FLOP/s"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["peak_MiB"] = static_cast<double>(g_tracker->peak()) / 1048576.0;
}

void register_all() {
  for (Pass pass : {Pass::forward, Pass::backward})
    for (bool causal : {false, true})
      for (Impl impl : {Impl::flash, Impl::standard}) {
        const std::string name = std::string(impl == Impl::flash ? "flash" : "standard") + "/" +
                                 (pass == Pass::forward ? "fwd" : "bwd") + "/" +
                                 (causal ? "causal" : "full");
        auto* b = benchmark::RegisterBenchmark(name.c_str(), bench, impl, pass, causal);
        for (int d : {64, 128})
          for (int n = 512; n <= 8192; n *= 2) b->Args({n, d});
        b->ArgNames({"seqlen", "d"})->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.2);
      }
}

/// Console output plus, at the end, flash/standard speed ratios per config.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& run : runs) {
      if (run.error_occurred) continue;
      const std::string name = run.benchmark_name();
      const auto slash = name.find('/');
      m_times[name.substr(slash + 1)][name.substr(0, slash)] =
          run.GetAdjustedRealTime();
      m_memory[name.substr(slash + 1)][name.substr(0, slash)] =
          run.counters.count("peak_MiB") ? double(run.counters.at("peak_MiB")) : 0.0;
    }
  }
  void Finalize() override {
    ConsoleReporter::Finalize();
    std::printf("\n%-40s %12s %12s %9s %12s %12s\n", "config", "flash ms", "standard ms",
                "speed-up", "flash MiB", "standard MiB");
    for (const auto& [config, times] : m_times) {
      if (!times.count("flash") || !times.count("standard")) continue;
      std::printf("%-40s %12.2f %12.2f %8.2fx %12.1f %12.1f\n", config.c_str(),
                  times.at("flash"), times.at("standard"),
                  times.at("standard") / times.at("flash"), m_memory[config]["flash"],
                  m_memory[config]["standard"]);
    }
  }

 private:
  std::map<std::string, std::map<std::string, double>> m_times, m_memory;
};

}  // namespace

int main(int argc, char* argv[]) {
#if KFA_ENABLE_MPI
  MPI_Init(&argc, &argv);
#endif
  {
    Kokkos::ScopeGuard guard(argc, argv);
    kfa::Experimental::MemoryTracker tracker;
    g_tracker = &tracker;
    std::printf("%s, execution space %s, float, batch 1, heads 4\n",
                kfa::configuration().c_str(), Space::name());
    benchmark::Initialize(&argc, argv);
    register_all();
    RatioReporter reporter;
    benchmark::RunSpecifiedBenchmarks(&reporter);
    benchmark::Shutdown();
  }
#if KFA_ENABLE_MPI
  MPI_Finalize();
#endif
  return 0;
}
