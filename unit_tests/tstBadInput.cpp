// Bad input: std::invalid_argument naming the argument and its expected
// shape, and nothing written to the outputs.

#include "kfa_test_helpers.hpp"

namespace kfa_test {
namespace {

template <class Space>
class BadInput : public ::testing::Test {};
using Spaces = ::testing::Types<
#ifdef KOKKOS_ENABLE_CUDA
    Kokkos::Cuda,
#endif
#ifdef KOKKOS_ENABLE_OPENMP
    Kokkos::OpenMP,
#endif
#ifdef KOKKOS_ENABLE_SERIAL
    Kokkos::Serial
#endif
    >;
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
