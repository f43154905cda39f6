#ifndef KFA_DROPOUT_HPP
#define KFA_DROPOUT_HPP

#include <kfa/options.hpp>

#include <kfa/detail/common/checks.hpp>
#include <kfa/detail/attention/dropout_generator.hpp>

namespace kfa {

/// The dropout keep mask the attention kernels draw for `options`
/// (dropout_p, dropout_seed): mask(b, h, i, j) = 1 where the weight of query
/// i and key j (batch entry or packed sequence b, query head h) is kept and
/// scaled by 1/(1 - dropout_p), 0 where it is dropped. The kernels never
/// store it; this regenerates it, for tests and debugging. Packed batches use
/// the same coordinates (i, j from the start of sequence b), so a mask of
/// [batch][heads][max_seqlen_q][max_seqlen_k] covers them.
///
/// mask [batch][heads][seqlen_q][seqlen_k]: a LayoutRight View of an
/// arithmetic type accessible from ExecSpace. Enqueued on `space`; no fence.
template <class ExecSpace, class Mask>
void dropout_mask(const ExecSpace& space, const Mask& mask, const AttentionOptions& options) {
  const char* function = "kfa::dropout_mask";
  Impl::ProfilingRegion region(function);
  Impl::check_view_kind<ExecSpace, Mask>(function, "mask", "[batch][heads][seqlen_q][seqlen_k]",
                                         4);
  Impl::check_options(function, options);
  if constexpr (Impl::view_ok<ExecSpace, Mask>(4)) {
    using value_type = typename Mask::value_type;
    static_assert(std::is_arithmetic<value_type>::value && !std::is_const<value_type>::value,
                  "kfa::dropout_mask: mask must be a non-const View of an arithmetic type");
    const Impl::DropoutGenerator generator(options.dropout_p, options.dropout_seed);
    Kokkos::parallel_for(
        "kfa::dropout_mask",
        Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<4>>(
            space, {0, 0, 0, 0}, {mask.extent(0), mask.extent(1), mask.extent(2), mask.extent(3)}),
        KOKKOS_LAMBDA(const int b, const int h, const int i, const int j) {
          mask(b, h, i, j) = generator.kept(generator.row_key(b, h, i), j) ? value_type(1)
                                                                           : value_type(0);
        });
  }
}

}  // namespace kfa

#endif
