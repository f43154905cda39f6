// Packed variable-length batches (cu_seqlens): fused and materialised,
// forward and backward, against the fp64 oracle run one sequence at a time;
// empty sequences, sequences whose rows see no key, grouped-query heads,
// windows, softcap and dropout; sequences longer and shorter than a tile at
// the fused kernels' own head dims; a packed batch of equal lengths gives
// the fixed-length batch's results bit for bit, on the portable kernels and
// (forward, dK and dV) on the fused ones.

#include "kfa_test_helpers.hpp"

namespace kfa_test {
namespace {

template <class C>
class Varlen : public ::testing::Test {};
TYPED_TEST_SUITE(Varlen, AllConfigs);

TYPED_TEST(Varlen, SelfAttentionWithEmptySequences) {
  if (is_duplicate_config<TypeParam>()) GTEST_SKIP() << "half is float here";
  const std::vector<int> lengths{37, 0, 113, 1, 64};
  check_varlen<TypeParam>({lengths, lengths, 3, 3, 59}, {}, "varlen");
  // Bounds above the actual lengths: the extra blocks are skipped.
  kfa::AttentionOptions causal;
  causal.causal = true;
  check_varlen<TypeParam>({lengths, lengths, 3, 3, 59, 150, 150}, causal, "varlen");
}

// seqlen_q != seqlen_k per sequence (bottom-right alignment per sequence), a
// sequence without queries (its dk, dv are 0) and one without keys (its rows
// give O = 0, lse = -inf), grouped-query heads, both dQ modes.
TYPED_TEST(Varlen, CrossLengthsCausalGroupedQuery) {
  if (is_duplicate_config<TypeParam>()) GTEST_SKIP() << "half is float here";
  const VarlenShape shape{{50, 97, 0, 13}, {70, 40, 25, 0}, 4, 2, 80};
  kfa::AttentionOptions opt;
  opt.causal = true;
  check_varlen<TypeParam>(shape, opt, "varlen-cross");
  opt.deterministic = true;
  check_varlen<TypeParam>(shape, opt, "varlen-cross");
}

// At head dims the fused kernels have (no padded copies): sequences of one
// row, of a tile and one row, of several tiles, empty ones, between one
// another, so that a tile's rows or keys past its sequence's end are the
// next sequence's and must neither be seen nor written.
TYPED_TEST(Varlen, SequencesAcrossTileEdges) {
  if (is_duplicate_config<TypeParam>()) GTEST_SKIP() << "half is float here";
  const std::vector<int> lengths{1, 130, 257, 0, 64, 200, 5, 129};
  kfa::AttentionOptions causal;
  causal.causal = true;
  check_varlen<TypeParam>({lengths, lengths, 2, 2, 128}, causal, "varlen-tiles");
  const std::vector<int> keys{70, 129, 300, 17, 0, 199, 64, 128};
  kfa::AttentionOptions window;
  window.window_left = 50;
  window.window_right = 3;
  check_varlen<TypeParam>({lengths, keys, 4, 2, 64}, window, "varlen-tiles");
  check_varlen<TypeParam>({lengths, keys, 4, 4, 64}, {}, "varlen-tiles");
}

TYPED_TEST(Varlen, WindowSoftcapDropout) {
  if (is_duplicate_config<TypeParam>()) GTEST_SKIP() << "half is float here";
  kfa::AttentionOptions opt;
  opt.window_left = 20;
  opt.window_right = 5;
  opt.softcap = 2;
  opt.dropout_p = 0.2;
  opt.dropout_seed = 99;
  check_varlen<TypeParam>({{97, 113, 31}, {113, 97, 60}, 2, 1, 32}, opt, "varlen-window");
}

/// The outputs of a fixed-length batch `s` and of the same tensors packed
/// ([batch][seqlen] rows as [batch·seqlen] rows, equal lengths), forward and
/// backward with `opt`; lse of the packed call [heads][batch·seqlen_q].
struct FixedAndPacked {
  Tensor o, lse, dq, dk, dv;
  Tensor o_p, lse_p, dq_p, dk_p, dv_p;
};

template <class C>
FixedAndPacked run_fixed_and_packed(const Shape& s, const kfa::AttentionOptions& opt,
                                    const std::string& tag) {
  using Space = typename C::space;
  using T = typename C::value_type;
  using Acc = kfa::accumulator_t<T>;
  const Case c = make_case<T>(s, {}, tag);
  auto q = to_device<T, Space>(c.q, "q");
  auto k = to_device<T, Space>(c.k, "k");
  auto v = to_device<T, Space>(c.v, "v");
  auto d_o = to_device<T, Space>(c.d_o, "d_o");
  DeviceView4<T, Space> o("o", s.batch, s.seqlen_q, s.heads, s.head_dim),
      dq("dq", s.batch, s.seqlen_q, s.heads, s.head_dim),
      dk("dk", s.batch, s.seqlen_k, kv_heads(s), s.head_dim),
      dv("dv", s.batch, s.seqlen_k, kv_heads(s), s.head_dim);
  DeviceView3<Acc, Space> lse("lse", s.batch, s.heads, s.seqlen_q);
  kfa::flash_attention_forward(Space(), q, k, v, o, lse, opt);
  kfa::flash_attention_backward(Space(), q, k, v, o, lse, d_o, dq, dk, dv, opt);

  const int tq = s.batch * s.seqlen_q, tk = s.batch * s.seqlen_k;
  auto packed = [](const DeviceView4<T, Space>& x, int total) {
    return DeviceView3<T, Space>(x.data(), total, x.extent(2), x.extent(3));
  };
  DeviceView3<T, Space> o_p("o_p", tq, s.heads, s.head_dim),
      dq_p("dq_p", tq, s.heads, s.head_dim), dk_p("dk_p", tk, kv_heads(s), s.head_dim),
      dv_p("dv_p", tk, kv_heads(s), s.head_dim);
  DeviceView2<Acc, Space> lse_p("lse_p", s.heads, tq);
  const auto cu_q =
      offsets_to_device<Space>(offsets_of(std::vector<int>(s.batch, s.seqlen_q)), "cu_q");
  const auto cu_k =
      offsets_to_device<Space>(offsets_of(std::vector<int>(s.batch, s.seqlen_k)), "cu_k");
  poison(o_p);
  poison(lse_p);
  poison(dq_p);
  poison(dk_p);
  poison(dv_p);
  kfa::flash_attention_varlen_forward(Space(), packed(q, tq), packed(k, tk), packed(v, tk), cu_q,
                                      cu_k, s.seqlen_q, s.seqlen_k, o_p, lse_p, opt);
  kfa::flash_attention_varlen_backward(Space(), packed(q, tq), packed(k, tk), packed(v, tk), cu_q,
                                       cu_k, s.seqlen_q, s.seqlen_k, o_p, lse_p,
                                       packed(d_o, tq), dq_p, dk_p, dv_p, opt);
  return {to_host(o),   to_host(lse),   to_host(dq),   to_host(dk),   to_host(dv),
          to_host(o_p), to_host(lse_p), to_host(dq_p), to_host(dk_p), to_host(dv_p)};
}

/// lse [batch][heads][seqlen_q] of the fixed call against the packed
/// [heads][batch·seqlen_q], bit for bit.
inline void expect_same_lse(const Shape& s, const FixedAndPacked& r, const std::string& what) {
  const int tq = s.batch * s.seqlen_q;
  for (int b = 0; b < s.batch; ++b)
    for (int h = 0; h < s.heads; ++h)
      for (int i = 0; i < s.seqlen_q; ++i)
        ASSERT_EQ(r.lse_p.data[std::size_t(h) * tq + b * s.seqlen_q + i], r.lse.at(b, h, i))
            << what;
}

// The packed and the fixed-length entry points run the same kernels: equal
// lengths must give identical bits (deterministic mode, so dQ's order is fixed).
// The fixed-length call is held to the portable kernels on GPUs (no opt-in
// shared memory and a variant: no fused family takes it), as the packed one
// is (deterministic backward).
TYPED_TEST(Varlen, EqualLengthsMatchFixedBatchBitwise) {
  using Space = typename TypeParam::space;
  if (is_duplicate_config<TypeParam>()) GTEST_SKIP() << "half is float here";
  const Shape s{3, 77, 90, 4, 40, 2};
  kfa::AttentionOptions opt;
  opt.causal = true;
  opt.deterministic = true;
  opt.dropout_p = 0.3;
  opt.dropout_seed = 3;
  opt.team_size = test_team_size<Space>();
  opt.kernel_policy.opt_in_shared_memory = false;
  const FixedAndPacked r = run_fixed_and_packed<TypeParam>(s, opt, "varlen-bitwise");
  EXPECT_EQ(r.o_p.data, r.o.data);
  EXPECT_EQ(r.dq_p.data, r.dq.data);
  EXPECT_EQ(r.dk_p.data, r.dk.data);
  EXPECT_EQ(r.dv_p.data, r.dv.data);
  expect_same_lse(s, r, "varlen-bitwise");
}

// The fused kernels run a packed batch of equal lengths as they run the
// fixed-length batch: the same O, lse, dK and dV bits (dQ is added up by
// atomics in the fused backwards, in no fixed order: close, not equal).
TYPED_TEST(Varlen, EqualLengthsMatchFixedBatchOnTheFusedKernels) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  using Acc = kfa::accumulator_t<T>;
  if (is_duplicate_config<TypeParam>()) GTEST_SKIP() << "half is float here";
  if (is_host_space<Space>()) GTEST_SKIP() << "the fused kernels are CUDA's";
  for (const Shape s : {Shape{3, 77, 90, 4, 64, 2}, Shape{2, 200, 130, 2, 128}}) {
    kfa::AttentionOptions opt;
    opt.causal = s.seqlen_q == 77;
    const FixedAndPacked r = run_fixed_and_packed<TypeParam>(s, opt, "varlen-fused-bitwise");
    const std::string what = to_string(s) + to_string(opt);
    EXPECT_EQ(r.o_p.data, r.o.data) << what;
    EXPECT_EQ(r.dk_p.data, r.dk.data) << what;
    EXPECT_EQ(r.dv_p.data, r.dv.data) << what;
    double worst = 0, scale = 0;
    for (std::size_t i = 0; i < r.dq.data.size(); ++i) {
      worst = std::max(worst, std::abs(r.dq.data[i] - r.dq_p.data[i]));
      scale = std::max(scale, std::abs(r.dq.data[i]));
    }
    EXPECT_LE(worst, 64 * scale * std::numeric_limits<Acc>::epsilon()) << what;
    expect_same_lse(s, r, what);
  }
}

}  // namespace
}  // namespace kfa_test
