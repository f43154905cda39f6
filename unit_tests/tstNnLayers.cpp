// kfa::nn::MultiHeadAttention and kfa::nn::TransformerBlock, forward and
// backward (the input gradient and every parameter gradient), against an
// fp64 host oracle composed from the step oracles of nn_test_helpers.hpp and
// the attention oracle of kfa_test_helpers.hpp, on awkward shapes (d_model
// 48, 3 heads, seqlen 37, batch 2), with grouped-query heads, both rotary
// conventions, fused and separate projections; gradient accumulation and
// zero_grad; finite differences of the device forward (fp64, with dropout)
// as an extra check.

#include "nn_layer_oracles.hpp"

#include <array>
#include <cstring>
#include <functional>

namespace {

using namespace kfa_test;


std::vector<kfa::nn::MultiHeadAttentionOptions> mha_cases() {
  std::vector<kfa::nn::MultiHeadAttentionOptions> cases(5);
  for (auto& o : cases) o.d_model = 48;
  cases[0].heads = 3;  // fused, biases, plain
  cases[1].heads = 4;  // separate, grouped-query, half-split rotary, causal
  cases[1].kv_heads = 2;
  cases[1].head_dim = 12;
  cases[1].fused_qkv = false;
  cases[1].rotary = true;
  cases[1].attention.causal = true;
  cases[2].heads = 3;  // fused, no bias, multi-query, interleaved partial rotary, window, softcap
  cases[2].kv_heads = 1;
  cases[2].bias = false;
  cases[2].rotary = true;
  cases[2].rotary_options.style = kfa::nn::RotaryStyle::interleaved;
  cases[2].rotary_options.rotary_dim = 10;
  cases[2].attention.window_left = 8;
  cases[2].attention.window_right = 2;
  cases[2].attention.softcap = 5;
  cases[3].heads = 4;  // fused, grouped-query, qk-norm before half-split partial rotary, causal
  cases[3].kv_heads = 2;
  cases[3].head_dim = 12;
  cases[3].qk_norm = true;
  cases[3].qk_norm_options.eps = 1e-6;
  cases[3].rotary = true;
  cases[3].rotary_options.rotary_dim = 8;
  cases[3].attention.causal = true;
  cases[4].heads = 3;  // separate, no bias, qk-norm without rotary
  cases[4].fused_qkv = false;
  cases[4].bias = false;
  cases[4].qk_norm = true;
  return cases;
}

/// One forward and backward of `layer` on the device with random parameters
/// and random x, dy [batch·seqlen][d_model] (rounded to T): the host copies
/// of x, dy, y and dx; the context stays for further backward calls.
template <class Space, class T, class Layer>
struct LayerRun {
  Tensor x, dy, y, dx;
  DeviceView3<T, Space> xv, dyv, yv, dxv;
  typename Layer::context_type context;

  LayerRun(Layer& layer, const std::string& tag, int B, int S, int d) {
    std::mt19937_64 rng(test_seed(tag));
    randomize_parameters(layer.parameters(), rng);
    x = rounded<T>(random_tensor({B * S, d}, rng));
    dy = rounded<T>(random_tensor({B * S, d}, rng));
    xv = make_view<DeviceView3<T, Space>>(reshaped(x, {B, S, d}), "x");
    dyv = make_view<DeviceView3<T, Space>>(reshaped(dy, {B, S, d}), "dy");
    yv = DeviceView3<T, Space>("y", B, S, d);
    dxv = DeviceView3<T, Space>("dx", B, S, d);
    poison(yv);
    poison(dxv);
    layer.forward(Space(), xv, yv, context);
    layer.backward(Space(), dyv, dxv, context);
    Space().fence();
    y = reshaped(to_host(yv), {B * S, d});
    dx = reshaped(to_host(dxv), {B * S, d});
  }
};

template <class C>
class NnLayers : public ::testing::Test {};
TYPED_TEST_SUITE(NnLayers, NnConfigs);

TYPED_TEST(NnLayers, MultiHeadAttentionMatchesOracle) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  const int B = 2, S = 37, d = 48;
  int index = 0;
  for (const auto& options : mha_cases()) {
    const std::string tag = "nn_mha_" + std::to_string(index++);
    const std::string what = tag + " " + type_name<T>() + " " + Space::name() + " seed " +
                             std::to_string(test_seed(tag));
    kfa::nn::MultiHeadAttention<Space, T> mha(options);
    LayerRun<Space, T, decltype(mha)> run(mha, tag, B, S, d);
    const Tensor &x = run.x, &dy = run.dy;

    const MhaParams p = mha_params(mha, false);
    MhaOracle oracle{mha.options(), p, B, S, {}, {}, {}, {}, {}, {}};
    oracle.forward(x);
    Tensor dx_ref;
    MhaParams g_ref = zero_grads(p);
    oracle.backward(x, dy, dx_ref, g_ref);
    const double factor = 16.0 * (d + S);
    expect_close_rel<T>(what + " y", run.y, oracle.y, factor);
    expect_close_rel<T>(what + " dx", run.dx, dx_ref, factor);
    expect_mha_grads<T>(what, mha_params(mha, true), g_ref, factor * 4);

    // A second backward adds the same gradients again; zero_grad resets them.
    mha.backward(Space(), run.dyv, run.dxv, run.context);
    Space().fence();
    MhaParams twice = g_ref;
    oracle.backward(x, dy, dx_ref, twice);
    expect_mha_grads<T>(what + " accumulated", mha_params(mha, true), twice, factor * 8);
    mha.zero_grad(Space());
    Space().fence();
    EXPECT_EQ(max_abs(mha_params(mha, true).wo), 0.0) << what << " zero_grad";
  }
}

/// Cross-attention: q from x [B][S][d], k and v from a memory [B][Skv][d_kv]
/// (fused k|v rows of in_proj_weight when d_kv = d, separate projections of
/// another width otherwise); causal with S > Skv (bottom-right aligned: the
/// first S - Skv rows see no key) and with S < Skv.
TYPED_TEST(NnLayers, CrossAttentionMatchesOracle) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  const int B = 2, d = 48;
  std::vector<kfa::nn::MultiHeadAttentionOptions> cases(2);
  for (auto& o : cases) {
    o.d_model = d;
    o.attention.causal = true;
  }
  const int seqlens[2][2] = {{37, 23}, {19, 41}};
  cases[0].heads = 3;  // fused q | k,v, biases, rotary
  cases[0].rotary = true;
  cases[1].heads = 4;  // separate, memory of 20 features, grouped-query, qk-norm, rotary
  cases[1].kv_heads = 2;
  cases[1].head_dim = 12;
  cases[1].d_model_kv = 20;
  cases[1].fused_qkv = false;
  cases[1].qk_norm = true;
  cases[1].rotary = true;
  cases[1].rotary_options.style = kfa::nn::RotaryStyle::interleaved;
  for (int index = 0; index < 2; ++index) {
    const auto& options = cases[index];
    const int S = seqlens[index][0], Skv = seqlens[index][1];
    const int dkv = options.d_model_kv > 0 ? options.d_model_kv : d;
    const std::string tag = "nn_cross_" + std::to_string(index);
    const std::string what = tag + " " + type_name<T>() + " " + Space::name() + " seed " +
                             std::to_string(test_seed(tag));
    kfa::nn::MultiHeadAttention<Space, T> mha(options);
    std::mt19937_64 rng(test_seed(tag));
    randomize_parameters(mha.parameters(), rng);
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
    typename kfa::nn::MultiHeadAttention<Space, T>::context_type context;
    mha.forward(Space(), xv, mv, yv, context);
    mha.backward(Space(), dyv, dxv, dmv, context);
    Space().fence();

    const MhaParams p = mha_params(mha, false);
    MhaOracle oracle{mha.options(), p, B, S, {}, {}, {}, {}, {}, {}};
    oracle.forward(x, memory, Skv);
    Tensor dx_ref, dm_ref;
    MhaParams g_ref = zero_grads(p);
    oracle.backward(x, memory, dy, dx_ref, dm_ref, g_ref);
    const double factor = 16.0 * (d + S + Skv);
    expect_close_rel<T>(what + " y", reshaped(to_host(yv), {B * S, d}), oracle.y, factor);
    expect_close_rel<T>(what + " dx", reshaped(to_host(dxv), {B * S, d}), dx_ref, factor);
    expect_close_rel<T>(what + " dmemory", reshaped(to_host(dmv), {B * Skv, dkv}), dm_ref,
                        factor);
    expect_mha_grads<T>(what, mha_params(mha, true), g_ref, factor * 4);
    if (index == 0) {
      // Causal with S > Skv: the first S - Skv query rows see no key, their
      // attention output is 0 and y there is out_proj's bias.
      const Tensor y = reshaped(to_host(yv), {B * S, d});
      for (int c = 0; c < d; ++c) EXPECT_EQ(y.data[c], T(p.bo.data[c])) << what << " row 0";
    }
  }
}

