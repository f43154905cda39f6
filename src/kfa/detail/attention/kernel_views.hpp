#ifndef KFA_DETAIL_ATTENTION_KERNEL_VIEWS_HPP
#define KFA_DETAIL_ATTENTION_KERNEL_VIEWS_HPP

// What every kernel family takes: the caller's Views as [batch][rows][heads]
// [head_dim] Views of their value type (const for inputs) and lse as
// [batch][heads][rows]; packed variable-length tensors as [1][total][heads]
// [head_dim]. Converting first means Views that differ only in constness or
// memory traits share one set of kernels.

#include <kfa/options.hpp>

#include <kfa/detail/attention/sequences.hpp>
#include <kfa/detail/attention/variant.hpp>

#include <cmath>

namespace kfa {
namespace Impl {

template <class Acc>
Acc softmax_scale(const AttentionOptions& options, int head_dim) {
  return options.softmax_scale != 0 ? static_cast<Acc>(options.softmax_scale)
                                    : static_cast<Acc>(1.0 / std::sqrt(double(head_dim)));
}

/// The kernels' View types for a caller's View type: inputs const, the
/// memory traits dropped.
template <class View>
using in4_t = Kokkos::View<const typename View::non_const_value_type****, Kokkos::LayoutRight,
                           typename View::memory_space>;
template <class View>
using out4_t = Kokkos::View<typename View::non_const_value_type****, Kokkos::LayoutRight,
                            typename View::memory_space>;
template <class View>
using in3_t = Kokkos::View<const typename View::non_const_value_type***, Kokkos::LayoutRight,
                           typename View::memory_space>;
template <class View>
using out3_t = Kokkos::View<typename View::non_const_value_type***, Kokkos::LayoutRight,
                            typename View::memory_space>;

/// A caller's tensor as the kernels see it: a fixed-length [batch][rows]
/// [heads][head_dim] View converted, a packed [total][heads][head_dim] one
/// reshaped to [1][total][heads][head_dim] (its contiguity is checked by the
/// entry points). lse: [batch][heads][rows], or packed [heads][total] as
/// [1][heads][total].
template <class Result, class View>
Result as_kernel_view(const View& view) {
  if constexpr (view_rank<View>() == view_rank<Result>()) {
    return Result(view);
  } else if constexpr (view_rank<View>() == 3) {
    return Result(view.data(), 1, view.extent(0), view.extent(1), view.extent(2));
  } else {
    return Result(view.data(), 1, view.extent(0), view.extent(1));
  }
}
template <class View>
in4_t<View> in4(const View& view) {
  return as_kernel_view<in4_t<View>>(view);
}
template <class View>
out4_t<View> out4(const View& view) {
  return as_kernel_view<out4_t<View>>(view);
}
template <class View>
in3_t<View> in3(const View& view) {
  return as_kernel_view<in3_t<View>>(view);
}
template <class View>
out3_t<View> out3(const View& view) {
  return as_kernel_view<out3_t<View>>(view);
}

/// Sequences of a fixed-length call: q [batch][seqlen_q].., k [batch][seqlen_k]..
template <class Q, class K>
Sequences<typename Q::memory_space> batch_sequences(const Q& q, const K& k) {
  return fixed_sequences<typename Q::memory_space>(
      static_cast<int>(q.extent(0)), static_cast<int>(q.extent(1)), static_cast<int>(k.extent(1)));
}

/// Sequences of a packed call (offsets already validated).
template <class Q, class CuQ, class CuK>
Sequences<typename Q::memory_space> varlen_sequences(const CuQ& cu_seqlens_q,
                                                     const CuK& cu_seqlens_k,
                                                     int max_seqlen_q, int max_seqlen_k) {
  using offsets_t = Kokkos::View<const int*, typename Q::memory_space>;
  return packed_sequences<typename Q::memory_space>(
      offsets_t(cu_seqlens_q.data(), cu_seqlens_q.extent(0)),
      offsets_t(cu_seqlens_k.data(), cu_seqlens_k.extent(0)), max_seqlen_q, max_seqlen_k);
}

template <class Acc, class MemorySpace>
KernelParams<Acc, MemorySpace> make_params(const AttentionOptions& options,
                                           const Sequences<MemorySpace>& seq, int heads,
                                           int heads_kv, int head_dim) {
  KernelParams<Acc, MemorySpace> p;
  p.seq = seq;
  p.heads = heads;
  p.heads_kv = heads_kv;
  p.head_dim = head_dim;
  p.window_left = options.window_left;
  p.window_right = options.causal ? 0 : options.window_right;
  p.scale = softmax_scale<Acc>(options, head_dim);
  p.softcap = static_cast<Acc>(options.softcap);
  p.dropout_p = options.dropout_p;
  p.dropout_seed = options.dropout_seed;
  return p;
}

/// True when the options need the softcap/dropout variant.
inline bool uses_modifiers(const AttentionOptions& options) {
  return options.softcap > 0 || options.dropout_p > 0;
}

}  // namespace Impl
}  // namespace kfa

#endif
