#ifndef KFA_NN_LAYER_ORACLES_HPP
#define KFA_NN_LAYER_ORACLES_HPP

// The fp64 host oracles of kfa::nn::MultiHeadAttention,
// kfa::nn::TransformerBlock and kfa::nn::TransformerDecoderBlock, composed from the step oracles of
// nn_test_helpers.hpp and the attention oracle of kfa_test_helpers.hpp, and
// the host copies of the layers' parameters they run on. With `store` set,
// an oracle rounds every tensor where the layer stores one in its value
// type: the plain same-precision implementation of FlashAttention's error
// rule for the 16-bit layers.

#include "nn_test_helpers.hpp"

#include <string>
#include <vector>

namespace kfa_test {

inline Tensor reshaped(Tensor t, std::vector<int> ext) {
  t.ext = std::move(ext);
  return t;
}

/// Rows [r0, r1) of a [rows][cols] tensor (or of a vector).
inline Tensor row_range(const Tensor& t, int r0, int r1) {
  if (t.data.empty()) return Tensor();
  const int cols = t.ext.size() == 1 ? 1 : t.ext[1];
  Tensor r(t.ext.size() == 1 ? std::vector<int>{r1 - r0} : std::vector<int>{r1 - r0, cols});
  std::copy(t.data.begin() + std::size_t(r0) * cols, t.data.begin() + std::size_t(r1) * cols,
            r.data.begin());
  return r;
}

inline Tensor added(Tensor a, const Tensor& b) {
  for (std::size_t n = 0; n < a.data.size(); ++n) a.data[n] += b.data[n];
  return a;
}

inline Tensor zeros_like(const Tensor& t) { return t.data.empty() ? Tensor() : Tensor(t.ext); }

/// The attention layer's parameters on the host, q/k/v split.
struct MhaParams {
  Tensor wq, wk, wv, wo, bq, bk, bv, bo, qn, kn;
};

/// The parameters (or the gradients: grads_fp32() where the layer keeps
/// fp32 gradients, else grads()) of a layer's Tensors `w`.
template <class Options, class Tensors>
MhaParams mha_tensors(const Options& o, const Tensors& w) {
  MhaParams p;
  if (o.fused_qkv) {
    const int q = o.heads * o.head_dim, kv = o.kv_heads * o.head_dim;
    const Tensor w_qkv = param(w.w_qkv), b_qkv = param(w.b_qkv);
    p.wq = row_range(w_qkv, 0, q);
    p.wk = row_range(w_qkv, q, q + kv);
    p.wv = row_range(w_qkv, q + kv, q + 2 * kv);
    p.bq = row_range(b_qkv, 0, q);
    p.bk = row_range(b_qkv, q, q + kv);
    p.bv = row_range(b_qkv, q + kv, q + 2 * kv);
  } else {
    p.wq = param(w.w_q), p.wk = param(w.w_k), p.wv = param(w.w_v);
    p.bq = param(w.b_q), p.bk = param(w.b_k), p.bv = param(w.b_v);
  }
  p.wo = param(w.w_o);
  p.bo = param(w.b_o);
  p.qn = param(w.q_norm);
  p.kn = param(w.k_norm);
  return p;
}

template <class Layer>
MhaParams mha_params(const Layer& layer, bool grads) {
  if (!grads) return mha_tensors(layer.options(), layer.weights());
  if (layer.grads_fp32().w_o.size() > 0) return mha_tensors(layer.options(), layer.grads_fp32());
  return mha_tensors(layer.options(), layer.grads());
}

/// Oracle of MultiHeadAttention: forward y from x [tokens][d_model] (batch
/// B, seqlen S) and the memory [B·Skv][d_model_kv] (x for self-attention),
/// and with dy the backward: dx, dmemory and the parameter gradients.
struct MhaOracle {
  const kfa::nn::MultiHeadAttentionOptions& o;
  const MhaParams& p;
  int B, S;
  Tensor q, k, v, att, lse, y;
  Tensor q_pre, k_pre;  // before the qk-norm
  int Skv = 0;
  RefExtras extras;  // the score modifier
  /// Rounds a tensor the layer stores in its value type (null: fp64 throughout).
  Tensor (*store)(Tensor) = nullptr;

  Tensor st(Tensor t) const { return store != nullptr ? store(std::move(t)) : t; }

  Tensor heads4(const Tensor& t, int heads, int seqlen = 0) const {
    return reshaped(t, {B, seqlen > 0 ? seqlen : S, heads, o.head_dim});
  }
  /// [B][S][heads][head_dim] as rows of head_dim (the qk-norm's rows).
  Tensor head_rows(const Tensor& t) const {
    return reshaped(t, {int(t.data.size()) / o.head_dim, o.head_dim});
  }

