// Score modifiers (FlexAttention's score_mod / mask_mod for Kokkos): a
// document mask with its block predicate, a relative position bias, a
// non-additive modifier with its derivative hook, alone and combined with the
// built-in variants; fully masked tiles are skipped (the modifier is not even
// called there). ALiBi, kfa's own modifier, is in tstAlibi.cpp.

#include "kfa_test_helpers.hpp"

#include <kfa/nn/score_mods.hpp>

namespace kfa_test {

/// One modifier type for every test (each type compiles its own kernels):
/// the features are switched by `modes`.
template <class MemorySpace>
struct TestScoreMod {
  enum : int {
    kDocument = 1,      // mask unless doc_q(b, i) == doc_k(b, j); block predicate from the ids
    kRelativeBias = 2,  // + rel(h, clamp(j - i, -radius, radius) + radius)
    kNonlinear = 4,     // temp(h)·s - 0.05·s², with score_grad
    kRecordTiles = 8,   // visible() marks tiles(row_begin, key_begin)
    kCountCalls = 16,   // operator() counts its calls in calls(0)
    kHideAll = 32,      // visible() is false everywhere
    kUnchanged = 64     // unchanged() is true on tiles inside one document (kDocument alone)
  };
  int modes = 0;
  Kokkos::View<const int**, MemorySpace> doc_q, doc_k;
  Kokkos::View<const float**, MemorySpace> rel;
  int radius = 0;
  Kokkos::View<const float*, MemorySpace> temp;
  Kokkos::View<int**, MemorySpace> tiles;
  Kokkos::View<int*, MemorySpace> calls;

  template <class Acc>
  KOKKOS_INLINE_FUNCTION Acc operator()(int b, int h, int i, int j, Acc s) const {
    if (modes & kCountCalls) Kokkos::atomic_add(&calls(0), 1);
    if ((modes & kDocument) && doc_q(b, i) != doc_k(b, j)) return kfa::masked_score<Acc>();
    if (modes & kNonlinear) s = static_cast<Acc>(temp(h)) * s - Acc(0.05) * s * s;
    if (modes & kRelativeBias) {
      const int r = j - i < -radius ? -radius : (j - i > radius ? radius : j - i);
      s += static_cast<Acc>(rel(h, r + radius));
    }
    return s;
  }

  template <class Acc>
  KOKKOS_INLINE_FUNCTION Acc score_grad(int, int h, int, int, Acc s) const {
    return (modes & kNonlinear) ? static_cast<Acc>(temp(h)) - Acc(0.1) * s : Acc(1);
  }

  KOKKOS_INLINE_FUNCTION bool visible(int b, int, int row_begin, int row_end, int key_begin,
                                      int key_end) const {
    if (modes & kRecordTiles) tiles(row_begin, key_begin) = 1;
    if (modes & kHideAll) return false;
    if (modes & kDocument) {
      // Document ids are non-decreasing: disjoint id ranges share no document.
      return doc_q(b, row_begin) <= doc_k(b, key_end - 1) &&
             doc_k(b, key_begin) <= doc_q(b, row_end - 1);
    }
    return true;
  }

  KOKKOS_INLINE_FUNCTION bool unchanged(int b, int, int row_begin, int row_end, int key_begin,
                                        int key_end) const {
    if (!(modes & kUnchanged) || (modes & (kRelativeBias | kNonlinear))) return false;
    if (!(modes & kDocument)) return true;
    return doc_q(b, row_begin) == doc_q(b, row_end - 1) &&
           doc_k(b, key_begin) == doc_k(b, key_end - 1) && doc_q(b, row_begin) == doc_k(b, key_begin);
  }
};

namespace {

template <class C>
class ScoreMod : public ::testing::Test {};
TYPED_TEST_SUITE(ScoreMod, AllConfigs);

template <class Space>
using Mod = TestScoreMod<typename Space::memory_space>;

/// Documents of random lengths (1..max_len) covering `n` positions, or of
/// the given `lengths` in turn.
inline std::vector<int> random_documents(int n, int max_len, std::mt19937_64& rng,
                                         const std::vector<int>& lengths = {}) {
  std::vector<int> ids(n);
  int doc = 0, left = 0;
  for (int i = 0; i < n; ++i) {
    if (left == 0) {
      left = lengths.empty() ? 1 + static_cast<int>(rng() % max_len)
                             : lengths[std::size_t(doc) % lengths.size()];
      ++doc;
    }
    ids[i] = doc;
    --left;
  }
  return ids;
}

/// A TestScoreMod on the device plus the oracle's view of it.
template <class Space>
struct ModSetup {
  Mod<Space> mod;
  RefExtras extras;
  std::vector<std::vector<int>> doc_q, doc_k;
  std::vector<float> rel, temp;
  Kokkos::View<int**, typename Space::memory_space> tiles;
  Kokkos::View<int*, typename Space::memory_space> calls;

