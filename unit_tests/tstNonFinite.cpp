// The non-finite values policy of docs/api.md: a NaN or ±Inf in q, k or v
// reaches the outputs of the rows that see it (lse included, so that the
// backward propagates it too) and nothing outside its (batch, head) pair;
// rows that see no key give O = 0, lse = -inf and dQ = 0; tiny and large
// softmax scales give the oracle's answer.

#include "kfa_test_helpers.hpp"

namespace kfa_test {
namespace {

template <class C>
class NonFinite : public ::testing::Test {};
TYPED_TEST_SUITE(NonFinite, AllConfigs);

/// Which input carries the non-finite value, at (batch 0, row kRow, head 1,
/// dim kDim).
enum class Where { q, k, v };
constexpr int kRow = 20, kDim = 3;

const char* name_of(Where w) { return w == Where::q ? "q" : w == Where::k ? "k" : "v"; }

// Elements outside the poisoned (batch, head) pair equal the clean run (up
// to the order of the backward's atomic sums); inside it, the outputs that
// depend on the poisoned value are not finite (NaN for a NaN).
template <class C>
void check_propagation(Where where, double bad) {
  using T = typename C::value_type;
  const Shape s{2, 40, 30, 2, 16};  // causal, offset -10: row i sees keys j <= i - 10
  kfa::AttentionOptions opt;
  opt.causal = true;
  opt.team_size = test_team_size<typename C::space>();
  const Case clean = make_case<T>(s, opt, "nonfinite");
  Case c = clean;
  Tensor& target = where == Where::q ? c.q : where == Where::k ? c.k : c.v;
  target.at(0, kRow, 1, kDim) = bad;
  const FlashOutputs ref = run_flash<T, typename C::space>(clean, opt),
                      got = run_flash<T, typename C::space>(c, opt);
  const std::string what = type_name<T>() + " " + C::space::name() + " " + name_of(where) + " = " +
                           std::to_string(bad);
  const bool nan = std::isnan(bad);
  auto bad_value = [&](double x) { return nan ? std::isnan(x) : !std::isfinite(x); };
  const double tol = 64 * epsilon<T>();
  auto expect_clean = [&](const Tensor& a, const Tensor& b, int bb, int i, int h, int d,
                          const char* name) {
    EXPECT_TRUE(std::isfinite(a.at(bb, i, h, d)) &&
                std::abs(a.at(bb, i, h, d) - b.at(bb, i, h, d)) <=
                    tol * std::max(1.0, std::abs(b.at(bb, i, h, d))))
        << what << ": " << name << "(" << bb << "," << i << "," << h << "," << d << ") = "
        << a.at(bb, i, h, d) << ", clean run " << b.at(bb, i, h, d);
  };
  // Outside the pair (batch 0, head 1): as if nothing happened.
  for (int b = 0; b < s.batch; ++b)
    for (int h = 0; h < s.heads; ++h) {
      if (b == 0 && h == 1) continue;
      for (int i = 0; i < s.seqlen_q; ++i)
        for (int d = 0; d < s.head_dim; ++d) {
          expect_clean(got.o, ref.o, b, i, h, d, "O");
          expect_clean(got.dq, ref.dq, b, i, h, d, "dQ");
        }
      for (int j = 0; j < s.seqlen_k; ++j)
        for (int d = 0; d < s.head_dim; ++d) {
          expect_clean(got.dk, ref.dk, b, j, h, d, "dK");
          expect_clean(got.dv, ref.dv, b, j, h, d, "dV");
        }
    }
  // Inside it: the rows that see the value.
  const int first_row = where == Where::q ? kRow : kRow + 10;
  const int last_row = where == Where::q ? kRow : s.seqlen_q - 1;
  for (int i = first_row; i <= last_row; ++i) {
    const double lse = got.lse.at(0, 1, i);
    if (where == Where::v) {
      // lse does not depend on v; O does in column kDim only.
      EXPECT_EQ(lse, ref.lse.at(0, 1, i)) << what << ": lse row " << i;
      EXPECT_TRUE(bad_value(got.o.at(0, i, 1, kDim))) << what << ": O row " << i;
    } else if (where == Where::k && !nan && c.q.at(0, i, 1, kDim) < 0) {
      // A score of -inf: the key is masked for this row.
      EXPECT_TRUE(std::isfinite(lse)) << what << ": lse row " << i;
      continue;
    } else {
      EXPECT_TRUE(std::isnan(lse)) << what << ": lse row " << i << " = " << lse;
      for (int d = 0; d < s.head_dim; ++d)
        EXPECT_TRUE(std::isnan(got.o.at(0, i, 1, d))) << what << ": O row " << i;
    }
    // dS of the row is not finite, hence its dQ.
    bool dq_bad = false;
    for (int d = 0; d < s.head_dim; ++d) dq_bad = dq_bad || bad_value(got.dq.at(0, i, 1, d));
    EXPECT_TRUE(dq_bad) << what << ": dQ row " << i;
  }
}

TYPED_TEST(NonFinite, NaNReachesTheRowsThatSeeItOnly) {
  if (is_duplicate_config<TypeParam>()) GTEST_SKIP() << "half is float here";
  for (Where w : {Where::q, Where::k, Where::v})
    check_propagation<TypeParam>(w, std::numeric_limits<double>::quiet_NaN());
}

TYPED_TEST(NonFinite, InfReachesTheRowsThatSeeItOnly) {
  if (is_duplicate_config<TypeParam>()) GTEST_SKIP() << "half is float here";
  for (Where w : {Where::q, Where::k, Where::v})
    check_propagation<TypeParam>(w, std::numeric_limits<double>::infinity());
}

// Rows that see no key: O = 0, lse = -inf, and they add nothing to the
// gradients (dQ = 0; dK, dV as the oracle's).
TYPED_TEST(NonFinite, RowsWithoutKeysHaveZeroGradients) {
  using T = typename TypeParam::value_type;
  if (is_duplicate_config<TypeParam>()) GTEST_SKIP() << "half is float here";
  const Shape s{1, 50, 20, 2, 24};
  kfa::AttentionOptions opt;
  opt.causal = true;
  opt.team_size = test_team_size<typename TypeParam::space>();
  const Case c = make_case<T>(s, opt, "empty-rows-bwd");
  const FlashOutputs got = run_flash<T, typename TypeParam::space>(c, opt);
  for (int h = 0; h < s.heads; ++h)
    for (int i = 0; i < s.seqlen_q - s.seqlen_k; ++i) {
      EXPECT_TRUE(std::isinf(got.lse.at(0, h, i)) && got.lse.at(0, h, i) < 0) << "row " << i;
      for (int d = 0; d < s.head_dim; ++d) {
        EXPECT_EQ(got.o.at(0, i, h, d), 0.0) << "row " << i;
        EXPECT_EQ(got.dq.at(0, i, h, d), 0.0) << "row " << i;
      }
    }
  check_variant<TypeParam>(s, opt, "empty-rows-bwd");
}

// A tiny scale makes every row the mean of v (forward and backward as the
// oracle); a large one a nearly one-hot softmax (forward as the oracle, with
// the forward bounds, which grow with |scale|; its gradients are as
// ill-conditioned as the scale is large and are left to the finite tests).
TYPED_TEST(NonFinite, ExtremeScales) {
  using T = typename TypeParam::value_type;
  if (is_duplicate_config<TypeParam>()) GTEST_SKIP() << "half is float here";
  const Shape s{1, 33, 47, 2, 16};
  for (double scale : {1e-30, -1e-30}) {
    kfa::AttentionOptions opt;
    opt.softmax_scale = scale;
    check_variant<TypeParam>(s, opt, "scale" + std::to_string(scale));
  }
  for (double scale : {1e3, -1e3}) {
    kfa::AttentionOptions opt;
    opt.softmax_scale = scale;
    opt.team_size = test_team_size<typename TypeParam::space>();
    const Case c = make_case<T>(s, opt, "large-scale");
    const FlashOutputs got = run_flash<T, typename TypeParam::space>(c, opt);
    expect_forward_close<T>(type_name<T>() + " scale " + std::to_string(scale), got.o, got.lse,
                            c.o_ref, c.lse_ref, forward_magnitudes<T>(c));
  }
}

// A packed batch: a NaN in the middle sequence's first row of q or k
// reaches no other sequence (its neighbours' tiles read those rows but mask
// them). v is the documented exception on the Hopper forward, whose bulk
// copies read the next sequence's first rows of v with zero weights: there
// only the sequence after the poisoned one is checked.
TYPED_TEST(NonFinite, PackedSequencesStayApart) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  using Acc = kfa::accumulator_t<T>;
  if (is_duplicate_config<TypeParam>()) GTEST_SKIP() << "half is float here";
  const std::vector<int> lengths{50, 70, 40};
  const std::vector<int> cu = offsets_of(lengths);
  const int total = cu.back(), H = 2, D = 64;
  bool hopper_forward = false;
#ifdef KOKKOS_ENABLE_CUDA
  if constexpr (std::is_same<Space, Kokkos::Cuda>::value)
    hopper_forward = !std::is_same<T, float>::value && !std::is_same<T, double>::value &&
                     kfa::Impl::wgmma_available(Space());
#endif
  kfa::AttentionOptions opt;
  opt.causal = true;
  opt.team_size = test_team_size<Space>();
  Tensor q({total, H, D}), k({total, H, D}), v({total, H, D}), d_o({total, H, D});
  std::mt19937_64 rng(test_seed("nonfinite-packed"));
  for (Tensor* t : {&q, &k, &v, &d_o}) {
    fill_random(*t, rng);
    round_to<T>(*t);
  }
  const auto cu_d = offsets_to_device<Space>(cu, "cu");
  struct Out {
    Tensor o, lse, dq, dk, dv;
  };
  auto run = [&](const Tensor& qq, const Tensor& kk, const Tensor& vv) {
    auto q_d = to_device3<T, Space>(qq, "q");
    auto k_d = to_device3<T, Space>(kk, "k");
    auto v_d = to_device3<T, Space>(vv, "v");
    auto do_d = to_device3<T, Space>(d_o, "d_o");
    DeviceView3<T, Space> o("o", total, H, D), dq("dq", total, H, D), dk("dk", total, H, D),
        dv("dv", total, H, D);
    DeviceView2<Acc, Space> lse("lse", H, total);
    kfa::flash_attention_varlen_forward(Space(), q_d, k_d, v_d, cu_d, cu_d, 70, 70, o, lse,
                                        opt);
    kfa::flash_attention_varlen_backward(Space(), q_d, k_d, v_d, cu_d, cu_d, 70, 70, o, lse,
                                         do_d, dq, dk, dv, opt);
    return Out{to_host(o), to_host(lse), to_host(dq), to_host(dk), to_host(dv)};
  };
  const Out clean = run(q, k, v);
  const double tol = 64 * epsilon<T>();
  for (const Where where : {Where::q, Where::k, Where::v}) {
    Tensor qq = q, kk = k, vv = v;
    Tensor& target = where == Where::q ? qq : where == Where::k ? kk : vv;
    target.data[(std::size_t(cu[1]) * H + 1) * D + kDim] = std::nan("");
    const Out got = run(qq, kk, vv);
    for (const int seq : {0, 2}) {
      if (seq == 0 && where == Where::v && hopper_forward) continue;
      for (int i = cu[seq]; i < cu[seq + 1]; ++i)
        for (int h = 0; h < H; ++h) {
          const std::string at = std::string(name_of(where)) + " poisoned, " + type_name<T>() +
                                 " " + Space::name() + ": sequence " + std::to_string(seq) +
                                 " row " + std::to_string(i) + " head " + std::to_string(h);
          const std::size_t l = std::size_t(h) * total + i;
          EXPECT_EQ(got.lse.data[l], clean.lse.data[l]) << at;
          for (int d = 0; d < D; ++d) {
            const std::size_t e = (std::size_t(i) * H + h) * D + d;
            EXPECT_EQ(got.o.data[e], clean.o.data[e]) << at;
            for (const auto& [a, b] : {std::make_pair(&got.dq, &clean.dq),
                                       std::make_pair(&got.dk, &clean.dk),
                                       std::make_pair(&got.dv, &clean.dv)})
              ASSERT_TRUE(std::isfinite(a->data[e]) &&
                          std::abs(a->data[e] - b->data[e]) <=
                              tol * std::max(1.0, std::abs(b->data[e])))
                  << at << " dim " << d << ": " << a->data[e] << ", clean " << b->data[e];
          }
        }
    }
  }
}

}  // namespace
}  // namespace kfa_test
