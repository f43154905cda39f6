// kfa::nn's stateless steps, forward and backward, against the fp64 host
// oracles of nn_test_helpers.hpp on awkward shapes; gradients accumulate;
// argument errors throw before anything is written.

#include "nn_test_helpers.hpp"

namespace {

using namespace kfa_test;

template <class C>
class NnFunctional : public ::testing::Test {};
TYPED_TEST_SUITE(NnFunctional, NnConfigs);

/// The bias gradient is a column sum over the tokens: more than 256 tokens
/// take its chunked path (several chunks and a partial one).
template <class C>
void check_linear(int tokens) {
  using Space = typename C::space;
  using T = typename C::value_type;
  const int in = 48, out = 29;
  const std::string tag = "nn_linear_" + std::to_string(tokens);
  std::mt19937_64 rng(test_seed(tag));
  const Tensor x = rounded<T>(random_tensor({tokens, in}, rng));
  const Tensor w = rounded<T>(random_tensor({out, in}, rng, 0.2));
  const Tensor b = rounded<T>(random_tensor({out}, rng));
  const Tensor dy = rounded<T>(random_tensor({tokens, out}, rng));
  const Tensor dw0 = rounded<T>(random_tensor({out, in}, rng));
  const Tensor db0 = rounded<T>(random_tensor({out}, rng));
  auto xv = make_view<DeviceView2<T, Space>>(x, "x");
  auto wv = make_view<DeviceView2<T, Space>>(w, "w");
  auto bv = make_view<DeviceView1<T, Space>>(b, "b");
  auto dyv = make_view<DeviceView2<T, Space>>(dy, "dy");
  auto dwv = make_view<DeviceView2<T, Space>>(dw0, "dw");
  auto dbv = make_view<DeviceView1<T, Space>>(db0, "db");
  DeviceView2<T, Space> yv("y", tokens, out), dxv("dx", tokens, in);
  poison(yv);
  poison(dxv);
  kfa::nn::linear_forward(Space(), xv, wv, bv, yv);
  kfa::nn::linear_backward(Space(), xv, wv, dyv, dxv, dwv, dbv);
  Space().fence();
  Tensor dx_ref, dw_ref = dw0, db_ref = db0;
  ref_linear_backward(x, w, dy, dx_ref, dw_ref, db_ref);
  const std::string what = tag + " " + type_name<T>() + " " + Space::name() + " seed " +
                           std::to_string(test_seed(tag));
  expect_close_rel<T>(what + " y", to_host(yv), ref_linear(x, w, b), 4 * in);
  expect_close_rel<T>(what + " dx", to_host(dxv), dx_ref, 4 * out);
  expect_close_rel<T>(what + " dweight (accumulated)", to_host(dwv), dw_ref, 4 * tokens);
  expect_close_rel<T>(what + " dbias (accumulated)", to_host(dbv), db_ref, 4 * tokens);

  // No bias: an empty View.
  DeviceView1<T, Space> none;
  poison(yv);
  kfa::nn::linear_forward(Space(), xv, wv, none, yv);
  Space().fence();
  expect_close_rel<T>(what + " y without bias", to_host(yv), ref_linear(x, w, Tensor()), 4 * in);
}

TYPED_TEST(NnFunctional, LinearForwardBackwardAccumulates) { check_linear<TypeParam>(37); }
TYPED_TEST(NnFunctional, LinearOverManyTokens) { check_linear<TypeParam>(600); }

template <class C>
void check_norm(bool rms, bool with_beta, int tokens = 37) {
  using Space = typename C::space;
  using T = typename C::value_type;
  using Acc = kfa::accumulator_t<T>;
  const int features = 48;
  const double eps = 1e-5;
  const std::string tag = std::string(rms ? "nn_rms_norm" : "nn_layer_norm") +
                          (with_beta ? "_beta" : "");
  std::mt19937_64 rng(test_seed(tag));
  Tensor x = random_tensor({tokens, features}, rng, 2.0);
  for (int r = 0; r < tokens; ++r)
    for (int j = 0; j < features; ++j) at2(x, r, j) += 3.0 * (r % 5);  // offsets: mean matters
  x = rounded<T>(x);
  const Tensor gamma = rounded<T>(random_tensor({features}, rng));
  const Tensor beta = with_beta ? rounded<T>(random_tensor({features}, rng)) : Tensor();
  const Tensor dy = rounded<T>(random_tensor({tokens, features}, rng));
  const Tensor dgamma0 = rounded<T>(random_tensor({features}, rng));
  const Tensor dbeta0 = with_beta ? rounded<T>(random_tensor({features}, rng)) : Tensor();
  auto xv = make_view<DeviceView2<T, Space>>(x, "x");
  auto gv = make_view<DeviceView1<T, Space>>(gamma, "gamma");
  auto bv = with_beta ? make_view<DeviceView1<T, Space>>(beta, "beta") : DeviceView1<T, Space>();
  auto dyv = make_view<DeviceView2<T, Space>>(dy, "dy");
  auto dgv = make_view<DeviceView1<T, Space>>(dgamma0, "dgamma");
  auto dbv = with_beta ? make_view<DeviceView1<T, Space>>(dbeta0, "dbeta") : DeviceView1<T, Space>();
  DeviceView2<T, Space> yv("y", tokens, features), dxv("dx", tokens, features);
  DeviceView1<Acc, Space> mean("mean", tokens), rstd("rstd", tokens);
  poison(yv);
  poison(dxv);
  poison(mean);
  poison(rstd);
  if (rms) {
    kfa::nn::rms_norm_forward(Space(), xv, gv, yv, rstd, {eps});
    kfa::nn::rms_norm_backward(Space(), xv, gv, rstd, dyv, dxv, dgv);
  } else {
    kfa::nn::layer_norm_forward(Space(), xv, gv, bv, yv, mean, rstd, {eps});
    kfa::nn::layer_norm_backward(Space(), xv, gv, mean, rstd, dyv, dxv, dgv, dbv);
  }
  Space().fence();
  Tensor dx_ref, dgamma_ref = dgamma0, dbeta_ref = dbeta0;
  ref_norm_backward(x, gamma, eps, rms, dy, dx_ref, dgamma_ref, dbeta_ref);
  const std::string what = tag + " " + type_name<T>() + " " + Space::name() + " seed " +
                           std::to_string(test_seed(tag));
  expect_close_rel<T>(what + " y", to_host(yv), ref_norm(x, gamma, beta, eps, rms), 8 * features);
  expect_close_rel<T>(what + " dx", to_host(dxv), dx_ref, 16 * features);
  expect_close_rel<T>(what + " dgamma", to_host(dgv), dgamma_ref, 8 * tokens);
  if (with_beta) expect_close_rel<T>(what + " dbeta", to_host(dbv), dbeta_ref, 8 * tokens);

  // Finite differences (fp64 only) of L = Σ dy·y for a few elements of x.
  if (std::is_same<T, double>::value) {
    const Tensor dx = to_host(dxv);
    for (int probe = 0; probe < 3; ++probe) {
      const int r = 5 * probe + 1, j = 7 * probe + 3;
      const double h = 1e-6;
      auto loss = [&](double delta) {
        Tensor xp = x;
        at2(xp, r, j) += delta;
        const Tensor y = ref_norm(xp, gamma, beta, eps, rms);
        double s = 0;
        for (std::size_t n = 0; n < y.data.size(); ++n) s += y.data[n] * dy.data[n];
        return s;
      };
      const double fd = (loss(h) - loss(-h)) / (2 * h);
      EXPECT_NEAR(at2(dx, r, j), fd, 1e-6 * std::max(1.0, std::abs(fd))) << what << " fd";
    }
  }
}

TYPED_TEST(NnFunctional, LayerNorm) { check_norm<TypeParam>(false, true); }
TYPED_TEST(NnFunctional, LayerNormWithoutBias) { check_norm<TypeParam>(false, false); }
TYPED_TEST(NnFunctional, RmsNorm) { check_norm<TypeParam>(true, false); }
// dgamma and dbeta over more than 256 tokens: the chunked column sums.
TYPED_TEST(NnFunctional, NormsOverManyTokens) {
  check_norm<TypeParam>(false, true, 600);
  check_norm<TypeParam>(true, false, 600);
}

TYPED_TEST(NnFunctional, RotaryBothConventionsAndInverse) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  const int B = 2, S = 37, H = 3, D = 16;
  for (auto style : {kfa::nn::RotaryStyle::half_split, kfa::nn::RotaryStyle::interleaved})
    for (int rotary_dim : {0, 10}) {
      kfa::nn::RotaryOptions opt;
      opt.style = style;
      opt.rotary_dim = rotary_dim;
      opt.position_offset = rotary_dim == 0 ? 0 : 1000;
      const std::string tag = "nn_rotary_" + std::to_string(int(style)) + "_" +
                              std::to_string(rotary_dim);
      std::mt19937_64 rng(test_seed(tag));
      const Tensor x = rounded<T>(random_tensor({B, S, H, D}, rng));
      const Tensor dy = rounded<T>(random_tensor({B, S, H, D}, rng));
      auto xv = make_view<DeviceView4<T, Space>>(x, "x");
      auto dyv = make_view<DeviceView4<T, Space>>(dy, "dy");
      DeviceView4<T, Space> yv("y", B, S, H, D), dxv("dx", B, S, H, D);
      poison(yv);
      poison(dxv);
      kfa::nn::rotary_forward(Space(), xv, yv, opt);
      kfa::nn::rotary_backward(Space(), dyv, dxv, opt);
      kfa::nn::rotary_forward(Space(), xv, xv, opt);  // in place
      Space().fence();
      const std::string what = tag + " " + type_name<T>() + " " + Space::name();
      // The angle p·θ is rounded to fp64 relative to its size: the bound
      // grows with the largest position.
      const double factor = 8 + 2 * double(opt.position_offset + S) *
                                    std::numeric_limits<double>::epsilon() / epsilon<T>();
      expect_close_rel<T>(what + " y", to_host(yv), ref_rotary(x, opt, 1), factor);
      expect_close_rel<T>(what + " y in place", to_host(xv), ref_rotary(x, opt, 1), factor);
      expect_close_rel<T>(what + " dx", to_host(dxv), ref_rotary(dy, opt, -1), factor);
      // The backward is the transpose: <R x, dy> = <x, Rᵀ dy>.
      const Tensor y = ref_rotary(x, opt, 1), dx = ref_rotary(dy, opt, -1);
      double a = 0, b = 0;
      for (std::size_t n = 0; n < x.data.size(); ++n) {
        a += y.data[n] * dy.data[n];
        b += x.data[n] * dx.data[n];
      }
      EXPECT_NEAR(a, b, 1e-9 * x.data.size()) << what;
    }
}

