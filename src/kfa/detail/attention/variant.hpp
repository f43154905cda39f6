#ifndef KFA_DETAIL_ATTENTION_VARIANT_HPP
#define KFA_DETAIL_ATTENTION_VARIANT_HPP

// The score pipeline every kernel shares (flash forward, both flash backward
// kernels, the materialised baseline): from the scaled score s = scale·q·k,
//   softcap:   s <- c·tanh(s/c)                 d/ds = 1 - tanh²(s/c)
//   modifier:  s <- score_mod(b, h, i, j, s)    d/ds = score_grad(...) or 1
// then the mask, the softmax, and dropout on P. A modifier with add_grad is
// handed dL/d(its result) of every element the backward sees. Which of these a kernel
// instantiation contains is its Variant; their run-time parameters travel in
// KernelParams.

#include <kfa/options.hpp>

#include <kfa/detail/common/compat.hpp>
#include <kfa/detail/attention/dropout_generator.hpp>
#include <kfa/detail/attention/online_softmax.hpp>
#include <kfa/detail/attention/sequences.hpp>

#include <type_traits>
#include <utility>

namespace kfa {

template <class SlopeType, class MemorySpace>
class AlibiBias;

namespace Impl {

/// The score modifier of the overloads that take none.
struct NoScoreMod {};

/// Compile-time feature set of one kernel instantiation, chosen in
/// kfa/detail/attention/dispatch.hpp. kModifiers compiles softcap and dropout in; each is still
/// off at run time when its parameter is 0. One flag serves both: a flag each
/// would double the kernels compiled per head dimension again, to save a
/// uniform branch per tile row.
template <bool Modifiers, class ScoreMod = NoScoreMod>
struct Variant {
  static constexpr bool kModifiers = Modifiers;
  static constexpr bool kScoreMod = !std::is_same<ScoreMod, NoScoreMod>::value;
  using score_mod_type = ScoreMod;
};

/// The default overloads without softcap and dropout: the fast path.
using PlainVariant = Variant<false>;

// What a score modifier provides (see include/kfa/score_mod.hpp).
template <class Mod, class Acc, class = void>
struct score_mod_takes_lengths : std::false_type {};
template <class Mod, class Acc>
struct score_mod_takes_lengths<Mod, Acc,
                               std::void_t<decltype(std::declval<const Mod&>()(
                                   0, 0, 0, 0, std::declval<Acc>(), 0, 0))>> : std::true_type {};

template <class Mod, class Acc, class = void>
struct score_mod_takes_score : std::false_type {};
template <class Mod, class Acc>
struct score_mod_takes_score<
    Mod, Acc, std::void_t<decltype(std::declval<const Mod&>()(0, 0, 0, 0, std::declval<Acc>()))>>
    : std::true_type {};

template <class Mod, class = void>
struct score_mod_has_visible : std::false_type {};
template <class Mod>
struct score_mod_has_visible<
    Mod, std::void_t<decltype(std::declval<const Mod&>().visible(0, 0, 0, 0, 0, 0))>>
    : std::true_type {};

template <class Mod, class = void>
struct score_mod_has_unchanged : std::false_type {};
template <class Mod>
struct score_mod_has_unchanged<
    Mod, std::void_t<decltype(std::declval<const Mod&>().unchanged(0, 0, 0, 0, 0, 0))>>
    : std::true_type {};

template <class Mod, class Acc, class = void>
struct score_mod_has_grad : std::false_type {};
template <class Mod, class Acc>
struct score_mod_has_grad<Mod, Acc,
                          std::void_t<decltype(std::declval<const Mod&>().score_grad(
                              0, 0, 0, 0, std::declval<Acc>()))>> : std::true_type {};

template <class Mod, class Acc, class = void>
struct score_mod_has_add_grad : std::false_type {};
template <class Mod, class Acc>
struct score_mod_has_add_grad<Mod, Acc,
                              std::void_t<decltype(std::declval<const Mod&>().add_grad(
                                  0, 0, 0, 0, std::declval<Acc>()))>> : std::true_type {};

/// True when the modifier takes the gradient of its result (add_grad):
/// such calls run backward kernels that visit each element once.
template <class Mod>
constexpr bool score_mod_takes_gradient() {
  return score_mod_has_add_grad<Mod, float>::value || score_mod_has_add_grad<Mod, double>::value;
}

/// kfa::alibi's modifier, which the fused kernels apply from float
/// distances (ScorePipeline::score_alibi).
template <class Mod>
struct is_alibi_bias : std::false_type {};
template <class SlopeType, class MemorySpace>
struct is_alibi_bias<AlibiBias<SlopeType, MemorySpace>> : std::true_type {};

template <class Mod, class Acc>
constexpr bool is_score_mod() {
  return score_mod_takes_score<Mod, Acc>::value || score_mod_takes_lengths<Mod, Acc>::value;
}

/// Run-time parameters shared by every kernel of one call.
template <class Acc, class MemorySpace>
struct KernelParams {
  Sequences<MemorySpace> seq;
  int heads = 0, heads_kv = 0, head_dim = 0;
  /// Causal folded in: it is window_right = 0.
  int window_left = -1, window_right = -1;
  Acc scale = 1;
  Acc softcap = 0;
  double dropout_p = 0;
  std::uint64_t dropout_seed = 0;

