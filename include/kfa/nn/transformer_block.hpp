#ifndef KFA_NN_TRANSFORMER_BLOCK_HPP
#define KFA_NN_TRANSFORMER_BLOCK_HPP

#include <kfa/nn/multi_head_attention.hpp>
#include <kfa/nn/options.hpp>

#include <kfa/detail/nn/block_parts.hpp>

namespace kfa {
namespace nn {

/// What TransformerBlock::forward saves for its backward, and the
/// workspaces; the caller owns it (see MultiHeadAttentionContext).
template <class ExecSpace, class T>
struct TransformerBlockContext {
  using memory_space = typename ExecSpace::memory_space;
  using view1_acc = Kokkos::View<accumulator_t<T>*, Kokkos::LayoutRight, memory_space>;
  using view2 = Kokkos::View<T**, Kokkos::LayoutRight, memory_space>;
  using view3 = Kokkos::View<T***, Kokkos::LayoutRight, memory_space>;

  /// Seed of every dropout in the block for this call (each site derives its
  /// own); set it before the forward, e.g. to the training step.
  std::uint64_t dropout_seed = 0;
  /// false: no dropout (inference).
  bool training = true;

  MultiHeadAttentionContext<ExecSpace, T> attention;
  // Saved by the forward: the input (a reference), norm1(x), x1 = x +
  // dropout(attention), norm2(x1), the MLP's first projection u and its
  // activation after dropout g, the norms' statistics.
  Kokkos::View<const T***, Kokkos::LayoutRight, memory_space> x;
  view3 h1, a;
  view2 x1, h2, u, g;
  view1_acc mean1, rstd1, mean2, rstd2;
  // Backward workspaces.
  view2 dm, dg, du, dh2, dx1;
  view3 da, dh1;

  /// Bytes of the Views the context owns, the attention's included (not the
  /// caller's x): the block's memory between a forward and its backward.
  std::size_t saved_bytes() const {
    const view3* tensors[] = {&h1, &a, &da, &dh1};
    const view2* matrices[] = {&x1, &h2, &u, &g, &dm, &dg, &du, &dh2, &dx1};
    const view1_acc* statistics[] = {&mean1, &rstd1, &mean2, &rstd2};
    std::size_t bytes = attention.saved_bytes();
    for (const view3* t : tensors) bytes += t->span() * sizeof(T);
    for (const view2* m : matrices) bytes += m->span() * sizeof(T);
    for (const view1_acc* s : statistics) bytes += s->span() * sizeof(accumulator_t<T>);
    return bytes;
  }
};

/// A pre-norm transformer encoder block (torch.nn.TransformerEncoderLayer
/// with norm_first=True and batch_first=True, or a Llama block with RMSNorm
/// and SwiGLU):
///   x1 = x + dropout(attention(norm1(x)))
///   y  = x1 + dropout(W2·dropout(act(W1·norm2(x1) + b1)) + b2)
/// Parameters and gradients are Views held by the block (weights(),
/// grads(), attention()); backward accumulates the gradients (zero_grad
/// resets them). Value types double, float, kfa::half and kfa::bfloat16
/// (see MultiHeadAttention: 16-bit storage, fp32 arithmetic; with
/// options.fp32_gradients the gradients are grads_fp32()).
///
/// Sequence-parallel mode: options.attention.sequence_parallel (see
/// MultiHeadAttention); norms and MLP are per token and stay local, and the
/// dropout masks follow the tokens, so the ranks draw the masks that one rank
/// draws on the whole sequence.
template <class ExecSpace, class T>
class TransformerBlock {
 public:
  using execution_space = ExecSpace;
  using memory_space = typename ExecSpace::memory_space;
  using view1 = Kokkos::View<T*, Kokkos::LayoutRight, memory_space>;
  using view2 = Kokkos::View<T**, Kokkos::LayoutRight, memory_space>;
  using context_type = TransformerBlockContext<ExecSpace, T>;

