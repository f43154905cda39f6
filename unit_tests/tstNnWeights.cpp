// kfa::nn safetensors weights: save→load round trips of MultiHeadAttention
// and TransformerBlock (PyTorch and Llama names, fused and separate
// projections, a prefix) that must give bitwise-equal parameters and
// outputs; files built byte by byte here with known values in every dtype
// the layers load (F64, F32, F16, BF16, subnormals included); every error
// path, each naming the tensor and leaving the layer unchanged.

#include "nn_test_helpers.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

namespace {

using namespace kfa_test;

/// A unique file under gtest's temporary folder, removed at the end.
struct TempFile {
  std::string path;
  explicit TempFile(const std::string& tag)
      : path(::testing::TempDir() + "kfa_weights_" + tag + ".safetensors") {}
  ~TempFile() { std::remove(path.c_str()); }
};

template <class T, class ViewType>
std::vector<T> host_values(const ViewType& view) {
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), view);
  return std::vector<T>(host.data(), host.data() + host.size());
}

/// Every parameter of a layer, by name, on the host.
template <class T, class Layer>
std::map<std::string, std::vector<T>> snapshot(const Layer& layer) {
  std::map<std::string, std::vector<T>> values;
  for (const auto& p : layer.parameters()) values[p.name] = host_values<T>(p.value);
  return values;
}

template <class T>
bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

/// Random values in every parameter (biases and norms included, which the
/// layers initialise to constants).
template <class T, class Layer>
void randomize_all(const Layer& layer, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> dist(-0.3, 0.3);
  for (const auto& p : layer.parameters()) {
    auto host = Kokkos::create_mirror_view(p.value);
    for (std::size_t n = 0; n < host.size(); ++n) host(n) = static_cast<T>(dist(rng));
    if (p.name.find("norm") != std::string::npos && p.name.find("weight") != std::string::npos)
      for (std::size_t n = 0; n < host.size(); ++n) host(n) += T(1);
    Kokkos::deep_copy(p.value, host);
  }
}

/// The layer's output on a fixed input (inference: no dropout), on the host.
template <class Space, class T, class Layer>
std::vector<T> forward_output(const Layer& layer, int d_model) {
  const int B = 2, S = 9;
  std::mt19937_64 rng(test_seed("nn_weights_x"));
  const Tensor x = random_tensor({B, S, d_model}, rng);
  auto xv = make_view<DeviceView3<T, Space>>(x, "x");
  DeviceView3<T, Space> yv("y", B, S, d_model);
  typename Layer::context_type context;
  context.training = false;
  layer.forward(Space(), xv, yv, context);
  Space().fence();
  return host_values<T>(yv);
}

/// A safetensors file written byte by byte (no JSON library): tensors
/// appended in order, the header assembled as text.
struct FileBuilder {
  struct Entry {
    std::string name, dtype, shape;
    std::string bytes;
  };
  std::vector<Entry> entries;
  std::string metadata;  // a JSON object's text, or empty

  template <class Word>
  void add(const std::string& name, const std::string& dtype, const std::string& shape,
           const std::vector<Word>& words) {
    std::string bytes;
    for (Word w : words) {
      std::uint64_t bits = 0;
      std::memcpy(&bits, &w, sizeof(Word));
      for (std::size_t b = 0; b < sizeof(Word); ++b)
        bytes.push_back(char((bits >> (8 * b)) & 0xff));
    }
    entries.push_back({name, dtype, shape, bytes});
  }

  std::string header() const {
    std::ostringstream h;
    h << "{";
    if (!metadata.empty()) h << "\"__metadata__\":" << metadata << ",";
    std::size_t offset = 0;
    for (std::size_t n = 0; n < entries.size(); ++n) {
      const auto& e = entries[n];
      h << (n ? "," : "") << "\"" << e.name << "\":{\"dtype\":\"" << e.dtype << "\",\"shape\":"
        << e.shape << ",\"data_offsets\":[" << offset << "," << offset + e.bytes.size() << "]}";
      offset += e.bytes.size();
    }
    h << "}";
    return h.str();
  }

