// Runs transformer blocks exported from PyTorch by
// examples/export_pytorch_block.py: loads each block's safetensors weights
// into a kfa::nn::TransformerBlock, runs it on PyTorch's input, and prints
// the largest difference from PyTorch's output. Fails above the tolerance;
// without the files it says how to make them and exits with 77 (skipped).
//
//   python3 examples/export_pytorch_block.py --out-dir DIR [--dtype float32]
//   pytorch_inference --dir DIR [--block encoder_layer|llama_block] [--tolerance T]
//                     [--save-dir OUT]
//
// --save-dir writes each loaded block back (save_safetensors, same names) to
// OUT/<block>.safetensors, which torch's load_state_dict(strict=True) takes.
// The block's configuration comes from the __metadata__ of <block>_io.safetensors.

#include <kfa/nn.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

namespace pytorch_example {

using Space = Kokkos::DefaultExecutionSpace;
using Metadata = std::map<std::string, std::string>;

std::string get(const Metadata& m, const std::string& key) {
  const auto it = m.find(key);
  if (it == m.end()) throw std::runtime_error("metadata has no '" + key + "'");
  return it->second;
}
int get_int(const Metadata& m, const std::string& key) { return std::stoi(get(m, key)); }

kfa::nn::TransformerBlockOptions block_options(const Metadata& m) {
  kfa::nn::TransformerBlockOptions o;
  o.attention.d_model = get_int(m, "d_model");
  o.attention.heads = get_int(m, "heads");
  o.attention.kv_heads = get_int(m, "kv_heads");
  o.attention.fused_qkv = get(m, "fused_qkv") == "1";
  o.attention.rotary = get(m, "rotary") == "1";
  if (o.attention.rotary) o.attention.rotary_options.base = std::stod(get(m, "rope_base"));
  o.attention.attention.causal = get(m, "causal") == "1";
  o.d_ff = get_int(m, "d_ff");
  o.norm = get(m, "norm") == "rms_norm" ? kfa::nn::Norm::rms_norm : kfa::nn::Norm::layer_norm;
  o.norm_options.eps = std::stod(get(m, "norm_eps"));
  o.activation = get(m, "activation") == "swiglu" ? kfa::nn::Activation::swiglu
                                                  : kfa::nn::Activation::gelu;
  o.bias = get(m, "bias") == "1";
  return o;
}

/// Loads, runs and compares one block in T; returns the max abs difference.
template <class T>
double run(const std::string& weights, const kfa::nn::SafetensorsContents<T>& io,
           const std::string& save_path, double& max_y) {
  using View3 = Kokkos::View<T***, Kokkos::LayoutRight, Space::memory_space>;
  const auto& m = io.metadata;
  kfa::nn::TransformerBlock<Space, T> block(block_options(m));
  kfa::nn::SafetensorsOptions load_options;
  load_options.names = get(m, "names") == "llama" ? kfa::nn::ParameterNames::llama
                                                  : kfa::nn::ParameterNames::pytorch;
  load_options.prefix = get(m, "prefix");
  const Space space;
  kfa::nn::load_safetensors(space, weights, block, load_options);
  if (!save_path.empty()) kfa::nn::save_safetensors(space, save_path, block, load_options);

  const auto& x = io.tensors.at("x");
  const auto& y_torch = io.tensors.at("y");
  if (x.shape.size() != 3) throw std::runtime_error("x must be [batch][seqlen][d_model]");
  View3 xv("x", x.shape[0], x.shape[1], x.shape[2]), yv("y", x.shape[0], x.shape[1], x.shape[2]);
  Kokkos::deep_copy(xv, Kokkos::View<const T***, Kokkos::LayoutRight, Kokkos::HostSpace,
                                     Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
                            x.values.data(), x.shape[0], x.shape[1], x.shape[2]));
  typename kfa::nn::TransformerBlock<Space, T>::context_type context;
  context.training = false;
  block.forward(space, xv, yv, context);
  auto y = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), yv);
  double err = 0;
  max_y = 0;
  for (std::size_t n = 0; n < y.size(); ++n) {
    const double ref = static_cast<double>(y_torch.values(n));
    err = std::max(err, std::abs(static_cast<double>(y.data()[n]) - ref));
    max_y = std::max(max_y, std::abs(ref));
    if (std::isnan(y.data()[n])) err = INFINITY;
  }
  return err;
}

bool exists(const std::string& path) { return std::ifstream(path).good(); }

}  // namespace pytorch_example

int main(int argc, char* argv[]) {
  using namespace pytorch_example;
  std::string dir = ".";
  std::vector<std::string> blocks = {"encoder_layer", "llama_block"};
  std::string save_dir;
  double tolerance = -1;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s: %s needs a value (see the comment at the top)\n", argv[0],
                   s.c_str());
      return 2;
    }
    if (s == "--dir") dir = argv[++i];
    else if (s == "--block") blocks = {argv[++i]};
    else if (s == "--tolerance") tolerance = std::atof(argv[++i]);
    else if (s == "--save-dir") save_dir = argv[++i];
    else {
      std::fprintf(stderr, "%s: unknown argument %s (see the comment at the top)\n", argv[0],
                   s.c_str());
      return 2;
    }
  }
  for (const auto& b : blocks) {
    for (const std::string file : {b + ".safetensors", b + "_io.safetensors"}) {
      if (!exists(dir + "/" + file)) {
        std::printf("skipped: %s/%s not found; write it with\n"
                    "  python3 examples/export_pytorch_block.py --out-dir %s\n"
                    "(needs PyTorch), then run this again\n",
                    dir.c_str(), file.c_str(), dir.c_str());
        return 77;
      }
    }
  }
  int status = 0;
  Kokkos::ScopeGuard guard(argc, argv);
  for (const auto& b : blocks) {
    const std::string weights = dir + "/" + b + ".safetensors";
    const std::string io = dir + "/" + b + "_io.safetensors";
    // The io file says the dtype; the block runs in it.
    bool fp32 = false;
    try {
      fp32 = kfa::nn::read_safetensors<double>(io).metadata.at("dtype") == "float32";
    } catch (const std::exception& e) {
      std::printf("FAILED %s: %s\n", io.c_str(), e.what());
      return 1;
    }
    double max_y = 0, err = 0;
    const std::string save_path = save_dir.empty() ? "" : save_dir + "/" + b + ".safetensors";
    try {
      if (fp32)
        err = run<float>(weights, kfa::nn::read_safetensors<float>(io), save_path, max_y);
      else
        err = run<double>(weights, kfa::nn::read_safetensors<double>(io), save_path, max_y);
    } catch (const std::exception& e) {
      std::printf("FAILED %s: %s\n", b.c_str(), e.what());
      status = 1;
      continue;
    }
    // Default bounds: a few hundred ulps of the type at max|y|.
    const double bound =
        tolerance >= 0 ? tolerance : (fp32 ? 1e-4 : 1e-12) * std::max(1.0, max_y);
    const bool ok = err <= bound;
    std::printf("%s %s (%s): max |kfa - PyTorch| = %.3e (max |y| %.3g, tolerance %.1e)\n",
                ok ? "ok" : "FAILED", b.c_str(), fp32 ? "float32" : "float64", err, max_y, bound);
    if (!ok) status = 1;
  }
  return status;
}