  void forward(const Tensor& x) { forward(x, x, S); }

  void forward(const Tensor& x, const Tensor& memory, int seqlen_kv) {
    Skv = seqlen_kv;
    q = st(heads4(ref_linear(x, p.wq, p.bq), o.heads));
    k = st(heads4(ref_linear(memory, p.wk, p.bk), o.kv_heads, Skv));
    v = st(heads4(ref_linear(memory, p.wv, p.bv), o.kv_heads, Skv));
    if (o.qk_norm) {
      q_pre = q;
      k_pre = k;
      const double eps = o.qk_norm_options.eps;
      q = st(heads4(ref_norm(head_rows(q_pre), p.qn, Tensor(), eps, true), o.heads));
      k = st(heads4(ref_norm(head_rows(k_pre), p.kn, Tensor(), eps, true), o.kv_heads, Skv));
    }
    if (o.rotary) {
      q = st(ref_rotary(q, o.rotary_options, 1));
      k = st(ref_rotary(k, o.rotary_options, 1));
    }
    if (o.axial_rotary) {
      q = st(ref_axial_rotary(q, o.axial_rotary_options, 1));
      k = st(ref_axial_rotary(k, o.axial_rotary_options, 1));
    }
    reference_forward(q, k, v, o.attention, att, lse, extras);
    att = st(att);
    y = st(ref_linear(reshaped(att, {B * S, o.heads * o.head_dim}), p.wo, p.bo));
  }

  /// dx (written) and grads (accumulated, shaped like p).
  void backward(const Tensor& x, const Tensor& dy, Tensor& dx, MhaParams& g) const {
    Tensor dmemory;
    backward(x, x, dy, dx, dmemory, g);
    dx = st(added(dx, dmemory));
  }

  void backward(const Tensor& x, const Tensor& memory, const Tensor& dy, Tensor& dx,
                Tensor& dmemory, MhaParams& g) const {
    Tensor d_att, dq, dk, dv, dmv;
    ref_linear_backward(reshaped(att, {B * S, o.heads * o.head_dim}), p.wo, dy, d_att, g.wo, g.bo);
    d_att = st(d_att);
    reference_backward<double, true>(q, k, v, att, lse, heads4(d_att, o.heads), o.attention, dq,
                                     dk, dv, extras);
    dq = st(dq), dk = st(dk), dv = st(dv);
    if (o.rotary) {
      dq = st(ref_rotary(dq, o.rotary_options, -1));
      dk = st(ref_rotary(dk, o.rotary_options, -1));
    }
    if (o.axial_rotary) {
      dq = st(ref_axial_rotary(dq, o.axial_rotary_options, -1));
      dk = st(ref_axial_rotary(dk, o.axial_rotary_options, -1));
    }
    if (o.qk_norm) {
      Tensor dq_pre, dk_pre, no_beta;
      const double eps = o.qk_norm_options.eps;
      ref_norm_backward(head_rows(q_pre), p.qn, eps, true, head_rows(dq), dq_pre, g.qn, no_beta);
      ref_norm_backward(head_rows(k_pre), p.kn, eps, true, head_rows(dk), dk_pre, g.kn, no_beta);
      dq = st(dq_pre);
      dk = st(dk_pre);
    }
    const int qc = o.heads * o.head_dim, kc = o.kv_heads * o.head_dim;
    ref_linear_backward(x, p.wq, reshaped(dq, {B * S, qc}), dx, g.wq, g.bq);
    ref_linear_backward(memory, p.wk, reshaped(dk, {B * Skv, kc}), dmemory, g.wk, g.bk);
    ref_linear_backward(memory, p.wv, reshaped(dv, {B * Skv, kc}), dmv, g.wv, g.bv);
    dmemory = added(dmemory, dmv);
    if (memory.data.data() != x.data.data()) {
      // Cross-attention: the layer stores dx and dmemory; self-attention
      // adds them first.
      dx = st(dx);
      dmemory = st(dmemory);
    }
  }
};

inline MhaParams zero_grads(const MhaParams& p) {
  return {zeros_like(p.wq), zeros_like(p.wk), zeros_like(p.wv), zeros_like(p.wo),
          zeros_like(p.bq), zeros_like(p.bk), zeros_like(p.bv), zeros_like(p.bo),
          zeros_like(p.qn), zeros_like(p.kn)};
}

template <class T>
void expect_mha_grads(const std::string& what, const MhaParams& got, const MhaParams& ref,
                      double factor) {
  expect_close_rel<T>(what + " d w_q", got.wq, ref.wq, factor);
  expect_close_rel<T>(what + " d w_k", got.wk, ref.wk, factor);
  expect_close_rel<T>(what + " d w_v", got.wv, ref.wv, factor);
  expect_close_rel<T>(what + " d w_o", got.wo, ref.wo, factor);
  expect_close_rel<T>(what + " d b_q", got.bq, ref.bq, factor);
  expect_close_rel<T>(what + " d b_k", got.bk, ref.bk, factor);
  expect_close_rel<T>(what + " d b_v", got.bv, ref.bv, factor);
  expect_close_rel<T>(what + " d b_o", got.bo, ref.bo, factor);
  expect_close_rel<T>(what + " d q_norm", got.qn, ref.qn, factor);
  expect_close_rel<T>(what + " d k_norm", got.kn, ref.kn, factor);
}

template <class List>
void randomize_parameters(const List& params, std::mt19937_64& rng) {
  for (const auto& p : params) {
    // Weights of O(1/sqrt(fan_in)) keep activations O(1); norm weights near 1.
    const bool vector = p.name.find("bias") != std::string::npos ||
                        p.name.find("norm") != std::string::npos;
    randomize(p.value, rng, vector ? 0.5 : 0.15);
    if (p.name.find("norm") != std::string::npos && p.name.find("weight") != std::string::npos) {
      auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), p.value);
      using T = typename decltype(host)::non_const_value_type;
      for (std::size_t n = 0; n < host.size(); ++n)
        host(n) = from_double<T>(to_double(host(n)) + 1);
      Kokkos::deep_copy(p.value, host);
    }
  }
}