  /// The file's bytes with `header_text` (default: header()) and a header
  /// length field of `length` (default: the header's own).
  std::string bytes(std::string header_text = "", std::uint64_t length = ~0ull) const {
    if (header_text.empty()) header_text = header();
    if (length == ~0ull) length = header_text.size();
    std::string out;
    for (int b = 0; b < 8; ++b) out.push_back(char((length >> (8 * b)) & 0xff));
    out += header_text;
    for (const auto& e : entries) out += e.bytes;
    return out;
  }
};

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file.write(bytes.data(), std::streamsize(bytes.size()));
}

template <class Call>
void expect_runtime_error(Call&& call, const std::string& needle) {
  try {
    call();
    ADD_FAILURE() << "no exception; expected one mentioning " << needle;
  } catch (const std::invalid_argument& e) {
    ADD_FAILURE() << "std::invalid_argument, expected std::runtime_error: " << e.what();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

std::vector<float> iota_values(std::size_t n, float scale) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = scale * float(int(i % 17) - 8);
  return v;
}

/// bf16 / fp16 bit patterns of small multiples of 1/8 and 1/16 (exact in
/// both formats): the value k/8 for k in -8..8.
std::uint16_t bf16_bits(float f) {
  std::uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return std::uint16_t(bits >> 16);  // exact for these values
}
std::uint16_t f16_bits(float f) {
  // Normal values with at most 10 mantissa bits (the tests' k/16).
  if (f == 0) return 0;
  std::uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const std::uint32_t sign = bits >> 31, exponent = (bits >> 23) & 0xff,
                      mantissa = bits & 0x7fffff;
  return std::uint16_t((sign << 15) | ((exponent - 127 + 15) << 10) | (mantissa >> 13));
}
template <class F>
std::vector<std::uint16_t> encoded(const std::vector<float>& v, F&& encode) {
  std::vector<std::uint16_t> out;
  for (float f : v) out.push_back(encode(f));
  return out;
}

template <class C>
class NnWeights : public ::testing::Test {};
TYPED_TEST_SUITE(NnWeights, NnConfigs);

std::vector<kfa::nn::MultiHeadAttentionOptions> weight_mha_cases() {
  std::vector<kfa::nn::MultiHeadAttentionOptions> cases(3);
  for (auto& o : cases) {
    o.d_model = 24;
    o.heads = 4;
    o.kv_heads = 2;
    o.head_dim = 8;
  }
  cases[1].fused_qkv = false;
  cases[1].rotary = true;
  cases[1].attention.causal = true;
  cases[2].qk_norm = true;
  cases[2].rotary = true;
  return cases;
}

TYPED_TEST(NnWeights, MultiHeadAttentionRoundTripIsBitwise) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  using Layer = kfa::nn::MultiHeadAttention<Space, T>;
  for (const auto& options : weight_mha_cases()) {
    for (auto names : {kfa::nn::ParameterNames::pytorch, kfa::nn::ParameterNames::llama}) {
      const std::string tag = std::string("mha_") + (options.fused_qkv ? "fused_" : "separate_") +
                              (options.qk_norm ? "qk_norm_" : "") +
                              (names == kfa::nn::ParameterNames::llama ? "llama_" : "pytorch_") +
                              type_name<T>() + "_" + Space::name();
      TempFile file(tag);
      Layer a(options), b(options);
      std::mt19937_64 rng(test_seed(tag));
      randomize_all<T>(a, rng);
      kfa::nn::SafetensorsOptions io;
      io.names = names;
      io.prefix = "layers.3.self_attn.";
      kfa::nn::save_safetensors(Space(), file.path, a, io);
      kfa::nn::load_safetensors(Space(), file.path, b, io);
      const auto pa = snapshot<T>(a), pb = snapshot<T>(b);
      for (const auto& [name, values] : pa)
        EXPECT_TRUE(bitwise_equal(values, pb.at(name))) << tag << " " << name;
      EXPECT_TRUE(bitwise_equal(forward_output<Space, T>(a, options.d_model),
                                forward_output<Space, T>(b, options.d_model)))
          << tag << " outputs";

      // The file holds the layer's dtype, and with PyTorch names exactly
      // the names of parameters(prefix).
      const auto contents = kfa::nn::read_safetensors<T>(file.path);
      EXPECT_EQ(contents.metadata.at("format"), "pt") << tag;
      for (const auto& [name, t] : contents.tensors)
        EXPECT_EQ(t.dtype, sizeof(T) == 8 ? "F64" : "F32") << tag << " " << name;
      if (names == kfa::nn::ParameterNames::pytorch) {
        std::vector<std::string> expected, got;
        for (const auto& p : a.parameters(io.prefix)) expected.push_back(p.name);
        for (const auto& entry : contents.tensors) got.push_back(entry.first);
        std::sort(expected.begin(), expected.end());
        EXPECT_EQ(got, expected) << tag;
      } else {
        EXPECT_EQ(contents.tensors.count("layers.3.self_attn.k_proj.weight"), 1u) << tag;
        EXPECT_EQ(contents.tensors.at("layers.3.self_attn.k_proj.weight").shape,
                  (std::vector<std::size_t>{16, 24}))
            << tag;
        EXPECT_EQ(contents.tensors.count("layers.3.self_attn.o_proj.bias"), 1u) << tag;
      }
    }
  }
}

