#ifndef KFA_TYPES_HPP
#define KFA_TYPES_HPP

#include <Kokkos_Core.hpp>

#include <kfa/detail/common/compat.hpp>

#include <type_traits>

namespace kfa {

/// IEEE half precision: Kokkos' own half_t. On Kokkos 3.4 host-only builds
/// this is `float` itself.
using half = Kokkos::Experimental::half_t;

/// bfloat16: Kokkos' own bhalf_t where the Kokkos version has one, otherwise
/// kfa's 16-bit storage type (round to nearest even from float).
using bfloat16 = Impl::bfloat16_type;

/// The type kfa accumulates in (and stores lse in) for a value type:
/// double for double, float for float, half and bfloat16.
template <class T>
struct accumulator {
  using type = std::conditional_t<std::is_same<std::remove_cv_t<T>, double>::value,
                                  double, float>;
};
template <class T>
using accumulator_t = typename accumulator<T>::type;

/// True for the value types the attention kernels accept.
template <class T>
struct is_supported_value_type
    : std::integral_constant<bool, std::is_same<T, double>::value ||
                                       std::is_same<T, float>::value ||
                                       std::is_same<T, half>::value ||
                                       std::is_same<T, bfloat16>::value> {};

}  // namespace kfa

#endif
