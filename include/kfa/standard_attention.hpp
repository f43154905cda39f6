#ifndef KFA_STANDARD_ATTENTION_HPP
#define KFA_STANDARD_ATTENTION_HPP

#include <kfa/options.hpp>
#include <kfa/score_mod.hpp>
#include <kfa/types.hpp>

#include <kfa/detail/common/checks.hpp>
#include <kfa/detail/attention/standard_attention_impl.hpp>

namespace kfa {

/// The baseline kfa exists to beat: S = Q·Kᵀ·scale and P = softmax(S) are
/// materialised in device memory ([batch·heads][seqlen_q][seqlen_k] in the
/// accumulator type) and both products go through KokkosBlas::gemm. P is
/// rounded to the value type before P·V, as a materialised implementation in
/// that precision would store it. Every variant of the fused kernels is
/// supported (grouped-query heads, windows, softcap, dropout with the same
/// mask, score modifiers): it is their same-precision yardstick in the tests.
/// Same arguments and shapes as flash_attention_forward.
/// Allocates O(batch·heads·seqlen_q·seqlen_k).
template <class ExecSpace, class Q, class K, class V, class O, class Lse, class ScoreMod>
void standard_attention_forward(const ExecSpace& space, const Q& q, const K& k, const V& v,
                                const O& o, const Lse& lse, const AttentionOptions& options,
                                const ScoreMod& score_mod) {
  const char* function = "kfa::standard_attention_forward";
  Impl::ProfilingRegion region(function);
  Impl::check_forward_arguments<ExecSpace>(function, q, k, v, o, lse, options);
  if constexpr (Impl::forward_types_ok<ExecSpace, Q, K, V, O, Lse>()) {
    Impl::check_score_mod_type<ScoreMod, typename Q::non_const_value_type>();
    Impl::check_score_mod<ExecSpace>(function, score_mod, static_cast<int>(q.extent(0)),
                                     static_cast<int>(q.extent(2)));
    Impl::standard_attention_forward_impl(space, Impl::in4(q), Impl::in4(k), Impl::in4(v),
                                          Impl::out4(o), Impl::out3(lse),
                                          Impl::batch_sequences(q, k), options, score_mod);
  }
}

template <class ExecSpace, class Q, class K, class V, class O, class Lse>
void standard_attention_forward(const ExecSpace& space, const Q& q, const K& k, const V& v,
                                const O& o, const Lse& lse,
                                const AttentionOptions& options = {}) {
  standard_attention_forward(space, q, k, v, o, lse, options, Impl::NoScoreMod{});
}

/// Materialised backward, the baseline for flash_attention_backward: P and
/// dP are stored ([batch·heads][seqlen_q][seqlen_k] each, accumulator type)
/// and the four products are KokkosBlas::gemm calls. Same arguments as
/// flash_attention_backward (o and lse from either forward).
template <class ExecSpace, class Q, class K, class V, class O, class Lse, class DO,
          class DQ, class DK, class DV, class ScoreMod>
void standard_attention_backward(const ExecSpace& space, const Q& q, const K& k, const V& v,
                                 const O& o, const Lse& lse, const DO& d_o, const DQ& dq,
                                 const DK& dk, const DV& dv, const AttentionOptions& options,
                                 const ScoreMod& score_mod) {
  const char* function = "kfa::standard_attention_backward";
  Impl::ProfilingRegion region(function);
  Impl::check_backward_arguments<ExecSpace>(function, q, k, v, o, lse, d_o, dq, dk, dv,
                                            options);
  if constexpr (Impl::backward_types_ok<ExecSpace, Q, K, V, O, Lse, DO, DQ, DK, DV>()) {
    Impl::check_score_mod_type<ScoreMod, typename Q::non_const_value_type>();
    Impl::check_score_mod<ExecSpace>(function, score_mod, static_cast<int>(q.extent(0)),
                                     static_cast<int>(q.extent(2)));
    Impl::standard_attention_backward_impl(
        space, Impl::in4(q), Impl::in4(k), Impl::in4(v), Impl::in4(o), Impl::in3(lse),
        Impl::in4(d_o), Impl::out4(dq), Impl::out4(dk), Impl::out4(dv),
        Impl::batch_sequences(q, k), options, score_mod);
  }
}

template <class ExecSpace, class Q, class K, class V, class O, class Lse, class DO,
          class DQ, class DK, class DV>
void standard_attention_backward(const ExecSpace& space, const Q& q, const K& k, const V& v,
                                 const O& o, const Lse& lse, const DO& d_o, const DQ& dq,
                                 const DK& dk, const DV& dv,
                                 const AttentionOptions& options = {}) {
  standard_attention_backward(space, q, k, v, o, lse, d_o, dq, dk, dv, options,
                              Impl::NoScoreMod{});
}

/// Materialised forward over a packed batch of variable-length sequences:
/// the baseline for flash_attention_varlen_forward, same arguments. Buffers
/// are padded to max_seqlen_q x max_seqlen_k per (sequence, head). Reads the
/// offsets on the host: this fences.
template <class ExecSpace, class Q, class K, class V, class CuQ, class CuK, class O, class Lse,
          class ScoreMod>
void standard_attention_varlen_forward(const ExecSpace& space, const Q& q, const K& k,
                                       const V& v, const CuQ& cu_seqlens_q,
                                       const CuK& cu_seqlens_k, int max_seqlen_q,
                                       int max_seqlen_k, const O& o, const Lse& lse,
                                       const AttentionOptions& options,
                                       const ScoreMod& score_mod) {
  const char* function = "kfa::standard_attention_varlen_forward";
  Impl::ProfilingRegion region(function);
  Impl::check_varlen_forward_arguments<ExecSpace>(function, q, k, v, cu_seqlens_q, cu_seqlens_k,
                                                  max_seqlen_q, max_seqlen_k, o, lse, options);
  if constexpr (Impl::varlen_types_ok<ExecSpace, Q, K, V, CuQ, CuK, O, Lse>()) {
    Impl::check_score_mod_type<ScoreMod, typename Q::non_const_value_type>();
    Impl::check_score_mod<ExecSpace>(function, score_mod,
                                     static_cast<int>(cu_seqlens_q.extent(0)) - 1,
                                     static_cast<int>(q.extent(1)));
    Impl::standard_attention_forward_impl(
        space, Impl::in4(q), Impl::in4(k), Impl::in4(v), Impl::out4(o), Impl::out3(lse),
        Impl::varlen_sequences<Q>(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k),
        options, score_mod);
  }
}

template <class ExecSpace, class Q, class K, class V, class CuQ, class CuK, class O, class Lse>
void standard_attention_varlen_forward(const ExecSpace& space, const Q& q, const K& k,
                                       const V& v, const CuQ& cu_seqlens_q,
                                       const CuK& cu_seqlens_k, int max_seqlen_q,
                                       int max_seqlen_k, const O& o, const Lse& lse,
                                       const AttentionOptions& options = {}) {
  standard_attention_varlen_forward(space, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                    max_seqlen_k, o, lse, options, Impl::NoScoreMod{});
}

/// Materialised backward over a packed batch: the baseline for
/// flash_attention_varlen_backward, same arguments. Reads the offsets on the
/// host: this fences.
template <class ExecSpace, class Q, class K, class V, class CuQ, class CuK, class O, class Lse,
          class DO, class DQ, class DK, class DV, class ScoreMod>
void standard_attention_varlen_backward(const ExecSpace& space, const Q& q, const K& k,
                                        const V& v, const CuQ& cu_seqlens_q,
                                        const CuK& cu_seqlens_k, int max_seqlen_q,
                                        int max_seqlen_k, const O& o, const Lse& lse,
                                        const DO& d_o, const DQ& dq, const DK& dk,
                                        const DV& dv, const AttentionOptions& options,
                                        const ScoreMod& score_mod) {
  const char* function = "kfa::standard_attention_varlen_backward";
  Impl::ProfilingRegion region(function);
  Impl::check_varlen_backward_arguments<ExecSpace>(function, q, k, v, cu_seqlens_q,
                                                   cu_seqlens_k, max_seqlen_q, max_seqlen_k, o,
                                                   lse, d_o, dq, dk, dv, options);
  if constexpr (Impl::varlen_types_ok<ExecSpace, Q, K, V, CuQ, CuK, O, Lse>() &&
                Impl::view_ok<ExecSpace, DO>(3) && Impl::view_ok<ExecSpace, DQ>(3) &&
                Impl::view_ok<ExecSpace, DK>(3) && Impl::view_ok<ExecSpace, DV>(3)) {
    Impl::check_score_mod_type<ScoreMod, typename Q::non_const_value_type>();
    Impl::check_score_mod<ExecSpace>(function, score_mod,
                                     static_cast<int>(cu_seqlens_q.extent(0)) - 1,
                                     static_cast<int>(q.extent(1)));
    Impl::standard_attention_backward_impl(
        space, Impl::in4(q), Impl::in4(k), Impl::in4(v), Impl::in4(o), Impl::in3(lse),
        Impl::in4(d_o), Impl::out4(dq), Impl::out4(dk), Impl::out4(dv),
        Impl::varlen_sequences<Q>(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k),
        options, score_mod);
  }
}

template <class ExecSpace, class Q, class K, class V, class CuQ, class CuK, class O, class Lse,
          class DO, class DQ, class DK, class DV>
void standard_attention_varlen_backward(const ExecSpace& space, const Q& q, const K& k,
                                        const V& v, const CuQ& cu_seqlens_q,
                                        const CuK& cu_seqlens_k, int max_seqlen_q,
                                        int max_seqlen_k, const O& o, const Lse& lse,
                                        const DO& d_o, const DQ& dq, const DK& dk,
                                        const DV& dv, const AttentionOptions& options = {}) {
  standard_attention_varlen_backward(space, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                     max_seqlen_k, o, lse, d_o, dq, dk, dv, options,
                                     Impl::NoScoreMod{});
}

}  // namespace kfa

#endif
