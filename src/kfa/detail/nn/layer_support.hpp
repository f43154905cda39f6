#ifndef KFA_DETAIL_NN_LAYER_SUPPORT_HPP
#define KFA_DETAIL_NN_LAYER_SUPPORT_HPP

// What the layer objects share: workspace Views that are reallocated only
// when a call's shape changes, the host-side weight initialisation
// (reproducible on every backend), per-site dropout seeds, and the checks of
// a layer's [batch][seqlen][d_model] input and output.

#include <kfa/nn/parameter.hpp>
#include <kfa/types.hpp>

#include <kfa/detail/attention/dropout_generator.hpp>
#include <kfa/detail/nn/checks.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace kfa {
namespace Impl {

/// (Re)allocates `view` with `extents` unless it already has them; the
/// contents are not initialised.
template <class ViewType, class... Extents>
void nn_ensure(ViewType& view, const char* label, Extents... extents) {
  const std::size_t wanted[] = {static_cast<std::size_t>(extents)...};
  bool same = view.use_count() > 0;  // a default-constructed View was never allocated
  for (std::size_t r = 0; r < sizeof...(Extents); ++r) same = same && view.extent(r) == wanted[r];
  if (!same) {
    view = ViewType(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), extents...);
  }
}

/// U(-bound, bound) from a host generator, then copied: the same weights on
/// every backend for a given seed.
template <class ViewType>
void nn_init_uniform(const ViewType& view, double bound, std::mt19937_64& rng) {
  auto host = Kokkos::create_mirror_view(view);
  std::uniform_real_distribution<double> dist(-bound, bound);
  for (std::size_t n = 0; n < view.size(); ++n)
    host.data()[n] = from_acc<typename ViewType::non_const_value_type>(dist(rng));
  Kokkos::deep_copy(view, host);
}

/// A dropout seed per site of a layer, derived from the call's seed.
inline std::uint64_t nn_site_seed(std::uint64_t seed, int site) {
  return DropoutGenerator::mix(seed + DropoutGenerator::kGamma * std::uint64_t(site + 1));
}

/// Appends (name, value, grad) for a parameter View and its gradient, of
/// the parameter's type or (fp32 gradients of a 16-bit layer) the
/// accumulator type; the unused one of the pair is empty.
template <class T, class MemorySpace, class ViewType, class GradView, class Fp32GradView>
void nn_add_parameter(std::vector<nn::Parameter<T, MemorySpace>>& list, const std::string& name,
                      const ViewType& value, const GradView& grad,
                      const Fp32GradView& grad_fp32) {
  if (value.size() == 0) return;
  using parameter = nn::Parameter<T, MemorySpace>;
  list.push_back({name, typename parameter::view_type(value.data(), value.size()),
                  typename parameter::view_type(grad.data(), grad.size()),
                  typename parameter::fp32_view_type(grad_fp32.data(), grad_fp32.size())});
}

/// Sets the gradient of every parameter in `list` to zero.
template <class ExecSpace, class List>
void nn_zero_grad(const ExecSpace& space, const List& list) {
  using parameter = typename List::value_type;
  using T = typename parameter::view_type::non_const_value_type;
  using Acc = typename parameter::fp32_view_type::non_const_value_type;
  for (const auto& p : list) {
    if (p.grad.size() > 0) Kokkos::deep_copy(space, p.grad, from_acc<T>(Acc(0)));
    if (p.grad_fp32.size() > 0) Kokkos::deep_copy(space, p.grad_fp32, Acc(0));
  }
}

/// A layer's input and output [batch][seqlen][d_model]: rank, layout, space,
/// contiguity and extents (`like` fixes batch and seqlen).
template <class ExecSpace, class ViewType>
void nn_check_tokens(const char* function, const char* name, const ViewType& view,
                     std::size_t d_model) {
  check_nn_view<ExecSpace, ViewType>(function, name, "[batch][seqlen][d_model]", 3);
  if constexpr (view_ok<ExecSpace, ViewType>(3)) {
    if (view.extent(2) != d_model) {
      throw_invalid(function, std::string(name) + " must be [batch][seqlen][d_model] with d_model = " +
                                  std::to_string(d_model) + ", got " + extents_string(view));
    }
    if (!view.span_is_contiguous()) {
      throw_invalid(function, std::string(name) + " must be contiguous (a LayoutRight View "
                                                  "without padding)");
    }
  }
}

}  // namespace Impl
}  // namespace kfa

#endif
