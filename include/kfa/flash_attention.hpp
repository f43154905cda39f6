#ifndef KFA_FLASH_ATTENTION_HPP
#define KFA_FLASH_ATTENTION_HPP

#include <kfa/options.hpp>
#include <kfa/score_mod.hpp>
#include <kfa/types.hpp>

#include <kfa/detail/common/checks.hpp>
#include <kfa/detail/attention/dispatch.hpp>

namespace kfa {

/// Fused attention forward: O = softmax(S)·V with S = Q·Kᵀ·scale (through
/// softcap, score_mod, the causal / window mask; dropout on the weights, see
/// AttentionOptions) without materialising the score matrix (O(N) memory),
/// plus the per-row log-sum-exp the backward pass needs.
///
/// q [batch][seqlen_q][heads][head_dim], k, v [batch][seqlen_k][heads_kv][head_dim],
/// o [batch][seqlen_q][heads][head_dim], lse [batch][heads][seqlen_q].
/// heads a multiple of heads_kv: grouped-query attention (multi-query for
/// heads_kv = 1), query head h reads key/value head h / (heads / heads_kv).
/// LayoutRight Views accessible from ExecSpace; value type double, float,
/// kfa::half or kfa::bfloat16 (q, k, v, o alike), lse of kfa::accumulator_t.
/// head_dim 1..256. score_mod: see kfa/score_mod.hpp (kfa::alibi for ALiBi).
/// Enqueued on `space`; no fence.
/// Throws std::invalid_argument (nothing written) on bad shapes, layouts or options.
template <class ExecSpace, class Q, class K, class V, class O, class Lse, class ScoreMod>
void flash_attention_forward(const ExecSpace& space, const Q& q, const K& k, const V& v,
                             const O& o, const Lse& lse, const AttentionOptions& options,
                             const ScoreMod& score_mod) {
  const char* function = "kfa::flash_attention_forward";
  Impl::ProfilingRegion region(function);
  Impl::check_forward_arguments<ExecSpace>(function, q, k, v, o, lse, options);
  if constexpr (Impl::forward_types_ok<ExecSpace, Q, K, V, O, Lse>()) {
    Impl::check_score_mod_type<ScoreMod, typename Q::non_const_value_type>();
    Impl::check_score_mod<ExecSpace>(function, score_mod, static_cast<int>(q.extent(0)),
                                     static_cast<int>(q.extent(2)));
    Impl::dispatch_forward(space, Impl::in4(q), Impl::in4(k), Impl::in4(v), Impl::out4(o),
                           Impl::out3(lse), Impl::batch_sequences(q, k), options, score_mod);
  }
}

template <class ExecSpace, class Q, class K, class V, class O, class Lse>
void flash_attention_forward(const ExecSpace& space, const Q& q, const K& k, const V& v,
                             const O& o, const Lse& lse, const AttentionOptions& options = {}) {
  flash_attention_forward(space, q, k, v, o, lse, options, Impl::NoScoreMod{});
}

/// Fused attention backward (FlashAttention-2 style): recomputes each score
/// tile from q, k and the saved lse, never storing P; dropout regenerates the
/// forward's mask from the seed.
///
/// Shapes as in flash_attention_forward; d_o and dq like q, dk and dv like k
/// (with grouped-query attention dk and dv sum over the query heads of each
/// group, without atomics). o and lse must be the forward pass' outputs for
/// the same q, k, v, options and score modifier. Temporary device memory:
/// O(batch·heads·seqlen_q) for rowsum(dO∘O), plus an fp32 accumulator of
/// dq's size for 16-bit types (on CUDA with grouped-query heads also fp32 dK
/// and dV per query head, 2·batch·seqlen_k·heads·head_dim floats); on CUDA
/// these stay allocated for the next call on the same stream (see
/// release_workspaces). Enqueued on `space`; no fence.
template <class ExecSpace, class Q, class K, class V, class O, class Lse, class DO,
          class DQ, class DK, class DV, class ScoreMod>
void flash_attention_backward(const ExecSpace& space, const Q& q, const K& k, const V& v,
                              const O& o, const Lse& lse, const DO& d_o, const DQ& dq,
                              const DK& dk, const DV& dv, const AttentionOptions& options,
                              const ScoreMod& score_mod) {
  const char* function = "kfa::flash_attention_backward";
  Impl::ProfilingRegion region(function);
  Impl::check_backward_arguments<ExecSpace>(function, q, k, v, o, lse, d_o, dq, dk, dv,
                                            options);
  if constexpr (Impl::backward_types_ok<ExecSpace, Q, K, V, O, Lse, DO, DQ, DK, DV>()) {
    Impl::check_score_mod_type<ScoreMod, typename Q::non_const_value_type>();
    Impl::check_score_mod<ExecSpace>(function, score_mod, static_cast<int>(q.extent(0)),
                                     static_cast<int>(q.extent(2)));
    Impl::dispatch_backward(space, Impl::in4(q), Impl::in4(k), Impl::in4(v), Impl::in4(o),
                            Impl::in3(lse), Impl::in4(d_o), Impl::out4(dq), Impl::out4(dk),
                            Impl::out4(dv), Impl::batch_sequences(q, k), options, score_mod);
  }
}

template <class ExecSpace, class Q, class K, class V, class O, class Lse, class DO,
          class DQ, class DK, class DV>
void flash_attention_backward(const ExecSpace& space, const Q& q, const K& k, const V& v,
                              const O& o, const Lse& lse, const DO& d_o, const DQ& dq,
                              const DK& dk, const DV& dv,
                              const AttentionOptions& options = {}) {
  flash_attention_backward(space, q, k, v, o, lse, d_o, dq, dk, dv, options,
                           Impl::NoScoreMod{});
}

/// Frees the memory that the backward and ring attention keep between calls
/// (on CUDA, per stream: D and the fp32 dq accumulator, the ring's blocks
/// and accumulators, and its pinned host staging buffers, which only grow).
/// Also done at Kokkos::finalize. Memory that a call still in flight uses is
/// freed when that call returns; a later call allocates again.
inline void release_workspaces() { Impl::release_workspaces(); }

/// Fused forward over a packed batch of variable-length sequences
/// (FlashAttention's varlen API): sequence b has query rows
/// [cu_seqlens_q[b], cu_seqlens_q[b+1]) and key rows [cu_seqlens_k[b],
/// cu_seqlens_k[b+1]); each attends only within itself, with causal masks,
/// windows, ALiBi and positions given to score modifiers relative to its own
/// start (bottom-right alignment uses its own lengths). Empty sequences are
/// allowed (rows that see no key: O = 0, lse = -inf).
///
/// q [total_q][heads][head_dim], k, v [total_k][heads_kv][head_dim],
/// o [total_q][heads][head_dim], lse [heads][total_q]: contiguous LayoutRight.
/// cu_seqlens_q, cu_seqlens_k [batch + 1] of int in q's memory space.
/// max_seqlen_q, max_seqlen_k: upper bounds of the lengths (they size the
/// launch). Everything else as in flash_attention_forward.
/// Validating the offsets (start 0, non-decreasing, end at total, lengths
/// within the maxima) reads them on the host: this fences.
template <class ExecSpace, class Q, class K, class V, class CuQ, class CuK, class O, class Lse,
          class ScoreMod>
void flash_attention_varlen_forward(const ExecSpace& space, const Q& q, const K& k, const V& v,
                                    const CuQ& cu_seqlens_q, const CuK& cu_seqlens_k,
                                    int max_seqlen_q, int max_seqlen_k, const O& o,
                                    const Lse& lse, const AttentionOptions& options,
                                    const ScoreMod& score_mod) {
  const char* function = "kfa::flash_attention_varlen_forward";
  Impl::ProfilingRegion region(function);
  Impl::check_varlen_forward_arguments<ExecSpace>(function, q, k, v, cu_seqlens_q, cu_seqlens_k,
                                                  max_seqlen_q, max_seqlen_k, o, lse, options);
  if constexpr (Impl::varlen_types_ok<ExecSpace, Q, K, V, CuQ, CuK, O, Lse>()) {
    Impl::check_score_mod_type<ScoreMod, typename Q::non_const_value_type>();
    Impl::check_score_mod<ExecSpace>(function, score_mod,
                                     static_cast<int>(cu_seqlens_q.extent(0)) - 1,
                                     static_cast<int>(q.extent(1)));
    Impl::dispatch_forward(space, Impl::in4(q), Impl::in4(k), Impl::in4(v), Impl::out4(o),
                           Impl::out3(lse),
                           Impl::varlen_sequences<Q>(cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                                     max_seqlen_k),
                           options, score_mod);
  }
}

template <class ExecSpace, class Q, class K, class V, class CuQ, class CuK, class O, class Lse>
void flash_attention_varlen_forward(const ExecSpace& space, const Q& q, const K& k, const V& v,
                                    const CuQ& cu_seqlens_q, const CuK& cu_seqlens_k,
                                    int max_seqlen_q, int max_seqlen_k, const O& o,
                                    const Lse& lse, const AttentionOptions& options = {}) {
  flash_attention_varlen_forward(space, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                 max_seqlen_k, o, lse, options, Impl::NoScoreMod{});
}

/// Fused backward over a packed batch; arguments as in
/// flash_attention_varlen_forward plus d_o, dq like q and dk, dv like k
/// (contiguous). Reads the offsets on the host: this fences.
template <class ExecSpace, class Q, class K, class V, class CuQ, class CuK, class O, class Lse,
          class DO, class DQ, class DK, class DV, class ScoreMod>
void flash_attention_varlen_backward(const ExecSpace& space, const Q& q, const K& k,
                                     const V& v, const CuQ& cu_seqlens_q,
                                     const CuK& cu_seqlens_k, int max_seqlen_q,
                                     int max_seqlen_k, const O& o, const Lse& lse,
                                     const DO& d_o, const DQ& dq, const DK& dk, const DV& dv,
                                     const AttentionOptions& options,
                                     const ScoreMod& score_mod) {
  const char* function = "kfa::flash_attention_varlen_backward";
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
    Impl::dispatch_backward(space, Impl::in4(q), Impl::in4(k), Impl::in4(v), Impl::in4(o),
                            Impl::in3(lse), Impl::in4(d_o), Impl::out4(dq), Impl::out4(dk),
                            Impl::out4(dv),
                            Impl::varlen_sequences<Q>(cu_seqlens_q, cu_seqlens_k,
                                                      max_seqlen_q, max_seqlen_k),
                            options, score_mod);
  }
}

template <class ExecSpace, class Q, class K, class V, class CuQ, class CuK, class O, class Lse,
          class DO, class DQ, class DK, class DV>
void flash_attention_varlen_backward(const ExecSpace& space, const Q& q, const K& k,
                                     const V& v, const CuQ& cu_seqlens_q,
                                     const CuK& cu_seqlens_k, int max_seqlen_q,
                                     int max_seqlen_k, const O& o, const Lse& lse,
                                     const DO& d_o, const DQ& dq, const DK& dk, const DV& dv,
                                     const AttentionOptions& options = {}) {
  flash_attention_varlen_backward(space, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                  max_seqlen_k, o, lse, d_o, dq, dk, dv, options,
                                  Impl::NoScoreMod{});
}

}  // namespace kfa

#endif