/// The block's oracle, from the host copies of its parameters.
struct BlockOracle {
  const kfa::nn::TransformerBlockOptions& o;
  MhaOracle mha;
  Tensor n1w, n1b, n2w, n2b, w1, b1, w2, b2;
  Tensor h1, x1, h2, u, g, y;
  bool rms() const { return o.norm == kfa::nn::Norm::rms_norm; }
  double eps() const { return o.norm_options.eps; }

  Tensor st(Tensor t) const { return mha.st(std::move(t)); }

  void forward(const Tensor& x) {
    h1 = st(ref_norm(x, n1w, n1b, eps(), rms()));
    mha.forward(h1);
    x1 = st(added(x, mha.y));
    h2 = st(ref_norm(x1, n2w, n2b, eps(), rms()));
    u = st(ref_linear(h2, w1, b1));
    g = st(ref_activation(u, o.activation));
    y = st(added(x1, st(ref_linear(g, w2, b2))));
  }

  /// dx and every gradient (the block's in `grads`, the attention's in `mg`).
  void backward(const Tensor& x, const Tensor& dy, Tensor& dx, std::vector<Tensor*> grads,
                MhaParams& mg) const {
    Tensor& dn1w = *grads[0]; Tensor& dn1b = *grads[1]; Tensor& dn2w = *grads[2];
    Tensor& dn2b = *grads[3]; Tensor& dw1 = *grads[4]; Tensor& db1 = *grads[5];
    Tensor& dw2 = *grads[6]; Tensor& db2 = *grads[7];
    Tensor dg, dh2, dx1n, dh1, dxn;
    ref_linear_backward(g, w2, dy, dg, dw2, db2);
    dg = st(dg);
    const Tensor du = st(ref_activation_backward(u, dg, o.activation));
    ref_linear_backward(h2, w1, du, dh2, dw1, db1);
    dh2 = st(dh2);
    ref_norm_backward(x1, n2w, eps(), rms(), dh2, dx1n, dn2w, dn2b);
    const Tensor dx1 = st(added(dy, dx1n));
    mha.backward(h1, dx1, dh1, mg);
    ref_norm_backward(x, n1w, eps(), rms(), dh1, dxn, dn1w, dn1b);
    dx = st(added(dx1, dxn));
  }
};

template <class Tensors>
std::vector<Tensor> block_tensor_list(const Tensors& w) {
  return {param(w.norm1_weight), param(w.norm1_bias), param(w.norm2_weight), param(w.norm2_bias),
          param(w.w1),           param(w.b1),         param(w.w2),           param(w.b2)};
}

/// The block's own parameters (or gradients, fp32 where it keeps them so).
template <class Block>
std::vector<Tensor> block_tensors(const Block& block, bool grads) {
  if (!grads) return block_tensor_list(block.weights());
  if (block.grads_fp32().w1.size() > 0) return block_tensor_list(block.grads_fp32());
  return block_tensor_list(block.grads());
}

