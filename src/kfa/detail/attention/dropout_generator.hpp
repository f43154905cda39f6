#ifndef KFA_DETAIL_ATTENTION_DROPOUT_GENERATOR_HPP
#define KFA_DETAIL_ATTENTION_DROPOUT_GENERATOR_HPP

// Counter-based dropout: whether element (b, h, i, j) of the attention matrix
// is kept is a pure function of (seed, b, h, i, j), so the backward pass
// regenerates the forward's mask instead of storing it, and host and device
// draw the same mask bit for bit (integer arithmetic only). splitmix64
// keys each (batch, head) once; a row's key and the draw of a pair of
// adjacent keys (j, j^1) are one 32-bit murmur3 finaliser each, whose two
// 16-bit halves decide the pair: a few integer operations per element, where
// a 64-bit hash per element would cost the GPU kernels more than the
// attention itself.

#include <Kokkos_Core.hpp>

#include <cstdint>

namespace kfa {
namespace Impl {

struct DropoutGenerator {
  std::uint64_t m_seed = 0;
  /// Dropped iff the element's 16 bits are below this (p·2^16, rounded).
  std::uint32_t m_threshold = 0;

  DropoutGenerator() = default;
  DropoutGenerator(double p, std::uint64_t seed) : m_seed(seed) {
    const double t = p * 65536.0 + 0.5;
    m_threshold = t >= 65536.0 ? 65536u : t <= 0.0 ? 0u : static_cast<std::uint32_t>(t);
  }

  /// splitmix64's output function: a bijection that mixes every input bit.
  KOKKOS_FORCEINLINE_FUNCTION static std::uint64_t mix(std::uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  static constexpr std::uint64_t kGamma = 0x9e3779b97f4a7c15ull;

  /// murmur3's 32-bit finaliser: a bijection, two multiplies.
  KOKKOS_FORCEINLINE_FUNCTION static std::uint32_t mix32(std::uint32_t z) {
    z = (z ^ (z >> 16)) * 0x85ebca6bu;
    z = (z ^ (z >> 13)) * 0xc2b2ae35u;
    return z ^ (z >> 16);
  }

  /// Key of (seed, b, h): the same for every element of one head, so the
  /// kernels compute it once per tile.
  KOKKOS_FORCEINLINE_FUNCTION std::uint64_t head_key(int b, int h) const {
    const std::uint64_t z = mix(m_seed + kGamma * (static_cast<std::uint64_t>(b) + 1));
    return mix(z + kGamma * (static_cast<std::uint64_t>(h) + 1));
  }

  /// Key of row i of a head (distinct for every row of the head).
  KOKKOS_FORCEINLINE_FUNCTION static std::uint32_t row_of(std::uint64_t head, int i) {
    return mix32(static_cast<std::uint32_t>(head) +
                 (static_cast<std::uint32_t>(i) + 1u) * 0x9e3779b9u) ^
           static_cast<std::uint32_t>(head >> 32);
  }

  /// Key of (seed, b, h, i): computed once per query row.
  KOKKOS_FORCEINLINE_FUNCTION std::uint64_t row_key(int b, int h, int i) const {
    return row_of(head_key(b, h), i);
  }

  /// The 32 random bits of keys (2p, 2p + 1) of a row: the low half
  /// decides key 2p, the high half key 2p + 1.
  KOKKOS_FORCEINLINE_FUNCTION static std::uint32_t pair_bits(std::uint64_t row, int pair) {
    return mix32(static_cast<std::uint32_t>(row) ^
                 ((static_cast<std::uint32_t>(pair) + 1u) * 0x85ebca77u));
  }

  KOKKOS_FORCEINLINE_FUNCTION bool kept_bits(std::uint32_t bits, int j) const {
    return ((j & 1) ? bits >> 16 : bits & 0xffffu) >= m_threshold;
  }

  /// True when element j of the row with key `row` is kept.
  KOKKOS_FORCEINLINE_FUNCTION bool kept(std::uint64_t row, int j) const {
    return kept_bits(pair_bits(row, j >> 1), j);
  }
};

}  // namespace Impl
}  // namespace kfa

#endif
