#ifndef KFA_FLASH_ATTENTION_HPP
#define KFA_FLASH_ATTENTION_HPP

#include <kfa/options.hpp>
#include <kfa/types.hpp>

#include <kfa_checks.hpp>
#include <kfa_dispatch.hpp>

namespace kfa {

/// Fused attention forward: O = softmax(Q·Kᵀ·scale)·V without materialising
/// the score matrix (O(N) memory), plus the per-row log-sum-exp the backward
/// pass needs.
///
/// q [batch][seqlen_q][heads][head_dim], k, v [batch][seqlen_k][heads][head_dim],
/// o [batch][seqlen_q][heads][head_dim], lse [batch][heads][seqlen_q].
/// LayoutRight Views accessible from ExecSpace; value type double, float,
/// kfa::half or kfa::bfloat16 (q, k, v, o alike), lse of kfa::accumulator_t.
/// head_dim 1..256. Enqueued on `space`; no fence.
/// Throws std::invalid_argument (nothing written) on bad shapes or layouts.
template <class ExecSpace, class Q, class K, class V, class O, class Lse>
void flash_attention_forward(const ExecSpace& space, const Q& q, const K& k, const V& v,
                             const O& o, const Lse& lse,
                             const AttentionOptions& options = {}) {
  Impl::ProfilingRegion region("kfa::flash_attention_forward");
  Impl::check_forward_arguments<ExecSpace>("kfa::flash_attention_forward", q, k, v, o,
                                           lse, options);
  if constexpr (Impl::forward_types_ok<ExecSpace, Q, K, V, O, Lse>()) {
    Impl::dispatch_forward(space, q, k, v, o, lse, options);
  }
}

/// Fused attention backward (FlashAttention-2 style): recomputes each score
/// tile from q, k and the saved lse, never storing P.
///
/// Shapes as in flash_attention_forward; d_o and dq like q, dk and dv like k.
/// o and lse must be the forward pass' outputs for the same q, k, v, options.
/// Temporary device memory: O(batch·heads·seqlen_q) for rowsum(dO∘O), plus an
/// accumulator of dq's size for 16-bit types. Enqueued on `space`; no fence.
template <class ExecSpace, class Q, class K, class V, class O, class Lse, class DO,
          class DQ, class DK, class DV>
void flash_attention_backward(const ExecSpace& space, const Q& q, const K& k, const V& v,
                              const O& o, const Lse& lse, const DO& d_o, const DQ& dq,
                              const DK& dk, const DV& dv,
                              const AttentionOptions& options = {}) {
  Impl::ProfilingRegion region("kfa::flash_attention_backward");
  Impl::check_backward_arguments<ExecSpace>("kfa::flash_attention_backward", q, k, v, o,
                                            lse, d_o, dq, dk, dv, options);
  if constexpr (Impl::backward_types_ok<ExecSpace, Q, K, V, O, Lse, DO, DQ, DK, DV>()) {
    Impl::dispatch_backward(space, q, k, v, o, lse, d_o, dq, dk, dv, options);
  }
}

}  // namespace kfa

#endif
