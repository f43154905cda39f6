#ifndef KFA_STANDARD_ATTENTION_HPP
#define KFA_STANDARD_ATTENTION_HPP

#include <kfa/options.hpp>
#include <kfa/types.hpp>

#include <kfa_checks.hpp>
#include <kfa_standard_attention_impl.hpp>

namespace kfa {

/// The baseline kfa exists to beat: S = Q·Kᵀ·scale and P = softmax(S) are
/// materialised in device memory ([batch·heads][seqlen_q][seqlen_k] in the
/// accumulator type) and both products go through KokkosBlas::gemm. P is
/// rounded to the value type before P·V, as a materialised implementation in
/// that precision would store it. Same arguments and shapes as
/// flash_attention_forward. Allocates O(batch·heads·seqlen_q·seqlen_k).
template <class ExecSpace, class Q, class K, class V, class O, class Lse>
void standard_attention_forward(const ExecSpace& space, const Q& q, const K& k,
                                const V& v, const O& o, const Lse& lse,
                                const AttentionOptions& options = {}) {
  Impl::ProfilingRegion region("kfa::standard_attention_forward");
  Impl::check_forward_arguments<ExecSpace>("kfa::standard_attention_forward", q, k, v, o,
                                           lse, options);
  if constexpr (Impl::forward_types_ok<ExecSpace, Q, K, V, O, Lse>()) {
    Impl::standard_attention_forward_impl(space, q, k, v, o, lse, options);
  }
}

/// Materialised backward, the baseline for flash_attention_backward: P and
/// dP are stored ([batch·heads][seqlen_q][seqlen_k] each, accumulator type)
/// and the four products are KokkosBlas::gemm calls. Same arguments as
/// flash_attention_backward (o and lse from either forward).
template <class ExecSpace, class Q, class K, class V, class O, class Lse, class DO,
          class DQ, class DK, class DV>
void standard_attention_backward(const ExecSpace& space, const Q& q, const K& k, const V& v,
                                 const O& o, const Lse& lse, const DO& d_o, const DQ& dq,
                                 const DK& dk, const DV& dv,
                                 const AttentionOptions& options = {}) {
  Impl::ProfilingRegion region("kfa::standard_attention_backward");
  Impl::check_backward_arguments<ExecSpace>("kfa::standard_attention_backward", q, k, v, o,
                                            lse, d_o, dq, dk, dv, options);
  if constexpr (Impl::backward_types_ok<ExecSpace, Q, K, V, O, Lse, DO, DQ, DK, DV>()) {
    Impl::standard_attention_backward_impl(space, q, k, v, o, lse, d_o, dq, dk, dv, options);
  }
}

}  // namespace kfa

#endif
