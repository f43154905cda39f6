#ifndef KFA_NN_TRANSFORMER_DECODER_BLOCK_HPP
#define KFA_NN_TRANSFORMER_DECODER_BLOCK_HPP

#include <kfa/nn/multi_head_attention.hpp>
#include <kfa/nn/options.hpp>

#include <kfa/detail/nn/block_parts.hpp>

namespace kfa {
namespace nn {

/// What TransformerDecoderBlock::forward saves for its backward, and the
/// workspaces; the caller owns it (see MultiHeadAttentionContext).
template <class ExecSpace, class T>
struct TransformerDecoderBlockContext {
  using memory_space = typename ExecSpace::memory_space;
  using view1_acc = Kokkos::View<accumulator_t<T>*, Kokkos::LayoutRight, memory_space>;
  using view2 = Kokkos::View<T**, Kokkos::LayoutRight, memory_space>;
  using view3 = Kokkos::View<T***, Kokkos::LayoutRight, memory_space>;

  /// Seed of every dropout in the block for this call (each site derives its
  /// own); set it before the forward, e.g. to the training step.
  std::uint64_t dropout_seed = 0;
  /// false: no dropout (inference).
  bool training = true;

  /// The sublayers' contexts; cross_attention keeps the reference to the
  /// memory.
  MultiHeadAttentionContext<ExecSpace, T> self_attention, cross_attention;
  // Saved by the forward: the input (a reference), norm1(x), x1 = x +
  // dropout(self-attention), norm2(x1), x2 = x1 + dropout(cross-attention),
  // norm3(x2), the MLP's first projection u and its activation after dropout
  // g, the norms' statistics; a holds each attention's output in turn.
  Kokkos::View<const T***, Kokkos::LayoutRight, memory_space> x;
  view3 h1, h2, a;
  view2 x1, x2, h3, u, g;
  view1_acc mean1, rstd1, mean2, rstd2, mean3, rstd3;
  // Backward workspaces: the MLP's, the residual stream's gradient, the
  // attention outputs' and the norm inputs' (each reused by the sublayers
  // in turn).
  view2 dm, dg, du, dres, da, dh;

  /// Bytes of the Views the context owns, the attentions' included (not the
  /// caller's x and memory): the block's memory between a forward and its
  /// backward.
  std::size_t saved_bytes() const {
    const view3* tensors[] = {&h1, &h2, &a};
    const view2* matrices[] = {&x1, &x2, &h3, &u, &g, &dm, &dg, &du, &dres, &da, &dh};
    const view1_acc* statistics[] = {&mean1, &rstd1, &mean2, &rstd2, &mean3, &rstd3};
    std::size_t bytes = self_attention.saved_bytes() + cross_attention.saved_bytes();
    for (const view3* t : tensors) bytes += t->span() * sizeof(T);
    for (const view2* m : matrices) bytes += m->span() * sizeof(T);
    for (const view1_acc* s : statistics) bytes += s->span() * sizeof(accumulator_t<T>);
    return bytes;
  }
};

/// A pre-norm transformer decoder block (torch.nn.TransformerDecoderLayer
/// with norm_first=True and batch_first=True) on a target x and the
/// encoder's output, the memory:
///   x1 = x  + dropout(self_attention(norm1(x)))            (causal by default)
///   x2 = x1 + dropout(cross_attention(norm2(x1), memory))
///   y  = x2 + dropout(W2·dropout(act(W1·norm3(x2) + b1)) + b2)
/// with LayerNorm or RMSNorm and GELU or SwiGLU as in TransformerBlock.
/// Parameters and gradients are Views held by the block (weights(),
/// grads(), self_attention(), cross_attention()); backward accumulates the
/// gradients (zero_grad resets them). Value types double, float, kfa::half
/// and kfa::bfloat16 (see MultiHeadAttention; with options.fp32_gradients
/// the gradients are grads_fp32()).
///
/// Not in the sequence-parallel mode, nor on packed batches (cross-attention
/// runs on neither); ALiBi comes from the attentions' options, other score
/// modifiers are not taken.
template <class ExecSpace, class T>
class TransformerDecoderBlock {
 public:
  using execution_space = ExecSpace;
  using memory_space = typename ExecSpace::memory_space;
  using view1 = Kokkos::View<T*, Kokkos::LayoutRight, memory_space>;
  using view2 = Kokkos::View<T**, Kokkos::LayoutRight, memory_space>;
  using context_type = TransformerDecoderBlockContext<ExecSpace, T>;

