#ifndef KFA_DETAIL_BACKEND_CUDA_TENSOR_CORE_GEMM_HPP
#define KFA_DETAIL_BACKEND_CUDA_TENSOR_CORE_GEMM_HPP

// 16-bit dense products on the CUDA backend. Kokkos Kernels' cuBLAS path
// covers float and double only, and its native GEMM accumulates in C's value
// type (bf16 sums lose digits after a few hundred terms); cublasGemmEx runs
// bf16 / fp16 operands on the tensor cores with fp32 accumulation, and
// cublasLtMatmul the products with a bias, added in fp32 by its epilogue
// before the one rounding into C.

#include <Kokkos_Core.hpp>

#ifdef KOKKOS_ENABLE_CUDA

#include <cublas_v2.h>

#include <algorithm>
#include <type_traits>

namespace kfa {
namespace Impl {

/// The calling thread's cuBLAS handle for the current CUDA device, created on
/// first use and destroyed by Kokkos::finalize.
cublasHandle_t cublas_handle();

/// Throws std::runtime_error naming `what` when `status` is not success.
void check_cublas(cublasStatus_t status, const char* what);

/// One column-major cuBLASLt product D = op(A)·op(B) + beta·D + bias(row),
/// bias of D's rows (m), fp32 compute; the operands as cuBLAS sees them.
struct LtBiasProduct {
  bool trans_a, trans_b;
  long long m, n, k, lda, ldb, ldd;
  cudaDataType ab_type, d_type, bias_type;
  const void* a;
  const void* b;
  const void* bias;
  void* d;
  float beta;
  cudaStream_t stream;
};

/// Runs `p` with a cached plan for its shape; false (nothing enqueued) when
/// cuBLASLt offers no algorithm for it, so that the caller falls back.
bool cublaslt_bias_product(const LtBiasProduct& p);

template <class T>
constexpr bool is_cuda_16bit() {
  return std::is_same<T, Kokkos::Experimental::half_t>::value ||
         std::is_same<T, Kokkos::Experimental::bhalf_t>::value;
}

template <class T>
constexpr cudaDataType cuda_data_type() {
  if constexpr (std::is_same<T, Kokkos::Experimental::half_t>::value) return CUDA_R_16F;
  else if constexpr (std::is_same<T, Kokkos::Experimental::bhalf_t>::value) return CUDA_R_16BF;
  else return CUDA_R_32F;
}

/// Whether tensor_core_gemm takes these Views: A and B of one 16-bit type, C
/// of that type or float, on the Cuda execution space.
template <class ExecSpace, class AView, class BView, class CView>
constexpr bool tensor_core_gemm_applies() {
  using TA = typename AView::non_const_value_type;
  using TB = typename BView::non_const_value_type;
  using TC = typename CView::non_const_value_type;
  return std::is_same<ExecSpace, Kokkos::Cuda>::value && is_cuda_16bit<TA>() &&
         std::is_same<TA, TB>::value && (std::is_same<TC, TA>::value || std::is_same<TC, float>::value);
}

/// A row-major product C = op(A)·op(B) as cuBLAS' column-major
/// Cᵀ = op(B)ᵀ·op(A)ᵀ (a row-major matrix is its own transpose read
/// column-major): sizes and leading dimensions, and whether cuBLAS takes
/// them (rows contiguous, 32-bit sizes).
struct ColumnMajorProduct {
  bool ok = false, trans_first = false, trans_second = false;
  long long m = 0, n = 0, k = 0, ld_first = 1, ld_second = 1, ldc = 1;
};

template <class AView, class BView, class CView>
ColumnMajorProduct column_major_product(const char* trans_a, const char* trans_b, const AView& a,
                                        const BView& b, const CView& c) {
  ColumnMajorProduct p;
  if (a.stride(1) != 1 || b.stride(1) != 1 || c.stride(1) != 1) return p;
  const bool ta = trans_a[0] != 'N' && trans_a[0] != 'n';
  const bool tb = trans_b[0] != 'N' && trans_b[0] != 'n';
  auto ld = [](const auto& v) {
    return std::max<long long>(v.extent(0) > 1 ? v.stride(0) : v.extent(1), 1);
  };
  p.trans_first = tb;
  p.trans_second = ta;
  p.m = c.extent(1);
  p.n = c.extent(0);
  p.k = ta ? a.extent(0) : a.extent(1);
  p.ld_first = ld(b);
  p.ld_second = ld(a);
  p.ldc = ld(c);
  // cuBLAS takes 32-bit sizes; larger products go elsewhere.
  const long long limit = 0x7fffffffLL;
  p.ok = p.m <= limit && p.n <= limit && p.k <= limit && p.ld_first <= limit &&
         p.ld_second <= limit && p.ldc <= limit;
  return p;
}

/// C = alpha·op(A)·op(B) + beta·C on Views whose rows are contiguous (stride 1
/// along extent 1; any row stride). Returns false, doing nothing, for other
/// strides: the caller falls back to Kokkos Kernels.
template <class AView, class BView, class CView>
bool tensor_core_gemm(const Kokkos::Cuda& space, const char* trans_a, const char* trans_b,
                      float alpha, const AView& a, const BView& b, float beta, const CView& c) {
  const ColumnMajorProduct p = column_major_product(trans_a, trans_b, a, b, c);
  if (!p.ok) return false;
  using TA = typename AView::non_const_value_type;
  using TC = typename CView::non_const_value_type;
  cublasHandle_t handle = cublas_handle();
  check_cublas(cublasSetStream(handle, space.cuda_stream()), "cublasSetStream");
  check_cublas(cublasGemmEx(handle, p.trans_first ? CUBLAS_OP_T : CUBLAS_OP_N,
                            p.trans_second ? CUBLAS_OP_T : CUBLAS_OP_N, int(p.m), int(p.n),
                            int(p.k), &alpha, b.data(), cuda_data_type<TA>(), int(p.ld_first),
                            a.data(), cuda_data_type<TA>(), int(p.ld_second), &beta, c.data(),
                            cuda_data_type<TC>(), int(p.ldc), CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx");
  return true;
}

/// C = op(A)·op(B) + bias(column) (+ C when accumulate) for 16-bit A, B, C
/// and bias of one type, rounded once (cuBLASLt's bias epilogue). Returns
/// false, doing nothing, where tensor_core_gemm would, or when cuBLASLt has
/// no algorithm for the shape.
template <class AView, class BView, class BiasView, class CView>
bool tensor_core_gemm_bias(const Kokkos::Cuda& space, const char* trans_a, const char* trans_b,
                           const AView& a, const BView& b, const BiasView& bias, bool accumulate,
                           const CView& c) {
  using TA = typename AView::non_const_value_type;
  using TC = typename CView::non_const_value_type;
  static_assert(std::is_same<TA, TC>::value &&
                    std::is_same<typename BiasView::non_const_value_type, TC>::value,
                "tensor_core_gemm_bias: A, B, bias and C of one 16-bit type");
  const ColumnMajorProduct p = column_major_product(trans_a, trans_b, a, b, c);
  // The bias runs along cuBLAS' m (C's columns).
  if (!p.ok || p.k == 0 || bias.stride(0) != 1 || (long long)bias.extent(0) != p.m) return false;
  return cublaslt_bias_product({p.trans_first, p.trans_second, p.m, p.n, p.k, p.ld_first,
                                p.ld_second, p.ldc, cuda_data_type<TA>(), cuda_data_type<TC>(),
                                cuda_data_type<TC>(), b.data(), a.data(), bias.data(), c.data(),
                                accumulate ? 1.f : 0.f, space.cuda_stream()});
}

}  // namespace Impl
}  // namespace kfa

#endif  // KOKKOS_ENABLE_CUDA

#endif
