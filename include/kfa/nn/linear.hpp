#ifndef KFA_NN_LINEAR_HPP
#define KFA_NN_LINEAR_HPP

#include <kfa/detail/nn/checks.hpp>
#include <kfa/detail/nn/linear_impl.hpp>

namespace kfa {
namespace nn {

/// y = x·weightᵀ + bias (torch.nn.functional.linear), the product through
/// KokkosBlas::gemm. For kfa::half and kfa::bfloat16 the product accumulates
/// in fp32 (a workspace the call allocates) and y is rounded once, after the
/// bias is added.
///
/// x [tokens][in_features], weight [out_features][in_features], bias
/// [out_features] or an empty View ([0]: no bias), y [tokens][out_features]:
/// LayoutRight Views of double, float, kfa::half or kfa::bfloat16 accessible
/// from ExecSpace; y must not overlap the inputs. Enqueued on `space` (Kokkos Kernels before 4.0
/// has no execution space argument: there the product fences `space`).
/// Throws std::invalid_argument (nothing written) on bad shapes.
template <class ExecSpace, class X, class W, class B, class Y>
void linear_forward(const ExecSpace& space, const X& x, const W& weight, const B& bias,
                    const Y& y) {
  const char* function = "kfa::nn::linear_forward";
  Impl::ProfilingRegion region(function);
  Impl::check_nn_view<ExecSpace, X>(function, "x", "[tokens][in_features]", 2);
  Impl::check_nn_view<ExecSpace, W>(function, "weight", "[out_features][in_features]", 2);
  Impl::check_nn_view<ExecSpace, B>(function, "bias", "[out_features]", 1);
  Impl::check_nn_view<ExecSpace, Y>(function, "y", "[tokens][out_features]", 2);
  if constexpr (Impl::view_ok<ExecSpace, X>(2) && Impl::view_ok<ExecSpace, W>(2) &&
                Impl::view_ok<ExecSpace, B>(1) && Impl::view_ok<ExecSpace, Y>(2)) {
    using T = typename X::non_const_value_type;
    static_assert(Impl::same_value_type<T, W, B, Y>() && Impl::all_non_const<Y>(),
                  "kfa::nn::linear_forward: weight, bias and y must have x's value type, y "
                  "non-const");
    const std::size_t tokens = x.extent(0), in = x.extent(1), out = weight.extent(0);
    Impl::check_extents(function, "weight", "[out_features][in_features]", weight, {out, in});
    Impl::check_optional_vector(function, "bias", "[out_features]", bias, out);
    Impl::check_extents(function, "y", "[tokens][out_features]", y, {tokens, out});
    Impl::check_disjoint(function, "y", y, "x", x);
    Impl::check_disjoint(function, "y", y, "weight", weight);
    Impl::check_disjoint(function, "y", y, "bias", bias);
    Impl::NnScratch<ExecSpace, T> scratch;
    Impl::linear_forward_impl<ExecSpace, T>(space, Impl::in_matrix(x), Impl::in_matrix(weight),
                                            Impl::in_vector(bias), Impl::out_matrix(y), scratch);
  }
}

/// Backward of linear_forward: dx = dy·weight (overwritten; an empty dx
/// [0][0] skips it), dweight += dyᵀ·x and dbias += Σ_tokens dy (accumulated,
/// as PyTorch accumulates parameter gradients; an empty dbias skips it).
///
/// x, weight as in linear_forward; dy [tokens][out_features], dx
/// [tokens][in_features], dweight [out_features][in_features], dbias
/// [out_features] or [0]. dweight and dbias hold x's value type or, for a
/// 16-bit x, float (fp32 gradients, e.g. of fp32 master weights); the
/// 16-bit products accumulate in fp32. The gradients must not overlap the inputs or each
/// other. Enqueued on `space`. Throws std::invalid_argument (nothing
/// written) on bad shapes.
template <class ExecSpace, class X, class W, class DY, class DX, class DW, class DB>
void linear_backward(const ExecSpace& space, const X& x, const W& weight, const DY& dy,
                     const DX& dx, const DW& dweight, const DB& dbias) {
  const char* function = "kfa::nn::linear_backward";
  Impl::ProfilingRegion region(function);
  Impl::check_nn_view<ExecSpace, X>(function, "x", "[tokens][in_features]", 2);
  Impl::check_nn_view<ExecSpace, W>(function, "weight", "[out_features][in_features]", 2);
  Impl::check_nn_view<ExecSpace, DY>(function, "dy", "[tokens][out_features]", 2);
  Impl::check_nn_view<ExecSpace, DX>(function, "dx", "[tokens][in_features]", 2);
  Impl::check_nn_view<ExecSpace, DW>(function, "dweight", "[out_features][in_features]", 2);
  Impl::check_nn_view<ExecSpace, DB>(function, "dbias", "[out_features]", 1);
  if constexpr (Impl::view_ok<ExecSpace, X>(2) && Impl::view_ok<ExecSpace, W>(2) &&
                Impl::view_ok<ExecSpace, DY>(2) && Impl::view_ok<ExecSpace, DX>(2) &&
                Impl::view_ok<ExecSpace, DW>(2) && Impl::view_ok<ExecSpace, DB>(1)) {
    using T = typename X::non_const_value_type;
    using G = typename DW::non_const_value_type;
    static_assert(Impl::same_value_type<T, W, DY, DX>() && Impl::same_value_type<G, DB>() &&
                      (std::is_same<G, T>::value ||
                       std::is_same<G, accumulator_t<T>>::value) &&
                      Impl::all_non_const<DX, DW, DB>(),
                  "kfa::nn::linear_backward: weight, dy and dx must have x's value type, "
                  "dweight and dbias that type or kfa::accumulator_t of it; the gradients "
                  "non-const");
    const std::size_t tokens = x.extent(0), in = x.extent(1), out = weight.extent(0);
    Impl::check_extents(function, "weight", "[out_features][in_features]", weight, {out, in});
    Impl::check_extents(function, "dy", "[tokens][out_features]", dy, {tokens, out});
    if (dx.size() != 0)
      Impl::check_extents(function, "dx", "[tokens][in_features]", dx, {tokens, in});
    Impl::check_extents(function, "dweight", "[out_features][in_features]", dweight, {out, in});
    Impl::check_optional_vector(function, "dbias", "[out_features]", dbias, out);
    auto check_gradient = [&](const char* name, const auto& g) {
      Impl::check_disjoint(function, name, g, "x", x);
      Impl::check_disjoint(function, name, g, "weight", weight);
      Impl::check_disjoint(function, name, g, "dy", dy);
    };
    check_gradient("dx", dx);
    check_gradient("dweight", dweight);
    check_gradient("dbias", dbias);
    Impl::check_disjoint(function, "dx", dx, "dweight", dweight);
    Impl::check_disjoint(function, "dx", dx, "dbias", dbias);
    Impl::check_disjoint(function, "dweight", dweight, "dbias", dbias);
    Impl::NnScratch<ExecSpace, T> scratch;
    Impl::linear_backward_impl<ExecSpace, T, G>(
        space, Impl::in_matrix(x), Impl::in_matrix(weight), Impl::in_matrix(dy),
        Impl::out_matrix(dx), Impl::out_matrix(dweight), Impl::out_vector(dbias), scratch);
  }
}

}  // namespace nn
}  // namespace kfa

#endif