  ModSetup(int modes, const Shape& s, std::uint64_t seed, int max_document = 40,
           const std::vector<int>& lengths = {}) {
    std::mt19937_64 rng(seed);
    using mem = typename Space::memory_space;
    mod.modes = modes;
    // Both sequences cut into the same documents, scaled to their lengths.
    Kokkos::View<int**, mem> dq("doc_q", s.batch, s.seqlen_q), dk("doc_k", s.batch, s.seqlen_k);
    auto hq = Kokkos::create_mirror_view(dq);
    auto hk = Kokkos::create_mirror_view(dk);
    for (int b = 0; b < s.batch; ++b) {
      doc_q.push_back(random_documents(s.seqlen_q, max_document, rng, lengths));
      doc_k.push_back(std::vector<int>(s.seqlen_k));
      const int docs = doc_q[b].empty() ? 1 : doc_q[b].back();
      for (int j = 0; j < s.seqlen_k; ++j)
        doc_k[b][j] = 1 + static_cast<int>(std::int64_t(j) * docs / std::max(1, s.seqlen_k));
      for (int i = 0; i < s.seqlen_q; ++i) hq(b, i) = doc_q[b][i];
      for (int j = 0; j < s.seqlen_k; ++j) hk(b, j) = doc_k[b][j];
    }
    Kokkos::deep_copy(dq, hq);
    Kokkos::deep_copy(dk, hk);
    mod.doc_q = dq;
    mod.doc_k = dk;
    mod.radius = 16;
    Kokkos::View<float**, mem> r("rel", s.heads, 2 * mod.radius + 1);
    Kokkos::View<float*, mem> t("temp", s.heads);
    auto hr = Kokkos::create_mirror_view(r);
    auto ht = Kokkos::create_mirror_view(t);
    std::uniform_real_distribution<float> bias(-1.5f, 1.5f), temperature(0.5f, 2.0f);
    for (int h = 0; h < s.heads; ++h) {
      for (int x = 0; x <= 2 * mod.radius; ++x) rel.push_back(hr(h, x) = bias(rng));
      temp.push_back(ht(h) = temperature(rng));
    }
    Kokkos::deep_copy(r, hr);
    Kokkos::deep_copy(t, ht);
    mod.rel = r;
    mod.temp = t;
    tiles = decltype(tiles)("tiles", std::max(1, s.seqlen_q), std::max(1, s.seqlen_k));
    calls = decltype(calls)("calls", 1);
    mod.tiles = tiles;
    mod.calls = calls;

    const int radius = mod.radius, heads_rel = 2 * radius + 1;
    extras.mod = [this, modes, radius, heads_rel](int b, int h, int i, int j, double x, int,
                                                  int) {
      if ((modes & Mod<Space>::kDocument) && doc_q[b][i] != doc_k[b][j]) return -double(INFINITY);
      if (modes & Mod<Space>::kNonlinear) x = double(temp[h]) * x - 0.05 * x * x;
      if (modes & Mod<Space>::kRelativeBias)
        x += rel[std::size_t(h) * heads_rel + std::clamp(j - i, -radius, radius) + radius];
      return x;
    };
    extras.mod_grad = [this, modes](int, int h, int, int, double x) {
      return (modes & Mod<Space>::kNonlinear) ? double(temp[h]) - 0.1 * x : 1.0;
    };
  }
};

TYPED_TEST(ScoreMod, DocumentMask) {
  using Space = typename TypeParam::space;
  if (is_duplicate_config<TypeParam>()) GTEST_SKIP() << "half is float here";
  for (const Shape& s : {Shape{2, 203, 203, 2, 64}, Shape{1, 113, 97, 3, 59, 1}}) {
    ModSetup<Space> setup(Mod<Space>::kDocument, s, test_seed("doc" + to_string(s)));
    check_variant<TypeParam>(s, {}, "document", setup.mod, setup.extras);
  }
}

TYPED_TEST(ScoreMod, RelativePositionBias) {
  using Space = typename TypeParam::space;
  if (is_duplicate_config<TypeParam>()) GTEST_SKIP() << "half is float here";
  const Shape s{2, 97, 113, 2, 80};
  ModSetup<Space> setup(Mod<Space>::kRelativeBias, s, test_seed("rel"));
  kfa::AttentionOptions opt;
  opt.causal = true;
  check_variant<TypeParam>(s, opt, "relative-bias", setup.mod, setup.extras);
}

// A modifier that is not additive needs its derivative (score_grad).
TYPED_TEST(ScoreMod, NonlinearWithDerivativeHook) {
  using Space = typename TypeParam::space;
  if (is_duplicate_config<TypeParam>()) GTEST_SKIP() << "half is float here";
  const Shape s{1, 113, 203, 2, 32};
  ModSetup<Space> setup(Mod<Space>::kNonlinear | Mod<Space>::kRelativeBias, s,
                        test_seed("nonlinear"));
  kfa::AttentionOptions opt;
  opt.deterministic = true;
  check_variant<TypeParam>(s, opt, "nonlinear", setup.mod, setup.extras);
}

// Modifier, softcap (applied first), dropout, window and grouped-query heads.
TYPED_TEST(ScoreMod, CombinedWithBuiltInVariants) {
  using Space = typename TypeParam::space;
  if (is_duplicate_config<TypeParam>()) GTEST_SKIP() << "half is float here";
  const Shape s{2, 130, 150, 4, 48, 2};
  ModSetup<Space> setup(Mod<Space>::kDocument | Mod<Space>::kRelativeBias, s,
                        test_seed("mod-combined"));
  kfa::AttentionOptions opt;
  opt.causal = true;
  opt.window_left = 70;
  opt.softcap = 4;
  opt.dropout_p = 0.15;
  opt.dropout_seed = 11;
  check_variant<TypeParam>(s, opt, "mod-combined", setup.mod, setup.extras);
}

// Documents long enough for whole tiles inside one: the tiles the modifier
// promises to leave unchanged run without it, alone and beside softcap (which
// still applies there), dropout, a window and grouped-query heads.
TYPED_TEST(ScoreMod, UnchangedTiles) {
  using Space = typename TypeParam::space;
  if (is_duplicate_config<TypeParam>()) GTEST_SKIP() << "half is float here";
  const Shape s{2, 300, 300, 2, 64};
  ModSetup<Space> setup(Mod<Space>::kDocument | Mod<Space>::kUnchanged, s,
                        test_seed("unchanged"), 200);
  kfa::AttentionOptions opt;
  opt.causal = true;
  check_variant<TypeParam>(s, opt, "unchanged", setup.mod, setup.extras);
  const Shape g{1, 290, 257, 4, 48, 2};
  ModSetup<Space> combined(Mod<Space>::kDocument | Mod<Space>::kUnchanged, g,
                           test_seed("unchanged-combined"), 150);
  opt.window_left = 170;
  opt.softcap = 4;
  opt.dropout_p = 0.15;
  opt.dropout_seed = 11;
  check_variant<TypeParam>(g, opt, "unchanged-combined", combined.mod, combined.extras);
}

// The block predicate skips fully masked tiles: the modifier is called once
// per element of the tiles it lets through and never for the others, and a
// predicate that hides everything gives empty rows (O = 0, lse = -inf) and
// zero gradients without calling the modifier at all.
TYPED_TEST(ScoreMod, BlockPredicateSkipsTiles) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  using Acc = kfa::accumulator_t<T>;
  if (is_duplicate_config<TypeParam>()) GTEST_SKIP() << "half is float here";
  const Shape s{1, 256, 256, 1, 64};
  kfa::AttentionOptions opt;
  opt.team_size = test_team_size<Space>();
  // The tiles of the kernel that runs: the host kernels' where a host space
  // gets no team size, else the portable kernels' (KernelTraits) on GPUs;
  // the fused kernels test the predicate on their own tiles (ScoreModCuda).
  opt.kernel_policy.opt_in_shared_memory = false;
  using traits = kfa::Impl::KernelTraits<Space, T, kfa::Impl::head_dim_bucket(64)>;
  using host_traits = kfa::Impl::Host::ForwardTileTraits<Acc>;
  const bool host_kernels = kfa::Impl::host_kernel(opt) == kfa::Impl::KernelFamily::host_tiled &&
                            kfa::Impl::is_host_tiled_space<Space>();
  const int bm = host_kernels ? host_traits::kBlockM : traits::kBlockM;
  const int bn = host_kernels ? host_traits::kBlockN : traits::kBlockN;
  ModSetup<Space> setup(Mod<Space>::kDocument | Mod<Space>::kCountCalls |
                            Mod<Space>::kRecordTiles,
                        s, test_seed("skip"));
  const Case c = make_case<T>(s, {}, "skip", setup.extras);
  auto q = to_device<T, Space>(c.q, "q");
  auto k = to_device<T, Space>(c.k, "k");
  auto v = to_device<T, Space>(c.v, "v");
  DeviceView4<T, Space> o("o", s.batch, s.seqlen_q, s.heads, s.head_dim);
  DeviceView3<Acc, Space> lse("lse", s.batch, s.heads, s.seqlen_q);
  kfa::flash_attention_forward(Space(), q, k, v, o, lse, opt, setup.mod);
  auto calls = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), setup.calls);
  auto tiles = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), setup.tiles);
  long expected_calls = 0, tiles_total = 0, tiles_kept = 0;
  for (int r0 = 0; r0 < s.seqlen_q; r0 += bm)
    for (int k0 = 0; k0 < s.seqlen_k; k0 += bn) {
      const int r1 = std::min(s.seqlen_q, r0 + bm), k1 = std::min(s.seqlen_k, k0 + bn);
      ++tiles_total;
      EXPECT_EQ(tiles(r0, k0), 1) << "tile " << r0 << "," << k0 << " not asked";
      if (setup.doc_q[0][r0] <= setup.doc_k[0][k1 - 1] &&
          setup.doc_k[0][k0] <= setup.doc_q[0][r1 - 1]) {
        ++tiles_kept;
        expected_calls += long(r1 - r0) * (k1 - k0);
      }
    }
  EXPECT_EQ(calls(0), expected_calls) << tiles_kept << " of " << tiles_total << " tiles kept";
  EXPECT_LT(tiles_kept, tiles_total);
  EXPECT_LE(max_abs_diff(to_host(o), c.o_ref), 64 * epsilon<T>() * std::max(1.0, max_abs(c.o_ref)));

  // With unchanged(): no call on a tile inside one document either (longer
  // documents, so that there are such tiles).
  {
    ModSetup<Space> whole(Mod<Space>::kDocument | Mod<Space>::kCountCalls |
                              Mod<Space>::kUnchanged,
                          s, test_seed("skip-unchanged"), 0, {150, 40, 66});
    const Case cw = make_case<T>(s, {}, "skip-unchanged", whole.extras);
    auto qw = to_device<T, Space>(cw.q, "q");
    auto kw = to_device<T, Space>(cw.k, "k");
    auto vw = to_device<T, Space>(cw.v, "v");
    kfa::flash_attention_forward(Space(), qw, kw, vw, o, lse, opt, whole.mod);
    auto whole_calls = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), whole.calls);
    long expected = 0, unchanged_tiles = 0;
    for (int r0 = 0; r0 < s.seqlen_q; r0 += bm)
      for (int k0 = 0; k0 < s.seqlen_k; k0 += bn) {
        const int r1 = std::min(s.seqlen_q, r0 + bm), k1 = std::min(s.seqlen_k, k0 + bn);
        const auto& dq = whole.doc_q[0];
        const auto& dk = whole.doc_k[0];
        if (!(dq[r0] <= dk[k1 - 1] && dk[k0] <= dq[r1 - 1])) continue;
        if (dq[r0] == dq[r1 - 1] && dk[k0] == dk[k1 - 1] && dq[r0] == dk[k0]) {
          ++unchanged_tiles;
          continue;
        }
        expected += long(r1 - r0) * (k1 - k0);
      }
    EXPECT_GT(unchanged_tiles, 0);
    EXPECT_EQ(whole_calls(0), expected) << unchanged_tiles << " tiles unchanged";
    EXPECT_LE(max_abs_diff(to_host(o), cw.o_ref),
              64 * epsilon<T>() * std::max(1.0, max_abs(cw.o_ref)));
  }

  setup.mod.modes = Mod<Space>::kHideAll | Mod<Space>::kCountCalls;
  Kokkos::deep_copy(setup.calls, 0);
  poison(o);
  poison(lse);
  kfa::flash_attention_forward(Space(), q, k, v, o, lse, opt, setup.mod);
  for (double x : to_host(o).data) ASSERT_EQ(x, 0.0);
  for (double x : to_host(lse).data) ASSERT_TRUE(std::isinf(x) && x < 0);
  auto d_o = to_device<T, Space>(c.d_o, "d_o");
  DeviceView4<T, Space> dq("dq", s.batch, s.seqlen_q, s.heads, s.head_dim),
      dk("dk", s.batch, s.seqlen_k, s.heads, s.head_dim),
      dv("dv", s.batch, s.seqlen_k, s.heads, s.head_dim);
  for (const bool deterministic : {false, true}) {
    opt.deterministic = deterministic;
    poison(dq);
    poison(dk);
    poison(dv);
    kfa::flash_attention_backward(Space(), q, k, v, o, lse, d_o, dq, dk, dv, opt, setup.mod);
    for (const auto& g : {to_host(dq), to_host(dk), to_host(dv)})
      for (double x : g.data) ASSERT_EQ(x, 0.0);
  }
  Kokkos::deep_copy(calls, setup.calls);
  EXPECT_EQ(calls(0), 0);
}

