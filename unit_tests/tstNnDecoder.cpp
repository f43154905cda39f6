// kfa::nn::TransformerDecoderBlock, forward and backward (dx, dmemory and
// every parameter gradient) against an fp64 host oracle composed from the
// attention and step oracles of nn_layer_oracles.hpp, on awkward shapes
// (d_model 48, 3 heads, seqlen 37 over a memory of 23, batch 2, causal
// self-attention; grouped-query heads, a memory of another width, ALiBi);
// gradient accumulation and zero_grad; the recompute mode bitwise against
// the default; finite differences of the device forward (fp64, every dropout
// on); PyTorch's parameter names and a safetensors round trip; argument
// errors with nothing written.

#include "nn_layer_oracles.hpp"

#include <kfa/kfa_config.hpp>

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace {

using namespace kfa_test;

template <class C>
class NnDecoder : public ::testing::Test {};
TYPED_TEST_SUITE(NnDecoder, NnConfigs);

/// A case: the options and the target and memory lengths.
struct DecoderCase {
  kfa::nn::TransformerDecoderBlockOptions options;
  int S, Skv, d_kv;
};

std::vector<DecoderCase> decoder_cases() {
  std::vector<DecoderCase> cases(3);
  for (auto& c : cases) {
    c.options.self_attention.d_model = 48;
    c.options.self_attention.heads = 3;
    c.options.d_ff = 40;
    c.d_kv = 48;
  }
  // torch.nn.TransformerDecoderLayer(norm_first=True) with a causal target
  // mask: LayerNorm, GELU, biases, fused projections.
  cases[0].S = 37, cases[0].Skv = 23;
  // Llama-style: RMSNorm, SwiGLU, no biases; grouped-query self-attention
  // with rotary embeddings; cross-attention on a memory of 20 features
  // (separate projections, qk-norm), more memory than target tokens.
  auto& o1 = cases[1].options;
  cases[1].S = 19, cases[1].Skv = 41, cases[1].d_kv = 20;
  o1.norm = kfa::nn::Norm::rms_norm;
  o1.activation = kfa::nn::Activation::swiglu;
  o1.bias = false;
  o1.self_attention.heads = 4;
  o1.self_attention.kv_heads = 2;
  o1.self_attention.head_dim = 12;
  o1.self_attention.fused_qkv = false;
  o1.self_attention.rotary = true;
  o1.cross_attention.heads = 4;
  o1.cross_attention.kv_heads = 2;
  o1.cross_attention.head_dim = 12;
  o1.cross_attention.d_model_kv = 20;
  o1.cross_attention.fused_qkv = false;
  o1.cross_attention.qk_norm = true;
  // GELU (tanh), LayerNorm without bias, non-causal self-attention with
  // interleaved rotary embeddings, ALiBi in the cross-attention.
  auto& o2 = cases[2].options;
  cases[2].S = 29, cases[2].Skv = 29;
  o2.activation = kfa::nn::Activation::gelu_tanh;
  o2.bias = false;
  o2.causal = false;
  o2.self_attention.rotary = true;
  o2.self_attention.rotary_options.style = kfa::nn::RotaryStyle::interleaved;
  o2.cross_attention.alibi = true;
  return cases;
}

const char* const kDecoderNames[] = {"norm1.weight", "norm1.bias",     "norm2.weight",
                                     "norm2.bias",   "norm3.weight",   "norm3.bias",
                                     "linear1.weight", "linear1.bias", "linear2.weight",
                                     "linear2.bias"};

/// The oracle's y, dx, dmemory and gradients for a block's parameters on
/// x [B·S][d], memory [B·Skv][d_kv], dy [B·S][d].
struct DecoderReference {
  Tensor y, dx, dmemory;
  std::vector<Tensor> g;
  MhaParams sg, cg;
};

template <class Block>
DecoderReference decoder_reference(const Block& block, int B, int S, int Skv, const Tensor& x,
                                   const Tensor& memory, const Tensor& dy) {
  const auto& o = block.options();
  const MhaParams sp = mha_params(block.self_attention(), false);
  const MhaParams cp = mha_params(block.cross_attention(), false);
  DecoderOracle oracle{o,
                       MhaOracle{o.self_attention, sp, B, S, {}, {}, {}, {}, {}, {}},
                       MhaOracle{o.cross_attention, cp, B, S, {}, {}, {}, {}, {}, {}},
                       decoder_tensors(block, false),
                       Skv};
  if (o.self_attention.alibi) oracle.self_mha.extras = alibi_extras(o.self_attention.heads);
  if (o.cross_attention.alibi) oracle.cross_mha.extras = alibi_extras(o.cross_attention.heads);
  oracle.forward(x, memory);
  DecoderReference r;
  r.y = oracle.y;
  for (const Tensor& t : oracle.w) r.g.push_back(zeros_like(t));
  r.sg = zero_grads(sp);
  r.cg = zero_grads(cp);
  oracle.backward(x, memory, dy, r.dx, r.dmemory, r.g, r.sg, r.cg);
  return r;
}

MhaParams doubled(const MhaParams& p) {
  return {added(p.wq, p.wq), added(p.wk, p.wk), added(p.wv, p.wv), added(p.wo, p.wo),
          added(p.bq, p.bq), added(p.bk, p.bk), added(p.bv, p.bv), added(p.bo, p.bo),
          added(p.qn, p.qn), added(p.kn, p.kn)};
}

template <class T, class Block>
void expect_decoder_grads(const std::string& what, const Block& block,
                          const DecoderReference& ref, double factor) {
  const std::vector<Tensor> g = decoder_tensors(block, true);
  for (int n = 0; n < 10; ++n)
    expect_close_rel<T>(what + " d " + kDecoderNames[n], g[n], ref.g[n], factor);
  expect_mha_grads<T>(what + " self_attn", mha_params(block.self_attention(), true), ref.sg,
                      factor);
  expect_mha_grads<T>(what + " multihead_attn", mha_params(block.cross_attention(), true), ref.cg,
                      factor);
}

TYPED_TEST(NnDecoder, MatchesOracle) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  using Block = kfa::nn::TransformerDecoderBlock<Space, T>;
  const int B = 2, d = 48;
  int index = 0;
  for (const auto& c : decoder_cases()) {
    const int S = c.S, Skv = c.Skv, dkv = c.d_kv;
    const std::string tag = "nn_decoder_" + std::to_string(index++);
    const std::string what = tag + " " + type_name<T>() + " " + Space::name() + " seed " +
                             std::to_string(test_seed(tag));
    Block block(c.options);
    EXPECT_EQ(block.self_attention().options().attention.causal, c.options.causal) << what;
    std::mt19937_64 rng(test_seed(tag));
    randomize_parameters(block.parameters(), rng);
    const Tensor x = rounded<T>(random_tensor({B * S, d}, rng));
    const Tensor memory = rounded<T>(random_tensor({B * Skv, dkv}, rng));
    const Tensor dy = rounded<T>(random_tensor({B * S, d}, rng));
    auto xv = make_view<DeviceView3<T, Space>>(reshaped(x, {B, S, d}), "x");
    auto mv = make_view<DeviceView3<T, Space>>(reshaped(memory, {B, Skv, dkv}), "memory");
    auto dyv = make_view<DeviceView3<T, Space>>(reshaped(dy, {B, S, d}), "dy");
    DeviceView3<T, Space> yv("y", B, S, d), dxv("dx", B, S, d), dmv("dmemory", B, Skv, dkv);
    poison(yv);
    poison(dxv);
    poison(dmv);
    typename Block::context_type context;
    block.forward(Space(), xv, mv, yv, context);
    block.backward(Space(), dyv, dxv, dmv, context);
    Space().fence();

    const DecoderReference ref = decoder_reference(block, B, S, Skv, x, memory, dy);
    const double factor = 16.0 * (d + S + Skv + c.options.d_ff);
    expect_close_rel<T>(what + " y", reshaped(to_host(yv), {B * S, d}), ref.y, factor);
    expect_close_rel<T>(what + " dx", reshaped(to_host(dxv), {B * S, d}), ref.dx, factor);
    expect_close_rel<T>(what + " dmemory", reshaped(to_host(dmv), {B * Skv, dkv}), ref.dmemory,
                        factor);
    expect_decoder_grads<T>(what, block, ref, factor * 4);

    // A second backward adds the same gradients again (and writes the same
    // dx and dmemory); zero_grad resets every gradient.
    poison(dxv);
    poison(dmv);
    block.backward(Space(), dyv, dxv, dmv, context);
    Space().fence();
    expect_close_rel<T>(what + " dx again", reshaped(to_host(dxv), {B * S, d}), ref.dx, factor);
    expect_close_rel<T>(what + " dmemory again", reshaped(to_host(dmv), {B * Skv, dkv}),
                        ref.dmemory, factor);
    DecoderReference twice = ref;
    for (std::size_t n = 0; n < twice.g.size(); ++n) twice.g[n] = added(ref.g[n], ref.g[n]);
    twice.sg = doubled(ref.sg);
    twice.cg = doubled(ref.cg);
    expect_decoder_grads<T>(what + " accumulated", block, twice, factor * 8);
    block.zero_grad(Space());
    Space().fence();
    for (const auto& p : block.parameters())
      EXPECT_EQ(max_abs(to_host(p.grad)), 0.0) << what << " zero_grad " << p.name;
  }
}