  /// The block's own parameters (the attention's are in attention()):
  /// norm weights and biases [d_model] (biases empty for RMSNorm or without
  /// options.bias), w1 [d_ff or 2·d_ff (SwiGLU: gate rows then up rows)]
  /// [d_model], b1, w2 [d_model][d_ff], b2.
  template <class V>
  struct Tensors {
    using value_type = V;
    Kokkos::View<V*, Kokkos::LayoutRight, memory_space> norm1_weight, norm1_bias, norm2_weight,
        norm2_bias;
    Kokkos::View<V**, Kokkos::LayoutRight, memory_space> w1, w2;
    Kokkos::View<V*, Kokkos::LayoutRight, memory_space> b1, b2;
  };
  using Weights = Tensors<T>;
  /// The gradients in fp32 (options.fp32_gradients of a 16-bit T).
  using Fp32Grads = Tensors<accumulator_t<T>>;

  /// Allocates the parameters: linear weights U(-1/sqrt(fan_in),
  /// 1/sqrt(fan_in)) from options.init_seed, biases zero, norm weights one;
  /// zero gradients. Throws std::invalid_argument on inconsistent options.
  explicit TransformerBlock(const TransformerBlockOptions& options)
      : m_options(resolve(options)),
        m_parts("kfa::nn::TransformerBlock", m_options.norm, m_options.norm_options,
                m_options.activation, m_options.d_ff, m_options.bias, m_options.dropout_p),
        m_attention(m_options.attention) {
    const auto& o = m_options;
    allocate(m_weights, "");
    if (o.fp32_gradients && Impl::nn_is_16bit<T>())
      allocate(m_grads_fp32, "grad_fp32_");
    else
      allocate(m_grads, "grad_");
    Kokkos::deep_copy(m_weights.norm1_weight, Impl::from_acc<T>(1.0f));
    Kokkos::deep_copy(m_weights.norm2_weight, Impl::from_acc<T>(1.0f));
    std::mt19937_64 rng(o.init_seed + 1);
    Impl::nn_init_uniform(m_weights.w1, 1.0 / std::sqrt(double(d_model())), rng);
    Impl::nn_init_uniform(m_weights.w2, 1.0 / std::sqrt(double(o.d_ff)), rng);
  }

  /// The options with the attention's options resolved.
  const TransformerBlockOptions& options() const { return m_options; }
  MultiHeadAttention<ExecSpace, T>& attention() { return m_attention; }
  const MultiHeadAttention<ExecSpace, T>& attention() const { return m_attention; }
  Weights& weights() { return m_weights; }
  const Weights& weights() const { return m_weights; }
  /// The gradients of T (empty Views under options.fp32_gradients).
  Weights& grads() { return m_grads; }
  const Weights& grads() const { return m_grads; }
  /// The fp32 gradients under options.fp32_gradients with a 16-bit T (else
  /// empty Views).
  Fp32Grads& grads_fp32() { return m_grads_fp32; }
  const Fp32Grads& grads_fp32() const { return m_grads_fp32; }

  /// Every parameter with torch.nn.TransformerEncoderLayer's name
  /// (self_attn.in_proj_weight, ..., linear1.weight, linear1.bias,
  /// linear2.weight, linear2.bias, norm1.weight, norm1.bias, norm2.weight,
  /// norm2.bias), each prefixed by `prefix`.
  std::vector<Parameter<T, memory_space>> parameters(const std::string& prefix = "") const {
    auto list = m_attention.parameters(prefix + "self_attn.");
    const Weights &w = m_weights, &g = m_grads;
    const Fp32Grads& g32 = m_grads_fp32;
    Impl::nn_add_parameter(list, prefix + "linear1.weight", w.w1, g.w1, g32.w1);
    Impl::nn_add_parameter(list, prefix + "linear1.bias", w.b1, g.b1, g32.b1);
    Impl::nn_add_parameter(list, prefix + "linear2.weight", w.w2, g.w2, g32.w2);
    Impl::nn_add_parameter(list, prefix + "linear2.bias", w.b2, g.b2, g32.b2);
    Impl::nn_add_parameter(list, prefix + "norm1.weight", w.norm1_weight, g.norm1_weight,
                           g32.norm1_weight);
    Impl::nn_add_parameter(list, prefix + "norm1.bias", w.norm1_bias, g.norm1_bias,
                           g32.norm1_bias);
    Impl::nn_add_parameter(list, prefix + "norm2.weight", w.norm2_weight, g.norm2_weight,
                           g32.norm2_weight);
    Impl::nn_add_parameter(list, prefix + "norm2.bias", w.norm2_bias, g.norm2_bias,
                           g32.norm2_bias);
    return list;
  }

