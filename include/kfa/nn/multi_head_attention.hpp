#ifndef KFA_NN_MULTI_HEAD_ATTENTION_HPP
#define KFA_NN_MULTI_HEAD_ATTENTION_HPP

#include <kfa/flash_attention.hpp>
#include <kfa/nn/grid.hpp>
#include <kfa/nn/options.hpp>
#include <kfa/nn/parameter.hpp>
#include <kfa/nn/score_mods.hpp>

#include <kfa/detail/nn/axial_rotary_kernels.hpp>
#include <kfa/detail/nn/checks.hpp>
#include <kfa/detail/nn/layer_support.hpp>
#include <kfa/detail/nn/linear_impl.hpp>
#include <kfa/detail/nn/norm_kernels.hpp>
#include <kfa/detail/nn/rotary_kernels.hpp>
#include <kfa/detail/nn/sequence_parallel.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace kfa {
namespace nn {

template <class ExecSpace, class T>
class TransformerBlock;
template <class ExecSpace, class T>
class TransformerDecoderBlock;

/// What MultiHeadAttention::forward saves for its backward, and the
/// workspaces of both; the caller owns it and passes the same context to the
/// backward of the forward it belongs to. Reused across calls (buffers are
/// reallocated only when the shape changes).
template <class ExecSpace, class T>
struct MultiHeadAttentionContext {
  using memory_space = typename ExecSpace::memory_space;
  using view2 = Kokkos::View<T**, Kokkos::LayoutRight, memory_space>;
  using view4 = Kokkos::View<T****, Kokkos::LayoutRight, memory_space>;
  using lse_view = Kokkos::View<accumulator_t<T>***, Kokkos::LayoutRight, memory_space>;
  using view1_acc = Kokkos::View<accumulator_t<T>*, Kokkos::LayoutRight, memory_space>;
  using const_view3 = Kokkos::View<const T***, Kokkos::LayoutRight, memory_space>;
  using scratch_type = Impl::NnScratch<ExecSpace, T>;

  /// Seed of the attention-weight dropout (attention.dropout_p), set by the
  /// caller before the forward; the backward regenerates the same mask.
  std::uint64_t dropout_seed = 0;
  /// false: no dropout (inference).
  bool training = true;

  /// Bytes of the Views the context owns (what the forward saved, the
  /// workspaces, the packed positions; not the caller's x and memory): the
  /// layer's memory between a forward and its backward.
  std::size_t saved_bytes() const {
    using acc_t = accumulator_t<T>;
    const view4* tensors[] = {&q, &k, &v, &o, &q_pre, &k_pre, &d_o, &dq, &dk, &dv, &dq_pre, &dk_pre};
    const view2* matrices[] = {&qkv, &dqkv, &kv, &dkv};
    std::size_t bytes = (lse.span() + rstd_q.span() + rstd_k.span()) * sizeof(acc_t) +
                        (positions.span() + positions_kv.span()) * sizeof(int);
    for (const view4* t : tensors) bytes += t->span() * sizeof(T);
    for (const view2* m : matrices) bytes += m->span() * sizeof(T);
    return bytes + scratch.bytes();
  }

  // Saved by the forward: the input (a reference: the caller must not change
  // it before the backward) and for cross-attention the memory (a reference
  // too), q and k after the rotary embedding, v, the attention output and its
  // log-sum-exp, and the options of the call.
  const_view3 x, memory;
  bool cross = false;
  // Set by a forward (the recompute mode frees every tensor but x, memory).
  bool has_forward = false;
  view4 q, k, v, o;
  lse_view lse;
  // With qk_norm: q and k before the norm, and the norm's 1/rms per
  // (token, head).
  view4 q_pre, k_pre;
  view1_acc rstd_q, rstd_k;
  AttentionOptions attention;
  // Where x's tokens sit in the global sequence (sequence-parallel mode),
  // and the keys' positions (the memory's own for cross-attention).
  Impl::NnSequenceSlice slice, slice_kv;
  // Packed batches: x is [1][total_tokens][d_model], the sequences' offsets
  // (the caller's View), their longest length, each token's position.
  bool packed = false;
  Kokkos::View<const int*, memory_space> cu_seqlens;
  int max_seqlen = 0;
  Kokkos::View<int*, memory_space> positions;
  // Packed cross-attention: the memory [1][total_tokens_kv][d_model_kv], its
  // offsets, longest length and each memory token's position (empty for
  // self-attention, whose keys are x's tokens).
  Kokkos::View<const int*, memory_space> cu_seqlens_kv;
  int max_seqlen_kv = 0;
  Kokkos::View<int*, memory_space> positions_kv;
  // Workspaces: the fused q|k|v (or, for cross-attention, k|v) projection,
  // the backward's gradients.
  view2 qkv, dqkv, kv, dkv;
  view4 d_o, dq, dk, dv, dq_pre, dk_pre;
  // The fp32 products of a 16-bit T (unused for double and float).
  scratch_type scratch;
};

/// Multi-head attention (torch.nn.MultiheadAttention with batch_first, or a
/// Llama attention with separate projections): y = out_proj(attention(
/// rotary(norm_q(x·W_qᵀ + b_q)), rotary(norm_k(m·W_kᵀ + b_k)), m·W_vᵀ + b_v)),
/// m = x (self-attention) or a second input, the memory (cross-attention),
/// the norms per head only with options.qk_norm, the rotary embeddings
/// 1D (options.rotary) or axial over a grid (options.axial_rotary), the attention
/// through kfa::flash_attention_forward/backward with the options'
/// AttentionOptions. Grouped-query heads when kv_heads < heads.
///
/// Sequence-parallel mode (options.sequence_parallel.comm): x holds this
/// rank's contiguous run of tokens of every sequence, attention runs as
/// kfa::ring_attention_forward/backward over the ranks, rotary embeddings
/// and causal masks use global positions, and forward and backward are
/// collective over the communicator. Parameter gradients are then this
/// rank's part of the sum over all tokens: add them up over the ranks with
/// kfa::nn::allreduce_gradients (GradientReduction::sum).
///
/// Parameters and their gradients are Views held by the layer (weights(),
/// grads()); backward accumulates into the gradients (zero_grad resets them).
///
/// Value types double, float, kfa::half and kfa::bfloat16. The 16-bit types
/// store parameters and activations in T and compute in fp32: products
/// accumulate in fp32 and are rounded once, norms, rotations and softmax run
/// in float, the attention is kfa's 16-bit flash attention. Parameter
/// gradients are T, or with options.fp32_gradients fp32 Views (grads_fp32()),
/// which kfa::nn::AdamW steps from (into fp32 master copies of the
/// parameters with AdamWOptions::fp32_master_weights).
template <class ExecSpace, class T>
class MultiHeadAttention {
 public:
  using execution_space = ExecSpace;
  using memory_space = typename ExecSpace::memory_space;
  using view1 = Kokkos::View<T*, Kokkos::LayoutRight, memory_space>;
  using view2 = Kokkos::View<T**, Kokkos::LayoutRight, memory_space>;
  using context_type = MultiHeadAttentionContext<ExecSpace, T>;
  static_assert(Impl::nn_value_type_ok<T>(),
                "kfa::nn::MultiHeadAttention: T must be double, float, kfa::half or "
                "kfa::bfloat16");

  /// The parameters (or their gradients). With fused_qkv, w_qkv
  /// [(heads + 2·kv_heads)·head_dim][d_model] holds q, k, v rows in that
  /// order (PyTorch's in_proj_weight) and w_q, w_k, w_v are empty; otherwise
  /// w_q [heads·head_dim][d_model], w_k, w_v [kv_heads·head_dim][d_model_kv].
  /// w_o [d_model][heads·head_dim]. Biases like their weights' rows; empty
  /// without options.bias. q_norm, k_norm [head_dim]: the qk-norm weights
  /// (empty without options.qk_norm).
  template <class V>
  struct Tensors {
    using value_type = V;
    Kokkos::View<V**, Kokkos::LayoutRight, memory_space> w_qkv, w_q, w_k, w_v, w_o;
    Kokkos::View<V*, Kokkos::LayoutRight, memory_space> b_qkv, b_q, b_k, b_v, b_o;
    Kokkos::View<V*, Kokkos::LayoutRight, memory_space> q_norm, k_norm;
  };
  using Weights = Tensors<T>;
  /// The gradients in fp32 (options.fp32_gradients of a 16-bit T).
  using Fp32Grads = Tensors<accumulator_t<T>>;

  /// Allocates the parameters: weights U(-1/sqrt(fan_in), 1/sqrt(fan_in))
  /// from options.init_seed (the same on every backend), biases zero, qk-norm
  /// weights one, and zero gradients. Throws std::invalid_argument on inconsistent options.
  explicit MultiHeadAttention(const MultiHeadAttentionOptions& options)
      : m_options(resolve(options)) {
    const auto& o = m_options;
    std::mt19937_64 rng(o.init_seed);
    const double bound_in = 1.0 / std::sqrt(double(o.d_model));
    const double bound_kv = 1.0 / std::sqrt(double(o.d_model_kv));
    const double bound_out = 1.0 / std::sqrt(double(o.heads * o.head_dim));
    allocate(m_weights, "");
    if (fp32_grads())
      allocate(m_grads_fp32, "grad_fp32_");
    else
      allocate(m_grads, "grad_");
    // Named arrays, not braced lists in the range-for: nvcc does not take the latter.
    const view2 projections[] = {m_weights.w_qkv, m_weights.w_q, m_weights.w_k, m_weights.w_v};
    const double bounds[] = {bound_in, bound_in, bound_kv, bound_kv};
    for (int n = 0; n < 4; ++n) Impl::nn_init_uniform(projections[n], bounds[n], rng);
    Impl::nn_init_uniform(m_weights.w_o, bound_out, rng);
    if (o.qk_norm) {
      Kokkos::deep_copy(m_weights.q_norm, Impl::from_acc<T>(1.0f));
      Kokkos::deep_copy(m_weights.k_norm, Impl::from_acc<T>(1.0f));
    }
    if (o.alibi) {
      const std::vector<double> slopes = alibi_slopes(o.heads);
      m_alibi_slopes = Kokkos::View<double*, memory_space>("kfa::nn::MultiHeadAttention::alibi_slopes",
                                                          o.heads);
      Kokkos::deep_copy(m_alibi_slopes,
                        Kokkos::View<const double*, Kokkos::HostSpace,
                                     Kokkos::MemoryTraits<Kokkos::Unmanaged>>(slopes.data(),
                                                                              slopes.size()));
    }
  }