/// torch.nn.MultiheadAttention has no qk-norm: its files lack q_norm.weight
/// and k_norm.weight, and a qk-norm layer refuses them by name (with
/// either naming), unchanged.
TYPED_TEST(NnWeights, QkNormWeightsMissingFromAFileAreNamed) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  auto options = weight_mha_cases()[0];
  for (auto names : {kfa::nn::ParameterNames::pytorch, kfa::nn::ParameterNames::llama}) {
    const bool llama = names == kfa::nn::ParameterNames::llama;
    const std::string tag = std::string("qk_norm_missing_") + (llama ? "llama_" : "pytorch_") +
                            type_name<T>() + "_" + Space::name();
    TempFile file(tag);
    kfa::nn::MultiHeadAttention<Space, T> plain(options);
    options.qk_norm = true;
    kfa::nn::MultiHeadAttention<Space, T> normed(options);
    options.qk_norm = false;
    std::mt19937_64 rng(test_seed(tag));
    randomize_all<T>(normed, rng);
    const auto before = snapshot<T>(normed);
    kfa::nn::SafetensorsOptions io;
    io.names = names;
    io.prefix = "attn.";
    kfa::nn::save_safetensors(Space(), file.path, plain, io);
    expect_invalid_argument([&] { kfa::nn::load_safetensors(Space(), file.path, normed, io); },
                            "tensor 'attn.q_norm.weight' [8] is missing from '" + file.path);
    const auto after = snapshot<T>(normed);
    for (const auto& [name, values] : before)
      EXPECT_TRUE(bitwise_equal(values, after.at(name))) << tag << ": " << name << " written";
    // The other way round the extra tensors are ignored, as any other.
    kfa::nn::save_safetensors(Space(), file.path, normed, io);
    kfa::nn::load_safetensors(Space(), file.path, plain, io);
    EXPECT_EQ(kfa::nn::read_safetensors<T>(file.path).tensors.count("attn.k_norm.weight"), 1u)
        << tag;
  }
}

