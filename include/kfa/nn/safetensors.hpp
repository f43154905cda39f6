#ifndef KFA_NN_SAFETENSORS_HPP
#define KFA_NN_SAFETENSORS_HPP

#include <kfa/kfa_config.hpp>

#if !KFA_ENABLE_SAFETENSORS
#error "kfa was configured with KFA_ENABLE_SAFETENSORS=OFF: kfa/nn/safetensors.hpp is not available"
#endif

#include <kfa/nn/multi_head_attention.hpp>
#include <kfa/nn/transformer_block.hpp>
#include <kfa/nn/transformer_decoder_block.hpp>

#include <kfa/detail/common/compat.hpp>
#include <kfa/detail/nn/checks.hpp>
#include <kfa/detail/nn/safetensors_bindings.hpp>
#include <kfa/detail/nn/safetensors_io.hpp>

#include <cstddef>
#include <map>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace kfa {
namespace Impl {

/// The dtype name of T in a file (the layers' value types; kfa::half and
/// kfa::bfloat16 are written as their binary16 and bfloat16 bits, where they
/// are not float itself).
template <class T>
const char* safetensors_dtype() {
  if (std::is_same<T, double>::value) return "F64";
  if (std::is_same<T, float>::value) return "F32";
  if (std::is_same<T, bfloat16>::value) return "BF16";
  return "F16";
}

/// Reads `tensor` converted to T into `out` (numel values): directly for
/// double and float, through float for the 16-bit types (exact from their own
/// dtype, rounded to nearest from wider ones).
template <class T>
void safetensors_read_as(SafetensorsReader& reader, const SafetensorsTensorInfo& tensor,
                         T* out, std::size_t numel) {
  if constexpr (std::is_same<T, double>::value || std::is_same<T, float>::value) {
    reader.read(tensor, out);
  } else {
    std::vector<float> values(numel);
    reader.read(tensor, values.data());
    for (std::size_t n = 0; n < numel; ++n) out[n] = from_acc<T>(values[n]);
  }
}

}  // namespace Impl

