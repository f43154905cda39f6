// ALiBi through kfa::alibi, the score modifier kfa provides: slopes per head
// or per batch entry (rank-1 or rank-2 View), with causal masks and windows,
// and in packed batches, where the distance is measured from each
// sequence's own bottom-right-aligned diagonal.

#include "kfa_test_helpers.hpp"

namespace kfa_test {
namespace {

template <class C>
class Alibi : public ::testing::Test {};
TYPED_TEST_SUITE(Alibi, AllConfigs);

/// ALiBi's oracle: score - slope · |i + seqlen_k - seqlen_q - j|.
RefExtras alibi_extras(const std::vector<float>& slopes, int heads, bool per_batch) {
  RefExtras x;
  x.mod = [slopes, heads, per_batch](int b, int h, int i, int j, double s, int sq, int sk) {
    const double slope = slopes[per_batch ? std::size_t(b) * heads + h : std::size_t(h)];
    return s - slope * std::abs(i + sk - sq - j);
  };
  return x;
}

template <class Space>
Kokkos::View<float*, typename Space::memory_space> slopes_on_device(const std::vector<float>& s) {
  Kokkos::View<float*, typename Space::memory_space> view("slopes", s.size());
  auto host = Kokkos::create_mirror_view(view);
  for (std::size_t n = 0; n < s.size(); ++n) host(n) = s[n];
  Kokkos::deep_copy(view, host);
  return view;
}

/// The geometric slopes of the ALiBi paper: 2^(-8(h+1)/heads).
std::vector<float> alibi_slopes(int count, int heads) {
  std::vector<float> s(count);
  for (int n = 0; n < count; ++n) s[n] = std::pow(2.0f, -8.0f * float(n % heads + 1) / heads);
  return s;
}

TYPED_TEST(Alibi, PerHeadAndPerBatch) {
  using Space = typename TypeParam::space;
  if (is_duplicate_config<TypeParam>()) GTEST_SKIP() << "half is float here";
  const Shape per_head{1, 113, 203, 4, 64, 2};
  const auto slopes = alibi_slopes(4, 4);
  kfa::AttentionOptions opt;
  opt.causal = true;
  check_variant<TypeParam>(per_head, opt, "alibi",
                           kfa::alibi(slopes_on_device<Space>(slopes)),
                           alibi_extras(slopes, 4, false));
  // [batch][heads] slopes (a rank-2 View), non-causal with a window.
  const Shape per_batch{2, 97, 97, 2, 59};
  std::vector<float> slopes2 = alibi_slopes(4, 2);
  slopes2[2] *= 3;
  slopes2[3] *= 0.25f;
  auto flat = slopes_on_device<Space>(slopes2);
  Kokkos::View<float**, Kokkos::LayoutRight, typename Space::memory_space> slopes_2d(flat.data(),
                                                                                  2, 2);
  opt = {};
  opt.window_left = opt.window_right = 30;
  check_variant<TypeParam>(per_batch, opt, "alibi-batch", kfa::alibi(slopes_2d),
                           alibi_extras(slopes2, 2, true));
}

#ifdef KOKKOS_ENABLE_CUDA
// ALiBi on the 16-bit tensor-core kernels (wgmma on Hopper with sm_90a code,
// mma.sync with wgmma off) at each fused head dim, seqlen_q above and below
// seqlen_k (the distance from the bottom-right diagonal), causal and window.
TEST(AlibiCuda, OnTheTensorCoreKernels) {
  using Space = Kokkos::Cuda;
  const auto slopes = alibi_slopes(4, 4);
  const auto device_slopes = slopes_on_device<Space>(slopes);
  for (const bool wgmma : {true, false})
    for (const int d : {64, 128, 256}) {
      kfa::AttentionOptions opt;
      opt.kernel_policy.wgmma = wgmma;
      opt.causal = true;
      check_variant<Config<Space, kfa::bfloat16>>({2, 203, 157, 4, d, wgmma ? 2 : 4}, opt,
                                                  "alibi-fused", kfa::alibi(device_slopes),
                                                  alibi_extras(slopes, 4, false));
      opt.causal = false;
      opt.window_left = 45;
      opt.window_right = 12;
      check_variant<Config<Space, kfa::half, true>>({1, 131, 250, 4, d}, opt, "alibi-fused",
                                                    kfa::alibi(device_slopes),
                                                    alibi_extras(slopes, 4, false));
    }
}
#endif

// ALiBi in a packed batch is aligned to each sequence's own bottom-right corner.
TYPED_TEST(Alibi, PackedSequences) {
  using Space = typename TypeParam::space;
  if (is_duplicate_config<TypeParam>()) GTEST_SKIP() << "half is float here";
  const auto slopes = alibi_slopes(2, 2);
  kfa::AttentionOptions opt;
  opt.causal = true;
  check_varlen<TypeParam>({{40, 70, 0, 33}, {90, 50, 10, 33}, 2, 2, 48}, opt, "alibi-varlen",
                          kfa::alibi(slopes_on_device<Space>(slopes)),
                          alibi_extras(slopes, 2, false));
}

}  // namespace
}  // namespace kfa_test
