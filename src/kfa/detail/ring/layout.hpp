#ifndef KFA_DETAIL_RING_LAYOUT_HPP
#define KFA_DETAIL_RING_LAYOUT_HPP

// Where every rank's slice of the sequence sits in the global sequence, and
// which (query chunk, key chunk) pairs a ring step computes.
//
// A rank holds one chunk (contiguous sharding) or two (zigzag: chunks r and
// 2P-1-r of 2P). Queries and keys are sliced alike, so a query chunk and a
// key chunk are either the same chunk or disjoint ranges of positions, and
// causal attention between them is one of three cases, each a plain call of
// the fused kernel: keys entirely before the queries (full, no mask), keys
// entirely after (skip), or the same chunk (diagonal: causal with
// seqlen_q == seqlen_k, where bottom-right alignment is the global mask).

#include <kfa/ring_options.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace kfa {
namespace Impl {

/// One chunk of the global sequence as a rank holds it.
struct RingChunk {
  int id;                    ///< index of the chunk in the global sequence
  std::size_t begin;         ///< first global position
  std::size_t length;        ///< positions
  std::size_t local_offset;  ///< first local position on the rank holding it
};

enum class BlockKind { skip, full, diagonal };

/// What a query chunk computes against a key/value chunk.
inline BlockKind classify(const RingChunk& q, const RingChunk& kv, bool causal) {
  if (q.length == 0 || kv.length == 0) return BlockKind::skip;
  if (!causal) return BlockKind::full;
  if (q.id == kv.id) return BlockKind::diagonal;
  return kv.begin < q.begin ? BlockKind::full : BlockKind::skip;
}

/// Local position -> global position of one rank (device-callable): local
/// positions [0, len0) are global [begin0, begin0 + len0), the rest (zigzag's
/// second chunk) start at begin1.
struct ShardMap {
  std::size_t len0, begin0, begin1;
  KOKKOS_INLINE_FUNCTION std::size_t global(std::size_t i) const {
    return i < len0 ? begin0 + i : begin1 + (i - len0);
  }
};

/// The chunks of every rank, from the local sequence lengths of all ranks.
class RingLayout {
 public:
  /// Throws std::invalid_argument (same message on every rank, since every
  /// rank passes the same lengths) when zigzag sharding gets unequal or odd
  /// local lengths.
  RingLayout(const char* function, RingSharding sharding, std::vector<std::size_t> seqlens)
      : m_seqlens(std::move(seqlens)), m_chunks(m_seqlens.size()) {
    const int ranks = static_cast<int>(m_seqlens.size());
    if (sharding == RingSharding::zigzag) {
      for (int r = 0; r < ranks; ++r) {
        if (m_seqlens[r] != m_seqlens[0] || m_seqlens[r] % 2 != 0) {
          std::ostringstream out;
          out << function << ": options.sharding = zigzag needs the same even local seqlen on "
              << "every rank (the sequence in " << 2 * ranks
              << " equal chunks, two per rank); local seqlen is " << m_seqlens[0]
              << " on rank 0 and " << m_seqlens[r] << " on rank " << r;
          throw std::invalid_argument(out.str());
        }
      }
      const std::size_t chunk = m_seqlens.empty() ? 0 : m_seqlens[0] / 2;
      for (int r = 0; r < ranks; ++r) {
        const int mirror = 2 * ranks - 1 - r;
        m_chunks[r] = {{r, r * chunk, chunk, 0}, {mirror, mirror * chunk, chunk, chunk}};
      }
    } else {
      std::size_t begin = 0;
      for (int r = 0; r < ranks; ++r) {
        m_chunks[r] = {{r, begin, m_seqlens[r], 0}};
        begin += m_seqlens[r];
      }
    }
    for (const auto& chunks : m_chunks)
      for (const RingChunk& c : chunks) {
        m_global_seqlen += c.length;
        if (c.length > m_max_chunk) m_max_chunk = c.length;
      }
    for (std::size_t s : m_seqlens)
      if (s > m_max_seqlen) m_max_seqlen = s;
  }

  int ranks() const { return static_cast<int>(m_seqlens.size()); }
  const std::vector<RingChunk>& chunks(int rank) const { return m_chunks[rank]; }
  std::size_t seqlen(int rank) const { return m_seqlens[rank]; }
  std::size_t max_seqlen() const { return m_max_seqlen; }
  std::size_t max_chunk() const { return m_max_chunk; }
  std::size_t global_seqlen() const { return m_global_seqlen; }

  ShardMap shard_map(int rank) const {
    const auto& c = m_chunks[rank];
    return {c[0].length, c[0].begin, c.size() > 1 ? c[1].begin : 0};
  }

 private:
  std::vector<std::size_t> m_seqlens;
  std::vector<std::vector<RingChunk>> m_chunks;
  std::size_t m_global_seqlen = 0, m_max_seqlen = 0, m_max_chunk = 0;
};

}  // namespace Impl
}  // namespace kfa

#endif
