// Phase timeline of the Hopper backward at head_dim 128 (the library's
// FlashBackwardWgmmaKernel, pipelined, bf16), from inside the kernel: the
// first thread of each warpgroup of the first --teams teams reads the SM
// clock (clock64) at ten points of each query block (ClockProbe, the
// kernel's probe). Prints, per phase, the median cycles a block
// spends in it over the traced blocks (the first two and the last of each
// team left out), for each warpgroup, beside the block's whole period, and
// how far apart the two warpgroups are at the team barrier. Then, from every
// team of the same launch, where a team's time goes outside its query
// blocks (start to the first block, the last dQ tile and the dK/dV stores,
// the wait at the end), the cycles between one team's end and the next
// one's start on an SM, and how long SMs sit idle at the kernel's start and
// end. CUDA builds with KFA_CUDA_SM90A only:
//
//   bench_bwd_trace [--batch 2] [--seqlen 8192] [--heads 16] [--causal]
//                   [--teams 16] [--blocks 64] [--narrow]
//
// --narrow traces the kernel with dQ's tensor reductions in boxes of 8
// fp32 a row (kDqWide false: the library's before RESULTS v49) instead of
// 32.
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

// The probe and the shapes are outside the anonymous namespace: nvcc warns
// of its members where a compilation pass has no wgmma kernel to call them.
namespace bwd_trace {

/// FlashBackwardWgmmaKernel's probe here (kfa::Impl::NoProbe says where the
/// kernel calls it): the SM clock (clock64) at the block events, taken by
/// the first thread of each warpgroup of the first `teams` teams, for their
/// first `blocks` query blocks, at trace[((team · 2 + warpgroup) · blocks +
/// block) · kBlockEvents + event]. And for each of the first `team_count`
/// teams, by its first thread, at team_trace[team · kTeamEvents + event]:
/// 0 the SM's index, 1 to 5 the SM clock at the team events (1 the team's
/// start, 2 its first query block's top, 3 the end of its last block, 4
/// its dK and dV stores issued, 5 its end); 6 and 7 the global timer (ns)
/// at its start and end.
constexpr int kBlockEvents = 10;
constexpr int kTeamEvents = 8;
struct ClockProbe {
  long long* m_trace = nullptr;
  int m_trace_teams = 0, m_trace_blocks = 0;
  long long* m_team_trace = nullptr;
  int m_team_trace_count = 0;

  void set_trace(long long* trace, int teams, int blocks) {
    m_trace = trace;
    m_trace_teams = teams;
    m_trace_blocks = blocks;
  }
  void set_team_trace(long long* team_trace, int team_count) {
    m_team_trace = team_trace;
    m_team_trace_count = team_count;
  }

  KOKKOS_FORCEINLINE_FUNCTION void team_event(int team, int tid, int event) const {
#if defined(__CUDA_ARCH__)
    if (tid != 0 || team >= m_team_trace_count) return;
    long long* const t = m_team_trace + long(team) * kTeamEvents;
    long long now;
    if (event == 1 || event == 5) {
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
      t[event == 1 ? 6 : 7] = now;
    }
    if (event == 1) {
      unsigned sm;
      asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
      t[0] = sm;
    }
    t[event] = clock64();
#else
    (void)team, (void)tid, (void)event;
#endif
  }

  KOKKOS_FORCEINLINE_FUNCTION void block_event(int team, int tid, int wg, int block,
                                               int event) const {
#if defined(__CUDA_ARCH__)
    if (tid % 128 == 0 && team < m_trace_teams && block < m_trace_blocks)
      m_trace[((team * 2 + wg) * m_trace_blocks + block) * kBlockEvents + event] = clock64();
#else
    (void)team, (void)tid, (void)wg, (void)block, (void)event;
#endif
  }
};

/// The library's shape at head_dim 128 with dQ's reductions in boxes of 8
/// fp32 a row (--narrow).
struct NarrowDqShape : kfa::Impl::WgmmaBwdShape<128> {
  static constexpr bool kDqWide = false;
};

}  // namespace bwd_trace

