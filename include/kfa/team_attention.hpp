#ifndef KFA_TEAM_ATTENTION_HPP
#define KFA_TEAM_ATTENTION_HPP

// Attention as a building block of the caller's own kernels: one team of a
// Kokkos TeamPolicy solves one small problem (per-particle neighbourhood
// attention, a few dozen keys), many teams at once.

#include <kfa/types.hpp>

#include <kfa/detail/attention/team_attention.hpp>

#include <cstddef>

namespace kfa {
namespace Experimental {

/// Options of team_attention_forward / team_attention_backward (the subset
/// of kfa::AttentionOptions that applies to one small problem). Trivially
/// copyable: build it on the host and capture it in the kernel.
struct TeamAttentionOptions {
  /// Multiplies Q·Kᵀ before the softmax; 0 means 1/sqrt(head_dim).
  double softmax_scale = 0;
  /// Masks key j for query i when j > i + (nk - nq) (bottom-right aligned,
  /// as kfa::AttentionOptions::causal); overrides window_right.
  bool causal = false;
  /// Sliding window: query i sees key j iff
  /// i + off - window_left <= j <= i + off + window_right, off = nk - nq;
  /// a negative value leaves that side unbounded.
  int window_left = -1;
  int window_right = -1;
};

/// Elements of kfa::accumulator_t<T> the scratch argument must hold for a
/// problem of nq query rows and nk keys (the score matrix, rows padded to an
/// odd length). Used for both passes.
KOKKOS_INLINE_FUNCTION constexpr std::size_t team_attention_scratch_size(int nq, int nk) {
  return static_cast<std::size_t>(nq) * static_cast<std::size_t>(Impl::team_scores_stride(nk));
}

/// Bytes of team scratch (TeamPolicy::set_scratch_size) that one rank-1
/// scratch View of team_attention_scratch_size(nq, nk) elements of
/// kfa::accumulator_t<T> takes, alignment included. Size it for the largest
/// problem a team of the launch solves.
template <class T>
std::size_t team_attention_scratch_bytes(int nq, int nk) {
  using scratch_view = Kokkos::View<accumulator_t<T>*, Kokkos::MemoryUnmanaged>;
  return scratch_view::shmem_size(team_attention_scratch_size(nq, nk));
}

/// Attention forward of one small problem by one team, called from inside
/// the caller's TeamPolicy kernel: O = softmax(scale·Q·Kᵀ (masked))·V and
/// lse = log Σ_j exp(s_ij) per row, as kfa::flash_attention_forward computes
/// them (stable max subtraction; rows that see no key give O = 0 and
/// lse = -inf; non-finite inputs as docs/api.md's "Non-finite values").
///
/// q [nq][head_dim], k, v [nk][head_dim], o [nq][head_dim]: rank-2 Views of
/// one value type T (double, float, kfa::half, kfa::bfloat16), any layout,
/// in global memory or in the team's scratch; lse [nq] and scratch
/// [>= team_attention_scratch_size(nq, nk)] of kfa::accumulator_t<T>,
/// rank 1. nq, nk >= 0, head_dim >= 1, all read from the extents. o, lse and
/// scratch must not overlap each other or the inputs.
///
/// Contains team barriers: every thread of the team calls it, with the same
/// arguments. Query rows are spread over the team's threads (a team of nq
/// threads keeps every thread busy), keys and the head dimension over each
/// thread's vector lanes; any team size and vector length works. Inputs
/// written by the team (staged into scratch) must be visible on entry
/// (team_barrier first); on return o and lse are visible to the whole team
/// and scratch may be reused. Shape violations call Kokkos::abort.
template <class Member, class Q, class K, class V, class O, class Lse, class Scratch>
KOKKOS_INLINE_FUNCTION void team_attention_forward(const Member& team, const Q& q, const K& k,
                                                   const V& v, const O& o, const Lse& lse,
                                                   const Scratch& scratch,
                                                   const TeamAttentionOptions& options = {}) {
  Impl::check_team_attention_types<Q, K, V, O, Lse, Scratch>();
  Impl::team_attention_forward(team, q, k, v, o, lse, scratch, options);
}

/// Attention backward of one small problem by one team: recomputes P from q,
/// k and the forward's lse, then dV = Pᵀ·dO, dS = P ∘ (dO·Vᵀ - rowsum(dO∘O)),
/// dQ = scale·dS·K, dK = scale·dSᵀ·Q.
///
/// Shapes and types as in team_attention_forward; o and lse are the
/// forward's outputs for the same q, k, v and options; d_o and dq like q,
/// dk and dv like k (outputs, must not overlap anything else). dq, dk and
/// dv are overwritten, not accumulated. Deterministic without atomics: each
/// element of dq, dk and dv is one lane's sum in a fixed order, so the bits
/// repeat from run to run and do not depend on the team size (only
/// rowsum(dO∘O) is summed over the vector lanes). Team barriers, scratch and
/// visibility as in the forward.
template <class Member, class Q, class K, class V, class O, class Lse, class DO, class DQ,
          class DK, class DV, class Scratch>
KOKKOS_INLINE_FUNCTION void team_attention_backward(const Member& team, const Q& q, const K& k,
                                                    const V& v, const O& o, const Lse& lse,
                                                    const DO& d_o, const DQ& dq, const DK& dk,
                                                    const DV& dv, const Scratch& scratch,
                                                    const TeamAttentionOptions& options = {}) {
  Impl::check_team_attention_types<Q, K, V, O, Lse, Scratch>();
  Impl::check_team_attention_types<DO, DQ, DK, DV, Lse, Scratch>();
  static_assert(std::is_same<typename DO::non_const_value_type,
                             typename Q::non_const_value_type>::value,
                "kfa::Experimental::team_attention_backward: d_o, dq, dk, dv must have q's "
                "value type");
  Impl::team_attention_backward(team, q, k, v, o, lse, d_o, dq, dk, dv, scratch, options);
}

}  // namespace Experimental
}  // namespace kfa

#endif
