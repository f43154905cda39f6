#ifndef KFA_DETAIL_NN_LINEAR_IMPL_HPP
#define KFA_DETAIL_NN_LINEAR_IMPL_HPP

// y = x·Wᵀ + b and its backward. The three products are KokkosBlas::gemm
// calls on the caller's row-major matrices; the bias is added by one pass
// over y, and its gradient is a column sum over the tokens that one thread
// per feature adds in token order (reproducible, no atomics).

#include <kfa/types.hpp>

#include <kfa/detail/common/compat.hpp>
#include <kfa/detail/nn/views.hpp>

namespace kfa {
namespace Impl {

template <class ExecSpace, class T>
struct BiasAdd {
  using memory_space = typename ExecSpace::memory_space;
  NnOut2<T, memory_space> m_y;
  NnIn1<T, memory_space> m_bias;

  KOKKOS_FUNCTION void operator()(const int token, const int feature) const {
    m_y(token, feature) += m_bias(feature);
  }

  static void launch(const ExecSpace& space, const NnOut2<T, memory_space>& y,
                     const NnIn1<T, memory_space>& bias) {
    Kokkos::parallel_for("kfa::nn::linear::bias",
                         Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>>(
                             space, {0, 0}, {int(y.extent(0)), int(y.extent(1))}),
                         BiasAdd{y, bias});
  }
};

/// sum(column) += Σ_token m(token, column), summed in the accumulator type.
template <class ExecSpace, class T>
struct ColumnSum {
  using memory_space = typename ExecSpace::memory_space;
  using acc_t = accumulator_t<T>;
  NnIn2<T, memory_space> m_m;
  NnOut1<T, memory_space> m_sum;

  KOKKOS_FUNCTION void operator()(const int column) const {
    acc_t s = 0;
    for (int token = 0; token < int(m_m.extent(0)); ++token) s += m_m(token, column);
    m_sum(column) = static_cast<T>(acc_t(m_sum(column)) + s);
  }

  static void launch(const ExecSpace& space, const char* label,
                     const NnIn2<T, memory_space>& m, const NnOut1<T, memory_space>& sum) {
    Kokkos::parallel_for(label, Kokkos::RangePolicy<ExecSpace>(space, 0, int(m.extent(1))),
                         ColumnSum{m, sum});
  }
};

/// C = alpha·op(A)·op(B) + beta·C; with an empty inner dimension C becomes
/// beta·C (Kokkos Kernels needs no call then, and some versions reject it).
template <class ExecSpace, class A, class B, class C>
void nn_gemm(const ExecSpace& space, const char* trans_a, const char* trans_b,
             typename C::const_value_type alpha, const A& a, const B& b,
             typename C::const_value_type beta, const C& c) {
  using T = typename C::non_const_value_type;
  if (c.extent(0) == 0 || c.extent(1) == 0) return;
  const std::size_t inner = trans_a[0] == 'N' ? a.extent(1) : a.extent(0);
  if (inner == 0) {
    if (beta == T(0)) Kokkos::deep_copy(space, c, T(0));
    return;
  }
  if (beta == T(0)) {
    // BLAS reads C only when beta != 0, but a NaN left in C from earlier
    // work must not leak through 0·NaN in an implementation that does.
    Kokkos::deep_copy(space, c, T(0));
  }
  gemm(space, trans_a, trans_b, alpha, a, b, beta, c);
}

/// y [tokens][out] = x [tokens][in] · weight [out][in]ᵀ (+ bias [out]).
template <class ExecSpace, class T>
void linear_forward_impl(const ExecSpace& space,
                         const NnIn2<T, typename ExecSpace::memory_space>& x,
                         const NnIn2<T, typename ExecSpace::memory_space>& weight,
                         const NnIn1<T, typename ExecSpace::memory_space>& bias,
                         const NnOut2<T, typename ExecSpace::memory_space>& y) {
  nn_gemm(space, "N", "T", T(1), x, weight, T(0), y);
  if (bias.extent(0) > 0 && y.extent(0) > 0) BiasAdd<ExecSpace, T>::launch(space, y, bias);
}

/// dx = dy·weight (written, or added with accumulate_dx; skipped when dx is
/// empty), dweight += dyᵀ·x, dbias += Σ_tokens dy (skipped when empty).
template <class ExecSpace, class T>
void linear_backward_impl(const ExecSpace& space,
                          const NnIn2<T, typename ExecSpace::memory_space>& x,
                          const NnIn2<T, typename ExecSpace::memory_space>& weight,
                          const NnIn2<T, typename ExecSpace::memory_space>& dy,
                          const NnOut2<T, typename ExecSpace::memory_space>& dx,
                          const NnOut2<T, typename ExecSpace::memory_space>& dweight,
                          const NnOut1<T, typename ExecSpace::memory_space>& dbias,
                          bool accumulate_dx = false) {
  if (dx.extent(0) > 0) nn_gemm(space, "N", "N", T(1), dy, weight, accumulate_dx ? T(1) : T(0), dx);
  nn_gemm(space, "T", "N", T(1), dy, x, T(1), dweight);
  if (dbias.extent(0) > 0)
    ColumnSum<ExecSpace, T>::launch(space, "kfa::nn::linear::dbias", dy, dbias);
}

}  // namespace Impl
}  // namespace kfa

#endif