/// Causal self-attention: the first target token sees only itself, so y's
/// first row does not change when the later tokens do.
TYPED_TEST(NnDecoder, CausalSelfAttentionIgnoresLaterTokens) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  using Block = kfa::nn::TransformerDecoderBlock<Space, T>;
  const int B = 1, S = 7, Skv = 5, d = 16;
  kfa::nn::TransformerDecoderBlockOptions options;
  options.self_attention.d_model = d;
  options.self_attention.heads = 2;
  options.d_ff = 24;
  for (const bool causal : {true, false}) {
    options.causal = causal;
    Block block(options);
    std::mt19937_64 rng(test_seed("nn_decoder_causal"));
    randomize_parameters(block.parameters(), rng);
    Tensor x = random_tensor({B, S, d}, rng);
    const Tensor memory = random_tensor({B, Skv, d}, rng);
    auto mv = make_view<DeviceView3<T, Space>>(memory, "memory");
    DeviceView3<T, Space> y1("y1", B, S, d), y2("y2", B, S, d);
    typename Block::context_type context;
    block.forward(Space(), make_view<DeviceView3<T, Space>>(x, "x"), mv, y1, context);
    // Not a shift per token, which the norm would take out.
    for (std::size_t n = d; n < x.data.size(); ++n) x.data[n] = 0.5 * double(n % 5) - x.data[n];
    block.forward(Space(), make_view<DeviceView3<T, Space>>(x, "x"), mv, y2, context);
    Space().fence();
    const Tensor h1 = to_host(y1), h2 = to_host(y2);
    double first_row = 0;
    for (int c = 0; c < d; ++c) first_row = std::max(first_row, std::abs(h1.data[c] - h2.data[c]));
    if (causal)
      EXPECT_EQ(first_row, 0.0) << "causal: row 0 saw later tokens";
    else
      EXPECT_GT(first_row, 1e-4) << "not causal: row 0 should see later tokens";
  }
}

