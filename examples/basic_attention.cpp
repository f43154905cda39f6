// kfa basic example: flash attention forward and backward on Kokkos Views,
// checked against the materialised standard attention, with the time and the
// peak extra memory of each.
//
//   basic_attention [--batch B] [--seqlen N] [--heads H] [--head-dim D]
//                   [--causal] [--double] [--repeat R]
//
// Exits non-zero when flash and standard attention disagree by more than a
// few units in the last place of the value type.

#include <kfa/kfa.hpp>
#include <kfa/memory_tracker.hpp>

#include "example_common.hpp"

#include <Kokkos_Core.hpp>
#include <Kokkos_Random.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#if KFA_ENABLE_MPI
#include <mpi.h>
#endif

namespace {

struct Args : kfa_example::CommonArgs {
  Args() { seqlen = 4096; }
};

Args parse(int argc, char* argv[]) {
  return kfa_example::parse_args(argc, argv, Args{},
                                 [](Args&, const std::string&, auto&&) { return false; });
}

using kfa_example::max_abs_diff;

struct Measure {
  double seconds;
  long long peak_bytes;
};

/// Median wall time of `repeat` runs of f (fenced) and the peak extra bytes
/// Kokkos allocated during them.
template <class Space, class F>
Measure measure(kfa::Experimental::MemoryTracker& tracker, int repeat, F&& f) {
  f();  // warm-up
  Space().fence();
  std::vector<double> times;
  tracker.reset();
  for (int r = 0; r < repeat; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    Space().fence();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  return {times[times.size() / 2], static_cast<long long>(tracker.peak())};
}

template <class T>
int run(const Args& a) {
  using Space = Kokkos::DefaultExecutionSpace;
  using Acc = kfa::accumulator_t<T>;
  using View4 = Kokkos::View<T****, Kokkos::LayoutRight, Space::memory_space>;
  using View3 = Kokkos::View<Acc***, Kokkos::LayoutRight, Space::memory_space>;
  const int B = a.batch, N = a.seqlen, H = a.heads, D = a.head_dim;
  std::printf("kfa %s on %s: batch %d, seqlen %d, heads %d, head_dim %d, %s, %s\n",
              kfa::version().c_str(), Space::name(), B, N, H, D, a.causal ? "causal" : "full",
              std::is_same<T, double>::value ? "double" : "float");

  View4 q("q", B, N, H, D), k("k", B, N, H, D), v("v", B, N, H, D), d_o("d_o", B, N, H, D);
  Kokkos::Random_XorShift64_Pool<Space> pool(/*seed=*/20261129);
  Kokkos::fill_random(q, pool, T(-1), T(1));
  Kokkos::fill_random(k, pool, T(-1), T(1));
  Kokkos::fill_random(v, pool, T(-1), T(1));
  Kokkos::fill_random(d_o, pool, T(-1), T(1));
  View4 o_flash("o_flash", B, N, H, D), o_std("o_std", B, N, H, D);
  View3 lse_flash("lse_flash", B, H, N), lse_std("lse_std", B, H, N);
  View4 dq_flash("dq_flash", B, N, H, D), dk_flash("dk_flash", B, N, H, D),
      dv_flash("dv_flash", B, N, H, D);
  View4 dq_std("dq_std", B, N, H, D), dk_std("dk_std", B, N, H, D), dv_std("dv_std", B, N, H, D);

  kfa::AttentionOptions options;
  options.causal = a.causal;
  const Space space;
  kfa::Experimental::MemoryTracker tracker;

  const Measure fwd_flash = measure<Space>(tracker, a.repeat, [&] {
    kfa::flash_attention_forward(space, q, k, v, o_flash, lse_flash, options);
  });
  const Measure fwd_std = measure<Space>(tracker, a.repeat, [&] {
    kfa::standard_attention_forward(space, q, k, v, o_std, lse_std, options);
  });
  const Measure bwd_flash = measure<Space>(tracker, a.repeat, [&] {
    kfa::flash_attention_backward(space, q, k, v, o_flash, lse_flash, d_o, dq_flash, dk_flash,
                                  dv_flash, options);
  });
  const Measure bwd_std = measure<Space>(tracker, a.repeat, [&] {
    kfa::standard_attention_backward(space, q, k, v, o_std, lse_std, d_o, dq_std, dk_std,
                                     dv_std, options);
  });

  const double err_o = max_abs_diff(o_flash, o_std), err_lse = max_abs_diff(lse_flash, lse_std);
  const double err_dq = max_abs_diff(dq_flash, dq_std), err_dk = max_abs_diff(dk_flash, dk_std),
               err_dv = max_abs_diff(dv_flash, dv_std);
  const double flops = 4.0 * B * H * double(N) * N * D * (a.causal ? 0.5 : 1.0);
  auto row = [&](const char* name, const Measure& m, double f) {
    std::printf("  %-22s %10.2f ms %10.2f GFLOP/s %12.1f MiB\n", name, 1e3 * m.seconds,
                f / m.seconds * 1e-9, m.peak_bytes / 1048576.0);
  };
  std::printf("\n  %-22s %13s %17s %16s\n", "", "time (median)", "rate", "peak extra memory");
  row("flash forward", fwd_flash, flops);
  row("standard forward", fwd_std, flops);
  row("flash backward", bwd_flash, 2.5 * flops);
  row("standard backward", bwd_std, 2.5 * flops);
  std::printf("\n  forward speed-up %.2fx, memory %s; backward speed-up %.2fx\n",
              fwd_std.seconds / fwd_flash.seconds,
              fwd_flash.peak_bytes == 0 ? "none beyond inputs/outputs" : "O(N)",
              bwd_std.seconds / bwd_flash.seconds);
  std::printf("  max |flash - standard|: O %.3g, lse %.3g, dQ %.3g, dK %.3g, dV %.3g\n", err_o,
              err_lse, err_dq, err_dk, err_dv);

  const double eps = std::is_same<T, double>::value ? 1e-13 : 1e-4;
  const bool ok = err_o < eps && err_lse < eps && err_dq < 10 * eps && err_dk < 10 * eps &&
                  err_dv < 10 * eps;
  std::printf("  %s\n", ok ? "OK: flash attention matches standard attention"
                           : "FAILED: flash and standard attention disagree");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char* argv[]) {
#if KFA_ENABLE_MPI
  MPI_Init(&argc, &argv);
#endif
  int status = 0;
  {
    Kokkos::ScopeGuard guard(argc, argv);
    const Args args = parse(argc, argv);
    status = args.use_double ? run<double>(args) : run<float>(args);
  }
#if KFA_ENABLE_MPI
  MPI_Finalize();
#endif
  return status;
}
