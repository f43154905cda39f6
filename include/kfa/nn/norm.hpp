#ifndef KFA_NN_NORM_HPP
#define KFA_NN_NORM_HPP

#include <kfa/nn/options.hpp>

#include <kfa/detail/nn/checks.hpp>
#include <kfa/detail/nn/norm_kernels.hpp>

#include <cmath>

namespace kfa {
namespace Impl {

template <class ExecSpace, bool IsRms, class X, class G, class B, class Y, class Mean, class Rstd>
void nn_norm_forward(const char* function, const ExecSpace& space, const X& x, const G& gamma,
                  const B& beta, const Y& y, const Mean& mean, const Rstd& rstd,
                  const nn::NormOptions& options) {
  ProfilingRegion region(function);
  check_nn_view<ExecSpace, X>(function, "x", "[tokens][features]", 2);
  check_nn_view<ExecSpace, G>(function, "gamma", "[features]", 1);
  check_nn_view<ExecSpace, B>(function, "beta", "[features]", 1);
  check_nn_view<ExecSpace, Y>(function, "y", "[tokens][features]", 2);
  if constexpr (!IsRms) check_nn_view<ExecSpace, Mean>(function, "mean", "[tokens]", 1);
  check_nn_view<ExecSpace, Rstd>(function, "rstd", "[tokens]", 1);
  if constexpr (view_ok<ExecSpace, X>(2) && view_ok<ExecSpace, G>(1) &&
                view_ok<ExecSpace, B>(1) && view_ok<ExecSpace, Y>(2) &&
                view_ok<ExecSpace, Mean>(1) && view_ok<ExecSpace, Rstd>(1)) {
    using T = typename X::non_const_value_type;
    using acc_t = accumulator_t<T>;
    static_assert(same_value_type<T, G, B, Y>() && same_value_type<acc_t, Mean, Rstd>() &&
                      all_non_const<Y, Mean, Rstd>(),
                  "kfa::nn norm forward: gamma, beta and y must have x's value type, mean and "
                  "rstd kfa::accumulator_t of it; y, mean, rstd non-const");
    const std::size_t tokens = x.extent(0), features = x.extent(1);
    check_extents(function, "gamma", "[features]", gamma, {features});
    check_optional_vector(function, "beta", "[features]", beta, features);
    check_extents(function, "y", "[tokens][features]", y, {tokens, features});
    if (!IsRms) check_extents(function, "mean", "[tokens]", mean, {tokens});
    check_extents(function, "rstd", "[tokens]", rstd, {tokens});
    if (!(options.eps >= 0) || !std::isfinite(options.eps)) {
      throw_invalid(function, "options.eps must be finite and >= 0, got " +
                                     std::to_string(options.eps));
    }
    // A team reads its whole row (mean, variance) before writing it: y may be x.
    check_alias_or_disjoint(function, "y", y, "x", x);
    check_disjoint(function, "y", y, "gamma", gamma);
    check_disjoint(function, "y", y, "beta", beta);
    check_disjoint(function, "mean", mean, "x", x);
    check_disjoint(function, "rstd", rstd, "x", x);
    check_disjoint(function, "mean", mean, "y", y);
    check_disjoint(function, "rstd", rstd, "y", y);
    norm_forward_impl<ExecSpace, T, IsRms>(space, in_matrix(x), in_vector(gamma),
                                              in_vector(beta), out_matrix(y),
                                              out_vector(mean), out_vector(rstd),
                                              options.eps);
  }
}

template <class ExecSpace, bool IsRms, class X, class G, class Mean, class Rstd, class DY,
          class DX, class DG, class DB>
void nn_norm_backward(const char* function, const ExecSpace& space, const X& x, const G& gamma,
                   const Mean& mean, const Rstd& rstd, const DY& dy, const DX& dx,
                   const DG& dgamma, const DB& dbeta) {
  ProfilingRegion region(function);
  check_nn_view<ExecSpace, X>(function, "x", "[tokens][features]", 2);
  check_nn_view<ExecSpace, G>(function, "gamma", "[features]", 1);
  if constexpr (!IsRms) check_nn_view<ExecSpace, Mean>(function, "mean", "[tokens]", 1);
  check_nn_view<ExecSpace, Rstd>(function, "rstd", "[tokens]", 1);
  check_nn_view<ExecSpace, DY>(function, "dy", "[tokens][features]", 2);
  check_nn_view<ExecSpace, DX>(function, "dx", "[tokens][features]", 2);
  check_nn_view<ExecSpace, DG>(function, "dgamma", "[features]", 1);
  check_nn_view<ExecSpace, DB>(function, "dbeta", "[features]", 1);
  if constexpr (view_ok<ExecSpace, X>(2) && view_ok<ExecSpace, G>(1) &&
                view_ok<ExecSpace, Mean>(1) && view_ok<ExecSpace, Rstd>(1) &&
                view_ok<ExecSpace, DY>(2) && view_ok<ExecSpace, DX>(2) &&
                view_ok<ExecSpace, DG>(1) && view_ok<ExecSpace, DB>(1)) {
    using T = typename X::non_const_value_type;
    using acc_t = accumulator_t<T>;
    using GradT = typename DG::non_const_value_type;
    static_assert(same_value_type<T, G, DY, DX>() && same_value_type<GradT, DB>() &&
                      (std::is_same<GradT, T>::value || std::is_same<GradT, acc_t>::value) &&
                      same_value_type<acc_t, Mean, Rstd>() && all_non_const<DX, DG, DB>(),
                  "kfa::nn norm backward: gamma, dy and dx must have x's value type, dgamma "
                  "and dbeta that type or kfa::accumulator_t of it, mean and rstd "
                  "kfa::accumulator_t of it; the gradients non-const");
    const std::size_t tokens = x.extent(0), features = x.extent(1);
    check_extents(function, "gamma", "[features]", gamma, {features});
    if (!IsRms) check_extents(function, "mean", "[tokens]", mean, {tokens});
    check_extents(function, "rstd", "[tokens]", rstd, {tokens});
    check_extents(function, "dy", "[tokens][features]", dy, {tokens, features});
    check_extents(function, "dx", "[tokens][features]", dx, {tokens, features});
    check_extents(function, "dgamma", "[features]", dgamma, {features});
    check_optional_vector(function, "dbeta", "[features]", dbeta, features);
    auto check_gradient = [&](const char* name, const auto& g) {
      check_disjoint(function, name, g, "x", x);
      check_disjoint(function, name, g, "gamma", gamma);
      check_disjoint(function, name, g, "mean", mean);
      check_disjoint(function, name, g, "rstd", rstd);
      check_disjoint(function, name, g, "dy", dy);
    };
    check_gradient("dx", dx);
    check_gradient("dgamma", dgamma);
    check_gradient("dbeta", dbeta);
    check_disjoint(function, "dx", dx, "dgamma", dgamma);
    check_disjoint(function, "dx", dx, "dbeta", dbeta);
    check_disjoint(function, "dgamma", dgamma, "dbeta", dbeta);
    norm_backward_impl<ExecSpace, T, IsRms, GradT>(space, in_matrix(x), in_vector(gamma),
                                               in_vector(mean), in_vector(rstd),
                                               in_matrix(dy), out_matrix(dx),
                                               out_vector(dgamma), out_vector(dbeta));
  }
}

}  // namespace Impl

namespace nn {

/// LayerNorm over the last extent (torch.nn.functional.layer_norm with
/// normalized_shape = [features]): y = (x - mean)·rstd·gamma + beta,
/// rstd = 1/sqrt(biased variance + eps). Saves mean and rstd for the backward.
///
/// x, y [tokens][features] (y may be x itself), gamma [features], beta
/// [features] or an empty View ([0]: no shift), mean, rstd [tokens] of
/// kfa::accumulator_t<T>. LayoutRight Views of double, float, kfa::half or
/// kfa::bfloat16 accessible from ExecSpace (the 16-bit types compute in
/// float and round y once). Enqueued on `space`; no fence. Throws
/// std::invalid_argument (nothing written) on bad shapes or options.
template <class ExecSpace, class X, class G, class B, class Y, class Mean, class Rstd>
void layer_norm_forward(const ExecSpace& space, const X& x, const G& gamma, const B& beta,
                        const Y& y, const Mean& mean, const Rstd& rstd,
                        const NormOptions& options = {}) {
  Impl::nn_norm_forward<ExecSpace, false>("kfa::nn::layer_norm_forward", space, x, gamma, beta, y,
                                       mean, rstd, options);
}

/// Backward of layer_norm_forward from its saved mean and rstd: dx
/// overwritten, dgamma and dbeta accumulated (+=; an empty dbeta skips it).
///
/// x, dy, dx [tokens][features]; gamma, dgamma, dbeta [features]; mean, rstd
/// [tokens]. dgamma and dbeta hold x's value type or kfa::accumulator_t of
/// it (fp32 gradients of a 16-bit layer). The gradients must not overlap the
/// inputs or each other.
template <class ExecSpace, class X, class G, class Mean, class Rstd, class DY, class DX, class DG,
          class DB>
void layer_norm_backward(const ExecSpace& space, const X& x, const G& gamma, const Mean& mean,
                         const Rstd& rstd, const DY& dy, const DX& dx, const DG& dgamma,
                         const DB& dbeta) {
  Impl::nn_norm_backward<ExecSpace, false>("kfa::nn::layer_norm_backward", space, x, gamma, mean,
                                        rstd, dy, dx, dgamma, dbeta);
}

/// RMSNorm over the last extent (torch.nn.functional.rms_norm): y =
/// x·rstd·gamma, rstd = 1/sqrt(mean(x²) + eps). Saves rstd for the backward.
/// Arguments as in layer_norm_forward, without beta and mean.
template <class ExecSpace, class X, class G, class Y, class Rstd>
void rms_norm_forward(const ExecSpace& space, const X& x, const G& gamma, const Y& y,
                      const Rstd& rstd, const NormOptions& options = {}) {
  const Kokkos::View<const typename X::non_const_value_type*, Kokkos::LayoutRight,
                     typename X::memory_space>
      no_beta;
  Impl::nn_norm_forward<ExecSpace, true>("kfa::nn::rms_norm_forward", space, x, gamma, no_beta, y,
                                      rstd, rstd, options);
}

/// Backward of rms_norm_forward: dx overwritten, dgamma accumulated.
template <class ExecSpace, class X, class G, class Rstd, class DY, class DX, class DG>
void rms_norm_backward(const ExecSpace& space, const X& x, const G& gamma, const Rstd& rstd,
                       const DY& dy, const DX& dx, const DG& dgamma) {
  const Kokkos::View<typename DG::non_const_value_type*, Kokkos::LayoutRight,
                     typename X::memory_space>
      no_dbeta;
  Impl::nn_norm_backward<ExecSpace, true>("kfa::nn::rms_norm_backward", space, x, gamma, rstd, rstd,
                                       dy, dx, dgamma, no_dbeta);
}

}  // namespace nn
}  // namespace kfa

#endif