  /// The block's own parameters (the attentions' are in self_attention()
  /// and cross_attention()): norm weights and biases [d_model] (biases
  /// empty for RMSNorm or without options.bias), w1 [d_ff or 2·d_ff
  /// (SwiGLU: gate rows then up rows)][d_model], b1, w2 [d_model][d_ff], b2.
  template <class V>
  struct Tensors {
    using value_type = V;
    Kokkos::View<V*, Kokkos::LayoutRight, memory_space> norm1_weight, norm1_bias, norm2_weight,
        norm2_bias, norm3_weight, norm3_bias;
    Kokkos::View<V**, Kokkos::LayoutRight, memory_space> w1, w2;
    Kokkos::View<V*, Kokkos::LayoutRight, memory_space> b1, b2;
  };
  using Weights = Tensors<T>;
  /// The gradients in fp32 (options.fp32_gradients of a 16-bit T).
  using Fp32Grads = Tensors<accumulator_t<T>>;

  /// Allocates the parameters: linear weights U(-1/sqrt(fan_in),
  /// 1/sqrt(fan_in)) (the MLP's from options.init_seed, each attention's
  /// from its options' init_seed, the cross-attention's mixed so that equal
  /// seeds do not give the two attentions equal weights), biases zero, norm
  /// weights one; zero gradients. Throws std::invalid_argument on
  /// inconsistent options.
  explicit TransformerDecoderBlock(const TransformerDecoderBlockOptions& options)
      : m_options(resolve(options)),
        m_parts("kfa::nn::TransformerDecoderBlock", m_options.norm, m_options.norm_options,
                m_options.activation, m_options.d_ff, m_options.bias, m_options.dropout_p),
        m_self(m_options.self_attention),
        m_cross(cross_init(m_options.cross_attention)) {
    allocate(m_weights, "");
    if (m_options.fp32_gradients && Impl::nn_is_16bit<T>())
      allocate(m_grads_fp32, "grad_fp32_");
    else
      allocate(m_grads, "grad_");
    const view1 norms[] = {m_weights.norm1_weight, m_weights.norm2_weight, m_weights.norm3_weight};
    for (const view1& n : norms) Kokkos::deep_copy(n, Impl::from_acc<T>(1.0f));
    std::mt19937_64 rng(m_options.init_seed + 1);
    Impl::nn_init_uniform(m_weights.w1, 1.0 / std::sqrt(double(d_model())), rng);
    Impl::nn_init_uniform(m_weights.w2, 1.0 / std::sqrt(double(m_options.d_ff)), rng);
  }

  /// The options with the attentions' options resolved.
  const TransformerDecoderBlockOptions& options() const { return m_options; }
  MultiHeadAttention<ExecSpace, T>& self_attention() { return m_self; }
  const MultiHeadAttention<ExecSpace, T>& self_attention() const { return m_self; }
  MultiHeadAttention<ExecSpace, T>& cross_attention() { return m_cross; }
  const MultiHeadAttention<ExecSpace, T>& cross_attention() const { return m_cross; }
  Weights& weights() { return m_weights; }
  const Weights& weights() const { return m_weights; }
  /// The gradients of T (empty Views under options.fp32_gradients).
  Weights& grads() { return m_grads; }
  const Weights& grads() const { return m_grads; }
  /// The fp32 gradients under options.fp32_gradients with a 16-bit T (else
  /// empty Views).
  Fp32Grads& grads_fp32() { return m_grads_fp32; }
  const Fp32Grads& grads_fp32() const { return m_grads_fp32; }

