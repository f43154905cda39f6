#ifndef KFA_NN_SCORE_MODS_HPP
#define KFA_NN_SCORE_MODS_HPP

/// Score modifiers for the kfa::nn layers (see kfa/score_mod.hpp for what a
/// modifier is): the standard ALiBi slopes, and an additive pairwise bias
/// read from a View (a particle-interaction or relative-position bias).

#include <kfa/score_mod.hpp>

#include <kfa/detail/common/checks.hpp>

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

namespace kfa {
namespace nn {

/// The ALiBi slopes of `heads` heads (Press et al.; Hugging Face's
/// build_alibi_tensor): 2^(-8·i/heads), i = 1..heads, when heads is a power
/// of two; otherwise those of the largest power of two c below heads, then
/// 2^(-4·i/c) for the odd i = 1, 3, ... of the remaining heads (every other
/// slope of 2c heads).
inline std::vector<double> alibi_slopes(int heads) {
  if (heads <= 0) Impl::throw_invalid("kfa::nn::alibi_slopes", "heads must be > 0");
  int closest = 1;
  while (2 * closest <= heads) closest *= 2;
  std::vector<double> slopes;
  for (int i = 1; i <= closest; ++i) slopes.push_back(std::exp2(-8.0 * i / closest));
  for (int i = 1; static_cast<int>(slopes.size()) < heads; i += 2)
    slopes.push_back(std::exp2(-4.0 * i / closest));
  return slopes;
}

/// Adds bias(b, h, i, j) to the score of query i and key j: a score modifier
/// over a rank-4 View [batch or 1][heads or 1][seqlen_q][seqlen_k] (an
/// extent 1 is shared by every batch entry or head), any layout, accessible
/// from the execution space of the call; it must outlive the work enqueued
/// with it. In packed variable-length batches b is the sequence and i, j
/// count from its start (rows and columns past a sequence's lengths are not
/// read). The backward treats it as every additive modifier (derivative 1);
/// the bias gets its gradient from PairwiseBiasWithGrad. Built with
/// kfa::nn::pairwise_bias(view).
template <class BiasView>
class PairwiseBias {
 public:
  using view_type = typename BiasView::const_type;
  using memory_space = typename BiasView::memory_space;

  explicit PairwiseBias(const BiasView& bias)
      : m_bias(bias), m_batch_shared(bias.extent(0) == 1), m_heads_shared(bias.extent(1) == 1) {}

  const view_type& view() const { return m_bias; }

  template <class Acc>
  KOKKOS_INLINE_FUNCTION Acc operator()(int batch, int head, int i, int j, Acc score) const {
    return score + static_cast<Acc>(
                       m_bias(m_batch_shared ? 0 : batch, m_heads_shared ? 0 : head, i, j));
  }

 protected:
  view_type m_bias;
  bool m_batch_shared, m_heads_shared;
};

/// A PairwiseBias whose backward adds dL/dbias into `grad` (the bias's
/// extents, float or double, non-const): grad(b, h, i, j) += the gradient
/// of the score it was added to, summed over the batch entries and heads
/// that share an entry (atomically where an extent is 1; elsewhere each
/// entry has one writer and the sum is deterministic). Gradients
/// accumulate across calls: zero grad before the first. Built with
/// kfa::nn::pairwise_bias(bias, grad).
template <class BiasView, class GradView>
class PairwiseBiasWithGrad : public PairwiseBias<BiasView> {
 public:
  PairwiseBiasWithGrad(const BiasView& bias, const GradView& grad)
      : PairwiseBias<BiasView>(bias), m_grad(grad) {}

  const GradView& grad() const { return m_grad; }

  template <class Acc>
  KOKKOS_INLINE_FUNCTION void add_grad(int batch, int head, int i, int j, Acc g) const {
    auto& entry = m_grad(this->m_batch_shared ? 0 : batch, this->m_heads_shared ? 0 : head, i, j);
    const auto value = static_cast<typename GradView::non_const_value_type>(g);
    if (this->m_batch_shared || this->m_heads_shared)
      Kokkos::atomic_add(&entry, value);
    else
      entry += value;
  }