/// Bad memory, wrong backward overloads, options that do not fit: named
/// std::invalid_argument, outputs untouched.
TYPED_TEST(NnLayers, CrossAttentionBadInputThrowsAndWritesNothing) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  using Layer = kfa::nn::MultiHeadAttention<Space, T>;
  kfa::nn::MultiHeadAttentionOptions options;
  options.d_model = 16;
  options.heads = 2;
  options.d_model_kv = 12;
  options.fused_qkv = false;
  Layer mha(options);
  typename Layer::context_type context, self_context;
  DeviceView3<T, Space> x("x", 2, 5, 16), m("m", 2, 7, 12), y("y", 2, 5, 16),
      m_bad("m_bad", 2, 7, 16), m_batch("m_batch", 3, 7, 12), dx("dx", 2, 5, 16),
      dm("dm", 2, 7, 12), dm_short("dm_short", 2, 6, 12);
  Kokkos::deep_copy(y, T(3));
  Kokkos::deep_copy(dx, T(3));
  Kokkos::deep_copy(dm, T(3));
  const char* f = "kfa::nn::MultiHeadAttention::forward: ";
  expect_invalid_argument([&] { mha.forward(Space(), x, m_bad, y, context); },
                          std::string(f) + "memory must be [batch][seqlen_kv][d_model_kv] with "
                          "batch = 2 and d_model_kv = 12, got [2][7][16]");
  expect_invalid_argument([&] { mha.forward(Space(), x, m_batch, y, context); },
                          "memory must be [batch][seqlen_kv][d_model_kv] with batch = 2");
  expect_invalid_argument([&] { mha.forward(Space(), x, y, context); },
                          "self-attention needs options.d_model_kv = d_model (16), got 12");
  expect_invalid_argument([&] { mha.backward(Space(), y, dx, dm, context); },
                          "call forward with this context first");
  mha.forward(Space(), x, m, y, context);
  Kokkos::deep_copy(y, T(3));
  expect_invalid_argument([&] { mha.backward(Space(), y, dx, context); },
                          "the forward had a memory (cross-attention): call backward(space, dy, "
                          "dx, dmemory, context)");
  expect_invalid_argument([&] { mha.backward(Space(), y, dx, dm_short, context); },
                          "dmemory [2][6][12] must have the shape of the forward's memory "
                          "[2][7][12]");
  expect_invalid_argument([&] { mha.backward(Space(), y, dx, m_bad, context); },
                          "dmemory must be [batch][seqlen_kv][d_model_kv]");
  options.d_model_kv = 16;
  Layer same_width(options);
  DeviceView3<T, Space> y_self("y_self", 2, 5, 16);
  same_width.forward(Space(), x, y_self, self_context);
  expect_invalid_argument([&] { same_width.backward(Space(), dx, x, m_bad, self_context); },
                          "dmemory needs a cross-attention forward");
  expect_invalid_argument([&] { same_width.forward(Space(), x, m_bad, m_bad, context); },
                          "y must be [batch][seqlen][d_model] = [2][5][16], got [2][7][16]");
  options.d_model_kv = 12;
  options.fused_qkv = true;
  expect_invalid_argument([&] { Layer bad(options); },
                          "options.fused_qkv needs d_model_kv = d_model (got 12 and 16)");
  kfa::nn::TransformerBlockOptions block_options;
  block_options.attention = options;
  block_options.attention.fused_qkv = false;
  block_options.d_ff = 8;
  expect_invalid_argument([&] { kfa::nn::TransformerBlock<Space, T> bad(block_options); },
                          "options.attention.d_model_kv must be 0 or d_model");
  const DeviceView3<T, Space> written[] = {y, dx, dm};
  for (const auto& v : written) {
    auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
    for (std::size_t n = 0; n < host.size(); ++n)
      ASSERT_EQ(host.data()[n], T(3)) << v.label() << " written";
  }
}


std::vector<kfa::nn::TransformerBlockOptions> block_cases() {
  std::vector<kfa::nn::TransformerBlockOptions> cases(3);
  for (auto& o : cases) {
    o.attention.d_model = 48;
    o.attention.heads = 3;
    o.d_ff = 40;
  }
  // torch.nn.TransformerEncoderLayer(norm_first=True), causal.
  cases[0].attention.attention.causal = true;
  // Llama: RMSNorm, SwiGLU, no biases, separate projections, GQA, rotary.
  cases[1].norm = kfa::nn::Norm::rms_norm;
  cases[1].activation = kfa::nn::Activation::swiglu;
  cases[1].bias = false;
  cases[1].attention.heads = 4;
  cases[1].attention.kv_heads = 2;
  cases[1].attention.head_dim = 12;
  cases[1].attention.fused_qkv = false;
  cases[1].attention.rotary = true;
  cases[1].attention.attention.causal = true;
  // GELU (tanh), LayerNorm without bias, qk-norm, rotary interleaved.
  cases[2].activation = kfa::nn::Activation::gelu_tanh;
  cases[2].bias = false;
  cases[2].attention.rotary = true;
  cases[2].attention.rotary_options.style = kfa::nn::RotaryStyle::interleaved;
  cases[2].attention.qk_norm = true;
  return cases;
}

/// The block's y and dx [B·S][d] and every gradient against the oracle on
/// x, dy [B·S][d]; `extras` is the attention's score modifier.
template <class T, class Block>
void expect_block_matches_oracle(const std::string& what, const Block& block, const Tensor& x,
                                 const Tensor& dy, const Tensor& y, const Tensor& dx, int B,
                                 int S, const RefExtras& extras = {}) {
  const auto& options = block.options();
  const int d = options.attention.d_model;
  const char* names[] = {"norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias",
                         "linear1.weight", "linear1.bias", "linear2.weight", "linear2.bias"};
  const MhaParams mp = mha_params(block.attention(), false);
  const std::vector<Tensor> w = block_tensors(block, false);
  BlockOracle oracle{options, MhaOracle{options.attention, mp, B, S, {}, {}, {}, {}, {}, {}},
                     w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]};
  oracle.mha.extras = extras;
  oracle.forward(x);
  std::vector<Tensor> g_ref;
  for (const Tensor& t : w) g_ref.push_back(zeros_like(t));
  MhaParams mg_ref = zero_grads(mp);
  Tensor dx_ref;
  oracle.backward(x, dy, dx_ref,
                  {&g_ref[0], &g_ref[1], &g_ref[2], &g_ref[3], &g_ref[4], &g_ref[5], &g_ref[6],
                   &g_ref[7]},
                  mg_ref);
  const double factor = 16.0 * (d + S + options.d_ff);
  expect_close_rel<T>(what + " y", y, oracle.y, factor);
  expect_close_rel<T>(what + " dx", dx, dx_ref, factor);
  const std::vector<Tensor> g = block_tensors(block, true);
  for (int n = 0; n < 8; ++n)
    expect_close_rel<T>(what + " d " + names[n], g[n], g_ref[n], factor * 4);
  expect_mha_grads<T>(what + " self_attn", mha_params(block.attention(), true), mg_ref,
                      factor * 4);
}

TEST(NnScoreMods, AlibiSlopesAreTheStandardOnes) {
  const auto s8 = kfa::nn::alibi_slopes(8);
  ASSERT_EQ(s8.size(), 8u);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(s8[i], std::exp2(-(i + 1.0))) << "heads 8, slope " << i;
  // Not a power of two: those of 4 heads, then every other slope of 8 heads.
  const std::vector<double> s6 = kfa::nn::alibi_slopes(6);
  const std::vector<double> expected6 = {0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125};
  EXPECT_EQ(s6, expected6);
  const auto s12 = kfa::nn::alibi_slopes(12);
  ASSERT_EQ(s12.size(), 12u);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(s12[i], std::exp2(-(i + 1.0))) << "heads 12";
  for (int i = 0; i < 4; ++i)
    EXPECT_DOUBLE_EQ(s12[8 + i], std::exp2(-(2 * i + 1) / 2.0)) << "heads 12, extra " << i;
  EXPECT_EQ(kfa::nn::alibi_slopes(1), std::vector<double>{0.00390625});
  expect_invalid_argument([] { kfa::nn::alibi_slopes(0); }, "heads must be > 0");
}

/// Scores times a per-head temperature: not additive, so the backward needs
/// its score_grad hook.
template <class MemorySpace>
struct TemperatureMod {
  Kokkos::View<const double*, MemorySpace> temperature;
  template <class Acc>
  KOKKOS_INLINE_FUNCTION Acc operator()(int, int h, int, int, Acc s) const {
    return s * static_cast<Acc>(temperature(h));
  }
  template <class Acc>
  KOKKOS_INLINE_FUNCTION Acc score_grad(int, int h, int, int, Acc) const {
    return static_cast<Acc>(temperature(h));
  }
};

/// One forward and backward of a MultiHeadAttention (self-attention, or
/// cross-attention on a memory of Skv tokens) with a score modifier (none:
/// the layer's own, ALiBi), against the oracle with `extras`.
template <class Space, class T, class Mod>
void check_mha_with_modifier(const kfa::nn::MultiHeadAttentionOptions& options,
                             const std::string& tag, int S, int Skv, bool cross, const Mod& mod,
                             const RefExtras& extras) {
  const int B = 2, d = options.d_model;
  const std::string what = tag + " " + type_name<T>() + " " + Space::name() + " seed " +
                           std::to_string(test_seed(tag));
  kfa::nn::MultiHeadAttention<Space, T> mha(options);
  std::mt19937_64 rng(test_seed(tag));
  randomize_parameters(mha.parameters(), rng);
  const Tensor x = rounded<T>(random_tensor({B * S, d}, rng));
  const Tensor memory = cross ? rounded<T>(random_tensor({B * Skv, d}, rng)) : x;
  const Tensor dy = rounded<T>(random_tensor({B * S, d}, rng));
  auto xv = make_view<DeviceView3<T, Space>>(reshaped(x, {B, S, d}), "x");
  auto mv = make_view<DeviceView3<T, Space>>(reshaped(memory, {B, Skv, d}), "memory");
  auto dyv = make_view<DeviceView3<T, Space>>(reshaped(dy, {B, S, d}), "dy");
  DeviceView3<T, Space> yv("y", B, S, d), dxv("dx", B, S, d), dmv("dmemory", B, Skv, d);
  poison(yv);
  poison(dxv);
  typename kfa::nn::MultiHeadAttention<Space, T>::context_type context;
  constexpr bool own = std::is_same<Mod, kfa::Impl::NoScoreMod>::value;
  if (cross) {
    if constexpr (own) {
      mha.forward(Space(), xv, mv, yv, context);
      mha.backward(Space(), dyv, dxv, dmv, context);
    } else {
      mha.forward(Space(), xv, mv, yv, context, mod);
      mha.backward(Space(), dyv, dxv, dmv, context, mod);
    }
  } else {
    if constexpr (own) {
      mha.forward(Space(), xv, yv, context);
      mha.backward(Space(), dyv, dxv, context);
    } else {
      mha.forward(Space(), xv, yv, context, mod);
      mha.backward(Space(), dyv, dxv, context, mod);
    }
  }
  Space().fence();
  const MhaParams p = mha_params(mha, false);
  MhaOracle oracle{mha.options(), p, B, S, {}, {}, {}, {}, {}, {}};
  oracle.extras = extras;
  Tensor dx_ref, dm_ref;
  MhaParams g_ref = zero_grads(p);
  if (cross) {
    oracle.forward(x, memory, Skv);
    oracle.backward(x, memory, dy, dx_ref, dm_ref, g_ref);
  } else {
    oracle.forward(x);
    oracle.backward(x, dy, dx_ref, g_ref);
  }
  const double factor = 16.0 * (d + S + Skv);
  expect_close_rel<T>(what + " y", reshaped(to_host(yv), {B * S, d}), oracle.y, factor);
  expect_close_rel<T>(what + " dx", reshaped(to_host(dxv), {B * S, d}), dx_ref, factor);
  if (cross)
    expect_close_rel<T>(what + " dmemory", reshaped(to_host(dmv), {B * Skv, d}), dm_ref, factor);
  expect_mha_grads<T>(what, mha_params(mha, true), g_ref, factor * 4);
}

