#ifndef KFA_DETAIL_NN_BLOCK_PARTS_HPP
#define KFA_DETAIL_NN_BLOCK_PARTS_HPP

// What the pre-norm blocks (TransformerBlock, TransformerDecoderBlock) build
// around their attention sublayers: LayerNorm or RMSNorm, residual + dropout
// with per-site seeds, the MLP sublayer forward and backward, the allocation
// of their norm and MLP parameters and the checks of the options they share.

#include <kfa/nn/options.hpp>
#include <kfa/types.hpp>

#include <kfa/detail/nn/checks.hpp>
#include <kfa/detail/nn/elementwise_kernels.hpp>
#include <kfa/detail/nn/layer_support.hpp>
#include <kfa/detail/nn/linear_impl.hpp>
#include <kfa/detail/nn/norm_kernels.hpp>
#include <kfa/detail/nn/sequence_parallel.hpp>

#include <cmath>
#include <cstdint>
#include <string>

namespace kfa {
namespace Impl {

/// Dropout sites of a block, each with its own seed derived from the call's;
/// the encoder block has the first four, so its masks do not depend on the
/// decoder's existence.
enum NnBlockSite {
  kSiteAttentionWeights,
  kSiteAttentionOutput,
  kSiteActivation,
  kSiteMlpOutput,
  kSiteCrossAttentionWeights,
  kSiteCrossAttentionOutput
};

/// The norms and the MLP of a pre-norm block, configured from its options:
///   mlp(h) = W2·dropout(act(W1·h + b1)) + b2,  y = residual + dropout(mlp(h)).
/// Kernels are labelled `name`::<step>.
template <class ExecSpace, class T>
class NnBlockParts {
 public:
  using memory_space = typename ExecSpace::memory_space;
  using in1 = NnIn1<T, memory_space>;
  using in2 = NnIn2<T, memory_space>;
  using out2 = NnOut2<T, memory_space>;
  using in1_acc = NnIn1<accumulator_t<T>, memory_space>;
  using out1_acc = NnOut1<accumulator_t<T>, memory_space>;

  NnBlockParts(const char* name, nn::Norm norm, const nn::NormOptions& norm_options,
               nn::Activation activation, int d_ff, bool bias, double dropout_p)
      : m_name(name),
        m_norm(norm),
        m_eps(norm_options.eps),
        m_activation(activation),
        m_d_ff(d_ff),
        m_bias(bias),
        m_dropout_p(dropout_p) {}

  /// The checks of the options every block has (`function` names the block).
  static void check_options(const char* function, int d_ff, const nn::NormOptions& norm_options,
                            double dropout_p) {
    if (d_ff <= 0) {
      throw_invalid(function, "options.d_ff must be > 0, got " + std::to_string(d_ff));
    }
    if (!(norm_options.eps >= 0) || !std::isfinite(norm_options.eps)) {
      throw_invalid(function, "options.norm_options.eps must be finite and >= 0");
    }
    check_dropout_p(function, "options.dropout_p", dropout_p);
  }

  /// Rows of W1: SwiGLU stacks the gate rows over the up rows.
  int mlp_rows() const { return m_activation == nn::Activation::swiglu ? 2 * m_d_ff : m_d_ff; }

  /// The dropout of `site` in a call seeded `seed`; off outside training.
  nn::DropoutOptions dropout(bool training, std::uint64_t seed, int site) const {
    return {training ? m_dropout_p : 0.0, nn_site_seed(seed, site)};
  }

  /// y = residual + dropout(x) (no residual: dropout(x), also dropout's
  /// backward). The masks are keyed by the tokens' places in the whole batch
  /// (`slice`, from the attention's forward), which differ from the local
  /// rows in the sequence-parallel mode.
  void residual_dropout(const ExecSpace& space, const char* step, const in2& residual,
                        const in2& x, const out2& y, const nn::DropoutOptions& dropout,
                        const NnSequenceSlice& slice) const {
    residual_dropout_impl<ExecSpace, T>(space, label(step).c_str(), residual, x, y, dropout,
                                        {slice.seqlen, slice.seqlen_global, slice.offset});
  }

  /// A norm's weight [d_model] and, for LayerNorm with biases, its shift.
  template <class V>
  void allocate_norm(Kokkos::View<V*, Kokkos::LayoutRight, memory_space>& weight,
                     Kokkos::View<V*, Kokkos::LayoutRight, memory_space>& bias,
                     const std::string& prefix, int d_model) const {
    using view1 = Kokkos::View<V*, Kokkos::LayoutRight, memory_space>;
    weight = view1(label(prefix + "_weight"), d_model);
    if (m_bias && m_norm == nn::Norm::layer_norm) bias = view1(label(prefix + "_bias"), d_model);
  }

