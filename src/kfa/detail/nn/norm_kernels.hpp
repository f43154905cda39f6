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

  void launch(const ExecSpace& space) const {
    launch_per_row(space, IsRms ? "kfa::nn::rms_norm::forward" : "kfa::nn::layer_norm::forward",
                   *this);
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

  void launch(const ExecSpace& space) const {
    launch_per_row(space,
                   IsRms ? "kfa::nn::rms_norm::backward_dx" : "kfa::nn::layer_norm::backward_dx",
                   *this);
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