/// The layer's ALiBi option (3 heads: the interpolated slopes; 4 heads over
/// 2 key/value heads), self- and cross-attention; a pairwise bias View with
/// its batch or its heads shared; a non-additive modifier with score_grad.
TYPED_TEST(NnLayers, ScoreModifiersThroughTheLayersMatchOracle) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  using memory_space = typename Space::memory_space;
  const int B = 2, d = 48;
  kfa::nn::MultiHeadAttentionOptions base;
  base.d_model = d;
  base.heads = 3;
  {
    auto o = base;
    o.alibi = true;
    o.attention.causal = true;
    check_mha_with_modifier<Space, T>(o, "nn_alibi_self", 37, 37, false,
                                      kfa::Impl::NoScoreMod{}, alibi_extras(3));
  }
  {
    auto o = base;
    o.alibi = true;
    o.heads = 4;
    o.kv_heads = 2;
    o.head_dim = 12;
    o.fused_qkv = false;
    o.qk_norm = true;
    check_mha_with_modifier<Space, T>(o, "nn_alibi_cross", 19, 41, true, kfa::Impl::NoScoreMod{},
                                      alibi_extras(4));
  }
  std::mt19937_64 rng(test_seed("nn_pairwise_bias"));
  {
    // [1][heads][S][Skv]: one bias for every batch entry, cross-attention.
    const int S = 23, Skv = 30;
    const Tensor bias = rounded<T>(random_tensor({1, 3, S, Skv}, rng));
    auto bias_view = make_view<Kokkos::View<T****, Kokkos::LayoutRight, memory_space>>(bias, "bias");
    RefExtras e;
    e.mod = [bias](int, int h, int i, int j, double s, int, int) { return s + bias.at(0, h, i, j); };
    auto o = base;
    o.attention.softcap = 4;
    check_mha_with_modifier<Space, T>(o, "nn_pairwise_cross", S, Skv, true,
                                      kfa::nn::pairwise_bias(bias_view), e);
  }
  {
    const std::vector<double> temperature = {0.5, 1.25, 2.0};
    Kokkos::View<double*, memory_space> tv("temperature", 3);
    auto th = Kokkos::create_mirror_view(tv);
    for (int h = 0; h < 3; ++h) th(h) = temperature[h];
    Kokkos::deep_copy(tv, th);
    RefExtras e;
    e.mod = [temperature](int, int h, int, int, double s, int, int) { return s * temperature[h]; };
    e.mod_grad = [temperature](int, int h, int, int, double) { return temperature[h]; };
    auto o = base;
    o.rotary = true;
    o.attention.causal = true;
    check_mha_with_modifier<Space, T>(o, "nn_temperature", 37, 37, false,
                                      TemperatureMod<memory_space>{tv}, e);
  }
  {
    // The block with a bias [batch][1][S][S] (heads shared).
    const int S = 29;
    kfa::nn::TransformerBlockOptions options;
    options.attention = base;
    options.attention.attention.causal = true;
    options.d_ff = 40;
    const Tensor bias = rounded<T>(random_tensor({B, 1, S, S}, rng));
    auto bias_view = make_view<Kokkos::View<T****, Kokkos::LayoutRight, memory_space>>(bias, "bias");
    const auto mod = kfa::nn::pairwise_bias(bias_view);
    const std::string tag = "nn_block_pairwise";
    const std::string what = tag + " " + type_name<T>() + " " + Space::name();
    kfa::nn::TransformerBlock<Space, T> block(options);
    std::mt19937_64 block_rng(test_seed(tag));
    randomize_parameters(block.parameters(), block_rng);
    const Tensor x = rounded<T>(random_tensor({B * S, d}, block_rng));
    const Tensor dy = rounded<T>(random_tensor({B * S, d}, block_rng));
    auto xv = make_view<DeviceView3<T, Space>>(reshaped(x, {B, S, d}), "x");
    auto dyv = make_view<DeviceView3<T, Space>>(reshaped(dy, {B, S, d}), "dy");
    DeviceView3<T, Space> yv("y", B, S, d), dxv("dx", B, S, d);
    typename kfa::nn::TransformerBlock<Space, T>::context_type context;
    block.forward(Space(), xv, yv, context, mod);
    block.backward(Space(), dyv, dxv, context, mod);
    Space().fence();
    RefExtras extras;
    extras.mod = [bias](int b, int, int i, int j, double s, int, int) {
      return s + bias.at(b, 0, i, j);
    };
    expect_block_matches_oracle<T>(what, block, x, dy, reshaped(to_host(yv), {B * S, d}),
                                   reshaped(to_host(dxv), {B * S, d}), B, S, extras);
  }
}

// The bias's gradient through the layer (kfa::nn::pairwise_bias(bias,
// grad)): central differences of L = sum(y ∘ dy) in double, at entries of
// a bias shared by the batch entries and of one per entry and head, with a
// causal mask and grouped-query heads; grad accumulates across backwards.
TYPED_TEST(NnLayers, PairwiseBiasGradientMatchesDifferences) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  using memory_space = typename Space::memory_space;
  if constexpr (!std::is_same<T, double>::value) {
    GTEST_SKIP() << "central differences need double";
  } else {
    const int B = 2, S = 19, d = 16;
    kfa::nn::MultiHeadAttentionOptions options;
    options.d_model = d;
    options.heads = 4;
    options.kv_heads = 2;
    options.attention.causal = true;
    kfa::nn::MultiHeadAttention<Space, T> layer(options);
    std::mt19937_64 rng(test_seed("nn_pairwise_grad"));
    randomize_parameters(layer.parameters(), rng);
    const Tensor x = random_tensor({B, S, d}, rng), dy = random_tensor({B, S, d}, rng);
    auto xv = make_view<DeviceView3<T, Space>>(x, "x");
    auto dyv = make_view<DeviceView3<T, Space>>(dy, "dy");
    DeviceView3<T, Space> yv("y", B, S, d), dxv("dx", B, S, d);
    for (const bool shared : {true, false}) {
      const int bb = shared ? 1 : B, bh = shared ? 1 : options.heads;
      using BiasView = Kokkos::View<double****, Kokkos::LayoutRight, memory_space>;
      BiasView bias("bias", bb, bh, S, S), grad("grad", bb, bh, S, S);
      auto host_bias = Kokkos::create_mirror_view(bias);
      std::uniform_real_distribution<double> dist(-1.0, 1.0);
      for (std::size_t n = 0; n < host_bias.span(); ++n) host_bias.data()[n] = dist(rng);
      Kokkos::deep_copy(bias, host_bias);
      typename kfa::nn::MultiHeadAttention<Space, T>::context_type context;
      const auto mod = kfa::nn::pairwise_bias(bias, grad);
      layer.forward(Space(), xv, yv, context, mod);
      layer.backward(Space(), dyv, dxv, context, mod);
      layer.backward(Space(), dyv, dxv, context, mod);  // accumulates: twice the gradient
      const auto g = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), grad);
      auto loss = [&] {
        typename kfa::nn::MultiHeadAttention<Space, T>::context_type c;
        layer.forward(Space(), xv, yv, c, kfa::nn::pairwise_bias(bias));
        const Tensor y = to_host(yv);
        double sum = 0;
        for (std::size_t n = 0; n < y.data.size(); ++n) sum += y.data[n] * dy.data[n];
        return sum;
      };
      const double eps = 1e-5;
      double largest = 0;
      for (int t = 0; t < 12; ++t) {
        // (causal: above the diagonal the gradient is 0, checked below)
        const int b = int(rng() % bb), h = int(rng() % bh), i = int(rng() % S);
        const int j = int(rng() % (i + 1));
        const double at = host_bias(b, h, i, j);
        auto set = [&](double value) {
          host_bias(b, h, i, j) = value;
          Kokkos::deep_copy(bias, host_bias);
        };
        set(at + eps);
        const double up = loss();
        set(at - eps);
        const double down = loss();
        set(at);
        const double diff = (up - down) / (2 * eps);
        largest = std::max(largest, std::abs(diff));
        EXPECT_NEAR(g(b, h, i, j), 2 * diff, 1e-6 * std::max(1.0, std::abs(diff)))
            << (shared ? "shared" : "per entry and head") << " bias (" << b << "," << h << ","
            << i << "," << j << ")";
      }
      EXPECT_GT(largest, 1e-4) << "differences too small to test anything";
      for (int b = 0; b < bb; ++b)
        for (int h = 0; h < bh; ++h)
          for (int i = 0; i < S; ++i)
            for (int j = i + 1; j < S; ++j) ASSERT_EQ(g(b, h, i, j), 0.0) << "masked entry";
    }
    // A grad of the wrong shape is refused when the modifier is built.
    Kokkos::View<double****, memory_space> bias("bias", 1, 1, S, S), wrong("wrong", 1, 1, S, S + 1);
    expect_invalid_argument([&] { (void)kfa::nn::pairwise_bias(bias, wrong); },
                            "kfa::nn::pairwise_bias: grad must have bias's extents [1][1][19][19], "
                            "got [1][1][19][20]");
    expect_invalid_argument([&] { (void)kfa::nn::pairwise_bias(bias, bias); },
                            "grad must not overlap bias");
  }
}