/// 29 features: one element per thread; 48: 16-byte packs per thread on GPUs.
TYPED_TEST(NnFunctional, GeluBothForms) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  const int tokens = 37;
  for (int features : {29, 48})
  for (auto form : {kfa::nn::GeluApproximation::none, kfa::nn::GeluApproximation::tanh}) {
    const bool tanh_form = form == kfa::nn::GeluApproximation::tanh;
    const std::string tag = std::string("nn_gelu_") + (tanh_form ? "tanh" : "erf") +
                            (features == 29 ? "" : "_packed");
    std::mt19937_64 rng(test_seed(tag));
    const Tensor x = rounded<T>(random_tensor({tokens, features}, rng, 3.0));
    const Tensor dy = rounded<T>(random_tensor({tokens, features}, rng));
    auto xv = make_view<DeviceView2<T, Space>>(x, "x");
    auto dyv = make_view<DeviceView2<T, Space>>(dy, "dy");
    DeviceView2<T, Space> yv("y", tokens, features), dxv("dx", tokens, features);
    poison(yv);
    poison(dxv);
    kfa::nn::gelu_forward(Space(), xv, yv, {form});
    kfa::nn::gelu_backward(Space(), xv, dyv, dxv, {form});
    Space().fence();
    const auto act = tanh_form ? kfa::nn::Activation::gelu_tanh : kfa::nn::Activation::gelu;
    const std::string what = tag + " " + type_name<T>() + " " + Space::name();
    expect_close_rel<T>(what + " y", to_host(yv), ref_activation(x, act), 16);
    expect_close_rel<T>(what + " dx", to_host(dxv), ref_activation_backward(x, dy, act), 16);
  }
}