TYPED_TEST(NnWeights, TransformerBlockRoundTripIsBitwise) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  using Block = kfa::nn::TransformerBlock<Space, T>;
  std::vector<std::pair<kfa::nn::TransformerBlockOptions, kfa::nn::ParameterNames>> cases(3);
  for (auto& c : cases) {
    c.first.attention.d_model = 24;
    c.first.attention.heads = 3;
    c.first.d_ff = 20;
  }
  // torch.nn.TransformerEncoderLayer(norm_first=True).
  cases[0].second = kfa::nn::ParameterNames::pytorch;
  // Llama: RMSNorm, SwiGLU, separate projections, grouped-query heads, rotary.
  auto& llama = cases[1].first;
  cases[1].second = kfa::nn::ParameterNames::llama;
  llama.norm = kfa::nn::Norm::rms_norm;
  llama.activation = kfa::nn::Activation::swiglu;
  llama.bias = false;
  llama.attention.heads = 4;
  llama.attention.kv_heads = 2;
  llama.attention.head_dim = 6;
  llama.attention.fused_qkv = false;
  llama.attention.rotary = true;
  llama.attention.attention.causal = true;
  // Llama names on a fused LayerNorm block with biases and SwiGLU.
  cases[2].second = kfa::nn::ParameterNames::llama;
  cases[2].first.activation = kfa::nn::Activation::swiglu;
  int index = 0;
  for (const auto& [options, names] : cases) {
    const std::string tag = "block_" + std::to_string(index++) + "_" + type_name<T>() + "_" +
                            Space::name();
    TempFile file(tag);
    Block a(options), b(options);
    std::mt19937_64 rng(test_seed(tag));
    randomize_all<T>(a, rng);
    kfa::nn::SafetensorsOptions io;
    io.names = names;
    io.prefix = "model.layers.3.";
    io.metadata = {{"format", "pt"}, {"source", "kfa test"}};
    kfa::nn::save_safetensors(Space(), file.path, a, io);
    kfa::nn::load_safetensors(Space(), file.path, b, io);
    const auto pa = snapshot<T>(a), pb = snapshot<T>(b);
    for (const auto& [name, values] : pa)
      EXPECT_TRUE(bitwise_equal(values, pb.at(name))) << tag << " " << name;
    EXPECT_TRUE(bitwise_equal(forward_output<Space, T>(a, 24), forward_output<Space, T>(b, 24)))
        << tag << " outputs";
    const auto contents = kfa::nn::read_safetensors<T>(file.path);
    EXPECT_EQ(contents.metadata, io.metadata) << tag;
    if (names == kfa::nn::ParameterNames::llama) {
      const auto& t = contents.tensors;
      EXPECT_EQ(t.at("model.layers.3.mlp.gate_proj.weight").shape,
                (std::vector<std::size_t>{20, 24}))
          << tag;
      EXPECT_EQ(t.at("model.layers.3.mlp.down_proj.weight").shape,
                (std::vector<std::size_t>{24, 20}))
          << tag;
      EXPECT_EQ(t.count("model.layers.3.input_layernorm.weight"), 1u) << tag;
      EXPECT_EQ(t.count("model.layers.3.post_attention_layernorm.weight"), 1u) << tag;
      EXPECT_EQ(t.count("model.layers.3.self_attn.q_proj.weight"), 1u) << tag;
    } else {
      EXPECT_EQ(contents.tensors.count("model.layers.3.self_attn.in_proj_weight"), 1u) << tag;
      EXPECT_EQ(contents.tensors.count("model.layers.3.linear1.bias"), 1u) << tag;
    }
  }
}

/// Llama names map fused and separate projections to the same tensors, so a
/// file saved from one loads into the other.
TYPED_TEST(NnWeights, LlamaNamesMoveBetweenFusedAndSeparateProjections) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  auto options = weight_mha_cases()[0];
  kfa::nn::MultiHeadAttention<Space, T> fused(options);
  options.fused_qkv = false;
  kfa::nn::MultiHeadAttention<Space, T> separate(options);
  const std::string tag = std::string("fused_to_separate_") + type_name<T>() + "_" + Space::name();
  std::mt19937_64 rng(test_seed(tag));
  randomize_all<T>(fused, rng);
  TempFile file(tag);
  kfa::nn::SafetensorsOptions io;
  io.names = kfa::nn::ParameterNames::llama;
  kfa::nn::save_safetensors(Space(), file.path, fused, io);
  kfa::nn::load_safetensors(Space(), file.path, separate, io);
  const auto f = snapshot<T>(fused), s = snapshot<T>(separate);
  const std::size_t q = 4 * 8 * 24, kv = 2 * 8 * 24;
  const auto& w_qkv = f.at("in_proj_weight");
  EXPECT_TRUE(bitwise_equal(s.at("q_proj.weight"), {w_qkv.begin(), w_qkv.begin() + q}));
  EXPECT_TRUE(bitwise_equal(s.at("k_proj.weight"), {w_qkv.begin() + q, w_qkv.begin() + q + kv}));
  EXPECT_TRUE(bitwise_equal(s.at("v_proj.weight"), {w_qkv.begin() + q + kv, w_qkv.end()}));
  const auto& b_qkv = f.at("in_proj_bias");
  EXPECT_TRUE(bitwise_equal(s.at("v_proj.bias"), {b_qkv.begin() + 48, b_qkv.end()}));
  EXPECT_TRUE(bitwise_equal(s.at("out_proj.weight"), f.at("out_proj.weight")));
}