namespace {

using bwd_trace::ClockProbe;
using bwd_trace::kBlockEvents;
using bwd_trace::kTeamEvents;
using bwd_trace::NarrowDqShape;

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

/// Where the teams' time goes (the last run of the traced kernel, every
/// team; ClockProbe's team events): per team, the cycles from its start
/// to its first query block's top (prologue: K, V and the first stages
/// loaded), through its blocks, to its last dQ tile handed over and its dK
/// and dV stored, to its end; per SM, the cycles between one team's end and
/// the next one's start; and over the kernel (global timer), how long the
/// SMs sat idle before their first team and after their last.
template <class TeamTrace>
void team_report(const TeamTrace& tt, int league, int seqlen, int block_m, bool causal) {
  auto ev = [&](int team, int e) { return tt(std::size_t(team) * kTeamEvents + e); };
  std::vector<double> prologue, loop, per_block, last_dq_stores, final_wait, total;
  std::vector<std::vector<int>> by_sm;
  long long t_begin = 0, t_end = 0;
  int traced = 0;
  for (int team = 0; team < league; ++team) {
    if (ev(team, 5) == 0 || ev(team, 7) == 0) continue;
    ++traced;
    const int blocks_of_team = causal ? 0 : (seqlen + block_m - 1) / block_m;
    if (ev(team, 2) != 0) {
      prologue.push_back(double(ev(team, 2) - ev(team, 1)));
      loop.push_back(double(ev(team, 3) - ev(team, 2)));
      if (blocks_of_team > 0) per_block.push_back(loop.back() / blocks_of_team);
    }
    last_dq_stores.push_back(double(ev(team, 4) - ev(team, 3)));
    final_wait.push_back(double(ev(team, 5) - ev(team, 4)));
    total.push_back(double(ev(team, 5) - ev(team, 1)));
    const int sm = int(ev(team, 0));
    if (sm >= int(by_sm.size())) by_sm.resize(sm + 1);
    by_sm[sm].push_back(team);
    t_begin = traced == 1 ? ev(team, 6) : std::min(t_begin, ev(team, 6));
    t_end = std::max(t_end, ev(team, 7));
  }
  if (traced == 0) return;
  std::vector<double> gap, idle_before, idle_after, busy;
  int sms = 0;
  for (auto& teams : by_sm) {
    if (teams.empty()) continue;
    ++sms;
    std::sort(teams.begin(), teams.end(), [&](int x, int y) { return ev(x, 1) < ev(y, 1); });
    double team_cycles = 0;
    for (std::size_t i = 0; i < teams.size(); ++i) {
      team_cycles += double(ev(teams[i], 5) - ev(teams[i], 1));
      if (i > 0) gap.push_back(double(ev(teams[i], 1) - ev(teams[i - 1], 5)));
    }
    busy.push_back(team_cycles / double(ev(teams.back(), 5) - ev(teams.front(), 1)));
    idle_before.push_back(double(ev(teams.front(), 6) - t_begin) * 1e-3);
    idle_after.push_back(double(t_end - ev(teams.back(), 7)) * 1e-3);
  }
  auto mean = [](const std::vector<double>& x) {
    double s = 0;
    for (double v : x) s += v;
    return x.empty() ? 0.0 : s / x.size();
  };
  std::printf("# every team of the traced kernel: %d teams on %d SMs, %.1f us from the first "
              "start to the last end (global timer)\n",
              traced, sms, double(t_end - t_begin) * 1e-3);
  std::printf("%-48s %10s %10s\n", "per team (SM clock cycles)", "median", "mean");
  std::printf("%-48s %10.0f %10.0f\n", "start to the first block's top", median(prologue),
              mean(prologue));
  std::printf("%-48s %10.0f %10.0f\n", "query blocks", median(loop), mean(loop));
  if (!per_block.empty())
    std::printf("%-48s %10.0f %10.0f\n", "  per query block", median(per_block),
                mean(per_block));
  std::printf("%-48s %10.0f %10.0f\n", "last dQ tile handed over, dK and dV stored",
              median(last_dq_stores), mean(last_dq_stores));
  std::printf("%-48s %10.0f %10.0f\n", "copies waited for, to the end", median(final_wait),
              mean(final_wait));
  std::printf("%-48s %10.0f %10.0f\n", "team total", median(total), mean(total));
  std::printf("%-48s %10.0f %10.0f\n", "one team's end to the next's start, same SM",
              median(gap), mean(gap));
  std::printf("%-48s %10.3f %10.3f\n", "SM busy (teams / first start to last end)",
              median(busy), mean(busy));
  std::printf("%-48s %10.2f %10.2f\n", "us idle before the SM's first team", median(idle_before),
              mean(idle_before));
  std::printf("%-48s %10.2f %10.2f\n", "us idle after the SM's last team", median(idle_after),
              mean(idle_after));
}

template <class Shape>
void run(const Args& a) {
  using Space = Kokkos::Cuda;
  using T = kfa::bfloat16;
  using View4 = Kokkos::View<T****, Kokkos::LayoutRight, Space::memory_space>;
  using View3 = Kokkos::View<float***, Kokkos::LayoutRight, Space::memory_space>;
  using Acc = Kokkos::View<float****, Kokkos::LayoutRight, Space::memory_space>;
  using Format = kfa::Impl::MmaFormat<Space, T>::type;
  constexpr int kD = 128;
  using Kernel = kfa::Impl::FlashBackwardWgmmaKernel<Space, kD, Format, View4, View4, View4, View4,
                                                     View3, View3, Acc, View4, View4, Shape,
                                                     ClockProbe>;
  static_assert(Kernel::kPipelined, "bench_bwd_trace: the phases are the pipelined loop's");
  constexpr int kEvents = kBlockEvents;
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
  const int league = B * H * ((N + Kernel::kBlockN - 1) / Kernel::kBlockN);
  Kokkos::View<long long*, Space::memory_space> team_trace("team_trace",
                                                           std::size_t(league) * kTeamEvents);
  Kernel kernel(q, k, v, d_o, lse, delta, acc, dk, dv, scale, a.causal);
  kernel.set_trace(trace.data(), a.teams, a.blocks);
  kernel.set_team_trace(team_trace.data(), league);
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
  const auto tt = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), team_trace);

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
  std::printf("# dQ reductions in boxes of %d fp32 a row\n", Kernel::kDqBoxCols);
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
  team_report(tt, league, N, Kernel::kBlockM, a.causal);
}

}  // namespace

int main(int argc, char* argv[]) {
  const Args a = parse(argc, argv);
  Kokkos::ScopeGuard guard(argc, argv);
  if (a.narrow)
    run<NarrowDqShape>(a);
  else
    run<kfa::Impl::WgmmaBwdShape<128>>(a);
  return 0;
}
