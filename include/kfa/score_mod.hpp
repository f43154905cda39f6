#ifndef KFA_SCORE_MOD_HPP
#define KFA_SCORE_MOD_HPP

/// Score modifiers: FlexAttention's score_mod and mask_mod for C++/Kokkos.
///
/// Every attention entry point has an overload taking a score modifier after
/// the options. A score modifier is a copyable functor callable on the
/// execution space (Views inside it are fine):
///
///   template <class Acc>
///   KOKKOS_FUNCTION Acc operator()(int batch, int head, int i, int j, Acc score) const;
///
/// returns the new score of query i and key j, for sequence `batch` and query
/// head `head`; i and j count from the start of the sequence (also in packed
/// variable-length batches). `score` is the scaled score, after the softcap;
/// the causal / window mask is applied after the modifier. Return
/// kfa::masked_score<Acc>() (-infinity) to mask the element. Acc is
/// kfa::accumulator_t of the value type: float, or double for double.
/// kfa calls it only for elements inside both sequences.
///
/// Optional members:
///
///   KOKKOS_FUNCTION bool visible(int batch, int head, int row_begin, int row_end,
///                                int key_begin, int key_end) const;
///     Block predicate: false promises that every element of rows
///     [row_begin, row_end) x keys [key_begin, key_end) is masked, and kfa
///     then skips that tile in the forward and backward passes (FlexAttention's
///     block mask). It must not return false for a tile with a visible element.
///
///   KOKKOS_FUNCTION bool unchanged(int batch, int head, int row_begin, int row_end,
///                                  int key_begin, int key_end) const;
///     Block predicate: true promises that operator() returns every score of
///     the tile as it gets it (a mask that hides nothing there, a bias that
///     is 0 there: FlexAttention's full blocks). kfa then skips the
///     modifier's calls on that tile (the softcap, the causal / window mask
///     and dropout still apply; add_grad is still called) and the tile runs
///     as without a modifier. Asked only for tiles that visible() lets
///     through; returning false is always correct.
///
///   template <class Acc>
///   KOKKOS_FUNCTION Acc score_grad(int batch, int head, int i, int j, Acc score) const;
///     The derivative of the new score with respect to `score`, for the
///     backward pass. Without it the modifier must be additive: it returns
///     score + bias(batch, head, i, j) or masks (derivative 1), which covers
///     masks, relative position biases and ALiBi.
///
///   template <class Acc>
///   KOKKOS_FUNCTION void add_grad(int batch, int head, int i, int j, Acc g) const;
///     Receives g = dL/d(new score) of every element the backward pass
///     computes with a nonzero probability, once per call (batch, head as in
///     operator(); g is P ∘ (dP∘Z/(1-p) - D), the gradient the score gets
///     before the modifier's and the softcap's derivatives): the gradient
///     of a bias the modifier adds, which it accumulates where it likes
///     (e.g. Kokkos::atomic_add into a View; calls for different elements
///     run concurrently). kfa::nn::pairwise_bias(bias, grad) is one. On
///     CUDA such calls run the portable backward, the only one that hands
///     over each element once.
///
/// A modifier that needs the lengths of the sequence (positions aligned to
/// the bottom-right corner, as FlashAttention-2 aligns causal masks and ALiBi)
/// may take them as two more arguments:
///   operator()(batch, head, i, j, score, seqlen_q, seqlen_k).
///
/// Modifiers must be pure functions of their arguments: the backward pass
/// calls them again and must get the forward's scores.

#include <kfa/types.hpp>

#include <kfa/detail/common/checks.hpp>
#include <kfa/detail/attention/variant.hpp>

#include <cmath>
#include <string>

namespace kfa {

/// The score that masks an element: -infinity (its weight exp(-inf) is 0).
template <class Acc>
KOKKOS_INLINE_FUNCTION constexpr Acc masked_score() {
  return static_cast<Acc>(-INFINITY);
}

/// ALiBi (Press et al.): score - slope · |i + seqlen_k - seqlen_q - j|, the
/// distance measured from the bottom-right-aligned diagonal, as in
/// FlashAttention-2. Slopes per head, or per batch entry and head. Built with
/// kfa::alibi(slopes).
template <class SlopeType, class MemorySpace>
class AlibiBias {
 public:
  using memory_space = MemorySpace;