  /// Every parameter with torch.nn.TransformerDecoderLayer's name
  /// (self_attn.in_proj_weight, ..., multihead_attn.in_proj_weight, ...,
  /// linear1.weight, linear1.bias, linear2.weight, linear2.bias,
  /// norm1.weight, norm1.bias, norm2.*, norm3.*), each prefixed by `prefix`.
  std::vector<Parameter<T, memory_space>> parameters(const std::string& prefix = "") const {
    auto list = m_self.parameters(prefix + "self_attn.");
    const auto cross = m_cross.parameters(prefix + "multihead_attn.");
    list.insert(list.end(), cross.begin(), cross.end());
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
    Impl::nn_add_parameter(list, prefix + "norm3.weight", w.norm3_weight, g.norm3_weight,
                           g32.norm3_weight);
    Impl::nn_add_parameter(list, prefix + "norm3.bias", w.norm3_bias, g.norm3_bias,
                           g32.norm3_bias);
    return list;
  }

  /// Sets every parameter gradient (the attentions' too) to zero.
  void zero_grad(const ExecSpace& space) { Impl::nn_zero_grad(space, parameters()); }

  /// y = block(x, memory); saves what the backward needs in `context`, with
  /// references to x and memory (do not change them before the backward).
  /// x, y [batch][seqlen][d_model], memory [batch][seqlen_kv][d_model_kv]
  /// (any seqlen_kv): contiguous LayoutRight Views of T accessible from
  /// ExecSpace; y must overlap neither x nor memory. Enqueued on `space`.
  /// Throws std::invalid_argument (nothing written) on bad shapes.
  template <class X, class M, class Y>
  void forward(const ExecSpace& space, const X& x, const M& memory, const Y& y,
               context_type& context) const {
    const char* function = "kfa::nn::TransformerDecoderBlock::forward";
    Impl::ProfilingRegion region(function);
    m_cross.check_cross_forward(function, x, memory, y);
    if constexpr (Attention::template pair_ok<X, Y>() && Attention::template pair_ok<M, Y>()) {
      Attention::unpack(context.self_attention);
      Attention::unpack(context.cross_attention);
      forward_impl(space, x, memory, Impl::out_matrix(y), context);
    }
  }

  /// Backward of the forward that filled `context`: dx and dmemory
  /// overwritten, every parameter gradient accumulated. dy, dx like that
  /// forward's x, dmemory like its memory; dx, dmemory and dy must not
  /// overlap.
  template <class DY, class DX, class DM>
  void backward(const ExecSpace& space, const DY& dy, const DX& dx, const DM& dmemory,
                context_type& context) {
    const char* function = "kfa::nn::TransformerDecoderBlock::backward";
    Impl::ProfilingRegion region(function);
    m_cross.check_cross_backward(function, dy, dx, dmemory, context.cross_attention);
    if constexpr (Attention::template pair_ok<DY, DX>() && Attention::template pair_ok<DM, DY>()) {
      const in2 dy2 = Impl::in_matrix(dy);
      const out2 dx2 = Impl::out_matrix(dx), dm2 = Impl::out_matrix(dmemory);
      if constexpr (Impl::nn_is_16bit<T>()) {
        if (m_options.fp32_gradients) {
          backward_into(space, dy2, dx2, dm2, context, m_grads_fp32);
          return;
        }
      }
      backward_into(space, dy2, dx2, dm2, context, m_grads);
    }
  }

 private:
  using Attention = MultiHeadAttention<ExecSpace, T>;
  using Parts = Impl::NnBlockParts<ExecSpace, T>;
  using in2 = Impl::NnIn2<T, memory_space>;
  using out2 = Impl::NnOut2<T, memory_space>;
  using const_view3 = Kokkos::View<const T***, Kokkos::LayoutRight, memory_space>;

  int d_model() const { return m_options.self_attention.d_model; }