TYPED_TEST(NnLayers, ScoreModifierErrorsThrowAndWriteNothing) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  using memory_space = typename Space::memory_space;
  using Layer = kfa::nn::MultiHeadAttention<Space, T>;
  kfa::nn::MultiHeadAttentionOptions options;
  options.d_model = 12;
  options.heads = 3;
  options.alibi = true;
  options.rotary = true;
  expect_invalid_argument([&] { Layer bad(options); },
                          "options.alibi and options.rotary are mutually exclusive");
  options.rotary = false;
  Layer alibi_layer(options);
  options.alibi = false;
  Layer plain(options);
  typename Layer::context_type context;
  DeviceView3<T, Space> x("x", 2, 5, 12), y("y", 2, 5, 12), m("m", 2, 4, 12);
  Kokkos::deep_copy(y, T(3));
  Kokkos::View<T****, Kokkos::LayoutRight, memory_space> bias("bias", 1, 3, 5, 6),
      good("good", 2, 1, 5, 5);
  expect_invalid_argument(
      [&] { alibi_layer.forward(Space(), x, y, context, kfa::nn::pairwise_bias(good)); },
      "options.alibi is on");
  expect_invalid_argument(
      [&] { plain.forward(Space(), x, y, context, kfa::nn::pairwise_bias(bias)); },
      "kfa::nn::MultiHeadAttention::forward: the pairwise bias must be [batch or 1][heads or 1]"
      "[seqlen_q][seqlen_k] = [2 or 1][3 or 1][5][5], got [1][3][5][6]");
  expect_invalid_argument(
      [&] { plain.forward(Space(), x, m, y, context, kfa::nn::pairwise_bias(good)); },
      "= [2 or 1][3 or 1][5][4], got [2][1][5][5]");
  Kokkos::View<double*, memory_space> slopes("slopes", 2);
  expect_invalid_argument([&] { plain.forward(Space(), x, y, context, kfa::alibi(slopes)); },
                          "ALiBi slopes must be [heads] = [3]");
  kfa::nn::TransformerBlockOptions block_options;
  block_options.attention = options;
  block_options.d_ff = 8;
  kfa::nn::TransformerBlock<Space, T> block(block_options);
  typename kfa::nn::TransformerBlock<Space, T>::context_type block_context;
  expect_invalid_argument(
      [&] { block.forward(Space(), x, y, block_context, kfa::nn::pairwise_bias(bias)); },
      "kfa::nn::TransformerBlock::forward: the pairwise bias must be");
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), y);
  for (std::size_t n = 0; n < host.size(); ++n) ASSERT_EQ(host.data()[n], T(3)) << "y written";
}

/// Packed batches of sequences of lengths 13, 0 (empty), 29 and 7: the
/// layers on x [49][d_model] with cu_seqlens against the oracle run one
/// sequence at a time (batch 1), gradients summed over the sequences;
/// rotary positions, causal masks, windows and ALiBi restart at each
/// sequence.
TYPED_TEST(NnLayers, PackedBatchesMatchOracle) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  using memory_space = typename Space::memory_space;
  const std::vector<int> lengths = {13, 0, 29, 7};
  std::vector<int> offsets{0};
  for (int n : lengths) offsets.push_back(offsets.back() + n);
  const int total = offsets.back(), max_seqlen = 29, d = 48;
  Kokkos::View<int*, memory_space> cu("cu_seqlens", offsets.size());
  Kokkos::deep_copy(cu, Kokkos::View<const int*, Kokkos::HostSpace,
                                     Kokkos::MemoryTraits<Kokkos::Unmanaged>>(offsets.data(),
                                                                              offsets.size()));
  auto rows = [&](const Tensor& t, int b) { return row_range(t, offsets[b], offsets[b + 1]); };
  auto put_rows = [&](Tensor& t, int b, const Tensor& r) {
    std::copy(r.data.begin(), r.data.end(), t.data.begin() + std::size_t(offsets[b]) * d);
  };
  std::vector<kfa::nn::MultiHeadAttentionOptions> cases(2);
  for (auto& o : cases) o.d_model = d;
  cases[0].heads = 3;  // fused, qk-norm, rotary, causal
  cases[0].qk_norm = true;
  cases[0].rotary = true;
  cases[0].attention.causal = true;
  cases[1].heads = 4;  // separate, grouped-query, ALiBi, a window
  cases[1].kv_heads = 2;
  cases[1].head_dim = 12;
  cases[1].fused_qkv = false;
  cases[1].alibi = true;
  cases[1].attention.window_left = 5;
  cases[1].attention.window_right = 3;
  for (int index = 0; index < 2; ++index) {
    const auto& options = cases[index];
    const std::string tag = "nn_packed_" + std::to_string(index);
    const std::string what = tag + " " + type_name<T>() + " " + Space::name() + " seed " +
                             std::to_string(test_seed(tag));
    kfa::nn::MultiHeadAttention<Space, T> mha(options);
    const RandomIo<DeviceView2<T, Space>> io(mha, tag, {total, d});
    const Tensor &x = io.x, &dy = io.dy;
    typename kfa::nn::MultiHeadAttention<Space, T>::context_type context;
    mha.forward(Space(), io.xv, cu, max_seqlen, io.yv, context);
    mha.backward(Space(), io.dyv, io.dxv, context);
    Space().fence();

    const MhaParams p = mha_params(mha, false);
    Tensor y_ref({total, d}), dx_ref({total, d});
    MhaParams g_ref = zero_grads(p);
    for (int b = 0; b < int(lengths.size()); ++b) {
      if (lengths[b] == 0) continue;
      MhaOracle oracle{mha.options(), p, 1, lengths[b], {}, {}, {}, {}, {}, {}};
      if (options.alibi) oracle.extras = alibi_extras(options.heads);
      oracle.forward(rows(x, b));
      Tensor dx_b;
      oracle.backward(rows(x, b), rows(dy, b), dx_b, g_ref);
      put_rows(y_ref, b, oracle.y);
      put_rows(dx_ref, b, dx_b);
    }
    const double factor = 16.0 * (d + max_seqlen);
    expect_close_rel<T>(what + " y", to_host(io.yv), y_ref, factor);
    expect_close_rel<T>(what + " dx", to_host(io.dxv), dx_ref, factor);
    expect_mha_grads<T>(what, mha_params(mha, true), g_ref, factor * 4);
  }
  {
    // The Llama block on the same packed batch: norms, MLP per token.
    kfa::nn::TransformerBlockOptions options;
    options.attention.d_model = d;
    options.attention.heads = 3;
    options.attention.rotary = true;
    options.attention.attention.causal = true;
    options.norm = kfa::nn::Norm::rms_norm;
    options.activation = kfa::nn::Activation::swiglu;
    options.d_ff = 40;
    const std::string tag = "nn_packed_block";
    const std::string what = tag + " " + type_name<T>() + " " + Space::name();
    kfa::nn::TransformerBlock<Space, T> block(options);
    const RandomIo<DeviceView2<T, Space>> io(block, tag, {total, d});
    const Tensor &x = io.x, &dy = io.dy;
    typename kfa::nn::TransformerBlock<Space, T>::context_type context;
    block.forward(Space(), io.xv, cu, max_seqlen, io.yv, context);
    block.backward(Space(), io.dyv, io.dxv, context);
    Space().fence();
    const MhaParams mp = mha_params(block.attention(), false);
    const std::vector<Tensor> w = block_tensors(block, false);
    Tensor y_ref({total, d}), dx_ref({total, d});
    std::vector<Tensor> g_ref;
    for (const Tensor& t : w) g_ref.push_back(zeros_like(t));
    MhaParams mg_ref = zero_grads(mp);
    for (int b = 0; b < int(lengths.size()); ++b) {
      if (lengths[b] == 0) continue;
      BlockOracle oracle{block.options(),
                         MhaOracle{block.options().attention, mp, 1, lengths[b], {}, {}, {}, {},
                                   {}, {}},
                         w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]};
      oracle.forward(rows(x, b));
      Tensor dx_b;
      oracle.backward(rows(x, b), rows(dy, b), dx_b,
                      {&g_ref[0], &g_ref[1], &g_ref[2], &g_ref[3], &g_ref[4], &g_ref[5],
                       &g_ref[6], &g_ref[7]},
                      mg_ref);
      put_rows(y_ref, b, oracle.y);
      put_rows(dx_ref, b, dx_b);
    }
    const double factor = 16.0 * (d + max_seqlen + options.d_ff);
    expect_close_rel<T>(what + " y", to_host(io.yv), y_ref, factor);
    expect_close_rel<T>(what + " dx", to_host(io.dxv), dx_ref, factor);
    const std::vector<Tensor> g = block_tensors(block, true);
    for (int n = 0; n < 8; ++n)
      expect_close_rel<T>(what + " d param " + std::to_string(n), g[n], g_ref[n], factor * 4);
    expect_mha_grads<T>(what + " self_attn", mha_params(block.attention(), true), mg_ref,
                        factor * 4);
  }
}

TYPED_TEST(NnLayers, PackedBatchErrorsThrowAndWriteNothing) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  using memory_space = typename Space::memory_space;
  kfa::nn::MultiHeadAttentionOptions options;
  options.d_model = 16;
  options.heads = 2;
  options.rotary = true;
  kfa::nn::MultiHeadAttention<Space, T> mha(options);
  typename kfa::nn::MultiHeadAttention<Space, T>::context_type context, batched;
  auto offsets = [](std::vector<int> v) {
    Kokkos::View<int*, memory_space> cu("cu", v.size());
    Kokkos::deep_copy(cu, Kokkos::View<const int*, Kokkos::HostSpace,
                                       Kokkos::MemoryTraits<Kokkos::Unmanaged>>(v.data(),
                                                                                v.size()));
    return cu;
  };
  DeviceView2<T, Space> x("x", 7, 16), y("y", 7, 16), x_bad("x_bad", 7, 12),
      y_short("y_short", 6, 16), dx("dx", 7, 16);
  DeviceView3<T, Space> x3("x3", 1, 7, 16), y3("y3", 1, 7, 16);
  Kokkos::deep_copy(y, T(3));
  Kokkos::deep_copy(dx, T(3));
  const auto good = offsets({0, 3, 7});
  expect_invalid_argument([&] { mha.forward(Space(), x, offsets({0, 3, 6}), 4, y, context); },
                          "kfa::nn::MultiHeadAttention::forward: cu_seqlens must start at 0, "
                          "never decrease, end at total_tokens = 7 and hold lengths <= "
                          "max_seqlen = 4; got cu_seqlens[2] = 6");
  expect_invalid_argument([&] { mha.forward(Space(), x, offsets({0, 5, 7}), 4, y, context); },
                          "got cu_seqlens[1] = 5");
  expect_invalid_argument([&] { mha.forward(Space(), x, offsets({1, 3, 7}), 4, y, context); },
                          "got cu_seqlens[0] = 1");
  expect_invalid_argument([&] { mha.forward(Space(), x_bad, good, 4, y, context); },
                          "x must be [total_tokens][d_model] with d_model = 16, got [7][12]");
  expect_invalid_argument([&] { mha.forward(Space(), x, good, 4, y_short, context); },
                          "y must be [total_tokens][d_model] = [7][16], got [6][16]");
  expect_invalid_argument([&] { mha.forward(Space(), x, good, 4, x, context); },
                          "y must not overlap x");
  mha.forward(Space(), x3, y3, batched);
  expect_invalid_argument([&] { mha.backward(Space(), y, dx, batched); },
                          "is packed [total_tokens][d_model] but the forward was not");
  DeviceView2<T, Space> y_packed("y_packed", 7, 16);
  mha.forward(Space(), x, good, 4, y_packed, context);
  expect_invalid_argument([&] { mha.backward(Space(), y3, x3, context); },
                          "the forward was packed: dy and dx must be [total_tokens][d_model]");
  expect_invalid_argument([&] { mha.backward(Space(), y_short, dx, context); },
                          "dy must be [total_tokens][d_model] = [7][16], got [6][16]");
  kfa::nn::TransformerBlockOptions block_options;
  block_options.attention = options;
  block_options.d_ff = 8;
  kfa::nn::TransformerBlock<Space, T> block(block_options);
  typename kfa::nn::TransformerBlock<Space, T>::context_type block_context;
  expect_invalid_argument(
      [&] { block.forward(Space(), x, offsets({0, 3, 6}), 4, y, block_context); },
      "kfa::nn::TransformerBlock::forward: cu_seqlens must start at 0");
  const DeviceView2<T, Space> written[] = {y, dx};
  for (const auto& v : written) {
    auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
    for (std::size_t n = 0; n < host.size(); ++n)
      ASSERT_EQ(host.data()[n], T(3)) << v.label() << " written";
  }
}

