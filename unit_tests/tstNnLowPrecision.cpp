// kfa::nn with kfa::bfloat16 and kfa::half: the functional steps round once
// from fp32 (error within an ulp of the fp64 oracle on the same 16-bit
// inputs); MultiHeadAttention, TransformerBlock and TransformerDecoderBlock
// forward and backward against the fp64 oracle under FlashAttention's rule,
// the baseline being the same oracle rounding every tensor where the layer
// stores one (the plain implementation in the same precision); fp32 gradients; AdamW with fp32
// master weights; safetensors files of dtype BF16 and F16; argument errors.
// On Kokkos 3.4 host builds kfa::half is float: its cases are skipped there.

#include "nn_layer_oracles.hpp"

#include <cstdio>

namespace {

using namespace kfa_test;

using LowConfigs = ::testing::Types<
#ifdef KOKKOS_ENABLE_CUDA
    Config<Kokkos::Cuda, kfa::bfloat16>, Config<Kokkos::Cuda, kfa::half, true>,
#endif
#ifdef KOKKOS_ENABLE_OPENMP
    Config<Kokkos::OpenMP, kfa::bfloat16>, Config<Kokkos::OpenMP, kfa::half, true>,
#endif
#ifdef KOKKOS_ENABLE_SERIAL
    Config<Kokkos::Serial, kfa::bfloat16>, Config<Kokkos::Serial, kfa::half, true>
#endif
    >;

template <class C>
class NnLowPrecision : public ::testing::Test {
 protected:
  void SetUp() override {
    if (is_duplicate_config<C>()) GTEST_SKIP() << "kfa::half is float in this build";
  }
};
TYPED_TEST_SUITE(NnLowPrecision, LowConfigs);

template <class T>
Tensor round_to(Tensor t) {
  return rounded<T>(std::move(t));
}

/// A step that computes in fp32 and rounds its result once: within one ulp
/// of T of the fp64 oracle's value, elementwise (relative to max(1, |ref|)
/// for values near zero).
template <class T>
void expect_rounded_once(const std::string& what, const Tensor& got, const Tensor& ref) {
  ASSERT_EQ(got.data.size(), ref.data.size()) << what;
  double worst = 0;
  std::size_t at = 0;
  for (std::size_t n = 0; n < got.data.size(); ++n) {
    const double ulps = std::abs(got.data[n] - ref.data[n]) /
                        (epsilon<T>() * std::max(1.0, std::abs(ref.data[n])));
    if (!(ulps <= worst)) worst = ulps, at = n;
  }
  EXPECT_LE(worst, 1.0) << what << ": " << worst << " ulps at " << at << " (got "
                        << got.data[at] << ", oracle " << ref.data[at] << ")";
}

TYPED_TEST(NnLowPrecision, FunctionalStepsRoundOnce) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  using Acc = kfa::accumulator_t<T>;
  const int tokens = 29, in = 40, out = 23;
  const std::string tag = "nn_low_functional";
  const std::string what = tag + " " + type_name<T>() + " " + Space::name();
  std::mt19937_64 rng(test_seed(tag));
  const Tensor x = round_to<T>(random_tensor({tokens, in}, rng));
  const Tensor w = round_to<T>(random_tensor({out, in}, rng, 0.2));
  const Tensor b = round_to<T>(random_tensor({out}, rng));
  const Tensor dy = round_to<T>(random_tensor({tokens, out}, rng));
  auto xv = make_view<DeviceView2<T, Space>>(x, "x");
  auto wv = make_view<DeviceView2<T, Space>>(w, "w");
  auto bv = make_view<DeviceView1<T, Space>>(b, "b");
  auto dyv = make_view<DeviceView2<T, Space>>(dy, "dy");
  DeviceView2<T, Space> yv("y", tokens, out), dxv("dx", tokens, in), dwv("dw", out, in);
  DeviceView1<T, Space> dbv("db", out);
  DeviceView2<Acc, Space> dw32("dw32", out, in);
  DeviceView1<Acc, Space> db32("db32", out);
  poison(yv);
  poison(dxv);
  kfa::nn::linear_forward(Space(), xv, wv, bv, yv);
  kfa::nn::linear_backward(Space(), xv, wv, dyv, dxv, dwv, dbv);
  // fp32 gradients from the same 16-bit activations, accumulated twice.
  kfa::nn::linear_backward(Space(), xv, wv, dyv, DeviceView2<T, Space>(), dw32, db32);
  kfa::nn::linear_backward(Space(), xv, wv, dyv, DeviceView2<T, Space>(), dw32, db32);
  Space().fence();
  Tensor dx_ref, dw_ref({out, in}), db_ref({out});
  ref_linear_backward(x, w, dy, dx_ref, dw_ref, db_ref);
  expect_rounded_once<T>(what + " linear y", to_host(yv), ref_linear(x, w, b));
  expect_rounded_once<T>(what + " linear dx", to_host(dxv), dx_ref);
  expect_rounded_once<T>(what + " linear dweight", to_host(dwv), dw_ref);
  expect_rounded_once<T>(what + " linear dbias", to_host(dbv), db_ref);
  Tensor dw2 = dw_ref, db2 = db_ref;
  for (double& v : dw2.data) v *= 2;
  for (double& v : db2.data) v *= 2;
  // fp32 sums of 29 products: far inside an fp32 ulp budget of the 16-bit one.
  expect_close_rel<float>(what + " linear fp32 dweight", to_host(dw32), dw2, 4.0 * tokens);
  expect_close_rel<float>(what + " linear fp32 dbias", to_host(db32), db2, 4.0 * tokens);

