// The 16-bit dense products of kfa::nn on CUDA (Impl::tensor_core_gemm,
// cublasGemmEx, and Impl::tensor_core_gemm_bias, cuBLASLt's bias epilogue):
// fp32 accumulation, every transpose, row strides wider than a row, the bias
// added before the one rounding. A product summed in bf16 misses the bound by orders of magnitude at
// k = 300. The host runs these products on fp32 copies (tstNnLowPrecision).

#include "nn_test_helpers.hpp"

#include <Kokkos_Core.hpp>

#include <utility>

#ifdef KOKKOS_ENABLE_CUDA

#include <kfa/detail/backend/cuda/tensor_core_gemm.hpp>

namespace {

using namespace kfa_test;

/// |C - ref| <= (k + 2)·eps_f32·Σ_l |a_il·b_lj| + eps_TC·|ref| (+ tiny floor),
/// elementwise: exact products of the 16-bit inputs, fp32 sums, one rounding
/// into C's type.
template <class TC>
void expect_gemm_close(const std::string& what, const Tensor& got, const Tensor& ref,
                       const Tensor& abs_ref, int k) {
  ASSERT_EQ(got.data.size(), ref.data.size());
  double worst = 0;
  std::size_t worst_at = 0;
  for (std::size_t n = 0; n < ref.data.size(); ++n) {
    const double bound = (k + 2) * epsilon<float>() * abs_ref.data[n] +
                         epsilon<TC>() * std::abs(ref.data[n]) + 1e-30;
    const double ratio = std::abs(got.data[n] - ref.data[n]) / bound;
    if (!(ratio <= worst)) {
      worst = ratio;
      worst_at = n;
    }
  }
  EXPECT_LE(worst, 1.0) << what << ": entry " << worst_at << " got " << got.data[worst_at]
                        << ", reference " << ref.data[worst_at];
}

/// Σ_l op(A)_il·op(B)_lj and Σ_l |op(A)_il·op(B)_lj| in long double, of
/// stored A [m][k] or [k][m] (ta) and B [k][n] or [n][k] (tb).
std::pair<long double, long double> product_sums(const Tensor& a, const Tensor& b, bool ta,
                                                 bool tb, int i, int j, int k) {
  long double s = 0, sa = 0;
  for (int l = 0; l < k; ++l) {
    const double x = ta ? at2(a, l, i) : at2(a, i, l);
    const double y = tb ? at2(b, j, l) : at2(b, l, j);
    s += (long double)x * y;
    sa += std::abs((long double)x * y);
  }
  return {s, sa};
}

template <class T, class TC>
void check_gemm16(bool ta, bool tb, bool strided) {
  using Space = Kokkos::Cuda;
  const int m = 37, n = 29, k = 300, pad = strided ? 5 : 0;
  const std::string tag = std::string("gemm16 ") + (ta ? "T" : "N") + (tb ? "T" : "N");
  std::mt19937_64 rng(test_seed(tag));
  // Stored shapes: A [m][k] or [k][m], B [k][n] or [n][k].
  const Tensor a = rounded<T>(random_tensor({ta ? k : m, ta ? m : k}, rng));
  const Tensor b = rounded<T>(random_tensor({tb ? n : k, tb ? k : n}, rng));
  const Tensor c0 = rounded<TC>(random_tensor({m, n}, rng));
  const double alpha = 0.75, beta = 0.5;
  Tensor ref({m, n}), abs_ref({m, n});
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      const auto [s, sa] = product_sums(a, b, ta, tb, i, j, k);
      at2(ref, i, j) = double(alpha * s + beta * at2(c0, i, j));
      at2(abs_ref, i, j) = double(alpha * sa + std::abs(beta * at2(c0, i, j)));
    }
  using V2 = Kokkos::View<T**, Kokkos::LayoutRight, typename Space::memory_space>;
  using C2 = Kokkos::View<TC**, Kokkos::LayoutRight, typename Space::memory_space>;
  auto widen = [&](const auto& dense, auto tag_view) {
    using W = decltype(tag_view);
    W wide("wide", dense.extent(0), dense.extent(1) + pad);
    Kokkos::deep_copy(wide, typename W::value_type(std::nanf("")));
    auto inner = Kokkos::subview(wide, Kokkos::ALL, std::make_pair(0, int(dense.extent(1))));
    Kokkos::deep_copy(inner, dense);
    return inner;
  };
  const auto av = widen(make_view<V2>(a, "a"), V2());
  const auto bv = widen(make_view<V2>(b, "b"), V2());
  const auto cv = widen(make_view<C2>(c0, "c"), C2());
  static_assert(kfa::Impl::tensor_core_gemm_applies<Space, V2, V2, C2>(), "16-bit operands");
  ASSERT_TRUE(kfa::Impl::tensor_core_gemm(Space(), ta ? "T" : "N", tb ? "T" : "N", float(alpha),
                                          av, bv, float(beta), cv));
  Space().fence();
  C2 dense("c dense", m, n);
  Kokkos::deep_copy(dense, cv);
  expect_gemm_close<TC>(tag + " " + type_name<T>() + " into " + type_name<TC>() + " " +
                            Space::name() + (strided ? " strided" : ""),
                        to_host(dense), ref, abs_ref, k);
}

