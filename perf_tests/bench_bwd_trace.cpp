// Phase timeline of the Hopper backward at head_dim 128 (the library's
// FlashBackwardWgmmaKernel with Pipelined, bf16), from inside the kernel:
// the first thread of each warpgroup of the first --teams teams reads the
// SM clock (clock64) at ten points of each query block (the kernel's Trace
// option, WgmmaBwdTrace). Prints, per phase, the median cycles a block
// spends in it over the traced blocks (the first two and the last of each
// team left out), for each warpgroup, beside the block's whole period, and
// how far apart the two warpgroups are at the team barrier. CUDA builds
// with KFA_CUDA_SM90A only:
//
//   bench_bwd_trace [--batch 2] [--seqlen 8192] [--heads 16] [--causal]
//                   [--teams 16] [--blocks 64] [--narrow]
//
// --narrow traces the kernel with dQ's tensor reductions in boxes of 8
// fp32 a row (the library's before RESULTS v49) instead of 32.
//
// The inputs are random (q, k, v, dO in [-1, 1]); O and lse come from the
// library's forward. The library's backward runs 3 times first (warm-up),
// then the traced kernel once, then the traced kernel's backward time is
// compared with the library's (its clock reads and stores cost a little;
// both as GPU time, gpu_time_ms).
#include <kfa/kfa.hpp>

#include "bench_cuda_check.hpp"
#include "bench_fill.hpp"

#include <Kokkos_Core.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

struct Args {
  int batch = 2, seqlen = 8192, heads = 16, teams = 16, blocks = 64;
  bool causal = false, narrow = false;
};

Args parse(int argc, char* argv[]) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    auto next = [&]() {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_bwd_trace: %s needs a value\n", s.c_str());
        std::exit(1);
      }
      return std::atoi(argv[++i]);
    };
    if (s == "--batch") a.batch = next();
    else if (s == "--seqlen") a.seqlen = next();
    else if (s == "--heads") a.heads = next();
    else if (s == "--teams") a.teams = next();
    else if (s == "--blocks") a.blocks = next();
    else if (s == "--causal") a.causal = true;
    else if (s == "--narrow") a.narrow = true;
    else {
      std::fprintf(stderr,
                   "usage: bench_bwd_trace [--batch B] [--seqlen N] [--heads H] [--causal] "
                   "[--teams T] [--blocks M] [--narrow]\n");
      std::exit(1);
    }
  }
  if (a.batch < 1 || a.seqlen < 1 || a.heads < 1 || a.teams < 1 || a.blocks < 4) {
    std::fprintf(stderr, "bench_bwd_trace: sizes must be positive, --blocks at least 4\n");
    std::exit(1);
  }
  return a;
}

double median(std::vector<double> x) {
  if (x.empty()) return 0;
  std::sort(x.begin(), x.end());
  return x[x.size() / 2];
}