// The gradient of an additive bias (add_grad; kfa::nn::pairwise_bias with a
// grad View): dL/d(score + bias) of every element, summed over the batch
// entries and heads that share a bias entry, against the fp64 oracle's, by
// the flash backward (both kernels of the deterministic one, which must not
// count an element twice) and by the materialised standard backward; with
// softcap (whose derivative the bias's gradient must not carry), dropout,
// a window and grouped-query heads; fixed-length and packed batches.
template <class C>
void check_bias_gradient(const Shape& s, kfa::AttentionOptions opt, bool shared,
                         const std::string& tag) {
  using Space = typename C::space;
  using T = typename C::value_type;
  using Acc = kfa::accumulator_t<T>;
  using mem = typename Space::memory_space;
  opt.team_size = test_team_size<Space>();
  const int bb = shared ? 1 : s.batch, bh = shared ? 1 : s.heads;
  // LayoutRight: the checks read the Views flat in that order (CUDA's
  // default layout is LayoutLeft).
  Kokkos::View<float****, Kokkos::LayoutRight, mem> bias("bias", bb, bh, s.seqlen_q, s.seqlen_k);
  Kokkos::View<double****, Kokkos::LayoutRight, mem> grad("grad", bb, bh, s.seqlen_q, s.seqlen_k);
  auto host_bias = Kokkos::create_mirror_view(bias);
  std::mt19937_64 rng(test_seed("bias-grad" + tag + to_string(s)));
  std::uniform_real_distribution<float> dist(-2.f, 2.f);
  for (std::size_t n = 0; n < host_bias.span(); ++n) host_bias.data()[n] = dist(rng);
  Kokkos::deep_copy(bias, host_bias);
  RefExtras extras;
  extras.mod = [&](int b, int h, int i, int j, double x, int, int) {
    return x + double(host_bias(shared ? 0 : b, shared ? 0 : h, i, j));
  };
  Tensor keep, dscore;
  if (opt.dropout_p > 0) {
    keep = dropout_keep_mask<Space>(s.batch, s.heads, s.seqlen_q, s.seqlen_k, opt);
    extras.keep = &keep;
  }
  const Case c = make_case<T>(s, opt, tag, extras);
  extras.dscore = &dscore;
  Tensor dq_ref, dk_ref, dv_ref;
  reference_backward<double, true>(c.q, c.k, c.v, c.o_ref, c.lse_ref, c.d_o, opt, dq_ref, dk_ref,
                                   dv_ref, extras);
  Tensor expected({bb, bh, s.seqlen_q, s.seqlen_k});
  for (int b = 0; b < s.batch; ++b)
    for (int h = 0; h < s.heads; ++h)
      for (int i = 0; i < s.seqlen_q; ++i)
        for (int j = 0; j < s.seqlen_k; ++j)
          expected.at(shared ? 0 : b, shared ? 0 : h, i, j) += dscore.at(b, h, i, j);
  const double size = std::max(1e-3, max_abs(expected));
  // fp64 and fp32 inputs: the oracle's own arithmetic; 16-bit: D comes from
  // the rounded O, P from 16-bit q and k.
  const double tol = std::is_same<T, double>::value ? 1e-10
                     : std::is_same<T, float>::value ? 2e-4
                                                     : 3e-2;
  const auto mod = kfa::nn::pairwise_bias(bias, grad);
  auto q = to_device<T, Space>(c.q, "q");
  auto k = to_device<T, Space>(c.k, "k");
  auto v = to_device<T, Space>(c.v, "v");
  auto d_o = to_device<T, Space>(c.d_o, "d_o");
  const int hk = kv_heads(s);
  DeviceView4<T, Space> o("o", s.batch, s.seqlen_q, s.heads, s.head_dim);
  DeviceView3<Acc, Space> lse("lse", s.batch, s.heads, s.seqlen_q);
  DeviceView4<T, Space> dq("dq", s.batch, s.seqlen_q, s.heads, s.head_dim),
      dk("dk", s.batch, s.seqlen_k, hk, s.head_dim), dv("dv", s.batch, s.seqlen_k, hk, s.head_dim);
  const std::string what = tag + " " + type_name<T>() + " " + Space::name() + " " + to_string(s) +
                           to_string(opt) + (shared ? " shared bias" : "");
  kfa::flash_attention_forward(Space(), q, k, v, o, lse, opt, mod);
  for (const bool deterministic : {false, true}) {
    kfa::AttentionOptions bwd = opt;
    bwd.deterministic = deterministic;
    Kokkos::deep_copy(grad, 1.0);  // gradients accumulate: start from 1
    kfa::flash_attention_backward(Space(), q, k, v, o, lse, d_o, dq, dk, dv, bwd, mod);
    Tensor got = to_host(grad);
    for (double& x : got.data) x -= 1.0;
    EXPECT_LE(max_abs_diff(got, expected), tol * size)
        << what << (deterministic ? " deterministic" : "") << " flash dbias";
  }
  Kokkos::deep_copy(grad, 0.0);
  kfa::standard_attention_forward(Space(), q, k, v, o, lse, opt, mod);
  kfa::standard_attention_backward(Space(), q, k, v, o, lse, d_o, dq, dk, dv, opt, mod);
  EXPECT_LE(max_abs_diff(to_host(grad), expected), tol * size) << what << " standard dbias";
}

