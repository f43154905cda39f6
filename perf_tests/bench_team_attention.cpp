// Many tiny attention problems (per-particle neighbourhood attention): the
// caller's TeamPolicy kernel calling kfa::Experimental::team_attention_*
// (one team per problem) against the same problems as one packed batch
// through kfa::flash_attention_varlen_*, on the default execution space.
// One line per (pass, team shape):
//   team-attention <type> problems=<P> nq=<nq> nk=<nk> d=<d> <fwd|fwd+bwd>
//     team=<T>x<V> [staged] team_ms=<ms> varlen_ms=<ms> speedup=<varlen/team>
//     max_diff=<max |O_team - O_varlen|>
// Times are the best of --repeat runs after one warm-up, each ending with a
// fence; the varlen calls fence anyway (they validate the offsets on the
// host). --stage copies q, k, v into team scratch first (rows padded by one
// element, so that threads reading a column each of consecutive rows hit
// different shared-memory banks).
//   bench_team_attention [--type float|double] [--problems 100000] [--nq 32]
//                        [--nk 32] [--head-dim 32] [--causal] [--repeat 5]
//                        [--shapes 1x1,32x1,...] [--stage] [--pass fwd|fwd+bwd|both]

#include "bench_fill.hpp"

#include <kfa/kfa.hpp>
#include <kfa/team_attention.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

namespace {

using Space = Kokkos::DefaultExecutionSpace;
using kfa::Experimental::TeamAttentionOptions;

struct TeamShape {
  int team_size, vector_length;
};

struct Args {
  std::string type = "float", pass = "both";
  int problems = 100000, nq = 32, nk = 32, head_dim = 32, repeat = 5;
  bool causal = false, stage = false;
  std::vector<TeamShape> shapes;
};

std::vector<TeamShape> shape_list(const std::string& s) {
  std::vector<TeamShape> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) {
    const std::size_t x = item.find('x');
    out.push_back({std::stoi(item.substr(0, x)),
                   x == std::string::npos ? 1 : std::stoi(item.substr(x + 1))});
  }
  return out;
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_team_attention: %s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--type") a.type = next();
    else if (arg == "--problems") a.problems = std::stoi(next());
    else if (arg == "--nq") a.nq = std::stoi(next());
    else if (arg == "--nk") a.nk = std::stoi(next());
    else if (arg == "--head-dim") a.head_dim = std::stoi(next());
    else if (arg == "--repeat") a.repeat = std::stoi(next());
    else if (arg == "--shapes") a.shapes = shape_list(next());
    else if (arg == "--pass") a.pass = next();
    else if (arg == "--causal") a.causal = true;
    else if (arg == "--stage") a.stage = true;
    else {
      std::fprintf(stderr, "bench_team_attention: unknown argument %s\n", arg.c_str());
      std::exit(2);
    }
  }
  if (a.shapes.empty()) {
#ifdef KOKKOS_ENABLE_CUDA
    a.shapes = shape_list("32x1,8x4,4x8,1x32,64x1");
#else
    a.shapes = shape_list("1x1");
#endif
  }
  return a;
}