/// The layer of the hand-built files: d_model 4, one head, fused, biases.
kfa::nn::MultiHeadAttentionOptions small_options() {
  kfa::nn::MultiHeadAttentionOptions o;
  o.d_model = 4;
  o.heads = 1;
  return o;
}

/// in_proj_weight [12][4] BF16, in_proj_bias [12] F16, out_proj.weight
/// [4][4] F64, out_proj.bias [4] F32, and an unrelated I64 tensor.
FileBuilder small_file() {
  FileBuilder f;
  f.metadata = "{\"format\":\"pt\"}";
  f.add("in_proj_weight", "BF16", "[12,4]", encoded(iota_values(48, 0.125f), bf16_bits));
  f.add("in_proj_bias", "F16", "[12]", encoded(iota_values(12, 0.0625f), f16_bits));
  std::vector<double> w_o(16);
  for (int i = 0; i < 16; ++i) w_o[i] = 0.1 * (i - 7);
  f.add("out_proj.weight", "F64", "[4,4]", w_o);
  f.add("out_proj.bias", "F32", "[4]", std::vector<float>{1.5f, -2.25f, 1e-3f, 3.0f});
  f.add("position_ids", "I64", "[3]", std::vector<std::int64_t>{0, -1, 1000000});
  return f;
}