template <class Layer>
void copy_parameters(const Layer& from, const Layer& to) {
  const auto a = from.parameters(), b = to.parameters();
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t n = 0; n < a.size(); ++n) Kokkos::deep_copy(b[n].value, a[n].value);
}

template <class T, class ViewType>
bool bitwise_same(const ViewType& a, const ViewType& b) {
  auto ha = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), a);
  auto hb = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), b);
  return ha.size() == hb.size() && std::memcmp(ha.data(), hb.data(), ha.size() * sizeof(T)) == 0;
}

/// The recompute mode against the default on the host, every dropout on:
/// y, dx, dmemory and every parameter gradient bitwise equal, and nothing
/// but the references to x and memory kept between forward and backward.
TYPED_TEST(NnDecoder, RecomputeIsBitwiseAndSavesMemory) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  using Block = kfa::nn::TransformerDecoderBlock<Space, T>;
  if (!Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename Space::memory_space>::accessible)
    GTEST_SKIP() << "bitwise equality is checked on host backends";
  const int B = 2, S = 21, Skv = 17, d = 32;
  kfa::nn::TransformerDecoderBlockOptions options;
  options.self_attention.d_model = d;
  options.self_attention.heads = 4;
  options.self_attention.kv_heads = 2;
  options.self_attention.rotary = true;
  options.self_attention.attention.dropout_p = 0.1;
  options.cross_attention.qk_norm = true;
  options.cross_attention.attention.dropout_p = 0.1;
  options.d_ff = 48;
  options.dropout_p = 0.1;
  options.norm = kfa::nn::Norm::rms_norm;
  options.activation = kfa::nn::Activation::swiglu;
  Block plain(options);
  options.cross_attention.recompute = true;  // the block's recompute, through an attention's flag
  Block recomputing(options);
  EXPECT_TRUE(recomputing.options().recompute);
  EXPECT_FALSE(recomputing.cross_attention().options().recompute);
  std::mt19937_64 rng(test_seed("nn_decoder_recompute"));
  randomize_parameters(plain.parameters(), rng);
  copy_parameters(plain, recomputing);
  const Tensor x = random_tensor({B, S, d}, rng), dy = random_tensor({B, S, d}, rng);
  const Tensor memory = random_tensor({B, Skv, d}, rng);
  auto xv = make_view<DeviceView3<T, Space>>(x, "x");
  auto dyv = make_view<DeviceView3<T, Space>>(dy, "dy");
  auto mv = make_view<DeviceView3<T, Space>>(memory, "memory");
  typename Block::context_type c_plain, c_re;
  c_plain.dropout_seed = c_re.dropout_seed = 9;
  DeviceView3<T, Space> y1("y1", B, S, d), y2("y2", B, S, d), dx1("dx1", B, S, d),
      dx2("dx2", B, S, d), dm1("dm1", B, Skv, d), dm2("dm2", B, Skv, d);
  plain.forward(Space(), xv, mv, y1, c_plain);
  recomputing.forward(Space(), xv, mv, y2, c_re);
  const std::size_t bytes_plain = c_plain.saved_bytes(), bytes_re = c_re.saved_bytes();
  // No View of the context may keep a block tensor alive either.
  EXPECT_EQ(c_re.self_attention.x.data(), xv.data());
  EXPECT_EQ(c_re.cross_attention.x.data(), xv.data());
  plain.backward(Space(), dyv, dx1, dm1, c_plain);
  recomputing.backward(Space(), dyv, dx2, dm2, c_re);
  Space().fence();
  const std::string what = std::string("decoder ") + type_name<T>() + " " + Space::name();
  EXPECT_TRUE(bitwise_same<T>(y1, y2)) << what << " y";
  EXPECT_TRUE(bitwise_same<T>(dx1, dx2)) << what << " dx";
  EXPECT_TRUE(bitwise_same<T>(dm1, dm2)) << what << " dmemory";
  const auto pa = plain.parameters(), pb = recomputing.parameters();
  for (std::size_t n = 0; n < pa.size(); ++n)
    EXPECT_TRUE(bitwise_same<T>(pa[n].grad, pb[n].grad)) << what << " d " << pa[n].name;
  std::cout << "[ memory   ] " << what << ": context after forward " << bytes_plain
            << " bytes, recompute " << bytes_re << " bytes" << std::endl;
  EXPECT_EQ(bytes_re, 0u) << what;
  EXPECT_GT(bytes_plain, 0u) << what;
  EXPECT_EQ(c_re.saved_bytes(), 0u) << what << " after the backward";
}