  for (const bool rms : {false, true}) {
    const std::string norm = what + (rms ? " rms_norm" : " layer_norm");
    const Tensor gamma = round_to<T>(random_tensor({in}, rng, 0.5));
    const Tensor beta = rms ? Tensor() : round_to<T>(random_tensor({in}, rng, 0.5));
    const Tensor dyn = round_to<T>(random_tensor({tokens, in}, rng));
    auto gv = make_view<DeviceView1<T, Space>>(gamma, "gamma");
    auto betav = make_view<DeviceView1<T, Space>>(beta, "beta");
    auto dynv = make_view<DeviceView2<T, Space>>(dyn, "dy");
    DeviceView2<T, Space> nv("y", tokens, in), dnv("dx", tokens, in);
    DeviceView1<Acc, Space> mean("mean", tokens), rstd("rstd", tokens);
    DeviceView1<Acc, Space> dgamma("dgamma", in), dbeta("dbeta", rms ? 0 : in);
    if (rms) {
      kfa::nn::rms_norm_forward(Space(), xv, gv, nv, rstd);
      kfa::nn::rms_norm_backward(Space(), xv, gv, rstd, dynv, dnv, dgamma);
    } else {
      kfa::nn::layer_norm_forward(Space(), xv, gv, betav, nv, mean, rstd);
      kfa::nn::layer_norm_backward(Space(), xv, gv, mean, rstd, dynv, dnv, dgamma, dbeta);
    }
    Space().fence();
    Tensor dn_ref, dg_ref({in}), dbeta_ref = rms ? Tensor() : Tensor({in});
    ref_norm_backward(x, gamma, 1e-5, rms, dyn, dn_ref, dg_ref, dbeta_ref);
    expect_rounded_once<T>(norm + " y", to_host(nv), ref_norm(x, gamma, beta, 1e-5, rms));
    // dx cancels (g - mean(g) - x̂·mean(g·x̂)): an ulp of the terms' size.
    expect_close_rel<T>(norm + " dx", to_host(dnv), dn_ref, 1.0);
    expect_close_rel<float>(norm + " fp32 dgamma", to_host(dgamma), dg_ref, 16.0 * tokens);
    if (!rms)
      expect_close_rel<float>(norm + " fp32 dbeta", to_host(dbeta), dbeta_ref, 16.0 * tokens);
  }

  for (const auto act : {kfa::nn::Activation::gelu, kfa::nn::Activation::swiglu}) {
    const bool glu = act == kfa::nn::Activation::swiglu;
    const std::string name = what + (glu ? " swiglu" : " gelu");
    const Tensor dg = round_to<T>(random_tensor({tokens, glu ? in / 2 : in}, rng));
    auto dgv = make_view<DeviceView2<T, Space>>(dg, "dg");
    DeviceView2<T, Space> gv("g", tokens, glu ? in / 2 : in), duv("du", tokens, in);
    if (glu) {
      kfa::nn::swiglu_forward(Space(), xv, gv);
      kfa::nn::swiglu_backward(Space(), xv, dgv, duv);
    } else {
      kfa::nn::gelu_forward(Space(), xv, gv);
      kfa::nn::gelu_backward(Space(), xv, dgv, duv);
    }
    Space().fence();
    expect_rounded_once<T>(name + " y", to_host(gv), ref_activation(x, act));
    expect_rounded_once<T>(name + " dx", to_host(duv), ref_activation_backward(x, dg, act));
  }

