// Attention variants on fixed-length batches: grouped-query / multi-query
// attention, sliding windows (with causal, bottom-right aligned), softcap,
// dropout, and all of them at once. Fused and materialised, forward and
// backward, against the fp64 oracle with the error rule of the core tests.
// Also: the mask's tile queries against brute force, the dropout mask, and
// the league order of the fused CUDA kernels.

#include "kfa_test_helpers.hpp"

namespace kfa_test {
namespace {

// The league order of the fused CUDA kernels (FusedProblem::block_of, on
// the host here): every (batch, head, block) has exactly one team; the
// teams that run at once (a group) share few (batch, head) pairs, and in a
// group block indices never decrease (block 0, the longest causal key
// block, first); group size 0, or few blocks, is one group of every pair.
TEST(FusedProblem, LeagueOwnsEveryBlockOnceGroupedByHead) {
  const int pair_shapes[][2] = {{1, 1}, {2, 3}, {3, 16}, {8, 16}};
  for (const int group : {256, 7, 0})
    for (const auto& bh : pair_shapes)
      for (const int blocks : {1, 5, 16, 64, 300}) {
        const Kokkos::View<float****, Kokkos::HostSpace> q("q", bh[0], 1, bh[1], 1);
        kfa::Impl::FusedProblem p(q, q, false);
        p.group_teams = group;
        const int pairs = bh[0] * bh[1];
        const int group_pairs =
            group > 0 && blocks >= kfa::Impl::FusedProblem::kMinGroupedBlocks
                ? std::max(1, std::min(pairs, group / blocks))
                : pairs;
        const std::string what = "group " + std::to_string(group) + " batch " +
                                 std::to_string(bh[0]) + " heads " + std::to_string(bh[1]) +
                                 " blocks " + std::to_string(blocks);
        ASSERT_EQ(p.league(blocks), pairs * blocks) << what;
        std::vector<int> owners(std::size_t(pairs) * blocks, 0);
        int last_block = -1;
        for (int rank = 0; rank < p.league(blocks); ++rank) {
          int b = -1, h = -1;
          const int block = p.block_of(rank, blocks, b, h);
          ASSERT_TRUE(b >= 0 && b < bh[0] && h >= 0 && h < bh[1] && block >= 0 && block < blocks)
              << what << " rank " << rank;
          ++owners[std::size_t(b * bh[1] + h) * blocks + block];
          const int pair_group = (b * bh[1] + h) / group_pairs;
          ASSERT_EQ(pair_group, rank / (group_pairs * blocks)) << what << " rank " << rank;
          if (rank % (group_pairs * blocks) == 0) last_block = -1;
          ASSERT_GE(block, last_block) << what << " rank " << rank;
          last_block = block;
        }
        for (const int n : owners) ASSERT_EQ(n, 1) << what;
      }
}

// The tile queries of the mask agree with the element mask (and so do the
// visible key range of a row and row range of a key): every visible
// element lies inside the key range of its row block and the row range of
// its key block, and a tile said not to need the element mask has no masked
// element. Windows also skip the tiles before them, not only after.
TEST(AttentionMask, TileQueriesMatchBruteForce) {
  struct Window {
    bool causal;
    int left, right;
  };
  const Window windows[] = {{false, -1, -1}, {true, -1, -1}, {false, 5, 0},  {true, 16, -1},
                            {false, 0, 0},   {false, -1, 3}, {false, 7, -1}, {false, 12, 30},
                            {true, 1000, -1}};
  const int shapes[][2] = {{97, 97}, {40, 150}, {150, 40}, {1, 64}, {64, 1}, {33, 0}};
  const int blocks[][2] = {{64, 64}, {16, 8}, {7, 5}};
  for (const Window& w : windows)
    for (const auto& shape : shapes)
      for (const auto& block : blocks) {
        const int sq = shape[0], sk = shape[1], bm = block[0], bn = block[1];
        kfa::AttentionOptions opt;
        opt.causal = w.causal;
        opt.window_left = w.left;
        opt.window_right = w.right;
        const kfa::Impl::AttentionMask mask(sq, sk, w.left, w.causal ? 0 : w.right);
        const std::string what = "sq=" + std::to_string(sq) + " sk=" + std::to_string(sk) +
                                 " block " + std::to_string(bm) + "x" + std::to_string(bn) +
                                 to_string(opt);
        for (int i = 0; i < sq; ++i)
          for (int j = 0; j < sk; ++j)
            ASSERT_EQ(mask.masked(i, j), ref_masked(opt, i, j, sq, sk)) << what;
        // The per-row and per-key ranges of the tensor-core kernels, also
        // over the padding rows and keys past the ends (all masked).
        for (int i = 0; i < sq + 3; ++i)
          for (int j = 0; j < sk + 5; ++j) {
            int first = 0, last = 0;
            mask.visible_keys(i, first, last);
            ASSERT_EQ(mask.masked(i, j), j < first || j > last) << what << " row " << i;
            ASSERT_TRUE(mask.has_left() || first == 0) << what;
            mask.visible_rows(j, first, last);
            ASSERT_EQ(mask.masked(i, j), i < first || i > last) << what << " key " << j;
          }
        int visited = 0, needed = 0;
        for (int r0 = 0; r0 < sq; r0 += bm) {
          const int r1 = std::min(sq, r0 + bm);
          const int key_lo = mask.key_begin(r0), key_hi = mask.key_end(r1);
          for (int k0 = 0; k0 < sk; k0 += bn) {
            const int k1 = std::min(sk, k0 + bn);
            bool any = false, all = true;
            for (int i = r0; i < r1; ++i)
              for (int j = k0; j < k0 + bn; ++j) {
                const bool visible = j < sk && !ref_masked(opt, i, j, sq, sk);
                any = any || visible;
                all = all && visible;
                if (visible) {
                  ASSERT_TRUE(j >= key_lo && j < key_hi) << what << " row " << i << " key " << j;
                  ASSERT_TRUE(i >= mask.row_begin(k0) && i < mask.row_end(k1))
                      << what << " row " << i << " key " << j;
                }
              }
            if (!mask.tile_needs_mask(r0, r1, k0, k0 + bn))
              ASSERT_TRUE(all) << what << " tile " << r0 << "," << k0;
            const bool in_range = k1 > key_lo && k0 < key_hi;
            visited += in_range;
            needed += any;
          }
        }
        // The ranges are tight up to one tile per row block at each end.
        EXPECT_LE(visited, needed + 2 * ((sq + bm - 1) / bm)) << what;
      }
}

template <class C>
class Variants : public ::testing::Test {};
TYPED_TEST_SUITE(Variants, AllConfigs);

kfa::AttentionOptions window(int left, int right, bool causal = false) {
  kfa::AttentionOptions opt;
  opt.window_left = left;
  opt.window_right = right;
  opt.causal = causal;
  return opt;
}

// Grouped-query (heads_kv = 2 for 6 query heads) and multi-query
// (heads_kv = 1) attention; dk and dv sum over each group's query heads.
TYPED_TEST(Variants, GroupedQueryAttention) {
  if (is_duplicate_config<TypeParam>()) GTEST_SKIP() << "half is float here";
  check_variant<TypeParam>({2, 97, 113, 6, 59, 2}, {}, "gqa");
  check_variant<TypeParam>({1, 113, 203, 4, 80, 1}, window(-1, -1, true), "mqa");
  kfa::AttentionOptions det = window(-1, -1, true);
  det.deterministic = true;
  check_variant<TypeParam>({2, 64, 70, 4, 32, 2}, det, "gqa-det");
  // Head dims of the fused CUDA kernels: there the 16-bit kernels read each
  // group's k/v head in place, and the backward sums dK, dV over the group.
  check_variant<TypeParam>({2, 190, 333, 8, 64, 2}, {}, "gqa-fused");
  check_variant<TypeParam>({1, 300, 129, 4, 128, 1}, window(-1, -1, true), "mqa-fused");
}

#ifdef KOKKOS_ENABLE_CUDA
// The CUDA tests below run every fused kernel family over many shapes; each
// is split into parts (a parameter each) so that one part is one test
// process of compute-sanitizer's racecheck, which runs ~100x slower.
struct KernelPart {
  bool wgmma;
  int value;  // a head dim, or 0/1 for a switch, per test
};
std::string part_name(const ::testing::TestParamInfo<KernelPart>& info) {
  return std::string(info.param.wgmma ? "wgmma_" : "mma_") + std::to_string(info.param.value);
}

// Grouped-query attention through every 16-bit tensor-core kernel, forward
// and backward: wgmma (on Hopper with sm_90a code, the typed test's path
// there; d 64/128), mma.sync in its large shape, and the TeamPolicy shape
// (d 256, and variants: the portable backward). Part: wgmma on/off, opt-in
// shared memory on/off.
class GroupedQueryCuda : public ::testing::TestWithParam<KernelPart> {};
TEST_P(GroupedQueryCuda, InEveryTensorCoreKernel) {
  using C16 = Config<Kokkos::Cuda, kfa::bfloat16>;
  using C16h = Config<Kokkos::Cuda, kfa::half, true>;
  const bool wgmma = GetParam().wgmma, opt_in = GetParam().value != 0;
  kfa::AttentionOptions opt = window(-1, -1, true), plain;
  opt.kernel_policy.wgmma = plain.kernel_policy.wgmma = wgmma;
  opt.kernel_policy.opt_in_shared_memory = plain.kernel_policy.opt_in_shared_memory = opt_in;
  check_variant<C16>({2, 190, 333, 8, 64, 2}, opt, "gqa-kernels");
  check_variant<C16h>({1, 129, 300, 6, 128, 3}, plain, "gqa-kernels");
  check_variant<C16>({1, 257, 200, 4, 256, 1}, plain, "gqa-kernels");
  // With a variant (the mma.sync forward leaves grouped heads with a
  // variant to the portable kernel; its backward takes them).
  kfa::AttentionOptions variant = opt;
  variant.softcap = 4;
  variant.dropout_p = 0.15;
  variant.dropout_seed = 5;
  check_variant<C16>({2, 190, 333, 8, 64, 2}, variant, "gqa-variant-kernels");
  check_variant<C16h>({1, 129, 300, 6, 128, 3}, variant, "gqa-variant-kernels");
}
INSTANTIATE_TEST_SUITE_P(VariantsCuda, GroupedQueryCuda,
                         ::testing::Values(KernelPart{true, 1}, KernelPart{true, 0},
                                           KernelPart{false, 1}, KernelPart{false, 0}),
                         part_name);

// A variant on the split-TF32 fp32 kernels (Fp32Matmul::split_tf32), held to
// that mode's own bound (FlashBackwardCuda.Fp32OnTensorCores): every output
// within 3e-5 of the size of the fp64 oracle's gradients.
void check_variant_split_tf32(const Shape& s, kfa::AttentionOptions opt, const std::string& tag) {
  opt.fp32_matmul = kfa::Fp32Matmul::split_tf32;
  RefExtras extras;
  Tensor keep;
  if (opt.dropout_p > 0) {
    keep = dropout_keep_mask<Kokkos::Cuda>(s.batch, s.heads, s.seqlen_q, s.seqlen_k, opt);
    extras.keep = &keep;
  }
  const Case c = make_case<float>(s, opt, tag, extras);
  const FlashOutputs flash = run_flash<float, Kokkos::Cuda>(c, opt);
  Tensor dq_ref, dk_ref, dv_ref;
  reference_backward<double, true>(c.q, c.k, c.v, c.o_ref, c.lse_ref, c.d_o, opt, dq_ref, dk_ref,
                                   dv_ref, extras);
  const double size = std::max({1.0, gradient_magnitude(c.q, c.k, c.v, c.d_o, opt),
                                max_abs(dq_ref), max_abs(dk_ref), max_abs(dv_ref)});
  const std::string what = tag + " " + to_string(s) + to_string(opt);
  EXPECT_LE(max_abs_diff(flash.o, c.o_ref), 3e-5 * std::max(1.0, max_abs(c.o_ref))) << what;
  EXPECT_LE(max_abs_diff(flash.dq, dq_ref), 3e-5 * size) << what << " dq";
  EXPECT_LE(max_abs_diff(flash.dk, dk_ref), 3e-5 * size) << what << " dk";
  EXPECT_LE(max_abs_diff(flash.dv, dv_ref), 3e-5 * size) << what << " dv";
}

// The built-in variants one at a time and all at once.
std::vector<std::pair<std::string, kfa::AttentionOptions>> builtin_variant_cases() {
  std::vector<std::pair<std::string, kfa::AttentionOptions>> cases;
  cases.push_back({"window", window(40, 7)});
  cases.push_back({"causal-window", window(33, -1, true)});
  kfa::AttentionOptions softcap = window(-1, -1, true);
  softcap.softcap = 5;
  cases.push_back({"softcap", softcap});
  kfa::AttentionOptions dropout;
  dropout.dropout_p = 0.2;
  dropout.dropout_seed = 9;
  cases.push_back({"dropout", dropout});
  kfa::AttentionOptions all = window(50, -1, true);
  all.softcap = 3;
  all.dropout_p = 0.1;
  all.dropout_seed = 77;
  cases.push_back({"combined", all});
  return cases;
}

// Every built-in variant on the 16-bit tensor-core kernels: wgmma (on Hopper
// with sm_90a code) and, with wgmma off, mma.sync, at each fused head dim
// (the part), on lengths that cut tiles and windows mid-block. Forward and
// backward against the fp64 oracle.
class EveryVariant16Cuda : public ::testing::TestWithParam<KernelPart> {};
TEST_P(EveryVariant16Cuda, OnTheTensorCoreKernels) {
  using Cb = Config<Kokkos::Cuda, kfa::bfloat16>;
  using Ch = Config<Kokkos::Cuda, kfa::half, true>;
  const bool wgmma = GetParam().wgmma;
  const int d = GetParam().value;
  for (auto [tag, opt] : builtin_variant_cases()) {
    opt.kernel_policy.wgmma = wgmma;
    const int heads = d == 256 ? 2 : 3;
    check_variant<Cb>({2, 203, 157, 2 * heads, d, wgmma ? heads : 2 * heads}, opt,
                      "fused-" + tag);
    check_variant<Ch>({1, 131, 250, heads, d}, opt, "fused-" + tag);
  }
}
INSTANTIATE_TEST_SUITE_P(VariantsCuda, EveryVariant16Cuda,
                         ::testing::Values(KernelPart{true, 64}, KernelPart{true, 128},
                                           KernelPart{true, 256}, KernelPart{false, 64},
                                           KernelPart{false, 128}, KernelPart{false, 256}),
                         part_name);

// The same on the exact fp32, the split-tf32 (its own bound) and the fp64
// kernels, grouped-query heads included; part: the head dim.
class EveryVariantFp32Fp64Cuda : public ::testing::TestWithParam<KernelPart> {};
TEST_P(EveryVariantFp32Fp64Cuda, OnTheTensorCoreKernels) {
  const int d = GetParam().value;
  for (const auto& opt : {window(40, 7), window(33, -1, true), window(-1, 20)}) {
    check_variant<Config<Kokkos::Cuda, float>>({2, 203, 157, 3, d}, opt, "fused-window");
    check_variant<Config<Kokkos::Cuda, double>>({1, 131, 250, 2, d}, opt, "fused-window");
  }
  for (const auto& [tag, opt] : builtin_variant_cases()) {
    check_variant<Config<Kokkos::Cuda, float>>({2, 203, 157, 3, d, 3}, opt, "fused-" + tag);
    check_variant<Config<Kokkos::Cuda, double>>({1, 131, 250, 4, d, 2}, opt, "fused-" + tag);
    check_variant_split_tf32({2, 203, 157, 4, d, 2}, opt, "fused-3xtf32-" + tag);
  }
}
INSTANTIATE_TEST_SUITE_P(VariantsCuda, EveryVariantFp32Fp64Cuda,
                         ::testing::Values(KernelPart{false, 64}, KernelPart{false, 128}),
                         part_name);

// Head dims without a kernel of their own run on the fused kernel of the
// next compiled head dim on zero-padded copies (KernelChoice.
// OddHeadDimsOnTheFusedKernels): dense, causal, windows, softcap and dropout,
// grouped-query heads, forward and backward against the fp64 oracle, with
// wgmma on and off (part: wgmma, head dim); fp32 and fp64 up to 128.
kfa::AttentionOptions padded_mixed() {
  kfa::AttentionOptions mixed = window(45, -1, true);
  mixed.softcap = 4;
  mixed.dropout_p = 0.15;
  mixed.dropout_seed = 5;
  return mixed;
}
class OddHeadDim16Cuda : public ::testing::TestWithParam<KernelPart> {};
TEST_P(OddHeadDim16Cuda, OnThePaddedFusedKernels) {
  using Cb = Config<Kokkos::Cuda, kfa::bfloat16>;
  using Ch = Config<Kokkos::Cuda, kfa::half, true>;
  const int d = GetParam().value;
  for (auto opt : {kfa::AttentionOptions{}, window(-1, -1, true), padded_mixed(), window(30, 9)}) {
    opt.kernel_policy.wgmma = GetParam().wgmma;
    check_variant<Cb>({2, 157, 203, 4, d, 2}, opt, "padded");
    check_variant<Ch>({1, 203, 131, 3, d}, opt, "padded");
  }
}
std::vector<KernelPart> odd_head_dim_parts() {
  std::vector<KernelPart> parts;
  for (const bool wgmma : {true, false})
    for (const int d : {8, 40, 80, 96, 112, 160, 200}) parts.push_back({wgmma, d});
  return parts;
}
INSTANTIATE_TEST_SUITE_P(VariantsCuda, OddHeadDim16Cuda,
                         ::testing::ValuesIn(odd_head_dim_parts()), part_name);

class OddHeadDimFp32Fp64Cuda : public ::testing::TestWithParam<KernelPart> {};
TEST_P(OddHeadDimFp32Fp64Cuda, OnThePaddedFusedKernels) {
  const int d = GetParam().value;
  for (const auto& opt : {kfa::AttentionOptions{}, window(-1, -1, true), window(40, 7)}) {
    check_variant<Config<Kokkos::Cuda, float>>({2, 157, 203, 3, d}, opt, "padded");
    check_variant<Config<Kokkos::Cuda, double>>({1, 131, 250, 2, d}, opt, "padded");
  }
}
INSTANTIATE_TEST_SUITE_P(VariantsCuda, OddHeadDimFp32Fp64Cuda,
                         ::testing::Values(KernelPart{false, 24}, KernelPart{false, 72},
                                           KernelPart{false, 100}),
                         part_name);
#endif

// Sliding windows, alone and with causal, seqlen_q below, equal to and above
// seqlen_k (bottom-right alignment), including rows that see no key.
TYPED_TEST(Variants, SlidingWindow) {
  if (is_duplicate_config<TypeParam>()) GTEST_SKIP() << "half is float here";
  check_variant<TypeParam>({1, 203, 113, 2, 64}, window(16, -1, true), "window");
  check_variant<TypeParam>({1, 203, 113, 2, 64}, window(40, 7), "window");
  check_variant<TypeParam>({2, 97, 97, 2, 32}, window(0, 0), "window");
  check_variant<TypeParam>({1, 113, 203, 3, 59}, window(-1, 9), "window");
  check_variant<TypeParam>({1, 113, 203, 3, 59}, window(23, -1), "window");
  check_variant<TypeParam>({1, 150, 40, 2, 16}, window(8, -1, true), "window");
  kfa::AttentionOptions det = window(30, 30);
  det.deterministic = true;
  check_variant<TypeParam>({1, 120, 130, 2, 48}, det, "window-det");
}

// Softcap: scores become softcap·tanh(s/softcap); the backward multiplies dS
// by 1 - tanh².
TYPED_TEST(Variants, Softcap) {
  if (is_duplicate_config<TypeParam>()) GTEST_SKIP() << "half is float here";
  kfa::AttentionOptions opt;
  opt.softcap = 1.5;
  check_variant<TypeParam>({2, 113, 203, 3, 80}, opt, "softcap");
  opt.softcap = 0.7;
  opt.softmax_scale = 0.5;
  opt.causal = true;
  opt.deterministic = true;
  check_variant<TypeParam>({1, 97, 97, 2, 59}, opt, "softcap");
}

// Dropout against the oracle given kfa's keep mask: the forward and both
// backward kernels must draw exactly that mask.
TYPED_TEST(Variants, Dropout) {
  if (is_duplicate_config<TypeParam>()) GTEST_SKIP() << "half is float here";
  kfa::AttentionOptions opt;
  opt.dropout_p = 0.17;
  opt.dropout_seed = 42;
  check_variant<TypeParam>({2, 97, 113, 2, 59}, opt, "dropout");
  opt.dropout_p = 0.5;
  opt.dropout_seed = 7;
  opt.causal = true;
  opt.deterministic = true;
  check_variant<TypeParam>({1, 113, 97, 3, 32}, opt, "dropout");
}

// Everything at once, and the largest head dimension (the smallest CUDA tiles).
TYPED_TEST(Variants, Combined) {
  if (is_duplicate_config<TypeParam>()) GTEST_SKIP() << "half is float here";
  kfa::AttentionOptions opt = window(37, -1, true);
  opt.softcap = 3;
  opt.dropout_p = 0.1;
  opt.dropout_seed = 2024;
  check_variant<TypeParam>({2, 130, 150, 4, 64, 2}, opt, "combined");
  opt = window(20, 20);
  opt.softcap = 2;
  opt.dropout_p = 0.2;
  opt.dropout_seed = 5;
  opt.deterministic = true;
  check_variant<TypeParam>({1, 70, 90, 2, 256, 1}, opt, "combined");
}

// The dropout mask: the kept fraction is 1 - p, a function of (seed, b, h,
// i, j) only (repeatable, different per seed, neighbours independent), and
// the host draws the same mask as the device.
TYPED_TEST(Variants, DropoutMask) {
  using Space = typename TypeParam::space;
  if (!std::is_same<typename TypeParam::value_type, double>::value)
    GTEST_SKIP() << "the mask does not depend on the value type";
  const int B = 2, H = 3, Sq = 250, Sk = 300;
  for (const double p : {0.0, 0.1, 0.5, 0.9}) {
    kfa::AttentionOptions opt;
    opt.dropout_p = p;
    opt.dropout_seed = 12345;
    const Tensor mask = dropout_keep_mask<Space>(B, H, Sq, Sk, opt);
    double kept = 0;
    for (double x : mask.data) kept += x;
    const double n = double(mask.data.size());
    const double sigma = std::sqrt(n * p * (1 - p));
    EXPECT_NEAR(kept, n * (1 - p), 5 * sigma + 1e-9) << "p " << p;
    EXPECT_EQ(dropout_keep_mask<Space>(B, H, Sq, Sk, opt).data, mask.data) << "p " << p;
    const kfa::Impl::DropoutGenerator host(p, opt.dropout_seed);
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < H; ++h)
        for (int i = 0; i < Sq; i += 7)
          for (int j = 0; j < Sk; j += 5)
            ASSERT_EQ(mask.at(b, h, i, j), host.kept(host.row_key(b, h, i), j) ? 1.0 : 0.0);
    if (p > 0) {
      opt.dropout_seed = 12346;
      const Tensor other = dropout_keep_mask<Space>(B, H, Sq, Sk, opt);
      double same = 0;
      for (std::size_t e = 0; e < n; ++e) same += other.data[e] == mask.data[e];
      // Independent masks agree with probability p² + (1-p)².
      EXPECT_NEAR(same, n * (p * p + (1 - p) * (1 - p)), 5 * std::sqrt(n) + 1e-9) << "p " << p;
      // So do neighbours: the two keys of one draw (j, j + 1 with j even)
      // and adjacent rows.
      double pair_same = 0, pairs = 0, row_same = 0, rows = 0;
      for (int b = 0; b < B; ++b)
        for (int h = 0; h < H; ++h)
          for (int i = 0; i < Sq; ++i)
            for (int j = 0; j < Sk; ++j) {
              if (j % 2 == 0 && j + 1 < Sk) {
                pair_same += mask.at(b, h, i, j) == mask.at(b, h, i, j + 1);
                pairs += 1;
              }
              if (i + 1 < Sq) {
                row_same += mask.at(b, h, i, j) == mask.at(b, h, i + 1, j);
                rows += 1;
              }
            }
      const double agree = p * p + (1 - p) * (1 - p);
      EXPECT_NEAR(pair_same, pairs * agree, 5 * std::sqrt(pairs)) << "p " << p;
      EXPECT_NEAR(row_same, rows * agree, 5 * std::sqrt(rows)) << "p " << p;
    }
  }
}

}  // namespace
}  // namespace kfa_test
