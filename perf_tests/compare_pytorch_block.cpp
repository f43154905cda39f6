// kfa::nn::TransformerBlock's forward and backward against PyTorch's, with
// FlashAttention's rule: for y, dx and every parameter gradient,
//   max |kfa - fp64 oracle| <= 2 · max |PyTorch in the same dtype - oracle|
//                              + floor · eps(dtype) · max |oracle|.
// The files come from perf_tests/compare_pytorch_block.py (the block's
// weights, x, dy, the oracle's and PyTorch's outputs and gradients, the
// configuration in the metadata); each is loaded with kfa's safetensors
// loader into a block on the default execution space, which runs x forward
// and dy backward. The floor (default 4) leaves room for kfa's bias and norm
// gradients, column sums added in token order. In float64, where PyTorch is
// the oracle, the bound is the floor alone, at least 16 eps · max |oracle|.
// Prints one table per file; exits 1 if a tensor fails, 77 (skipped) if DIR
// holds no file, 0 otherwise. A file of a dtype that this build's kfa::nn has
// no layers for is reported skipped.
//
//   compare_pytorch_block --dir DIR [--floor 4]
//
// perf_tests/run_pytorch_compare.sh writes the files and runs this.

#include <kfa/nn.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using Space = Kokkos::DefaultExecutionSpace;
using Metadata = std::map<std::string, std::string>;
using Contents = kfa::nn::SafetensorsContents<double>;

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

/// kfa's outputs of one file, flat, by the name of the oracle's tensor
/// without its "ref." prefix: "y", "dx", "grad.<weight name>".
using Results = std::map<std::string, std::vector<double>>;

template <class View>
std::vector<double> to_host(const View& v) {
  using acc_t = kfa::accumulator_t<typename View::non_const_value_type>;
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  std::vector<double> out(h.size());
  for (std::size_t n = 0; n < h.size(); ++n)
    out[n] = static_cast<double>(static_cast<acc_t>(h.data()[n]));
  return out;
}

/// Loads the block of `path` in T, runs x forward and dy backward.
template <class T>
Results run(const std::string& path, const Contents& file) {
  using View3 = Kokkos::View<T***, Kokkos::LayoutRight, Space::memory_space>;
  const Metadata& m = file.metadata;
  kfa::nn::SafetensorsOptions names;
  names.names = get(m, "names") == "llama" ? kfa::nn::ParameterNames::llama
                                           : kfa::nn::ParameterNames::pytorch;
  names.prefix = get(m, "prefix");
  kfa::nn::TransformerBlock<Space, T> block(block_options(m));
  const Space space;
  kfa::nn::load_safetensors(space, path, block, names);

  // x and dy hold values of T (the file has them in T), so the casts are exact.
  auto device_copy = [&](const char* name) {
    const auto& t = file.tensors.at(name);
    if (t.shape.size() != 3) throw std::runtime_error(std::string(name) + " must be rank 3");
    View3 v(std::string(name), t.shape[0], t.shape[1], t.shape[2]);
    auto h = Kokkos::create_mirror_view(v);
    for (std::size_t n = 0; n < h.size(); ++n)
      h.data()[n] = static_cast<T>(static_cast<kfa::accumulator_t<T>>(t.values(n)));
    Kokkos::deep_copy(v, h);
    return v;
  };
  const View3 x = device_copy("x"), dy = device_copy("dy");
  View3 y("y", x.extent(0), x.extent(1), x.extent(2));
  View3 dx("dx", x.extent(0), x.extent(1), x.extent(2));
  typename kfa::nn::TransformerBlock<Space, T>::context_type context;
  block.zero_grad(space);
  block.forward(space, x, y, context);
  block.backward(space, dy, dx, context);
  space.fence();

  Results out;
  out["y"] = to_host(y);
  out["dx"] = to_host(dx);
  // The gradients under the file's names: written into the weights, saved
  // with the loader's naming and read back (the block is not used again).
  for (const auto& p : block.parameters()) Kokkos::deep_copy(space, p.value, p.grad);
  const std::string grads = path + ".kfa_grads";
  kfa::nn::save_safetensors(space, grads, block, names);
  for (const auto& [name, t] : kfa::nn::read_safetensors<double>(grads).tensors)
    out["grad." + name].assign(t.values.data(), t.values.data() + t.values.size());
  std::filesystem::remove(grads);
  return out;
}

/// Runs the file's block in T if kfa::nn has layers of T and T is a type of
/// its own (Distinct; false: nothing run); `eps` is the dtype's machine
/// epsilon.
template <class T, bool Distinct = true>
bool run_if_supported(const std::string& path, const Contents& file, Results& out, double eps,
                      double& eps_out) {
  if constexpr (kfa::Impl::nn_value_type_ok<T>() && Distinct) {
    out = run<T>(path, file);
    eps_out = eps;
    return true;
  } else {
    return false;
  }
}

bool run_dtype(const std::string& dtype, const std::string& path, const Contents& file,
               Results& out, double& eps) {
  if (dtype == "float64")
    return run_if_supported<double>(path, file, out, std::numeric_limits<double>::epsilon(), eps);
  if (dtype == "float32")
    return run_if_supported<float>(path, file, out, std::numeric_limits<float>::epsilon(), eps);
  if (dtype == "bfloat16") return run_if_supported<kfa::bfloat16>(path, file, out, 0x1p-7, eps);
  // Where Kokkos has no half_t (3.4 host builds) kfa::half is float itself.
  constexpr bool real_half = !std::is_same<kfa::half, float>::value;
  if (dtype == "float16")
    return run_if_supported<kfa::half, real_half>(path, file, out, 0x1p-10, eps);
  return false;
}

struct Error {
  double max_abs = 0, rms = 0;
};