/// Copies every parameter of `from` into `to` (layers of the same options).
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
  return ha.size() == hb.size() &&
         std::memcmp(ha.data(), hb.data(), ha.size() * sizeof(T)) == 0;
}

/// The recompute mode against the default on the host: outputs, input
/// gradients and every parameter gradient bitwise equal (self- and
/// cross-attention, a packed batch, the block with every dropout on), and
/// the context's memory between forward and backward in both modes.
TYPED_TEST(NnLayers, RecomputeIsBitwiseAndSavesMemory) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  using memory_space = typename Space::memory_space;
  if (!Kokkos::SpaceAccessibility<Kokkos::HostSpace, memory_space>::accessible)
    GTEST_SKIP() << "bitwise equality is checked on host backends";
  const int B = 2, S = 21, Skv = 17, d = 32;
  std::mt19937_64 rng(test_seed("nn_recompute"));
  const Tensor x = random_tensor({B, S, d}, rng), dy = random_tensor({B, S, d}, rng);
  const Tensor memory = random_tensor({B, Skv, d}, rng);
  auto xv = make_view<DeviceView3<T, Space>>(x, "x");
  auto dyv = make_view<DeviceView3<T, Space>>(dy, "dy");
  auto mv = make_view<DeviceView3<T, Space>>(memory, "memory");
  auto expect_same_grads = [](const std::string& what, const auto& a, const auto& b) {
    const auto pa = a.parameters(), pb = b.parameters();
    for (std::size_t n = 0; n < pa.size(); ++n)
      EXPECT_TRUE(bitwise_same<T>(pa[n].grad, pb[n].grad)) << what << " d " << pa[n].name;
  };

  kfa::nn::MultiHeadAttentionOptions options;
  options.d_model = d;
  options.heads = 4;
  options.kv_heads = 2;
  options.qk_norm = true;
  options.rotary = true;
  options.attention.causal = true;
  options.attention.dropout_p = 0.1;
  using Layer = kfa::nn::MultiHeadAttention<Space, T>;
  for (int mode = 0; mode < 3; ++mode) {  // self-attention, cross-attention, packed
    const std::string what = std::string("mha ") + (mode == 0 ? "self" : mode == 1 ? "cross" : "packed") +
                             " " + type_name<T>() + " " + Space::name();
    Layer plain(options);
    auto ro = options;
    ro.recompute = true;
    Layer recomputing(ro);
    randomize_parameters(plain.parameters(), rng);
    copy_parameters(plain, recomputing);
    typename Layer::context_type c_plain, c_re;
    c_plain.dropout_seed = c_re.dropout_seed = 11;
    DeviceView3<T, Space> y1("y1", B, S, d), y2("y2", B, S, d), dx1("dx1", B, S, d),
        dx2("dx2", B, S, d), dm1("dm1", B, Skv, d), dm2("dm2", B, Skv, d);
    DeviceView2<T, Space> x2(xv.data(), B * S, d), dy2(dyv.data(), B * S, d),
        yp1(y1.data(), B * S, d), yp2(y2.data(), B * S, d), dxp1(dx1.data(), B * S, d),
        dxp2(dx2.data(), B * S, d);
    Kokkos::View<int*, memory_space> cu("cu", 4);
    auto cu_host = Kokkos::create_mirror_view(cu);
    cu_host(0) = 0, cu_host(1) = 15, cu_host(2) = 15, cu_host(3) = B * S;  // 15, 0, 27 tokens
    Kokkos::deep_copy(cu, cu_host);
    std::size_t bytes_plain = 0, bytes_re = 0;
    if (mode == 0) {
      plain.forward(Space(), xv, y1, c_plain);
      recomputing.forward(Space(), xv, y2, c_re);
      bytes_plain = c_plain.saved_bytes(), bytes_re = c_re.saved_bytes();
      plain.backward(Space(), dyv, dx1, c_plain);
      recomputing.backward(Space(), dyv, dx2, c_re);
    } else if (mode == 1) {
      plain.forward(Space(), xv, mv, y1, c_plain);
      recomputing.forward(Space(), xv, mv, y2, c_re);
      bytes_plain = c_plain.saved_bytes(), bytes_re = c_re.saved_bytes();
      plain.backward(Space(), dyv, dx1, dm1, c_plain);
      recomputing.backward(Space(), dyv, dx2, dm2, c_re);
      EXPECT_TRUE(bitwise_same<T>(dm1, dm2)) << what << " dmemory";
    } else {
      plain.forward(Space(), x2, cu, 27, yp1, c_plain);
      recomputing.forward(Space(), x2, cu, 27, yp2, c_re);
      bytes_plain = c_plain.saved_bytes(), bytes_re = c_re.saved_bytes();
      plain.backward(Space(), dy2, dxp1, c_plain);
      recomputing.backward(Space(), dy2, dxp2, c_re);
    }
    Space().fence();
    EXPECT_TRUE(bitwise_same<T>(y1, y2)) << what << " y";
    EXPECT_TRUE(bitwise_same<T>(dx1, dx2)) << what << " dx";
    expect_same_grads(what, plain, recomputing);
    std::cout << "[ memory   ] " << what << ": context after forward " << bytes_plain
              << " bytes, recompute " << bytes_re << " bytes" << std::endl;
    // Only the packed batch's positions (an int per token) stay.
    EXPECT_EQ(bytes_re, mode == 2 ? std::size_t(B * S) * sizeof(int) : 0u) << what;
    EXPECT_GT(bytes_plain, 20 * bytes_re) << what;
    EXPECT_EQ(c_re.saved_bytes(), bytes_re) << what << " after the backward";
  }

  kfa::nn::TransformerBlockOptions block_options;
  block_options.attention = options;
  block_options.d_ff = 48;
  block_options.dropout_p = 0.1;
  block_options.norm = kfa::nn::Norm::rms_norm;
  block_options.activation = kfa::nn::Activation::swiglu;
  using Block = kfa::nn::TransformerBlock<Space, T>;
  Block plain(block_options);
  block_options.recompute = true;
  Block recomputing(block_options);
  EXPECT_TRUE(recomputing.options().recompute);
  EXPECT_FALSE(recomputing.attention().options().recompute);
  randomize_parameters(plain.parameters(), rng);
  copy_parameters(plain, recomputing);
  typename Block::context_type c_plain, c_re;
  c_plain.dropout_seed = c_re.dropout_seed = 5;
  DeviceView3<T, Space> y1("y1", B, S, d), y2("y2", B, S, d), dx1("dx1", B, S, d),
      dx2("dx2", B, S, d);
  plain.forward(Space(), xv, y1, c_plain);
  recomputing.forward(Space(), xv, y2, c_re);
  const std::size_t bytes_plain = c_plain.saved_bytes(), bytes_re = c_re.saved_bytes();
  // The attention's input reference is the caller's x, not the freed h1.
  EXPECT_EQ(c_re.attention.x.data(), xv.data()) << "block recompute keeps h1";
  plain.backward(Space(), dyv, dx1, c_plain);
  recomputing.backward(Space(), dyv, dx2, c_re);
  Space().fence();
  const std::string what = std::string("block ") + type_name<T>() + " " + Space::name();
  EXPECT_TRUE(bitwise_same<T>(y1, y2)) << what << " y";
  EXPECT_TRUE(bitwise_same<T>(dx1, dx2)) << what << " dx";
  expect_same_grads(what, plain, recomputing);
  std::cout << "[ memory   ] " << what << ": context after forward " << bytes_plain
            << " bytes, recompute " << bytes_re << " bytes" << std::endl;
  EXPECT_EQ(bytes_re, 0u) << what;
  EXPECT_GT(bytes_plain, 0u) << what;
  EXPECT_EQ(c_re.saved_bytes(), 0u) << what << " after the backward";
}

TYPED_TEST(NnLayers, TransformerBlockMatchesOracle) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  const int B = 2, S = 37, d = 48;
  int index = 0;
  for (const auto& options : block_cases()) {
    const std::string tag = "nn_block_" + std::to_string(index++);
    const std::string what = tag + " " + type_name<T>() + " " + Space::name() + " seed " +
                             std::to_string(test_seed(tag));
    kfa::nn::TransformerBlock<Space, T> block(options);
    LayerRun<Space, T, decltype(block)> run(block, tag, B, S, d);
    expect_block_matches_oracle<T>(what, block, run.x, run.dy, run.y, run.dx, B, S);
  }
}