template <class T, class TC>
void check_all_transposes() {
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (bool strided : {false, true}) check_gemm16<T, TC>(ta, tb, strided);
}

/// C = op(A)·op(B) + bias (+ C) through tensor_core_gemm_bias. With
/// bias_offset the bias starts one element into its buffer (2-byte aligned):
/// cuBLASLt may decline that (false, C untouched), never compute it wrong.
template <class T>
void check_gemm16_bias(bool ta, bool tb, bool strided, bool accumulate, int bias_offset) {
  using Space = Kokkos::Cuda;
  const int m = 37, n = 29, k = 300, pad = strided ? 5 : 0;
  const std::string tag = std::string("gemm16 bias ") + (ta ? "T" : "N") + (tb ? "T" : "N") +
                          (accumulate ? " accumulate" : "") + (strided ? " strided" : "") +
                          (bias_offset ? " offset bias" : "") + " " + type_name<T>();
  std::mt19937_64 rng(test_seed(tag));
  const Tensor a = rounded<T>(random_tensor({ta ? k : m, ta ? m : k}, rng));
  const Tensor b = rounded<T>(random_tensor({tb ? n : k, tb ? k : n}, rng));
  const Tensor c0 = rounded<T>(random_tensor({m, n}, rng));
  const Tensor bias = rounded<T>(random_tensor({n + bias_offset}, rng));
  Tensor ref({m, n}), abs_ref({m, n});
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      const auto [s, sa] = product_sums(a, b, ta, tb, i, j, k);
      const double add = bias.data[j + bias_offset] + (accumulate ? at2(c0, i, j) : 0.0);
      at2(ref, i, j) = double(s + add);
      at2(abs_ref, i, j) = double(sa + std::abs(add));
    }
  using V2 = Kokkos::View<T**, Kokkos::LayoutRight, typename Space::memory_space>;
  using V1 = Kokkos::View<T*, typename Space::memory_space>;
  auto widen = [&](const V2& dense) {
    V2 wide("wide", dense.extent(0), dense.extent(1) + pad);
    Kokkos::deep_copy(wide, T(std::nanf("")));
    auto inner = Kokkos::subview(wide, Kokkos::ALL, std::make_pair(0, int(dense.extent(1))));
    Kokkos::deep_copy(inner, dense);
    return inner;
  };
  const auto av = widen(make_view<V2>(a, "a"));
  const auto bv = widen(make_view<V2>(b, "b"));
  const auto cv = widen(make_view<V2>(c0, "c"));
  const V1 bias_all = make_view<V1>(bias, "bias");
  const auto bias_v = Kokkos::subview(bias_all, std::make_pair(bias_offset, bias_offset + n));
  const bool ran = kfa::Impl::tensor_core_gemm_bias(Space(), ta ? "T" : "N", tb ? "T" : "N", av,
                                                    bv, bias_v, accumulate, cv);
  Space().fence();
  V2 dense("c dense", m, n);
  Kokkos::deep_copy(dense, cv);
  if (!ran) {
    // Declined: C as it was.
    ASSERT_TRUE(bias_offset != 0 || strided) << tag << ": declined an aligned product";
    const Tensor got = to_host(dense);
    for (std::size_t e = 0; e < got.data.size(); ++e)
      ASSERT_EQ(got.data[e], c0.data[e]) << tag << ": declined but wrote C";
    return;
  }
  expect_gemm_close<T>(tag, to_host(dense), ref, abs_ref, k);
}

TEST(TensorCoreGemm, BiasEpilogueRoundsOnce) {
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (bool strided : {false, true})
        for (bool accumulate : {false, true}) {
          check_gemm16_bias<kfa::bfloat16>(ta, tb, strided, accumulate, 0);
          check_gemm16_bias<kfa::half>(ta, tb, strided, accumulate, 0);
        }
  check_gemm16_bias<kfa::bfloat16>(false, true, false, false, 1);
  check_gemm16_bias<kfa::half>(false, true, true, true, 1);
}

TEST(TensorCoreGemm, Bf16AccumulatesInFp32) {
  check_all_transposes<kfa::bfloat16, float>();
  check_all_transposes<kfa::bfloat16, kfa::bfloat16>();
}

TEST(TensorCoreGemm, HalfAccumulatesInFp32) {
  check_all_transposes<kfa::half, float>();
  check_all_transposes<kfa::half, kfa::half>();
}

TEST(TensorCoreGemm, DeclinesColumnStrides) {
  Kokkos::View<kfa::bfloat16**, Kokkos::LayoutLeft, Kokkos::CudaSpace> a("a", 8, 8);
  Kokkos::View<float**, Kokkos::LayoutRight, Kokkos::CudaSpace> c("c", 8, 8);
  EXPECT_FALSE(kfa::Impl::tensor_core_gemm(Kokkos::Cuda(), "N", "N", 1.f, a, a, 0.f, c));
}

}  // namespace

#endif  // KOKKOS_ENABLE_CUDA
