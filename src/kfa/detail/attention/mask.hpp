#ifndef KFA_DETAIL_ATTENTION_MASK_HPP
#define KFA_DETAIL_ATTENTION_MASK_HPP

// Which keys a query row sees, and which tiles a row block or a key block
// touches (FlashAttention's block info and mask in one struct). Query i of a
// sequence sees key j iff
//   i < seqlen_q and j < seqlen_k,
//   j >= i + offset - left   (left >= 0),
//   j <= i + offset + right  (right >= 0),
// with offset = seqlen_k - seqlen_q: windows and causal masking (right = 0)
// are aligned to the bottom-right corner, as in FlashAttention-2. -1 leaves a
// side unbounded.

#include <kfa/detail/common/compat.hpp>

namespace kfa {
namespace Impl {

struct AttentionMask {
  int m_seqlen_q, m_seqlen_k, m_offset, m_left, m_right;

  /// window_left, window_right as in AttentionOptions, causal already folded
  /// into window_right. A window wider than both sequences is unbounded:
  /// clamping it keeps i + offset ± window far from int overflow.
  KOKKOS_INLINE_FUNCTION AttentionMask(int seqlen_q, int seqlen_k, int window_left,
                                       int window_right)
      : m_seqlen_q(seqlen_q),
        m_seqlen_k(seqlen_k),
        m_offset(seqlen_k - seqlen_q),
        m_left(window_left > seqlen_q + seqlen_k ? -1 : window_left),
        m_right(window_right > seqlen_q + seqlen_k ? -1 : window_right) {}

  KOKKOS_INLINE_FUNCTION bool masked(int i, int j) const {
    return i >= m_seqlen_q || j >= m_seqlen_k || (m_right >= 0 && j > i + m_offset + m_right) ||
           (m_left >= 0 && j < i + m_offset - m_left);
  }

  /// The keys query i sees, [first, last]: masked(i, j) iff j < first or
  /// j > last (last < first where it sees none). The tensor-core kernels
  /// take these once per row and test each score's column against them (a
  /// compare and a select) instead of calling masked per score.
  KOKKOS_INLINE_FUNCTION void visible_keys(int i, int& first, int& last) const {
    first = m_left < 0 ? 0 : i + m_offset - m_left;
    last = m_right < 0 ? m_seqlen_k - 1 : imin(i + m_offset + m_right, m_seqlen_k - 1);
    if (i >= m_seqlen_q) last = -1;
  }

  /// The queries that see key j, [first, last]: masked(i, j) iff i < first
  /// or i > last (last < first where none does).
  KOKKOS_INLINE_FUNCTION void visible_rows(int j, int& first, int& last) const {
    first = m_right < 0 ? 0 : j - m_offset - m_right;
    last = m_left < 0 ? m_seqlen_q - 1 : imin(j - m_offset + m_left, m_seqlen_q - 1);
    if (j >= m_seqlen_k) last = -1;
  }

  /// Whether a window bounds the keys a row sees on the left (else `first`
  /// of visible_keys is 0, and a kernel may test only `last`).
  KOKKOS_INLINE_FUNCTION bool has_left() const { return m_left >= 0; }

  /// First key any row of a block starting at `row_begin` sees.
  KOKKOS_INLINE_FUNCTION int key_begin(int row_begin) const {
    return m_left < 0 ? 0 : iclamp(row_begin + m_offset - m_left, 0, m_seqlen_k);
  }

  /// One past the last key any row before `row_end` sees. A row block sees
  /// keys [key_begin(row_begin), key_end(row_end)): the tiles before the
  /// window and after it are skipped.
  KOKKOS_INLINE_FUNCTION int key_end(int row_end) const {
    return m_right < 0 ? m_seqlen_k : iclamp(row_end + m_offset + m_right, 0, m_seqlen_k);
  }

  /// The key blocks of `block_n` keys that rows [row_begin, row_end) visit:
  /// [first, end), the block range of key_begin / key_end.
  KOKKOS_INLINE_FUNCTION void key_blocks(int row_begin, int row_end, int block_n, int& first,
                                         int& end) const {
    first = key_begin(row_begin) / block_n;
    end = (key_end(row_end) + block_n - 1) / block_n;
  }

  /// First query row that sees a key at or after `key_begin`.
  KOKKOS_INLINE_FUNCTION int row_begin(int key_begin) const {
    return m_right < 0 ? 0 : iclamp(key_begin - m_offset - m_right, 0, m_seqlen_q);
  }

  /// One past the last query row that sees a key before `key_end`. A key
  /// block is seen by rows [row_begin(key_begin), row_end(key_end)).
  KOKKOS_INLINE_FUNCTION int row_end(int key_end) const {
    return m_left < 0 ? m_seqlen_q : iclamp(key_end - m_offset + m_left, 0, m_seqlen_q);
  }

  /// True when some element of the tile rows [row_begin, row_end) x keys
  /// [key_begin, key_end) may be masked, so the element mask must be applied.
  /// Rows past seqlen_q are not considered: they are padding the kernels
  /// never store (key_end past seqlen_k is, padded keys must not count).
  KOKKOS_INLINE_FUNCTION bool tile_needs_mask(int row_begin, int row_end, int key_begin,
                                              int key_end) const {
    return key_end > m_seqlen_k || (m_right >= 0 && key_end - 1 > row_begin + m_offset + m_right) ||
           (m_left >= 0 && key_begin < row_end - 1 + m_offset - m_left);
  }
};

/// `edge` moved `step` blocks toward `limit`, not past it.
KOKKOS_INLINE_FUNCTION int step_toward(int edge, int step, int limit) {
  return edge < limit ? imin(edge + step, limit) : imax(edge - step, limit);
}

/// One end of trim_hidden_blocks below: `edge` (the first block, or one
/// past the last) moved toward `limit` (the other end) past the blocks
/// `shown` hides, in runs that double while hidden and then halve.
template <class Shown>
KOKKOS_INLINE_FUNCTION int skip_hidden_blocks(const Shown& shown, int edge, int limit) {
  int step = 1;
  for (; edge != limit; step *= 2) {
    const int to = step_toward(edge, step, limit);
    if (shown(imin(edge, to), imax(edge, to))) break;
    edge = to;
  }
  for (step /= 2; step >= 1 && edge != limit; step /= 2) {
    const int to = step_toward(edge, step, limit);
    if (!shown(imin(edge, to), imax(edge, to))) edge = to;
  }
  return edge;
}

/// [first, end) narrowed to its first and last blocks where shown(lo, hi)
/// holds: a block predicate (a score modifier's `visible`) over blocks
/// [lo, hi), false only when every element there is masked. It holds for
/// any rectangle, so hidden runs are skipped in ranges that double and then
/// halve: about 2·log2(blocks) calls per end instead of one per block (a
/// document far from the sequence's start sits behind many hidden blocks,
/// and the walk is serial latency on every tile). A predicate that passes a
/// range but hides each of its blocks leaves masked blocks inside, which
/// cost work, not correctness.
template <class Shown>
KOKKOS_INLINE_FUNCTION void trim_hidden_blocks(const Shown& shown, int& first, int& end) {
  first = skip_hidden_blocks(shown, first, end);
  end = skip_hidden_blocks(shown, end, first);
}

}  // namespace Impl
}  // namespace kfa

#endif
