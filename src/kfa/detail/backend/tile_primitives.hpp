#ifndef KFA_DETAIL_BACKEND_TILE_PRIMITIVES_HPP
#define KFA_DETAIL_BACKEND_TILE_PRIMITIVES_HPP

// Backend facts the traits need, and the inner tile primitives of the fused
// kernels. This folder is the only place where backends differ: the functors
// call these primitives with a backend tag and never branch on the backend.

#include <Kokkos_Core.hpp>

#include <type_traits>

// No loop-carried dependence: lets the host compiler vectorise the inner loops.
#if defined(__GNUC__) && !defined(__CUDACC__) && !defined(__clang__)
#define KFA_PRAGMA_IVDEP _Pragma("GCC ivdep")
#else
#define KFA_PRAGMA_IVDEP
#endif

namespace kfa {
namespace Impl {

/// Tags selecting the inner-loop shape: lanes of a GPU vector, or a host
/// thread walking contiguous rows that the compiler vectorises.
struct GpuTag {};
struct HostTag {};

template <class ExecSpace>
struct is_gpu_space : std::false_type {};
#ifdef KOKKOS_ENABLE_CUDA
template <>
struct is_gpu_space<Kokkos::Cuda> : std::true_type {};
#endif

template <class ExecSpace>
using backend_tag_t = std::conditional_t<is_gpu_space<ExecSpace>::value, GpuTag, HostTag>;

/// out[j] = sum_d a[d] * bt[d * ldb + j] for j < N (a row times a transposed
/// tile). GPU: vector lanes over j, the d loop in registers.
template <int N, int D, class Member, class Acc>
KOKKOS_FORCEINLINE_FUNCTION void row_times_tile_t(GpuTag, const Member& member,
                                                  const Acc* a, const Acc* bt, int ldb,
                                                  Acc* out) {
  Kokkos::parallel_for(Kokkos::ThreadVectorRange(member, N), [&](const int j) {
    Acc s = 0;
    for (int d = 0; d < D; ++d) s += a[d] * bt[d * ldb + j];
    out[j] = s;
  });
}

/// Host: d outer, j inner, so the j loop vectorises without reassociating sums.
template <int N, int D, class Member, class Acc>
KOKKOS_FORCEINLINE_FUNCTION void row_times_tile_t(HostTag, const Member&, const Acc* a,
                                                  const Acc* bt, int ldb, Acc* out) {
  Acc s[N];
  for (int j = 0; j < N; ++j) s[j] = 0;
  for (int d = 0; d < D; ++d) {
    const Acc ad = a[d];
    const Acc* row = bt + d * ldb;
    KFA_PRAGMA_IVDEP
    for (int j = 0; j < N; ++j) s[j] += ad * row[j];
  }
  for (int j = 0; j < N; ++j) out[j] = s[j];
}

/// out[d] = beta * out[d] + sum_{j < n} c[j * ldc] * b[j * D + d] for d < D
/// (a row of coefficients times a row-major tile). GPU: lanes over d.
template <int D, class Member, class Acc>
KOKKOS_FORCEINLINE_FUNCTION void coeffs_times_tile(GpuTag, const Member& member, Acc beta,
                                                   const Acc* c, int ldc, const Acc* b,
                                                   int n, Acc* out) {
  Kokkos::parallel_for(Kokkos::ThreadVectorRange(member, D), [&](const int d) {
    Acc s = beta == Acc(0) ? Acc(0) : beta * out[d];
    for (int j = 0; j < n; ++j) s += c[j * ldc] * b[j * D + d];
    out[d] = s;
  });
}

/// Host: j outer, d inner (contiguous), the d loop vectorises; zero
/// coefficients (masked or underflowed probabilities) are skipped.
template <int D, class Member, class Acc>
KOKKOS_FORCEINLINE_FUNCTION void coeffs_times_tile(HostTag, const Member&, Acc beta,
                                                   const Acc* c, int ldc, const Acc* b,
                                                   int n, Acc* out) {
  if (beta == Acc(0)) {
    for (int d = 0; d < D; ++d) out[d] = 0;
  } else if (beta != Acc(1)) {
    for (int d = 0; d < D; ++d) out[d] *= beta;
  }
  for (int j = 0; j < n; ++j) {
    const Acc cj = c[j * ldc];
    if (cj == Acc(0)) continue;
    const Acc* row = b + j * D;
    KFA_PRAGMA_IVDEP
    for (int d = 0; d < D; ++d) out[d] += cj * row[d];
  }
}

}  // namespace Impl
}  // namespace kfa

#endif
