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
NnIn2<typename ViewType::non_const_value_type, typename ViewType::memory_space> in_matrix(
    const ViewType& view) {
  constexpr int last = static_cast<int>(ViewType::rank) - 1;
  return NnIn2<typename ViewType::non_const_value_type, typename ViewType::memory_space>(
      view.data(), leading_rows(view), view.extent(last));
}
template <class ViewType>
NnOut2<typename ViewType::non_const_value_type, typename ViewType::memory_space> out_matrix(
    const ViewType& view) {
  constexpr int last = static_cast<int>(ViewType::rank) - 1;
  return NnOut2<typename ViewType::non_const_value_type, typename ViewType::memory_space>(
      view.data(), leading_rows(view), view.extent(last));
}
template <class ViewType>
NnIn1<typename ViewType::non_const_value_type, typename ViewType::memory_space> in_vector(
    const ViewType& view) {
  return NnIn1<typename ViewType::non_const_value_type, typename ViewType::memory_space>(
      view.data(), view.extent(0));
}
template <class ViewType>
NnOut1<typename ViewType::non_const_value_type, typename ViewType::memory_space> out_vector(
    const ViewType& view) {
  return NnOut1<typename ViewType::non_const_value_type, typename ViewType::memory_space>(
      view.data(), view.extent(0));
}

/// A LayoutRight [batch][seqlen][...] View as [batch·seqlen][features], the
/// features of a token being everything after seqlen ([heads][head_dim] of
/// the attention's tensors as heads·head_dim).
template <class ViewType>
NnIn2<typename ViewType::non_const_value_type, typename ViewType::memory_space> in_tokens(
    const ViewType& view) {
  const std::size_t rows = view.extent(0) * view.extent(1);
  return NnIn2<typename ViewType::non_const_value_type, typename ViewType::memory_space>(
      view.data(), rows, rows == 0 ? 0 : view.size() / rows);
}
template <class ViewType>
NnOut2<typename ViewType::non_const_value_type, typename ViewType::memory_space> out_tokens(
    const ViewType& view) {
  const std::size_t rows = view.extent(0) * view.extent(1);
  return NnOut2<typename ViewType::non_const_value_type, typename ViewType::memory_space>(
      view.data(), rows, rows == 0 ? 0 : view.size() / rows);
}

}  // namespace Impl
}  // namespace kfa

#endif