  {
    // Rotary on [2][tokens][2][head_dim 10]: positions up to 28.
    const Tensor r = round_to<T>(random_tensor({2, tokens, 2, 10}, rng));
    auto rv = make_view<DeviceView4<T, Space>>(r, "x");
    DeviceView4<T, Space> ry("y", 2, tokens, 2, 10), rb("back", 2, tokens, 2, 10);
    kfa::nn::RotaryOptions ro;
    ro.rotary_dim = 8;
    kfa::nn::rotary_forward(Space(), rv, ry, ro);
    kfa::nn::rotary_backward(Space(), rv, rb, ro);
    Space().fence();
    expect_rounded_once<T>(what + " rotary forward", to_host(ry), ref_rotary(r, ro, 1));
    expect_rounded_once<T>(what + " rotary backward", to_host(rb), ref_rotary(r, ro, -1));
    // Axial rotary on one axis is the 1D rotary.
    kfa::nn::AxialRotaryOptions ao;
    ao.axes = 1;
    ao.extent[0] = tokens;
    ao.rotary_dim = 8;
    kfa::nn::axial_rotary_forward(Space(), rv, ry, ao);
    Space().fence();
    expect_rounded_once<T>(what + " axial rotary", to_host(ry), ref_rotary(r, ro, 1));
  }

  {
    // Dropout keeps an element exactly or zeroes it; x/(1 - p) rounds once.
    kfa::nn::DropoutOptions dropout{0.25, 7};
    DeviceView2<T, Space> dv("dropped", tokens, in);
    kfa::nn::dropout_forward(Space(), xv, dv, dropout);
    Space().fence();
    const Tensor got = to_host(dv);
    Tensor scaled = x;
    int kept = 0;
    for (std::size_t n = 0; n < got.data.size(); ++n) {
      scaled.data[n] = got.data[n] == 0 ? 0 : x.data[n] / 0.75;
      kept += got.data[n] != 0;
    }
    expect_rounded_once<T>(what + " dropout", got, scaled);
    EXPECT_NEAR(double(kept) / got.data.size(), 0.75, 0.05) << what << " dropout rate";
  }
}

/// y, dx and the gradients of the MultiHeadAttention oracle.
struct MhaResult {
  Tensor y, dx;
  MhaParams g;
};

MhaResult run_mha_oracle(const kfa::nn::MultiHeadAttentionOptions& o, const MhaParams& p, int B,
                         int S, const Tensor& x, const Tensor& dy, Tensor (*store)(Tensor),
                         bool round_grads) {
  MhaOracle oracle{o, p, B, S, {}, {}, {}, {}, {}, {}};
  oracle.store = store;
  oracle.forward(x);
  MhaResult r;
  r.y = oracle.y;
  r.g = zero_grads(p);
  oracle.backward(x, dy, r.dx, r.g);
  if (round_grads && store != nullptr) {
    Tensor* g[] = {&r.g.wq, &r.g.wk, &r.g.wv, &r.g.wo, &r.g.bq, &r.g.bk, &r.g.bv, &r.g.bo,
                   &r.g.qn, &r.g.kn};
    for (Tensor* t : g) *t = store(*t);
  }
  return r;
}

void expect_mha_grads_rule(const std::string& what, const MhaParams& got, const MhaParams& base,
                           const MhaParams& ref, double (*bound)(double, const Tensor&)) {
  const char* names[] = {"w_q", "w_k", "w_v", "w_o", "b_q", "b_k", "b_v", "b_o", "q_norm",
                         "k_norm"};
  const Tensor* g[] = {&got.wq, &got.wk, &got.wv, &got.wo, &got.bq,
                       &got.bk, &got.bv, &got.bo, &got.qn, &got.kn};
  const Tensor* b[] = {&base.wq, &base.wk, &base.wv, &base.wo, &base.bq,
                       &base.bk, &base.bv, &base.bo, &base.qn, &base.kn};
  const Tensor* r[] = {&ref.wq, &ref.wk, &ref.wv, &ref.wo, &ref.bq,
                       &ref.bk, &ref.bv, &ref.bo, &ref.qn, &ref.kn};
  for (int n = 0; n < 10; ++n) {
    ASSERT_EQ(g[n]->data.size(), r[n]->data.size()) << what << " d " << names[n];
    if (r[n]->data.empty()) continue;
    const double err = max_abs_diff(*g[n], *r[n]), err_base = max_abs_diff(*b[n], *r[n]);
    EXPECT_LE(err, bound(err_base, *r[n]))
        << what << ": d " << names[n] << " error " << err << ", baseline's " << err_base;
  }
}

template <class T>
double rule_bound(double err_base, const Tensor& ref) {
  return allowed_error<T>(err_base, ref);
}

template <class T>
void expect_rule(const std::string& what, const Tensor& got, const Tensor& base,
                 const Tensor& ref) {
  const double err = max_abs_diff(got, ref), err_base = max_abs_diff(base, ref);
  EXPECT_LE(err, allowed_error<T>(err_base, ref))
      << what << " error " << err << ", baseline's " << err_base;
  EXPECT_LE(err_base, baseline_sanity_bound<T>(max_abs(ref)))
      << what << " baseline error " << err_base << " is not plausible";
}

