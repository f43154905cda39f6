#ifndef KFA_TEST_ETI_HPP
#define KFA_TEST_ETI_HPP

// The entry points that the test files call with the same View types are
// compiled once per backend (kfa_test_eti_<backend>.cpp) instead of once per
// test file: explicit instantiation declarations here, the definitions
// there. Only the test build does this, to keep it within a few minutes on
// two cores; it changes nothing in how kfa is used. Score-modifier overloads
// are instantiated where they are used (tstScoreMod.cpp).

#include <kfa/kfa.hpp>

namespace kfa_test {

template <class S, class T>
struct EtiViews {
  using mem = typename S::memory_space;
  using acc = kfa::accumulator_t<T>;
  using V4 = Kokkos::View<T****, Kokkos::LayoutRight, mem>;
  using V3 = Kokkos::View<T***, Kokkos::LayoutRight, mem>;
  using L3 = Kokkos::View<acc***, Kokkos::LayoutRight, mem>;
  using L2 = Kokkos::View<acc**, Kokkos::LayoutRight, mem>;
  using Cu = Kokkos::View<int*, mem>;
};

}  // namespace kfa_test

#define KFA_TEST_ETI_V(S, T, X) typename kfa_test::EtiViews<S, T>::X
#define KFA_TEST_ETI_FIXED(EXTERN, NAME, S, T)                                              \
  EXTERN template void kfa::NAME##_forward(                                                  \
      const S&, const KFA_TEST_ETI_V(S, T, V4)&, const KFA_TEST_ETI_V(S, T, V4)&,              \
      const KFA_TEST_ETI_V(S, T, V4)&, const KFA_TEST_ETI_V(S, T, V4)&,                        \
      const KFA_TEST_ETI_V(S, T, L3)&, const kfa::AttentionOptions&,                           \
      const kfa::Impl::NoScoreMod&);                                                           \
  EXTERN template void kfa::NAME##_backward(                                                 \
      const S&, const KFA_TEST_ETI_V(S, T, V4)&, const KFA_TEST_ETI_V(S, T, V4)&,              \
      const KFA_TEST_ETI_V(S, T, V4)&, const KFA_TEST_ETI_V(S, T, V4)&,                        \
      const KFA_TEST_ETI_V(S, T, L3)&, const KFA_TEST_ETI_V(S, T, V4)&,                        \
      const KFA_TEST_ETI_V(S, T, V4)&, const KFA_TEST_ETI_V(S, T, V4)&,                        \
      const KFA_TEST_ETI_V(S, T, V4)&, const kfa::AttentionOptions&,                           \
      const kfa::Impl::NoScoreMod&);
#define KFA_TEST_ETI_PACKED(EXTERN, NAME, S, T)                                             \
  EXTERN template void kfa::NAME##_varlen_forward(                                           \
      const S&, const KFA_TEST_ETI_V(S, T, V3)&, const KFA_TEST_ETI_V(S, T, V3)&,              \
      const KFA_TEST_ETI_V(S, T, V3)&, const KFA_TEST_ETI_V(S, T, Cu)&,                        \
      const KFA_TEST_ETI_V(S, T, Cu)&, int, int, const KFA_TEST_ETI_V(S, T, V3)&,              \
      const KFA_TEST_ETI_V(S, T, L2)&, const kfa::AttentionOptions&,                           \
      const kfa::Impl::NoScoreMod&);                                                           \
  EXTERN template void kfa::NAME##_varlen_backward(                                          \
      const S&, const KFA_TEST_ETI_V(S, T, V3)&, const KFA_TEST_ETI_V(S, T, V3)&,              \
      const KFA_TEST_ETI_V(S, T, V3)&, const KFA_TEST_ETI_V(S, T, Cu)&,                        \
      const KFA_TEST_ETI_V(S, T, Cu)&, int, int, const KFA_TEST_ETI_V(S, T, V3)&,              \
      const KFA_TEST_ETI_V(S, T, L2)&, const KFA_TEST_ETI_V(S, T, V3)&,                        \
      const KFA_TEST_ETI_V(S, T, V3)&, const KFA_TEST_ETI_V(S, T, V3)&,                        \
      const KFA_TEST_ETI_V(S, T, V3)&, const kfa::AttentionOptions&,                           \
      const kfa::Impl::NoScoreMod&);
#define KFA_TEST_ETI_TYPE(EXTERN, S, T)                \
  KFA_TEST_ETI_FIXED(EXTERN, flash_attention, S, T)    \
  KFA_TEST_ETI_FIXED(EXTERN, standard_attention, S, T) \
  KFA_TEST_ETI_PACKED(EXTERN, flash_attention, S, T)   \
  KFA_TEST_ETI_PACKED(EXTERN, standard_attention, S, T)

// Every value type of the test configurations, without the duplicates of
// builds where kfa::half or kfa::bfloat16 is float itself.
#if defined(KOKKOS_HALF_T_IS_FLOAT) && KOKKOS_HALF_T_IS_FLOAT
#define KFA_TEST_ETI_HALF(EXTERN, S)
#else
#define KFA_TEST_ETI_HALF(EXTERN, S) KFA_TEST_ETI_TYPE(EXTERN, S, kfa::half)
#endif
#if KFA_KOKKOS_4 && defined(KOKKOS_BHALF_T_IS_FLOAT) && KOKKOS_BHALF_T_IS_FLOAT
#define KFA_TEST_ETI_BFLOAT16(EXTERN, S)
#else
#define KFA_TEST_ETI_BFLOAT16(EXTERN, S) KFA_TEST_ETI_TYPE(EXTERN, S, kfa::bfloat16)
#endif
#define KFA_TEST_ETI_SPACE(EXTERN, S)   \
  KFA_TEST_ETI_TYPE(EXTERN, S, double) \
  KFA_TEST_ETI_TYPE(EXTERN, S, float)  \
  KFA_TEST_ETI_HALF(EXTERN, S)         \
  KFA_TEST_ETI_BFLOAT16(EXTERN, S)

#ifdef KOKKOS_ENABLE_CUDA
KFA_TEST_ETI_SPACE(extern, Kokkos::Cuda)
#endif
#ifdef KOKKOS_ENABLE_OPENMP
KFA_TEST_ETI_SPACE(extern, Kokkos::OpenMP)
#endif
#ifdef KOKKOS_ENABLE_SERIAL
KFA_TEST_ETI_SPACE(extern, Kokkos::Serial)
#endif

#endif