TYPED_TEST(NnWeights, HandBuiltFileLoadsValueByValue) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  const std::string tag = std::string("hand_") + type_name<T>() + "_" + Space::name();
  TempFile file(tag);
  write_file(file.path, small_file().bytes());

  kfa::nn::MultiHeadAttention<Space, T> layer(small_options());
  kfa::nn::load_safetensors(Space(), file.path, layer);
  const auto p = snapshot<T>(layer);
  const auto w_qkv = p.at("in_proj_weight"), b_qkv = p.at("in_proj_bias");
  for (int i = 0; i < 48; ++i) EXPECT_EQ(w_qkv[i], T(0.125 * (i % 17 - 8))) << tag << " bf16 " << i;
  for (int i = 0; i < 12; ++i) EXPECT_EQ(b_qkv[i], T(0.0625 * (i % 17 - 8))) << tag << " f16 " << i;
  for (int i = 0; i < 16; ++i)
    EXPECT_EQ(p.at("out_proj.weight")[i], T(0.1 * (i - 7))) << tag << " f64 " << i;
  const std::vector<T> b_o = {T(1.5f), T(-2.25f), T(1e-3f), T(3.0f)};
  EXPECT_TRUE(bitwise_equal(p.at("out_proj.bias"), b_o)) << tag << " f32";

  // The whole file, in T: special values of every floating dtype.
  FileBuilder f;
  f.metadata = "{\"format\":\"pt\",\"note\":\"hand built\"}";
  // F16: 1, -2, 1/3 rounded (0x3555), the smallest subnormal 2^-24, the
  // largest finite 65504, -infinity.
  f.add("half", "F16", "[2,3]",
        std::vector<std::uint16_t>{0x3c00, 0xc000, 0x3555, 0x0001, 0x7bff, 0xfc00});
  // BF16: 1, -5, 1/3 rounded (0x3eab), the smallest subnormal 2^-133.
  f.add("bf16", "BF16", "[4]", std::vector<std::uint16_t>{0x3f80, 0xc0a0, 0x3eab, 0x0001});
  f.add("f32", "F32", "[2]", std::vector<float>{0.1f, -3.0e38f});
  f.add("f64", "F64", "[2]", std::vector<double>{0.1, -1e-300});
  f.add("i8", "I8", "[2]", std::vector<std::int8_t>{-7, 100});
  f.add("u8", "BOOL", "[2]", std::vector<std::uint8_t>{1, 0});
  f.add("empty", "F32", "[0,3]", std::vector<float>{});
  write_file(file.path, f.bytes());
  const auto contents = kfa::nn::read_safetensors<T>(file.path);
  EXPECT_EQ(contents.metadata.at("note"), "hand built");
  const auto& t = contents.tensors;
  ASSERT_EQ(t.size(), 7u);
  EXPECT_EQ(t.at("half").shape, (std::vector<std::size_t>{2, 3}));
  EXPECT_EQ(t.at("half").dtype, "F16");
  const auto& h = t.at("half").values;
  EXPECT_EQ(h(0), T(1));
  EXPECT_EQ(h(1), T(-2));
  EXPECT_EQ(h(2), T(0.333251953125));
  EXPECT_EQ(h(3), T(std::ldexp(1.0, -24)));
  EXPECT_EQ(h(4), T(65504));
  EXPECT_TRUE(std::isinf(h(5)) && h(5) < 0);
  const auto& bf = t.at("bf16").values;
  EXPECT_EQ(bf(0), T(1));
  EXPECT_EQ(bf(1), T(-5));
  EXPECT_EQ(bf(2), T(0.333984375));
  EXPECT_EQ(bf(3), T(std::ldexp(1.0, -133)));
  EXPECT_EQ(t.at("f32").values(0), T(0.1f));
  EXPECT_EQ(t.at("f32").values(1), T(-3.0e38f));
  EXPECT_EQ(t.at("f64").values(0), T(0.1));
  EXPECT_EQ(t.at("f64").values(1), T(-1e-300));  // 0 in float: below its range
  EXPECT_EQ(t.at("i8").values(0), T(-7));
  EXPECT_EQ(t.at("i8").values(1), T(100));
  EXPECT_EQ(t.at("u8").values(0), T(1));
  EXPECT_EQ(t.at("empty").values.size(), 0u);

  // write_safetensors → read_safetensors keeps the values and shapes.
  TempFile copy(tag + "_copy");
  std::map<std::string, kfa::nn::HostTensor<T>> tensors(t.begin(), t.end());
  tensors.erase("half");  // its -infinity compares fine, but keep the check simple
  kfa::nn::write_safetensors(copy.path, tensors, contents.metadata);
  const auto again = kfa::nn::read_safetensors<T>(copy.path);
  EXPECT_EQ(again.metadata, contents.metadata);
  ASSERT_EQ(again.tensors.size(), tensors.size());
  for (const auto& [name, tensor] : tensors) {
    const auto& other = again.tensors.at(name);
    EXPECT_EQ(other.shape, tensor.shape) << name;
    EXPECT_EQ(other.dtype, sizeof(T) == 8 ? "F64" : "F32") << name;
    for (std::size_t n = 0; n < tensor.values.size(); ++n)
      EXPECT_EQ(other.values(n), tensor.values(n)) << name << " " << n;
  }
}