  /// Sets every parameter gradient (the attention's too) to zero.
  void zero_grad(const ExecSpace& space) {
    Impl::nn_zero_grad(space, parameters());
  }

  /// y = block(x); saves what the backward needs in `context`.
  /// x, y [batch][seqlen][d_model]: contiguous LayoutRight Views of T
  /// accessible from ExecSpace; y must not overlap x. Enqueued on `space`.
  /// Throws std::invalid_argument (nothing written) on bad shapes.
  template <class X, class Y>
  void forward(const ExecSpace& space, const X& x, const Y& y, context_type& context) const {
    const char* function = "kfa::nn::TransformerBlock::forward";
    Impl::ProfilingRegion region(function);
    Impl::nn_checks_on_every_rank(m_options.attention.sequence_parallel,
                                  [&] { m_attention.check_pair(function, "x", x, "y", y); });
    if constexpr (MultiHeadAttention<ExecSpace, T>::template pair_ok<X, Y>()) {
      Attention::unpack(context.attention);
      m_attention.with_own_modifier(
          [&](const auto& mod) { forward_impl(space, x, Impl::out_matrix(y), context, mod); });
    }
  }

  /// The block with a score modifier in its attention (see
  /// MultiHeadAttention::forward); pass the same one to the backward.
  template <class X, class Y, class ScoreMod>
  void forward(const ExecSpace& space, const X& x, const Y& y, context_type& context,
               const ScoreMod& score_mod) const {
    const char* function = "kfa::nn::TransformerBlock::forward";
    Impl::ProfilingRegion region(function);
    Impl::nn_checks_on_every_rank(m_options.attention.sequence_parallel,
                                  [&] { m_attention.check_pair(function, "x", x, "y", y); });
    if constexpr (MultiHeadAttention<ExecSpace, T>::template pair_ok<X, Y>()) {
      m_attention.check_modifier(function, score_mod, x.extent(0), x.extent(1), x.extent(1));
      Attention::unpack(context.attention);
      forward_impl(space, x, Impl::out_matrix(y), context, score_mod);
    }
  }

  /// A packed batch of variable-length sequences: x, y [total_tokens]
  /// [d_model], cu_seqlens and max_seqlen as in
  /// MultiHeadAttention's packed forward (positions, masks and the
  /// attention restart at each sequence; norms, MLP and dropout are per
  /// token). The backward takes dy, dx [total_tokens][d_model]. Fences (the
  /// offsets are checked on the host).
  template <class X, class Cu, class Y>
  void forward(const ExecSpace& space, const X& x, const Cu& cu_seqlens, int max_seqlen,
               const Y& y, context_type& context) const {
    const char* function = "kfa::nn::TransformerBlock::forward";
    Impl::ProfilingRegion region(function);
    m_attention.check_packed_forward(function, x, cu_seqlens, max_seqlen, y, context.attention);
    if constexpr (Attention::template packed_pair_ok<X, Y>()) {
      m_attention.with_own_modifier([&](const auto& mod) {
        forward_impl(space, Attention::packed_tokens(x), Impl::out_matrix(y), context, mod);
      });
    }
  }

  /// A packed batch with a score modifier in the attention.
  template <class X, class Cu, class Y, class ScoreMod>
  void forward(const ExecSpace& space, const X& x, const Cu& cu_seqlens, int max_seqlen,
               const Y& y, context_type& context, const ScoreMod& score_mod) const {
    const char* function = "kfa::nn::TransformerBlock::forward";
    Impl::ProfilingRegion region(function);
    m_attention.check_packed_forward(function, x, cu_seqlens, max_seqlen, y, context.attention);
    if constexpr (Attention::template packed_pair_ok<X, Y>()) {
      m_attention.check_modifier(function, score_mod, cu_seqlens.extent(0) - 1, max_seqlen,
                                 max_seqlen);
      forward_impl(space, Attention::packed_tokens(x), Impl::out_matrix(y), context, score_mod);
    }
  }