std::vector<kfa::nn::MultiHeadAttentionOptions> low_mha_cases() {
  std::vector<kfa::nn::MultiHeadAttentionOptions> cases(2);
  for (auto& o : cases) o.d_model = 48;
  cases[0].heads = 3;  // fused, biases, causal, T gradients
  cases[0].attention.causal = true;
  cases[1].heads = 4;  // separate, grouped-query, qk-norm, rotary, fp32 gradients
  cases[1].kv_heads = 2;
  cases[1].head_dim = 12;
  cases[1].fused_qkv = false;
  cases[1].qk_norm = true;
  cases[1].rotary = true;
  cases[1].fp32_gradients = true;
  return cases;
}

TYPED_TEST(NnLowPrecision, MultiHeadAttentionFollowsTheErrorRule) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  const int B = 2, S = 29, d = 48;
  int index = 0;
  for (const auto& options : low_mha_cases()) {
    const std::string tag = "nn_low_mha_" + std::to_string(index++);
    const std::string what = tag + " " + type_name<T>() + " " + Space::name() + " seed " +
                             std::to_string(test_seed(tag));
    kfa::nn::MultiHeadAttention<Space, T> mha(options);
    EXPECT_EQ(mha.grads().w_o.size() == 0, options.fp32_gradients) << what;
    EXPECT_EQ(mha.grads_fp32().w_o.size() == 0, !options.fp32_gradients) << what;
    const RandomIo<DeviceView3<T, Space>> io(mha, tag, {B, S, d});
    typename kfa::nn::MultiHeadAttention<Space, T>::context_type context;
    mha.forward(Space(), io.xv, io.yv, context);
    mha.backward(Space(), io.dyv, io.dxv, context);
    Space().fence();
    const Tensor x = reshaped(io.x, {B * S, d}), dy = reshaped(io.dy, {B * S, d});
    const MhaParams p = mha_params(mha, false);
    const MhaResult ref = run_mha_oracle(mha.options(), p, B, S, x, dy, nullptr, false);
    const MhaResult base =
        run_mha_oracle(mha.options(), p, B, S, x, dy, &round_to<T>, !options.fp32_gradients);
    expect_rule<T>(what + " y", reshaped(to_host(io.yv), {B * S, d}), base.y, ref.y);
    expect_rule<T>(what + " dx", reshaped(to_host(io.dxv), {B * S, d}), base.dx, ref.dx);
    expect_mha_grads_rule(what, mha_params(mha, true), base.g, ref.g,
                          options.fp32_gradients ? &rule_bound<float> : &rule_bound<T>);
  }
}

std::vector<kfa::nn::TransformerBlockOptions> low_block_cases() {
  std::vector<kfa::nn::TransformerBlockOptions> cases(2);
  for (auto& o : cases) {
    o.attention.d_model = 48;
    o.attention.heads = 3;
    o.d_ff = 40;
  }
  // torch.nn.TransformerEncoderLayer(norm_first=True): LayerNorm, GELU, causal.
  cases[0].attention.attention.causal = true;
  // Llama: RMSNorm, SwiGLU, no biases, separate projections, GQA, rotary,
  // fp32 gradients.
  cases[1].norm = kfa::nn::Norm::rms_norm;
  cases[1].activation = kfa::nn::Activation::swiglu;
  cases[1].bias = false;
  cases[1].attention.heads = 4;
  cases[1].attention.kv_heads = 2;
  cases[1].attention.head_dim = 12;
  cases[1].attention.fused_qkv = false;
  cases[1].attention.rotary = true;
  cases[1].attention.attention.causal = true;
  cases[1].fp32_gradients = true;
  return cases;
}

struct BlockResult {
  Tensor y, dx;
  std::vector<Tensor> g;
  MhaParams mg;
};

BlockResult run_block_oracle(const kfa::nn::TransformerBlockOptions& o, const MhaParams& mp,
                             const std::vector<Tensor>& w, int B, int S, const Tensor& x,
                             const Tensor& dy, Tensor (*store)(Tensor), bool round_grads) {
  BlockOracle oracle{o, MhaOracle{o.attention, mp, B, S, {}, {}, {}, {}, {}, {}},
                     w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]};
  oracle.mha.store = store;
  oracle.forward(x);
  BlockResult r;
  r.y = oracle.y;
  for (const Tensor& t : w) r.g.push_back(zeros_like(t));
  r.mg = zero_grads(mp);
  oracle.backward(x, dy, r.dx,
                  {&r.g[0], &r.g[1], &r.g[2], &r.g[3], &r.g[4], &r.g[5], &r.g[6], &r.g[7]}, r.mg);
  if (round_grads && store != nullptr) {
    for (Tensor& t : r.g) t = store(t);
    Tensor* g[] = {&r.mg.wq, &r.mg.wk, &r.mg.wv, &r.mg.wo, &r.mg.bq,
                   &r.mg.bk, &r.mg.bv, &r.mg.bo, &r.mg.qn, &r.mg.kn};
    for (Tensor* t : g) *t = store(*t);
  }
  return r;
}

