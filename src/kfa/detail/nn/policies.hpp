#ifndef KFA_DETAIL_NN_POLICIES_HPP
#define KFA_DETAIL_NN_POLICIES_HPP

// How the kfa::nn kernels walk their LayoutRight tensors. Kokkos' CUDA
// MDRange puts index 0 on threadIdx.x whatever the iteration pattern, so a
// warp would read one column of many rows; on GPUs the elementwise kernels
// run a flat range instead, the last index fastest (coalesced). Host spaces
// keep MDRange, iterating right.
//
// Column sums over the tokens (bias, LayerNorm and RMSNorm parameter
// gradients) cut the rows into fixed chunks: one thread per (chunk, column)
// sums its chunk in row order, then one thread per column adds the chunks in
// order. The order depends on the shape only, so results are bitwise
// reproducible, with chunks × columns threads instead of one per column.

#include <kfa/detail/common/workspace.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <cstring>
#include <string>

namespace kfa {
namespace Impl {

template <class ExecSpace>
constexpr bool nn_host_space() {
  return Kokkos::SpaceAccessibility<Kokkos::HostSpace,
                                    typename ExecSpace::memory_space>::accessible;
}

template <class F, class I>
struct NnFlat2 {
  F m_f;
  I m_cols;
  KOKKOS_FUNCTION void operator()(const I n) const { m_f(int(n / m_cols), int(n % m_cols)); }
};

template <class F, class I>
struct NnFlat3 {
  F m_f;
  I m_e1, m_e2;
  KOKKOS_FUNCTION void operator()(const I n) const {
    const I r = n / m_e2;
    m_f(int(r / m_e1), int(r % m_e1), int(n % m_e2));
  }
};

/// The flat range of `total` indices, 32-bit where they fit: a 64-bit
/// division per element costs several times the 32-bit one on GPUs.
template <class ExecSpace, class Flat32, class Flat64>
void nn_flat_for(const char* label, const ExecSpace& space, std::int64_t total, const Flat32& f32,
                 const Flat64& f64) {
  if (total <= 0x7fffffffLL) {
    Kokkos::parallel_for(label,
                         Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::uint32_t>>(
                             space, 0, std::uint32_t(total)),
                         f32);
  } else {
    Kokkos::parallel_for(
        label, Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(space, 0, total),
        f64);
  }
}

/// f(i, j) for i < e0, j < e1.
template <class ExecSpace, class F>
void nn_for(const char* label, const ExecSpace& space, int e0, int e1, const F& f) {
  if (e0 <= 0 || e1 <= 0) return;
  if constexpr (nn_host_space<ExecSpace>()) {
    using Rank = Kokkos::Rank<2, Kokkos::Iterate::Right, Kokkos::Iterate::Right>;
    Kokkos::parallel_for(label, Kokkos::MDRangePolicy<ExecSpace, Rank>(space, {0, 0}, {e0, e1}), f);
  } else {
    nn_flat_for(label, space, std::int64_t(e0) * e1, NnFlat2<F, std::uint32_t>{f, std::uint32_t(e1)},
                NnFlat2<F, std::int64_t>{f, e1});
  }
}

/// f(i, j, k) for i < e0, j < e1, k < e2.
template <class ExecSpace, class F>
void nn_for(const char* label, const ExecSpace& space, int e0, int e1, int e2, const F& f) {
  if (e0 <= 0 || e1 <= 0 || e2 <= 0) return;
  if constexpr (nn_host_space<ExecSpace>()) {
    using Rank = Kokkos::Rank<3, Kokkos::Iterate::Right, Kokkos::Iterate::Right>;
    Kokkos::parallel_for(
        label, Kokkos::MDRangePolicy<ExecSpace, Rank>(space, {0, 0, 0}, {e0, e1, e2}), f);
  } else {
    nn_flat_for(label, space, std::int64_t(e0) * e1 * e2,
                NnFlat3<F, std::uint32_t>{f, std::uint32_t(e1), std::uint32_t(e2)},
                NnFlat3<F, std::int64_t>{f, e1, e2});
  }
}

/// Elements of T per 16-byte access.
template <class T>
constexpr int nn_pack_width() {
  return 16 % sizeof(T) == 0 ? int(16 / sizeof(T)) : 1;
}

struct alignas(16) NnBytes16 {
  std::uint32_t word[4];
};

/// Whether every row of a LayoutRight matrix starts 16-byte aligned and
/// holds whole packs (empty matrices qualify).
template <class View>
bool nn_rows_packable(const View& m) {
  using T = typename View::non_const_value_type;
  constexpr int w = nn_pack_width<T>();
  return m.size() == 0 || (w > 1 && reinterpret_cast<std::uintptr_t>(m.data()) % 16 == 0 &&
                           m.extent(1) % w == 0);
}

/// The pack of nn_pack_width<T>() values at (row, j0), j0 a multiple of the
/// width, in one 16-byte load.
template <class View>
KOKKOS_FORCEINLINE_FUNCTION void nn_load_pack(const View& m, int row, int j0,
                                              typename View::non_const_value_type* out) {
  const NnBytes16 bytes = *reinterpret_cast<const NnBytes16*>(&m(row, j0));
  memcpy(static_cast<void*>(out), &bytes, 16);
}

template <class View>
KOKKOS_FORCEINLINE_FUNCTION void nn_store_pack(const View& m, int row, int j0,
                                               const typename View::non_const_value_type* in) {
  NnBytes16 bytes;
  memcpy(&bytes, static_cast<const void*>(in), 16);
  *reinterpret_cast<NnBytes16*>(&m(row, j0)) = bytes;
}

template <class F, int W>
struct NnPacked2 {
  F m_f;
  std::uint32_t m_packs;  // per row
  KOKKOS_FUNCTION void operator()(const std::uint32_t n) const {
    m_f.pack(int(n / m_packs), int(n % m_packs) * W);
  }
};

/// f(i, j) for i < e0, j < e1, as nn_for; on GPUs, when f.packable() (its
/// Views' rows are whole aligned packs of F::pack_width, a multiple of the
/// width in e1), f.pack(i, j0) does pack_width consecutive j at once: one
/// 16-byte access per operand and one index division per pack.
template <class ExecSpace, class F>
void nn_for_packed(const char* label, const ExecSpace& space, int e0, int e1, const F& f) {
  constexpr int w = F::pack_width;
  if constexpr (!nn_host_space<ExecSpace>() && w > 1) {
    if (e0 > 0 && e1 > 0 && e1 % w == 0 && std::int64_t(e0) * (e1 / w) <= 0x7fffffffLL &&
        f.packable()) {
      Kokkos::parallel_for(label,
                           Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::uint32_t>>(
                               space, 0, std::uint32_t(std::int64_t(e0) * (e1 / w))),
                           NnPacked2<F, w>{f, std::uint32_t(e1 / w)});
      return;
    }
  }
  nn_for(label, space, e0, e1, f);
}

/// Rows per chunk of a column sum.
constexpr int kNnSumChunkRows = 256;

/// Stage one: partial(k, chunk, col) = Σ_{rows of chunk} term(row, col)[k];
/// with a single chunk it calls finish(col, sums) itself.
template <class ExecSpace, class Acc, int N, class Term, class Finish>
struct NnChunkSum {
  Term m_term;
  Finish m_finish;
  Kokkos::View<Acc***, Kokkos::LayoutRight, typename ExecSpace::memory_space> m_partial;
  int m_rows, m_cols, m_chunks;