TYPED_TEST(ScoreMod, GradientOfAnAdditiveBias) {
  if (is_duplicate_config<TypeParam>()) GTEST_SKIP() << "half is float here";
  kfa::AttentionOptions causal, all;
  causal.causal = true;
  all.window_left = 40;
  all.window_right = 9;
  all.softcap = 3;
  all.dropout_p = 0.2;
  all.dropout_seed = 21;
  for (const bool shared : {false, true}) {
    check_bias_gradient<TypeParam>({2, 97, 113, 4, 48, 2}, causal, shared, "bias-grad");
    check_bias_gradient<TypeParam>({1, 130, 70, 2, 64}, all, shared, "bias-grad-all");
  }
}

// The same through a packed batch: b is the sequence, i and j count from
// its starts.
TYPED_TEST(ScoreMod, GradientOfAnAdditiveBiasPacked) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  using Acc = kfa::accumulator_t<T>;
  using mem = typename Space::memory_space;
  if (is_duplicate_config<TypeParam>()) GTEST_SKIP() << "half is float here";
  const std::vector<int> lq = {40, 0, 77, 13}, lk = {55, 20, 60, 13};
  const int seqs = int(lq.size()), heads = 2, d = 32, max_q = 77, max_k = 60;
  int total_q = 0, total_k = 0;
  for (int b = 0; b < seqs; ++b) total_q += lq[b], total_k += lk[b];
  // Fixed-length twins of each sequence give the oracle.
  Kokkos::View<float****, Kokkos::LayoutRight, mem> bias("bias", seqs, heads, max_q, max_k);
  Kokkos::View<double****, Kokkos::LayoutRight, mem> grad("grad", seqs, heads, max_q, max_k);
  auto host_bias = Kokkos::create_mirror_view(bias);
  std::mt19937_64 rng(test_seed("bias-grad-packed"));
  std::uniform_real_distribution<float> dist(-2.f, 2.f);
  for (std::size_t n = 0; n < host_bias.span(); ++n) host_bias.data()[n] = dist(rng);
  Kokkos::deep_copy(bias, host_bias);
  kfa::AttentionOptions opt;
  opt.causal = true;
  opt.team_size = test_team_size<Space>();
  Tensor qp({1, total_q, heads, d}), kp({1, total_k, heads, d}), vp({1, total_k, heads, d}),
      dop({1, total_q, heads, d});
  Tensor expected({seqs, heads, max_q, max_k});
  std::vector<int> cu_q{0}, cu_k{0};
  for (int b = 0; b < seqs; ++b) {
    const Shape s{1, lq[b], lk[b], heads, d};
    RefExtras extras;
    extras.mod = [&, b](int, int h, int i, int j, double x, int, int) {
      return x + double(host_bias(b, h, i, j));
    };
    const Case c = make_case<T>(s, opt, "bias-grad-packed" + std::to_string(b), extras);
    Tensor dscore, dq_ref, dk_ref, dv_ref;
    extras.dscore = &dscore;
    reference_backward<double, true>(c.q, c.k, c.v, c.o_ref, c.lse_ref, c.d_o, opt, dq_ref,
                                     dk_ref, dv_ref, extras);
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < lq[b]; ++i)
        for (int j = 0; j < lk[b]; ++j) expected.at(b, h, i, j) = dscore.at(0, h, i, j);
    for (int h = 0; h < heads; ++h)
      for (int x = 0; x < d; ++x) {
        for (int i = 0; i < lq[b]; ++i) {
          qp.at(0, cu_q.back() + i, h, x) = c.q.at(0, i, h, x);
          dop.at(0, cu_q.back() + i, h, x) = c.d_o.at(0, i, h, x);
        }
        for (int j = 0; j < lk[b]; ++j) {
          kp.at(0, cu_k.back() + j, h, x) = c.k.at(0, j, h, x);
          vp.at(0, cu_k.back() + j, h, x) = c.v.at(0, j, h, x);
        }
      }
    cu_q.push_back(cu_q.back() + lq[b]);
    cu_k.push_back(cu_k.back() + lk[b]);
  }
  const auto cq = offsets_to_device<Space>(cu_q, "cu_q");
  const auto ck = offsets_to_device<Space>(cu_k, "cu_k");
  auto q4 = to_device<T, Space>(qp, "q");
  auto k4 = to_device<T, Space>(kp, "k");
  auto v4 = to_device<T, Space>(vp, "v");
  auto do4 = to_device<T, Space>(dop, "d_o");
  auto packed = [](const DeviceView4<T, Space>& x) {
    return DeviceView3<T, Space>(x.data(), x.extent(1), x.extent(2), x.extent(3));
  };
  const auto q = packed(q4), k = packed(k4), v = packed(v4), d_o = packed(do4);
  DeviceView3<T, Space> o("o", total_q, heads, d), dq("dq", total_q, heads, d),
      dk("dk", total_k, heads, d), dv("dv", total_k, heads, d);
  DeviceView2<Acc, Space> lse("lse", heads, total_q);
  const auto mod = kfa::nn::pairwise_bias(bias, grad);
  kfa::flash_attention_varlen_forward(Space(), q, k, v, cq, ck, max_q, max_k, o, lse, opt, mod);
  kfa::flash_attention_varlen_backward(Space(), q, k, v, cq, ck, max_q, max_k, o, lse, d_o, dq, dk,
                                       dv, opt, mod);
  const double tol = std::is_same<T, double>::value ? 1e-10
                     : std::is_same<T, float>::value ? 2e-4
                                                     : 3e-2;
  EXPECT_LE(max_abs_diff(to_host(grad), expected), tol * std::max(1e-3, max_abs(expected)))
      << type_name<T>() << " " << Space::name() << " packed dbias";
}

