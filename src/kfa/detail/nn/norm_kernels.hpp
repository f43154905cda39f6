#ifndef KFA_DETAIL_NN_NORM_KERNELS_HPP
#define KFA_DETAIL_NN_NORM_KERNELS_HPP

// LayerNorm and RMSNorm over the last extent of [tokens][features]: one team
// per token row. The forward takes the mean first and then the variance of
// x - mean (two passes: no cancellation in E[x²] - E[x]²) and saves mean and
// rstd = 1/sqrt(var + eps) in the accumulator type. The backward recomputes
// x̂ = (x - mean)·rstd and gives
//   dx = rstd·(g - mean(g) - x̂·mean(g·x̂)),  g = dy·gamma
// (RMSNorm: no mean, no mean(g) term); dgamma and dbeta are column sums over
// the tokens, one thread per feature in token order (reproducible).

#include <kfa/types.hpp>

#include <kfa/detail/common/compat.hpp>
#include <kfa/detail/nn/policies.hpp>
#include <kfa/detail/nn/views.hpp>

namespace kfa {
namespace Impl {

/// Σ_j term(j) over a row's features, shared by the team's threads.
template <class Acc, class Member, class Term>
KOKKOS_FORCEINLINE_FUNCTION Acc team_row_sum(const Member& team, int features, const Term& term) {
  Acc sum = 0;
  Kokkos::parallel_reduce(
      Kokkos::TeamThreadRange(team, features), [&](const int j, Acc& s) { s += term(j); }, sum);
  return sum;
}

/// One team per token row of the functor's m_x.
template <class ExecSpace, class Functor>
void launch_per_row(const ExecSpace& space, const char* label, const Functor& functor) {
  Kokkos::parallel_for(
      label, Kokkos::TeamPolicy<ExecSpace>(space, int(functor.m_x.extent(0)), Kokkos::AUTO),
      functor);
}

/// The packed form of the per-row norm kernels on GPUs: a team of
/// kNnNormTeam threads holds a row in registers, kNnNormPacks 16-byte packs
/// per thread at most, and reads it from memory once (the plain form reads
/// it once per pass).
constexpr int kNnNormTeam = 128, kNnNormPacks = 4;
struct NnNormPacked {};

template <class View1>
KOKKOS_FORCEINLINE_FUNCTION void nn_load_pack1(const View1& v, int j0,
                                               typename View1::non_const_value_type* out) {
  const NnBytes16 bytes = *reinterpret_cast<const NnBytes16*>(&v(j0));
  memcpy(static_cast<void*>(out), &bytes, 16);
}

template <class View1>
bool nn_vector_packable(const View1& v) {
  using T = typename View1::non_const_value_type;
  constexpr int w = nn_pack_width<T>();
  return v.extent(0) == 0 ||
         (w > 1 && reinterpret_cast<std::uintptr_t>(v.data()) % 16 == 0 && v.extent(0) % w == 0);
}

/// Launches functor(NnNormPacked, team) on GPUs when `packable`, else the
/// plain per-row kernel.
template <class ExecSpace, class Functor>
void launch_norm_rows(const ExecSpace& space, const char* label, const Functor& functor,
                      bool packable) {
  constexpr int w = Functor::pack_width;
  if constexpr (!nn_host_space<ExecSpace>() && w > 1) {
    const int features = int(functor.m_x.extent(1));
    if (packable && features % w == 0 && features / w <= kNnNormTeam * kNnNormPacks) {
      Kokkos::parallel_for(label,
                           Kokkos::TeamPolicy<ExecSpace, NnNormPacked>(
                               space, int(functor.m_x.extent(0)), kNnNormTeam),
                           functor);
      return;
    }
  }
  launch_per_row(space, label, functor);
}

template <class ExecSpace, class T, bool IsRms>
struct NormForward {
  using memory_space = typename ExecSpace::memory_space;
  using acc_t = accumulator_t<T>;
  using member_type = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  NnIn2<T, memory_space> m_x;
  NnIn1<T, memory_space> m_gamma, m_beta;
  NnOut2<T, memory_space> m_y;
  NnOut1<acc_t, memory_space> m_mean, m_rstd;
  acc_t m_eps;