 private:
  GradView m_grad;
};

/// The PairwiseBias modifier of `bias` [batch or 1][heads or 1][seqlen_q]
/// [seqlen_k] (float or double).
template <class BiasView>
PairwiseBias<BiasView> pairwise_bias(const BiasView& bias) {
  static_assert(Kokkos::is_view<BiasView>::value && BiasView::rank == 4,
                "kfa::nn::pairwise_bias: bias must be a rank-4 View [batch or 1][heads or 1]"
                "[seqlen_q][seqlen_k]");
  using value_type = typename BiasView::non_const_value_type;
  static_assert(std::is_same<value_type, float>::value || std::is_same<value_type, double>::value,
                "kfa::nn::pairwise_bias: bias must hold float or double");
  return PairwiseBias<BiasView>(bias);
}

/// The PairwiseBiasWithGrad modifier of `bias` and its gradient `grad`
/// (same extents; float or double).
template <class BiasView, class GradView>
PairwiseBiasWithGrad<BiasView, GradView> pairwise_bias(const BiasView& bias,
                                                       const GradView& grad) {
  (void)pairwise_bias(bias);  // bias's own static checks
  static_assert(Kokkos::is_view<GradView>::value && GradView::rank == 4,
                "kfa::nn::pairwise_bias: grad must be a rank-4 View like bias");
  using grad_type = typename GradView::value_type;
  static_assert(std::is_same<grad_type, float>::value || std::is_same<grad_type, double>::value,
                "kfa::nn::pairwise_bias: grad must hold (non-const) float or double");
  for (int r = 0; r < 4; ++r) {
    if (grad.extent(r) != bias.extent(r)) {
      Impl::throw_invalid("kfa::nn::pairwise_bias", "grad must have bias's extents " +
                                                        Impl::extents_string(bias) + ", got " +
                                                        Impl::extents_string(grad));
    }
  }
  if (grad.span() > 0 && bias.span() > 0) {
    const auto* g0 = reinterpret_cast<const char*>(grad.data());
    const auto* g1 = g0 + grad.span() * sizeof(grad_type);
    const auto* b0 = reinterpret_cast<const char*>(bias.data());
    const auto* b1 = b0 + bias.span() * sizeof(typename BiasView::value_type);
    if (g0 < b1 && b0 < g1)
      Impl::throw_invalid("kfa::nn::pairwise_bias", "grad must not overlap bias");
  }
  return PairwiseBiasWithGrad<BiasView, GradView>(bias, grad);
}

}  // namespace nn

namespace Impl {

/// Checks a layer's score modifier against the call before anything is
/// written: kfa::alibi's slopes as the entry points check them, a pairwise
/// bias's extents against (batch, heads, seqlen_q, seqlen_k); user functors
/// are not checked.
template <class ExecSpace, class ScoreMod>
void nn_check_score_mod(const char* function, const ScoreMod& mod, int batch, int heads, int,
                        int) {
  check_score_mod<ExecSpace>(function, mod, batch, heads);
}

template <class ExecSpace, class BiasView>
void nn_check_score_mod(const char* function, const nn::PairwiseBias<BiasView>& mod, int batch,
                        int heads, int seqlen_q, int seqlen_k) {
  using memory_space = typename BiasView::memory_space;
  if (!Kokkos::SpaceAccessibility<ExecSpace, memory_space>::accessible) {
    throw_invalid(function, std::string("the pairwise bias lives in memory space ") +
                                memory_space::name() + ", which the execution space " +
                                ExecSpace::name() + " cannot access");
  }
  const auto& b = mod.view();
  if ((b.extent(0) != 1 && b.extent(0) != std::size_t(batch)) ||
      (b.extent(1) != 1 && b.extent(1) != std::size_t(heads)) ||
      b.extent(2) != std::size_t(seqlen_q) || b.extent(3) != std::size_t(seqlen_k)) {
    std::ostringstream out;
    out << "the pairwise bias must be [batch or 1][heads or 1][seqlen_q][seqlen_k] = [" << batch
        << " or 1][" << heads << " or 1][" << seqlen_q << "][" << seqlen_k << "], got "
        << extents_string(b);
    throw_invalid(function, out.str());
  }
}

template <class ExecSpace, class BiasView, class GradView>
void nn_check_score_mod(const char* function,
                        const nn::PairwiseBiasWithGrad<BiasView, GradView>& mod, int batch,
                        int heads, int seqlen_q, int seqlen_k) {
  using memory_space = typename GradView::memory_space;
  if (!Kokkos::SpaceAccessibility<ExecSpace, memory_space>::accessible) {
    throw_invalid(function, std::string("the pairwise bias's grad lives in memory space ") +
                                memory_space::name() + ", which the execution space " +
                                ExecSpace::name() + " cannot access");
  }
  nn_check_score_mod<ExecSpace>(function, static_cast<const nn::PairwiseBias<BiasView>&>(mod),
                                batch, heads, seqlen_q, seqlen_k);
}

}  // namespace Impl
}  // namespace kfa

#endif