TYPED_TEST(NnLowPrecision, TransformerBlockFollowsTheErrorRule) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  const int B = 2, S = 29, d = 48;
  const char* names[] = {"norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias",
                         "linear1.weight", "linear1.bias", "linear2.weight", "linear2.bias"};
  int index = 0;
  for (const auto& options : low_block_cases()) {
    const std::string tag = "nn_low_block_" + std::to_string(index++);
    const std::string what = tag + " " + type_name<T>() + " " + Space::name() + " seed " +
                             std::to_string(test_seed(tag));
    kfa::nn::TransformerBlock<Space, T> block(options);
    const RandomIo<DeviceView3<T, Space>> io(block, tag, {B, S, d});
    typename kfa::nn::TransformerBlock<Space, T>::context_type context;
    block.forward(Space(), io.xv, io.yv, context);
    block.backward(Space(), io.dyv, io.dxv, context);
    Space().fence();
    const Tensor x = reshaped(io.x, {B * S, d}), dy = reshaped(io.dy, {B * S, d});
    const MhaParams mp = mha_params(block.attention(), false);
    const std::vector<Tensor> w = block_tensors(block, false);
    const BlockResult ref = run_block_oracle(block.options(), mp, w, B, S, x, dy, nullptr, false);
    const BlockResult base = run_block_oracle(block.options(), mp, w, B, S, x, dy, &round_to<T>,
                                              !options.fp32_gradients);
    expect_rule<T>(what + " y", reshaped(to_host(io.yv), {B * S, d}), base.y, ref.y);
    expect_rule<T>(what + " dx", reshaped(to_host(io.dxv), {B * S, d}), base.dx, ref.dx);
    const auto bound = options.fp32_gradients ? &rule_bound<float> : &rule_bound<T>;
    const std::vector<Tensor> g = block_tensors(block, true);
    for (int n = 0; n < 8; ++n) {
      ASSERT_EQ(g[n].data.size(), ref.g[n].data.size()) << what << " d " << names[n];
      if (ref.g[n].data.empty()) continue;
      const double err = max_abs_diff(g[n], ref.g[n]), err_base = max_abs_diff(base.g[n], ref.g[n]);
      EXPECT_LE(err, bound(err_base, ref.g[n]))
          << what << ": d " << names[n] << " error " << err << ", baseline's " << err_base;
    }
    expect_mha_grads_rule(what + " self_attn", mha_params(block.attention(), true), base.mg,
                          ref.mg, bound);
  }
}

std::vector<kfa::nn::TransformerDecoderBlockOptions> low_decoder_cases() {
  std::vector<kfa::nn::TransformerDecoderBlockOptions> cases(2);
  for (auto& o : cases) {
    o.self_attention.d_model = 48;
    o.self_attention.heads = 3;
    o.d_ff = 40;
  }
  // cases[0]: torch.nn.TransformerDecoderLayer(norm_first=True), causal,
  // T gradients. cases[1]: RMSNorm, SwiGLU, no biases, grouped-query rotary
  // self-attention, a memory of 20 features, fp32 gradients.
  auto& o = cases[1];
  o.norm = kfa::nn::Norm::rms_norm;
  o.activation = kfa::nn::Activation::swiglu;
  o.bias = false;
  o.self_attention.heads = 4;
  o.self_attention.kv_heads = 2;
  o.self_attention.head_dim = 12;
  o.self_attention.fused_qkv = false;
  o.self_attention.rotary = true;
  o.cross_attention.d_model_kv = 20;
  o.cross_attention.fused_qkv = false;
  o.fp32_gradients = true;
  return cases;
}

struct DecoderResult {
  Tensor y, dx, dmemory;
  std::vector<Tensor> g;
  MhaParams sg, cg;
};

DecoderResult run_decoder_oracle(const kfa::nn::TransformerDecoderBlockOptions& o,
                                 const MhaParams& sp, const MhaParams& cp,
                                 const std::vector<Tensor>& w, int B, int S, int Skv,
                                 const Tensor& x, const Tensor& memory, const Tensor& dy,
                                 Tensor (*store)(Tensor), bool round_grads) {
  DecoderOracle oracle{o,
                       MhaOracle{o.self_attention, sp, B, S, {}, {}, {}, {}, {}, {}},
                       MhaOracle{o.cross_attention, cp, B, S, {}, {}, {}, {}, {}, {}},
                       w,
                       Skv};
  oracle.self_mha.store = store;
  oracle.cross_mha.store = store;
  oracle.forward(x, memory);
  DecoderResult r;
  r.y = oracle.y;
  for (const Tensor& t : w) r.g.push_back(zeros_like(t));
  r.sg = zero_grads(sp);
  r.cg = zero_grads(cp);
  oracle.backward(x, memory, dy, r.dx, r.dmemory, r.g, r.sg, r.cg);
  if (round_grads && store != nullptr) {
    for (Tensor& t : r.g) t = store(t);
    for (MhaParams* m : {&r.sg, &r.cg}) {
      Tensor* g[] = {&m->wq, &m->wk, &m->wv, &m->wo, &m->bq,
                     &m->bk, &m->bv, &m->bo, &m->qn, &m->kn};
      for (Tensor* t : g) *t = store(*t);
    }
  }
  return r;
}