Error error(const std::vector<double>& got, const kfa::nn::HostTensor<double>& ref) {
  Error e;
  for (std::size_t n = 0; n < got.size(); ++n) {
    const double d = std::abs(got[n] - ref.values(n));
    e.max_abs = std::isnan(d) ? INFINITY : std::max(e.max_abs, d);
    e.rms += d * d;
  }
  e.rms = std::sqrt(e.rms / double(std::max<std::size_t>(got.size(), 1)));
  return e;
}

/// Checks one file; returns the number of tensors that fail (-1: skipped).
int check(const std::string& path, double floor) {
  const Contents file = kfa::nn::read_safetensors<double>(path);
  const std::string dtype = get(file.metadata, "dtype");
  std::printf("== %s: case %s, %s, batch %s, seqlen %s, d_model %s, %s heads (%s kv), d_ff %s, "
              "causal %s; PyTorch %s on %s; kfa on %s\n",
              path.c_str(), get(file.metadata, "case").c_str(), dtype.c_str(),
              get(file.metadata, "batch").c_str(), get(file.metadata, "seqlen").c_str(),
              get(file.metadata, "d_model").c_str(), get(file.metadata, "heads").c_str(),
              get(file.metadata, "kv_heads").c_str(), get(file.metadata, "d_ff").c_str(),
              get(file.metadata, "causal").c_str(), get(file.metadata, "torch_version").c_str(),
              get(file.metadata, "torch_device").c_str(), Space::name());
  Results kfa_out;
  double eps = 0;
  if (!run_dtype(dtype, path, file, kfa_out, eps)) {
    std::printf("skipped: kfa::nn has no %s layers in this build\n", dtype.c_str());
    return -1;
  }
  // PyTorch in fp64 is the oracle itself (its error is 0): the bound is then
  // the floor alone, wide enough for kfa's sums in another order.
  if (dtype == "float64") {
    floor = std::max(floor, 16.0);
    std::printf("float64: PyTorch is the oracle; bound %g eps x max|ref|\n", floor);
  }
  std::printf("%-52s %9s %10s %10s %10s %6s %10s %10s\n", "tensor", "max|ref|", "err kfa",
              "err torch", "bound", "ratio", "rms kfa", "rms torch");
  int failed = 0;
  // Every oracle tensor must have kfa's and PyTorch's counterpart.
  for (const auto& [name, ref] : file.tensors) {
    if (name.rfind("ref.", 0) != 0) continue;
    const std::string key = name.substr(4);
    const auto torch_it = file.tensors.find("torch." + key);
    const auto kfa_it = kfa_out.find(key);
    if (torch_it == file.tensors.end() || kfa_it == kfa_out.end() ||
        kfa_it->second.size() != ref.values.size()) {
      std::printf("%-52s FAILED: %s\n", key.c_str(),
                  kfa_it == kfa_out.end() ? "kfa has no such tensor" : "missing or wrong size");
      ++failed;
      continue;
    }
    const auto& pt = torch_it->second;
    std::vector<double> torch_values(pt.values.data(), pt.values.data() + pt.values.size());
    double scale = 0;
    for (std::size_t n = 0; n < ref.values.size(); ++n)
      scale = std::max(scale, std::abs(ref.values(n)));
    const Error e_kfa = error(kfa_it->second, ref), e_torch = error(torch_values, ref);
    const double bound = 2 * e_torch.max_abs + floor * eps * scale;
    const bool ok = e_kfa.max_abs <= bound;
    failed += ok ? 0 : 1;
    std::printf("%-52s %9.3g %10.3e %10.3e %10.3e %6.2f %10.3e %10.3e%s\n", key.c_str(), scale,
                e_kfa.max_abs, e_torch.max_abs, bound,
                e_torch.max_abs > 0 ? e_kfa.max_abs / e_torch.max_abs : 0.0, e_kfa.rms,
                e_torch.rms, ok ? "" : "  FAILED");
    kfa_out.erase(kfa_it);
  }
  for (const auto& [key, values] : kfa_out) {
    std::printf("%-52s FAILED: no oracle tensor ref.%s in the file\n", key.c_str(), key.c_str());
    ++failed;
  }
  return failed;
}

}  // namespace

int main(int argc, char* argv[]) {
  std::string dir;
  double floor = 4;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s: %s needs a value (see the comment at the top)\n", argv[0],
                   s.c_str());
      return 2;
    }
    if (s == "--dir") dir = argv[++i];
    else if (s == "--floor") floor = std::atof(argv[++i]);
    else {
      std::fprintf(stderr, "%s: unknown argument %s (see the comment at the top)\n", argv[0],
                   s.c_str());
      return 2;
    }
  }
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec))
    if (entry.path().extension() == ".safetensors") files.push_back(entry.path().string());
  std::sort(files.begin(), files.end());
  if (files.empty()) {
    std::printf("skipped: no .safetensors file in '%s'; write them with\n"
                "  python3 perf_tests/compare_pytorch_block.py --out-dir %s\n"
                "(needs PyTorch), then run this again\n",
                dir.c_str(), dir.c_str());
    return 77;
  }
  Kokkos::ScopeGuard guard(argc, argv);
  int failed = 0, checked = 0, skipped = 0;
  for (const auto& path : files) {
    try {
      const int n = check(path, floor);
      if (n < 0) ++skipped;
      else ++checked, failed += n;
    } catch (const std::exception& e) {
      std::printf("FAILED %s: %s\n", path.c_str(), e.what());
      ++failed;
    }
  }
  std::printf("%s: %d file(s) checked, %d skipped, %d tensor(s) failed (bound: 2 x PyTorch's "
              "error + %g eps x max|ref|)\n",
              failed ? "FAILED" : "ok", checked, skipped, failed, floor);
  return failed ? 1 : 0;
}