TYPED_TEST(NnWeights, ErrorsNameTheTensorAndLeaveTheLayerUnchanged) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  const std::string tag = std::string("errors_") + type_name<T>() + "_" + Space::name();
  TempFile file(tag);
  kfa::nn::MultiHeadAttention<Space, T> layer(small_options());
  std::mt19937_64 rng(test_seed(tag));
  randomize_all<T>(layer, rng);
  const auto before = snapshot<T>(layer);
  auto load = [&] { kfa::nn::load_safetensors(Space(), file.path, layer); };
  auto unchanged = [&](const std::string& what) {
    const auto after = snapshot<T>(layer);
    for (const auto& [name, values] : before)
      EXPECT_TRUE(bitwise_equal(values, after.at(name))) << what << ": " << name << " written";
  };

  // Every check below fails on the last tensor the layer reads
  // (out_proj.bias) or on the file, after the others passed.
  {
    FileBuilder f = small_file();
    f.entries.erase(f.entries.begin() + 3);
    write_file(file.path, f.bytes());
    expect_invalid_argument(load, "kfa::nn::load_safetensors: tensor 'out_proj.bias' [4] is "
                                  "missing from '" + file.path + "'");
    unchanged("missing tensor");
    kfa::nn::SafetensorsOptions io;
    io.prefix = "layers.0.";
    expect_invalid_argument([&] { kfa::nn::load_safetensors(Space(), file.path, layer, io); },
                            "tensor 'layers.0.in_proj_weight' [12][4] is missing");
    unchanged("wrong prefix");
  }
  {
    FileBuilder f = small_file();
    f.entries[3].shape = "[2,2]";
    write_file(file.path, f.bytes());
    expect_invalid_argument(load, "tensor 'out_proj.bias' must be [4], '" + file.path +
                                      "' has [2][2]");
    unchanged("wrong shape");
  }
  {
    FileBuilder f = small_file();
    f.entries[3].dtype = "I32";
    write_file(file.path, f.bytes());
    expect_invalid_argument(load, "tensor 'out_proj.bias' has dtype I32");
    unchanged("wrong dtype");
  }
  {
    FileBuilder f = small_file();
    f.entries[3].dtype = "F64";  // 16 bytes where F32 [4] has them: the offsets disagree
    write_file(file.path, f.bytes());
    expect_runtime_error(load, "tensor 'out_proj.bias': data_offsets [");
    unchanged("dtype size");
  }
  {
    const std::string bytes = small_file().bytes();
    write_file(file.path, bytes.substr(0, bytes.size() - 30));  // cuts position_ids, out_proj.bias
    expect_runtime_error(load, "truncated: tensor 'out_proj.bias' ends at byte");
    unchanged("truncated data");
    write_file(file.path, bytes.substr(0, 5));
    expect_runtime_error(load, "truncated: 5 bytes");
    unchanged("truncated length");
  }
  {
    const FileBuilder f = small_file();
    write_file(file.path, f.bytes("", 1u << 20));
    expect_runtime_error(load, "header length 1048576 runs past the end of the file");
    unchanged("header length");
  }
  {
    const FileBuilder f = small_file();
    std::string header = f.header();
    header[header.size() / 2] = '}';
    write_file(file.path, f.bytes(header));
    expect_runtime_error(load, "bad header (not JSON)");
    write_file(file.path, f.bytes("[1, 2]    "));
    expect_runtime_error(load, "bad header: not a JSON object");
    std::string no_offsets = f.header();
    no_offsets.replace(no_offsets.find("data_offsets"), 12, "data_offsetz");
    write_file(file.path, f.bytes(no_offsets));
    expect_runtime_error(load, "bad header entry for tensor 'in_proj_weight'");
    unchanged("bad header");
  }
  expect_runtime_error(
      [&] { kfa::nn::load_safetensors(Space(), file.path + ".absent", layer); },
      "cannot open it for reading");
  expect_runtime_error([&] { kfa::nn::read_safetensors<T>(file.path + ".absent"); },
                       "cannot open it for reading");
  {
    FileBuilder f;
    f.add("scale", "F8_E4M3", "[2]", std::vector<std::uint8_t>{1, 2});
    write_file(file.path, f.bytes());
    expect_invalid_argument([&] { kfa::nn::read_safetensors<T>(file.path); },
                            "tensor 'scale' in '" + file.path + "' has dtype F8_E4M3");
  }
  unchanged("all errors");
}

}  // namespace