/// Finite differences of L = Σ dy·block(x) on the device in fp64, with
/// dropout in the attention weights, the residuals and the MLP (fixed
/// seeds: L is a smooth function), against the block's backward.
TYPED_TEST(NnLayers, TransformerBlockFiniteDifferencesWithDropout) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  if (!std::is_same<T, double>::value) GTEST_SKIP() << "fp64 only";
  const int B = 2, S = 11, d = 24;
  kfa::nn::TransformerBlockOptions options;
  options.attention.d_model = d;
  options.attention.heads = 2;
  options.attention.rotary = true;
  options.attention.attention.causal = true;
  options.attention.attention.dropout_p = 0.2;
  options.d_ff = 20;
  options.dropout_p = 0.1;
  const std::string tag = "nn_block_fd";
  std::mt19937_64 rng(test_seed(tag));
  kfa::nn::TransformerBlock<Space, T> block(options);
  randomize_parameters(block.parameters(), rng);
  const Tensor x = random_tensor({B, S, d}, rng), dy = random_tensor({B, S, d}, rng);
  auto xv = make_view<DeviceView3<T, Space>>(x, "x");
  auto dyv = make_view<DeviceView3<T, Space>>(dy, "dy");
  DeviceView3<T, Space> yv("y", B, S, d), dxv("dx", B, S, d);
  typename kfa::nn::TransformerBlock<Space, T>::context_type context;
  context.dropout_seed = 77;
  auto loss = [&]() {
    block.forward(Space(), xv, yv, context);
    Space().fence();
    const Tensor y = to_host(yv);
    double s = 0;
    for (std::size_t n = 0; n < y.data.size(); ++n) s += y.data[n] * dy.data[n];
    return s;
  };
  const double y_train = loss();
  block.zero_grad(Space());
  block.backward(Space(), dyv, dxv, context);
  Space().fence();
  const Tensor dx = to_host(dxv);
  auto params = block.parameters();
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
  for (int probe = 0; probe < 4; ++probe) {
    const std::size_t n = (probe * 131 + 7) % x.data.size();
    auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), xv);
    const double fd = central([&](double delta) {
      host.data()[n] += delta;
      Kokkos::deep_copy(xv, host);
    });
    EXPECT_NEAR(dx.data[n], fd, 1e-5 * std::max(1.0, std::abs(fd))) << tag << " dx[" << n << "]";
  }
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
  // Dropout is on in training and off in inference.
  context.training = false;
  const double y_eval = loss();
  EXPECT_GT(std::abs(y_train - y_eval), 1e-6) << tag << " dropout changed nothing";
}

TYPED_TEST(NnLayers, TrainingWithAdamWReducesLoss) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  const int B = 2, S = 16, d = 32;
  kfa::nn::TransformerBlockOptions options;
  options.attention.d_model = d;
  options.attention.heads = 2;
  options.d_ff = 64;
  kfa::nn::TransformerBlock<Space, T> block(options);
  kfa::nn::AdamW<Space, T> adamw(block.parameters(), {1e-2, 0.9, 0.999, 1e-8, 0.0});
  std::mt19937_64 rng(test_seed("nn_training"));
  const Tensor x = random_tensor({B, S, d}, rng), target = random_tensor({B, S, d}, rng, 0.5);
  auto xv = make_view<DeviceView3<T, Space>>(x, "x");
  DeviceView3<T, Space> yv("y", B, S, d), dyv("dy", B, S, d), dxv("dx", B, S, d);
  typename kfa::nn::TransformerBlock<Space, T>::context_type context;
  double first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    block.forward(Space(), xv, yv, context);
    Space().fence();
    // Mean squared error against the target; dy = 2·(y - target)/n.
    const Tensor y = to_host(yv);
    Tensor dy = y;
    double loss = 0;
    for (std::size_t n = 0; n < y.data.size(); ++n) {
      const double e = y.data[n] - target.data[n];
      loss += e * e / y.data.size();
      dy.data[n] = 2 * e / y.data.size();
    }
    Kokkos::deep_copy(dyv, make_view<DeviceView3<T, Space>>(dy, "dy"));
    adamw.zero_grad(Space());
    block.backward(Space(), dyv, dxv, context);
    adamw.step(Space());
    if (step == 0) first = loss;
    last = loss;
  }
  EXPECT_LT(last, 0.5 * first) << "loss " << first << " -> " << last;
  EXPECT_EQ(adamw.steps(), 30);
}

TYPED_TEST(NnLayers, BadShapesThrowAndWriteNothing) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  kfa::nn::TransformerBlockOptions options;
  options.attention.d_model = 48;
  options.attention.heads = 3;
  options.d_ff = 40;
  kfa::nn::TransformerBlock<Space, T> block(options);
  typename kfa::nn::TransformerBlock<Space, T>::context_type context;
  DeviceView3<T, Space> x("x", 2, 5, 48), bad("bad", 2, 5, 40), y("y", 2, 5, 48),
      y_short("y_short", 2, 4, 48);
  Kokkos::deep_copy(y, T(3));
  expect_invalid_argument([&] { block.forward(Space(), bad, y, context); },
                 "kfa::nn::TransformerBlock::forward: x must be [batch][seqlen][d_model] with "
                 "d_model = 48, got [2][5][40]");
  expect_invalid_argument([&] { block.forward(Space(), x, y_short, context); },
                 "y must be [batch][seqlen][d_model] = [2][5][48], got [2][4][48]");
  expect_invalid_argument([&] { block.forward(Space(), x, x, context); }, "y must not overlap x");
  expect_invalid_argument([&] { block.backward(Space(), x, y, context); },
                 "call forward with this context first");
  expect_invalid_argument([&] {
    auto o = options;
    o.d_ff = 0;
    kfa::nn::TransformerBlock<Space, T> b(o);
  }, "options.d_ff must be > 0");
  expect_invalid_argument([&] {
    auto o = options;
    o.attention.qk_norm = true;
    o.attention.qk_norm_options.eps = -1;
    kfa::nn::TransformerBlock<Space, T> b(o);
  }, "options.qk_norm_options.eps must be finite and >= 0");
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), y);
  for (std::size_t n = 0; n < host.size(); ++n) ASSERT_EQ(host.data()[n], T(3)) << "y written";
}

// ---------------------------------------------------------------------------
// Axial rotary embeddings as a layer option (options.axial_rotary).

kfa::nn::AxialRotaryOptions grid_rope(int axes, std::array<int, 3> extent,
                                      kfa::nn::RotaryStyle style, int rotary_dim,
                                      std::array<int, 3> offset = {0, 0, 0},
                                      std::array<double, 3> scale = {1, 1, 1}) {
  kfa::nn::AxialRotaryOptions o;
  o.axes = axes;
  o.style = style;
  o.rotary_dim = rotary_dim;
  for (int a = 0; a < 3; ++a) {
    o.extent[a] = extent[a];
    o.offset[a] = offset[a];
    o.scale[a] = scale[a];
  }
  return o;
}