TYPED_TEST(NnFunctional, Swiglu) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  const int tokens = 37, hidden = 29;
  const std::string tag = "nn_swiglu";
  std::mt19937_64 rng(test_seed(tag));
  const Tensor x = rounded<T>(random_tensor({tokens, 2 * hidden}, rng, 3.0));
  const Tensor dy = rounded<T>(random_tensor({tokens, hidden}, rng));
  auto xv = make_view<DeviceView2<T, Space>>(x, "x");
  auto dyv = make_view<DeviceView2<T, Space>>(dy, "dy");
  DeviceView2<T, Space> yv("y", tokens, hidden), dxv("dx", tokens, 2 * hidden);
  poison(yv);
  poison(dxv);
  kfa::nn::swiglu_forward(Space(), xv, yv);
  kfa::nn::swiglu_backward(Space(), xv, dyv, dxv);
  Space().fence();
  const auto act = kfa::nn::Activation::swiglu;
  const std::string what = tag + " " + type_name<T>() + " " + Space::name();
  expect_close_rel<T>(what + " y", to_host(yv), ref_activation(x, act), 16);
  expect_close_rel<T>(what + " dx", to_host(dxv), ref_activation_backward(x, dy, act), 16);
}

TYPED_TEST(NnFunctional, DropoutAndResidual) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  const int tokens = 64, features = 96;
  const double p = 0.25;
  const std::string tag = "nn_dropout";
  std::mt19937_64 rng(test_seed(tag));
  Tensor x = rounded<T>(random_tensor({tokens, features}, rng));
  for (double& v : x.data)
    if (v == 0) v = 1;  // a kept element is never 0
  const Tensor res = rounded<T>(random_tensor({tokens, features}, rng));
  auto xv = make_view<DeviceView2<T, Space>>(x, "x");
  auto rv = make_view<DeviceView2<T, Space>>(res, "residual");
  DeviceView2<T, Space> yv("y", tokens, features), dxv("dx", tokens, features),
      sv("sum", tokens, features), y2v("y2", tokens, features);
  const kfa::nn::DropoutOptions opt{p, 1234};
  kfa::nn::dropout_forward(Space(), xv, yv, opt);
  kfa::nn::dropout_forward(Space(), xv, y2v, {p, 1235});
  kfa::nn::dropout_backward(Space(), xv, dxv, opt);
  kfa::nn::residual_dropout_forward(Space(), rv, xv, sv, opt);
  Space().fence();
  const Tensor y = to_host(yv), dx = to_host(dxv), sum = to_host(sv), y2 = to_host(y2v);
  std::size_t kept = 0, same_as_other_seed = 0;
  const double scale = 1 / (1 - p);
  for (std::size_t n = 0; n < x.data.size(); ++n) {
    const bool k = y.data[n] != 0;
    kept += k;
    same_as_other_seed += k == (y2.data[n] != 0);
    ASSERT_NEAR(y.data[n], k ? x.data[n] * scale : 0.0, 4 * epsilon<T>() * std::abs(x.data[n]));
    // The backward draws the same mask; the residual form adds it.
    ASSERT_EQ(dx.data[n], y.data[n]);
    ASSERT_NEAR(sum.data[n], res.data[n] + y.data[n], 4 * epsilon<T>() * (1 + std::abs(y.data[n])));
  }
  const double n = double(x.data.size()), frac = kept / n;
  EXPECT_NEAR(frac, 1 - p, 4 * std::sqrt(p * (1 - p) / n)) << "kept fraction";
  EXPECT_LT(same_as_other_seed, x.data.size()) << "another seed draws another mask";
}

