// Tensors of more than 2^31 elements: element offsets past 2^31 (and byte
// offsets past 2^32) in every pointer computation of the kernels that run.
// The first, a middle and the last batch entry (or packed sequence) of a
// call whose tensors hold more than 2^31 elements must equal the same entry
// run alone. They need memory (about 45 GB on a GPU, fp16/bf16 forward and
// backward; about 9 GB on a host, forward only), so they run only with
// KFA_TEST_LARGE=1 in the environment.

#include "kfa_test_helpers.hpp"

#include <cstdlib>

namespace kfa_test {
namespace {

using Space = Kokkos::DefaultExecutionSpace;
using T = kfa::bfloat16;
using Views = EtiViews<Space, T>;
using V4 = Views::V4;
using V3 = Views::V3;
using L3 = Views::L3;
using L2 = Views::L2;
using Cu = Views::Cu;

bool large_tests_enabled() {
  const char* value = std::getenv("KFA_TEST_LARGE");
  return value != nullptr && std::string(value) == "1";
}

/// The shape: one query tile per entry, enough entries for 2^31 + one
/// entry's elements in q (and, on a GPU, in k, v and the gradients).
struct LargeShape {
  int seqlen_q, seqlen_k, heads, head_dim;
  bool backward;
  long batch() const {
    const long per_entry = long(seqlen_q) * heads * head_dim;
    return (long(1) << 31) / per_entry + 1;
  }
};

LargeShape large_shape() {
  if (kfa::Impl::is_gpu_space<Space>::value) return {128, 128, 4, 128, true};
  return {128, 16, 4, 128, false};  // k, v small: q and o alone pass 2^31
}

/// Values in [-1, 1) from a hash of the flat index: no host copy of
/// gigabytes, the same values for the same seed.
template <class View>
void fill_hashed(const View& view, std::uint64_t seed) {
  auto* data = view.data();
  Kokkos::parallel_for(
      "kfa_test::fill_hashed",
      Kokkos::RangePolicy<Space, Kokkos::IndexType<long>>(0, long(view.size())),
      KOKKOS_LAMBDA(const long i) {
        std::uint64_t x = (std::uint64_t(i) + seed) * 0x9E3779B97F4A7C15ull;
        x ^= x >> 31;
        x *= 0xBF58476D1CE4E5B9ull;
        x ^= x >> 29;
        data[i] = kfa::Impl::from_acc<T>(float(x >> 40) * (1.0f / 8388608.0f) - 1.0f);
      });
}

/// Offsets [batch + 1] of `batch` sequences of `length` rows each.
Cu equal_offsets(long batch, int length) {
  Cu cu("cu_seqlens", batch + 1);
  Kokkos::parallel_for(
      "kfa_test::equal_offsets", Kokkos::RangePolicy<Space>(0, int(batch + 1)),
      KOKKOS_LAMBDA(const int b) { cu(b) = b * length; });
  return cu;
}

/// Entry b of a [batch][rows][heads][head_dim] View as its own View.
V4 entry(const V4& big, long b, const char* label) {
  V4 one(std::string(label), 1, big.extent(1), big.extent(2), big.extent(3));
  Kokkos::deep_copy(Kokkos::subview(one, 0, Kokkos::ALL, Kokkos::ALL, Kokkos::ALL),
                    Kokkos::subview(big, b, Kokkos::ALL, Kokkos::ALL, Kokkos::ALL));
  return one;
}

template <class View>
Tensor entry_on_host(const View& big, long b) {
  if constexpr (View::rank == 4)
    return to_host(Kokkos::subview(big, b, Kokkos::ALL, Kokkos::ALL, Kokkos::ALL));
  else
    return to_host(Kokkos::subview(big, b, Kokkos::ALL, Kokkos::ALL));
}

/// Entry `b` of a big call's output against the same entry run alone,
/// within `tolerance` of max |x| (the kernels may differ in tile schedule
/// and in the order dQ sums key blocks; a wrong offset reads other data and
/// misses by O(1)); and not all zero.
void expect_entry(const char* name, long b, const Tensor& big, const Tensor& alone,
                  double tolerance) {
  const double scale = max_abs(alone);
  EXPECT_GT(scale, 0) << name << " of entry " << b << " is all zero";
  EXPECT_LE(max_abs_diff(big, alone), tolerance * scale)
      << name << " of entry " << b << " differs from the entry run alone";
}

TEST(LargeTensors, BatchPast2To31Elements) {
  if (!large_tests_enabled()) GTEST_SKIP() << "set KFA_TEST_LARGE=1 (needs ~45 GB on a GPU)";
  const LargeShape s = large_shape();
  const long batch = s.batch();
  V4 q("q", batch, s.seqlen_q, s.heads, s.head_dim), k("k", batch, s.seqlen_k, s.heads, s.head_dim),
      v("v", batch, s.seqlen_k, s.heads, s.head_dim), o("o", batch, s.seqlen_q, s.heads, s.head_dim);
  L3 lse("lse", batch, s.heads, s.seqlen_q);
  ASSERT_GT(q.size(), std::size_t(1) << 31);
  fill_hashed(q, 1);
  fill_hashed(k, 2);
  fill_hashed(v, 3);
  kfa::AttentionOptions opt;
  opt.causal = true;
  kfa::flash_attention_forward(Space(), q, k, v, o, lse, opt);
  V4 d_o, dq, dk, dv;
  if (s.backward) {
    d_o = V4("d_o", batch, s.seqlen_q, s.heads, s.head_dim);
    dq = V4("dq", batch, s.seqlen_q, s.heads, s.head_dim);
    dk = V4("dk", batch, s.seqlen_k, s.heads, s.head_dim);
    dv = V4("dv", batch, s.seqlen_k, s.heads, s.head_dim);
    fill_hashed(d_o, 4);
    kfa::flash_attention_backward(Space(), q, k, v, o, lse, d_o, dq, dk, dv, opt);
  }
  Space().fence();
  for (const long b : {long(0), batch / 2, batch - 1}) {
    const V4 q1 = entry(q, b, "q1"), k1 = entry(k, b, "k1"), v1 = entry(v, b, "v1");
    V4 o1("o1", 1, s.seqlen_q, s.heads, s.head_dim);
    L3 lse1("lse1", 1, s.heads, s.seqlen_q);
    kfa::flash_attention_forward(Space(), q1, k1, v1, o1, lse1, opt);
    expect_entry("o", b, entry_on_host(o, b), entry_on_host(o1, 0), 2 * epsilon<T>());
    expect_entry("lse", b, entry_on_host(lse, b), entry_on_host(lse1, 0), 1e-5);
    if (!s.backward) continue;
    const V4 do1 = entry(d_o, b, "do1");
    V4 dq1("dq1", 1, s.seqlen_q, s.heads, s.head_dim), dk1("dk1", 1, s.seqlen_k, s.heads, s.head_dim),
        dv1("dv1", 1, s.seqlen_k, s.heads, s.head_dim);
    kfa::flash_attention_backward(Space(), q1, k1, v1, o1, lse1, do1, dq1, dk1, dv1, opt);
    // dQ sums key blocks in an order the GPU picks: a few bf16 ulps apart.
    expect_entry("dq", b, entry_on_host(dq, b), entry_on_host(dq1, 0), 4 * epsilon<T>());
    expect_entry("dk", b, entry_on_host(dk, b), entry_on_host(dk1, 0), 4 * epsilon<T>());
    expect_entry("dv", b, entry_on_host(dv, b), entry_on_host(dv1, 0), 4 * epsilon<T>());
  }
}

/// The same shape as one packed batch of equal lengths: packed rows whose
/// element offsets pass 2^31, checked against each sequence run alone.
TEST(LargeTensors, PackedBatchPast2To31Elements) {
  if (!large_tests_enabled()) GTEST_SKIP() << "set KFA_TEST_LARGE=1 (needs ~45 GB on a GPU)";
  const LargeShape s = large_shape();
  const long batch = s.batch();
  const long rows_q = batch * s.seqlen_q, rows_k = batch * s.seqlen_k;
  V3 q("q", rows_q, s.heads, s.head_dim), k("k", rows_k, s.heads, s.head_dim),
      v("v", rows_k, s.heads, s.head_dim), o("o", rows_q, s.heads, s.head_dim);
  L2 lse("lse", s.heads, rows_q);
  fill_hashed(q, 1);
  fill_hashed(k, 2);
  fill_hashed(v, 3);
  const int nq = s.seqlen_q, nk = s.seqlen_k;
  const Cu cu_q = equal_offsets(batch, nq), cu_k = equal_offsets(batch, nk);
  kfa::AttentionOptions opt;
  opt.causal = true;
  kfa::flash_attention_varlen_forward(Space(), q, k, v, cu_q, cu_k, nq, nk, o, lse, opt);
  V3 d_o, dq, dk, dv;
  if (s.backward) {
    d_o = V3("d_o", rows_q, s.heads, s.head_dim);
    dq = V3("dq", rows_q, s.heads, s.head_dim);
    dk = V3("dk", rows_k, s.heads, s.head_dim);
    dv = V3("dv", rows_k, s.heads, s.head_dim);
    fill_hashed(d_o, 4);
    kfa::flash_attention_varlen_backward(Space(), q, k, v, cu_q, cu_k, nq, nk, o, lse, d_o, dq,
                                         dk, dv, opt);
  }
  Space().fence();
  const auto rows = [](const V3& big, long b, int n) {
    return Kokkos::subview(big, std::make_pair(b * n, (b + 1) * n), Kokkos::ALL, Kokkos::ALL);
  };
  const auto alone = [&](const V3& big, long b, int n, const char* label) {
    V4 one(std::string(label), 1, n, s.heads, s.head_dim);
    Kokkos::deep_copy(Kokkos::subview(one, 0, Kokkos::ALL, Kokkos::ALL, Kokkos::ALL),
                      rows(big, b, n));
    return one;
  };
  for (const long b : {long(0), batch / 2, batch - 1}) {
    const V4 q1 = alone(q, b, nq, "q1"), k1 = alone(k, b, nk, "k1"), v1 = alone(v, b, nk, "v1");
    V4 o1("o1", 1, nq, s.heads, s.head_dim);
    L3 lse1("lse1", 1, s.heads, nq);
    kfa::flash_attention_forward(Space(), q1, k1, v1, o1, lse1, opt);
    expect_entry("o", b, to_host(rows(o, b, nq)), entry_on_host(o1, 0), 2 * epsilon<T>());
    // A column range of lse is strided: gathered on the device first (no
    // copy mechanism moves a strided View between spaces).
    L2 lse_b("lse_b", s.heads, nq);
    Kokkos::deep_copy(lse_b,
                      Kokkos::subview(lse, Kokkos::ALL, std::make_pair(b * nq, (b + 1) * nq)));
    expect_entry("lse", b, to_host(lse_b), entry_on_host(lse1, 0), 1e-5);
    if (!s.backward) continue;
    const V4 do1 = alone(d_o, b, nq, "do1");
    V4 dq1("dq1", 1, nq, s.heads, s.head_dim), dk1("dk1", 1, nk, s.heads, s.head_dim),
        dv1("dv1", 1, nk, s.heads, s.head_dim);
    kfa::flash_attention_backward(Space(), q1, k1, v1, o1, lse1, do1, dq1, dk1, dv1, opt);
    expect_entry("dq", b, to_host(rows(dq, b, nq)), entry_on_host(dq1, 0), 4 * epsilon<T>());
    expect_entry("dk", b, to_host(rows(dk, b, nk)), entry_on_host(dk1, 0), 4 * epsilon<T>());
    expect_entry("dv", b, to_host(rows(dv, b, nk)), entry_on_host(dv1, 0), 4 * epsilon<T>());
  }
}

}  // namespace
}  // namespace kfa_test
