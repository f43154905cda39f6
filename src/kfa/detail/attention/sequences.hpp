#ifndef KFA_DETAIL_ATTENTION_SEQUENCES_HPP
#define KFA_DETAIL_ATTENTION_SEQUENCES_HPP

// Where each sequence of a call lives. Fixed-length batches and packed
// variable-length batches run the same kernels: both see the tensors as
// [view_batch][rows][heads][head_dim] (a packed tensor [total][heads][d] is
// [1][total][heads][d]) and lse as [view_batch][heads][rows], and ask this
// struct for the rows of sequence b.

#include <Kokkos_Core.hpp>

namespace kfa {
namespace Impl {

/// Rows of one sequence: q rows [q_begin, q_begin + seqlen_q), key rows
/// [k_begin, k_begin + seqlen_k) of batch entry `view_batch` of the views.
struct SequenceInfo {
  int view_batch;
  int q_begin, seqlen_q;
  int k_begin, seqlen_k;
};

template <class MemorySpace>
struct Sequences {
  /// Packed batches: offsets [batch + 1] into the rows (cu_seqlens); empty
  /// for fixed-length batches.
  Kokkos::View<const int*, MemorySpace> cu_q, cu_k;
  /// Number of sequences; the lengths (fixed) or their upper bounds (packed),
  /// which size the kernels' leagues.
  int batch = 0, max_seqlen_q = 0, max_seqlen_k = 0;
  bool packed = false;

  KOKKOS_INLINE_FUNCTION SequenceInfo operator()(int b) const {
    if (!packed) return {b, 0, max_seqlen_q, 0, max_seqlen_k};
    const int q0 = cu_q(b), k0 = cu_k(b);
    return {0, q0, cu_q(b + 1) - q0, k0, cu_k(b + 1) - k0};
  }
};

/// The query block that work item `item` of a league of (sequence, query
/// head, query block) items handles. The last blocks come first: under a
/// causal mask they see the most keys, so they should start first.
struct QueryBlock {
  int b, h, row_begin;
  /// Rows of the block; <= 0 where a packed sequence shorter than the
  /// longest has no such block.
  int rows;
  SequenceInfo seq;
};

template <class MemorySpace>
KOKKOS_INLINE_FUNCTION QueryBlock query_block(const Sequences<MemorySpace>& seqs, int item,
                                              int heads, int num_q_blocks, int block_m) {
  const int bh = item % (seqs.batch * heads);
  const int q_block = num_q_blocks - 1 - item / (seqs.batch * heads);
  QueryBlock qb;
  qb.b = bh / heads;
  qb.h = bh % heads;
  qb.seq = seqs(qb.b);
  qb.row_begin = q_block * block_m;
  const int left = qb.seq.seqlen_q - qb.row_begin;
  qb.rows = left < block_m ? left : block_m;
  return qb;
}

template <class MemorySpace>
Sequences<MemorySpace> fixed_sequences(int batch, int seqlen_q, int seqlen_k) {
  Sequences<MemorySpace> s;
  s.batch = batch;
  s.max_seqlen_q = seqlen_q;
  s.max_seqlen_k = seqlen_k;
  return s;
}

template <class MemorySpace>
Sequences<MemorySpace> packed_sequences(const Kokkos::View<const int*, MemorySpace>& cu_q,
                                        const Kokkos::View<const int*, MemorySpace>& cu_k,
                                        int max_seqlen_q, int max_seqlen_k) {
  Sequences<MemorySpace> s;
  s.cu_q = cu_q;
  s.cu_k = cu_k;
  s.batch = static_cast<int>(cu_q.extent(0)) - 1;
  s.max_seqlen_q = max_seqlen_q;
  s.max_seqlen_k = max_seqlen_k;
  s.packed = true;
  return s;
}

}  // namespace Impl
}  // namespace kfa

#endif
