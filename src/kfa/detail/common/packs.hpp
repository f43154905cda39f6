#ifndef KFA_DETAIL_COMMON_PACKS_HPP
#define KFA_DETAIL_COMMON_PACKS_HPP

// Consecutive values moved as one memory access, for the elementwise
// kernels over contiguous arrays (ring chunk copies, accumulations, the
// attention merge). On GPUs a Pack of 16 bytes is one 16-byte load or
// store; one 2- or 4-byte access a value moves the same bytes with 4-8x the
// instructions, which keeps such passes well below the memory bandwidth.

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace kfa {
namespace Impl {

template <class V, int Width>
struct alignas(sizeof(V) * Width) Pack {
  static_assert((sizeof(V) * Width & (sizeof(V) * Width - 1)) == 0,
                "kfa::Impl::Pack: a pack's size must be a power of two");
  V v[Width];
};

/// Values per pack when values of A and B move side by side: 16 bytes of
/// the wider of the two (1 for values of 16 bytes or more).
template <class A, class B = A>
constexpr int pack_width() {
  constexpr std::size_t wide = sizeof(A) > sizeof(B) ? sizeof(A) : sizeof(B);
  return wide >= 16 ? 1 : static_cast<int>(16 / wide);
}

/// Whether `p` may be read or written as Pack<V, Width>.
template <int Width, class V>
bool pack_aligned(const V* p) {
  return reinterpret_cast<std::uintptr_t>(p) % (sizeof(V) * Width) == 0;
}

template <int Width, class V>
KOKKOS_FORCEINLINE_FUNCTION Pack<V, Width> load_pack(const V* p) {
  static_assert(std::is_trivially_copyable<V>::value,
                "kfa::Impl::load_pack: packs move trivially copyable values");
  return *reinterpret_cast<const Pack<V, Width>*>(p);
}

template <int Width, class V>
KOKKOS_FORCEINLINE_FUNCTION void store_pack(V* p, const Pack<V, Width>& x) {
  *reinterpret_cast<Pack<V, Width>*>(p) = x;
}

}  // namespace Impl
}  // namespace kfa

#endif