  /// Backward of the forward that filled `context`: dx overwritten, every
  /// parameter gradient accumulated. dy, dx [batch][seqlen][d_model] like
  /// that forward's x ([total_tokens][d_model] after a packed forward); dx
  /// must not overlap dy.
  template <class DY, class DX>
  void backward(const ExecSpace& space, const DY& dy, const DX& dx, context_type& context) {
    const char* function = "kfa::nn::TransformerBlock::backward";
    Impl::ProfilingRegion region(function);
    check_backward(function, dy, dx, context);
    if constexpr (backward_views_ok<DY, DX>()) {
      m_attention.with_own_modifier([&](const auto& mod) {
        backward_impl(space, Impl::in_matrix(dy), Impl::out_matrix(dx), context, mod);
      });
    }
  }

  /// Backward of a forward with `score_mod` (the same modifier).
  template <class DY, class DX, class ScoreMod>
  void backward(const ExecSpace& space, const DY& dy, const DX& dx, context_type& context,
                const ScoreMod& score_mod) {
    const char* function = "kfa::nn::TransformerBlock::backward";
    Impl::ProfilingRegion region(function);
    check_backward(function, dy, dx, context);
    if constexpr (backward_views_ok<DY, DX>()) {
      const auto& c = context.attention;
      if (c.packed) {
        m_attention.check_modifier(function, score_mod, c.cu_seqlens.extent(0) - 1,
                                   c.max_seqlen, c.max_seqlen);
      } else {
        m_attention.check_modifier(function, score_mod, c.x.extent(0), c.x.extent(1),
                                   c.x.extent(1));
      }
      backward_impl(space, Impl::in_matrix(dy), Impl::out_matrix(dx), context, score_mod);
    }
  }

 private:
  using Attention = MultiHeadAttention<ExecSpace, T>;

  /// dy, dx: packed [total_tokens][d_model] or [batch][seqlen][d_model].
  template <class DY, class DX>
  static constexpr bool backward_views_ok() {
    return Attention::template packed_pair_ok<DY, DX>() ||
           Attention::template pair_ok<DY, DX>();
  }

  /// The backward's checks: dy and dx like the forward's x, packed or not.
  template <class DY, class DX>
  void check_backward(const char* function, const DY& dy, const DX& dx,
                      const context_type& context) const {
    if constexpr (Attention::template packed_pair_ok<DY, DX>()) {
      m_attention.check_packed_backward(function, dy, dx, context.attention);
    } else {
      Impl::nn_checks_on_every_rank(m_options.attention.sequence_parallel, [&] {
        m_attention.check_pair(function, "dy", dy, "dx", dx);
        if constexpr (Attention::template pair_ok<DY, DX>())
          Attention::check_like_forward(function, dy, context.attention);
      });
    }
  }
  using in2 = Impl::NnIn2<T, memory_space>;
  using out2 = Impl::NnOut2<T, memory_space>;
  using Parts = Impl::NnBlockParts<ExecSpace, T>;

  int d_model() const { return m_options.attention.d_model; }

  static TransformerBlockOptions resolve(TransformerBlockOptions o) {
    const char* function = "kfa::nn::TransformerBlock";
    o.attention.bias = o.bias;
    o.attention.fp32_gradients = o.fp32_gradients;
    Parts::check_options(function, o.d_ff, o.norm_options, o.dropout_p);
    if (o.attention.d_model_kv != 0 && o.attention.d_model_kv != o.attention.d_model) {
      Impl::throw_invalid(function, "options.attention.d_model_kv must be 0 or d_model: the "
                                    "block's attention is self-attention");
    }
    // The block recomputes as a whole; its attention then never on its own.
    o.recompute = o.recompute || o.attention.recompute;
    o.attention.recompute = false;
    o.attention = MultiHeadAttention<ExecSpace, T>::resolve(o.attention);
    return o;
  }

