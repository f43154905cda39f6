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

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <string>

namespace kfa {
namespace Impl {

template <class ExecSpace>
constexpr bool nn_host_space() {
  return Kokkos::SpaceAccessibility<Kokkos::HostSpace,
                                    typename ExecSpace::memory_space>::accessible;
}

template <class F>
struct NnFlat2 {
  F m_f;
  std::int64_t m_cols;
  KOKKOS_FUNCTION void operator()(const std::int64_t n) const {
    m_f(int(n / m_cols), int(n % m_cols));
  }
};

template <class F>
struct NnFlat3 {
  F m_f;
  std::int64_t m_e1, m_e2;
  KOKKOS_FUNCTION void operator()(const std::int64_t n) const {
    const std::int64_t r = n / m_e2;
    m_f(int(r / m_e1), int(r % m_e1), int(n % m_e2));
  }
};

/// f(i, j) for i < e0, j < e1.
template <class ExecSpace, class F>
void nn_for(const char* label, const ExecSpace& space, int e0, int e1, const F& f) {
  if (e0 <= 0 || e1 <= 0) return;
  if constexpr (nn_host_space<ExecSpace>()) {
    using Rank = Kokkos::Rank<2, Kokkos::Iterate::Right, Kokkos::Iterate::Right>;
    Kokkos::parallel_for(label, Kokkos::MDRangePolicy<ExecSpace, Rank>(space, {0, 0}, {e0, e1}), f);
  } else {
    Kokkos::parallel_for(
        label, Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(
                   space, 0, std::int64_t(e0) * e1),
        NnFlat2<F>{f, e1});
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
    Kokkos::parallel_for(
        label, Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(
                   space, 0, std::int64_t(e0) * e1 * e2),
        NnFlat3<F>{f, e1, e2});
  }
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
  if (chunks > 1) {
    partial = Partial(Kokkos::view_alloc(Kokkos::WithoutInitializing,
                                         std::string("kfa::nn::column_sum_partials")),
                      N, chunks, cols);
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
