#ifndef KFA_DETAIL_ATTENTION_MERGE_KERNELS_HPP
#define KFA_DETAIL_ATTENTION_MERGE_KERNELS_HPP

// The two passes of kfa::merge_attention: O first, every thread recomputing
// its row's weights from lse_a and lse_b, which it only reads; then lse_a.
// Both are parallel over contiguous elements (coalesced on GPUs; one thread
// a row looping over head_dim made neighbouring threads read rows head_dim
// apart).

#include <kfa/types.hpp>

#include <kfa/detail/attention/online_softmax.hpp>
#include <kfa/detail/common/packs.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <type_traits>

namespace kfa {
namespace Impl {

/// o_a <- w_a·o_a + w_b·o_b over [batch][seqlen][heads][head_dim]. Where
/// both O tensors are contiguous, head_dim is a multiple of kWidth and the
/// pointers allow, a thread merges kWidth elements of one row (one pack
/// each side, the row's weights computed once: two exponentials and a
/// logarithm for kWidth elements instead of each); otherwise one an element.
template <class ExecSpace, class OA, class LseA, class OB, class LseB>
class MergeOutput {
 public:
  using acc_t = typename LseA::non_const_value_type;
  using value_a = typename OA::non_const_value_type;
  using value_b = typename OB::non_const_value_type;
  using softmax = OnlineSoftmax<acc_t>;
  static constexpr int kWidth = pack_width<value_a, value_b>();

  MergeOutput(const OA& o_a, const LseA& lse_a, const OB& o_b, const LseB& lse_b)
      : m_o_a(o_a), m_lse_a(lse_a), m_o_b(o_b), m_lse_b(lse_b) {}

  void launch(const ExecSpace& space) const {
    const std::size_t elements = m_o_a.size();
    if (elements == 0) return;
    if (m_o_a.span_is_contiguous() && m_o_b.span_is_contiguous() && m_o_a.extent(3) % kWidth == 0 &&
        pack_aligned<kWidth>(m_o_a.data()) && pack_aligned<kWidth>(m_o_b.data())) {
      Kokkos::parallel_for("kfa::merge_attention::o",
                           Kokkos::RangePolicy<ExecSpace, Packed>(space, 0, elements / kWidth),
                           *this);
    } else {
      Kokkos::parallel_for("kfa::merge_attention::o",
                           Kokkos::RangePolicy<ExecSpace>(space, 0, elements), *this);
    }
  }

  struct Packed {};
  KOKKOS_INLINE_FUNCTION void operator()(Packed, const std::size_t pack) const {
    const std::size_t n = pack * kWidth;
    std::size_t b, i, h, d;
    position(n, b, i, h, d);
    acc_t w_a, w_b;
    weights(b, h, i, w_a, w_b);
    const Pack<value_a, kWidth> o_a = load_pack<kWidth>(m_o_a.data() + n);
    const Pack<value_b, kWidth> o_b = load_pack<kWidth>(m_o_b.data() + n);
    Pack<value_a, kWidth> out;
    for (int e = 0; e < kWidth; ++e) out.v[e] = merged(w_a, o_a.v[e], w_b, o_b.v[e]);
    store_pack<kWidth>(m_o_a.data() + n, out);
  }

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t n) const {
    std::size_t b, i, h, d;
    position(n, b, i, h, d);
    acc_t w_a, w_b;
    weights(b, h, i, w_a, w_b);
    m_o_a(b, i, h, d) = merged(w_a, m_o_a(b, i, h, d), w_b, m_o_b(b, i, h, d));
  }

 private:
  /// (b, i, h, d) of element n of [batch][seqlen][heads][head_dim].
  KOKKOS_FORCEINLINE_FUNCTION void position(std::size_t n, std::size_t& b, std::size_t& i,
                                            std::size_t& h, std::size_t& d) const {
    const std::size_t head_dim = m_o_a.extent(3), heads = m_o_a.extent(2), seqlen = m_o_a.extent(1);
    const std::size_t row = n / head_dim, bi = row / heads;
    d = n - row * head_dim;
    h = row - bi * heads;
    b = bi / seqlen;
    i = bi - b * seqlen;
  }

  /// The merge weights of row (b, h, i).
  KOKKOS_FORCEINLINE_FUNCTION void weights(std::size_t b, std::size_t h, std::size_t i, acc_t& w_a,
                                           acc_t& w_b) const {
    acc_t lse;
    softmax::merge_weights(m_lse_a(b, h, i), m_lse_b(b, h, i), w_a, w_b, lse);
  }

  /// A zero weight drops its side outright (an empty side's O may be
  /// anything, even NaN).
  KOKKOS_FORCEINLINE_FUNCTION static value_a merged(acc_t w_a, const value_a& a, acc_t w_b,
                                                    const value_b& b) {
    const acc_t x = w_a == acc_t(0) ? acc_t(0) : w_a * to_acc<acc_t>(a);
    const acc_t y = w_b == acc_t(0) ? acc_t(0) : w_b * to_acc<acc_t>(b);
    return from_acc<value_a>(x + y);
  }

  OA m_o_a;
  LseA m_lse_a;
  OB m_o_b;
  LseB m_lse_b;
};

/// lse_a <- log(exp(lse_a) + exp(lse_b)), one thread a row.
template <class ExecSpace, class LseA, class LseB>
class MergeLse {
 public:
  using acc_t = typename LseA::non_const_value_type;

  MergeLse(const LseA& lse_a, const LseB& lse_b) : m_lse_a(lse_a), m_lse_b(lse_b) {}

  void launch(const ExecSpace& space) const {
    if (m_lse_a.size() == 0) return;
    Kokkos::parallel_for("kfa::merge_attention::lse",
                         Kokkos::RangePolicy<ExecSpace>(space, 0, m_lse_a.size()), *this);
  }

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t row) const {
    const std::size_t heads = m_lse_a.extent(1), seqlen = m_lse_a.extent(2);
    const std::size_t i = row % seqlen, bh = row / seqlen;
    const std::size_t h = bh % heads, b = bh / heads;
    acc_t w_a, w_b, lse;
    OnlineSoftmax<acc_t>::merge_weights(m_lse_a(b, h, i), m_lse_b(b, h, i), w_a, w_b, lse);
    m_lse_a(b, h, i) = lse;
  }

 private:
  LseA m_lse_a;
  LseB m_lse_b;
};

/// (o_a, lse_a) becomes the merge of (o_a, lse_a) and (o_b, lse_b); the
/// extents are the caller's to check.
template <class ExecSpace, class OA, class LseA, class OB, class LseB>
void merge_attention_into(const ExecSpace& space, const OA& o_a, const LseA& lse_a,
                          const OB& o_b, const LseB& lse_b) {
  MergeOutput<ExecSpace, OA, LseA, OB, LseB>(o_a, lse_a, o_b, lse_b).launch(space);
  MergeLse<ExecSpace, LseA, LseB>(lse_a, lse_b).launch(space);
}

}  // namespace Impl
}  // namespace kfa

#endif
