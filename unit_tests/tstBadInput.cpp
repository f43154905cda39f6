// Bad input: std::invalid_argument naming the argument and its expected
// shape (or the valid range of an option, or what is wrong with the
// offsets of a packed batch), and nothing written to the outputs.

#include "kfa_test_helpers.hpp"

namespace kfa_test {
namespace {

template <class Space>
class BadInput : public ::testing::Test {};
using Spaces = AllSpaces;
TYPED_TEST_SUITE(BadInput, Spaces);

/// Expects f() to throw std::invalid_argument whose message contains every
/// string in `needles`.
template <class F>
void expect_invalid(F&& f, std::initializer_list<const char*> needles) {
  try {
    f();
    ADD_FAILURE() << "no exception thrown";
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    for (const char* n : needles)
      EXPECT_NE(msg.find(n), std::string::npos) << "message '" << msg << "' lacks '" << n << "'";
  }
}

template <class ViewType>
void expect_untouched(const ViewType& view, double sentinel) {
  const Tensor t = to_host(view);
  for (double x : t.data) ASSERT_EQ(x, sentinel) << "an output was written";
}

template <class Space>
struct Fixture {
  using V4 = DeviceView4<float, Space>;
  using V3 = DeviceView3<float, Space>;
  V4 q{"q", 2, 10, 3, 16}, k{"k", 2, 12, 3, 16}, v{"v", 2, 12, 3, 16}, o{"o", 2, 10, 3, 16};
  V3 lse{"lse", 2, 3, 10};
  V4 d_o{"d_o", 2, 10, 3, 16}, dq{"dq", 2, 10, 3, 16}, dk{"dk", 2, 12, 3, 16},
      dv{"dv", 2, 12, 3, 16};
  Fixture() {
    Kokkos::deep_copy(o, 7.0f);
    Kokkos::deep_copy(lse, 7.0f);
    Kokkos::deep_copy(dq, 7.0f);
    Kokkos::deep_copy(dk, 7.0f);
    Kokkos::deep_copy(dv, 7.0f);
  }
  void untouched() const {
    expect_untouched(o, 7.0);
    expect_untouched(lse, 7.0);
    expect_untouched(dq, 7.0);
    expect_untouched(dk, 7.0);
    expect_untouched(dv, 7.0);
  }
};

TYPED_TEST(BadInput, ForwardExtents) {
  using Space = TypeParam;
  Fixture<Space> f;
  using V4 = typename Fixture<Space>::V4;
  using V3 = typename Fixture<Space>::V3;
  V4 k_bad_dim("k", 2, 12, 3, 8), v_bad_len("v", 2, 11, 3, 16), o_bad("o", 2, 10, 4, 16);
  V3 lse_bad("lse", 2, 10, 3);
  expect_invalid([&] { kfa::flash_attention_forward(Space(), f.q, k_bad_dim, f.v, f.o, f.lse); },
                 {"kfa::flash_attention_forward", "k must be", "[2][12][3][16]", "[2][12][3][8]"});
  expect_invalid([&] { kfa::flash_attention_forward(Space(), f.q, f.k, v_bad_len, f.o, f.lse); },
                 {"v must be", "[batch][seqlen_k][heads_kv][head_dim]"});
  expect_invalid([&] { kfa::flash_attention_forward(Space(), f.q, f.k, f.v, o_bad, f.lse); },
                 {"o must be", "[2][10][3][16]"});
  expect_invalid([&] { kfa::flash_attention_forward(Space(), f.q, f.k, f.v, f.o, lse_bad); },
                 {"lse must be", "[batch][heads][seqlen_q]", "[2][3][10]"});
  expect_invalid(
      [&] { kfa::standard_attention_forward(Space(), f.q, f.k, f.v, f.o, lse_bad); },
      {"kfa::standard_attention_forward", "lse must be"});
  f.untouched();
}

TYPED_TEST(BadInput, ForwardHeadDimRankLayout) {
  using Space = TypeParam;
  Fixture<Space> f;
  using V4 = typename Fixture<Space>::V4;
  V4 q_big("q", 1, 4, 1, 257), k_big("k", 1, 4, 1, 257), v_big("v", 1, 4, 1, 257),
      o_big("o", 1, 4, 1, 257);
  typename Fixture<Space>::V3 lse_big("lse", 1, 1, 4);
  expect_invalid(
      [&] { kfa::flash_attention_forward(Space(), q_big, k_big, v_big, o_big, lse_big); },
      {"head_dim", "1..256", "257"});
  DeviceView3<float, Space> q_rank3("q", 2, 10, 16);
  expect_invalid([&] { kfa::flash_attention_forward(Space(), q_rank3, f.k, f.v, f.o, f.lse); },
                 {"q must be a rank-4 View", "[batch][seqlen_q][heads][head_dim]"});
  Kokkos::View<float****, Kokkos::LayoutLeft, typename Space::memory_space> k_left("k", 2, 12,
                                                                                     3, 16);
  expect_invalid([&] { kfa::flash_attention_forward(Space(), f.q, k_left, f.v, f.o, f.lse); },
                 {"k", "LayoutRight"});
  f.untouched();
}

TYPED_TEST(BadInput, ForwardOptionsAndAliasing) {
  using Space = TypeParam;
  Fixture<Space> f;
  kfa::AttentionOptions opt;
  opt.softmax_scale = std::numeric_limits<double>::quiet_NaN();
  expect_invalid([&] { kfa::flash_attention_forward(Space(), f.q, f.k, f.v, f.o, f.lse, opt); },
                 {"softmax_scale"});
  opt = {};
  opt.team_size = -1;
  expect_invalid([&] { kfa::flash_attention_forward(Space(), f.q, f.k, f.v, f.o, f.lse, opt); },
                 {"team_size"});
  Kokkos::deep_copy(f.q, 7.0f);
  expect_invalid([&] { kfa::flash_attention_forward(Space(), f.q, f.k, f.v, f.q, f.lse); },
                 {"overlap"});
  expect_untouched(f.q, 7.0);
  f.untouched();
}

TYPED_TEST(BadInput, BackwardExtents) {
  using Space = TypeParam;
  Fixture<Space> f;
  using V4 = typename Fixture<Space>::V4;
  V4 dq_bad("dq", 2, 10, 3, 15), dk_bad("dk", 2, 10, 3, 16), dv_bad("dv", 1, 12, 3, 16),
      do_bad("d_o", 2, 12, 3, 16);
  auto bwd = [&](const V4& d_o, const V4& dq, const V4& dk, const V4& dv) {
    kfa::flash_attention_backward(Space(), f.q, f.k, f.v, f.o, f.lse, d_o, dq, dk, dv);
  };
  expect_invalid([&] { bwd(f.d_o, dq_bad, f.dk, f.dv); },
                 {"kfa::flash_attention_backward", "dq must be", "[2][10][3][16]"});
  expect_invalid([&] { bwd(f.d_o, f.dq, dk_bad, f.dv); }, {"dk must be", "[2][12][3][16]"});
  expect_invalid([&] { bwd(f.d_o, f.dq, f.dk, dv_bad); }, {"dv must be"});
  expect_invalid([&] { bwd(do_bad, f.dq, f.dk, f.dv); }, {"d_o must be"});
  expect_invalid([&] { bwd(f.d_o, f.dq, f.dk, f.dk); }, {"overlap"});
  DeviceView3<float, Space> dk_rank3("dk", 2, 12, 48);
  expect_invalid(
      [&] {
        kfa::flash_attention_backward(Space(), f.q, f.k, f.v, f.o, f.lse, f.d_o, f.dq,
                                      dk_rank3, f.dv);
      },
      {"dk must be a rank-4 View"});
  f.untouched();
}

TYPED_TEST(BadInput, VariantOptions) {
  using Space = TypeParam;
  Fixture<Space> f;
  auto fwd = [&](const kfa::AttentionOptions& opt) {
    kfa::flash_attention_forward(Space(), f.q, f.k, f.v, f.o, f.lse, opt);
  };
  auto bwd = [&](const kfa::AttentionOptions& opt) {
    kfa::flash_attention_backward(Space(), f.q, f.k, f.v, f.o, f.lse, f.d_o, f.dq, f.dk, f.dv,
                                  opt);
  };
  auto std_fwd = [&](const kfa::AttentionOptions& opt) {
    kfa::standard_attention_forward(Space(), f.q, f.k, f.v, f.o, f.lse, opt);
  };
  kfa::AttentionOptions opt;
  opt.window_left = -2;
  expect_invalid([&] { fwd(opt); }, {"window_left", "-1 for an unbounded side", "(-2, -1)"});
  opt = {};
  opt.window_right = -5;
  opt.causal = true;
  expect_invalid([&] { bwd(opt); }, {"kfa::flash_attention_backward", "window_right", "-5"});
  for (const double p : {1.0, -0.1, 1.5, std::numeric_limits<double>::quiet_NaN()}) {
    opt = {};
    opt.dropout_p = p;
    expect_invalid([&] { fwd(opt); }, {"dropout_p", "[0, 1)"});
    expect_invalid([&] { bwd(opt); }, {"dropout_p"});
    expect_invalid([&] { std_fwd(opt); }, {"kfa::standard_attention_forward", "dropout_p"});
  }
  for (const double c : {-1.0, -1e-30, std::numeric_limits<double>::infinity(),
                         std::numeric_limits<double>::quiet_NaN()}) {
    opt = {};
    opt.softcap = c;
    expect_invalid([&] { fwd(opt); }, {"softcap", ">= 0"});
    expect_invalid([&] { bwd(opt); }, {"softcap"});
  }
  opt = {};
  opt.dropout_p = 1;
  Kokkos::View<std::uint8_t****, Kokkos::LayoutRight, typename Space::memory_space> mask(
      "mask", 1, 1, 2, 2);
  expect_invalid([&] { kfa::dropout_mask(Space(), mask, opt); },
                 {"kfa::dropout_mask", "dropout_p"});
  f.untouched();
}

TYPED_TEST(BadInput, GroupedQueryHeads) {
  using Space = TypeParam;
  Fixture<Space> f;
  using V4 = typename Fixture<Space>::V4;
  // 3 query heads cannot share 2 key/value heads.
  V4 k2("k", 2, 12, 2, 16), v2("v", 2, 12, 2, 16);
  expect_invalid([&] { kfa::flash_attention_forward(Space(), f.q, k2, v2, f.o, f.lse); },
                 {"heads of q (3)", "multiple of heads_kv", "(2)"});
  expect_invalid(
      [&] {
        kfa::flash_attention_backward(Space(), f.q, k2, v2, f.o, f.lse, f.d_o, f.dq, f.dk, f.dv);
      },
      {"multiple of heads_kv"});
  // One key/value head (multi-query): v and dk must follow k's heads.
  V4 k1("k", 2, 12, 1, 16), v1("v", 2, 12, 1, 16);
  expect_invalid([&] { kfa::flash_attention_forward(Space(), f.q, k1, f.v, f.o, f.lse); },
                 {"v must be", "[batch][seqlen_k][heads_kv][head_dim]", "[2][12][1][16]"});
  expect_invalid(
      [&] {
        kfa::flash_attention_backward(Space(), f.q, k1, v1, f.o, f.lse, f.d_o, f.dq, f.dk, f.dv);
      },
      {"dk must be", "[2][12][1][16]", "[2][12][3][16]"});
  f.untouched();
}

TYPED_TEST(BadInput, PackedOffsets) {
  using Space = TypeParam;
  using mem = typename Space::memory_space;
  using V3 = DeviceView3<float, Space>;
  using V2 = DeviceView2<float, Space>;
  using Cu = Kokkos::View<int*, mem>;
  // Two sequences: 4 + 6 query rows, 5 + 7 keys.
  V3 q("q", 10, 3, 16), k("k", 12, 3, 16), v("v", 12, 3, 16), o("o", 10, 3, 16),
      d_o("d_o", 10, 3, 16), dq("dq", 10, 3, 16), dk("dk", 12, 3, 16), dv("dv", 12, 3, 16);
  V2 lse("lse", 3, 10);
  for (const auto& out : {o, dq, dk, dv}) Kokkos::deep_copy(out, 7.0f);
  Kokkos::deep_copy(lse, 7.0f);
  auto offsets = [](std::vector<int> values) {
    return offsets_to_device<Space>(values, "cu_seqlens");
  };
  const Cu cu_q = offsets({0, 4, 10}), cu_k = offsets({0, 5, 12});
  auto fwd = [&](const Cu& cq, const Cu& ck, int max_q, int max_k) {
    kfa::flash_attention_varlen_forward(Space(), q, k, v, cq, ck, max_q, max_k, o, lse);
  };
  auto bwd = [&](const Cu& cq, const Cu& ck, int max_q, int max_k) {
    kfa::flash_attention_varlen_backward(Space(), q, k, v, cq, ck, max_q, max_k, o, lse, d_o, dq,
                                         dk, dv);
  };
  expect_invalid([&] { fwd(offsets({0, 6, 4, 10}), offsets({0, 5, 6, 12}), 10, 10); },
                 {"kfa::flash_attention_varlen_forward", "cu_seqlens_q", "non-decreasing",
                  "cu_seqlens_q[1] = 6 > cu_seqlens_q[2] = 4"});
  expect_invalid([&] { bwd(cu_q, offsets({0, 7, 5}), 10, 10); },
                 {"kfa::flash_attention_varlen_backward", "cu_seqlens_k", "non-decreasing"});
  expect_invalid([&] { fwd(offsets({1, 4, 10}), cu_k, 10, 10); },
                 {"cu_seqlens_q", "must start at 0", "got cu_seqlens_q[0] = 1"});
  expect_invalid([&] { fwd(offsets({0, 4, 9}), cu_k, 10, 10); },
                 {"must end at total_q (q.extent(0)) = 10", "cu_seqlens_q[2] = 9"});
  expect_invalid([&] { fwd(cu_q, offsets({0, 5, 13}), 10, 10); },
                 {"cu_seqlens_k", "must end at total_k (k.extent(0)) = 12", "13"});
  expect_invalid([&] { fwd(cu_q, cu_k, 5, 10); },
                 {"cu_seqlens_q", "length 6", "max_seqlen_q = 5"});
  expect_invalid([&] { bwd(cu_q, cu_k, 10, 6); }, {"cu_seqlens_k", "length 7", "max_seqlen_k = 6"});
  expect_invalid([&] { fwd(cu_q, offsets({0, 12}), 10, 12); },
                 {"cu_seqlens_q and cu_seqlens_k must both be [batch + 1]", "[3] and [2]"});
  expect_invalid([&] { fwd(cu_q, cu_k, -1, 10); }, {"max_seqlen_q", ">= 0"});
  V2 lse_bad("lse", 10, 3);
  expect_invalid(
      [&] {
        kfa::flash_attention_varlen_forward(Space(), q, k, v, cu_q, cu_k, 6, 7, o, lse_bad);
      },
      {"lse must be", "[heads][total_q]", "[3][10]"});
  V3 k_bad("k", 12, 2, 16);
  expect_invalid(
      [&] { kfa::flash_attention_varlen_forward(Space(), q, k_bad, k_bad, cu_q, cu_k, 6, 7, o, lse); },
      {"multiple of heads_kv"});
  Kokkos::View<int**, mem> cu_rank2("cu", 3, 1);
  expect_invalid(
      [&] { kfa::flash_attention_varlen_forward(Space(), q, k, v, cu_rank2, cu_k, 6, 7, o, lse); },
      {"cu_seqlens_q must be a rank-1 View"});
  expect_invalid(
      [&] {
        kfa::standard_attention_varlen_forward(Space(), q, k, v, offsets({0, 11, 10}), cu_k, 11,
                                               7, o, lse);
      },
      {"kfa::standard_attention_varlen_forward", "non-decreasing"});
  // A valid call goes through (and writes).
  fwd(cu_q, cu_k, 6, 7);
  Space().fence();
  EXPECT_NE(to_host(o).data[0], 7.0);
  Kokkos::deep_copy(o, 7.0f);
  Kokkos::deep_copy(lse, 7.0f);
  for (const auto& out : {o, dq, dk, dv}) expect_untouched(out, 7.0);
  expect_untouched(lse, 7.0);
}

TYPED_TEST(BadInput, AlibiSlopesShape) {
  using Space = TypeParam;
  Fixture<Space> f;
  Kokkos::View<float*, typename Space::memory_space> per_head("slopes", 2);
  Kokkos::View<float**, Kokkos::LayoutRight, typename Space::memory_space> per_batch("slopes", 3, 3);
  expect_invalid(
      [&] {
        kfa::flash_attention_forward(Space(), f.q, f.k, f.v, f.o, f.lse, {}, kfa::alibi(per_head));
      },
      {"ALiBi slopes must be [heads] = [3] or [batch][heads] = [2][3]", "got [2]"});
  expect_invalid(
      [&] {
        kfa::flash_attention_backward(Space(), f.q, f.k, f.v, f.o, f.lse, f.d_o, f.dq, f.dk, f.dv,
                                      {}, kfa::alibi(per_batch));
      },
      {"got [3][3]"});
  f.untouched();
}

// Extents the kernels cannot index (int rows, heads and batch entries, an
// int league of tiles) are refused before anything is read: Views over no
// memory with those extents.
TYPED_TEST(BadInput, IndexLimits) {
  using Space = TypeParam;
  using V4 = DeviceView4<float, Space>;
  using V3 = DeviceView3<float, Space>;
  const std::size_t big = std::size_t(1) << 31;
  float* none = nullptr;
  {
    V4 q(none, 1, big, 1, 8), k(none, 1, 4, 1, 8), v(none, 1, 4, 1, 8), o(none, 1, big, 1, 8);
    V3 lse(none, 1, 1, big);
    expect_invalid([&] { kfa::flash_attention_forward(Space(), q, k, v, o, lse); },
                   {"seqlen_q (q's extent 1) must be below 2^31", "got 2147483648"});
  }
  {
    // 2^16 entries x 2^10 heads x 2^5 blocks of 64 rows: 2^31 tiles.
    const std::size_t batch = 1 << 16, heads = 1 << 10, rows = 2048;
    V4 q(none, batch, rows, heads, 1), k(none, batch, 4, heads, 1), v(none, batch, 4, heads, 1),
        o(none, batch, rows, heads, 1), d_o(none, batch, rows, heads, 1),
        dq(none, batch, rows, heads, 1), dk(none, batch, 4, heads, 1),
        dv(none, batch, 4, heads, 1);
    V3 lse(none, batch, heads, rows);
    expect_invalid(
        [&] { kfa::flash_attention_backward(Space(), q, k, v, o, lse, d_o, dq, dk, dv); },
        {"batch * heads * ceil(seqlen_q / 64) must be below 2^31"});
  }
  {
    V3 q(none, big, 1, 8), k(none, 4, 1, 8), v(none, 4, 1, 8), o(none, big, 1, 8);
    DeviceView2<float, Space> lse(none, 1, big);
    Kokkos::View<int*, typename Space::memory_space> cu("cu_seqlens", 2);
    expect_invalid(
        [&] { kfa::flash_attention_varlen_forward(Space(), q, k, v, cu, cu, 1, 1, o, lse); },
        {"total_q (q's extent 0) must be below 2^31"});
  }
}

#ifdef KOKKOS_ENABLE_CUDA
TEST(BadInputCuda, HostViewsOnTheDevice) {
  Kokkos::View<float****, Kokkos::LayoutRight, Kokkos::HostSpace> q("q", 1, 4, 1, 8),
      k("k", 1, 4, 1, 8), v("v", 1, 4, 1, 8), o("o", 1, 4, 1, 8);
  Kokkos::View<float***, Kokkos::LayoutRight, Kokkos::HostSpace> lse("lse", 1, 1, 4);
  Kokkos::deep_copy(o, 7.0f);
  expect_invalid([&] { kfa::flash_attention_forward(Kokkos::Cuda(), q, k, v, o, lse); },
                 {"q", "cannot access"});
  expect_untouched(o, 7.0);
}
#endif

}  // namespace
}  // namespace kfa_test