  static TransformerDecoderBlockOptions resolve(TransformerDecoderBlockOptions o) {
    const char* function = "kfa::nn::TransformerDecoderBlock";
    Parts::check_options(function, o.d_ff, o.norm_options, o.dropout_p);
    auto& self = o.self_attention;
    auto& cross = o.cross_attention;
    if (self.d_model_kv != 0 && self.d_model_kv != self.d_model) {
      Impl::throw_invalid(function, "options.self_attention.d_model_kv must be 0 or d_model, got " +
                                        std::to_string(self.d_model_kv));
    }
    if (cross.d_model == 0) cross.d_model = self.d_model;
    if (cross.heads == 0) cross.heads = self.heads;
    if (cross.d_model != self.d_model) {
      Impl::throw_invalid(function, "options.cross_attention.d_model must be 0 or "
                                    "options.self_attention.d_model (" +
                                        std::to_string(self.d_model) + "), got " +
                                        std::to_string(cross.d_model));
    }
    if (self.sequence_parallel.comm != nullptr || cross.sequence_parallel.comm != nullptr) {
      Impl::throw_invalid(function, "the decoder block does not run in the sequence-parallel "
                                    "mode (its cross-attention does not run as ring attention)");
    }
    MultiHeadAttentionOptions* both[] = {&self, &cross};
    for (MultiHeadAttentionOptions* a : both) {
      a->bias = o.bias;
      a->fp32_gradients = o.fp32_gradients;
      // The block recomputes as a whole; its attentions then never on their own.
      o.recompute = o.recompute || a->recompute;
      a->recompute = false;
    }
    self.attention.causal = self.attention.causal || o.causal;
    self = Attention::resolve(self);
    cross = Attention::resolve(cross);
    return o;
  }

  /// The cross-attention's options with its weight seed mixed (default
  /// seeds would otherwise give both attentions the same q projection).
  static MultiHeadAttentionOptions cross_init(MultiHeadAttentionOptions o) {
    o.init_seed = Impl::nn_site_seed(o.init_seed, Impl::kSiteCrossAttentionWeights);
    return o;
  }

  template <class V>
  void allocate(Tensors<V>& w, const std::string& prefix) const {
    m_parts.allocate_norm(w.norm1_weight, w.norm1_bias, prefix + "norm1", d_model());
    m_parts.allocate_norm(w.norm2_weight, w.norm2_bias, prefix + "norm2", d_model());
    m_parts.allocate_norm(w.norm3_weight, w.norm3_bias, prefix + "norm3", d_model());
    m_parts.allocate_mlp(w.w1, w.b1, w.w2, w.b2, prefix, d_model());
  }

  /// y = residual + dropout(x) with the mask of `site` (Impl::NnBlockSite).
  void residual_dropout(const ExecSpace& space, const char* step, const in2& residual,
                        const in2& x, const out2& y, const context_type& c, int site) const {
    m_parts.residual_dropout(space, step, residual, x, y,
                             m_parts.dropout(c.training, c.dropout_seed, site),
                             c.self_attention.slice);
  }

  /// The products' fp32 workspace, shared with the self-attention's (one
  /// stream).
  static Impl::NnScratch<ExecSpace, T>& scratch(context_type& c) {
    return c.self_attention.scratch;
  }

  /// Frees every View the context owns (the recompute mode).
  static void release(context_type& c) {
    typename context_type::view3* tensors[] = {&c.h1, &c.h2, &c.a};
    typename context_type::view2* matrices[] = {&c.x1, &c.x2, &c.h3,   &c.u,  &c.g, &c.dm,
                                                &c.dg, &c.du, &c.dres, &c.da, &c.dh};
    typename context_type::view1_acc* statistics[] = {&c.mean1, &c.rstd1, &c.mean2,
                                                      &c.rstd2, &c.mean3, &c.rstd3};
    for (auto* t : tensors) *t = typename context_type::view3();
    for (auto* m : matrices) *m = typename context_type::view2();
    for (auto* s : statistics) *s = typename context_type::view1_acc();
    Attention::release(c.self_attention);
    Attention::release(c.cross_attention);
    // The attentions' inputs were h1 and h2: keep only their shape (the
    // backward's checks read it), through the caller's x, which has the same.
    c.self_attention.x = c.x;
    c.cross_attention.x = c.x;
  }