/// Finite differences of L = Σ dy·block(x, memory) on the device in fp64,
/// with dropout in both attentions' weights, the residuals and the MLP
/// (fixed seeds: L is a smooth function), against the block's backward.
TYPED_TEST(NnDecoder, FiniteDifferencesWithDropout) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  using Block = kfa::nn::TransformerDecoderBlock<Space, T>;
  if (!std::is_same<T, double>::value) GTEST_SKIP() << "fp64 only";
  const int B = 2, S = 9, Skv = 6, d = 16;
  kfa::nn::TransformerDecoderBlockOptions options;
  options.self_attention.d_model = d;
  options.self_attention.heads = 2;
  options.self_attention.rotary = true;
  options.self_attention.attention.dropout_p = 0.2;
  options.cross_attention.attention.dropout_p = 0.2;
  options.d_ff = 20;
  options.dropout_p = 0.1;
  const std::string tag = "nn_decoder_fd";
  std::mt19937_64 rng(test_seed(tag));
  Block block(options);
  randomize_parameters(block.parameters(), rng);
  const Tensor x = random_tensor({B, S, d}, rng), dy = random_tensor({B, S, d}, rng);
  const Tensor memory = random_tensor({B, Skv, d}, rng);
  auto xv = make_view<DeviceView3<T, Space>>(x, "x");
  auto mv = make_view<DeviceView3<T, Space>>(memory, "memory");
  auto dyv = make_view<DeviceView3<T, Space>>(dy, "dy");
  DeviceView3<T, Space> yv("y", B, S, d), dxv("dx", B, S, d), dmv("dm", B, Skv, d);
  typename Block::context_type context;
  context.dropout_seed = 31;
  auto loss = [&]() {
    block.forward(Space(), xv, mv, yv, context);
    Space().fence();
    const Tensor y = to_host(yv);
    double s = 0;
    for (std::size_t n = 0; n < y.data.size(); ++n) s += y.data[n] * dy.data[n];
    return s;
  };
  const double y_train = loss();
  block.zero_grad(Space());
  block.backward(Space(), dyv, dxv, dmv, context);
  Space().fence();
  const Tensor dx = to_host(dxv), dm = to_host(dmv);
  const auto params = block.parameters();
  std::vector<Tensor> grads;
  for (const auto& p : params) grads.push_back(to_host(p.grad));

  const double h = 1e-6;
  auto central = [&](auto&& perturb) {
    perturb(h);
    const double plus = loss();
    perturb(-2 * h);
    const double minus = loss();
    perturb(h);
    return (plus - minus) / (2 * h);
  };
  auto probe_input = [&](const DeviceView3<T, Space>& view, const Tensor& grad, const char* name) {
    for (int probe = 0; probe < 4; ++probe) {
      const std::size_t n = (probe * 131 + 7) % grad.data.size();
      auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), view);
      const double fd = central([&](double delta) {
        host.data()[n] += delta;
        Kokkos::deep_copy(view, host);
      });
      EXPECT_NEAR(grad.data[n], fd, 1e-5 * std::max(1.0, std::abs(fd)))
          << tag << " " << name << "[" << n << "]";
    }
  };
  probe_input(xv, dx, "dx");
  probe_input(mv, dm, "dmemory");
  for (std::size_t p = 0; p < params.size(); ++p) {
    const std::size_t n = (p * 37 + 3) % params[p].value.size();
    auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), params[p].value);
    const double fd = central([&](double delta) {
      host.data()[n] += delta;
      Kokkos::deep_copy(params[p].value, host);
    });
    EXPECT_NEAR(grads[p].data[n], fd, 1e-5 * std::max(1.0, std::abs(fd)))
        << tag << " " << params[p].name << "[" << n << "]";
  }
  context.training = false;
  EXPECT_GT(std::abs(y_train - loss()), 1e-6) << tag << " dropout changed nothing";
}