  /// Query heads per key/value head (grouped-query attention).
  int group() const { return heads_kv > 0 ? heads / heads_kv : 1; }
};

/// The softcap, modifier and dropout of one call, as the kernels apply them.
template <class VariantT, class Acc>
struct ScorePipeline {
  using score_mod_type = typename VariantT::score_mod_type;
  static constexpr bool kModifiers = VariantT::kModifiers;
  static constexpr bool kScoreMod = VariantT::kScoreMod;
  /// The modifier takes dL/d(its result) (add_grad).
  static constexpr bool kGradOut =
      kScoreMod && score_mod_has_add_grad<score_mod_type, Acc>::value;

  Acc m_softcap = 0, m_inv_softcap = 0;
  bool m_dropout = false;
  DropoutGenerator m_generator;
  /// 1/(1-p): kept weights are scaled up so that E[O] is unchanged.
  Acc m_keep_scale = 1;
  score_mod_type m_mod;

  ScorePipeline() = default;
  template <class MemorySpace>
  ScorePipeline(const KernelParams<Acc, MemorySpace>& p, const score_mod_type& mod)
      : m_softcap(p.softcap),
        m_inv_softcap(p.softcap > Acc(0) ? Acc(1) / p.softcap : Acc(0)),
        m_dropout(p.dropout_p > 0),
        m_generator(p.dropout_p, p.dropout_seed),
        m_keep_scale(static_cast<Acc>(1.0 / (1.0 - p.dropout_p))),
        m_mod(mod) {}

  /// True when the pipeline changes scores (the kernels then run the
  /// element loop on every tile, not only on tiles the mask cuts).
  KOKKOS_FORCEINLINE_FUNCTION bool modifies_scores() const {
    if constexpr (kScoreMod) return true;
    if constexpr (kModifiers) return m_softcap != Acc(0);
    return false;
  }

  KOKKOS_FORCEINLINE_FUNCTION bool dropout() const {
    if constexpr (kModifiers) return m_dropout;
    return false;
  }

  /// Score of element (i, j) of sequence b, head h from the scaled score s;
  /// `grad` receives d(result)/ds. Only for unmasked elements.
  /// `modify` false: the modifier is left out (a tile it promised to leave
  /// unchanged, see unchanged()).
  template <bool WithGrad>
  KOKKOS_FORCEINLINE_FUNCTION Acc score(const SequenceInfo& seq, int b, int h, int i, int j,
                                        Acc s, Acc& grad, bool modify = true) const {
    s = softcapped<WithGrad>(s, grad);
    return modify ? modified<WithGrad>(seq, b, h, i, j, s, grad) : s;
  }

