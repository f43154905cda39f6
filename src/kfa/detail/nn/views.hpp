#ifndef KFA_DETAIL_NN_VIEWS_HPP
#define KFA_DETAIL_NN_VIEWS_HPP

// The View types the kfa::nn kernels take: the caller's tensors as
// LayoutRight [rows][cols] matrices and vectors of their value type (const
// for inputs), whatever their rank and memory traits, so that one set of
// kernels serves every caller.

#include <Kokkos_Core.hpp>

namespace kfa {
namespace Impl {

template <class T, class MemorySpace>
using NnIn1 = Kokkos::View<const T*, Kokkos::LayoutRight, MemorySpace>;
template <class T, class MemorySpace>
using NnOut1 = Kokkos::View<T*, Kokkos::LayoutRight, MemorySpace>;
template <class T, class MemorySpace>
using NnIn2 = Kokkos::View<const T**, Kokkos::LayoutRight, MemorySpace>;
template <class T, class MemorySpace>
using NnOut2 = Kokkos::View<T**, Kokkos::LayoutRight, MemorySpace>;

/// A LayoutRight View of any rank as a [rows][last extent] matrix: the
/// tokens of [batch][seqlen][features] as [batch·seqlen][features].
template <class ViewType>
std::size_t leading_rows(const ViewType& view) {
  std::size_t rows = 1;
  for (int r = 0; r + 1 < static_cast<int>(ViewType::rank); ++r) rows *= view.extent(r);
  return rows;
}

template <class ViewType>
using nn_value_t = typename ViewType::non_const_value_type;
template <class ViewType>
using nn_memory_t = typename ViewType::memory_space;

template <class ViewType>
using in2_of = NnIn2<nn_value_t<ViewType>, nn_memory_t<ViewType>>;
template <class ViewType>
using out2_of = NnOut2<nn_value_t<ViewType>, nn_memory_t<ViewType>>;

template <class ViewType>
in2_of<ViewType> in_matrix(const ViewType& view) {
  return in2_of<ViewType>(view.data(), leading_rows(view), view.extent(ViewType::rank - 1));
}
template <class ViewType>
out2_of<ViewType> out_matrix(const ViewType& view) {
  return out2_of<ViewType>(view.data(), leading_rows(view), view.extent(ViewType::rank - 1));
}
template <class ViewType>
NnIn1<nn_value_t<ViewType>, nn_memory_t<ViewType>> in_vector(const ViewType& view) {
  return NnIn1<nn_value_t<ViewType>, nn_memory_t<ViewType>>(view.data(), view.extent(0));
}
template <class ViewType>
NnOut1<nn_value_t<ViewType>, nn_memory_t<ViewType>> out_vector(const ViewType& view) {
  return NnOut1<nn_value_t<ViewType>, nn_memory_t<ViewType>>(view.data(), view.extent(0));
}

/// A LayoutRight [batch][seqlen][...] View as [batch·seqlen][features], the
/// features of a token being everything after seqlen ([heads][head_dim] of
/// the attention's tensors as heads·head_dim).
template <class ViewType>
std::size_t token_features(const ViewType& view) {
  const std::size_t rows = view.extent(0) * view.extent(1);
  return rows == 0 ? 0 : view.size() / rows;
}
template <class ViewType>
in2_of<ViewType> in_tokens(const ViewType& view) {
  return in2_of<ViewType>(view.data(), view.extent(0) * view.extent(1), token_features(view));
}
template <class ViewType>
out2_of<ViewType> out_tokens(const ViewType& view) {
  return out2_of<ViewType>(view.data(), view.extent(0) * view.extent(1), token_features(view));
}

}  // namespace Impl
}  // namespace kfa

#endif
