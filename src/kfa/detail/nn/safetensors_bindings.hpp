#ifndef KFA_DETAIL_NN_SAFETENSORS_BINDINGS_HPP
#define KFA_DETAIL_NN_SAFETENSORS_BINDINGS_HPP

// Which file tensor holds which rows of which layer View, under each naming
// scheme. Load and save walk the same list, so the two cannot disagree; a
// fused View can be several file tensors (Llama's q_proj, k_proj, v_proj are
// row ranges of w_qkv, gate_proj and up_proj of the SwiGLU w1).

#include <kfa/nn/multi_head_attention.hpp>
#include <kfa/nn/transformer_block.hpp>
#include <kfa/nn/transformer_decoder_block.hpp>

#include <cstddef>
#include <string>
#include <vector>

namespace kfa {
namespace Impl {

/// Rows [row0, row0 + shape[0]) of a layer's View as one file tensor
/// (flat, over the rows' contiguous storage).
template <class T, class MemorySpace>
struct SafetensorsBinding {
  using view_type =
      Kokkos::View<T*, Kokkos::LayoutRight, MemorySpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  std::string name;
  std::vector<std::size_t> shape;
  view_type values;
};

template <class T, class MemorySpace>
using SafetensorsBindings = std::vector<SafetensorsBinding<T, MemorySpace>>;

/// Appends rows [row0, row0 + rows) of `view` (rank 1 or 2; rows < 0: all)
/// under `name`; an empty View (an absent bias) adds nothing.
template <class T, class MemorySpace, class ViewType>
void safetensors_bind(SafetensorsBindings<T, MemorySpace>& list, const std::string& name,
                      const ViewType& view, int row0 = 0, int rows = -1) {
  if (view.size() == 0) return;
  const std::size_t n = rows < 0 ? view.extent(0) : std::size_t(rows);
  const std::size_t cols = ViewType::rank == 2 ? view.extent(1) : 1;
  std::vector<std::size_t> shape{n};
  if (ViewType::rank == 2) shape.push_back(cols);
  using view_type = typename SafetensorsBinding<T, MemorySpace>::view_type;
  list.push_back({name, shape, view_type(view.data() + std::size_t(row0) * cols, n * cols)});
}

template <class ExecSpace, class T>
SafetensorsBindings<T, typename ExecSpace::memory_space> safetensors_bindings(
    const nn::MultiHeadAttention<ExecSpace, T>& layer, bool llama, const std::string& prefix) {
  SafetensorsBindings<T, typename ExecSpace::memory_space> list;
  const auto& w = layer.weights();
  const auto& o = layer.options();
  if (!llama) {
    // The names of parameters() (a test checks that the two lists agree).
    safetensors_bind(list, prefix + "in_proj_weight", w.w_qkv);
    safetensors_bind(list, prefix + "in_proj_bias", w.b_qkv);
    safetensors_bind(list, prefix + "q_proj.weight", w.w_q);
    safetensors_bind(list, prefix + "q_proj.bias", w.b_q);
    safetensors_bind(list, prefix + "k_proj.weight", w.w_k);
    safetensors_bind(list, prefix + "k_proj.bias", w.b_k);
    safetensors_bind(list, prefix + "v_proj.weight", w.w_v);
    safetensors_bind(list, prefix + "v_proj.bias", w.b_v);
    safetensors_bind(list, prefix + "out_proj.weight", w.w_o);
    safetensors_bind(list, prefix + "out_proj.bias", w.b_o);
    safetensors_bind(list, prefix + "q_norm.weight", w.q_norm);
    safetensors_bind(list, prefix + "k_norm.weight", w.k_norm);
    return list;
  }
  const int q_rows = o.heads * o.head_dim, kv_rows = o.kv_heads * o.head_dim;
  const char* proj[] = {"q_proj", "k_proj", "v_proj"};
  const int row0[] = {0, q_rows, q_rows + kv_rows}, rows[] = {q_rows, kv_rows, kv_rows};
  for (int n = 0; n < 3; ++n) {
    const std::string name = prefix + proj[n];
    if (o.fused_qkv) {
      safetensors_bind(list, name + ".weight", w.w_qkv, row0[n], rows[n]);
      safetensors_bind(list, name + ".bias", w.b_qkv, row0[n], rows[n]);
    } else {
      const decltype(w.w_q)* weight[] = {&w.w_q, &w.w_k, &w.w_v};
      const decltype(w.b_q)* bias[] = {&w.b_q, &w.b_k, &w.b_v};
      safetensors_bind(list, name + ".weight", *weight[n]);
      safetensors_bind(list, name + ".bias", *bias[n]);
    }
  }
  safetensors_bind(list, prefix + "o_proj.weight", w.w_o);
  safetensors_bind(list, prefix + "o_proj.bias", w.b_o);
  // Qwen3's names (Hugging Face Llama has no qk-norm).
  safetensors_bind(list, prefix + "q_norm.weight", w.q_norm);
  safetensors_bind(list, prefix + "k_norm.weight", w.k_norm);
  return list;
}

template <class ExecSpace, class T>
SafetensorsBindings<T, typename ExecSpace::memory_space> safetensors_bindings(
    const nn::TransformerBlock<ExecSpace, T>& block, bool llama, const std::string& prefix) {
  auto list = safetensors_bindings(block.attention(), llama, prefix + "self_attn.");
  const auto& w = block.weights();
  const auto& o = block.options();
  if (!llama) {
    safetensors_bind(list, prefix + "linear1.weight", w.w1);
    safetensors_bind(list, prefix + "linear1.bias", w.b1);
    safetensors_bind(list, prefix + "linear2.weight", w.w2);
    safetensors_bind(list, prefix + "linear2.bias", w.b2);
    safetensors_bind(list, prefix + "norm1.weight", w.norm1_weight);
    safetensors_bind(list, prefix + "norm1.bias", w.norm1_bias);
    safetensors_bind(list, prefix + "norm2.weight", w.norm2_weight);
    safetensors_bind(list, prefix + "norm2.bias", w.norm2_bias);
    return list;
  }
  const std::string mlp = prefix + "mlp.";
  if (o.activation == nn::Activation::swiglu) {
    // w1 stacks the gate rows over the up rows.
    safetensors_bind(list, mlp + "gate_proj.weight", w.w1, 0, o.d_ff);
    safetensors_bind(list, mlp + "gate_proj.bias", w.b1, 0, o.d_ff);
    safetensors_bind(list, mlp + "up_proj.weight", w.w1, o.d_ff, o.d_ff);
    safetensors_bind(list, mlp + "up_proj.bias", w.b1, o.d_ff, o.d_ff);
  } else {
    safetensors_bind(list, mlp + "up_proj.weight", w.w1);
    safetensors_bind(list, mlp + "up_proj.bias", w.b1);
  }
  safetensors_bind(list, mlp + "down_proj.weight", w.w2);
  safetensors_bind(list, mlp + "down_proj.bias", w.b2);
  safetensors_bind(list, prefix + "input_layernorm.weight", w.norm1_weight);
  safetensors_bind(list, prefix + "input_layernorm.bias", w.norm1_bias);
  safetensors_bind(list, prefix + "post_attention_layernorm.weight", w.norm2_weight);
  safetensors_bind(list, prefix + "post_attention_layernorm.bias", w.norm2_bias);
  return list;
}

/// torch.nn.TransformerDecoderLayer's names (the decoder's parameters());
/// Llama has no cross-attention sublayer to take names from.
template <class ExecSpace, class T>
SafetensorsBindings<T, typename ExecSpace::memory_space> safetensors_bindings(
    const nn::TransformerDecoderBlock<ExecSpace, T>& block, bool llama, const std::string& prefix) {
  if (llama) {
    throw_invalid("kfa::nn::TransformerDecoderBlock",
                  "ParameterNames::llama has no names for a decoder block's cross-attention; "
                  "use ParameterNames::pytorch (torch.nn.TransformerDecoderLayer's names)");
  }
  auto list = safetensors_bindings(block.self_attention(), false, prefix + "self_attn.");
  const auto cross =
      safetensors_bindings(block.cross_attention(), false, prefix + "multihead_attn.");
  list.insert(list.end(), cross.begin(), cross.end());
  const auto& w = block.weights();
  safetensors_bind(list, prefix + "linear1.weight", w.w1);
  safetensors_bind(list, prefix + "linear1.bias", w.b1);
  safetensors_bind(list, prefix + "linear2.weight", w.w2);
  safetensors_bind(list, prefix + "linear2.bias", w.b2);
  safetensors_bind(list, prefix + "norm1.weight", w.norm1_weight);
  safetensors_bind(list, prefix + "norm1.bias", w.norm1_bias);
  safetensors_bind(list, prefix + "norm2.weight", w.norm2_weight);
  safetensors_bind(list, prefix + "norm2.bias", w.norm2_bias);
  safetensors_bind(list, prefix + "norm3.weight", w.norm3_weight);
  safetensors_bind(list, prefix + "norm3.bias", w.norm3_bias);
  return list;
}

}  // namespace Impl
}  // namespace kfa

#endif