TYPED_TEST(NnLowPrecision, TransformerDecoderBlockFollowsTheErrorRule) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  using Block = kfa::nn::TransformerDecoderBlock<Space, T>;
  const int B = 2, S = 29, Skv = 23, d = 48;
  const char* names[] = {"norm1.weight",   "norm1.bias",   "norm2.weight",  "norm2.bias",
                         "norm3.weight",   "norm3.bias",   "linear1.weight", "linear1.bias",
                         "linear2.weight", "linear2.bias"};
  int index = 0;
  for (const auto& options : low_decoder_cases()) {
    const std::string tag = "nn_low_decoder_" + std::to_string(index++);
    const std::string what = tag + " " + type_name<T>() + " " + Space::name() + " seed " +
                             std::to_string(test_seed(tag));
    Block block(options);
    const int dkv = block.options().cross_attention.d_model_kv;
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
    const MhaParams sp = mha_params(block.self_attention(), false);
    const MhaParams cp = mha_params(block.cross_attention(), false);
    const std::vector<Tensor> w = decoder_tensors(block, false);
    const DecoderResult ref = run_decoder_oracle(block.options(), sp, cp, w, B, S, Skv, x, memory,
                                                 dy, nullptr, false);
    const DecoderResult base = run_decoder_oracle(block.options(), sp, cp, w, B, S, Skv, x,
                                                  memory, dy, &round_to<T>,
                                                  !options.fp32_gradients);
    expect_rule<T>(what + " y", reshaped(to_host(yv), {B * S, d}), base.y, ref.y);
    expect_rule<T>(what + " dx", reshaped(to_host(dxv), {B * S, d}), base.dx, ref.dx);
    expect_rule<T>(what + " dmemory", reshaped(to_host(dmv), {B * Skv, dkv}), base.dmemory,
                   ref.dmemory);
    const auto bound = options.fp32_gradients ? &rule_bound<float> : &rule_bound<T>;
    const std::vector<Tensor> g = decoder_tensors(block, true);
    for (int n = 0; n < 10; ++n) {
      ASSERT_EQ(g[n].data.size(), ref.g[n].data.size()) << what << " d " << names[n];
      if (ref.g[n].data.empty()) continue;
      const double err = max_abs_diff(g[n], ref.g[n]), err_base = max_abs_diff(base.g[n], ref.g[n]);
      EXPECT_LE(err, bound(err_base, ref.g[n]))
          << what << ": d " << names[n] << " error " << err << ", baseline's " << err_base;
    }
    expect_mha_grads_rule(what + " self_attn", mha_params(block.self_attention(), true), base.sg,
                          ref.sg, bound);
    expect_mha_grads_rule(what + " multihead_attn", mha_params(block.cross_attention(), true),
                          base.cg, ref.cg, bound);
  }
}

/// fp64 AdamW (torch.optim.AdamW's formula) on a vector, in place.
void ref_adamw(std::vector<double>& p, const std::vector<double>& g, std::vector<double>& m,
               std::vector<double>& v, long step, const kfa::nn::AdamWOptions& o) {
  for (std::size_t n = 0; n < p.size(); ++n) {
    p[n] *= 1 - o.lr * o.weight_decay;
    m[n] = o.beta1 * m[n] + (1 - o.beta1) * g[n];
    v[n] = o.beta2 * v[n] + (1 - o.beta2) * g[n] * g[n];
    const double mhat = m[n] / (1 - std::pow(o.beta1, double(step)));
    const double vhat = v[n] / (1 - std::pow(o.beta2, double(step)));
    p[n] -= o.lr * mhat / (std::sqrt(vhat) + o.eps);
  }
}

