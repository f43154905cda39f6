#ifndef KFA_NN_DROPOUT_HPP
#define KFA_NN_DROPOUT_HPP

#include <kfa/nn/options.hpp>

#include <kfa/detail/nn/checks.hpp>
#include <kfa/detail/nn/elementwise_kernels.hpp>

namespace kfa {
namespace Impl {

template <class ExecSpace, class R, class X, class Y>
void nn_residual_dropout(const char* function, const char* x_name, const char* y_name,
                         const ExecSpace& space, const R& residual, const X& x, const Y& y,
                         const nn::DropoutOptions& options) {
  ProfilingRegion region(function);
  check_nn_view<ExecSpace, R>(function, "residual", "[tokens][features]", 2);
  check_nn_view<ExecSpace, X>(function, x_name, "[tokens][features]", 2);
  check_nn_view<ExecSpace, Y>(function, y_name, "[tokens][features]", 2);
  if constexpr (view_ok<ExecSpace, R>(2) && view_ok<ExecSpace, X>(2) &&
                view_ok<ExecSpace, Y>(2)) {
    using T = typename X::non_const_value_type;
    static_assert(same_value_type<T, R, Y>() && all_non_const<Y>(),
                  "kfa::nn dropout: every View must have the same value type, the output "
                  "non-const");
    const std::size_t tokens = x.extent(0), features = x.extent(1);
    if (residual.size() != 0)
      check_extents(function, "residual", "[tokens][features]", residual, {tokens, features});
    check_extents(function, y_name, "[tokens][features]", y, {tokens, features});
    check_dropout_p(function, "options.p", options.p);
    // One thread reads and writes each element: the output may be an input.
    check_alias_or_disjoint(function, y_name, y, x_name, x);
    check_alias_or_disjoint(function, y_name, y, "residual", residual);
    residual_dropout_impl<ExecSpace, T>(space, function, in_matrix(residual), in_matrix(x),
                                        out_matrix(y), options);
  }
}

}  // namespace Impl

namespace nn {

/// Dropout (torch.nn.functional.dropout in training mode): y = Z∘x/(1 - p),
/// Z a keep mask drawn by a counter-based generator keyed by (options.seed,
/// token, feature), the same on every backend.
///
/// x, y [tokens][features] (y may be x itself): LayoutRight Views of double,
/// float, kfa::half or kfa::bfloat16 accessible from ExecSpace (16-bit
/// values are scaled in float and rounded once). Enqueued on `space`. Throws
/// std::invalid_argument (nothing written) on bad shapes or p outside [0, 1).
template <class ExecSpace, class X, class Y>
void dropout_forward(const ExecSpace& space, const X& x, const Y& y,
                     const DropoutOptions& options) {
  const Kokkos::View<const typename X::non_const_value_type**, Kokkos::LayoutRight,
                     typename X::memory_space>
      none;
  Impl::nn_residual_dropout("kfa::nn::dropout_forward", "x", "y", space, none, x, y, options);
}

/// Backward of dropout_forward with the same options: dx = Z∘dy/(1 - p),
/// the mask regenerated (dx may be dy itself).
template <class ExecSpace, class DY, class DX>
void dropout_backward(const ExecSpace& space, const DY& dy, const DX& dx,
                      const DropoutOptions& options) {
  const Kokkos::View<const typename DY::non_const_value_type**, Kokkos::LayoutRight,
                     typename DY::memory_space>
      none;
  Impl::nn_residual_dropout("kfa::nn::dropout_backward", "dy", "dx", space, none, dy, dx,
                            options);
}

/// Residual connection with dropout in one pass: y = residual + dropout(x).
/// Its backward: d residual = dy, dx = dropout_backward(dy) with the same
/// options. residual, x, y [tokens][features]; y may be residual or x itself.
template <class ExecSpace, class R, class X, class Y>
void residual_dropout_forward(const ExecSpace& space, const R& residual, const X& x, const Y& y,
                              const DropoutOptions& options = {}) {
  const char* function = "kfa::nn::residual_dropout_forward";
  if (residual.size() == 0 && x.size() != 0) {
    Impl::throw_invalid(function, "residual must be [tokens][features] like x = " +
                                      Impl::extents_string(x) + ", got " +
                                      Impl::extents_string(residual));
  }
  Impl::nn_residual_dropout(function, "x", "y", space, residual, x, y, options);
}

}  // namespace nn
}  // namespace kfa

#endif