namespace nn {

/// How layer parameters are named in a safetensors file.
enum class ParameterNames {
  /// torch.nn.MultiheadAttention / torch.nn.TransformerEncoderLayer /
  /// torch.nn.TransformerDecoderLayer: the names of the layers'
  /// parameters(prefix) (in_proj_weight, out_proj.weight,
  /// self_attn.in_proj_weight, multihead_attn.in_proj_weight, linear1.weight,
  /// norm1.weight, ...).
  pytorch,
  /// The Llama decoder layer of Hugging Face transformers: self_attn.q_proj,
  /// k_proj, v_proj, o_proj; mlp.gate_proj, up_proj, down_proj;
  /// input_layernorm, post_attention_layernorm (".weight", ".bias").
  llama
};

/// load_safetensors / save_safetensors of a layer.
struct SafetensorsOptions {
  ParameterNames names = ParameterNames::pytorch;
  /// Prepended to every name: "layers.3." for the fourth layer of a
  /// model's file ("model.layers.3." in Hugging Face Llama checkpoints).
  std::string prefix;
  /// save_safetensors: written as the file's __metadata__ (string to string).
  /// Empty: {"format": "pt"}, which Hugging Face loaders look for.
  std::map<std::string, std::string> metadata;
};

/// One tensor of a file read by read_safetensors: its values converted to T,
/// flat in the file's (row-major) order, its shape and the dtype it had in
/// the file.
template <class T>
struct HostTensor {
  std::vector<std::size_t> shape;
  std::string dtype;
  Kokkos::View<T*, Kokkos::LayoutRight, Kokkos::HostSpace> values;
};

/// Every tensor of a safetensors file, by name, and its metadata.
template <class T>
struct SafetensorsContents {
  std::map<std::string, HostTensor<T>> tensors;
  std::map<std::string, std::string> metadata;
};

/// Reads a whole safetensors file into host Views of T (double, float,
/// kfa::half or kfa::bfloat16), for models kfa::nn does not have. Floating
/// dtypes (F64, F32, F16, BF16) and integer dtypes convert to T (exactly
/// where T holds the value: F16, BF16 and F32 into float, a dtype into
/// itself; otherwise rounded to nearest, F16 into bfloat16 too). Throws
/// std::runtime_error naming the file (and the tensor) for a file that is
/// truncated or whose header is not valid safetensors JSON, and
/// std::invalid_argument naming the tensor for a dtype it cannot convert
/// (F8_E4M3, F8_E5M2).
template <class T>
SafetensorsContents<T> read_safetensors(const std::string& path) {
  static_assert(Impl::nn_value_type_ok<T>(),
                "kfa::nn::read_safetensors: T must be double, float, kfa::half or "
                "kfa::bfloat16");
  Impl::ProfilingRegion region("kfa::nn::read_safetensors");
  Impl::SafetensorsReader reader(path);
  for (const auto& t : reader.tensors()) {
    if (!Impl::safetensors_convertible(t.dtype)) {
      throw std::invalid_argument("kfa::nn::read_safetensors: tensor '" + t.name + "' in '" +
                                  path + "' has dtype " + t.dtype + ", which is not converted");
    }
  }
  SafetensorsContents<T> contents;
  contents.metadata = reader.metadata();
  for (const auto& t : reader.tensors()) {
    std::size_t numel = 1;
    for (std::size_t e : t.shape) numel *= e;
    const std::string label = "kfa::nn::read_safetensors::" + t.name;
    HostTensor<T> tensor{t.shape, t.dtype,
                         Kokkos::View<T*, Kokkos::LayoutRight, Kokkos::HostSpace>(
                             Kokkos::view_alloc(Kokkos::WithoutInitializing, label), numel)};
    Impl::safetensors_read_as(reader, t, tensor.values.data(), numel);
    contents.tensors.emplace(t.name, std::move(tensor));
  }
  return contents;
}

/// Writes `tensors` (shape and values; their dtype field is ignored) as a
/// safetensors file of T's dtype (F64, F32, F16 or BF16), with `metadata` as its
/// __metadata__. Throws std::invalid_argument naming a tensor whose values
/// do not match its shape, std::runtime_error if the file cannot be written
/// (no partial file is left at `path`).
template <class T>
void write_safetensors(const std::string& path, const std::map<std::string, HostTensor<T>>& tensors,
                       const std::map<std::string, std::string>& metadata = {}) {
  static_assert(Impl::nn_value_type_ok<T>(),
                "kfa::nn::write_safetensors: T must be double, float, kfa::half or "
                "kfa::bfloat16");
  Impl::ProfilingRegion region("kfa::nn::write_safetensors");
  std::vector<Impl::SafetensorsRecord> records;
  for (const auto& [name, t] : tensors) {
    std::size_t numel = 1;
    for (std::size_t e : t.shape) numel *= e;
    if (numel != t.values.size()) {
      throw std::invalid_argument("kfa::nn::write_safetensors: tensor '" + name + "' has shape " +
                                  Impl::safetensors_shape_string(t.shape) + " but " +
                                  std::to_string(t.values.size()) + " values");
    }
    records.push_back({name, Impl::safetensors_dtype<T>(), t.shape, t.values.data(),
                       numel * sizeof(T)});
  }
  Impl::safetensors_write(path, records, metadata);
}

/// Loads the parameters of `layer` (a MultiHeadAttention, a
/// TransformerBlock or a TransformerDecoderBlock, the last with
/// ParameterNames::pytorch only) from the safetensors file at `path`, named as
/// options.names says, each name prefixed by options.prefix; other tensors
/// in the file are ignored. Dtypes F64, F32, F16 and BF16 convert to the
/// layer's T: exactly where T holds them (its own dtype; F32, F16, BF16 into
/// float), otherwise rounded to nearest (F64 into float, anything wider into
/// a 16-bit layer, F16 into bfloat16 and BF16 into half). A kfa::nn::AdamW
/// with fp32 master weights copies the parameters when constructed: load
/// before constructing it. Everything is checked before anything is written: a missing
/// tensor, a wrong shape or a dtype that is not one of those four throws
/// std::invalid_argument naming the tensor; a truncated file or a bad
/// header throws std::runtime_error; the layer is then unchanged. The
/// copies to the layer's memory are enqueued on `space`, which is fenced
/// before returning (the host staging buffers must outlive them).
template <class ExecSpace, class Layer>
void load_safetensors(const ExecSpace& space, const std::string& path, Layer& layer,
                      const SafetensorsOptions& options = {}) {
  using T = typename Layer::view1::non_const_value_type;
  static_assert(std::is_same<typename Layer::execution_space, ExecSpace>::value,
                "kfa::nn::load_safetensors: space must be the layer's execution space");
  const char* function = "kfa::nn::load_safetensors";
  Impl::ProfilingRegion region(function);
  const auto bindings = Impl::safetensors_bindings(
      layer, options.names == ParameterNames::llama, options.prefix);
  Impl::SafetensorsReader reader(path);
  std::vector<const Impl::SafetensorsTensorInfo*> found;
  for (const auto& b : bindings) {
    const auto* t = reader.find(b.name);
    const std::string tensor = "tensor '" + b.name + "'";
    if (t == nullptr) {
      std::string hint;
      if (!reader.tensors().empty())
        hint = " (its first tensor is '" + reader.tensors().front().name +
               "': check SafetensorsOptions::prefix and names)";
      Impl::throw_invalid(function, tensor + " " + Impl::safetensors_shape_string(b.shape) +
                                        " is missing from '" + path + "'" + hint);
    }
    if (t->shape != b.shape) {
      Impl::throw_invalid(function, tensor + " must be " +
                                        Impl::safetensors_shape_string(b.shape) + ", '" + path +
                                        "' has " + Impl::safetensors_shape_string(t->shape));
    }
    if (t->dtype != "F64" && t->dtype != "F32" && t->dtype != "F16" && t->dtype != "BF16") {
      Impl::throw_invalid(function, tensor + " has dtype " + t->dtype + " in '" + path +
                                        "'; layers load F64, F32, F16 or BF16");
    }
    found.push_back(t);
  }
  // Read everything before the first copy into the layer: a read error
  // leaves the layer as it was.
  std::vector<std::vector<T>> staging(bindings.size());
  for (std::size_t n = 0; n < bindings.size(); ++n) {
    staging[n].resize(bindings[n].values.size());
    Impl::safetensors_read_as(reader, *found[n], staging[n].data(), staging[n].size());
  }
  using host_view = Kokkos::View<const T*, Kokkos::LayoutRight, Kokkos::HostSpace,
                                 Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  for (std::size_t n = 0; n < bindings.size(); ++n)
    Kokkos::deep_copy(space, bindings[n].values, host_view(staging[n].data(), staging[n].size()));
  space.fence();
}

/// Saves the parameters of `layer` (a MultiHeadAttention, a
/// TransformerBlock or a TransformerDecoderBlock) to a safetensors file at
/// `path` in the layer's dtype (F64, F32, F16 or BF16), named as
/// options.names says with options.prefix, and options.metadata. The copies to the host are enqueued on `space`, which
/// is fenced. Throws std::runtime_error if the file cannot be written (no
/// partial file is left at `path`).
template <class ExecSpace, class Layer>
void save_safetensors(const ExecSpace& space, const std::string& path, const Layer& layer,
                      const SafetensorsOptions& options = {}) {
  using T = typename Layer::view1::non_const_value_type;
  static_assert(std::is_same<typename Layer::execution_space, ExecSpace>::value,
                "kfa::nn::save_safetensors: space must be the layer's execution space");
  Impl::ProfilingRegion region("kfa::nn::save_safetensors");
  const auto bindings = Impl::safetensors_bindings(
      layer, options.names == ParameterNames::llama, options.prefix);
  std::vector<std::vector<T>> staging(bindings.size());
  using host_view = Kokkos::View<T*, Kokkos::LayoutRight, Kokkos::HostSpace,
                                 Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  for (std::size_t n = 0; n < bindings.size(); ++n) {
    staging[n].resize(bindings[n].values.size());
    Kokkos::deep_copy(space, host_view(staging[n].data(), staging[n].size()), bindings[n].values);
  }
  space.fence();
  std::vector<Impl::SafetensorsRecord> records;
  for (std::size_t n = 0; n < bindings.size(); ++n) {
    records.push_back({bindings[n].name, Impl::safetensors_dtype<T>(), bindings[n].shape,
                       staging[n].data(), staging[n].size() * sizeof(T)});
  }
  const std::map<std::string, std::string> format_pt = {{"format", "pt"}};
  Impl::safetensors_write(path, records, options.metadata.empty() ? format_pt : options.metadata);
}

}  // namespace nn
}  // namespace kfa

#endif