  KOKKOS_FUNCTION void operator()(const member_type& team) const {
    const int row = team.league_rank(), features = static_cast<int>(m_x.extent(1));
    const acc_t mean =
        IsRms ? acc_t(0)
              : team_row_sum<acc_t>(team, features, [&](int j) { return acc_t(m_x(row, j)); }) /
                    features;
    const acc_t square_sum = team_row_sum<acc_t>(team, features, [&](int j) {
      const acc_t d = acc_t(m_x(row, j)) - mean;
      return d * d;
    });
    const acc_t rstd = acc_t(1) / math::sqrt(square_sum / features + m_eps);
    const bool has_beta = m_beta.extent(0) > 0;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, features), [&](const int j) {
      const acc_t y = (acc_t(m_x(row, j)) - mean) * rstd * acc_t(m_gamma(j));
      m_y(row, j) = from_acc<T>(has_beta ? y + acc_t(m_beta(j)) : y);
    });
    Kokkos::single(Kokkos::PerTeam(team), [&]() {
      if (!IsRms) m_mean(row) = mean;
      m_rstd(row) = rstd;
    });
  }

  static constexpr int pack_width = nn_pack_width<T>();
  using packed_member = typename Kokkos::TeamPolicy<ExecSpace, NnNormPacked>::member_type;

  KOKKOS_FUNCTION void operator()(NnNormPacked, const packed_member& team) const {
    constexpr int W = pack_width;
    const int row = team.league_rank(), features = static_cast<int>(m_x.extent(1));
    const int packs = features / W;
    acc_t v[kNnNormPacks][W];
    acc_t sum = 0;
    #pragma unroll
    for (int k = 0; k < kNnNormPacks; ++k) {
      const int p = team.team_rank() + k * kNnNormTeam;
      if (p >= packs) break;
      T t[W];
      nn_load_pack(m_x, row, p * W, t);
      #pragma unroll
      for (int w = 0; w < W; ++w) {
        v[k][w] = to_acc<acc_t>(t[w]);
        sum += v[k][w];
      }
    }
    acc_t mean = 0;
    if (!IsRms) {
      team.team_reduce(Kokkos::Sum<acc_t>(sum));
      mean = sum / features;
    }
    acc_t square_sum = 0;
    #pragma unroll
    for (int k = 0; k < kNnNormPacks; ++k) {
      if (team.team_rank() + k * kNnNormTeam >= packs) break;
      #pragma unroll
      for (int w = 0; w < W; ++w) square_sum += (v[k][w] - mean) * (v[k][w] - mean);
    }
    team.team_reduce(Kokkos::Sum<acc_t>(square_sum));
    const acc_t rstd = acc_t(1) / math::sqrt(square_sum / features + m_eps);
    const bool has_beta = m_beta.extent(0) > 0;
    #pragma unroll
    for (int k = 0; k < kNnNormPacks; ++k) {
      const int p = team.team_rank() + k * kNnNormTeam;
      if (p >= packs) break;
      T gamma[W], beta[W], out[W];
      nn_load_pack1(m_gamma, p * W, gamma);
      if (has_beta) nn_load_pack1(m_beta, p * W, beta);
      #pragma unroll
      for (int w = 0; w < W; ++w) {
        const acc_t y = (v[k][w] - mean) * rstd * to_acc<acc_t>(gamma[w]);
        out[w] = from_acc<T>(has_beta ? y + to_acc<acc_t>(beta[w]) : y);
      }
      nn_store_pack(m_y, row, p * W, out);
    }
    if (team.team_rank() == 0) {
      if (!IsRms) m_mean(row) = mean;
      m_rstd(row) = rstd;
    }
  }

  void launch(const ExecSpace& space) const {
    launch_norm_rows(space, IsRms ? "kfa::nn::rms_norm::forward" : "kfa::nn::layer_norm::forward",
                     *this,
                     nn_rows_packable(m_x) && nn_rows_packable(m_y) &&
                         nn_vector_packable(m_gamma) && nn_vector_packable(m_beta));
  }
};

/// dx = rstd·(g - mean(g) - x̂·mean(g·x̂)), written or (Accumulate) added.
template <class ExecSpace, class T, bool IsRms>
struct NormBackwardInput {
  using memory_space = typename ExecSpace::memory_space;
  using acc_t = accumulator_t<T>;
  using member_type = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  NnIn2<T, memory_space> m_x, m_dy;
  NnIn1<T, memory_space> m_gamma;
  NnIn1<acc_t, memory_space> m_mean, m_rstd;
  NnOut2<T, memory_space> m_dx;
  bool m_accumulate;