/// Best of `repeat` timed runs of f, after one warm-up run.
template <class F>
double best_seconds(int repeat, F&& f) {
  f();
  double best = 1e300;
  for (int r = 0; r < repeat; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

/// The caller's kernel: team p attends problem p's nq rows of q to its nk
/// rows of k and v (rows [p·n, (p+1)·n) of the packed [rows][1][d] Views the
/// varlen path reads too).
template <class T, bool Backward>
struct ProblemKernel {
  using acc_t = kfa::accumulator_t<T>;
  using mem = Space::memory_space;
  using V3 = Kokkos::View<T***, Kokkos::LayoutRight, mem>;
  using L2 = Kokkos::View<acc_t**, Kokkos::LayoutRight, mem>;
  using member_t = Kokkos::TeamPolicy<Space>::member_type;
  using scratch_space = Space::scratch_memory_space;
  using ScratchAcc = Kokkos::View<acc_t*, scratch_space, Kokkos::MemoryUnmanaged>;
  using ScratchTile = Kokkos::View<T**, Kokkos::LayoutRight, scratch_space, Kokkos::MemoryUnmanaged>;

  V3 m_q, m_k, m_v, m_o, m_do, m_dq, m_dk, m_dv;
  L2 m_lse;
  int m_nq, m_nk;
  bool m_stage;
  TeamAttentionOptions m_options;

  static std::size_t scratch_bytes(int nq, int nk, int d, bool stage) {
    return kfa::Experimental::team_attention_scratch_bytes<T>(nq, nk) +
           (stage ? ScratchTile::shmem_size(nq, d + 1) + 2 * ScratchTile::shmem_size(nk, d + 1)
                  : 0);
  }

  /// Rows [begin, begin + n) of a packed View as [n][d].
  static KOKKOS_INLINE_FUNCTION auto rows(const V3& x, int begin, int n) {
    return Kokkos::subview(x, Kokkos::make_pair(begin, begin + n), 0, Kokkos::ALL());
  }

  KOKKOS_INLINE_FUNCTION void operator()(const member_t& team) const {
    const int p = team.league_rank(), q0 = p * m_nq, k0 = p * m_nk;
    const int d = static_cast<int>(m_q.extent(2));
    const auto q = rows(m_q, q0, m_nq);
    const auto k = rows(m_k, k0, m_nk);
    const auto v = rows(m_v, k0, m_nk);
    const auto lse = Kokkos::subview(m_lse, 0, Kokkos::make_pair(q0, q0 + m_nq));
    const ScratchAcc work(team.team_scratch(0),
                          kfa::Experimental::team_attention_scratch_size(m_nq, m_nk));
    if (m_stage) {
      const auto cols = Kokkos::make_pair(0, d);
      const ScratchTile sQ_pad(team.team_scratch(0), m_nq, d + 1),
          sK_pad(team.team_scratch(0), m_nk, d + 1), sV_pad(team.team_scratch(0), m_nk, d + 1);
      const auto sQ = Kokkos::subview(sQ_pad, Kokkos::ALL(), cols);
      const auto sK = Kokkos::subview(sK_pad, Kokkos::ALL(), cols);
      const auto sV = Kokkos::subview(sV_pad, Kokkos::ALL(), cols);
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, m_nq), [&](const int i) {
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, d),
                             [&](const int c) { sQ(i, c) = q(i, c); });
      });
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, m_nk), [&](const int j) {
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, d), [&](const int c) {
          sK(j, c) = k(j, c);
          sV(j, c) = v(j, c);
        });
      });
      // The staged tiles are visible to every thread.
      team.team_barrier();
      run(team, sQ, sK, sV, lse, work, q0, k0);
    } else {
      run(team, q, k, v, lse, work, q0, k0);
    }
  }

  template <class Q, class K, class V, class L>
  KOKKOS_INLINE_FUNCTION void run(const member_t& team, const Q& q, const K& k, const V& v,
                                  const L& lse, const ScratchAcc& work, int q0, int k0) const {
    const auto o = rows(m_o, q0, m_nq);
    if constexpr (Backward) {
      kfa::Experimental::team_attention_backward(team, q, k, v, o, lse, rows(m_do, q0, m_nq),
                                                 rows(m_dq, q0, m_nq), rows(m_dk, k0, m_nk),
                                                 rows(m_dv, k0, m_nk), work, m_options);
    } else {
      kfa::Experimental::team_attention_forward(team, q, k, v, o, lse, work, m_options);
    }
  }
};