  KOKKOS_FUNCTION void operator()(const int chunk, const int col) const {
    Kokkos::Array<Acc, N> s;
    for (int k = 0; k < N; ++k) s[k] = Acc(0);
    const int end = m_rows < (chunk + 1) * kNnSumChunkRows ? m_rows : (chunk + 1) * kNnSumChunkRows;
    for (int row = chunk * kNnSumChunkRows; row < end; ++row) {
      const Kokkos::Array<Acc, N> t = m_term(row, col);
      for (int k = 0; k < N; ++k) s[k] += t[k];
    }
    if (m_chunks == 1) {
      m_finish(col, s);
    } else {
      for (int k = 0; k < N; ++k) m_partial(k, chunk, col) = s[k];
    }
  }
};

/// Stage two: finish(col, Σ_chunk partial(·, chunk, col)), chunks in order.
template <class ExecSpace, class Acc, int N, class Finish>
struct NnChunkTotal {
  Finish m_finish;
  Kokkos::View<const Acc***, Kokkos::LayoutRight, typename ExecSpace::memory_space> m_partial;

  KOKKOS_FUNCTION void operator()(const int col) const {
    Kokkos::Array<Acc, N> s;
    for (int k = 0; k < N; ++k) {
      s[k] = Acc(0);
      for (int chunk = 0; chunk < int(m_partial.extent(1)); ++chunk) s[k] += m_partial(k, chunk, col);
    }
    m_finish(col, s);
  }
};

/// finish(col, Σ_row term(row, col)) for col < cols, N sums at once (term
/// returns Kokkos::Array<Acc, N>), in the chunked order above.
template <class Acc, int N, class ExecSpace, class Term, class Finish>
void nn_column_sums(const char* label, const ExecSpace& space, int rows, int cols,
                    const Term& term, const Finish& finish) {
  if (cols <= 0) return;
  const int chunks = rows <= kNnSumChunkRows ? 1 : (rows + kNnSumChunkRows - 1) / kNnSumChunkRows;
  using Partial = Kokkos::View<Acc***, Kokkos::LayoutRight, typename ExecSpace::memory_space>;
  Partial partial;
  // The stream's cached workspace: an allocation per call would cost a
  // cudaMalloc and a device-wide wait in cudaFree.
  decltype(workspace(space, WorkspaceSlot::nn_column_sums, 0, "")) buffer;
  if (chunks > 1) {
    buffer = workspace(space, WorkspaceSlot::nn_column_sums,
                       workspace_bytes<Acc>(std::size_t(N) * chunks * cols),
                       "kfa::nn::column_sum_partials");
    partial = workspace_view<Partial>(buffer, N, chunks, cols);
  }
  nn_for(label, space, chunks, cols,
         NnChunkSum<ExecSpace, Acc, N, Term, Finish>{term, finish, partial, rows, cols, chunks});
  if (chunks > 1) {
    Kokkos::parallel_for(label, Kokkos::RangePolicy<ExecSpace>(space, 0, cols),
                         NnChunkTotal<ExecSpace, Acc, N, Finish>{finish, partial});
  }
}

}  // namespace Impl
}  // namespace kfa

#endif