/// Updates below half the 16-bit spacing of a weight: without master
/// weights each step rounds back to the old value, with them the steps
/// accumulate in fp32 and the parameter follows the fp64 AdamW.
TYPED_TEST(NnLowPrecision, AdamWMasterWeightsAccumulateSmallUpdates) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  using Acc = kfa::accumulator_t<T>;
  using Parameter = kfa::nn::Parameter<T, typename Space::memory_space>;
  const int n = 64, steps = 100;
  const std::string what = std::string("adamw ") + type_name<T>() + " " + Space::name();
  std::mt19937_64 rng(test_seed("nn_low_adamw"));
  const Tensor p0 = round_to<T>(random_tensor({n}, rng, 4.0));
  const Tensor grad = round_to<T>(random_tensor({n}, rng));
  kfa::nn::AdamWOptions options;
  options.lr = 1e-4 * epsilon<T>() * 128;  // a step of lr is far below the spacing of |p| > 1
  options.weight_decay = 0;
  for (const bool master : {false, true}) {
    options.fp32_master_weights = master;
    auto value = make_view<DeviceView1<T, Space>>(p0, "value");
    auto g = make_view<DeviceView1<T, Space>>(grad, "grad");
    kfa::nn::AdamW<Space, T> adamw(
        {Parameter{"p", typename Parameter::view_type(value.data(), n),
                   typename Parameter::view_type(g.data(), n)}},
        options);
    EXPECT_EQ(adamw.master_weights()[0].size(), master ? std::size_t(n) : 0u) << what;
    for (int s = 0; s < steps; ++s) adamw.step(Space());
    Space().fence();
    std::vector<double> p = p0.data, m(n), v(n);
    for (int s = 1; s <= steps; ++s) ref_adamw(p, grad.data, m, v, s, options);
    const Tensor got = to_host(value);
    int moved = 0;
    for (int k = 0; k < n; ++k) {
      moved += got.data[k] != p0.data[k];
      if (master) {
        // The master follows fp64 within fp32 rounding; the parameter is it rounded.
        const Tensor mw = to_host(adamw.master_weights()[0]);
        EXPECT_NEAR(mw.data[k], p[k], 1e-5 * std::max(1.0, std::abs(p[k]))) << what << " " << k;
        EXPECT_EQ(got.data[k], to_double(from_double<T>(Acc(mw.data[k])))) << what << " " << k;
      } else if (std::abs(p0.data[k]) > 1) {
        EXPECT_EQ(got.data[k], p0.data[k]) << what << " without master weights, " << k;
      }
    }
    if (master) EXPECT_GT(moved, n / 4) << what << ": the accumulated updates moved few weights";
  }
}

/// A bf16/fp16 block with fp32 gradients and master weights learns.
TYPED_TEST(NnLowPrecision, TrainingWithMasterWeightsReducesLoss) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  const int B = 2, S = 16, d = 32;
  kfa::nn::TransformerBlockOptions options;
  options.attention.d_model = d;
  options.attention.heads = 2;
  options.d_ff = 64;
  options.fp32_gradients = true;
  kfa::nn::TransformerBlock<Space, T> block(options);
  kfa::nn::AdamWOptions adamw_options{1e-2, 0.9, 0.999, 1e-8, 0.0};
  adamw_options.fp32_master_weights = true;
  kfa::nn::AdamW<Space, T> adamw(block.parameters(), adamw_options);
  for (const auto& p : block.parameters()) {
    EXPECT_EQ(p.grad.size(), 0u) << p.name;
    EXPECT_EQ(p.grad_fp32.size(), p.value.size()) << p.name;
  }
  std::mt19937_64 rng(test_seed("nn_low_training"));
  const Tensor x = round_to<T>(random_tensor({B, S, d}, rng));
  const Tensor target = random_tensor({B, S, d}, rng, 0.5);
  auto xv = make_view<DeviceView3<T, Space>>(x, "x");
  DeviceView3<T, Space> yv("y", B, S, d), dxv("dx", B, S, d);
  typename kfa::nn::TransformerBlock<Space, T>::context_type context;
  double first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    block.forward(Space(), xv, yv, context);
    Space().fence();
    const Tensor y = to_host(yv);
    Tensor dy = y;
    double loss = 0;
    for (std::size_t n = 0; n < y.data.size(); ++n) {
      const double e = y.data[n] - target.data[n];
      loss += e * e / y.data.size();
      dy.data[n] = 2 * e / y.data.size() * 1024;  // scaled: the 16-bit gradients stay normal
    }
    const auto dyv = make_view<DeviceView3<T, Space>>(dy, "dy");
    adamw.zero_grad(Space());
    block.backward(Space(), dyv, dxv, context);
    adamw.step(Space());
    if (step == 0) first = loss;
    last = loss;
  }
  EXPECT_LT(last, 0.5 * first) << "loss " << first << " -> " << last;
}