template <class T>
void run_type(const Args& a, const char* name) {
  using Fwd = ProblemKernel<T, false>;
  using Bwd = ProblemKernel<T, true>;
  using V3 = typename Fwd::V3;
  using L2 = typename Fwd::L2;
  const Space space;
  const int P = a.problems, d = a.head_dim, total_q = P * a.nq, total_k = P * a.nk;
  V3 q("q", total_q, 1, d), k("k", total_k, 1, d), v("v", total_k, 1, d), o("o", total_q, 1, d),
      o_team("o_team", total_q, 1, d), d_o("do", total_q, 1, d), dq("dq", total_q, 1, d),
      dk("dk", total_k, 1, d), dv("dv", total_k, 1, d);
  L2 lse("lse", 1, total_q), lse_team("lse_team", 1, total_q);
  fill_uniform<Space>({q, k, v, d_o});
  Kokkos::View<int*, Space::memory_space> cu_q("cu_seqlens_q", P + 1), cu_k("cu_seqlens_k", P + 1);
  const int nq = a.nq, nk = a.nk;
  Kokkos::parallel_for(
      "bench::offsets", Kokkos::RangePolicy<Space>(0, P + 1), KOKKOS_LAMBDA(const int p) {
        cu_q(p) = p * nq;
        cu_k(p) = p * nk;
      });
  kfa::AttentionOptions opt;
  opt.causal = a.causal;
  TeamAttentionOptions team_opt;
  team_opt.causal = a.causal;

  for (const bool backward : {false, true}) {
    if ((backward && a.pass == "fwd") || (!backward && a.pass == "fwd+bwd")) continue;
    const double varlen_s = best_seconds(a.repeat, [&] {
      kfa::flash_attention_varlen_forward(space, q, k, v, cu_q, cu_k, nq, nk, o, lse, opt);
      if (backward)
        kfa::flash_attention_varlen_backward(space, q, k, v, cu_q, cu_k, nq, nk, o, lse, d_o, dq,
                                             dk, dv, opt);
      space.fence();
    });
    for (const TeamShape shape : a.shapes) {
      const Fwd fwd{q, k, v, o_team, d_o, dq, dk, dv, lse_team, nq, nk, a.stage, team_opt};
      const Bwd bwd{q, k, v, o_team, d_o, dq, dk, dv, lse_team, nq, nk, a.stage, team_opt};
      Kokkos::TeamPolicy<Space> policy(space, P, shape.team_size, shape.vector_length);
      policy.set_scratch_size(0, Kokkos::PerTeam(Fwd::scratch_bytes(nq, nk, d, a.stage)));
      const int max_team = policy.team_size_max(fwd, Kokkos::ParallelForTag());
      if (shape.team_size > max_team) {
        std::printf("# team %dx%d: more than the %d threads a team may have here\n",
                    shape.team_size, shape.vector_length, max_team);
        continue;
      }
      const double team_s = best_seconds(a.repeat, [&] {
        Kokkos::parallel_for("bench::team_attention_forward", policy, fwd);
        if (backward) Kokkos::parallel_for("bench::team_attention_backward", policy, bwd);
        space.fence();
      });
      // Both paths' O from the same inputs (the last varlen run left o).
      double max_diff = 0;
      Kokkos::parallel_reduce(
          "bench::compare", Kokkos::RangePolicy<Space>(space, 0, total_q * d),
          KOKKOS_LAMBDA(const int n, double& m) {
            const double x = static_cast<double>(static_cast<float>(o_team(n / d, 0, n % d))) -
                             static_cast<double>(static_cast<float>(o(n / d, 0, n % d)));
            const double ax = x < 0 ? -x : x;
            m = ax > m ? ax : m;
          },
          Kokkos::Max<double>(max_diff));
      std::printf(
          "team-attention %s problems=%d nq=%d nk=%d d=%d %s%s team=%dx%d%s team_ms=%.3f "
          "varlen_ms=%.3f speedup=%.2f max_diff=%.3g\n",
          name, P, nq, nk, d, backward ? "fwd+bwd" : "fwd", a.causal ? " causal" : "",
          shape.team_size, shape.vector_length, a.stage ? " staged" : "", team_s * 1e3,
          varlen_s * 1e3, varlen_s / team_s, max_diff);
      std::fflush(stdout);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  Kokkos::ScopeGuard guard(argc, argv);
  std::printf("# %s, concurrency %d, best of %d\n", Space::name(), Space().concurrency(),
              a.repeat);
  if (a.type == "float") run_type<float>(a, "float");
  else if (a.type == "double") run_type<double>(a, "double");
  else {
    std::fprintf(stderr, "bench_team_attention: --type float or double\n");
    return 2;
  }
  return 0;
}
