#ifndef KFA_MASK_HPP
#define KFA_MASK_HPP

// Which tiles a row block or a key block touches, and the element mask.
// Causal masking is aligned bottom-right: query i sees key j iff
// j <= i + (seqlen_k - seqlen_q).

#include <Kokkos_Core.hpp>

namespace kfa {
namespace Impl {

struct CausalMask {
  bool m_causal;
  int m_offset;  // seqlen_k - seqlen_q
  int m_seqlen_k;

  KOKKOS_INLINE_FUNCTION bool masked(int i, int j) const {
    return j >= m_seqlen_k || (m_causal && j > i + m_offset);
  }

  /// One past the last key any of the rows [.., row_end) sees.
  KOKKOS_INLINE_FUNCTION int key_end(int row_end) const {
    if (!m_causal) return m_seqlen_k;
    const int end = row_end + m_offset;
    return end < 0 ? 0 : (end < m_seqlen_k ? end : m_seqlen_k);
  }

  /// First query row that sees key `key` (rows before it are masked).
  KOKKOS_INLINE_FUNCTION int first_row(int key) const {
    if (!m_causal) return 0;
    const int row = key - m_offset;
    return row < 0 ? 0 : row;
  }

  /// True when some element of the tile rows [row_begin, ..) x keys
  /// [.., key_end) may be masked, so the element mask must be applied.
  KOKKOS_INLINE_FUNCTION bool tile_needs_mask(int row_begin, int key_end) const {
    return key_end > m_seqlen_k || (m_causal && key_end - 1 > row_begin + m_offset);
  }
};

}  // namespace Impl
}  // namespace kfa

#endif