// The fused kernels narrow a tile's key (query) blocks with the block
// predicate in ranges that double and then halve: the same blocks as a walk
// block by block for a predicate exact on every range, and O(log) calls.
TEST(ScoreModBlocks, TrimHiddenBlocksInLogarithmicCalls) {
  std::mt19937_64 rng(test_seed("trim-hidden-blocks"));
  for (int trial = 0; trial < 400; ++trial) {
    const int n = 1 + int(rng() % 300);
    // Shown blocks: none, one run (a document), or scattered ones.
    std::vector<char> shown(n, 0);
    const int kind = trial % 3;
    if (kind == 1) {
      const int a = int(rng() % n), len = 1 + int(rng() % 12);
      for (int i = a; i < std::min(n, a + len); ++i) shown[i] = 1;
    } else if (kind == 2) {
      for (int i = 0; i < n; ++i) shown[i] = rng() % 17 == 0;
    }
    int calls = 0;
    auto exact = [&](int lo, int hi) {
      ++calls;
      EXPECT_LT(lo, hi);
      EXPECT_GE(lo, 0);
      EXPECT_LE(hi, n);
      for (int i = lo; i < hi; ++i)
        if (shown[i]) return true;
      return false;
    };
    const int first0 = int(rng() % n), end0 = first0 + 1 + int(rng() % (n - first0));
    int first = first0, end = end0;
    kfa::Impl::trim_hidden_blocks(exact, first, end);
    int want_first = first0, want_end = end0;
    while (want_first < want_end && !shown[want_first]) ++want_first;
    while (want_end > want_first && !shown[want_end - 1]) --want_end;
    if (want_first == want_end) {
      EXPECT_EQ(first, end) << "n " << n << " trial " << trial;
    } else {
      EXPECT_EQ(first, want_first) << "n " << n << " trial " << trial;
      EXPECT_EQ(end, want_end) << "n " << n << " trial " << trial;
    }
    int log2n = 0;
    while ((1 << log2n) < n) ++log2n;
    EXPECT_LE(calls, 4 * log2n + 4) << "n " << n << " trial " << trial;

    // A predicate that passes every range of two or more blocks: the
    // result keeps every shown block (never skips one), only fewer hidden.
    auto coarse = [&](int lo, int hi) { return hi - lo > 1 || shown[lo]; };
    first = first0;
    end = end0;
    kfa::Impl::trim_hidden_blocks(coarse, first, end);
    EXPECT_LE(first0, first);
    EXPECT_LE(end, end0);
    if (want_first < want_end) {
      EXPECT_LE(first, want_first);
      EXPECT_GE(end, want_end);
    }
  }
}