/// parameters() gives torch.nn.TransformerDecoderLayer's state_dict names
/// in its order.
TYPED_TEST(NnDecoder, ParametersHavePyTorchNames) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  kfa::nn::TransformerDecoderBlockOptions options;
  options.self_attention.d_model = 16;
  options.self_attention.heads = 2;
  options.d_ff = 8;
  kfa::nn::TransformerDecoderBlock<Space, T> block(options);
  std::vector<std::string> names;
  for (const auto& p : block.parameters("layers.1.")) names.push_back(p.name);
  std::vector<std::string> expected;
  for (const char* attn : {"self_attn.", "multihead_attn."})
    for (const char* n : {"in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"})
      expected.push_back(std::string("layers.1.") + attn + n);
  for (const char* n : {"linear1.weight", "linear1.bias", "linear2.weight", "linear2.bias",
                        "norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias", "norm3.weight",
                        "norm3.bias"})
    expected.push_back(std::string("layers.1.") + n);
  EXPECT_EQ(names, expected);
  // The two attentions start from different weights.
  const Tensor wq_self = param(block.self_attention().weights().w_qkv);
  const Tensor wq_cross = param(block.cross_attention().weights().w_qkv);
  EXPECT_GT(max_abs_diff(wq_self, wq_cross), 0.0);
}

