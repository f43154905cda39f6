#ifndef KFA_DETAIL_BACKEND_HOST_MICRO_KERNEL_HPP
#define KFA_DETAIL_BACKEND_HOST_MICRO_KERNEL_HPP

// The one matrix product of the host kernels, C (+)= A·B on per-thread tiles,
// and the tile shapes it works on. A register block of kRows rows of C by
// kCols columns (two vector registers per row) stays in registers while the
// reduction index walks A's columns and B's rows; every score, P·V and
// gradient product of the forward and backward kernels is this loop.

#include <kfa/detail/backend/host/vector_math.hpp>

#include <cstddef>
#include <cstdint>
#include <initializer_list>

namespace kfa {
namespace Impl {
namespace Host {

/// The register block of the products for accumulator type Acc: kRows x
/// kCols accumulators in 2·kRows vector registers, leaving room for the
/// broadcasts and B's loads: 16 of AVX-512's 32 registers, 8 of the 16
/// elsewhere.
template <class Acc>
struct RegisterBlock {
  static constexpr int kRows = kVectorBytes == 64 ? 8 : 4;
  static constexpr int kCols = 2 * vector_lanes<Acc>();
};

/// Compile-time tile choices of one host kernel for accumulator type Acc:
/// BlockM query rows by BlockN keys per tile, multiples of the register
/// block, and tile rows indexed by head dimension padded to whole blocks.
template <class Acc, int BlockM, int BlockN>
struct TileTraits : RegisterBlock<Acc> {
  using RegisterBlock<Acc>::kRows;
  using RegisterBlock<Acc>::kCols;
  static constexpr int kBlockM = BlockM;
  static constexpr int kBlockN = BlockN;
  static_assert(kBlockM % kRows == 0 && kBlockN % kCols == 0 && kBlockM % kCols == 0,
                "kfa::Host::TileTraits: blocks must be whole register blocks");

  static constexpr int round_up(int x, int to) { return (x + to - 1) / to * to; }
  /// Row length of the tiles indexed by head dimension: whole register blocks.
  static constexpr int padded_head_dim(int head_dim) { return round_up(head_dim, kCols); }
};

/// The forward's tiles. A query block of 128 rows reads each K and V block
/// (64 keys, read in place from the View) half as often as 64 rows would:
/// with many heads the rows of one head are a page apart and share few
/// cache sets, so these blocks come from beyond L2 each time.
template <class Acc>
using ForwardTileTraits = TileTraits<Acc, 128, 64>;

/// The backward's tiles. For each key block it streams every query row's
/// Q, dO and dQ accumulator: 128 keys a block halve that traffic, which
/// dominates at long sequences, while its S, dP, Q and dO tiles stay at 64
/// query rows.
template <class Acc>
using BackwardTileTraits = TileTraits<Acc, 64, 128>;

/// How a product reads its left operand A [m][k]: element (r, p) at
/// a[r * lda + p] (row_major), or at a[p * lda + r] (transposed: the tile
/// holds Aᵀ, as a Pᵀ or dSᵀ tile whose rows are keys does). Either way the
/// register block broadcasts one element per row and reduction step.
enum class ALayout { row_major, transposed };

/// C[Rows][Vecs vectors] (+)= A[Rows][k] · B[k][Vecs vectors]; strides in
/// elements. The accumulators are vector registers from the first load of
/// C to the last store.
template <int Rows, int Vecs, ALayout Layout, bool Accumulate, class T>
KFA_HOST_INLINE void micro_product(int k, const T* __restrict a, std::ptrdiff_t lda,
                                   const T* __restrict b, std::ptrdiff_t ldb, T* __restrict c,
                                   std::ptrdiff_t ldc) {
  constexpr int lanes = vector_lanes<T>();
  Vec<T> acc[Rows][Vecs];
  for (int r = 0; r < Rows; ++r)
    for (int v = 0; v < Vecs; ++v)
      acc[r][v] = Accumulate ? vec_load(c + r * ldc + v * lanes) : vec_zero<T>();
  for (int p = 0; p < k; ++p) {
    Vec<T> bp[Vecs];
    for (int v = 0; v < Vecs; ++v) bp[v] = vec_load(b + p * ldb + v * lanes);
    for (int r = 0; r < Rows; ++r) {
      const T ar = Layout == ALayout::row_major ? a[r * lda + p] : a[p * lda + r];
      for (int v = 0; v < Vecs; ++v) vec_fma(acc[r][v], ar, bp[v]);
    }
  }
  for (int r = 0; r < Rows; ++r)
    for (int v = 0; v < Vecs; ++v) vec_store(c + r * ldc + v * lanes, acc[r][v]);
}

/// C[m][n] (+)= A[m][k] · B[k][n] with m a multiple of kRows and n of kCols
/// (the tiles are padded to whole register blocks); A read as Layout says,
/// C overwritten or added to as Accumulate says.
template <ALayout Layout, bool Accumulate, class T>
void tile_product(int m, int n, int k, const T* a, std::ptrdiff_t lda, const T* b,
                  std::ptrdiff_t ldb, T* c, std::ptrdiff_t ldc) {
  using traits = RegisterBlock<T>;
  constexpr int vecs = traits::kCols / vector_lanes<T>();
  for (int i = 0; i < m; i += traits::kRows) {
    const T* a_rows = Layout == ALayout::row_major ? a + i * lda : a + i;
    for (int j = 0; j < n; j += traits::kCols)
      micro_product<traits::kRows, vecs, Layout, Accumulate>(k, a_rows, lda, b + j, ldb,
                                                             c + i * ldc + j, ldc);
  }
}

/// Carves a thread's scratch into 64-byte aligned tiles, in order.
class TileArena {
 public:
  explicit TileArena(void* base) : m_next(align(reinterpret_cast<std::uintptr_t>(base))) {}
  template <class T>
  T* take(std::size_t count) {
    T* p = reinterpret_cast<T*>(m_next);
    m_next = align(m_next + count * sizeof(T));
    return p;
  }
  /// Bytes of scratch that tiles of `bytes_each` need, alignment included.
  static std::size_t bytes(std::initializer_list<std::size_t> bytes_each) {
    std::size_t total = kAlign;
    for (std::size_t b : bytes_each) total += (b + kAlign - 1) / kAlign * kAlign;
    return total;
  }

 private:
  static constexpr std::size_t kAlign = 64;
  static std::uintptr_t align(std::uintptr_t p) { return (p + kAlign - 1) / kAlign * kAlign; }
  std::uintptr_t m_next;
};

}  // namespace Host
}  // namespace Impl
}  // namespace kfa

#endif