#ifdef KOKKOS_ENABLE_CUDA
// Score modifiers on the 16-bit tensor-core kernels: the wgmma forward and
// backward (on Hopper with sm_90a code), the mma.sync forward with wgmma off;
// at the head dims whose backward takes them. A non-additive modifier with its
// derivative, documents with window, softcap, dropout and grouped heads; the
// block predicate skips tiles (fewer calls than scores) and, hiding
// everything, gives empty rows and zero gradients without a single call.
TEST(ScoreModCuda, OnTheTensorCoreKernels) {
  using Space = Kokkos::Cuda;
  using T = kfa::bfloat16;
  using Cb = Config<Space, T>;
  using Ch = Config<Space, kfa::half, true>;
  for (const bool wgmma : {true, false})
    for (const int d : {64, 128}) {
      kfa::AttentionOptions opt;
      opt.kernel_policy.wgmma = wgmma;
      opt.causal = true;
      const Shape s{2, 203, 157, 3, d};
      ModSetup<Space> nonlinear(Mod<Space>::kNonlinear | Mod<Space>::kRelativeBias, s,
                                test_seed("fused-nonlinear"));
      check_variant<Cb>(s, opt, "fused-nonlinear", nonlinear.mod, nonlinear.extras);
      opt.window_left = 70;
      opt.softcap = 4;
      opt.dropout_p = 0.15;
      opt.dropout_seed = 11;
      const Shape g{1, 250, 131, 4, d, wgmma ? 2 : 4};
      ModSetup<Space> doc(Mod<Space>::kDocument | Mod<Space>::kRelativeBias, g,
                          test_seed("fused-doc"));
      check_variant<Ch>(g, opt, "fused-doc", doc.mod, doc.extras);

      kfa::AttentionOptions plain;
      plain.kernel_policy.wgmma = wgmma;
      const Shape one{1, 1024, 1024, 1, d};
      ModSetup<Space> skip(Mod<Space>::kDocument | Mod<Space>::kCountCalls, one,
                           test_seed("fused-skip"));
      const Case c = make_case<T>(one, {}, "fused-skip", skip.extras);
      auto q = to_device<T, Space>(c.q, "q");
      auto k = to_device<T, Space>(c.k, "k");
      auto v = to_device<T, Space>(c.v, "v");
      auto d_o = to_device<T, Space>(c.d_o, "d_o");
      DeviceView4<T, Space> o("o", 1, 1024, 1, d), dq("dq", 1, 1024, 1, d),
          dk("dk", 1, 1024, 1, d), dv("dv", 1, 1024, 1, d);
      DeviceView3<float, Space> lse("lse", 1, 1, 1024);
      kfa::flash_attention_forward(Space(), q, k, v, o, lse, plain, skip.mod);
      auto calls = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), skip.calls);
      EXPECT_GT(calls(0), 0);
      // Documents of at most 40 tokens: the tiles on the diagonal and next to
      // it, a small part of the 1024 x 1024 scores.
      EXPECT_LT(calls(0), 1024 * 1024 / 3) << "wgmma " << wgmma << " d " << d;
      EXPECT_LE(max_abs_diff(to_host(o), c.o_ref),
                64 * epsilon<T>() * std::max(1.0, max_abs(c.o_ref)));

      // Two documents: with unchanged() the tiles inside one run without
      // the modifier, forward and backward, with the same results.
      {
        ModSetup<Space> whole(Mod<Space>::kDocument | Mod<Space>::kCountCalls, one,
                              test_seed("fused-unchanged"), 0, {600, 424});
        const Case cw = make_case<T>(one, {}, "fused-unchanged", whole.extras);
        auto qw = to_device<T, Space>(cw.q, "q");
        auto kw = to_device<T, Space>(cw.k, "k");
        auto vw = to_device<T, Space>(cw.v, "v");
        auto dow = to_device<T, Space>(cw.d_o, "d_o");
        long counted[2] = {0, 0};
        Tensor out[2][4];
        for (const int with : {0, 1}) {
          whole.mod.modes = Mod<Space>::kDocument | Mod<Space>::kCountCalls |
                            (with ? int(Mod<Space>::kUnchanged) : 0);
          Kokkos::deep_copy(whole.calls, 0);
          kfa::flash_attention_forward(Space(), qw, kw, vw, o, lse, plain, whole.mod);
          kfa::flash_attention_backward(Space(), qw, kw, vw, o, lse, dow, dq, dk, dv, plain,
                                        whole.mod);
          auto n = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), whole.calls);
          counted[with] = n(0);
          out[with][0] = to_host(o);
          out[with][1] = to_host(dq);
          out[with][2] = to_host(dk);
          out[with][3] = to_host(dv);
        }
        EXPECT_LT(counted[1], counted[0]) << "wgmma " << wgmma << " d " << d;
        EXPECT_LE(max_abs_diff(out[1][0], cw.o_ref),
                  64 * epsilon<T>() * std::max(1.0, max_abs(cw.o_ref)));
        // The same kernels without the calls: the same results up to the
        // rounding of where the scale is applied.
        for (int x = 0; x < 4; ++x)
          EXPECT_LE(max_abs_diff(out[1][x], out[0][x]),
                    8 * epsilon<T>() * std::max(1.0, max_abs(out[0][x])))
              << "wgmma " << wgmma << " d " << d << " output " << x;
      }

      skip.mod.modes = Mod<Space>::kHideAll | Mod<Space>::kCountCalls;
      Kokkos::deep_copy(skip.calls, 0);
      poison(o);
      poison(lse);
      kfa::flash_attention_forward(Space(), q, k, v, o, lse, plain, skip.mod);
      for (double x : to_host(o).data) ASSERT_EQ(x, 0.0) << "wgmma " << wgmma << " d " << d;
      for (double x : to_host(lse).data) ASSERT_TRUE(std::isinf(x) && x < 0);
      poison(dq);
      poison(dk);
      poison(dv);
      kfa::flash_attention_backward(Space(), q, k, v, o, lse, d_o, dq, dk, dv, plain, skip.mod);
      for (const auto& grad : {to_host(dq), to_host(dk), to_host(dv)})
        for (double x : grad.data) ASSERT_EQ(x, 0.0) << "wgmma " << wgmma << " d " << d;
      Kokkos::deep_copy(calls, skip.calls);
      EXPECT_EQ(calls(0), 0) << "wgmma " << wgmma << " d " << d;
    }
}
#endif

}  // namespace
}  // namespace kfa_test