  /// The modifier step of score<WithGrad>: grad is multiplied by its
  /// derivative (where it has score_grad).
  template <bool WithGrad>
  KOKKOS_FORCEINLINE_FUNCTION Acc modified([[maybe_unused]] const SequenceInfo& seq,
                                           [[maybe_unused]] int b, [[maybe_unused]] int h,
                                           [[maybe_unused]] int i, [[maybe_unused]] int j, Acc s,
                                           [[maybe_unused]] Acc& grad) const {
    if constexpr (kScoreMod) {
      Acc modified;
      if constexpr (score_mod_takes_lengths<score_mod_type, Acc>::value) {
        modified = m_mod(b, h, i, j, s, seq.seqlen_q, seq.seqlen_k);
      } else {
        modified = m_mod(b, h, i, j, s);
      }
      if constexpr (WithGrad && score_mod_has_grad<score_mod_type, Acc>::value) {
        grad *= static_cast<Acc>(m_mod.score_grad(b, h, i, j, s));
      }
      s = modified;
    }
    return s;
  }

  /// True when the softcap is on (a kernel may take this test out of its
  /// element loops and call softcapped only then).
  KOKKOS_FORCEINLINE_FUNCTION bool softcap_on() const {
    if constexpr (kModifiers) return m_softcap != Acc(0);
    return false;
  }

  /// The softcap step of score<WithGrad>.
  template <bool WithGrad>
  KOKKOS_FORCEINLINE_FUNCTION Acc softcapped(Acc s, [[maybe_unused]] Acc& grad) const {
    if constexpr (kModifiers) {
      if (m_softcap != Acc(0)) {
        const Acc t = math::tanh(s * m_inv_softcap);
        s = m_softcap * t;
        if constexpr (WithGrad) grad = Acc(1) - t * t;
      }
    }
    return s;
  }

  /// kfa::alibi: score<WithGrad> from the element's distance |i + seqlen_k -
  /// seqlen_q - j| given as a float (exact below 2^24), which the fused
  /// kernels form from a tile's base distance and a constant per fragment
  /// element instead of converting two indices per score.
  static constexpr bool kAlibi = is_alibi_bias<score_mod_type>::value;
  KOKKOS_FORCEINLINE_FUNCTION Acc alibi_slope([[maybe_unused]] int b,
                                              [[maybe_unused]] int h) const {
    if constexpr (kAlibi) return m_mod.template slope<Acc>(b, h);
    return Acc(0);
  }
  template <bool WithGrad>
  KOKKOS_FORCEINLINE_FUNCTION Acc score_alibi(Acc s, Acc slope, Acc distance, Acc& grad) const {
    return softcapped<WithGrad>(s, grad) - slope * distance;
  }

  /// False when the modifier's block predicate says the tile is fully masked.
  KOKKOS_FORCEINLINE_FUNCTION bool visible([[maybe_unused]] int b, [[maybe_unused]] int h,
                                           [[maybe_unused]] int row_begin,
                                           [[maybe_unused]] int row_end,
                                           [[maybe_unused]] int key_begin,
                                           [[maybe_unused]] int key_end) const {
    if constexpr (kScoreMod && score_mod_has_visible<score_mod_type>::value) {
      return m_mod.visible(b, h, row_begin, row_end, key_begin, key_end);
    } else {
      return true;
    }
  }

  /// True when the modifier's `unchanged` member promises that it returns
  /// every score of the tile as it gets it (FlexAttention's full blocks):
  /// the kernels then skip its calls there. Always true without a modifier.
  KOKKOS_FORCEINLINE_FUNCTION bool unchanged([[maybe_unused]] int b, [[maybe_unused]] int h,
                                             [[maybe_unused]] int row_begin,
                                             [[maybe_unused]] int row_end,
                                             [[maybe_unused]] int key_begin,
                                             [[maybe_unused]] int key_end) const {
    if constexpr (!kScoreMod) {
      return true;
    } else if constexpr (score_mod_has_unchanged<score_mod_type>::value) {
      return m_mod.unchanged(b, h, row_begin, row_end, key_begin, key_end);
    } else {
      return false;
    }
  }