  template <class V>
  void allocate(Tensors<V>& w, const std::string& prefix) const {
    m_parts.allocate_norm(w.norm1_weight, w.norm1_bias, prefix + "norm1", d_model());
    m_parts.allocate_norm(w.norm2_weight, w.norm2_bias, prefix + "norm2", d_model());
    m_parts.allocate_mlp(w.w1, w.b1, w.w2, w.b2, prefix, d_model());
  }

  /// y = residual + dropout(x) with the mask of `site` (Impl::NnBlockSite).
  void residual_dropout(const ExecSpace& space, const char* step, const in2& residual,
                        const in2& x, const out2& y, const context_type& c, int site) const {
    m_parts.residual_dropout(space, step, residual, x, y,
                             m_parts.dropout(c.training, c.dropout_seed, site), c.attention.slice);
  }

  /// Frees every View the context owns (the recompute mode).
  static void release(context_type& c) {
    typename context_type::view3* tensors[] = {&c.h1, &c.a, &c.da, &c.dh1};
    typename context_type::view2* matrices[] = {&c.x1, &c.h2, &c.u,   &c.g,  &c.dm,
                                                &c.dg, &c.du, &c.dh2, &c.dx1};
    typename context_type::view1_acc* statistics[] = {&c.mean1, &c.rstd1, &c.mean2, &c.rstd2};
    for (auto* t : tensors) *t = typename context_type::view3();
    for (auto* m : matrices) *m = typename context_type::view2();
    for (auto* s : statistics) *s = typename context_type::view1_acc();
    Attention::release(c.attention);
    // The attention's x was h1: keep only its shape (the backward's checks
    // read it), through the caller's x, which has the same.
    c.attention.x = c.x;
  }

  /// y = block(x); in the recompute mode everything but x is freed after
  /// (unless `keep`: the backward's recomputation).
  template <class X, class ScoreMod>
  void forward_impl(const ExecSpace& space, const X& x, const out2& y, context_type& c,
                    const ScoreMod& score_mod, bool keep = false) const {
    const auto& w = m_weights;
    const int batch = int(x.extent(0)), seqlen = int(x.extent(1)), tokens = batch * seqlen;
    const int d = d_model();
    c.x = x;
    Impl::nn_ensure(c.h1, "kfa::nn::TransformerBlock::h1", batch, seqlen, d);
    Impl::nn_ensure(c.a, "kfa::nn::TransformerBlock::a", batch, seqlen, d);
    Impl::nn_ensure(c.x1, "kfa::nn::TransformerBlock::x1", tokens, d);
    Impl::nn_ensure(c.h2, "kfa::nn::TransformerBlock::h2", tokens, d);
    Impl::nn_ensure(c.u, "kfa::nn::TransformerBlock::u", tokens, m_parts.mlp_rows());
    Impl::nn_ensure(c.g, "kfa::nn::TransformerBlock::g", tokens, m_options.d_ff);
    typename context_type::view1_acc* statistics[] = {&c.mean1, &c.rstd1, &c.mean2, &c.rstd2};
    for (auto* s : statistics) Impl::nn_ensure(*s, "kfa::nn::TransformerBlock::norm_statistics", tokens);
    const in2 x2 = Impl::in_matrix(x);

    m_parts.norm_forward(space, x2, w.norm1_weight, w.norm1_bias, Impl::out_matrix(c.h1), c.mean1,
                         c.rstd1);
    c.attention.training = c.training;
    c.attention.dropout_seed = Impl::nn_site_seed(c.dropout_seed, Impl::kSiteAttentionWeights);
    m_attention.forward_impl(space, c.h1, Impl::out_matrix(c.a), c.attention, score_mod);
    residual_dropout(space, "residual1", x2, Impl::in_matrix(c.a), c.x1, c,
                     Impl::kSiteAttentionOutput);
    m_parts.norm_forward(space, c.x1, w.norm2_weight, w.norm2_bias, c.h2, c.mean2, c.rstd2);
    m_parts.mlp_forward(space, c.h2, w.w1, w.b1, w.w2, w.b2, c.u, c.g, c.x1, y, c.training,
                        c.dropout_seed, c.attention.slice, scratch(c));
    if (m_options.recompute && !keep) release(c);
  }