TYPED_TEST(NnFunctional, AdamWMatchesClosedForm) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  const int n = 101;
  const std::string tag = "nn_adamw";
  std::mt19937_64 rng(test_seed(tag));
  const Tensor p0 = rounded<T>(random_tensor({n}, rng));
  std::vector<Tensor> grads;
  for (int s = 0; s < 3; ++s) grads.push_back(rounded<T>(random_tensor({n}, rng)));
  kfa::nn::AdamWOptions opt;
  opt.lr = 0.05;
  opt.weight_decay = 0.1;
  auto pv = make_view<DeviceView1<T, Space>>(p0, "p");
  DeviceView1<T, Space> gv("g", n), mv("m", n), vv("v", n);
  // Closed form: m_t, v_t are the exponential averages; p follows PyTorch's
  // AdamW recurrence in long double.
  std::vector<LD> p(p0.data.begin(), p0.data.end()), m(n, 0), v(n, 0);
  for (int s = 1; s <= 3; ++s) {
    Kokkos::deep_copy(gv, make_view<DeviceView1<T, Space>>(grads[s - 1], "g"));
    kfa::nn::adamw_step(Space(), pv, gv, mv, vv, s, opt);
    for (int i = 0; i < n; ++i) {
      const LD g = grads[s - 1].data[i];
      p[i] *= 1 - LD(opt.lr) * opt.weight_decay;
      m[i] = opt.beta1 * m[i] + (1 - LD(opt.beta1)) * g;
      v[i] = opt.beta2 * v[i] + (1 - LD(opt.beta2)) * g * g;
      const LD mhat = m[i] / (1 - std::pow(LD(opt.beta1), s));
      const LD vhat = v[i] / (1 - std::pow(LD(opt.beta2), s));
      p[i] -= opt.lr * mhat / (std::sqrt(vhat) + opt.eps);
    }
  }
  Space().fence();
  Tensor ref({n});
  for (int i = 0; i < n; ++i) ref.data[i] = double(p[i]);
  expect_close_rel<T>(tag + " " + type_name<T>() + " " + Space::name(), to_host(pv), ref, 64);
  // After one step from zero moments each parameter moves by about lr.
  const Tensor moved = to_host(pv);
  EXPECT_GT(max_abs_diff(moved, p0), 0.05);
}