  /// w1 [mlp_rows][d_model], w2 [d_model][d_ff] and with biases b1, b2;
  /// `prefix` tells parameters from gradients in the labels.
  template <class V>
  void allocate_mlp(Kokkos::View<V**, Kokkos::LayoutRight, memory_space>& w1,
                    Kokkos::View<V*, Kokkos::LayoutRight, memory_space>& b1,
                    Kokkos::View<V**, Kokkos::LayoutRight, memory_space>& w2,
                    Kokkos::View<V*, Kokkos::LayoutRight, memory_space>& b2,
                    const std::string& prefix, int d_model) const {
    using view1 = Kokkos::View<V*, Kokkos::LayoutRight, memory_space>;
    using view2 = Kokkos::View<V**, Kokkos::LayoutRight, memory_space>;
    w1 = view2(label(prefix + "w1"), mlp_rows(), d_model);
    w2 = view2(label(prefix + "w2"), d_model, m_d_ff);
    if (m_bias) {
      b1 = view1(label(prefix + "b1"), mlp_rows());
      b2 = view1(label(prefix + "b2"), d_model);
    }
  }

  void norm_forward(const ExecSpace& space, const in2& x, const in1& gamma, const in1& beta,
                    const out2& y, const out1_acc& mean, const out1_acc& rstd) const {
    if (m_norm == nn::Norm::rms_norm)
      norm_forward_impl<ExecSpace, T, true>(space, x, gamma, beta, y, mean, rstd, m_eps);
    else
      norm_forward_impl<ExecSpace, T, false>(space, x, gamma, beta, y, mean, rstd, m_eps);
  }

  /// dx += the norm's backward (dx holds the residual's gradient already);
  /// dgamma, dbeta (of T or fp32) accumulated.
  template <class G>
  void norm_backward(const ExecSpace& space, const in2& x, const in1& gamma, const in1_acc& mean,
                     const in1_acc& rstd, const in2& dy, const out2& dx,
                     const NnOut1<G, memory_space>& dgamma,
                     const NnOut1<G, memory_space>& dbeta) const {
    if (m_norm == nn::Norm::rms_norm)
      norm_backward_impl<ExecSpace, T, true, G>(space, x, gamma, mean, rstd, dy, dx, dgamma, dbeta,
                                                true);
    else
      norm_backward_impl<ExecSpace, T, false, G>(space, x, gamma, mean, rstd, dy, dx, dgamma,
                                                 dbeta, true);
  }

  /// y = residual + dropout(W2·g + b2), g = dropout(act(u)), u = W1·h + b1;
  /// u and g are saved for the backward; y must not overlap residual (the
  /// product is written into y before the residual is added).
  void mlp_forward(const ExecSpace& space, const in2& h, const in2& w1, const in1& b1,
                   const in2& w2, const in1& b2, const out2& u, const out2& g,
                   const in2& residual, const out2& y, bool training, std::uint64_t seed,
                   const NnSequenceSlice& slice, NnScratch<ExecSpace, T>& scratch) const {
    linear_forward_impl<ExecSpace, T>(space, h, w1, b1, u, scratch);
    if (m_activation == nn::Activation::swiglu)
      swiglu_forward_impl<ExecSpace, T>(space, u, g);
    else
      gelu_forward_impl<ExecSpace, T>(space, u, g, m_activation == nn::Activation::gelu_tanh);
    residual_dropout(space, "mlp_dropout", {}, g, g, dropout(training, seed, kSiteActivation),
                     slice);
    linear_forward_impl<ExecSpace, T>(space, g, w2, b2, y, scratch);
    residual_dropout(space, "mlp_residual", residual, y, y,
                     dropout(training, seed, kSiteMlpOutput), slice);
  }

  /// The MLP's backward from dy (the gradient of the block's output): dh
  /// written, dm, dg, du workspaces, the W1, b1, W2, b2 gradients (of G)
  /// accumulated.
  template <class G>
  void mlp_backward(const ExecSpace& space, const in2& h, const in2& w1, const in2& w2,
                    const in2& u, const in2& g, const in2& dy, const out2& dm, const out2& dg,
                    const out2& du, const out2& dh, const NnOut2<G, memory_space>& dw1,
                    const NnOut1<G, memory_space>& db1, const NnOut2<G, memory_space>& dw2,
                    const NnOut1<G, memory_space>& db2, bool training, std::uint64_t seed,
                    const NnSequenceSlice& slice, NnScratch<ExecSpace, T>& scratch) const {
    residual_dropout(space, "mlp_residual_backward", {}, dy, dm,
                     dropout(training, seed, kSiteMlpOutput), slice);
    linear_backward_impl<ExecSpace, T, G>(space, g, w2, dm, dg, dw2, db2, scratch);
    residual_dropout(space, "mlp_dropout_backward", {}, dg, dg,
                     dropout(training, seed, kSiteActivation), slice);
    if (m_activation == nn::Activation::swiglu)
      swiglu_backward_impl<ExecSpace, T>(space, u, dg, du);
    else
      gelu_backward_impl<ExecSpace, T>(space, u, dg, du,
                                       m_activation == nn::Activation::gelu_tanh);
    linear_backward_impl<ExecSpace, T, G>(space, h, w1, du, dh, dw1, db1, scratch);
  }

  std::string label(const std::string& step) const { return m_name + "::" + step; }

 private:
  std::string m_name;
  nn::Norm m_norm;
  double m_eps;
  nn::Activation m_activation;
  int m_d_ff;
  bool m_bias;
  double m_dropout_p;
};

}  // namespace Impl
}  // namespace kfa

#endif