  /// The options with kv_heads, head_dim and rotary_dim resolved.
  const MultiHeadAttentionOptions& options() const { return m_options; }
  Weights& weights() { return m_weights; }
  const Weights& weights() const { return m_weights; }
  /// The gradients of T (empty Views under options.fp32_gradients).
  Weights& grads() { return m_grads; }
  const Weights& grads() const { return m_grads; }
  /// The fp32 gradients under options.fp32_gradients with a 16-bit T (else
  /// empty Views).
  Fp32Grads& grads_fp32() { return m_grads_fp32; }
  const Fp32Grads& grads_fp32() const { return m_grads_fp32; }

  /// Every parameter with PyTorch's name (torch.nn.MultiheadAttention's
  /// in_proj_weight, in_proj_bias, out_proj.weight, out_proj.bias; with
  /// separate projections q_proj.weight, k_proj.weight, v_proj.weight and
  /// their biases; with qk_norm q_norm.weight and k_norm.weight, as Qwen3
  /// names them, PyTorch's layer having none), each prefixed by `prefix`.
  std::vector<Parameter<T, memory_space>> parameters(const std::string& prefix = "") const {
    std::vector<Parameter<T, memory_space>> list;
    const Weights &w = m_weights, &g = m_grads;
    const Fp32Grads& g32 = m_grads_fp32;
    Impl::nn_add_parameter(list, prefix + "in_proj_weight", w.w_qkv, g.w_qkv, g32.w_qkv);
    Impl::nn_add_parameter(list, prefix + "in_proj_bias", w.b_qkv, g.b_qkv, g32.b_qkv);
    Impl::nn_add_parameter(list, prefix + "q_proj.weight", w.w_q, g.w_q, g32.w_q);
    Impl::nn_add_parameter(list, prefix + "q_proj.bias", w.b_q, g.b_q, g32.b_q);
    Impl::nn_add_parameter(list, prefix + "k_proj.weight", w.w_k, g.w_k, g32.w_k);
    Impl::nn_add_parameter(list, prefix + "k_proj.bias", w.b_k, g.b_k, g32.b_k);
    Impl::nn_add_parameter(list, prefix + "v_proj.weight", w.w_v, g.w_v, g32.w_v);
    Impl::nn_add_parameter(list, prefix + "v_proj.bias", w.b_v, g.b_v, g32.b_v);
    Impl::nn_add_parameter(list, prefix + "out_proj.weight", w.w_o, g.w_o, g32.w_o);
    Impl::nn_add_parameter(list, prefix + "out_proj.bias", w.b_o, g.b_o, g32.b_o);
    Impl::nn_add_parameter(list, prefix + "q_norm.weight", w.q_norm, g.q_norm, g32.q_norm);
    Impl::nn_add_parameter(list, prefix + "k_norm.weight", w.k_norm, g.k_norm, g32.k_norm);
    return list;
  }

  /// Sets every parameter gradient to zero. Enqueued on `space`.
  void zero_grad(const ExecSpace& space) {
    Impl::nn_zero_grad(space, parameters());
  }

  /// y = attention block of x; saves what the backward needs in `context`.
  /// x, y [batch][seqlen][d_model]: contiguous LayoutRight Views of T
  /// accessible from ExecSpace; y must not overlap x. Enqueued on `space`
  /// (products on Kokkos Kernels before 4.0 fence it). Throws
  /// std::invalid_argument (nothing written) on bad shapes.
  template <class X, class Y>
  void forward(const ExecSpace& space, const X& x, const Y& y, context_type& context) const {
    const char* function = "kfa::nn::MultiHeadAttention::forward";
    Impl::ProfilingRegion region(function);
    check_self_forward(function, x, y);
    if constexpr (pair_ok<X, Y>()) {
      unpack(context);
      with_own_modifier(
          [&](const auto& mod) { forward_impl(space, x, Impl::out_matrix(y), context, mod); });
    }
  }

  /// Self-attention with a score modifier (see kfa/score_mod.hpp: a user
  /// functor, kfa::alibi(slopes), kfa::nn::pairwise_bias(view)), applied as
  /// the attention entry points apply it; pass the same modifier to the
  /// backward. Not with options.alibi, nor in the sequence-parallel mode.
  template <class X, class Y, class ScoreMod>
  void forward(const ExecSpace& space, const X& x, const Y& y, context_type& context,
               const ScoreMod& score_mod) const {
    const char* function = "kfa::nn::MultiHeadAttention::forward";
    Impl::ProfilingRegion region(function);
    check_self_forward(function, x, y);
    if constexpr (pair_ok<X, Y>()) {
      check_modifier(function, score_mod, x.extent(0), x.extent(1), x.extent(1));
      unpack(context);
      forward_impl(space, x, Impl::out_matrix(y), context, score_mod);
    }
  }

  /// Cross-attention: queries from x, keys and values from `memory`
  /// [batch][seqlen_kv][d_model_kv] (contiguous LayoutRight, like x; any
  /// seqlen_kv), y [batch][seqlen][d_model] like x; y must overlap neither.
  /// Causal masks and windows are aligned to the bottom-right corner (query
  /// i sees key j <= i + seqlen_kv - seqlen), as in kfa::AttentionOptions;
  /// rotary positions count from 0 in x and in the memory alike. The
  /// context keeps a reference to memory too. Not in the sequence-parallel
  /// mode. Throws std::invalid_argument (nothing written) on bad shapes.
  template <class X, class M, class Y>
  void forward(const ExecSpace& space, const X& x, const M& memory, const Y& y,
               context_type& context) const {
    const char* function = "kfa::nn::MultiHeadAttention::forward";
    Impl::ProfilingRegion region(function);
    check_cross_forward(function, x, memory, y);
    if constexpr (pair_ok<X, Y>() && pair_ok<M, Y>()) {
      unpack(context);
      with_own_modifier([&](const auto& mod) {
        attend_forward(space, x, memory, Impl::out_matrix(y), context, true, mod);
      });
    }
  }

  /// Cross-attention with a score modifier (i counts query rows, j memory
  /// rows).
  template <class X, class M, class Y, class ScoreMod>
  void forward(const ExecSpace& space, const X& x, const M& memory, const Y& y,
               context_type& context, const ScoreMod& score_mod) const {
    const char* function = "kfa::nn::MultiHeadAttention::forward";
    Impl::ProfilingRegion region(function);
    check_cross_forward(function, x, memory, y);
    if constexpr (pair_ok<X, Y>() && pair_ok<M, Y>()) {
      check_modifier(function, score_mod, x.extent(0), x.extent(1), memory.extent(1));
      unpack(context);
      attend_forward(space, x, memory, Impl::out_matrix(y), context, true, score_mod);
    }
  }

  /// A packed batch of variable-length sequences (the layout of
  /// kfa::flash_attention_varlen_forward): x, y [total_tokens][d_model]
  /// (contiguous LayoutRight); sequence b is rows [cu_seqlens[b],
  /// cu_seqlens[b + 1]) and attends only within itself. Causal masks,
  /// windows, rotary positions and score-modifier positions restart at each
  /// sequence. cu_seqlens [batch + 1] of int in the layer's memory space
  /// (referenced by the context until the backward); max_seqlen bounds the
  /// lengths. The backward takes dy, dx [total_tokens][d_model]. Checking
  /// the offsets reads them on the host: this fences. Not in the
  /// sequence-parallel mode.
  template <class X, class Cu, class Y>
  void forward(const ExecSpace& space, const X& x, const Cu& cu_seqlens, int max_seqlen,
               const Y& y, context_type& context) const {
    const char* function = "kfa::nn::MultiHeadAttention::forward";
    Impl::ProfilingRegion region(function);
    check_packed_forward(function, x, cu_seqlens, max_seqlen, y, context);
    if constexpr (packed_pair_ok<X, Y>()) {
      with_own_modifier([&](const auto& mod) {
        forward_impl(space, packed_tokens(x), Impl::out_matrix(y), context, mod);
      });
    }
  }

  /// A packed batch with a score modifier (b is the sequence, i and j count
  /// from its start; a pairwise bias is [batch or 1][heads or 1][max_seqlen]
  /// [max_seqlen]).
  template <class X, class Cu, class Y, class ScoreMod>
  void forward(const ExecSpace& space, const X& x, const Cu& cu_seqlens, int max_seqlen,
               const Y& y, context_type& context, const ScoreMod& score_mod) const {
    const char* function = "kfa::nn::MultiHeadAttention::forward";
    Impl::ProfilingRegion region(function);
    check_packed_forward(function, x, cu_seqlens, max_seqlen, y, context);
    if constexpr (packed_pair_ok<X, Y>()) {
      check_modifier(function, score_mod, cu_seqlens.extent(0) - 1, max_seqlen, max_seqlen);
      forward_impl(space, packed_tokens(x), Impl::out_matrix(y), context, score_mod);
    }
  }

