#ifndef KFA_NN_PARAMETER_HPP
#define KFA_NN_PARAMETER_HPP

#include <Kokkos_Core.hpp>

#include <string>

namespace kfa {
namespace nn {

/// One parameter tensor of a layer, flattened: its name (PyTorch's, e.g.
/// "self_attn.in_proj_weight"), its values and its gradient. The Views are
/// unmanaged views of the layer's storage: valid while the layer lives.
template <class T, class MemorySpace>
struct Parameter {
  using view_type =
      Kokkos::View<T*, Kokkos::LayoutRight, MemorySpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  std::string name;
  view_type value;
  view_type grad;
};

}  // namespace nn
}  // namespace kfa

#endif
