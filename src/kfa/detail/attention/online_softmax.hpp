#ifndef KFA_DETAIL_ATTENTION_ONLINE_SOFTMAX_HPP
#define KFA_DETAIL_ATTENTION_ONLINE_SOFTMAX_HPP

// The online softmax shared by the forward kernel, the backward kernels and
// the merge of partial results: a running row max m and row sum l, and the
// rescale factor exp(m_old - m_new) applied to what was accumulated so far.

#include <kfa/detail/common/compat.hpp>

namespace kfa {
namespace Impl {

template <class Acc>
struct OnlineSoftmax {
  /// The shift subtracted before exp. A row whose max is still -inf (every
  /// score so far masked) must not compute exp(-inf - (-inf)) = NaN: shift by
  /// 0 instead, so its masked scores give exp(-inf) = 0.
  KOKKOS_FORCEINLINE_FUNCTION static Acc shift(Acc row_max) {
    return row_max == math::neg_inf<Acc>() ? Acc(0) : row_max;
  }

  /// Factor that rescales the partial output and sum when the running max
  /// moves from m_old to m_new (0 when nothing was accumulated yet).
  KOKKOS_FORCEINLINE_FUNCTION static Acc rescale(Acc m_old, Acc m_new) {
    return m_old == math::neg_inf<Acc>() ? Acc(0) : math::exp(m_old - shift(m_new));
  }

  /// lse = m + log(l); rows that saw no key give -inf. A NaN sum (a NaN or
  /// +inf score) stays NaN, so that the backward propagates it too.
  KOKKOS_FORCEINLINE_FUNCTION static Acc lse(Acc row_max, Acc row_sum) {
    return row_sum == Acc(0) ? math::neg_inf<Acc>() : row_max + math::log(row_sum);
  }

  /// Probability of a score given the row's final lse; 0 for rows that saw
  /// no key (lse = -inf would otherwise give exp(+inf)).
  KOKKOS_FORCEINLINE_FUNCTION static Acc probability(Acc score, Acc lse) {
    return lse == math::neg_inf<Acc>() ? Acc(0) : math::exp(score - lse);
  }

  /// Exact merge of two partial attentions over disjoint key sets:
  /// weights w_a, w_b with w_a + w_b = 1 and the merged lse.
  KOKKOS_FORCEINLINE_FUNCTION static void merge_weights(Acc lse_a, Acc lse_b, Acc& w_a,
                                                        Acc& w_b, Acc& lse_out) {
    const Acc m = lse_a > lse_b ? lse_a : lse_b;
    if (m == math::neg_inf<Acc>()) {
      w_a = 0;
      w_b = 0;
      lse_out = m;
      return;
    }
    const Acc ea = math::exp(lse_a - m), eb = math::exp(lse_b - m);
    const Acc sum = ea + eb;
    w_a = ea / sum;
    w_b = eb / sum;
    lse_out = m + math::log(sum);
  }
};

}  // namespace Impl
}  // namespace kfa

#endif