  /// The backward pass's P and dS of element (i, j) from its scaled score s,
  /// the row's lse and D, and dP = dO·v: P = exp(pipeline(s) - lse) (the
  /// dropped P with dropout, for dV), dS = P ∘ (dP∘Z/(1-p) - D) ∘ pipeline'.
  /// Masked elements and rows that saw no key (lse = -inf) give 0. With
  /// GradOut a modifier with add_grad gets P ∘ (dP∘Z/(1-p) - D), dL/d(its
  /// result), of each element that has P > 0 (a kernel that computes an
  /// element twice passes GradOut = false in one of the passes).
  /// `modify` as in score(); add_grad is called either way.
  template <bool GradOut = true>
  KOKKOS_FORCEINLINE_FUNCTION void p_and_ds(const SequenceInfo& seq, int b, int h, int i, int j,
                                            bool masked, std::uint64_t dropout_row, Acc s,
                                            Acc lse, Acc delta, Acc dp, Acc& p, Acc& ds,
                                            bool modify = true) const {
    Acc grad = 1, pj = 0;
    if (!masked)
      pj = OnlineSoftmax<Acc>::probability(score<true>(seq, b, h, i, j, s, grad, modify), lse);
    const Acc keep = dropout() ? keep_factor(dropout_row, j) : Acc(1);
    if constexpr (GradOut && kGradOut) {
      if (pj != Acc(0)) add_grad(b, h, i, j, pj * (dp * keep - delta));
    }
    p_and_ds_of(pj, grad, keep, delta, dp, p, ds);
  }
  /// Hands the modifier dL/d(its result) g of element (i, j) (kGradOut).
  KOKKOS_FORCEINLINE_FUNCTION void add_grad([[maybe_unused]] int b, [[maybe_unused]] int h,
                                            [[maybe_unused]] int i, [[maybe_unused]] int j,
                                            [[maybe_unused]] Acc g) const {
    if constexpr (kGradOut) m_mod.add_grad(b, h, i, j, g);
  }
  /// The rest of p_and_ds from the element's undropped probability pj, the
  /// pipeline's derivative and the dropout factor.
  KOKKOS_FORCEINLINE_FUNCTION static void p_and_ds_of(Acc pj, Acc grad, Acc keep, Acc delta,
                                                      Acc dp, Acc& p, Acc& ds) {
    p = pj * keep;
    // pj = 0 (masked, or masked by the modifier) must give dS = 0 whatever
    // the modifier's derivative there.
    ds = pj == Acc(0) ? Acc(0) : pj * (dp * keep - delta) * grad;
  }

  /// Dropout row key of query row i (see DropoutGenerator).
  KOKKOS_FORCEINLINE_FUNCTION std::uint64_t dropout_row(int b, int h, int i) const {
    return m_generator.row_key(b, h, i);
  }
  /// The same in two steps, for kernels that visit many rows of one head:
  /// dropout_row_of(dropout_head(b, h), i) == dropout_row(b, h, i).
  KOKKOS_FORCEINLINE_FUNCTION std::uint64_t dropout_head(int b, int h) const {
    return m_generator.head_key(b, h);
  }
  KOKKOS_FORCEINLINE_FUNCTION static std::uint64_t dropout_row_of(std::uint64_t head, int i) {
    return DropoutGenerator::row_of(head, i);
  }
  /// The dropped P's factor of a kept element, 1/(1-p).
  KOKKOS_FORCEINLINE_FUNCTION Acc keep_scale() const { return m_keep_scale; }
  /// Whether element j of a row is kept, from the bits of its pair
  /// (DropoutGenerator::pair_bits of the row's key and j / 2).
  KOKKOS_FORCEINLINE_FUNCTION bool kept_bits(std::uint32_t bits, int j) const {
    return m_generator.kept_bits(bits, j);
  }
  /// Factor of element j of that row in the dropped P: 1/(1-p) or 0.
  KOKKOS_FORCEINLINE_FUNCTION Acc keep_factor(std::uint64_t row, int j) const {
    return m_generator.kept(row, j) ? m_keep_scale : Acc(0);
  }
  /// The factors of keys j and j + 1 of a row, j even: one draw for both.
  KOKKOS_FORCEINLINE_FUNCTION void keep_factors(std::uint64_t row, int j, Acc& keep0,
                                                Acc& keep1) const {
    const std::uint32_t bits = DropoutGenerator::pair_bits(row, j >> 1);
    keep0 = m_generator.kept_bits(bits, 0) ? m_keep_scale : Acc(0);
    keep1 = m_generator.kept_bits(bits, 1) ? m_keep_scale : Acc(0);
  }
};

}  // namespace Impl
}  // namespace kfa

#endif
