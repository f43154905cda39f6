#ifndef KFA_DETAIL_COMMON_COMPAT_HPP
#define KFA_DETAIL_COMMON_COMPAT_HPP

// The one place that absorbs differences between Kokkos 3.4 and Kokkos 4.x.
//  - Kokkos 3.4 has no bhalf_t; on host builds its half_t is float itself.
//  - Kokkos 3.4 keeps the math functions in Kokkos::Experimental.
//  - KokkosBlas::gemm takes no execution space instance before Kokkos Kernels 4.

#include <Kokkos_Core.hpp>
#include <KokkosBlas3_gemm.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#define KFA_KOKKOS_4 (KOKKOS_VERSION >= 40000)

namespace kfa {
namespace Impl {

#if KFA_KOKKOS_4
using bfloat16_type = Kokkos::Experimental::bhalf_t;
#else
/// bfloat16 storage for Kokkos versions without bhalf_t: the upper 16 bits of
/// an IEEE float, converted with round-to-nearest-even (NaN stays NaN).
struct bfloat16_type {
  std::uint16_t bits;

  KOKKOS_DEFAULTED_FUNCTION bfloat16_type() = default;
  KOKKOS_INLINE_FUNCTION bfloat16_type(float value) {
    std::uint32_t u;
    std::memcpy(&u, &value, sizeof(u));
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0) {
      bits = static_cast<std::uint16_t>((u >> 16) | 0x0040u);
    } else {
      u += 0x7fffu + ((u >> 16) & 1u);
      bits = static_cast<std::uint16_t>(u >> 16);
    }
  }
  KOKKOS_INLINE_FUNCTION bfloat16_type(double value)
      : bfloat16_type(static_cast<float>(value)) {}
  KOKKOS_INLINE_FUNCTION operator float() const {
    std::uint32_t u = static_cast<std::uint32_t>(bits) << 16;
    float value;
    std::memcpy(&value, &u, sizeof(value));
    return value;
  }
};
#endif

KOKKOS_FORCEINLINE_FUNCTION constexpr int imin(int a, int b) { return a < b ? a : b; }
KOKKOS_FORCEINLINE_FUNCTION constexpr int imax(int a, int b) { return a > b ? a : b; }
KOKKOS_FORCEINLINE_FUNCTION constexpr int iclamp(int x, int lo, int hi) {
  return x < lo ? lo : (x > hi ? hi : x);
}

/// Conversions between a value type and its accumulator, through float for
/// the 16-bit types (their constructors take float).
template <class Acc, class T>
KOKKOS_FORCEINLINE_FUNCTION Acc to_acc(const T& x) {
  return static_cast<Acc>(static_cast<float>(x));
}
template <class Acc>
KOKKOS_FORCEINLINE_FUNCTION Acc to_acc(const double& x) {
  return static_cast<Acc>(x);
}
template <class T, class Acc>
KOKKOS_FORCEINLINE_FUNCTION T from_acc(const Acc& x) {
  if constexpr (std::is_same<T, double>::value || std::is_same<T, float>::value) {
    return static_cast<T>(x);
  } else {
    return T(static_cast<float>(x));
  }
}

namespace math {
#if KFA_KOKKOS_4
using Kokkos::cos;
using Kokkos::erf;
using Kokkos::exp;
using Kokkos::log;
using Kokkos::pow;
using Kokkos::sin;
using Kokkos::sqrt;
using Kokkos::tanh;
#else
using Kokkos::Experimental::cos;
using Kokkos::Experimental::erf;
using Kokkos::Experimental::exp;
using Kokkos::Experimental::log;
using Kokkos::Experimental::pow;
using Kokkos::Experimental::sin;
using Kokkos::Experimental::sqrt;
using Kokkos::Experimental::tanh;
#endif

template <class T>
KOKKOS_FORCEINLINE_FUNCTION constexpr T neg_inf() {
  return static_cast<T>(-INFINITY);
}
}  // namespace math

/// C = alpha·op(A)·op(B) + beta·C through Kokkos Kernels, ordered after the
/// work already enqueued on `space`.
template <class ExecSpace, class AView, class BView, class CView>
void gemm(const ExecSpace& space, const char* trans_a, const char* trans_b,
          typename AView::const_value_type alpha, const AView& a, const BView& b,
          typename CView::const_value_type beta, const CView& c) {
#if KFA_KOKKOS_4
  KokkosBlas::gemm(space, trans_a, trans_b, alpha, a, b, beta, c);
#else
  // Kokkos Kernels 3.4 runs on the default instance of the views' space:
  // order it after `space` and make the result visible to later work on it.
  space.fence();
  KokkosBlas::gemm(trans_a, trans_b, alpha, a, b, beta, c);
  typename CView::execution_space().fence();
#endif
}

/// Kokkos profiling region (what Kokkos Tools users see around each call).
class ProfilingRegion {
 public:
  explicit ProfilingRegion(const std::string& name) { Kokkos::Profiling::pushRegion(name); }
  ~ProfilingRegion() { Kokkos::Profiling::popRegion(); }
  ProfilingRegion(const ProfilingRegion&) = delete;
  ProfilingRegion& operator=(const ProfilingRegion&) = delete;
};

/// Rank of a View type as an int (rank is an integral_constant in Kokkos 4).
template <class ViewType>
constexpr int view_rank() {
  return static_cast<int>(ViewType::rank);
}

}  // namespace Impl
}  // namespace kfa

#endif