#if KFA_ENABLE_SAFETENSORS
/// Save and load give bitwise the same parameters and outputs, the file
/// holds exactly the names of parameters(prefix), and Llama names are
/// refused with the layer unchanged.
TYPED_TEST(NnDecoder, SafetensorsRoundTripIsBitwise) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  using Block = kfa::nn::TransformerDecoderBlock<Space, T>;
  const int B = 2, S = 5, Skv = 4, d = 24;
  kfa::nn::TransformerDecoderBlockOptions options;
  options.self_attention.d_model = d;
  options.self_attention.heads = 4;
  options.self_attention.kv_heads = 2;
  options.cross_attention.fused_qkv = false;
  options.cross_attention.d_model_kv = 12;
  options.d_ff = 20;
  Block a(options), b(options);
  const std::string tag = std::string("decoder_weights_") + type_name<T>() + "_" + Space::name();
  std::mt19937_64 rng(test_seed(tag));
  randomize_parameters(a.parameters(), rng);
  const std::string path = ::testing::TempDir() + "kfa_" + tag + ".safetensors";
  kfa::nn::SafetensorsOptions io;
  io.prefix = "model.decoder.layers.0.";
  kfa::nn::save_safetensors(Space(), path, a, io);
  kfa::nn::load_safetensors(Space(), path, b, io);
  const auto pa = a.parameters(), pb = b.parameters();
  for (std::size_t n = 0; n < pa.size(); ++n)
    EXPECT_TRUE(bitwise_same<T>(pa[n].value, pb[n].value)) << tag << " " << pa[n].name;
  const auto contents = kfa::nn::read_safetensors<T>(path);
  std::vector<std::string> expected, got;
  for (const auto& p : a.parameters(io.prefix)) expected.push_back(p.name);
  for (const auto& entry : contents.tensors) got.push_back(entry.first);
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(got, expected) << tag;
  EXPECT_EQ(contents.tensors.at("model.decoder.layers.0.multihead_attn.k_proj.weight").shape,
            (std::vector<std::size_t>{24, 12}))
      << tag;

  std::mt19937_64 io_rng(test_seed(tag + "_io"));
  auto xv = make_view<DeviceView3<T, Space>>(random_tensor({B, S, d}, io_rng), "x");
  auto mv = make_view<DeviceView3<T, Space>>(random_tensor({B, Skv, 12}, io_rng), "memory");
  DeviceView3<T, Space> ya("ya", B, S, d), yb("yb", B, S, d);
  typename Block::context_type ca, cb;
  a.forward(Space(), xv, mv, ya, ca);
  b.forward(Space(), xv, mv, yb, cb);
  Space().fence();
  EXPECT_TRUE(bitwise_same<T>(ya, yb)) << tag << " outputs";

  kfa::nn::SafetensorsOptions llama = io;
  llama.names = kfa::nn::ParameterNames::llama;
  const Tensor before = to_host(pb[0].value);
  expect_invalid_argument([&] { kfa::nn::load_safetensors(Space(), path, b, llama); },
                          "ParameterNames::llama has no names for a decoder block's "
                          "cross-attention");
  EXPECT_EQ(max_abs_diff(to_host(pb[0].value), before), 0.0) << tag << " changed";
  std::remove(path.c_str());
}
#endif