TYPED_TEST(NnFunctional, BadArgumentsThrowAndWriteNothing) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  using Acc = kfa::accumulator_t<T>;
  DeviceView2<T, Space> x("x", 5, 8), w("w", 6, 7), y("y", 5, 6), dx("dx", 5, 8);
  DeviceView1<T, Space> b("b", 6), gamma("gamma", 9), dgamma("dgamma", 8);
  DeviceView1<Acc, Space> mean("mean", 5), rstd("rstd", 5);
  Kokkos::deep_copy(y, T(7));
  expect_invalid_argument([&] { kfa::nn::linear_forward(Space(), x, w, b, y); },
                 "kfa::nn::linear_forward: weight must be [out_features][in_features] = [6][8], "
                 "got [6][7]");
  expect_invalid_argument([&] { kfa::nn::layer_norm_forward(Space(), x, gamma, b, x, mean, rstd); },
                 "gamma must be [features] = [8], got [9]");
  expect_invalid_argument([&] { kfa::nn::linear_forward(Space(), x, DeviceView2<T, Space>("w", 6, 8),
                                               b, DeviceView2<T, Space>(x.data(), 5, 6)); },
                 "y must not overlap x");
  expect_invalid_argument([&] { kfa::nn::dropout_forward(Space(), x, x, {1.0, 0}); },
                 "options.p must be in [0, 1)");
  expect_invalid_argument([&] { kfa::nn::swiglu_forward(Space(), DeviceView2<T, Space>("u", 5, 7), y); },
                 "even number of features");
  expect_invalid_argument([&] {
    kfa::nn::rotary_forward(Space(), DeviceView4<T, Space>("q", 1, 2, 1, 6),
                            DeviceView4<T, Space>("r", 1, 2, 1, 6), {kfa::nn::RotaryStyle::half_split, 10000, 3});
  }, "rotary_dim must be even");
  expect_invalid_argument([&] {
    kfa::nn::adamw_step(Space(), b, DeviceView1<T, Space>("g", 5), b, b, 1);
  }, "grad must be [n] = [6], got [5]");
  expect_invalid_argument([&] {
    kfa::nn::MultiHeadAttentionOptions o;
    o.d_model = 48;
    o.heads = 3;
    o.kv_heads = 2;
    kfa::nn::MultiHeadAttention<Space, T> mha(o);
  }, "must be a multiple of options.kv_heads");
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), y);
  for (std::size_t n = 0; n < host.size(); ++n) ASSERT_EQ(host.data()[n], T(7)) << "y written";
}

}  // namespace