/// Self-attention on 2D, 3D and 1D grids (both pair conventions, partial
/// rotary, offsets and scales, qk-norm, grouped-query heads, the recompute
/// mode), cross-attention between two fields on one grid, the Llama block,
/// and a packed batch of grids (with an empty sequence), each forward, input
/// gradient and every parameter gradient against the fp64 oracle.
TYPED_TEST(NnLayers, AxialRotaryThroughTheLayersMatchesOracle) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  using kfa::nn::RotaryStyle;
  const int B = 2, d = 48;
  std::vector<kfa::nn::MultiHeadAttentionOptions> cases(3);
  for (auto& o : cases) {
    o.d_model = d;
    o.axial_rotary = true;
  }
  // 5 x 7, fused, grouped-query, causal, half-split over all 12 features.
  cases[0].heads = 4;
  cases[0].kv_heads = 2;
  cases[0].head_dim = 12;
  cases[0].attention.causal = true;
  cases[0].axial_rotary_options = grid_rope(2, {5, 7, 1}, RotaryStyle::half_split, 0, {2, -3, 0},
                                            {1, 0.5, 1});
  // 3 x 2 x 5, separate projections without bias, qk-norm, interleaved
  // partial rotary (12 of 16 features, 4 per axis).
  cases[1].heads = 3;
  cases[1].fused_qkv = false;
  cases[1].bias = false;
  cases[1].qk_norm = true;
  cases[1].axial_rotary_options = grid_rope(3, {3, 2, 5}, RotaryStyle::interleaved, 12);
  // One axis of 29 points in the recompute mode, a window.
  cases[2].heads = 3;
  cases[2].recompute = true;
  cases[2].attention.window_left = 6;
  cases[2].attention.window_right = 4;
  cases[2].axial_rotary_options = grid_rope(1, {29, 1, 1}, RotaryStyle::interleaved, 8, {40, 0, 0});
  for (int index = 0; index < int(cases.size()); ++index) {
    const auto& options = cases[index];
    int S = 1;
    for (int a = 0; a < options.axial_rotary_options.axes; ++a)
      S *= options.axial_rotary_options.extent[a];
    const std::string tag = "nn_axial_mha_" + std::to_string(index);
    const std::string what = tag + " " + type_name<T>() + " " + Space::name() + " seed " +
                             std::to_string(test_seed(tag));
    kfa::nn::MultiHeadAttention<Space, T> mha(options);
    LayerRun<Space, T, decltype(mha)> run(mha, tag, B, S, d);
    const MhaParams p = mha_params(mha, false);
    MhaOracle oracle{mha.options(), p, B, S, {}, {}, {}, {}, {}, {}};
    oracle.forward(run.x);
    Tensor dx_ref;
    MhaParams g_ref = zero_grads(p);
    oracle.backward(run.x, run.dy, dx_ref, g_ref);
    const double factor = 16.0 * (d + S);
    expect_close_rel<T>(what + " y", run.y, oracle.y, factor);
    expect_close_rel<T>(what + " dx", run.dx, dx_ref, factor);
    expect_mha_grads<T>(what, mha_params(mha, true), g_ref, factor * 4);
  }
  {
    // Cross-attention: queries and memory are two fields on one 4 x 6 grid.
    kfa::nn::MultiHeadAttentionOptions options;
    options.d_model = d;
    options.heads = 3;
    options.axial_rotary = true;
    options.axial_rotary_options = grid_rope(2, {4, 6, 1}, RotaryStyle::half_split, 8);
    const int S = 24;
    const std::string tag = "nn_axial_cross";
    const std::string what = tag + " " + type_name<T>() + " " + Space::name() + " seed " +
                             std::to_string(test_seed(tag));
    kfa::nn::MultiHeadAttention<Space, T> mha(options);
    std::mt19937_64 rng(test_seed(tag));
    randomize_parameters(mha.parameters(), rng);
    const Tensor x = rounded<T>(random_tensor({B * S, d}, rng));
    const Tensor memory = rounded<T>(random_tensor({B * S, d}, rng));
    const Tensor dy = rounded<T>(random_tensor({B * S, d}, rng));
    auto xv = make_view<DeviceView3<T, Space>>(reshaped(x, {B, S, d}), "x");
    auto mv = make_view<DeviceView3<T, Space>>(reshaped(memory, {B, S, d}), "memory");
    auto dyv = make_view<DeviceView3<T, Space>>(reshaped(dy, {B, S, d}), "dy");
    DeviceView3<T, Space> yv("y", B, S, d), dxv("dx", B, S, d), dmv("dmemory", B, S, d);
    poison(yv);
    poison(dxv);
    poison(dmv);
    typename kfa::nn::MultiHeadAttention<Space, T>::context_type context;
    mha.forward(Space(), xv, mv, yv, context);
    mha.backward(Space(), dyv, dxv, dmv, context);
    Space().fence();
    const MhaParams p = mha_params(mha, false);
    MhaOracle oracle{mha.options(), p, B, S, {}, {}, {}, {}, {}, {}};
    oracle.forward(x, memory, S);
    Tensor dx_ref, dm_ref;
    MhaParams g_ref = zero_grads(p);
    oracle.backward(x, memory, dy, dx_ref, dm_ref, g_ref);
    const double factor = 16.0 * (d + 2 * S);
    expect_close_rel<T>(what + " y", reshaped(to_host(yv), {B * S, d}), oracle.y, factor);
    expect_close_rel<T>(what + " dx", reshaped(to_host(dxv), {B * S, d}), dx_ref, factor);
    expect_close_rel<T>(what + " dmemory", reshaped(to_host(dmv), {B * S, d}), dm_ref, factor);
    expect_mha_grads<T>(what, mha_params(mha, true), g_ref, factor * 4);
  }
  {
    // The Llama block on a 5 x 7 grid: RMSNorm, SwiGLU, separate
    // projections, grouped-query heads, interleaved axial rotary, causal.
    kfa::nn::TransformerBlockOptions options;
    options.attention.d_model = d;
    options.attention.heads = 4;
    options.attention.kv_heads = 2;
    options.attention.head_dim = 12;
    options.attention.fused_qkv = false;
    options.attention.attention.causal = true;
    options.attention.axial_rotary = true;
    options.attention.axial_rotary_options =
        grid_rope(2, {5, 7, 1}, RotaryStyle::interleaved, 8, {0, 3, 0});
    options.norm = kfa::nn::Norm::rms_norm;
    options.activation = kfa::nn::Activation::swiglu;
    options.bias = false;
    options.d_ff = 40;
    const int S = 35;
    const std::string tag = "nn_axial_block";
    const std::string what = tag + " " + type_name<T>() + " " + Space::name() + " seed " +
                             std::to_string(test_seed(tag));
    kfa::nn::TransformerBlock<Space, T> block(options);
    LayerRun<Space, T, decltype(block)> run(block, tag, B, S, d);
    expect_block_matches_oracle<T>(what, block, run.x, run.dy, run.y, run.dx, B, S);
  }
  {
    // A packed batch of three 3 x 4 grids, the second empty: every grid
    // starts at its own first point.
    using memory_space = typename Space::memory_space;
    const std::vector<int> offsets = {0, 12, 12, 24};
    const int total = 24;
    Kokkos::View<int*, memory_space> cu("cu_seqlens", offsets.size());
    Kokkos::deep_copy(cu, Kokkos::View<const int*, Kokkos::HostSpace,
                                       Kokkos::MemoryTraits<Kokkos::Unmanaged>>(offsets.data(),
                                                                                offsets.size()));
    kfa::nn::MultiHeadAttentionOptions options;
    options.d_model = d;
    options.heads = 3;
    options.qk_norm = true;
    options.attention.causal = true;
    options.axial_rotary = true;
    options.axial_rotary_options = grid_rope(2, {3, 4, 1}, RotaryStyle::half_split, 0, {1, 0, 0});
    const std::string tag = "nn_axial_packed";
    const std::string what = tag + " " + type_name<T>() + " " + Space::name() + " seed " +
                             std::to_string(test_seed(tag));
    kfa::nn::MultiHeadAttention<Space, T> mha(options);
    const RandomIo<DeviceView2<T, Space>> io(mha, tag, {total, d});
    typename kfa::nn::MultiHeadAttention<Space, T>::context_type context;
    mha.forward(Space(), io.xv, cu, 17, io.yv, context);
    mha.backward(Space(), io.dyv, io.dxv, context);
    Space().fence();
    // The two grids as a batch of 2 equal sequences: the same oracle.
    const MhaParams p = mha_params(mha, false);
    MhaOracle oracle{mha.options(), p, 2, 12, {}, {}, {}, {}, {}, {}};
    oracle.forward(io.x);
    Tensor dx_ref;
    MhaParams g_ref = zero_grads(p);
    oracle.backward(io.x, io.dy, dx_ref, g_ref);
    const double factor = 16.0 * (d + 12);
    expect_close_rel<T>(what + " y", to_host(io.yv), oracle.y, factor);
    expect_close_rel<T>(what + " dx", to_host(io.dxv), dx_ref, factor);
    expect_mha_grads<T>(what, mha_params(mha, true), g_ref, factor * 4);
  }
}

/// Bad axial options at construction, and sequences that are not the grid
/// (x, a cross-attention memory, a packed sequence, the block's x): named
/// std::invalid_argument, outputs untouched.
TYPED_TEST(NnLayers, AxialRotaryErrorsThrowAndWriteNothing) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  using Layer = kfa::nn::MultiHeadAttention<Space, T>;
  using kfa::nn::RotaryStyle;
  kfa::nn::MultiHeadAttentionOptions options;
  options.d_model = 16;
  options.heads = 2;
  options.axial_rotary = true;
  options.axial_rotary_options = grid_rope(2, {5, 7, 1}, RotaryStyle::half_split, 0);
  const auto refused = [&](const std::function<void(kfa::nn::MultiHeadAttentionOptions&)>& edit,
                           const std::string& message) {
    auto o = options;
    edit(o);
    expect_invalid_argument([&] { Layer layer(o); }, message);
  };
  refused([](auto& o) { o.rotary = true; },
          "kfa::nn::MultiHeadAttention: options.axial_rotary replaces options.rotary and "
          "options.alibi");
  refused([](auto& o) { o.alibi = true; }, "options.axial_rotary replaces options.rotary");
  refused([](auto& o) { o.axial_rotary_options.axes = 4; },
          "options.axial_rotary_options.axes must be 1, 2 or 3, got 4");
  refused([](auto& o) { o.axial_rotary_options.extent[1] = 0; },
          "options.axial_rotary_options.extent[1] must be >= 1, got extent = [5][0]");
  refused([](auto& o) { o.axial_rotary_options.rotary_dim = 6; },
          "options.axial_rotary_options.rotary_dim (0: head_dim) must be in 0..head_dim = 8 and "
          "a multiple of 2·axes = 4 (an even share per axis), got 6");
  refused([](auto& o) { o.axial_rotary_options.axes = 3; },
          "a multiple of 2·axes = 6 (an even share per axis), got 8");
  refused([](auto& o) { o.axial_rotary_options.scale[0] = NAN; },
          "options.axial_rotary_options.base must be finite and > 0 and its scale finite");

  const Layer layer(options);
  typename Layer::context_type context;
  DeviceView3<T, Space> x("x", 2, 36, 16), y("y", 2, 36, 16), x35("x35", 2, 35, 16),
      y35("y35", 2, 35, 16), memory("memory", 2, 30, 16);
  Kokkos::deep_copy(y, T(7));
  Kokkos::deep_copy(y35, T(7));
  expect_invalid_argument([&] { layer.forward(Space(), x, y, context); },
                          "kfa::nn::MultiHeadAttention::forward: x must be [batch][35][16]: "
                          "options.axial_rotary_options.extent = [5][7] holds 35 grid points, "
                          "but seqlen is 36");
  expect_invalid_argument([&] { layer.forward(Space(), x35, memory, y35, context); },
                          "kfa::nn::MultiHeadAttention::forward: memory must be [batch][35][16]: "
                          "options.axial_rotary_options.extent = [5][7] holds 35 grid points, "
                          "but seqlen_kv is 30");
  {
    using memory_space = typename Space::memory_space;
    const std::vector<int> offsets = {0, 35, 55};
    Kokkos::View<int*, memory_space> cu("cu_seqlens", offsets.size());
    Kokkos::deep_copy(cu, Kokkos::View<const int*, Kokkos::HostSpace,
                                       Kokkos::MemoryTraits<Kokkos::Unmanaged>>(offsets.data(),
                                                                                offsets.size()));
    DeviceView2<T, Space> xp("xp", 55, 16), yp("yp", 55, 16);
    Kokkos::deep_copy(yp, T(7));
    expect_invalid_argument([&] { layer.forward(Space(), xp, cu, 35, yp, context); },
                            "kfa::nn::MultiHeadAttention::forward: "
                            "options.axial_rotary_options.extent holds 35 grid points: every "
                            "sequence of a packed batch must be the grid (or empty), got "
                            "cu_seqlens sequence 1 of length 20");
    for (double v : to_host(yp).data) ASSERT_EQ(v, 7.0) << "packed y written";
  }
  kfa::nn::TransformerBlockOptions block_options;
  block_options.attention = options;
  block_options.d_ff = 8;
  kfa::nn::TransformerBlock<Space, T> block(block_options);
  typename kfa::nn::TransformerBlock<Space, T>::context_type block_context;
  expect_invalid_argument([&] { block.forward(Space(), x, y, block_context); },
                          "x must be [batch][35][16]: options.axial_rotary_options.extent = "
                          "[5][7] holds 35 grid points, but seqlen is 36");
  for (double v : to_host(y).data) ASSERT_EQ(v, 7.0) << "y written";
  for (double v : to_host(y35).data) ASSERT_EQ(v, 7.0) << "cross-attention y written";
}

// ---------------------------------------------------------------------------
// Packed cross-attention: queries and memory with their own cu_seqlens.

/// A device View of int offsets.
template <class Space>
Kokkos::View<int*, typename Space::memory_space> device_offsets(std::vector<int> v) {
  Kokkos::View<int*, typename Space::memory_space> cu("cu", v.size());
  Kokkos::deep_copy(cu, Kokkos::View<const int*, Kokkos::HostSpace,
                                     Kokkos::MemoryTraits<Kokkos::Unmanaged>>(v.data(), v.size()));
  return cu;
}