template <bool DqWide>
void run(const Args& a) {
  using Space = Kokkos::Cuda;
  using T = kfa::bfloat16;
  using View4 = Kokkos::View<T****, Kokkos::LayoutRight, Space::memory_space>;
  using View3 = Kokkos::View<float***, Kokkos::LayoutRight, Space::memory_space>;
  using Acc = Kokkos::View<float****, Kokkos::LayoutRight, Space::memory_space>;
  using Format = kfa::Impl::MmaFormat<Space, T>::type;
  constexpr int kD = 128;
  using Kernel = kfa::Impl::FlashBackwardWgmmaKernel<Space, kD, Format, View4, View4, View4, View4,
                                                     View3, View3, Acc, View4, View4, false, true,
                                                     false, true, true, true, DqWide>;
  constexpr int kEvents = kfa::Impl::kWgmmaBwdTraceEvents;
  const Space space;
  if (!kfa::Impl::wgmma_available(space) || !Kernel::fits(space)) {
    std::fprintf(stderr, "bench_bwd_trace: needs a Hopper GPU and a build with sm_90a code\n");
    std::exit(1);
  }
  const int B = a.batch, N = a.seqlen, H = a.heads;
  View4 q("q", B, N, H, kD), k("k", B, N, H, kD), v("v", B, N, H, kD), d_o("d_o", B, N, H, kD),
      o("o", B, N, H, kD), dq("dq", B, N, H, kD), dk("dk", B, N, H, kD), dv("dv", B, N, H, kD);
  View3 lse("lse", B, H, N), delta("delta", B, H, N);
  Acc acc("dq_acc", B, N, H, kD);
  fill_uniform<Space>({q, k, v, d_o});
  kfa::AttentionOptions opt;
  opt.causal = a.causal;
  kfa::flash_attention_forward(space, q, k, v, o, lse, opt);
  const float scale = 1.0f / std::sqrt(float(kD));

  const cudaStream_t stream = space.cuda_stream();
  auto time_ms = [&](auto&& fn) { return gpu_time_ms(stream, fn); };
  auto library = [&] {
    kfa::flash_attention_backward(space, q, k, v, o, lse, d_o, dq, dk, dv, opt);
  };
  std::vector<double> lib_ms;
  for (int i = 0; i < 3; ++i) library();
  for (int i = 0; i < 5; ++i) lib_ms.push_back(time_ms(library));

  Kokkos::View<long long*, Space::memory_space> trace("trace", std::size_t(a.teams) * 2 *
                                                                   a.blocks * kEvents);
  Kernel kernel(q, k, v, d_o, lse, delta, acc, dk, dv, scale, a.causal);
  kernel.set_trace(trace.data(), a.teams, a.blocks);
  auto traced = [&] {
    kfa::Impl::BackwardPrep16Kernel<Format, kD>(
        reinterpret_cast<const std::uint16_t*>(o.data()),
        reinterpret_cast<const std::uint16_t*>(d_o.data()), delta.data(), acc.data(), B, N, H)
        .launch(space);
    kernel.launch(space);
  };
  traced();
  std::vector<double> traced_ms;
  for (int i = 0; i < 5; ++i) traced_ms.push_back(time_ms(traced));
  KFA_CHECK_CUDA(cudaGetLastError());
  const auto t = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), trace);

  static const char* const kPhase[kEvents] = {
      "Sᵀ, dPᵀ issued; previous dQ tile handed over",
      "wait for Sᵀ",
      "Pᵀ (exp2), dV issued",
      "wait for dPᵀ",
      "dSᵀ computed, dK issued",
      "dSᵀ stored, copies waited for",
      "team barrier, dQ issued",
      "next loads issued; wait for dV, dK, dQ",
      "dQ tile stored",
      "to the next block's top"};
  // durations[wg][phase]: phase e runs from event e to e + 1 (the last to
  // the next block's event 0).
  std::vector<double> dur[2][kEvents], period[2], skew;
  auto at = [&](int team, int wg, int blk, int e) {
    return t(((std::size_t(team) * 2 + wg) * a.blocks + blk) * kEvents + e);
  };
  int used_teams = 0;
  for (int team = 0; team < a.teams; ++team) {
    // The blocks this team traced: those with every event set.
    int n = 0;
    while (n < a.blocks && at(team, 0, n, 0) != 0 && at(team, 0, n, kEvents - 1) != 0 &&
           at(team, 1, n, 0) != 0 && at(team, 1, n, kEvents - 1) != 0)
      ++n;
    if (n < 4) continue;
    ++used_teams;
    for (int blk = 2; blk + 1 < n; ++blk) {
      for (int wg = 0; wg < 2; ++wg) {
        for (int e = 0; e < kEvents; ++e) {
          const long long end =
              e + 1 < kEvents ? at(team, wg, blk, e + 1) : at(team, wg, blk + 1, 0);
          dur[wg][e].push_back(double(end - at(team, wg, blk, e)));
        }
        period[wg].push_back(double(at(team, wg, blk + 1, 0) - at(team, wg, blk, 0)));
      }
      skew.push_back(double(at(team, 1, blk, 7) - at(team, 0, blk, 7)));
    }
  }
  const double lib = median(lib_ms), trc = median(traced_ms);
  const double flops = 2.5 * 4.0 * B * H * double(N) * N * kD / (a.causal ? 2 : 1);
  std::printf("# dQ reductions in boxes of %d fp32 a row\n", DqWide ? 32 : 8);
  std::printf("# bf16 B %d N %d H %d d %d%s: library backward %.3f ms (%.1f TFLOP/s), traced "
              "kernel + prep %.3f ms\n",
              B, N, H, kD, a.causal ? " causal" : "", lib, flops / (lib * 1e-3) / 1e12, trc);
  std::printf("# %d teams, %zu blocks each warpgroup; median cycles (SM clock) per query block\n",
              used_teams, period[0].size());
  std::printf("%-48s %10s %10s\n", "phase", "wg 0", "wg 1");
  for (int e = 0; e < kEvents; ++e)
    std::printf("%-48s %10.0f %10.0f\n", kPhase[e], median(dur[0][e]), median(dur[1][e]));
  std::printf("%-48s %10.0f %10.0f\n", "block period", median(period[0]), median(period[1]));
  std::printf("%-48s %10.0f\n", "wg 1 minus wg 0 past the team barrier", median(skew));
  std::printf(
      "# the products of a block at the tensor cores' peak: 2560 cycles (10 of m64n64k128)\n");
}

}  // namespace

int main(int argc, char* argv[]) {
  const Args a = parse(argc, argv);
  Kokkos::ScopeGuard guard(argc, argv);
  if (a.narrow)
    run<false>(a);
  else
    run<true>(a);
  return 0;
}