/// The decoder block's oracle, from the host copies of its parameters: the
/// self-attention oracle on norm1(x), the cross-attention oracle on
/// (norm2(x1), memory), the MLP on norm3(x2).
struct DecoderOracle {
  const kfa::nn::TransformerDecoderBlockOptions& o;
  MhaOracle self_mha, cross_mha;
  /// norm1..3 weight and bias, w1, b1, w2, b2 (decoder_tensor_list's order).
  std::vector<Tensor> w;
  int Skv = 0;
  Tensor h1, x1, h2, x2, h3, u, g, y;
  bool rms() const { return o.norm == kfa::nn::Norm::rms_norm; }
  double eps() const { return o.norm_options.eps; }

  Tensor st(Tensor t) const { return self_mha.st(std::move(t)); }

  void forward(const Tensor& x, const Tensor& memory) {
    h1 = st(ref_norm(x, w[0], w[1], eps(), rms()));
    self_mha.forward(h1);
    x1 = st(added(x, self_mha.y));
    h2 = st(ref_norm(x1, w[2], w[3], eps(), rms()));
    cross_mha.forward(h2, memory, Skv);
    x2 = st(added(x1, cross_mha.y));
    h3 = st(ref_norm(x2, w[4], w[5], eps(), rms()));
    u = st(ref_linear(h3, w[6], w[7]));
    g = st(ref_activation(u, o.activation));
    y = st(added(x2, st(ref_linear(g, w[8], w[9]))));
  }

  /// dx, dmemory and every gradient (the block's in `grads`, accumulated,
  /// shaped like w; the attentions' in sg and cg).
  void backward(const Tensor& x, const Tensor& memory, const Tensor& dy, Tensor& dx,
                Tensor& dmemory, std::vector<Tensor>& grads, MhaParams& sg, MhaParams& cg) const {
    Tensor dg, dh3, dx2n, dh2, dx1n, dh1, dxn;
    ref_linear_backward(g, w[8], dy, dg, grads[8], grads[9]);
    dg = st(dg);
    const Tensor du = st(ref_activation_backward(u, dg, o.activation));
    ref_linear_backward(h3, w[6], du, dh3, grads[6], grads[7]);
    dh3 = st(dh3);
    ref_norm_backward(x2, w[4], eps(), rms(), dh3, dx2n, grads[4], grads[5]);
    const Tensor dx2 = st(added(dy, dx2n));
    cross_mha.backward(h2, memory, dx2, dh2, dmemory, cg);
    ref_norm_backward(x1, w[2], eps(), rms(), dh2, dx1n, grads[2], grads[3]);
    const Tensor dx1 = st(added(dx2, dx1n));
    self_mha.backward(h1, dx1, dh1, sg);
    ref_norm_backward(x, w[0], eps(), rms(), dh1, dxn, grads[0], grads[1]);
    dx = st(added(dx1, dxn));
  }
};

template <class Tensors>
std::vector<Tensor> decoder_tensor_list(const Tensors& w) {
  return {param(w.norm1_weight), param(w.norm1_bias), param(w.norm2_weight),
          param(w.norm2_bias),   param(w.norm3_weight), param(w.norm3_bias),
          param(w.w1),           param(w.b1),           param(w.w2),
          param(w.b2)};
}

/// The decoder block's own parameters (or gradients, fp32 where it keeps
/// them so), in DecoderOracle's order.
template <class Block>
std::vector<Tensor> decoder_tensors(const Block& block, bool grads) {
  if (!grads) return decoder_tensor_list(block.weights());
  if (block.grads_fp32().w1.size() > 0) return decoder_tensor_list(block.grads_fp32());
  return decoder_tensor_list(block.grads());
}

/// ALiBi as the reference applies it: score - slope(h)·|i + Skv - S - j|.
inline RefExtras alibi_extras(int heads) {
  RefExtras e;
  const std::vector<double> slopes = kfa::nn::alibi_slopes(heads);
  e.mod = [slopes](int, int h, int i, int j, double s, int sq, int sk) {
    return s - slopes[h] * std::abs(i + sk - sq - j);
  };
  return e;
}

/// Random parameters of `layer` (seeded by tag) and random x, dy (rounded
/// to T) of `shape`, as device Views of type V with poisoned y and dx.
template <class V>
struct RandomIo {
  Tensor x, dy;
  V xv, dyv, yv, dxv;

  template <class Layer>
  RandomIo(const Layer& layer, const std::string& tag, const std::vector<int>& shape) {
    std::mt19937_64 rng(test_seed(tag));
    randomize_parameters(layer.parameters(), rng);
    x = rounded<typename V::non_const_value_type>(random_tensor(shape, rng));
    dy = rounded<typename V::non_const_value_type>(random_tensor(shape, rng));
    xv = make_view<V>(x, "x");
    dyv = make_view<V>(dy, "dy");
    yv = make_view<V>(Tensor(shape), "y");
    dxv = make_view<V>(Tensor(shape), "dx");
    poison(yv);
    poison(dxv);
  }
};

}  // namespace kfa_test

#endif