/// Sequences of query lengths 13, 0, 29, 7, 5 over memories of 20, 9, 11, 6
/// and 0 tokens (an empty query run beside a memory, a query run without
/// memory): y, dx, dmemory and every parameter gradient against the oracle
/// run one sequence at a time. A sequence without memory has attention output
/// 0 (y = out_proj's bias, dx = 0, only out_proj.bias gets its dy); a memory
/// without queries gets dmemory = 0.
TYPED_TEST(NnLayers, PackedCrossAttentionMatchesOracle) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  const std::vector<int> lengths = {13, 0, 29, 7, 5}, lengths_kv = {20, 9, 11, 6, 0};
  std::vector<int> offsets{0}, offsets_kv{0};
  for (std::size_t b = 0; b < lengths.size(); ++b) {
    offsets.push_back(offsets.back() + lengths[b]);
    offsets_kv.push_back(offsets_kv.back() + lengths_kv[b]);
  }
  const int total = offsets.back(), total_kv = offsets_kv.back(), d = 48;
  const int max_seqlen = 29, max_seqlen_kv = 23;
  const auto cu = device_offsets<Space>(offsets), cu_kv = device_offsets<Space>(offsets_kv);
  std::vector<kfa::nn::MultiHeadAttentionOptions> cases(3);
  for (auto& o : cases) o.d_model = d;
  cases[0].heads = 3;  // fused q | k,v, qk-norm, half-split rotary, causal
  cases[0].qk_norm = true;
  cases[0].rotary = true;
  cases[0].attention.causal = true;
  cases[1].heads = 4;  // separate, memory of 20 features, grouped-query, ALiBi, a window
  cases[1].kv_heads = 2;
  cases[1].head_dim = 12;
  cases[1].d_model_kv = 20;
  cases[1].fused_qkv = false;
  cases[1].alibi = true;
  cases[1].attention.window_left = 4;
  cases[1].attention.window_right = 2;
  cases[2].heads = 3;  // fused, interleaved partial rotary with an offset, recompute
  cases[2].rotary = true;
  cases[2].rotary_options.style = kfa::nn::RotaryStyle::interleaved;
  cases[2].rotary_options.rotary_dim = 10;
  cases[2].rotary_options.position_offset = 3;
  cases[2].recompute = true;
  for (int index = 0; index < int(cases.size()); ++index) {
    const auto& options = cases[index];
    const int dkv = options.d_model_kv > 0 ? options.d_model_kv : d;
    const std::string tag = "nn_packed_cross_" + std::to_string(index);
    const std::string what = tag + " " + type_name<T>() + " " + Space::name() + " seed " +
                             std::to_string(test_seed(tag));
    kfa::nn::MultiHeadAttention<Space, T> mha(options);
    std::mt19937_64 rng(test_seed(tag));
    randomize_parameters(mha.parameters(), rng);
    const Tensor x = rounded<T>(random_tensor({total, d}, rng));
    const Tensor memory = rounded<T>(random_tensor({total_kv, dkv}, rng));
    const Tensor dy = rounded<T>(random_tensor({total, d}, rng));
    auto xv = make_view<DeviceView2<T, Space>>(x, "x");
    auto mv = make_view<DeviceView2<T, Space>>(memory, "memory");
    auto dyv = make_view<DeviceView2<T, Space>>(dy, "dy");
    DeviceView2<T, Space> yv("y", total, d), dxv("dx", total, d), dmv("dmemory", total_kv, dkv);
    poison(yv);
    poison(dxv);
    poison(dmv);
    typename kfa::nn::MultiHeadAttention<Space, T>::context_type context;
    mha.forward(Space(), xv, cu, max_seqlen, mv, cu_kv, max_seqlen_kv, yv, context);
    mha.backward(Space(), dyv, dxv, dmv, context);
    Space().fence();

    const MhaParams p = mha_params(mha, false);
    Tensor y_ref({total, d}), dx_ref({total, d}), dm_ref({total_kv, dkv});
    MhaParams g_ref = zero_grads(p);
    for (std::size_t b = 0; b < lengths.size(); ++b) {
      const Tensor x_b = row_range(x, offsets[b], offsets[b + 1]);
      const Tensor dy_b = row_range(dy, offsets[b], offsets[b + 1]);
      Tensor y_b({lengths[b], d}), dx_b({lengths[b], d}), dm_b({lengths_kv[b], dkv});
      if (lengths[b] > 0 && lengths_kv[b] > 0) {
        MhaOracle oracle{mha.options(), p, 1, lengths[b], {}, {}, {}, {}, {}, {}};
        if (options.alibi) oracle.extras = alibi_extras(options.heads);
        const Tensor m_b = row_range(memory, offsets_kv[b], offsets_kv[b + 1]);
        oracle.forward(x_b, m_b, lengths_kv[b]);
        oracle.backward(x_b, m_b, dy_b, dx_b, dm_b, g_ref);
        y_b = oracle.y;
      } else if (lengths[b] > 0) {
        for (int i = 0; i < lengths[b]; ++i)
          for (int c = 0; c < d; ++c) {
            at2(y_b, i, c) = p.bo.data.empty() ? 0 : p.bo.data[c];
            if (!g_ref.bo.data.empty()) g_ref.bo.data[c] += at2(dy_b, i, c);
          }
      }
      std::copy(y_b.data.begin(), y_b.data.end(), y_ref.data.begin() + std::size_t(offsets[b]) * d);
      std::copy(dx_b.data.begin(), dx_b.data.end(),
                dx_ref.data.begin() + std::size_t(offsets[b]) * d);
      std::copy(dm_b.data.begin(), dm_b.data.end(),
                dm_ref.data.begin() + std::size_t(offsets_kv[b]) * dkv);
    }
    const double factor = 16.0 * (d + max_seqlen + max_seqlen_kv);
    expect_close_rel<T>(what + " y", to_host(yv), y_ref, factor);
    expect_close_rel<T>(what + " dx", to_host(dxv), dx_ref, factor);
    expect_close_rel<T>(what + " dmemory", to_host(dmv), dm_ref, factor);
    expect_mha_grads<T>(what, mha_params(mha, true), g_ref, factor * 4);
  }
}

/// Offsets of another batch or total, memory of another width, overlapping
/// outputs, the wrong backward for the context: named std::invalid_argument,
/// outputs untouched.
TYPED_TEST(NnLayers, PackedCrossAttentionErrorsThrowAndWriteNothing) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  kfa::nn::MultiHeadAttentionOptions options;
  options.d_model = 16;
  options.heads = 2;
  options.d_model_kv = 12;
  options.fused_qkv = false;
  kfa::nn::MultiHeadAttention<Space, T> mha(options);
  typename kfa::nn::MultiHeadAttention<Space, T>::context_type context, self;
  const auto cu = device_offsets<Space>({0, 3, 7}), cu_kv = device_offsets<Space>({0, 5, 9});
  DeviceView2<T, Space> x("x", 7, 16), y("y", 7, 16), dx("dx", 7, 16), m("m", 9, 12),
      m_bad("m_bad", 9, 16), dm("dm", 9, 12), dm_short("dm_short", 8, 12);
  Kokkos::deep_copy(y, T(3));
  Kokkos::deep_copy(dx, T(3));
  Kokkos::deep_copy(dm, T(3));
  const char* function = "kfa::nn::MultiHeadAttention::forward: ";
  expect_invalid_argument(
      [&] {
        mha.forward(Space(), x, cu, 4, m, device_offsets<Space>({0, 9}), 9, y, context);
      },
      std::string(function) + "cu_seqlens_kv must be [batch + 1] = [3] like cu_seqlens, got [2]");
  expect_invalid_argument(
      [&] {
        mha.forward(Space(), x, cu, 4, m, device_offsets<Space>({0, 5, 8}), 5, y, context);
      },
      "cu_seqlens_kv must start at 0, never decrease, end at total_tokens_kv = 9 and hold "
      "lengths <= max_seqlen_kv = 5; got cu_seqlens_kv[2] = 8");
  expect_invalid_argument([&] { mha.forward(Space(), x, cu, 4, m, cu_kv, 4, y, context); },
                          "hold lengths <= max_seqlen_kv = 4; got cu_seqlens_kv[1] = 5");
  expect_invalid_argument([&] { mha.forward(Space(), x, cu, 3, m, cu_kv, 5, y, context); },
                          "hold lengths <= max_seqlen = 3; got cu_seqlens[2] = 7");
  expect_invalid_argument([&] { mha.forward(Space(), x, cu, 4, m_bad, cu_kv, 5, y, context); },
                          "memory must be [total_tokens_kv][d_model_kv] with d_model_kv = 12, "
                          "got [9][16]");
  expect_invalid_argument(
      [&] {
        DeviceView1<T, Space> buffer("buffer", 9 * 12 + 7 * 16);
        DeviceView2<T, Space> m_alias(buffer.data(), 9, 12), y_alias(buffer.data() + 100, 7, 16);
        mha.forward(Space(), x, cu, 4, m_alias, cu_kv, 5, y_alias, context);
      },
      "y must not overlap memory");
  // The self-attention overloads of a packed cross-attention context, and
  // the reverse.
  DeviceView2<T, Space> y_packed("y_packed", 7, 16);
  mha.forward(Space(), x, cu, 4, m, cu_kv, 5, y_packed, context);
  expect_invalid_argument([&] { mha.backward(Space(), y_packed, dx, context); },
                          "kfa::nn::MultiHeadAttention::backward: the forward had a memory "
                          "(packed cross-attention): call backward(space, dy, dx, dmemory, "
                          "context)");
  expect_invalid_argument([&] { mha.backward(Space(), y_packed, dx, dm_short, context); },
                          "dmemory must be [total_tokens_kv][d_model_kv] = [9][12], got [8][12]");
  expect_invalid_argument([&] { mha.backward(Space(), y_packed, dx, dx, context); },
                          "dmemory must be [total_tokens_kv][d_model_kv] = [9][12], got [7][16]");
  DeviceView3<T, Space> m3("m3", 1, 9, 12), x3("x3", 1, 7, 16), y3("y3", 1, 7, 16);
  mha.forward(Space(), x3, m3, y3, self);
  expect_invalid_argument([&] { mha.backward(Space(), y_packed, dx, dm, self); },
                          "dmemory [9][12] is packed: it needs a packed cross-attention forward");
  const DeviceView2<T, Space> written[] = {y, dx, dm};
  for (const auto& v : written) {
    auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
    for (std::size_t n = 0; n < host.size(); ++n)
      ASSERT_EQ(host.data()[n], T(3)) << v.label() << " written";
  }
}

}  // namespace