TYPED_TEST(NnLowPrecision, BadInputThrowsAndWritesNothing) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  DeviceView2<T, Space> x("x", 5, 8), w("w", 3, 8), w_bad("w_bad", 3, 7), y("y", 5, 3);
  DeviceView1<T, Space> b_bad("b_bad", 4);
  const T three = from_double<T>(3);
  Kokkos::deep_copy(y, three);
  expect_invalid_argument([&] { kfa::nn::linear_forward(Space(), x, w_bad, b_bad, y); },
                          "kfa::nn::linear_forward: weight must be [out_features][in_features]");
  expect_invalid_argument([&] { kfa::nn::linear_forward(Space(), x, w, b_bad, y); },
                          "bias must be [out_features] = [3] or empty");
  DeviceView1<T, Space> p("p", 4), g("g", 4);
  DeviceView1<kfa::accumulator_t<T>, Space> m("m", 4), v("v", 5);
  expect_invalid_argument([&] { kfa::nn::adamw_step(Space(), p, g, m, v, 1); },
                          "kfa::nn::adamw_step: exp_avg_sq must be [n]");
  expect_invalid_argument([&] { kfa::nn::adamw_step(Space(), p, g, m, m, 1); },
                          "exp_avg must not overlap exp_avg_sq");
  using Parameter = kfa::nn::Parameter<T, typename Space::memory_space>;
  expect_invalid_argument(
      [&] {
        kfa::nn::AdamW<Space, T> bad(
            {Parameter{"orphan", typename Parameter::view_type(p.data(), 4), {}}});
      },
      "kfa::nn::AdamW: parameter 'orphan' has 4 values but no gradient");
  kfa::nn::TransformerBlockOptions options;
  options.attention.d_model = 8;
  options.attention.heads = 2;
  options.d_ff = 8;
  options.fp32_gradients = true;
  kfa::nn::TransformerBlock<Space, T> block(options);
  typename kfa::nn::TransformerBlock<Space, T>::context_type context;
  DeviceView3<T, Space> x3("x3", 1, 5, 8), y3("y3", 1, 5, 8), bad3("bad3", 1, 5, 6);
  Kokkos::deep_copy(y3, three);
  expect_invalid_argument([&] { block.forward(Space(), bad3, y3, context); },
                          "kfa::nn::TransformerBlock::forward: x must be [batch][seqlen][d_model] "
                          "with d_model = 8, got [1][5][6]");
  expect_invalid_argument([&] { block.backward(Space(), x3, y3, context); },
                          "call forward with this context first");
  for (const auto& view : {DeviceView2<T, Space>(y), DeviceView2<T, Space>(y3.data(), 5, 8)}) {
    const Tensor host = to_host(view);
    for (double value : host.data) ASSERT_EQ(value, 3.0) << "written";
  }
}

#if KFA_ENABLE_SAFETENSORS
/// A 16-bit layer saves its own dtype (BF16 or F16) and loads back bitwise;
/// the file loads exactly into a float layer, and a float file of the same
/// values loads back into the 16-bit layer exactly.
TYPED_TEST(NnLowPrecision, SafetensorsRoundTripInTheLayerDtype) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  const std::string dtype = std::is_same<T, kfa::bfloat16>::value ? "BF16" : "F16";
  const std::string path = "kfa_nn_low_" + dtype + "_" + Space::name() + ".safetensors";
  kfa::nn::TransformerBlockOptions options;
  options.attention.d_model = 16;
  options.attention.heads = 2;
  options.attention.qk_norm = true;
  options.d_ff = 12;
  kfa::nn::TransformerBlock<Space, T> block(options), loaded(options);
  std::mt19937_64 rng(test_seed("nn_low_safetensors"));
  randomize_parameters(block.parameters(), rng);
  kfa::nn::save_safetensors(Space(), path, block);
  const auto contents = kfa::nn::read_safetensors<double>(path);
  const auto params = block.parameters();
  ASSERT_EQ(contents.tensors.size(), params.size());
  for (const auto& p : params) {
    const auto& t = contents.tensors.at(p.name);
    EXPECT_EQ(t.dtype, dtype) << p.name;
    const Tensor values = to_host(p.value);
    for (std::size_t n = 0; n < values.data.size(); ++n)
      ASSERT_EQ(t.values(n), values.data[n]) << p.name << "[" << n << "]";
  }
  kfa::nn::load_safetensors(Space(), path, loaded);
  kfa::nn::TransformerBlock<Space, float> wide(options);
  kfa::nn::load_safetensors(Space(), path, wide);
  const std::string wide_path = "kfa_nn_low_F32_" + std::string(Space::name()) + ".safetensors";
  kfa::nn::save_safetensors(Space(), wide_path, wide);
  kfa::nn::TransformerBlock<Space, T> from_wide(options);
  kfa::nn::load_safetensors(Space(), wide_path, from_wide);
  const auto a = block.parameters(), b = loaded.parameters(), c = from_wide.parameters();
  const auto f = wide.parameters();
  for (std::size_t n = 0; n < a.size(); ++n) {
    const Tensor ta = to_host(a[n].value);
    EXPECT_EQ(max_abs_diff(ta, to_host(b[n].value)), 0.0) << a[n].name << " round trip";
    EXPECT_EQ(max_abs_diff(ta, to_host(f[n].value)), 0.0) << a[n].name << " into float";
    EXPECT_EQ(max_abs_diff(ta, to_host(c[n].value)), 0.0) << a[n].name << " from F32";
  }
  std::remove(path.c_str());
  std::remove(wide_path.c_str());
}
#endif

}  // namespace