  /// Cross-attention over a packed batch: queries from x [total_tokens]
  /// [d_model] (sequence b is rows [cu_seqlens[b], cu_seqlens[b + 1])), keys
  /// and values from memory [total_tokens_kv][d_model_kv] (sequence b's
  /// memory is rows [cu_seqlens_kv[b], cu_seqlens_kv[b + 1])); y like x.
  /// Sequence b attends only to its own memory, with masks aligned to the
  /// bottom-right corner of its own lengths and rotary positions from each
  /// start; a sequence with an empty memory gets a zero attention output.
  /// cu_seqlens and cu_seqlens_kv [batch + 1] (the same batch) of int in the
  /// layer's memory space, referenced by the context until the backward;
  /// max_seqlen, max_seqlen_kv bound the lengths. The backward is
  /// backward(space, dy, dx, dmemory, context) with dy, dx like x and
  /// dmemory like memory. Checking the offsets reads them on the host: this
  /// fences. Not in the sequence-parallel mode.
  template <class X, class Cu, class M, class CuM, class Y>
  void forward(const ExecSpace& space, const X& x, const Cu& cu_seqlens, int max_seqlen,
               const M& memory, const CuM& cu_seqlens_kv, int max_seqlen_kv, const Y& y,
               context_type& context) const {
    const char* function = "kfa::nn::MultiHeadAttention::forward";
    Impl::ProfilingRegion region(function);
    check_packed_cross_forward(function, x, cu_seqlens, max_seqlen, memory, cu_seqlens_kv,
                               max_seqlen_kv, y, context);
    if constexpr (packed_pair_ok<X, Y>() && packed_pair_ok<M, Y>()) {
      with_own_modifier([&](const auto& mod) {
        attend_forward(space, packed_tokens(x), packed_tokens(memory), Impl::out_matrix(y),
                       context, true, mod);
      });
    }
  }

  /// Packed cross-attention with a score modifier (b is the sequence, i and
  /// j count from the starts of its queries and of its memory; a pairwise
  /// bias is [batch or 1][heads or 1][max_seqlen][max_seqlen_kv]).
  template <class X, class Cu, class M, class CuM, class Y, class ScoreMod>
  void forward(const ExecSpace& space, const X& x, const Cu& cu_seqlens, int max_seqlen,
               const M& memory, const CuM& cu_seqlens_kv, int max_seqlen_kv, const Y& y,
               context_type& context, const ScoreMod& score_mod) const {
    const char* function = "kfa::nn::MultiHeadAttention::forward";
    Impl::ProfilingRegion region(function);
    check_packed_cross_forward(function, x, cu_seqlens, max_seqlen, memory, cu_seqlens_kv,
                               max_seqlen_kv, y, context);
    if constexpr (packed_pair_ok<X, Y>() && packed_pair_ok<M, Y>()) {
      check_modifier(function, score_mod, cu_seqlens.extent(0) - 1, max_seqlen, max_seqlen_kv);
      attend_forward(space, packed_tokens(x), packed_tokens(memory), Impl::out_matrix(y),
                     context, true, score_mod);
    }
  }

  /// Backward of the forward that filled `context`: dx overwritten, the
  /// parameter gradients accumulated. dy, dx [batch][seqlen][d_model] like
  /// that forward's x ([total_tokens][d_model] after a packed forward); dx
  /// must not overlap dy.
  template <class DY, class DX>
  void backward(const ExecSpace& space, const DY& dy, const DX& dx, context_type& context) {
    const char* function = "kfa::nn::MultiHeadAttention::backward";
    Impl::ProfilingRegion region(function);
    if constexpr (packed_pair_ok<DY, DX>()) {
      check_packed_backward(function, dy, dx, context);
      with_own_modifier([&](const auto& mod) {
        backward_impl(space, Impl::in_matrix(dy), Impl::out_matrix(dx), context, mod);
      });
      return;
    }
    check_self_backward(function, dy, dx, context);
    if constexpr (pair_ok<DY, DX>()) {
      with_own_modifier([&](const auto& mod) {
        backward_impl(space, Impl::in_matrix(dy), Impl::out_matrix(dx), context, mod);
      });
    }
  }

  /// Backward of a forward with `score_mod` (the same modifier).
  template <class DY, class DX, class ScoreMod>
  void backward(const ExecSpace& space, const DY& dy, const DX& dx, context_type& context,
                const ScoreMod& score_mod) {
    const char* function = "kfa::nn::MultiHeadAttention::backward";
    Impl::ProfilingRegion region(function);
    if constexpr (packed_pair_ok<DY, DX>()) {
      check_packed_backward(function, dy, dx, context);
      check_modifier(function, score_mod, context.cu_seqlens.extent(0) - 1, context.max_seqlen,
                     context.max_seqlen);
      backward_impl(space, Impl::in_matrix(dy), Impl::out_matrix(dx), context, score_mod);
      return;
    }
    check_self_backward(function, dy, dx, context);
    if constexpr (pair_ok<DY, DX>()) {
      check_modifier(function, score_mod, context.x.extent(0), context.x.extent(1),
                     context.cross ? context.memory.extent(1) : context.x.extent(1));
      backward_impl(space, Impl::in_matrix(dy), Impl::out_matrix(dx), context, score_mod);
    }
  }

  /// Backward of a cross-attention forward: dx (through q) and dmemory
  /// [batch][seqlen_kv][d_model_kv] like that forward's memory (through k and
  /// v) overwritten, the parameter gradients accumulated. dx, dmemory and dy
  /// must not overlap.
  template <class DY, class DX, class DM>
  void backward(const ExecSpace& space, const DY& dy, const DX& dx, const DM& dmemory,
                context_type& context) {
    const char* function = "kfa::nn::MultiHeadAttention::backward";
    Impl::ProfilingRegion region(function);
    if constexpr (packed_pair_ok<DY, DX>()) {
      check_packed_cross_backward(function, dy, dx, dmemory, context);
      if constexpr (packed_pair_ok<DM, DY>()) {
        with_own_modifier([&](const auto& mod) {
          attend_backward(space, Impl::in_matrix(dy), Impl::out_matrix(dx),
                          Impl::out_matrix(dmemory), context, mod);
        });
      }
      return;
    }
    check_cross_backward(function, dy, dx, dmemory, context);
    if constexpr (pair_ok<DY, DX>() && pair_ok<DM, DY>()) {
      with_own_modifier([&](const auto& mod) {
        attend_backward(space, Impl::in_matrix(dy), Impl::out_matrix(dx),
                        Impl::out_matrix(dmemory), context, mod);
      });
    }
  }

  /// Backward of a cross-attention forward with `score_mod`.
  template <class DY, class DX, class DM, class ScoreMod>
  void backward(const ExecSpace& space, const DY& dy, const DX& dx, const DM& dmemory,
                context_type& context, const ScoreMod& score_mod) {
    const char* function = "kfa::nn::MultiHeadAttention::backward";
    Impl::ProfilingRegion region(function);
    if constexpr (packed_pair_ok<DY, DX>()) {
      check_packed_cross_backward(function, dy, dx, dmemory, context);
      if constexpr (packed_pair_ok<DM, DY>()) {
        check_modifier(function, score_mod, context.cu_seqlens.extent(0) - 1, context.max_seqlen,
                       context.max_seqlen_kv);
        attend_backward(space, Impl::in_matrix(dy), Impl::out_matrix(dx),
                        Impl::out_matrix(dmemory), context, score_mod);
      }
      return;
    }
    check_cross_backward(function, dy, dx, dmemory, context);
    if constexpr (pair_ok<DY, DX>() && pair_ok<DM, DY>()) {
      check_modifier(function, score_mod, context.x.extent(0), context.x.extent(1),
                     context.cross ? context.memory.extent(1) : context.x.extent(1));
      attend_backward(space, Impl::in_matrix(dy), Impl::out_matrix(dx),
                      Impl::out_matrix(dmemory), context, score_mod);
    }
  }

 private:
  friend class TransformerBlock<ExecSpace, T>;
  friend class TransformerDecoderBlock<ExecSpace, T>;
  using in2 = Impl::NnIn2<T, memory_space>;
  using out2 = Impl::NnOut2<T, memory_space>;
  using view4 = typename context_type::view4;
  using view1_acc = typename context_type::view1_acc;

  /// Whether the gradients are the fp32 Views (options.fp32_gradients of a
  /// 16-bit T; double and float accumulate in their own type).
  bool fp32_grads() const { return m_options.fp32_gradients && Impl::nn_is_16bit<T>(); }

  template <class V>
  void allocate(Tensors<V>& w, const std::string& prefix) const {
    using view1 = Kokkos::View<V*, Kokkos::LayoutRight, memory_space>;
    using view2 = Kokkos::View<V**, Kokkos::LayoutRight, memory_space>;
    const auto& o = m_options;
    const int q_rows = o.heads * o.head_dim, kv_rows = o.kv_heads * o.head_dim;
    auto label = [&](const char* name) {
      return "kfa::nn::MultiHeadAttention::" + prefix + name;
    };
    if (o.fused_qkv) {
      w.w_qkv = view2(label("w_qkv"), q_rows + 2 * kv_rows, o.d_model);
      if (o.bias) w.b_qkv = view1(label("b_qkv"), q_rows + 2 * kv_rows);
    } else {
      w.w_q = view2(label("w_q"), q_rows, o.d_model);
      w.w_k = view2(label("w_k"), kv_rows, o.d_model_kv);
      w.w_v = view2(label("w_v"), kv_rows, o.d_model_kv);
      if (o.bias) {
        w.b_q = view1(label("b_q"), q_rows);
        w.b_k = view1(label("b_k"), kv_rows);
        w.b_v = view1(label("b_v"), kv_rows);
      }
    }
    w.w_o = view2(label("w_o"), o.d_model, q_rows);
    if (o.bias) w.b_o = view1(label("b_o"), o.d_model);
    if (o.qk_norm) {
      w.q_norm = view1(label("q_norm"), o.head_dim);
      w.k_norm = view1(label("k_norm"), o.head_dim);
    }
  }

