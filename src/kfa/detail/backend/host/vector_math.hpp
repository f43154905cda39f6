#ifndef KFA_DETAIL_BACKEND_HOST_VECTOR_MATH_HPP
#define KFA_DETAIL_BACKEND_HOST_VECTOR_MATH_HPP

// What the host kernels need for the compiler to vectorise them: the vector
// width the build targets, a loop pragma, and an exponential written without
// calls or branches (std::exp is a library call the loop vectoriser cannot
// inline without -ffast-math).

#include <kfa/kfa_config.hpp>

#include <cstdint>
#include <cstring>
#include <type_traits>

// A loop whose iterations are independent (and whose reductions may be
// reassociated): `omp simd` where OpenMP SIMD is on, else GCC's ivdep.
#if defined(_OPENMP) || defined(KFA_OPENMP_SIMD)
#define KFA_HOST_SIMD _Pragma("omp simd")
#define KFA_HOST_SIMD_REDUCTION(op, var) _Pragma(KFA_HOST_STRINGIFY(omp simd reduction(op : var)))
#define KFA_HOST_STRINGIFY(x) #x
#elif defined(__GNUC__) && !defined(__clang__)
#define KFA_HOST_SIMD _Pragma("GCC ivdep")
#define KFA_HOST_SIMD_REDUCTION(op, var)
#else
#define KFA_HOST_SIMD
#define KFA_HOST_SIMD_REDUCTION(op, var)
#endif

namespace kfa {
namespace Impl {
namespace Host {

/// Bytes of one vector register of the ISA the build targets.
#if defined(__AVX512F__)
constexpr int kVectorBytes = 64;
#elif defined(__AVX__)
constexpr int kVectorBytes = 32;
#else
constexpr int kVectorBytes = 16;
#endif

template <class T>
constexpr int vector_lanes() {
  return kVectorBytes / int(sizeof(T));
}

// Forced inlining of the register-block loops: a call boundary would put
// the accumulators back in memory.
#if defined(__GNUC__)
#define KFA_HOST_INLINE inline __attribute__((always_inline))
#else
#define KFA_HOST_INLINE inline
#endif

/// One vector register of T. GCC and Clang (and the compilers that take
/// their extensions) get a vector type, which stays in a register where an
/// array of T indexed in a loop would not; elsewhere an array whose loops
/// the compiler vectorises. Only what the micro kernel needs: zero, load,
/// store, and acc += scalar · vector.
#if defined(__GNUC__)
template <class T>
struct VectorRegister {
  typedef T type __attribute__((vector_size(kVectorBytes)));
};
template <class T>
using Vec = typename VectorRegister<T>::type;

template <class T>
KFA_HOST_INLINE Vec<T> vec_zero() {
  return Vec<T>{};
}
template <class T>
KFA_HOST_INLINE void vec_fma(Vec<T>& acc, T a, const Vec<T>& b) {
  acc += a * b;
}
#else
template <class T>
struct Vec {
  T lane[vector_lanes<T>()];
};

template <class T>
KFA_HOST_INLINE Vec<T> vec_zero() {
  Vec<T> v;
  for (int l = 0; l < vector_lanes<T>(); ++l) v.lane[l] = T(0);
  return v;
}
template <class T>
KFA_HOST_INLINE void vec_fma(Vec<T>& acc, T a, const Vec<T>& b) {
  KFA_HOST_SIMD
  for (int l = 0; l < vector_lanes<T>(); ++l) acc.lane[l] += a * b.lane[l];
}
#endif

/// Unaligned load and store of vector_lanes<T>() elements.
template <class T>
KFA_HOST_INLINE Vec<T> vec_load(const T* p) {
  Vec<T> v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
template <class T>
KFA_HOST_INLINE void vec_store(T* p, const Vec<T>& v) {
  std::memcpy(p, &v, sizeof(v));
}

template <class T>
struct ExpConstants;
template <>
struct ExpConstants<float> {
  using bits_t = std::uint32_t;
  static constexpr int kMantissa = 23, kDegree = 7;
  // exp(lo) is the smallest normal float; below it the result is 0.
  static constexpr float kLo = -87.33654f, kHi = 88.37626f;
  // 1.5 * 2^23 + 127: adding it rounds to an integer n and leaves n plus the
  // exponent bias in the low mantissa bits.
  static constexpr float kShifter = 12583039.0f;
  // ln 2 = kLn2Hi + kLn2Lo, kLn2Hi with trailing zero bits so n·kLn2Hi is exact.
  static constexpr float kLn2Hi = 0.693145751953125f, kLn2Lo = 1.428606820309417232e-06f;
};
template <>
struct ExpConstants<double> {
  using bits_t = std::uint64_t;
  static constexpr int kMantissa = 52, kDegree = 13;
  static constexpr double kLo = -708.3964185322641, kHi = 709.782712893384;
  static constexpr double kShifter = 6755399441056767.0;  // 1.5 * 2^52 + 1023
  static constexpr double kLn2Hi = 6.93147180369123816490e-01,
                          kLn2Lo = 1.90821492927058770002e-10;
};

/// The exponential's Taylor coefficients 1/k!, k = 0..Degree, as constants.
template <class T, int Degree>
struct TaylorCoefficients {
  T c[Degree + 1];
  constexpr TaylorCoefficients() : c() {
    long double f = 1;
    for (int k = 0; k <= Degree; ++k) {
      if (k > 1) f /= k;
      c[k] = static_cast<T>(f);
    }
  }
};

/// exp(x) within a few ulp for x >= lo, 0 below lo (and for -inf, which the
/// online softmax relies on for masked scores); finite for x <= hi; NaN for
/// NaN. Range reduction x = n·ln2 + r, |r| <= ln2/2, a Taylor polynomial of
/// r (its truncation error is below the type's rounding), and 2^n assembled
/// in the exponent bits: all plain arithmetic, so `omp simd` loops
/// vectorise it. Each clamp and the final select is one compare-and-pick,
/// which the compiler turns into a vector min, max or blend.
template <class T>
inline T exp(T x) {
  using c = ExpConstants<T>;
  using bits_t = typename c::bits_t;
  const bool underflow = x < c::kLo;
  x = x < c::kLo ? c::kLo : x;
  x = x > c::kHi ? c::kHi : x;
  // Adding the shifter rounds x·log2(e) to an integer n held, with the
  // exponent bias, in its low bits.
  const T kn = x * T(1.4426950408889634) + c::kShifter;
  const T n = kn - c::kShifter;
  const T r = (x - n * c::kLn2Hi) - n * c::kLn2Lo;
  // Horner form of sum r^k / k!, one multiply-add a degree.
  constexpr TaylorCoefficients<T, c::kDegree> taylor;
  T p = taylor.c[c::kDegree];
  for (int k = c::kDegree - 1; k >= 0; --k) p = p * r + taylor.c[k];
  bits_t bits;
  std::memcpy(&bits, &kn, sizeof(T));
  bits <<= c::kMantissa;
  T scale;
  std::memcpy(&scale, &bits, sizeof(T));
  const T e = p * scale;
  return underflow ? T(0) : e;
}

}  // namespace Host
}  // namespace Impl
}  // namespace kfa

#endif
