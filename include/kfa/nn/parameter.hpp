#ifndef KFA_NN_PARAMETER_HPP
#define KFA_NN_PARAMETER_HPP

#include <kfa/types.hpp>

#include <Kokkos_Core.hpp>

#include <string>

namespace kfa {
namespace nn {

/// One parameter tensor of a layer, flattened: its name (PyTorch's, e.g.
/// "self_attn.in_proj_weight"), its values and its gradient. The Views are
/// unmanaged views of the layer's storage: valid while the layer lives.
///
/// The gradient is `grad` (of T), or for a 16-bit T whose layer accumulates
/// gradients in fp32 (the layer option fp32_gradients) `grad_fp32`; the
/// other one is empty.
template <class T, class MemorySpace>
struct Parameter {
  using view_type =
      Kokkos::View<T*, Kokkos::LayoutRight, MemorySpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  using fp32_view_type = Kokkos::View<accumulator_t<T>*, Kokkos::LayoutRight, MemorySpace,
                                      Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  std::string name;
  view_type value;
  view_type grad;
  fp32_view_type grad_fp32;
};

}  // namespace nn
}  // namespace kfa

#endif
