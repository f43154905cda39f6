// The kernel-choice table (kfa/detail/attention/kernel_choice.hpp): which
// kernel family serves a call, per backend, value type, shape, options and
// KernelPolicy. The numerical tests check what each family computes; these
// check that a call reaches the family the table promises.

#include "kfa_test_helpers.hpp"

#include <kfa/nn/score_mods.hpp>

#include <kfa/detail/attention/kernel_choice.hpp>
#include <kfa/detail/attention/padded_head_dim.hpp>

namespace kfa_test {
namespace {

using kfa::Impl::KernelFamily;

template <class C>
class KernelChoice : public ::testing::Test {};
TYPED_TEST_SUITE(KernelChoice, AllConfigs);

/// An additive score modifier (a relative-position bias) for the table.
struct RelativeBias {
  template <class Acc>
  KOKKOS_FUNCTION Acc operator()(int, int, int i, int j, Acc score) const {
    return score - Acc(0.01) * Acc(i - j);
  }
};

/// The kernels (family, padded head dim or 0) a forward and a backward call
/// of `shape` with `opt` (and a score modifier of type ScoreMod) get.
template <class C, class ScoreMod = kfa::Impl::NoScoreMod>
std::pair<kfa::Impl::KernelChoice, kfa::Impl::KernelChoice> choices(
    const Shape& s, const kfa::AttentionOptions& opt,
    const std::vector<int>& packed_lengths = {}) {
  using Space = typename C::space;
  using T = typename C::value_type;
  using Acc = kfa::accumulator_t<T>;
  using mem = typename Space::memory_space;
  Kokkos::View<T****, Kokkos::LayoutRight, mem> q("q", s.batch, s.seqlen_q, s.heads, s.head_dim),
      k("k", s.batch, s.seqlen_k, kv_heads(s), s.head_dim),
      v("v", s.batch, s.seqlen_k, kv_heads(s), s.head_dim),
      o("o", s.batch, s.seqlen_q, s.heads, s.head_dim);
  Kokkos::View<Acc***, Kokkos::LayoutRight, mem> lse("lse", s.batch, s.heads, s.seqlen_q);
  using namespace kfa::Impl;
  const Space space;
  // With packed_lengths: a packed batch of those sequences, the views
  // [1][total] (s.batch 1, s.seqlen_q = s.seqlen_k = the total).
  auto seq = batch_sequences(q, k);
  if (!packed_lengths.empty()) {
    const auto cu = offsets_to_device<Space>(offsets_of(packed_lengths), "cu");
    const int longest = *std::max_element(packed_lengths.begin(), packed_lengths.end());
    seq = packed_sequences<mem>(cu, cu, longest, longest);
  }
  const auto fwd =
      forward_kernel_choice<ScoreMod, Space, decltype(in4(q)), decltype(in4(k)),
                            decltype(in4(v)), decltype(out4(o)), decltype(out3(lse))>(
          space, in4(q), in4(k), in4(v), out4(o), seq, opt);
  using Delta = Kokkos::View<Acc***, Kokkos::LayoutRight, mem>;
  const auto bwd =
      backward_kernel_choice<ScoreMod, Space, decltype(in4(q)), decltype(in4(k)),
                             decltype(in4(v)), decltype(in4(o)), decltype(in3(lse)),
                             decltype(in4(o)), decltype(out4(o)), decltype(out4(k)),
                             decltype(out4(v)), Delta>(space, in4(q), in4(k), in4(v), in4(o),
                                                       out4(o), out4(k), out4(v), seq, opt);
  return std::make_pair(fwd, bwd);
}

/// The families of choices().
template <class C, class ScoreMod = kfa::Impl::NoScoreMod>
std::pair<KernelFamily, KernelFamily> families(const Shape& s, const kfa::AttentionOptions& opt) {
  const auto [fwd, bwd] = choices<C, ScoreMod>(s, opt);
  return std::make_pair(fwd.family, bwd.family);
}

TYPED_TEST(KernelChoice, TablePerTypeAndPolicy) {
  if (is_duplicate_config<TypeParam>()) GTEST_SKIP() << "half is float here";
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  const Shape dense{2, 130, 200, 4, 64};
  const kfa::AttentionOptions plain;
  const auto [fwd, bwd] = families<TypeParam>(dense, plain);
  if constexpr (is_host_space<Space>()) {
    // Host backends: the host kernels unless the policy asks for the
    // portable ones.
    EXPECT_EQ(fwd, KernelFamily::host_tiled);
    EXPECT_EQ(bwd, KernelFamily::host_tiled);
    kfa::AttentionOptions portable;
    portable.kernel_policy.host_tiled = false;
    EXPECT_EQ(families<TypeParam>(dense, portable).first, KernelFamily::portable);
    EXPECT_EQ(families<TypeParam>(dense, portable).second, KernelFamily::portable);
  } else {
#ifdef KOKKOS_ENABLE_CUDA
    constexpr bool k16 = !std::is_same<T, float>::value && !std::is_same<T, double>::value;
    kfa::AttentionOptions no_wgmma, no_opt_in, split;
    no_wgmma.kernel_policy.wgmma = false;
    no_opt_in.kernel_policy.opt_in_shared_memory = false;
    split.fp32_matmul = kfa::Fp32Matmul::split_tf32;
    const bool hopper = kfa::Impl::wgmma_available(Space());
    if constexpr (k16) {
      const KernelFamily best = hopper ? KernelFamily::wgmma : KernelFamily::mma_sync;
      EXPECT_EQ(fwd, best);
      EXPECT_EQ(bwd, best);
      EXPECT_EQ(families<TypeParam>(dense, no_wgmma).first, KernelFamily::mma_sync);
      EXPECT_EQ(families<TypeParam>(dense, no_wgmma).second, KernelFamily::mma_sync);
      EXPECT_EQ(families<TypeParam>(dense, no_opt_in).first, KernelFamily::mma_sync_team_policy);
      EXPECT_EQ(families<TypeParam>(dense, no_opt_in).second,
                KernelFamily::mma_sync_team_policy);
      // Grouped-query heads and head_dim 256 stay on the 16-bit kernels.
      EXPECT_EQ(families<TypeParam>({1, 100, 100, 4, 128, 2}, plain).first, best);
      EXPECT_EQ(families<TypeParam>({1, 100, 100, 2, 256}, plain).second, best);
    } else {
      const KernelFamily ieee =
          std::is_same<T, float>::value ? KernelFamily::exact_fp32 : KernelFamily::fp32_fp64;
      EXPECT_EQ(fwd, ieee);
      EXPECT_EQ(bwd, ieee);
      EXPECT_EQ(families<TypeParam>(dense, split).first, KernelFamily::fp32_fp64);
      EXPECT_EQ(families<TypeParam>(dense, no_opt_in).first, KernelFamily::portable);
      // Grouped-query heads on the fused kernels too.
      EXPECT_EQ(families<TypeParam>({1, 100, 100, 4, 64, 2}, plain).first, ieee);
      EXPECT_EQ(families<TypeParam>({1, 100, 100, 4, 64, 2}, plain).second, ieee);
    }
#endif
  }
}

// Windows run on every fused family; softcap, dropout and score modifiers on
// every fused family but the TeamPolicy-shaped mma_sync backward.
// What the fused kernels do not take goes to the portable kernels on GPUs:
// head dims outside 64/128(/256), an explicit team size, deterministic
// backward. Host backends run all of it on the host
// kernels, and grouped-query heads and odd head dims too; an explicit team
// size asks for the portable kernels' teams everywhere.
TYPED_TEST(KernelChoice, VariantsOnTheFusedKernels) {
  if (is_duplicate_config<TypeParam>()) GTEST_SKIP() << "half is float here";
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  constexpr bool host = is_host_space<Space>();
  const Shape dense{1, 100, 120, 2, 64};
  kfa::AttentionOptions window, causal_window, softcap, dropout, team, det;
  window.window_left = 16;
  window.window_right = 8;
  causal_window.causal = true;
  causal_window.window_left = 40;
  softcap.softcap = 30;
  dropout.dropout_p = 0.1;
  team.team_size = 2;
  det.deterministic = true;
  const auto dense_families = families<TypeParam>(dense, {});
  // Windows: the dense call's families, on every backend.
  for (const auto& opt : {window, causal_window}) {
    EXPECT_EQ(families<TypeParam>(dense, opt), dense_families);
  }
  KernelFamily variant_fwd = KernelFamily::host_tiled, variant_bwd = KernelFamily::host_tiled;
  if constexpr (!host) {
    constexpr bool k16 = !std::is_same<T, float>::value && !std::is_same<T, double>::value;
    variant_fwd = dense_families.first;
    variant_bwd = dense_families.second;
#ifdef KOKKOS_ENABLE_CUDA
    if constexpr (k16) {
      // The staged mma_sync backward and the wgmma ones take variants (256
      // too); the TeamPolicy-shaped mma_sync backward does not.
      if (variant_bwd == KernelFamily::mma_sync_team_policy) variant_bwd = KernelFamily::portable;
      auto policy_only = dropout;
      policy_only.kernel_policy.wgmma = false;
      EXPECT_EQ(families<TypeParam>(dense, policy_only).first, KernelFamily::mma_sync);
      EXPECT_EQ(families<TypeParam>(dense, policy_only).second, KernelFamily::mma_sync);
      EXPECT_EQ(families<TypeParam>({1, 100, 100, 2, 256}, policy_only).second,
                KernelFamily::mma_sync);
      EXPECT_EQ(families<TypeParam>({1, 100, 100, 2, 256}, softcap).first,
                dense_families.first);
      EXPECT_EQ(families<TypeParam>({1, 100, 100, 2, 256}, softcap).second,
                families<TypeParam>({1, 100, 100, 2, 256}, {}).second);
      // Grouped-query heads with a variant: wgmma, not mma_sync.
      auto grouped_policy_only = softcap;
      grouped_policy_only.kernel_policy.wgmma = false;
      EXPECT_EQ(families<TypeParam>({1, 100, 100, 4, 64, 2}, grouped_policy_only).first,
                KernelFamily::portable);
      EXPECT_EQ(families<TypeParam>({1, 100, 100, 4, 64, 2}, grouped_policy_only).second,
                KernelFamily::mma_sync);
      EXPECT_EQ(families<TypeParam>({1, 100, 100, 4, 64, 2}, softcap).first,
                dense_families.first);
    }
#endif
  }
  for (const auto& opt : {softcap, dropout}) {
    EXPECT_EQ(families<TypeParam>(dense, opt).first, variant_fwd);
    EXPECT_EQ(families<TypeParam>(dense, opt).second, variant_bwd);
  }
  EXPECT_EQ((families<TypeParam, RelativeBias>(dense, {}).first), variant_fwd);
  EXPECT_EQ((families<TypeParam, RelativeBias>(dense, {}).second), variant_bwd);
  // A modifier that takes its gradient: the forward as any modifier's, the
  // backward on the host kernels or the portable ones.
  using mem = typename Space::memory_space;
  using GradBias = kfa::nn::PairwiseBiasWithGrad<Kokkos::View<float****, mem>,
                                                 Kokkos::View<double****, mem>>;
  EXPECT_EQ((families<TypeParam, GradBias>(dense, {}).first), variant_fwd);
  EXPECT_EQ((families<TypeParam, GradBias>(dense, {}).second),
            host ? KernelFamily::host_tiled : KernelFamily::portable);
  const KernelFamily elsewhere = host ? KernelFamily::host_tiled : KernelFamily::portable;
  EXPECT_EQ(families<TypeParam>(dense, team).first, KernelFamily::portable);
  EXPECT_EQ(families<TypeParam>(dense, team).second, KernelFamily::portable);
  EXPECT_EQ(families<TypeParam>(dense, det).second, elsewhere);
  if (host) {
    for (const Shape& odd : {Shape{1, 1, 1, 1, 1}, Shape{1, 97, 113, 6, 59, 2},
                             Shape{1, 113, 203, 2, 256}}) {
      EXPECT_EQ(families<TypeParam>(odd, {}).first, KernelFamily::host_tiled);
      EXPECT_EQ(families<TypeParam>(odd, {}).second, KernelFamily::host_tiled);
    }
  }
  EXPECT_STREQ(kfa::Impl::to_string(KernelFamily::exact_fp32), "exact_fp32");
  EXPECT_STREQ(kfa::Impl::to_string(KernelFamily::host_tiled), "host_tiled");
}

// Packed variable-length batches take the fixed-length batch's kernels, on
// every backend, at every head dim, with and without masks and grouped
// heads.
TYPED_TEST(KernelChoice, PackedBatchesOnTheFusedKernels) {
  if (is_duplicate_config<TypeParam>()) GTEST_SKIP() << "half is float here";
  using Space = typename TypeParam::space;
  const std::vector<int> lengths{100, 3, 0, 257, 1};
  const int total = 361;
  kfa::AttentionOptions causal, window;
  causal.causal = true;
  window.window_left = 30;
  window.window_right = 0;
  for (const int heads_kv : {2, 1})
    for (const int d : {64, 128, 80})
      for (const auto& opt : {kfa::AttentionOptions(), causal, window}) {
        SCOPED_TRACE("heads_kv " + std::to_string(heads_kv) + " head_dim " + std::to_string(d) +
                     to_string(opt));
        const Shape packed{1, total, total, 2, d, heads_kv}, fixed{2, 100, 120, 2, d, heads_kv};
        const auto [fwd, bwd] = choices<TypeParam>(packed, opt, lengths);
        const auto [fwd_fixed, bwd_fixed] = choices<TypeParam>(fixed, opt);
        EXPECT_EQ(fwd.family, fwd_fixed.family);
        EXPECT_EQ(fwd.head_dim, fwd_fixed.head_dim);
        EXPECT_EQ(bwd.family, bwd_fixed.family);
        EXPECT_EQ(bwd.head_dim, bwd_fixed.head_dim);
        if constexpr (!is_host_space<Space>()) {
#ifdef KOKKOS_ENABLE_CUDA
          EXPECT_NE(fwd.family, KernelFamily::portable);
#endif
        }
      }
}

// Head dims without a fused kernel of their own run on GPUs on the fused
// kernel of the next compiled head dim up (64, 128, and 256 for 16-bit
// types), zero-padded; beyond that, and on host backends (whose kernels take
// any head dim), at their own head dim.
TYPED_TEST(KernelChoice, OddHeadDimsOnTheFusedKernels) {
  if (is_duplicate_config<TypeParam>()) GTEST_SKIP() << "half is float here";
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  const auto dense = choices<TypeParam>({1, 100, 120, 2, 64}, {});
  constexpr bool k16 = !std::is_same<T, float>::value && !std::is_same<T, double>::value;
  kfa::AttentionOptions softcap, team, det;
  softcap.softcap = 20;
  team.team_size = 2;
  det.deterministic = true;
  for (const int d : {1, 8, 40, 63, 65, 80, 96, 127, 129, 160, 200, 255}) {
    SCOPED_TRACE("head_dim " + std::to_string(d));
    const Shape shape{1, 100, 120, 2, d};
    const auto [fwd, bwd] = choices<TypeParam>(shape, {});
    if constexpr (is_host_space<Space>()) {
      EXPECT_EQ(fwd.family, KernelFamily::host_tiled);
      EXPECT_EQ(fwd.head_dim, 0);
      EXPECT_EQ(bwd.family, KernelFamily::host_tiled);
    } else {
      const int bucket = d <= 64 ? 64 : d <= 128 ? 128 : k16 ? 256 : 0;
      if (bucket == 0) {
        EXPECT_EQ(fwd.family, KernelFamily::portable);
        EXPECT_EQ(bwd.family, KernelFamily::portable);
        continue;
      }
      EXPECT_EQ(fwd.head_dim, bucket);
      EXPECT_EQ(bwd.head_dim, bucket);
      if (bucket != 256) {
        EXPECT_EQ(fwd.family, dense.first.family);
        EXPECT_EQ(bwd.family, dense.second.family);
      } else {
        EXPECT_NE(fwd.family, KernelFamily::portable);
        EXPECT_NE(bwd.family, KernelFamily::portable);
      }
      // An explicit team size and the deterministic backward stay portable.
      EXPECT_EQ(choices<TypeParam>(shape, team).first.family, KernelFamily::portable);
      EXPECT_EQ(choices<TypeParam>(shape, det).second.family, KernelFamily::portable);
      if constexpr (k16) {
        EXPECT_EQ(choices<TypeParam>(shape, softcap).first.family,
                  choices<TypeParam>({1, 100, 120, 2, bucket}, softcap).first.family);
      }
    }
  }
}

/// The padded copies (padded_head_dim.hpp) of one [batch][rows][heads][d]
/// tensor: padded to `padded` columns of zeros and cropped back, on the
/// 16-byte-chunk path (rows of whole chunks, aligned) and on the
/// per-element one (odd head dims, a source one element off alignment).
template <class C>
void check_pad_and_crop(int head_dim, int padded, int offset) {
  using Space = typename C::space;
  using T = typename C::value_type;
  using mem = typename Space::memory_space;
  using Unmanaged = Kokkos::View<T****, Kokkos::LayoutRight, mem, Kokkos::MemoryUnmanaged>;
  const int batch = 2, rows = 5, heads = 3;
  const std::size_t n = std::size_t(batch) * rows * heads * head_dim;
  Kokkos::View<T*, mem> storage("storage", n + offset);
  const Unmanaged src(storage.data() + offset, batch, rows, heads, head_dim);
  auto host = Kokkos::create_mirror_view(storage);
  // Small integers: exact in every value type.
  for (std::size_t i = 0; i < n; ++i)
    host(i + offset) = from_double<T>(double(int((i * 7) % 251) - 125));
  Kokkos::deep_copy(storage, host);
  Kokkos::View<T****, Kokkos::LayoutRight, mem> wide("wide", batch, rows, heads, padded),
      back("back", batch, rows, heads, head_dim);
  poison(wide);
  poison(back);
  kfa::Impl::copy_head_dim(Space(), "test::pad", src, wide);
  kfa::Impl::copy_head_dim(Space(), "test::crop", wide, back);
  const Tensor w = to_host(wide), b = to_host(back);
  const std::string what = "head_dim " + std::to_string(head_dim) + " -> " +
                           std::to_string(padded) + ", offset " + std::to_string(offset);
  for (std::size_t r = 0; r < std::size_t(batch) * rows * heads; ++r) {
    for (int c = 0; c < padded; ++c) {
      const double expected =
          c < head_dim ? double(int(((r * head_dim + c) * 7) % 251) - 125) : 0.0;
      ASSERT_EQ(w.data[r * padded + c], expected) << what << ", row " << r << ", column " << c;
    }
    for (int c = 0; c < head_dim; ++c)
      ASSERT_EQ(b.data[r * head_dim + c], w.data[r * padded + c])
          << what << ", row " << r << ", column " << c;
  }
}

TYPED_TEST(KernelChoice, PaddedHeadDimCopies) {
  if (is_duplicate_config<TypeParam>()) GTEST_SKIP();
  for (const auto& shape : {std::pair<int, int>{96, 128}, {80, 128}, {32, 64}, {40, 64},
                            {33, 64}, {1, 64}, {160, 256}, {200, 256}}) {
    check_pad_and_crop<TypeParam>(shape.first, shape.second, 0);
    check_pad_and_crop<TypeParam>(shape.first, shape.second, 1);
  }
}

}  // namespace
}  // namespace kfa_test