  static MultiHeadAttentionOptions resolve(MultiHeadAttentionOptions o) {
    const char* function = "kfa::nn::MultiHeadAttention";
    if (o.d_model <= 0 || o.heads <= 0) {
      Impl::throw_invalid(function, "options.d_model and options.heads must be > 0, got " +
                                        std::to_string(o.d_model) + " and " +
                                        std::to_string(o.heads));
    }
    if (o.kv_heads == 0) o.kv_heads = o.heads;
    if (o.d_model_kv == 0) o.d_model_kv = o.d_model;
    if (o.d_model_kv < 0) {
      Impl::throw_invalid(function, "options.d_model_kv must be >= 0 (0: d_model), got " +
                                        std::to_string(o.d_model_kv));
    }
    if (o.fused_qkv && o.d_model_kv != o.d_model) {
      Impl::throw_invalid(function, "options.fused_qkv needs d_model_kv = d_model (got " +
                                        std::to_string(o.d_model_kv) + " and " +
                                        std::to_string(o.d_model) +
                                        "), as PyTorch's in_proj_weight; set fused_qkv = false");
    }
    if (o.head_dim == 0) {
      if (o.d_model % o.heads != 0) {
        Impl::throw_invalid(function, "options.head_dim = 0 needs d_model (" +
                                          std::to_string(o.d_model) + ") divisible by heads (" +
                                          std::to_string(o.heads) + ")");
      }
      o.head_dim = o.d_model / o.heads;
    }
    if (o.kv_heads < 0 || o.heads % o.kv_heads != 0) {
      Impl::throw_invalid(function, "options.heads (" + std::to_string(o.heads) +
                                        ") must be a multiple of options.kv_heads (" +
                                        std::to_string(o.kv_heads) + ")");
    }
    Impl::check_head_dim(function, o.head_dim, "options.head_dim");
    if (o.rotary_options.rotary_dim == 0) o.rotary_options.rotary_dim = o.head_dim;
    const int rd = o.rotary_options.rotary_dim;
    if (rd < 0 || rd % 2 != 0 || rd > o.head_dim || !(o.rotary_options.base > 0) ||
        o.rotary_options.position_offset < 0) {
      Impl::throw_invalid(function, "options.rotary_options: rotary_dim must be even and in "
                                    "0..head_dim, base > 0, position_offset >= 0");
    }
    if (o.axial_rotary) resolve_axial(function, o);
    if (!(o.qk_norm_options.eps >= 0) || !std::isfinite(o.qk_norm_options.eps)) {
      Impl::throw_invalid(function, "options.qk_norm_options.eps must be finite and >= 0");
    }
    if (o.alibi && o.rotary) {
      Impl::throw_invalid(function, "options.alibi and options.rotary are mutually exclusive "
                                    "(ALiBi replaces position embeddings)");
    }
    if (o.alibi && o.sequence_parallel.comm != nullptr) {
      Impl::throw_invalid(function, "options.alibi does not run in the sequence-parallel mode "
                                    "(ring attention takes no score modifier)");
    }
    Impl::check_options(function, o.attention);
    Impl::nn_check_sequence_parallel(function, o.sequence_parallel, o.attention);
    return o;
  }

  /// The axial rotary option: a grid of 1..3 axes, rotary features that
  /// split into an even share per axis, a finite base and scales.
  static void resolve_axial(const char* function, MultiHeadAttentionOptions& o) {
    auto& a = o.axial_rotary_options;
    if (o.rotary || o.alibi) {
      Impl::throw_invalid(function, "options.axial_rotary replaces options.rotary and "
                                    "options.alibi (one kind of position information); turn "
                                    "them off");
    }
    if (a.axes < 1 || a.axes > 3) {
      Impl::throw_invalid(function, "options.axial_rotary_options.axes must be 1, 2 or 3, got " +
                                        std::to_string(a.axes));
    }
    std::int64_t points = 1;
    for (int axis = 0; axis < a.axes; ++axis) {
      if (a.extent[axis] < 1) {
        Impl::throw_invalid(function, "options.axial_rotary_options.extent[" +
                                          std::to_string(axis) + "] must be >= 1, got extent = " +
                                          Impl::grid_string(a.axes, a.extent));
      }
      points *= a.extent[axis];
      if (points > std::numeric_limits<int>::max()) {
        Impl::throw_invalid(function, "options.axial_rotary_options.extent = " +
                                          Impl::grid_string(a.axes, a.extent) +
                                          " holds more than 2^31 - 1 points");
      }
    }
    if (a.rotary_dim == 0) a.rotary_dim = o.head_dim;
    if (a.rotary_dim < 0 || a.rotary_dim > o.head_dim || a.rotary_dim % (2 * a.axes) != 0) {
      Impl::throw_invalid(function, "options.axial_rotary_options.rotary_dim (0: head_dim) must "
                                    "be in 0..head_dim = " + std::to_string(o.head_dim) +
                                        " and a multiple of 2·axes = " +
                                        std::to_string(2 * a.axes) +
                                        " (an even share per axis), got " +
                                        std::to_string(a.rotary_dim));
    }
    bool finite = a.base > 0 && std::isfinite(a.base);
    for (int axis = 0; axis < a.axes; ++axis) finite = finite && std::isfinite(a.scale[axis]);
    if (!finite) {
      Impl::throw_invalid(function, "options.axial_rotary_options.base must be finite and > 0 "
                                    "and its scale finite");
    }
  }

  /// The grid's points under options.axial_rotary, else 0.
  int axial_points() const {
    if (!m_options.axial_rotary) return 0;
    const auto& a = m_options.axial_rotary_options;
    int points = 1;
    for (int axis = 0; axis < a.axes; ++axis) points *= a.extent[axis];
    return points;
  }

  /// Under options.axial_rotary the query and key sequences must be the
  /// grid (the whole sequence in the sequence-parallel mode).
  void check_axial_lengths(const char* function, int seqlen, int seqlen_kv, bool cross) const {
    const int points = axial_points();
    if (points == 0 || (seqlen == points && seqlen_kv == points)) return;
    const auto& a = m_options.axial_rotary_options;
    const bool memory_bad = cross && seqlen == points;
    const bool ranks = m_options.sequence_parallel.comm != nullptr;
    const std::string shape =
        "[batch][" + std::to_string(points) + "][" +
        std::to_string(memory_bad ? m_options.d_model_kv : m_options.d_model) + "]";
    Impl::throw_invalid(
        function, std::string(memory_bad ? "memory" : "x") +
                      (ranks ? " of all ranks together must be " : " must be ") + shape +
                      ": options.axial_rotary_options.extent = " +
                      Impl::grid_string(a.axes, a.extent) + " holds " + std::to_string(points) +
                      " grid points, but " + (memory_bad ? "seqlen_kv" : "seqlen") + " is " +
                      std::to_string(memory_bad ? seqlen_kv : seqlen));
  }

  template <class A, class B>
  static constexpr bool pair_ok() {
    return Impl::view_ok<ExecSpace, A>(3) && Impl::view_ok<ExecSpace, B>(3);
  }

  template <class In, class Out>
  void check_pair(const char* function, const char* in_name, const In& in, const char* out_name,
                  const Out& out) const {
    Impl::nn_check_tokens<ExecSpace>(function, in_name, in, m_options.d_model);
    Impl::nn_check_tokens<ExecSpace>(function, out_name, out, m_options.d_model);
    if constexpr (pair_ok<In, Out>()) {
      static_assert(Impl::same_value_type<T, In, Out>() && Impl::all_non_const<Out>(),
                    "kfa::nn::MultiHeadAttention: inputs and outputs must be Views of the "
                    "layer's T, outputs non-const");
      Impl::check_extents(function, out_name, "[batch][seqlen][d_model]", out,
                          {in.extent(0), in.extent(1), in.extent(2)});
      Impl::check_disjoint(function, out_name, out, in_name, in);
    }
  }

  template <class A, class B>
  static constexpr bool packed_pair_ok() {
    return Impl::view_ok<ExecSpace, A>(2) && Impl::view_ok<ExecSpace, B>(2);
  }

  /// Packed [total_tokens][d_model] as the [1][total_tokens][d_model] the
  /// projections and norms run on.
  template <class X>
  static typename context_type::const_view3 packed_tokens(const X& x) {
    return typename context_type::const_view3(x.data(), 1, x.extent(0), x.extent(1));
  }

  /// Marks a context as holding a batch of equal-length sequences.
  static void unpack(context_type& c) {
    c.packed = false;
    c.cu_seqlens = {};
    c.max_seqlen = 0;
    c.cu_seqlens_kv = {};
    c.max_seqlen_kv = 0;
  }

  /// A packed input and output [total_tokens][d_model]; the offsets are
  /// read on the host and checked (and the tokens' positions derived) here,
  /// before anything is written.
  template <class X, class Cu, class Y>
  void check_packed_forward(const char* function, const X& x, const Cu& cu_seqlens,
                            int max_seqlen, const Y& y, context_type& c) const {
    if (m_options.sequence_parallel.comm != nullptr) {
      Impl::throw_invalid(function, "packed batches do not run in the sequence-parallel mode");
    }
    if (m_options.d_model_kv != m_options.d_model) {
      Impl::throw_invalid(function, "packed self-attention needs options.d_model_kv = d_model; "
                                    "for cross-attention pass the memory and cu_seqlens_kv");
    }
    const char* shape = "[total_tokens][d_model]";
    Impl::check_nn_view<ExecSpace, X>(function, "x", shape, 2);
    Impl::check_nn_view<ExecSpace, Y>(function, "y", shape, 2);
    if constexpr (packed_pair_ok<X, Y>()) {
      static_assert(Impl::same_value_type<T, X, Y>() && Impl::all_non_const<Y>(),
                    "kfa::nn::MultiHeadAttention: inputs and outputs must be Views of the "
                    "layer's T, outputs non-const");
      check_packed_queries(function, x, y);
      pack(function, cu_seqlens, max_seqlen, x.extent(0), c, axial_points());
    }
  }

  /// The queries and output of both packed forwards: x and y
  /// [total_tokens][d_model], contiguous, apart.
  template <class X, class Y>
  void check_packed_queries(const char* function, const X& x, const Y& y) const {
    if (x.extent(1) != std::size_t(m_options.d_model)) {
      Impl::throw_invalid(function, "x must be [total_tokens][d_model] with d_model = " +
                                        std::to_string(m_options.d_model) + ", got " +
                                        Impl::extents_string(x));
    }
    Impl::check_extents(function, "y", "[total_tokens][d_model]", y, {x.extent(0), x.extent(1)});
    if (!x.span_is_contiguous() || !y.span_is_contiguous()) {
      Impl::throw_invalid(function, "x and y must be contiguous (LayoutRight Views without "
                                    "padding)");
    }
    Impl::check_disjoint(function, "y", y, "x", x);
  }

