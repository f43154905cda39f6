#ifndef KFA_DETAIL_ATTENTION_BACKWARD_BUFFERS_HPP
#define KFA_DETAIL_ATTENTION_BACKWARD_BUFFERS_HPP

// The buffers around a backward kernel that every family shares: the dQ
// accumulator in the call's workspace, its conversion to dq, and the sum of
// per-query-head dK, dV over a grouped-query group.

#include <kfa/detail/common/compat.hpp>
#include <kfa/detail/common/workspace.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>

namespace kfa {
namespace Impl {

/// dq = dq_acc, converted from the accumulator type (both LayoutRight, of
/// the same extents; dq_acc contiguous). A contiguous dq is converted as one
/// flat array, so that adjacent threads touch adjacent values; a strided one
/// with the last index fastest.
template <class ExecSpace, class AccView, class DQ>
void convert_dq(const ExecSpace& space, const AccView& dq_acc, const DQ& dq) {
  using value_type = typename DQ::non_const_value_type;
  if (dq.span_is_contiguous()) {
    value_type* const out = dq.data();
    const auto* const in = dq_acc.data();
    Kokkos::parallel_for(
        "kfa::bwd::convert_dq", Kokkos::RangePolicy<ExecSpace>(space, 0, dq.size()),
        KOKKOS_LAMBDA(const std::size_t i) { out[i] = from_acc<value_type>(in[i]); });
    return;
  }
  Kokkos::parallel_for(
      "kfa::bwd::convert_dq",
      Kokkos::MDRangePolicy<ExecSpace,
                            Kokkos::Rank<4, Kokkos::Iterate::Right, Kokkos::Iterate::Right>>(
          space, {0, 0, 0, 0}, {dq.extent(0), dq.extent(1), dq.extent(2), dq.extent(3)}),
      KOKKOS_LAMBDA(const int b, const int i, const int h, const int d) {
        dq(b, i, h, d) = from_acc<value_type>(dq_acc(b, i, h, d));
      });
}

/// dk and dv [batch][seqlen_k][heads_kv][head_dim] from dK and dV per
/// query head ([batch][seqlen_k][heads][head_dim], dV `half` values after
/// dK, in fp32 for 16-bit types): each k/v head's the sum over its group of
/// query heads, rounded once. One thread per output element, consecutive
/// threads along head_dim.
template <class ExecSpace, class Acc, class DK, class DV>
void sum_grouped_dk_dv(const ExecSpace& space, const Acc* dkv, long half, int heads,
                       const DK& dk, const DV& dv) {
  using value_type = typename DK::non_const_value_type;
  const int seqlen_k = static_cast<int>(dk.extent(1)), heads_kv = static_cast<int>(dk.extent(2)),
            head_dim = static_cast<int>(dk.extent(3));
  const int group = heads / heads_kv;
  Kokkos::parallel_for(
      "kfa::bwd::sum_grouped_dk_dv",
      Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<long>>(space, 0, long(dk.size())),
      KOKKOS_LAMBDA(const long i) {
        const int d = static_cast<int>(i % head_dim);
        const long r = i / head_dim;
        const int hk = static_cast<int>(r % heads_kv);
        const long row = r / heads_kv;  // b * seqlen_k + key
        const long from = (row * heads + long(hk) * group) * head_dim + d;
        Acc sum_k = 0, sum_v = 0;
        for (int g = 0; g < group; ++g) {
          sum_k += dkv[from + long(g) * head_dim];
          sum_v += dkv[half + from + long(g) * head_dim];
        }
        const int b = static_cast<int>(row / seqlen_k), key = static_cast<int>(row % seqlen_k);
        dk(b, key, hk, d) = from_acc<value_type>(sum_k);
        dv(b, key, hk, d) = from_acc<value_type>(sum_v);
      });
}

/// The dq accumulator of a backward call, in the call's workspace (`bytes`
/// keeps it alive); contents undefined.
template <class Acc, class ExecSpace, class DQ>
Kokkos::View<Acc****, Kokkos::LayoutRight, typename ExecSpace::memory_space,
             Kokkos::MemoryTraits<Kokkos::Unmanaged>>
dq_accumulator(const ExecSpace& space, const DQ& dq,
               Kokkos::View<unsigned char*, typename ExecSpace::memory_space>& bytes) {
  using view_t = Kokkos::View<Acc****, Kokkos::LayoutRight, typename ExecSpace::memory_space,
                              Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  bytes = workspace(space, WorkspaceSlot::dq_accum, workspace_bytes<Acc>(dq.size()),
                    "kfa::bwd::dq_accum");
  return workspace_view<view_t>(bytes, dq.extent(0), dq.extent(1), dq.extent(2), dq.extent(3));
}

/// dq_accumulator, zeroed on `space`.
template <class Acc, class ExecSpace, class DQ>
Kokkos::View<Acc****, Kokkos::LayoutRight, typename ExecSpace::memory_space,
             Kokkos::MemoryTraits<Kokkos::Unmanaged>>
zeroed_dq_accumulator(const ExecSpace& space, const DQ& dq,
                      Kokkos::View<unsigned char*, typename ExecSpace::memory_space>& bytes) {
  const auto acc = dq_accumulator<Acc>(space, dq, bytes);
  Kokkos::deep_copy(space, acc, Acc(0));
  return acc;
}

}  // namespace Impl
}  // namespace kfa

#endif