/// Bad shapes, a backward before its forward, inconsistent options: named
/// std::invalid_argument, outputs untouched.
TYPED_TEST(NnDecoder, BadInputThrowsAndWritesNothing) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  using Block = kfa::nn::TransformerDecoderBlock<Space, T>;
  kfa::nn::TransformerDecoderBlockOptions options;
  options.self_attention.d_model = 16;
  options.self_attention.heads = 2;
  options.cross_attention.d_model_kv = 12;
  options.cross_attention.fused_qkv = false;
  options.d_ff = 8;
  Block block(options);
  typename Block::context_type context;
  DeviceView3<T, Space> x("x", 2, 5, 16), m("m", 2, 7, 12), y("y", 2, 5, 16),
      x_bad("x_bad", 2, 5, 12), m_bad("m_bad", 2, 7, 16), m_batch("m_batch", 3, 7, 12),
      y_short("y_short", 2, 4, 16), dx("dx", 2, 5, 16), dm("dm", 2, 7, 12),
      dm_short("dm_short", 2, 6, 12);
  const DeviceView3<T, Space> written[] = {y, dx, dm, y_short};
  for (const auto& v : written) Kokkos::deep_copy(v, T(3));
  const std::string f = "kfa::nn::TransformerDecoderBlock::forward: ";
  const std::string b = "kfa::nn::TransformerDecoderBlock::backward: ";
  expect_invalid_argument([&] { block.forward(Space(), x_bad, m, y, context); },
                          f + "x must be [batch][seqlen][d_model] with d_model = 16, got "
                              "[2][5][12]");
  expect_invalid_argument([&] { block.forward(Space(), x, m_bad, y, context); },
                          f + "memory must be [batch][seqlen_kv][d_model_kv] with batch = 2 and "
                              "d_model_kv = 12, got [2][7][16]");
  expect_invalid_argument([&] { block.forward(Space(), x, m_batch, y, context); },
                          "memory must be [batch][seqlen_kv][d_model_kv] with batch = 2");
  expect_invalid_argument([&] { block.forward(Space(), x, m, y_short, context); },
                          f + "y must be [batch][seqlen][d_model] = [2][5][16], got [2][4][16]");
  expect_invalid_argument([&] { block.forward(Space(), x, m, x, context); },
                          "y must not overlap x");
  expect_invalid_argument([&] { block.backward(Space(), y, dx, dm, context); },
                          b + "dy [2][5][16] must have the shape of the forward's x");
  block.forward(Space(), x, m, y, context);
  Space().fence();
  Kokkos::deep_copy(y, T(3));
  expect_invalid_argument([&] { block.backward(Space(), y, dx, dm_short, context); },
                          b + "dmemory [2][6][12] must have the shape of the forward's memory "
                              "[2][7][12]");
  expect_invalid_argument([&] { block.backward(Space(), y, dx, m_bad, context); },
                          "dmemory must be [batch][seqlen_kv][d_model_kv]");
  expect_invalid_argument([&] { block.backward(Space(), y, y_short, dm, context); },
                          "dx must be [batch][seqlen][d_model] = [2][5][16], got [2][4][16]");
  expect_invalid_argument([&] { block.backward(Space(), y, y, dm, context); },
                          "dx must not overlap dy");

  const char* c = "kfa::nn::TransformerDecoderBlock: ";
  expect_invalid_argument([&] {
    auto o = options;
    o.d_ff = 0;
    Block bad(o);
  }, std::string(c) + "options.d_ff must be > 0");
  expect_invalid_argument([&] {
    auto o = options;
    o.dropout_p = 1;
    Block bad(o);
  }, "options.dropout_p");
  expect_invalid_argument([&] {
    auto o = options;
    o.cross_attention.d_model = 24;
    Block bad(o);
  }, std::string(c) + "options.cross_attention.d_model must be 0 or "
                      "options.self_attention.d_model (16), got 24");
  expect_invalid_argument([&] {
    auto o = options;
    o.self_attention.d_model_kv = 12;
    o.self_attention.fused_qkv = false;
    Block bad(o);
  }, "options.self_attention.d_model_kv must be 0 or d_model, got 12");
  expect_invalid_argument([&] {
    auto o = options;
    o.cross_attention.fused_qkv = true;
    Block bad(o);
  }, "options.fused_qkv needs d_model_kv = d_model (got 12 and 16)");

  for (const auto& v : written) {
    auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
    for (std::size_t n = 0; n < host.size(); ++n)
      ASSERT_EQ(host.data()[n], T(3)) << v.label() << " written";
  }
}

}  // namespace