  /// Reads packed offsets on the host and checks them (names: the View, its
  /// maximum length, its total); returns each token's position in its
  /// sequence. Writes nothing.
  template <class Cu>
  static std::vector<int> packed_positions(const char* function, const char* name,
                                           const char* max_name, const char* total_name,
                                           const Cu& cu_seqlens, int max_seqlen,
                                           std::size_t total, int axial_points) {
    static_assert(Kokkos::is_view<Cu>::value && Cu::rank == 1 &&
                      std::is_same<typename Cu::non_const_value_type, int>::value &&
                      std::is_same<typename Cu::memory_space, memory_space>::value,
                  "kfa::nn::MultiHeadAttention: cu_seqlens and cu_seqlens_kv must be rank-1 "
                  "Views of int in the layer's memory space");
    const std::string cu = name, max = max_name;
    if (cu_seqlens.extent(0) == 0 || max_seqlen < 0) {
      Impl::throw_invalid(function, cu + " must be [batch + 1] (got " +
                                        Impl::extents_string(cu_seqlens) + ") and " + max +
                                        " >= 0 (got " + std::to_string(max_seqlen) + ")");
    }
    const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), cu_seqlens);
    const std::size_t n = host.extent(0);
    for (std::size_t b = 0; b < n; ++b) {
      const bool bad = b == 0 ? host(0) != 0
                              : host(b) < host(b - 1) || host(b) - host(b - 1) > max_seqlen;
      if (bad || (b + 1 == n && std::size_t(host(b)) != total)) {
        Impl::throw_invalid(function, cu + " must start at 0, never decrease, end at " +
                                          total_name + " = " + std::to_string(total) +
                                          " and hold lengths <= " + max + " = " +
                                          std::to_string(max_seqlen) + "; got " + cu + "[" +
                                          std::to_string(b) + "] = " + std::to_string(host(b)));
      }
    }
    // Axial rotary embeddings: every sequence is the grid (token t of the
    // packed batch is then grid point t % points).
    for (std::size_t b = 0; axial_points > 0 && b + 1 < n; ++b) {
      const int length = host(b + 1) - host(b);
      if (length != 0 && length != axial_points) {
        Impl::throw_invalid(function, "options.axial_rotary_options.extent holds " +
                                          std::to_string(axial_points) +
                                          " grid points: every sequence of a packed batch must "
                                          "be the grid (or empty), got " + cu + " sequence " +
                                          std::to_string(b) + " of length " +
                                          std::to_string(length));
      }
    }
    // Rotary positions restart at every sequence.
    std::vector<int> positions(total);
    for (std::size_t b = 0; b + 1 < n; ++b)
      for (int t = host(b); t < host(b + 1); ++t) positions[t] = t - host(b);
    return positions;
  }

  static void store_positions(Kokkos::View<int*, memory_space>& view, const char* label,
                              const std::vector<int>& positions) {
    Impl::nn_ensure(view, label, positions.size());
    Kokkos::deep_copy(view, Kokkos::View<const int*, Kokkos::HostSpace,
                                         Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
                                positions.data(), positions.size()));
  }

  template <class Cu>
  static void pack(const char* function, const Cu& cu_seqlens, int max_seqlen, std::size_t total,
                   context_type& c, int axial_points) {
    const std::vector<int> positions = packed_positions(
        function, "cu_seqlens", "max_seqlen", "total_tokens", cu_seqlens, max_seqlen, total,
        axial_points);
    store_positions(c.positions, "kfa::nn::MultiHeadAttention::positions", positions);
    c.packed = true;
    c.cu_seqlens = cu_seqlens;
    c.max_seqlen = max_seqlen;
    c.cu_seqlens_kv = {};
    c.max_seqlen_kv = 0;
  }

  /// Packed cross-attention: x, y [total_tokens][d_model], memory
  /// [total_tokens_kv][d_model_kv] and both offsets of one batch, checked
  /// (offsets on the host) before anything is written.
  template <class X, class Cu, class M, class CuM, class Y>
  void check_packed_cross_forward(const char* function, const X& x, const Cu& cu_seqlens,
                                  int max_seqlen, const M& memory, const CuM& cu_seqlens_kv,
                                  int max_seqlen_kv, const Y& y, context_type& c) const {
    check_not_sequence_parallel(function);
    const char* shape = "[total_tokens][d_model]";
    Impl::check_nn_view<ExecSpace, X>(function, "x", shape, 2);
    Impl::check_nn_view<ExecSpace, Y>(function, "y", shape, 2);
    Impl::check_nn_view<ExecSpace, M>(function, "memory", "[total_tokens_kv][d_model_kv]", 2);
    if constexpr (packed_pair_ok<X, Y>() && packed_pair_ok<M, Y>()) {
      static_assert(Impl::same_value_type<T, X, M, Y>() && Impl::all_non_const<Y>(),
                    "kfa::nn::MultiHeadAttention: inputs and outputs must be Views of the "
                    "layer's T, outputs non-const");
      check_packed_queries(function, x, y);
      if (memory.extent(1) != std::size_t(m_options.d_model_kv)) {
        Impl::throw_invalid(function, "memory must be [total_tokens_kv][d_model_kv] with "
                                      "d_model_kv = " + std::to_string(m_options.d_model_kv) +
                                          ", got " + Impl::extents_string(memory));
      }
      if (!memory.span_is_contiguous()) {
        Impl::throw_invalid(function, "memory must be contiguous (a LayoutRight View without "
                                      "padding)");
      }
      Impl::check_disjoint(function, "y", y, "memory", memory);
      if (cu_seqlens_kv.extent(0) != cu_seqlens.extent(0)) {
        Impl::throw_invalid(function, "cu_seqlens_kv must be [batch + 1] = " +
                                          Impl::extents_string(cu_seqlens) +
                                          " like cu_seqlens, got " +
                                          Impl::extents_string(cu_seqlens_kv));
      }
      const int points = axial_points();
      const std::vector<int> positions = packed_positions(
          function, "cu_seqlens", "max_seqlen", "total_tokens", cu_seqlens, max_seqlen,
          x.extent(0), points);
      const std::vector<int> positions_kv = packed_positions(
          function, "cu_seqlens_kv", "max_seqlen_kv", "total_tokens_kv", cu_seqlens_kv,
          max_seqlen_kv, memory.extent(0), points);
      store_positions(c.positions, "kfa::nn::MultiHeadAttention::positions", positions);
      store_positions(c.positions_kv, "kfa::nn::MultiHeadAttention::positions_kv", positions_kv);
      c.packed = true;
      c.cu_seqlens = cu_seqlens;
      c.max_seqlen = max_seqlen;
      c.cu_seqlens_kv = cu_seqlens_kv;
      c.max_seqlen_kv = max_seqlen_kv;
    }
  }

  /// dy, dx [total_tokens][d_model] and dmemory [total_tokens_kv][d_model_kv]
  /// after a packed cross-attention forward.
  template <class DY, class DX, class DM>
  void check_packed_cross_backward(const char* function, const DY& dy, const DX& dx,
                                   const DM& dmemory, const context_type& c) const {
    Impl::check_nn_view<ExecSpace, DM>(function, "dmemory", "[total_tokens_kv][d_model_kv]", 2);
    if constexpr (Impl::view_ok<ExecSpace, DM>(2)) {
      static_assert(Impl::same_value_type<T, DY, DX, DM>() && Impl::all_non_const<DX, DM>(),
                    "kfa::nn::MultiHeadAttention: dy, dx and dmemory must be Views of the "
                    "layer's T, dx and dmemory non-const");
      if (!c.packed || !c.cross) {
        Impl::throw_invalid(function, "dmemory " + Impl::extents_string(dmemory) +
                                          " is packed: it needs a packed cross-attention forward "
                                          "(forward(space, x, cu_seqlens, max_seqlen, memory, "
                                          "cu_seqlens_kv, max_seqlen_kv, y, context)) with this "
                                          "context");
      }
      const std::size_t total = c.x.extent(1), d = std::size_t(m_options.d_model);
      Impl::check_extents(function, "dy", "[total_tokens][d_model]", dy, {total, d});
      Impl::check_extents(function, "dx", "[total_tokens][d_model]", dx, {total, d});
      Impl::check_extents(function, "dmemory", "[total_tokens_kv][d_model_kv]", dmemory,
                          {c.memory.extent(1), c.memory.extent(2)});
      if (!dy.span_is_contiguous() || !dx.span_is_contiguous() ||
          !dmemory.span_is_contiguous()) {
        Impl::throw_invalid(function, "dy, dx and dmemory must be contiguous (LayoutRight Views "
                                      "without padding)");
      }
      Impl::check_disjoint(function, "dx", dx, "dy", dy);
      Impl::check_disjoint(function, "dmemory", dmemory, "dy", dy);
      Impl::check_disjoint(function, "dmemory", dmemory, "dx", dx);
    }
  }

  /// dy, dx [total_tokens][d_model] after a packed forward.
  template <class DY, class DX>
  void check_packed_backward(const char* function, const DY& dy, const DX& dx,
                             const context_type& c) const {
    static_assert(Impl::same_value_type<T, DY, DX>() && Impl::all_non_const<DX>(),
                  "kfa::nn::MultiHeadAttention: dy and dx must be Views of the layer's T, dx "
                  "non-const");
    if (!c.packed) {
      Impl::throw_invalid(function, "dy " + Impl::extents_string(dy) +
                                        " is packed [total_tokens][d_model] but the forward was "
                                        "not (call forward with this context first)");
    }
    if (c.cross) {
      Impl::throw_invalid(function, "the forward had a memory (packed cross-attention): call "
                                    "backward(space, dy, dx, dmemory, context)");
    }
    const std::size_t total = c.x.extent(1), d = std::size_t(m_options.d_model);
    Impl::check_extents(function, "dy", "[total_tokens][d_model]", dy, {total, d});
    Impl::check_extents(function, "dx", "[total_tokens][d_model]", dx, {total, d});
    if (!dy.span_is_contiguous() || !dx.span_is_contiguous()) {
      Impl::throw_invalid(function, "dy and dx must be contiguous (LayoutRight Views without "
                                    "padding)");
    }
    Impl::check_disjoint(function, "dx", dx, "dy", dy);
  }

  template <class X, class Y>
  void check_self_forward(const char* function, const X& x, const Y& y) const {
    Impl::nn_checks_on_every_rank(m_options.sequence_parallel, [&] {
      check_pair<X, Y>(function, "x", x, "y", y);
      if (m_options.d_model_kv != m_options.d_model) {
        Impl::throw_invalid(function, "self-attention needs options.d_model_kv = d_model (" +
                                          std::to_string(m_options.d_model) + "), got " +
                                          std::to_string(m_options.d_model_kv) +
                                          "; pass the memory: forward(space, x, memory, y, "
                                          "context)");
      }
    });
  }

  template <class X, class M, class Y>
  void check_cross_forward(const char* function, const X& x, const M& memory,
                           const Y& y) const {
    check_not_sequence_parallel(function);
    check_pair<X, Y>(function, "x", x, "y", y);
    check_memory<M>(function, "memory", memory, x.extent(0));
    if constexpr (pair_ok<X, Y>() && pair_ok<M, Y>())
      Impl::check_disjoint(function, "y", y, "memory", memory);
  }

  template <class DY, class DX>
  void check_self_backward(const char* function, const DY& dy, const DX& dx,
                           const context_type& context) const {
    Impl::nn_checks_on_every_rank(m_options.sequence_parallel, [&] {
      check_pair<DY, DX>(function, "dy", dy, "dx", dx);
      if constexpr (pair_ok<DY, DX>()) check_like_forward(function, dy, context);
    });
    if (context.cross) {
      Impl::throw_invalid(function, "the forward had a memory (cross-attention): call "
                                    "backward(space, dy, dx, dmemory, context)");
    }
  }

  template <class DY, class DX, class DM>
  void check_cross_backward(const char* function, const DY& dy, const DX& dx, const DM& dmemory,
                            const context_type& context) const {
    check_not_sequence_parallel(function);
    check_pair<DY, DX>(function, "dy", dy, "dx", dx);
    if constexpr (pair_ok<DY, DX>()) check_like_forward(function, dy, context);
    check_memory<DM>(function, "dmemory", dmemory, dy.extent(0));
    if constexpr (pair_ok<DY, DX>() && pair_ok<DM, DY>()) {
      static_assert(Impl::all_non_const<DM>(),
                    "kfa::nn::MultiHeadAttention::backward: dmemory must be non-const");
      if (!context.cross) {
        Impl::throw_invalid(function, "dmemory needs a cross-attention forward (forward(space, "
                                      "x, memory, y, context)); this context holds "
                                      "self-attention");
      }
      if (dmemory.extent(1) != context.memory.extent(1)) {
        Impl::throw_invalid(function, "dmemory " + Impl::extents_string(dmemory) +
                                          " must have the shape of the forward's memory " +
                                          Impl::extents_string(context.memory));
      }
      Impl::check_disjoint(function, "dmemory", dmemory, "dy", dy);
      Impl::check_disjoint(function, "dmemory", dmemory, "dx", dx);
    }
  }

  /// Calls f with the layer's own modifier: kfa::alibi with the standard
  /// slopes under options.alibi, else none.
  template <class F>
  void with_own_modifier(F&& f) const {
    if (m_options.alibi)
      f(kfa::alibi(m_alibi_slopes));
    else
      f(Impl::NoScoreMod{});
  }

  /// A caller's modifier: not beside the layer's ALiBi (ALiBi's bottom-right
  /// distances need the lengths, which a composed modifier's score_grad does
  /// not get), not through ring attention, and its Views fit the call.
  template <class ScoreMod>
  void check_modifier(const char* function, const ScoreMod& score_mod, std::size_t batch,
                      std::size_t seqlen_q, std::size_t seqlen_k) const {
    Impl::check_score_mod_type<ScoreMod, T>();
    if (m_options.alibi) {
      Impl::throw_invalid(function, "options.alibi is on: the layer applies kfa::alibi itself "
                                    "and takes no other score modifier (add the ALiBi bias in "
                                    "your modifier and turn options.alibi off)");
    }
    if (m_options.sequence_parallel.comm != nullptr) {
      Impl::throw_invalid(function, "score modifiers do not run in the sequence-parallel mode "
                                    "(ring attention takes none)");
    }
    Impl::nn_check_score_mod<ExecSpace>(function, score_mod, int(batch), m_options.heads,
                                        int(seqlen_q), int(seqlen_k));
  }

  void check_not_sequence_parallel(const char* function) const {
    if (m_options.sequence_parallel.comm != nullptr) {
      Impl::throw_invalid(function, "cross-attention does not run in the sequence-parallel "
                                    "mode (options.sequence_parallel.comm is set)");
    }
  }

  /// The memory (or its gradient): [batch][seqlen_kv][d_model_kv], contiguous.
  template <class M>
  void check_memory(const char* function, const char* name, const M& memory,
                    std::size_t batch) const {
    Impl::check_nn_view<ExecSpace, M>(function, name, "[batch][seqlen_kv][d_model_kv]", 3);
    if constexpr (Impl::view_ok<ExecSpace, M>(3)) {
      static_assert(Impl::same_value_type<T, M>(),
                    "kfa::nn::MultiHeadAttention: the memory must be a View of the layer's T");
      if (memory.extent(0) != batch || memory.extent(2) != std::size_t(m_options.d_model_kv)) {
        Impl::throw_invalid(function, std::string(name) +
                                          " must be [batch][seqlen_kv][d_model_kv] with batch = " +
                                          std::to_string(batch) + " and d_model_kv = " +
                                          std::to_string(m_options.d_model_kv) + ", got " +
                                          Impl::extents_string(memory));
      }
      if (!memory.span_is_contiguous()) {
        Impl::throw_invalid(function, std::string(name) + " must be contiguous (a LayoutRight "
                                                          "View without padding)");
      }
    }
  }

  template <class DY>
  static void check_like_forward(const char* function, const DY& dy, const context_type& c) {
    if (c.packed) {
      Impl::throw_invalid(function, "the forward was packed: dy and dx must be "
                                    "[total_tokens][d_model]");
    }
    if (!c.has_forward || dy.extent(0) != c.x.extent(0) ||
        dy.extent(1) != c.x.extent(1)) {
      Impl::throw_invalid(function, "dy " + Impl::extents_string(dy) +
                                        " must have the shape of the forward's x " +
                                        Impl::extents_string(c.x) +
                                        " (call forward with this context first)");
    }
  }

  /// Rotates `heads` heads of in's columns from in_col0 into out's from
  /// out_col0 (sign -1: the inverse); without rotary a copy. Positions are
  /// global: the tokens of `slice` start at slice.offset.
  void rotate(const ExecSpace& space, const in2& in, int in_col0, const out2& out, int out_col0,
              const Impl::NnSequenceSlice& slice, int heads, bool rotary, int sign,
              const Kokkos::View<const int*, memory_space>& positions = {}) const {
    RotaryOptions rotary_options = m_options.rotary_options;
    rotary_options.position_offset += slice.offset;
    Impl::rotary_apply_impl<ExecSpace, T>(space, in, in_col0, out, out_col0, slice.seqlen, heads,
                                          m_options.head_dim,
                                          rotary ? rotary_options.rotary_dim : 0, rotary_options,
                                          sign, positions);
  }

  /// Axial rotary embedding of q or k (sign -1: the inverse, on dq or dk) in
  /// place. A packed batch's sequences are all the grid, so token t is grid
  /// point t % points; in the sequence-parallel mode this rank's tokens start
  /// at grid point slice.offset.
  void rotate_axial(const ExecSpace& space, const view4& t, bool packed,
                    const Impl::NnSequenceSlice& slice, int heads, int sign) const {
    const out2 rows = Impl::out_tokens(t);
    const auto& a = m_options.axial_rotary_options;
    Impl::axial_rotary_impl<ExecSpace, T>(space, rows, rows, packed ? axial_points() : slice.seqlen,
                                          heads, m_options.head_dim, a.rotary_dim, a, sign,
                                          packed ? 0 : slice.offset);
  }

  /// RMSNorm over head_dim of every (token, head) row of `in` into `out`.
  void qk_norm_forward(const ExecSpace& space, const view4& in, const view1& weight,
                       const view4& out, const view1_acc& rstd) const {
    Impl::norm_forward_impl<ExecSpace, T, true>(space, Impl::in_matrix(in), weight, {},
                                                Impl::out_matrix(out), {}, rstd,
                                                m_options.qk_norm_options.eps);
  }

  /// d_in written, d_weight (of T or fp32) accumulated; d_out must stay
  /// intact until the weight's column sums have read it, so d_in is a buffer
  /// of its own.
  template <class GradView>
  void qk_norm_backward(const ExecSpace& space, const view4& in, const view1& weight,
                        const view1_acc& rstd, const view4& d_out, const view4& d_in,
                        const GradView& d_weight) const {
    using G = typename GradView::non_const_value_type;
    Impl::norm_backward_impl<ExecSpace, T, true, G>(space, Impl::in_matrix(in), weight, {}, rstd,
                                                    Impl::in_matrix(d_out),
                                                    Impl::out_matrix(d_in), d_weight, {});
  }

  /// Rows [row0, row0 + rows) of a weight matrix or bias vector (an empty
  /// bias stays empty): the q or the k|v part of the fused projection.
  static in2 weight_rows(const view2& w, int row0, int rows) {
    return in2(w.data() + std::size_t(row0) * w.extent(1), rows, w.extent(1));
  }
  template <class V>
  static Impl::NnOut2<V, memory_space> grad_rows(
      const Kokkos::View<V**, Kokkos::LayoutRight, memory_space>& w, int row0, int rows) {
    return Impl::NnOut2<V, memory_space>(w.data() + std::size_t(row0) * w.extent(1), rows,
                                         w.extent(1));
  }
  template <class V>
  static Kokkos::View<V*, Kokkos::LayoutRight, memory_space> vector_rows(
      const Kokkos::View<V*, Kokkos::LayoutRight, memory_space>& b, int row0, int rows) {
    using vector = Kokkos::View<V*, Kokkos::LayoutRight, memory_space>;
    return b.extent(0) == 0 ? vector() : vector(b.data() + row0, rows);
  }

  /// Whether the pass that splits a fused projection also rotates q (self-
  /// attention only: cross-attention projects q on its own) and k: not with
  /// the qk-norm, which comes between projection and rotation.
  bool q_rotates_in_split(bool cross) const {
    return m_options.fused_qkv && !cross && m_options.rotary && !m_options.qk_norm;
  }
  bool k_rotates_in_split() const {
    return m_options.fused_qkv && m_options.rotary && !m_options.qk_norm;
  }

  /// The varlen attention forward (or backward) of a packed batch: the
  /// context's [1][total_tokens][...] tensors as the varlen entry points'
  /// [total_tokens][...].
  template <class ScoreMod>
  static void packed_attention(const ExecSpace& space, context_type& c,
                               const ScoreMod& score_mod, bool backward) {
    using view3 = Kokkos::View<T***, Kokkos::LayoutRight, memory_space>;
    using lse2 = Kokkos::View<accumulator_t<T>**, Kokkos::LayoutRight, memory_space>;
    const auto rows = [](const view4& v) {
      return view3(v.data(), v.extent(1), v.extent(2), v.extent(3));
    };
    const lse2 lse(c.lse.data(), c.lse.extent(1), c.lse.extent(2));
    // Self-attention's keys are its queries' tokens.
    const int max_seqlen = c.max_seqlen;
    const int max_seqlen_kv = c.cross ? c.max_seqlen_kv : max_seqlen;
    const Kokkos::View<const int*, memory_space> cu_kv = c.cross ? c.cu_seqlens_kv : c.cu_seqlens;
    if (backward) {
      flash_attention_varlen_backward(space, rows(c.q), rows(c.k), rows(c.v), c.cu_seqlens,
                                      cu_kv, max_seqlen, max_seqlen_kv, rows(c.o), lse,
                                      rows(c.d_o), rows(c.dq), rows(c.dk), rows(c.dv),
                                      c.attention, score_mod);
    } else {
      flash_attention_varlen_forward(space, rows(c.q), rows(c.k), rows(c.v), c.cu_seqlens,
                                     cu_kv, max_seqlen, max_seqlen_kv, rows(c.o), lse,
                                     c.attention, score_mod);
    }
  }

  /// Self-attention (the block's entry).
  template <class X, class ScoreMod>
  void forward_impl(const ExecSpace& space, const X& x, const out2& y, context_type& c,
                    const ScoreMod& score_mod) const {
    attend_forward(space, x, x, y, c, false, score_mod);
  }

  /// q from x [batch][seqlen][d_model], k and v from mem [batch][seqlen_kv]
  /// [d_model_kv] (x itself for self-attention, `cross` false).
  template <class X, class M, class ScoreMod>
  void attend_forward(const ExecSpace& space, const X& x, const M& mem, const out2& y,
                      context_type& c, bool cross, const ScoreMod& score_mod) const {
    attend_core(space, x, mem, c, cross, score_mod);
    Impl::linear_forward_impl<ExecSpace, T>(space, Impl::in_tokens(c.o), m_weights.w_o,
                                            m_weights.b_o, y, c.scratch);
    // Recompute mode: keep only the inputs; the backward redoes the rest.
    if (m_options.recompute) release(c);
  }

  /// Frees every View the context owns but the packed positions.
  static void release(context_type& c) {
    view4* tensors[] = {&c.q,  &c.k,  &c.v,  &c.o,  &c.q_pre,  &c.k_pre,
                        &c.d_o, &c.dq, &c.dk, &c.dv, &c.dq_pre, &c.dk_pre};
    typename context_type::view2* matrices[] = {&c.qkv, &c.dqkv, &c.kv, &c.dkv};
    for (view4* t : tensors) *t = view4();
    for (auto* m : matrices) *m = typename context_type::view2();
    c.lse = typename context_type::lse_view();
    c.rstd_q = c.rstd_k = view1_acc();
    c.scratch.release();
  }

  /// Everything up to the attention output (o and lse): the forward, and in
  /// the recompute mode the backward's first step.
  template <class X, class M, class ScoreMod>
  void attend_core(const ExecSpace& space, const X& x, const M& mem, context_type& c, bool cross,
                   const ScoreMod& score_mod) const {
    const auto& o = m_options;
    const int batch = int(x.extent(0)), seqlen = int(x.extent(1)), tokens = batch * seqlen;
    const int seqlen_kv = int(mem.extent(1)), tokens_kv = batch * seqlen_kv;
    const int hd = o.head_dim, q_cols = o.heads * hd, kv_cols = o.kv_heads * hd;
    // A packed batch's sequences were checked against the grid with its offsets.
    const Impl::NnSequenceSlice slice =
        c.packed ? Impl::NnSequenceSlice{0, c.max_seqlen, c.max_seqlen}
                 : Impl::nn_sequence_slice(o.sequence_parallel, seqlen);
    if (!c.packed) {
      check_axial_lengths("kfa::nn::MultiHeadAttention::forward", slice.seqlen_global,
                          cross ? seqlen_kv : slice.seqlen_global, cross);
    }
    c.x = x;
    c.cross = cross;
    c.has_forward = true;
    c.memory = cross ? typename context_type::const_view3(mem) : typename context_type::const_view3();
    // A packed batch's rotary table has a row per position of its longest
    // sequence; the tokens' own positions come from c.positions.
    c.slice = slice;
    // Keys count their positions from the start of the memory (of their
    // sequence's memory in a packed batch).
    const int kv_rows = c.packed ? c.max_seqlen_kv : seqlen_kv;
    c.slice_kv = cross ? Impl::NnSequenceSlice{0, kv_rows, kv_rows} : c.slice;
    const Kokkos::View<const int*, memory_space> pos =
        c.packed ? c.positions : Kokkos::View<int*, memory_space>();
    const Kokkos::View<const int*, memory_space> pos_kv = c.packed && cross ? c.positions_kv : pos;
    Impl::nn_ensure(c.q, "kfa::nn::MultiHeadAttention::q", batch, seqlen, o.heads, hd);
    Impl::nn_ensure(c.k, "kfa::nn::MultiHeadAttention::k", batch, seqlen_kv, o.kv_heads, hd);
    Impl::nn_ensure(c.v, "kfa::nn::MultiHeadAttention::v", batch, seqlen_kv, o.kv_heads, hd);
    Impl::nn_ensure(c.o, "kfa::nn::MultiHeadAttention::o", batch, seqlen, o.heads, hd);
    Impl::nn_ensure(c.lse, "kfa::nn::MultiHeadAttention::lse", batch, o.heads, seqlen);
    const in2 x2 = Impl::in_matrix(x), mem2 = Impl::in_matrix(mem);
    if (o.qk_norm) {
      Impl::nn_ensure(c.q_pre, "kfa::nn::MultiHeadAttention::q_pre", batch, seqlen, o.heads, hd);
      Impl::nn_ensure(c.k_pre, "kfa::nn::MultiHeadAttention::k_pre", batch, seqlen_kv,
                      o.kv_heads, hd);
      Impl::nn_ensure(c.rstd_q, "kfa::nn::MultiHeadAttention::rstd_q", tokens * o.heads);
      Impl::nn_ensure(c.rstd_k, "kfa::nn::MultiHeadAttention::rstd_k", tokens_kv * o.kv_heads);
    }
    // The projections' q and k: the attention's own, or the norm's inputs.
    const out2 q2 = Impl::out_tokens(o.qk_norm ? c.q_pre : c.q),
               k2 = Impl::out_tokens(o.qk_norm ? c.k_pre : c.k), v2 = Impl::out_tokens(c.v);
    const bool q_in_split = q_rotates_in_split(cross), k_in_split = k_rotates_in_split();
    const auto& w = m_weights;
    if (o.fused_qkv && !cross) {
      // One product for q|k|v, then one pass that splits it into the
      // attention's [batch][seqlen][heads][head_dim] tensors and rotates q, k.
      Impl::nn_ensure(c.qkv, "kfa::nn::MultiHeadAttention::qkv", tokens, q_cols + 2 * kv_cols);
      Impl::linear_forward_impl<ExecSpace, T>(space, x2, w.w_qkv, w.b_qkv, c.qkv, c.scratch);
      rotate(space, c.qkv, 0, q2, 0, c.slice, o.heads, q_in_split, 1, pos);
      rotate(space, c.qkv, q_cols, k2, 0, c.slice, o.kv_heads, k_in_split, 1, pos);
      rotate(space, c.qkv, q_cols + kv_cols, v2, 0, c.slice, o.kv_heads, false, 1, pos);
    } else if (o.fused_qkv) {
      // Cross-attention: q from the q rows, one product for k|v from the rest.
      Impl::nn_ensure(c.kv, "kfa::nn::MultiHeadAttention::kv", tokens_kv, 2 * kv_cols);
      Impl::linear_forward_impl<ExecSpace, T>(space, x2, weight_rows(w.w_qkv, 0, q_cols),
                                              vector_rows(w.b_qkv, 0, q_cols), q2, c.scratch);
      Impl::linear_forward_impl<ExecSpace, T>(space, mem2,
                                              weight_rows(w.w_qkv, q_cols, 2 * kv_cols),
                                              vector_rows(w.b_qkv, q_cols, 2 * kv_cols), c.kv,
                                              c.scratch);
      rotate(space, c.kv, 0, k2, 0, c.slice_kv, o.kv_heads, k_in_split, 1, pos_kv);
      rotate(space, c.kv, kv_cols, v2, 0, c.slice_kv, o.kv_heads, false, 1, pos_kv);
    } else {
      Impl::linear_forward_impl<ExecSpace, T>(space, x2, w.w_q, w.b_q, q2, c.scratch);
      Impl::linear_forward_impl<ExecSpace, T>(space, mem2, w.w_k, w.b_k, k2, c.scratch);
      Impl::linear_forward_impl<ExecSpace, T>(space, mem2, w.w_v, w.b_v, v2, c.scratch);
    }
    if (o.qk_norm) {
      qk_norm_forward(space, c.q_pre, w.q_norm, c.q, c.rstd_q);
      qk_norm_forward(space, c.k_pre, w.k_norm, c.k, c.rstd_k);
    }
    if (o.rotary && !q_in_split) {
      const out2 q_att = Impl::out_tokens(c.q);
      rotate(space, q_att, 0, q_att, 0, c.slice, o.heads, true, 1, pos);
    }
    if (o.rotary && !k_in_split) {
      const out2 k_att = Impl::out_tokens(c.k);
      rotate(space, k_att, 0, k_att, 0, c.slice_kv, o.kv_heads, true, 1, pos_kv);
    }
    if (o.axial_rotary) {
      rotate_axial(space, c.q, c.packed, c.slice, o.heads, 1);
      rotate_axial(space, c.k, c.packed, c.slice_kv, o.kv_heads, 1);
    }
    c.attention = o.attention;
    c.attention.dropout_seed = c.dropout_seed;
    if (!c.training) c.attention.dropout_p = 0;
    if (c.packed) {
      packed_attention(space, c, score_mod, false);
    } else {
      Impl::nn_attention_forward(space, o.sequence_parallel, c.q, c.k, c.v, c.o, c.lse,
                                 c.attention, score_mod);
    }
  }

  /// Self-attention (the block's entry): dx gets the gradients through q, k
  /// and v.
  template <class ScoreMod>
  void backward_impl(const ExecSpace& space, const in2& dy, const out2& dx, context_type& c,
                     const ScoreMod& score_mod) {
    attend_backward(space, dy, dx, dx, c, score_mod);
  }

  /// dx through q; dmem through k and v (dx itself for self-attention, which
  /// then adds them up); the parameter gradients into grads() or grads_fp32().
  template <class ScoreMod>
  void attend_backward(const ExecSpace& space, const in2& dy, const out2& dx, const out2& dmem,
                       context_type& c, const ScoreMod& score_mod) {
    if constexpr (Impl::nn_is_16bit<T>()) {
      if (fp32_grads()) {
        attend_backward_into(space, dy, dx, dmem, c, score_mod, m_grads_fp32);
        return;
      }
    }
    attend_backward_into(space, dy, dx, dmem, c, score_mod, m_grads);
  }

  template <class ScoreMod, class Grads>
  void attend_backward_into(const ExecSpace& space, const in2& dy, const out2& dx,
                            const out2& dmem, context_type& c, const ScoreMod& score_mod,
                            const Grads& g) {
    using G = typename Grads::value_type;
    const auto& o = m_options;
    const bool cross = c.cross;
    // The same kernels on the same inputs: bitwise the forward's tensors.
    if (o.recompute) attend_core(space, c.x, cross ? c.memory : c.x, c, cross, score_mod);
    const int batch = int(c.x.extent(0)), seqlen = int(c.x.extent(1)), tokens = batch * seqlen;
    const int seqlen_kv = int(c.k.extent(1)), tokens_kv = batch * seqlen_kv;
    const int hd = o.head_dim, q_cols = o.heads * hd, kv_cols = o.kv_heads * hd;
    Impl::nn_ensure(c.d_o, "kfa::nn::MultiHeadAttention::d_o", batch, seqlen, o.heads, hd);
    Impl::nn_ensure(c.dq, "kfa::nn::MultiHeadAttention::dq", batch, seqlen, o.heads, hd);
    Impl::nn_ensure(c.dk, "kfa::nn::MultiHeadAttention::dk", batch, seqlen_kv, o.kv_heads, hd);
    Impl::nn_ensure(c.dv, "kfa::nn::MultiHeadAttention::dv", batch, seqlen_kv, o.kv_heads, hd);
    const auto& w = m_weights;
    Impl::linear_backward_impl<ExecSpace, T, G>(space, Impl::in_tokens(c.o), w.w_o, dy,
                                                Impl::out_tokens(c.d_o), g.w_o, g.b_o, c.scratch);
    if (c.packed) {
      packed_attention(space, c, score_mod, true);
    } else {
      Impl::nn_attention_backward(space, o.sequence_parallel, c.q, c.k, c.v, c.o, c.lse, c.d_o,
                                  c.dq, c.dk, c.dv, c.attention, score_mod);
    }
    const Kokkos::View<const int*, memory_space> pos =
        c.packed ? c.positions : Kokkos::View<int*, memory_space>();
    const Kokkos::View<const int*, memory_space> pos_kv = c.packed && cross ? c.positions_kv : pos;
    const in2 x2 = Impl::in_matrix(c.x), mem2 = cross ? Impl::in_matrix(c.memory) : x2;
    const bool q_in_split = q_rotates_in_split(cross), k_in_split = k_rotates_in_split();
    if (o.rotary && !q_in_split) {
      const out2 dq_att = Impl::out_tokens(c.dq);
      rotate(space, dq_att, 0, dq_att, 0, c.slice, o.heads, true, -1, pos);
    }
    if (o.rotary && !k_in_split) {
      const out2 dk_att = Impl::out_tokens(c.dk);
      rotate(space, dk_att, 0, dk_att, 0, c.slice_kv, o.kv_heads, true, -1, pos_kv);
    }
    if (o.axial_rotary) {
      rotate_axial(space, c.dq, c.packed, c.slice, o.heads, -1);
      rotate_axial(space, c.dk, c.packed, c.slice_kv, o.kv_heads, -1);
    }
    if (o.qk_norm) {
      Impl::nn_ensure(c.dq_pre, "kfa::nn::MultiHeadAttention::dq_pre", batch, seqlen, o.heads, hd);
      Impl::nn_ensure(c.dk_pre, "kfa::nn::MultiHeadAttention::dk_pre", batch, seqlen_kv,
                      o.kv_heads, hd);
      qk_norm_backward(space, c.q_pre, w.q_norm, c.rstd_q, c.dq, c.dq_pre, g.q_norm);
      qk_norm_backward(space, c.k_pre, w.k_norm, c.rstd_k, c.dk, c.dk_pre, g.k_norm);
    }
    // The gradients of the projections' q and k.
    const out2 dq2 = Impl::out_tokens(o.qk_norm ? c.dq_pre : c.dq),
               dk2 = Impl::out_tokens(o.qk_norm ? c.dk_pre : c.dk),
               dv2 = Impl::out_tokens(c.dv);
    if (o.fused_qkv && !cross) {
      // The inverse rotations write straight into the fused gradient.
      Impl::nn_ensure(c.dqkv, "kfa::nn::MultiHeadAttention::dqkv", tokens, q_cols + 2 * kv_cols);
      rotate(space, dq2, 0, c.dqkv, 0, c.slice, o.heads, q_in_split, -1, pos);
      rotate(space, dk2, 0, c.dqkv, q_cols, c.slice, o.kv_heads, k_in_split, -1, pos);
      rotate(space, dv2, 0, c.dqkv, q_cols + kv_cols, c.slice, o.kv_heads, false, -1, pos);
      Impl::linear_backward_impl<ExecSpace, T, G>(space, x2, w.w_qkv, c.dqkv, dx, g.w_qkv,
                                                  g.b_qkv, c.scratch);
    } else if (o.fused_qkv) {
      Impl::nn_ensure(c.dkv, "kfa::nn::MultiHeadAttention::dkv", tokens_kv, 2 * kv_cols);
      rotate(space, dk2, 0, c.dkv, 0, c.slice_kv, o.kv_heads, k_in_split, -1, pos_kv);
      rotate(space, dv2, 0, c.dkv, kv_cols, c.slice_kv, o.kv_heads, false, -1, pos_kv);
      Impl::linear_backward_impl<ExecSpace, T, G>(space, x2, weight_rows(w.w_qkv, 0, q_cols),
                                                  dq2, dx, grad_rows(g.w_qkv, 0, q_cols),
                                                  vector_rows(g.b_qkv, 0, q_cols), c.scratch);
      Impl::linear_backward_impl<ExecSpace, T, G>(
          space, mem2, weight_rows(w.w_qkv, q_cols, 2 * kv_cols), c.dkv, dmem,
          grad_rows(g.w_qkv, q_cols, 2 * kv_cols), vector_rows(g.b_qkv, q_cols, 2 * kv_cols),
          c.scratch);
    } else {
      Impl::linear_backward_impl<ExecSpace, T, G>(space, x2, w.w_q, dq2, dx, g.w_q, g.b_q,
                                                  c.scratch);
      Impl::linear_backward_impl<ExecSpace, T, G>(space, mem2, w.w_k, dk2, dmem, g.w_k, g.b_k,
                                                  c.scratch, !cross);
      Impl::linear_backward_impl<ExecSpace, T, G>(space, mem2, w.w_v, dv2, dmem, g.w_v, g.b_v,
                                                  c.scratch, true);
    }
    if (o.recompute) release(c);
  }

  MultiHeadAttentionOptions m_options;
  Weights m_weights, m_grads;
  Fp32Grads m_grads_fp32;
  /// kfa::nn::alibi_slopes(heads) under options.alibi.
  Kokkos::View<double*, memory_space> m_alibi_slopes;
};

}  // namespace nn
}  // namespace kfa

#endif