  /// The products' fp32 workspace, shared with the attention's (one stream).
  static Impl::NnScratch<ExecSpace, T>& scratch(context_type& c) { return c.attention.scratch; }

  /// The backward into grads() or grads_fp32().
  template <class ScoreMod>
  void backward_impl(const ExecSpace& space, const in2& dy, const out2& dx, context_type& c,
                     const ScoreMod& score_mod) {
    if constexpr (Impl::nn_is_16bit<T>()) {
      if (m_options.fp32_gradients) {
        backward_into(space, dy, dx, c, score_mod, m_grads_fp32);
        return;
      }
    }
    backward_into(space, dy, dx, c, score_mod, m_grads);
  }

  template <class ScoreMod, class Grads>
  void backward_into(const ExecSpace& space, const in2& dy, const out2& dx, context_type& c,
                     const ScoreMod& score_mod, const Grads& g) {
    using G = typename Grads::value_type;
    const auto& w = m_weights;
    const int batch = int(c.x.extent(0)), seqlen = int(c.x.extent(1)), tokens = batch * seqlen;
    const int d = d_model();
    if (m_options.recompute) {
      // The forward again (same seeds, same kernels: bitwise the same
      // tensors); its y goes to dm, which the backward overwrites first.
      Impl::nn_ensure(c.dm, "kfa::nn::TransformerBlock::dm", tokens, d);
      forward_impl(space, c.x, c.dm, c, score_mod, true);
    }
    Impl::nn_ensure(c.dm, "kfa::nn::TransformerBlock::dm", tokens, d);
    Impl::nn_ensure(c.dg, "kfa::nn::TransformerBlock::dg", tokens, m_options.d_ff);
    Impl::nn_ensure(c.du, "kfa::nn::TransformerBlock::du", tokens, m_parts.mlp_rows());
    Impl::nn_ensure(c.dh2, "kfa::nn::TransformerBlock::dh2", tokens, d);
    Impl::nn_ensure(c.dx1, "kfa::nn::TransformerBlock::dx1", tokens, d);
    Impl::nn_ensure(c.da, "kfa::nn::TransformerBlock::da", batch, seqlen, d);
    Impl::nn_ensure(c.dh1, "kfa::nn::TransformerBlock::dh1", batch, seqlen, d);

    // MLP branch: y = x1 + dropout(mlp(h2)).
    m_parts.template mlp_backward<G>(space, c.h2, w.w1, w.w2, c.u, c.g, dy, c.dm, c.dg, c.du,
                                     c.dh2, g.w1, g.b1, g.w2, g.b2, c.training, c.dropout_seed,
                                     c.attention.slice, scratch(c));
    // dx1 = dy (residual) + norm2's backward.
    Kokkos::deep_copy(space, c.dx1, dy);
    m_parts.template norm_backward<G>(space, c.x1, w.norm2_weight, c.mean2, c.rstd2, c.dh2, c.dx1,
                                      g.norm2_weight, g.norm2_bias);
    // Attention branch: x1 = x + dropout(a), a = attention(h1).
    residual_dropout(space, "residual1_backward", {}, c.dx1, Impl::out_matrix(c.da), c,
                     Impl::kSiteAttentionOutput);
    m_attention.backward_impl(space, Impl::in_matrix(c.da), Impl::out_matrix(c.dh1), c.attention,
                              score_mod);
    Kokkos::deep_copy(space, dx, in2(c.dx1));
    m_parts.template norm_backward<G>(space, Impl::in_matrix(c.x), w.norm1_weight, c.mean1,
                                      c.rstd1, Impl::in_matrix(c.dh1), dx, g.norm1_weight,
                                      g.norm1_bias);
    if (m_options.recompute) release(c);
  }

  TransformerBlockOptions m_options;
  Parts m_parts;
  MultiHeadAttention<ExecSpace, T> m_attention;
  Weights m_weights, m_grads;
  Fp32Grads m_grads_fp32;
};

}  // namespace nn
}  // namespace kfa

#endif