  /// slopes(b·batch_stride + h·head_stride) is the slope of batch entry b,
  /// head h; `batch` is 0 for slopes per head only.
  AlibiBias(const Kokkos::View<const SlopeType*, MemorySpace>& slopes, int batch, int heads,
            int batch_stride, int head_stride)
      : m_slopes(slopes),
        m_batch(batch),
        m_heads(heads),
        m_batch_stride(batch_stride),
        m_head_stride(head_stride) {}

  int batch() const { return m_batch; }
  int heads() const { return m_heads; }

  template <class Acc>
  KOKKOS_INLINE_FUNCTION Acc operator()(int batch, int head, int i, int j, Acc score,
                                        int seqlen_q, int seqlen_k) const {
    const int distance = i + seqlen_k - seqlen_q - j;
    return score - slope<Acc>(batch, head) * static_cast<Acc>(distance < 0 ? -distance : distance);
  }

  /// The slope of batch entry `batch`, head `head`.
  template <class Acc>
  KOKKOS_INLINE_FUNCTION Acc slope(int batch, int head) const {
    return static_cast<Acc>(m_slopes(batch * m_batch_stride + head * m_head_stride));
  }

 private:
  Kokkos::View<const SlopeType*, MemorySpace> m_slopes;
  int m_batch, m_heads, m_batch_stride, m_head_stride;
};

/// ALiBi score modifier from slopes [heads] (every batch entry) or
/// [batch][heads] (per batch entry): a rank-1 or rank-2 View of float or
/// double (any layout) accessible from the execution space of the call; it
/// must outlive the work enqueued with it. Pass it as the score modifier of
/// any entry point; its extents are checked against q's there.
template <class Slopes>
auto alibi(const Slopes& slopes) {
  static_assert(Kokkos::is_view<Slopes>::value && (Slopes::rank == 1 || Slopes::rank == 2),
                "kfa::alibi: slopes must be a rank-1 [heads] or rank-2 [batch][heads] View");
  using slope_type = typename Slopes::non_const_value_type;
  static_assert(std::is_same<slope_type, float>::value || std::is_same<slope_type, double>::value,
                "kfa::alibi: slopes must be float or double");
  using memory_space = typename Slopes::memory_space;
  const bool per_batch = static_cast<int>(Slopes::rank) == 2;
  const int batch = per_batch ? static_cast<int>(slopes.extent(0)) : 0;
  const int heads = static_cast<int>(slopes.extent(per_batch ? 1 : 0));
  const int batch_stride = per_batch ? static_cast<int>(slopes.stride(0)) : 0;
  const int head_stride = static_cast<int>(slopes.stride(per_batch ? 1 : 0));
  Kokkos::View<const slope_type*, memory_space> flat(slopes.data(), slopes.span());
  return AlibiBias<slope_type, memory_space>(flat, batch, heads, batch_stride, head_stride);
}

namespace Impl {

template <class ScoreMod, class T>
constexpr void check_score_mod_type() {
  static_assert(std::is_same<ScoreMod, NoScoreMod>::value ||
                    is_score_mod<ScoreMod, accumulator_t<T>>(),
                "kfa: score_mod must be callable on the execution space as "
                "score_mod(batch, head, i, j, score) (or with seqlen_q, seqlen_k appended), "
                "score of kfa::accumulator_t<value type> (see kfa/score_mod.hpp)");
}

/// Checks a score modifier against the call (a no-op for user functors).
template <class ExecSpace, class ScoreMod>
void check_score_mod(const char*, const ScoreMod&, int, int) {}

template <class ExecSpace, class SlopeType, class MemorySpace>
void check_score_mod(const char* function, const AlibiBias<SlopeType, MemorySpace>& mod,
                     int batch, int heads) {
  if (!Kokkos::SpaceAccessibility<ExecSpace, MemorySpace>::accessible) {
    throw_invalid(function, std::string("ALiBi slopes live in memory space ") +
                                MemorySpace::name() + ", which the execution space " +
                                ExecSpace::name() + " cannot access");
  }
  if (mod.heads() != heads || (mod.batch() != 0 && mod.batch() != batch)) {
    std::ostringstream out;
    out << "ALiBi slopes must be [heads] = [" << heads << "] or [batch][heads] = [" << batch
        << "][" << heads << "], got ";
    if (mod.batch() != 0) out << "[" << mod.batch() << "]";
    out << "[" << mod.heads() << "]";
    throw_invalid(function, out.str());
  }
}

}  // namespace Impl
}  // namespace kfa

#endif
