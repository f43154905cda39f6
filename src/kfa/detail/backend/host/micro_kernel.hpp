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

/// Compile-time tile choices of the host kernels for accumulator type Acc.
template <class Acc>
struct TileTraits {
  /// Register block: kRows x kCols accumulators in 2·kRows vector
  /// registers, leaving room for the broadcasts and B's loads: 16 of
  /// AVX-512's 32 registers, 8 of the 16 elsewhere.
  static constexpr int kRows = kVectorBytes == 64 ? 8 : 4;
  static constexpr int kCols = 2 * vector_lanes<Acc>();
  /// Query rows and keys per tile. Multiples of the register block; at
  /// head_dim 128 a key block of K and V is 64 KiB in fp32, which stays in
  /// L2 (and largely in L1) while every row group of the query block uses it.
  static constexpr int kBlockM = 64;
  static constexpr int kBlockN = 64;
  static_assert(kBlockM % kRows == 0 && kBlockN % kCols == 0 && kBlockM % kCols == 0,
                "kfa::Host::TileTraits: blocks must be whole register blocks");

  static constexpr int round_up(int x, int to) { return (x + to - 1) / to * to; }
  /// Row length of the tiles indexed by head dimension: whole register blocks.
  static constexpr int padded_head_dim(int head_dim) { return round_up(head_dim, kCols); }
};

/// How a product reads its left operand A [m][k]: element (r, p) at
/// a[r * lda + p] (row_major), or at a[p * lda + r] (transposed: the tile
/// holds Aᵀ, as a Pᵀ or dSᵀ tile whose rows are keys does). Either way the
/// register block broadcasts one element per row and reduction step.
enum class ALayout { row_major, transposed };

/// C[Rows][Cols] (+)= A[Rows][k] · B[k][Cols]; strides in elements.
template <int Rows, int Cols, ALayout Layout, class T>
inline void micro_product(int k, const T* __restrict a, std::ptrdiff_t lda,
                          const T* __restrict b, std::ptrdiff_t ldb, T* __restrict c,
                          std::ptrdiff_t ldc, bool accumulate) {
  T acc[Rows][Cols];
  for (int r = 0; r < Rows; ++r) {
    KFA_HOST_SIMD
    for (int j = 0; j < Cols; ++j) acc[r][j] = accumulate ? c[r * ldc + j] : T(0);
  }
  for (int p = 0; p < k; ++p) {
    const T* bp = b + p * ldb;
    for (int r = 0; r < Rows; ++r) {
      const T ar = Layout == ALayout::row_major ? a[r * lda + p] : a[p * lda + r];
      KFA_HOST_SIMD
      for (int j = 0; j < Cols; ++j) acc[r][j] += ar * bp[j];
    }
  }
  for (int r = 0; r < Rows; ++r) {
    KFA_HOST_SIMD
    for (int j = 0; j < Cols; ++j) c[r * ldc + j] = acc[r][j];
  }
}

/// C[m][n] (+)= A[m][k] · B[k][n] with m a multiple of kRows and n of kCols
/// (the tiles are padded to whole register blocks); A read as Layout says.
template <ALayout Layout, class T>
inline void tile_product(int m, int n, int k, const T* a, std::ptrdiff_t lda, const T* b,
                         std::ptrdiff_t ldb, T* c, std::ptrdiff_t ldc, bool accumulate) {
  using traits = TileTraits<T>;
  for (int i = 0; i < m; i += traits::kRows) {
    const T* a_rows = Layout == ALayout::row_major ? a + i * lda : a + i;
    for (int j = 0; j < n; j += traits::kCols)
      micro_product<traits::kRows, traits::kCols, Layout>(k, a_rows, lda, b + j, ldb,
                                                          c + i * ldc + j, ldc, accumulate);
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