  /// a = self-attention(h1), with the layer's own modifier (ALiBi or none).
  void self_attention_forward(const ExecSpace& space, context_type& c) const {
    c.self_attention.training = c.training;
    c.self_attention.dropout_seed =
        Impl::nn_site_seed(c.dropout_seed, Impl::kSiteAttentionWeights);
    m_self.with_own_modifier([&](const auto& mod) {
      m_self.forward_impl(space, c.h1, Impl::out_matrix(c.a), c.self_attention, mod);
    });
  }

  /// a = cross-attention(h2, memory).
  void cross_attention_forward(const ExecSpace& space, const const_view3& memory,
                               context_type& c) const {
    c.cross_attention.training = c.training;
    c.cross_attention.dropout_seed =
        Impl::nn_site_seed(c.dropout_seed, Impl::kSiteCrossAttentionWeights);
    m_cross.with_own_modifier([&](const auto& mod) {
      m_cross.attend_forward(space, c.h2, memory, Impl::out_matrix(c.a), c.cross_attention, true,
                             mod);
    });
  }

  /// y = block(x, memory); in the recompute mode everything but the
  /// references to x and memory is freed after (unless `keep`: the
  /// backward's recomputation).
  void forward_impl(const ExecSpace& space, const const_view3& x, const const_view3& memory,
                    const out2& y, context_type& c, bool keep = false) const {
    const auto& w = m_weights;
    const int batch = int(x.extent(0)), seqlen = int(x.extent(1)), tokens = batch * seqlen;
    const int d = d_model();
    c.x = x;
    Impl::nn_ensure(c.h1, "kfa::nn::TransformerDecoderBlock::h1", batch, seqlen, d);
    Impl::nn_ensure(c.h2, "kfa::nn::TransformerDecoderBlock::h2", batch, seqlen, d);
    Impl::nn_ensure(c.a, "kfa::nn::TransformerDecoderBlock::a", batch, seqlen, d);
    Impl::nn_ensure(c.x1, "kfa::nn::TransformerDecoderBlock::x1", tokens, d);
    Impl::nn_ensure(c.x2, "kfa::nn::TransformerDecoderBlock::x2", tokens, d);
    Impl::nn_ensure(c.h3, "kfa::nn::TransformerDecoderBlock::h3", tokens, d);
    Impl::nn_ensure(c.u, "kfa::nn::TransformerDecoderBlock::u", tokens, m_parts.mlp_rows());
    Impl::nn_ensure(c.g, "kfa::nn::TransformerDecoderBlock::g", tokens, m_options.d_ff);
    typename context_type::view1_acc* statistics[] = {&c.mean1, &c.rstd1, &c.mean2,
                                                      &c.rstd2, &c.mean3, &c.rstd3};
    for (auto* s : statistics)
      Impl::nn_ensure(*s, "kfa::nn::TransformerDecoderBlock::norm_statistics", tokens);
    const in2 x2 = Impl::in_matrix(x), a2 = Impl::in_matrix(c.a);

    m_parts.norm_forward(space, x2, w.norm1_weight, w.norm1_bias, Impl::out_matrix(c.h1), c.mean1,
                         c.rstd1);
    self_attention_forward(space, c);
    residual_dropout(space, "residual1", x2, a2, c.x1, c, Impl::kSiteAttentionOutput);
    m_parts.norm_forward(space, c.x1, w.norm2_weight, w.norm2_bias, Impl::out_matrix(c.h2),
                         c.mean2, c.rstd2);
    cross_attention_forward(space, memory, c);
    residual_dropout(space, "residual2", c.x1, a2, c.x2, c, Impl::kSiteCrossAttentionOutput);
    m_parts.norm_forward(space, c.x2, w.norm3_weight, w.norm3_bias, c.h3, c.mean3, c.rstd3);
    m_parts.mlp_forward(space, c.h3, w.w1, w.b1, w.w2, w.b2, c.u, c.g, c.x2, y, c.training,
                        c.dropout_seed, c.self_attention.slice, scratch(c));
    if (m_options.recompute && !keep) release(c);
  }

