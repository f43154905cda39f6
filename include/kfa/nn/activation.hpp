#ifndef KFA_NN_ACTIVATION_HPP
#define KFA_NN_ACTIVATION_HPP

#include <kfa/nn/options.hpp>

#include <kfa/detail/nn/checks.hpp>
#include <kfa/detail/nn/elementwise_kernels.hpp>

namespace kfa {
namespace Impl {

/// Checks of an elementwise step: `in` [tokens][in_features], `out`
/// [tokens][out_features] (out may be in itself when the features agree).
template <class ExecSpace, class In, class Out>
constexpr bool nn_pair_ok() {
  return view_ok<ExecSpace, In>(2) && view_ok<ExecSpace, Out>(2);
}

}  // namespace Impl

namespace nn {

/// GELU elementwise (torch.nn.functional.gelu, approximate "none" or
/// "tanh"). x, y [tokens][features] (y may be x itself): LayoutRight Views
/// of double, float, kfa::half or kfa::bfloat16 (computed in float)
/// accessible from ExecSpace. Enqueued on `space`.
template <class ExecSpace, class X, class Y>
void gelu_forward(const ExecSpace& space, const X& x, const Y& y,
                  const GeluOptions& options = {}) {
  const char* function = "kfa::nn::gelu_forward";
  Impl::ProfilingRegion region(function);
  Impl::check_nn_view<ExecSpace, X>(function, "x", "[tokens][features]", 2);
  Impl::check_nn_view<ExecSpace, Y>(function, "y", "[tokens][features]", 2);
  if constexpr (Impl::nn_pair_ok<ExecSpace, X, Y>()) {
    using T = typename X::non_const_value_type;
    static_assert(Impl::same_value_type<T, Y>() && Impl::all_non_const<Y>(),
                  "kfa::nn::gelu_forward: y must be a non-const View of x's value type");
    Impl::check_extents(function, "y", "[tokens][features]", y, {x.extent(0), x.extent(1)});
    Impl::check_alias_or_disjoint(function, "y", y, "x", x);
    Impl::gelu_forward_impl<ExecSpace, T>(space, Impl::in_matrix(x), Impl::out_matrix(y),
                                          options.approximate == GeluApproximation::tanh);
  }
}

/// Backward of gelu_forward: dx = dy·gelu'(x) (dx may be dy itself).
template <class ExecSpace, class X, class DY, class DX>
void gelu_backward(const ExecSpace& space, const X& x, const DY& dy, const DX& dx,
                   const GeluOptions& options = {}) {
  const char* function = "kfa::nn::gelu_backward";
  Impl::ProfilingRegion region(function);
  Impl::check_nn_view<ExecSpace, X>(function, "x", "[tokens][features]", 2);
  Impl::check_nn_view<ExecSpace, DY>(function, "dy", "[tokens][features]", 2);
  Impl::check_nn_view<ExecSpace, DX>(function, "dx", "[tokens][features]", 2);
  if constexpr (Impl::nn_pair_ok<ExecSpace, X, DY>() && Impl::view_ok<ExecSpace, DX>(2)) {
    using T = typename X::non_const_value_type;
    static_assert(Impl::same_value_type<T, DY, DX>() && Impl::all_non_const<DX>(),
                  "kfa::nn::gelu_backward: dy and dx must have x's value type, dx non-const");
    Impl::check_extents(function, "dy", "[tokens][features]", dy, {x.extent(0), x.extent(1)});
    Impl::check_extents(function, "dx", "[tokens][features]", dx, {x.extent(0), x.extent(1)});
    Impl::check_alias_or_disjoint(function, "dx", dx, "dy", dy);
    Impl::check_disjoint(function, "dx", dx, "x", x);
    Impl::gelu_backward_impl<ExecSpace, T>(space, Impl::in_matrix(x), Impl::in_matrix(dy),
                                           Impl::out_matrix(dx),
                                           options.approximate == GeluApproximation::tanh);
  }
}

/// SwiGLU: y(t, j) = silu(x(t, j))·x(t, hidden + j), the gate in the first
/// half of x's features and the up projection in the second (Llama's w1 and
/// w3 outputs side by side). x [tokens][2·hidden], y [tokens][hidden]; y must
/// not overlap x. Enqueued on `space`.
template <class ExecSpace, class X, class Y>
void swiglu_forward(const ExecSpace& space, const X& x, const Y& y) {
  const char* function = "kfa::nn::swiglu_forward";
  Impl::ProfilingRegion region(function);
  Impl::check_nn_view<ExecSpace, X>(function, "x", "[tokens][2·hidden]", 2);
  Impl::check_nn_view<ExecSpace, Y>(function, "y", "[tokens][hidden]", 2);
  if constexpr (Impl::nn_pair_ok<ExecSpace, X, Y>()) {
    using T = typename X::non_const_value_type;
    static_assert(Impl::same_value_type<T, Y>() && Impl::all_non_const<Y>(),
                  "kfa::nn::swiglu_forward: y must be a non-const View of x's value type");
    if (x.extent(1) % 2 != 0) {
      Impl::throw_invalid(function, "x must be [tokens][2·hidden] (an even number of "
                                    "features), got " + Impl::extents_string(x));
    }
    Impl::check_extents(function, "y", "[tokens][hidden]", y, {x.extent(0), x.extent(1) / 2});
    Impl::check_disjoint(function, "y", y, "x", x);
    Impl::swiglu_forward_impl<ExecSpace, T>(space, Impl::in_matrix(x), Impl::out_matrix(y));
  }
}

/// Backward of swiglu_forward: dx [tokens][2·hidden] = (d gate | d up),
/// overwritten; dx must not overlap x or dy.
template <class ExecSpace, class X, class DY, class DX>
void swiglu_backward(const ExecSpace& space, const X& x, const DY& dy, const DX& dx) {
  const char* function = "kfa::nn::swiglu_backward";
  Impl::ProfilingRegion region(function);
  Impl::check_nn_view<ExecSpace, X>(function, "x", "[tokens][2·hidden]", 2);
  Impl::check_nn_view<ExecSpace, DY>(function, "dy", "[tokens][hidden]", 2);
  Impl::check_nn_view<ExecSpace, DX>(function, "dx", "[tokens][2·hidden]", 2);
  if constexpr (Impl::nn_pair_ok<ExecSpace, X, DY>() && Impl::view_ok<ExecSpace, DX>(2)) {
    using T = typename X::non_const_value_type;
    static_assert(Impl::same_value_type<T, DY, DX>() && Impl::all_non_const<DX>(),
                  "kfa::nn::swiglu_backward: dy and dx must have x's value type, dx non-const");
    if (x.extent(1) % 2 != 0) {
      Impl::throw_invalid(function, "x must be [tokens][2·hidden] (an even number of "
                                    "features), got " + Impl::extents_string(x));
    }
    Impl::check_extents(function, "dy", "[tokens][hidden]", dy, {x.extent(0), x.extent(1) / 2});
    Impl::check_extents(function, "dx", "[tokens][2·hidden]", dx, {x.extent(0), x.extent(1)});
    Impl::check_disjoint(function, "dx", dx, "x", x);
    Impl::check_disjoint(function, "dx", dx, "dy", dy);
    Impl::swiglu_backward_impl<ExecSpace, T>(space, Impl::in_matrix(x), Impl::in_matrix(dy),
                                             Impl::out_matrix(dx));
  }
}

}  // namespace nn
}  // namespace kfa

#endif