  KOKKOS_FUNCTION void operator()(const member_type& team) const {
    const int row = team.league_rank(), features = static_cast<int>(m_x.extent(1));
    const acc_t mean = IsRms ? acc_t(0) : m_mean(row), rstd = m_rstd(row);
    const acc_t sum_g = IsRms ? acc_t(0) : team_row_sum<acc_t>(team, features, [&](int j) {
      return acc_t(m_dy(row, j)) * acc_t(m_gamma(j));
    });
    const acc_t sum_gx = team_row_sum<acc_t>(team, features, [&](int j) {
      return acc_t(m_dy(row, j)) * acc_t(m_gamma(j)) * (acc_t(m_x(row, j)) - mean) * rstd;
    });
    const acc_t mean_g = sum_g / features, mean_gx = sum_gx / features;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, features), [&](const int j) {
      const acc_t x_hat = (acc_t(m_x(row, j)) - mean) * rstd;
      const acc_t g = acc_t(m_dy(row, j)) * acc_t(m_gamma(j));
      const acc_t dx = rstd * (g - mean_g - x_hat * mean_gx);
      m_dx(row, j) = from_acc<T>(m_accumulate ? acc_t(m_dx(row, j)) + dx : dx);
    });
  }

  static constexpr int pack_width = nn_pack_width<T>();
  using packed_member = typename Kokkos::TeamPolicy<ExecSpace, NnNormPacked>::member_type;

  KOKKOS_FUNCTION void operator()(NnNormPacked, const packed_member& team) const {
    constexpr int W = pack_width;
    const int row = team.league_rank(), features = static_cast<int>(m_x.extent(1));
    const int packs = features / W;
    const acc_t mean = IsRms ? acc_t(0) : m_mean(row), rstd = m_rstd(row);
    // x̂ and g = dy·gamma of the thread's packs.
    acc_t x_hat[kNnNormPacks][W], g[kNnNormPacks][W];
    acc_t sum_g = 0, sum_gx = 0;
    #pragma unroll
    for (int k = 0; k < kNnNormPacks; ++k) {
      const int p = team.team_rank() + k * kNnNormTeam;
      if (p >= packs) break;
      T x[W], dy[W], gamma[W];
      nn_load_pack(m_x, row, p * W, x);
      nn_load_pack(m_dy, row, p * W, dy);
      nn_load_pack1(m_gamma, p * W, gamma);
      #pragma unroll
      for (int w = 0; w < W; ++w) {
        x_hat[k][w] = (to_acc<acc_t>(x[w]) - mean) * rstd;
        g[k][w] = to_acc<acc_t>(dy[w]) * to_acc<acc_t>(gamma[w]);
        sum_g += g[k][w];
        sum_gx += g[k][w] * x_hat[k][w];
      }
    }
    if (!IsRms) team.team_reduce(Kokkos::Sum<acc_t>(sum_g));
    team.team_reduce(Kokkos::Sum<acc_t>(sum_gx));
    const acc_t mean_g = IsRms ? acc_t(0) : sum_g / features, mean_gx = sum_gx / features;
    #pragma unroll
    for (int k = 0; k < kNnNormPacks; ++k) {
      const int p = team.team_rank() + k * kNnNormTeam;
      if (p >= packs) break;
      T out[W];
      if (m_accumulate) nn_load_pack(m_dx, row, p * W, out);
      #pragma unroll
      for (int w = 0; w < W; ++w) {
        const acc_t dx = rstd * (g[k][w] - mean_g - x_hat[k][w] * mean_gx);
        out[w] = from_acc<T>(m_accumulate ? to_acc<acc_t>(out[w]) + dx : dx);
      }
      nn_store_pack(m_dx, row, p * W, out);
    }
  }

  void launch(const ExecSpace& space) const {
    launch_norm_rows(space,
                     IsRms ? "kfa::nn::rms_norm::backward_dx" : "kfa::nn::layer_norm::backward_dx",
                     *this,
                     nn_rows_packable(m_x) && nn_rows_packable(m_dy) && nn_rows_packable(m_dx) &&
                         nn_vector_packable(m_gamma));
  }
};