  /// The backward into grads() or grads_fp32() (and the attentions' own).
  template <class Grads>
  void backward_into(const ExecSpace& space, const in2& dy, const out2& dx, const out2& dmemory,
                     context_type& c, const Grads& g) {
    using G = typename Grads::value_type;
    const auto& w = m_weights;
    const int tokens = int(c.x.extent(0) * c.x.extent(1)), d = d_model();
    if (m_options.recompute) {
      // The forward again (same seeds, same kernels: bitwise the same
      // tensors); its y goes to dm, which the backward overwrites first.
      Impl::nn_ensure(c.dm, "kfa::nn::TransformerDecoderBlock::dm", tokens, d);
      forward_impl(space, c.x, c.cross_attention.memory, c.dm, c, true);
    }
    Impl::nn_ensure(c.dm, "kfa::nn::TransformerDecoderBlock::dm", tokens, d);
    Impl::nn_ensure(c.dg, "kfa::nn::TransformerDecoderBlock::dg", tokens, m_options.d_ff);
    Impl::nn_ensure(c.du, "kfa::nn::TransformerDecoderBlock::du", tokens, m_parts.mlp_rows());
    Impl::nn_ensure(c.dres, "kfa::nn::TransformerDecoderBlock::dres", tokens, d);
    Impl::nn_ensure(c.da, "kfa::nn::TransformerDecoderBlock::da", tokens, d);
    Impl::nn_ensure(c.dh, "kfa::nn::TransformerDecoderBlock::dh", tokens, d);

    // MLP: y = x2 + dropout(mlp(h3)); then dx2 = dy + norm3's backward.
    m_parts.template mlp_backward<G>(space, c.h3, w.w1, w.w2, c.u, c.g, dy, c.dm, c.dg, c.du,
                                     c.dh, g.w1, g.b1, g.w2, g.b2, c.training, c.dropout_seed,
                                     c.self_attention.slice, scratch(c));
    Kokkos::deep_copy(space, c.dres, dy);
    m_parts.template norm_backward<G>(space, c.x2, w.norm3_weight, c.mean3, c.rstd3, c.dh, c.dres,
                                      g.norm3_weight, g.norm3_bias);
    // Cross-attention: x2 = x1 + dropout(cross(h2, memory)); dmemory is
    // written, dx1 = dx2 + norm2's backward.
    residual_dropout(space, "residual2_backward", {}, c.dres, c.da, c,
                     Impl::kSiteCrossAttentionOutput);
    m_cross.with_own_modifier([&](const auto& mod) {
      m_cross.attend_backward(space, c.da, c.dh, dmemory, c.cross_attention, mod);
    });
    m_parts.template norm_backward<G>(space, c.x1, w.norm2_weight, c.mean2, c.rstd2, c.dh, c.dres,
                                      g.norm2_weight, g.norm2_bias);
    // Self-attention: x1 = x + dropout(self(h1)); dx = dx1 + norm1's backward.
    residual_dropout(space, "residual1_backward", {}, c.dres, c.da, c,
                     Impl::kSiteAttentionOutput);
    m_self.with_own_modifier([&](const auto& mod) {
      m_self.backward_impl(space, c.da, c.dh, c.self_attention, mod);
    });
    Kokkos::deep_copy(space, dx, in2(c.dres));
    m_parts.template norm_backward<G>(space, Impl::in_matrix(c.x), w.norm1_weight, c.mean1,
                                      c.rstd1, c.dh, dx, g.norm1_weight, g.norm1_bias);
    if (m_options.recompute) release(c);
  }

  TransformerDecoderBlockOptions m_options;
  Parts m_parts;
  MultiHeadAttention<ExecSpace, T> m_self, m_cross;
  Weights m_weights, m_grads;
  Fp32Grads m_grads_fp32;
};

}  // namespace nn
}  // namespace kfa

#endif
