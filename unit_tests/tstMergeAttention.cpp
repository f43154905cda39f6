// merge_attention: attention over keys [0, s) merged with attention over keys
// [s, n) equals attention over all n keys.

#include "kfa_test_helpers.hpp"

namespace kfa_test {
namespace {

template <class C>
class MergeAttention : public ::testing::Test {};
TYPED_TEST_SUITE(MergeAttention, AllConfigs);

TYPED_TEST(MergeAttention, SplitKeysEqualsFullAttention) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  using Acc = kfa::accumulator_t<T>;
  if (is_duplicate_config<TypeParam>()) GTEST_SKIP() << "half is float here";
  // Second pass ("empty"): merging with a partial that saw no key
  // (lse = -inf everywhere) must leave the other partial unchanged. head_dim
  // 40 merges packs of elements a thread, 13 one element a thread.
  for (int head_dim : {40, 13})
    for (bool empty : {false, true}) {
      SCOPED_TRACE("head_dim " + std::to_string(head_dim) + (empty ? " empty" : ""));
      const Shape s{2, 77, 150, 3, head_dim};
      kfa::AttentionOptions opt;
      const Case c = make_case<T>(s, opt, "merge");
      const int split = 61;
      Tensor k_a({s.batch, split, s.heads, s.head_dim}), v_a = k_a;
      Tensor k_b({s.batch, s.seqlen_k - split, s.heads, s.head_dim}), v_b = k_b;
      for (int b = 0; b < s.batch; ++b)
        for (int j = 0; j < s.seqlen_k; ++j)
          for (int h = 0; h < s.heads; ++h)
            for (int d = 0; d < s.head_dim; ++d) {
              if (j < split) {
                k_a.at(b, j, h, d) = c.k.at(b, j, h, d);
                v_a.at(b, j, h, d) = c.v.at(b, j, h, d);
              } else {
                k_b.at(b, j - split, h, d) = c.k.at(b, j, h, d);
                v_b.at(b, j - split, h, d) = c.v.at(b, j, h, d);
              }
            }
      auto q = to_device<T, Space>(c.q, "q");
      DeviceView4<T, Space> o_b("o_b", s.batch, s.seqlen_q, s.heads, s.head_dim);
      DeviceView4<Acc, Space> o_acc("o_acc", s.batch, s.seqlen_q, s.heads, s.head_dim);
      DeviceView4<T, Space> o_a("o_a", s.batch, s.seqlen_q, s.heads, s.head_dim);
      DeviceView3<Acc, Space> lse_a("lse_a", s.batch, s.heads, s.seqlen_q),
          lse_b("lse_b", s.batch, s.heads, s.seqlen_q);
      kfa::flash_attention_forward(Space(), q, to_device<T, Space>(k_a, "k_a"),
                                   to_device<T, Space>(v_a, "v_a"), o_a, lse_a, opt);
      kfa::flash_attention_forward(Space(), q, to_device<T, Space>(k_b, "k_b"),
                                   to_device<T, Space>(v_b, "v_b"), o_b, lse_b, opt);
      Kokkos::deep_copy(o_acc, to_device<Acc, Space>(to_host(o_a), "o_a_acc"));
      if (empty) Kokkos::deep_copy(lse_b, -INFINITY);
      kfa::merge_attention(Space(), o_acc, lse_a, o_b, lse_b);
      const Tensor merged = to_host(o_acc), lse = to_host(lse_a);
      if (empty) {
        EXPECT_EQ(max_abs_diff(merged, to_host(o_a)), 0.0);
        continue;
      }
      // The merge itself is exact in the accumulator; the halves' rounding
      // to the value type is within the forward bound's eps_T·max|v|.
      expect_forward_close<T>("merged", merged, lse, c.o_ref, c.lse_ref, forward_magnitudes<T>(c),
                              false);
    }
}

TYPED_TEST(MergeAttention, BadShapes) {
  using Space = typename TypeParam::space;
  DeviceView4<float, Space> o_a("o_a", 1, 4, 2, 8), o_b("o_b", 1, 5, 2, 8);
  DeviceView3<float, Space> lse_a("lse_a", 1, 2, 4), lse_b("lse_b", 1, 2, 4);
  EXPECT_THROW(kfa::merge_attention(Space(), o_a, lse_a, o_b, lse_b), std::invalid_argument);
}

}  // namespace
}  // namespace kfa_test