/// dgamma += Σ_tokens dy·x̂, dbeta += Σ_tokens dy (dbeta skipped when empty);
/// the gradients of type G (T, or fp32 for a 16-bit T).
template <class ExecSpace, class T, bool IsRms, class G = T>
struct NormBackwardParameters {
  using memory_space = typename ExecSpace::memory_space;
  using acc_t = accumulator_t<T>;
  NnIn2<T, memory_space> m_x, m_dy;
  NnIn1<acc_t, memory_space> m_mean, m_rstd;
  NnOut1<G, memory_space> m_dgamma, m_dbeta;

  /// The terms of row `row`: dgamma's and dbeta's.
  KOKKOS_FUNCTION Kokkos::Array<acc_t, 2> operator()(const int row, const int j) const {
    const acc_t mean = IsRms ? acc_t(0) : m_mean(row);
    const acc_t dy = to_acc<acc_t>(m_dy(row, j));
    return {dy * (to_acc<acc_t>(m_x(row, j)) - mean) * m_rstd(row), dy};
  }

  struct Finish {
    NnOut1<G, memory_space> m_dgamma, m_dbeta;
    KOKKOS_FUNCTION void operator()(const int j, const Kokkos::Array<acc_t, 2>& s) const {
      m_dgamma(j) = from_acc<G>(to_acc<acc_t>(m_dgamma(j)) + s[0]);
      if (m_dbeta.extent(0) > 0) m_dbeta(j) = from_acc<G>(to_acc<acc_t>(m_dbeta(j)) + s[1]);
    }
  };

  void launch(const ExecSpace& space) const {
    const char* label =
        IsRms ? "kfa::nn::rms_norm::backward_dgamma" : "kfa::nn::layer_norm::backward_dgamma";
    nn_column_sums<acc_t, 2>(label, space, int(m_x.extent(0)), int(m_x.extent(1)), *this,
                             Finish{m_dgamma, m_dbeta});
  }
};

/// Forward of either norm; mean is unused (may be empty) for RMSNorm.
template <class ExecSpace, class T, bool IsRms>
void norm_forward_impl(const ExecSpace& space, const NnIn2<T, typename ExecSpace::memory_space>& x,
                       const NnIn1<T, typename ExecSpace::memory_space>& gamma,
                       const NnIn1<T, typename ExecSpace::memory_space>& beta,
                       const NnOut2<T, typename ExecSpace::memory_space>& y,
                       const NnOut1<accumulator_t<T>, typename ExecSpace::memory_space>& mean,
                       const NnOut1<accumulator_t<T>, typename ExecSpace::memory_space>& rstd,
                       double eps) {
  if (x.extent(0) == 0 || x.extent(1) == 0) return;
  NormForward<ExecSpace, T, IsRms>{x, gamma, beta, y, mean, rstd, accumulator_t<T>(eps)}.launch(
      space);
}

/// Backward of either norm: dx written (or added with accumulate_dx), dgamma
/// and dbeta (when not empty, of type G) accumulated.
template <class ExecSpace, class T, bool IsRms, class G = T>
void norm_backward_impl(const ExecSpace& space,
                        const NnIn2<T, typename ExecSpace::memory_space>& x,
                        const NnIn1<T, typename ExecSpace::memory_space>& gamma,
                        const NnIn1<accumulator_t<T>, typename ExecSpace::memory_space>& mean,
                        const NnIn1<accumulator_t<T>, typename ExecSpace::memory_space>& rstd,
                        const NnIn2<T, typename ExecSpace::memory_space>& dy,
                        const NnOut2<T, typename ExecSpace::memory_space>& dx,
                        const NnOut1<G, typename ExecSpace::memory_space>& dgamma,
                        const NnOut1<G, typename ExecSpace::memory_space>& dbeta,
                        bool accumulate_dx = false) {
  if (x.extent(0) == 0 || x.extent(1) == 0) return;
  NormBackwardInput<ExecSpace, T, IsRms>{x, dy, gamma, mean, rstd, dx, accumulate_dx}.launch(
      space);
  NormBackwardParameters<ExecSpace, T, IsRms, G>{x, dy, mean, rstd, dgamma, dbeta}.launch(space);
}

}  // namespace Impl
}  // namespace kfa

#endif
