#ifndef KFA_DETAIL_ATTENTION_DROPOUT_GENERATOR_HPP
#define KFA_DETAIL_ATTENTION_DROPOUT_GENERATOR_HPP

// Counter-based dropout: whether element (b, h, i, j) of the attention matrix
// is kept is a pure function of (seed, b, h, i, j), so the backward pass
// regenerates the forward's mask instead of storing it, and host and device
// draw the same mask bit for bit (integer arithmetic only). The hash chains
// splitmix64's finaliser over the coordinates; the keep test compares the
// high 32 bits with p·2^32.

#include <Kokkos_Core.hpp>

#include <cstdint>

namespace kfa {
namespace Impl {

struct DropoutGenerator {
  std::uint64_t m_seed = 0;
  /// Dropped iff the 32 high bits of the hash are below this (p·2^32).
  std::uint32_t m_threshold = 0;

  DropoutGenerator() = default;
  DropoutGenerator(double p, std::uint64_t seed) : m_seed(seed) {
    const double t = p * 4294967296.0;
    m_threshold = t >= 4294967295.0 ? 4294967295u : static_cast<std::uint32_t>(t);
  }

  /// splitmix64's output function: a bijection that mixes every input bit.
  KOKKOS_FORCEINLINE_FUNCTION static std::uint64_t mix(std::uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  static constexpr std::uint64_t kGamma = 0x9e3779b97f4a7c15ull;

  /// Hash of (seed, b, h, i): computed once per query row.
  KOKKOS_FORCEINLINE_FUNCTION std::uint64_t row_key(int b, int h, int i) const {
    std::uint64_t z = mix(m_seed + kGamma * (static_cast<std::uint64_t>(b) + 1));
    z = mix(z + kGamma * (static_cast<std::uint64_t>(h) + 1));
    return mix(z + kGamma * (static_cast<std::uint64_t>(i) + 1));
  }

  /// True when element j of the row with key `row` is kept.
  KOKKOS_FORCEINLINE_FUNCTION bool kept(std::uint64_t row, int j) const {
    const std::uint64_t z = mix(row + kGamma * (static_cast<std::uint64_t>(j) + 1));
    return static_cast<std::uint32_t>(z >> 32) >= m_threshold;
  }
};

}  // namespace Impl
}  // namespace kfa

#endif
