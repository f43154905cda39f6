#ifndef KFA_DETAIL_NN_LINEAR_IMPL_HPP
#define KFA_DETAIL_NN_LINEAR_IMPL_HPP

// y = x·Wᵀ + b and its backward. The three products are KokkosBlas::gemm
// calls on the caller's row-major matrices; the bias is added by one pass
// over y, and its gradient is a column sum over the tokens that one thread
// per feature adds in token order (reproducible, no atomics).
//
// 16-bit value types: on CUDA the products run on the tensor cores
// (cublasGemmEx, fp32 accumulation, one rounding into C). Elsewhere they run
// in fp32 on fp32 copies of A and B into an fp32 C, a workspace that one pass
// then rounds into the 16-bit result, the bias or the value already there
// added in fp32 on the way; gradients held in fp32 take the product
// directly. Kokkos Kernels does not
// multiply 16-bit operands into an fp32 C: 4.x converts between the value
// types only implicitly (Kokkos' half_t and bhalf_t convert to float
// explicitly), 3.4 has no ArithTraits for kfa's own bfloat16.

#include <kfa/types.hpp>

#include <kfa/detail/backend/cuda/tensor_core_gemm.hpp>
#include <kfa/detail/common/compat.hpp>
#include <kfa/detail/nn/checks.hpp>
#include <kfa/detail/nn/policies.hpp>
#include <kfa/detail/nn/views.hpp>

#include <string>

namespace kfa {
namespace Impl {

/// The fp32 buffers of the 16-bit products: the product and the copies of
/// its two operands, each one allocation grown on demand that the products
/// of a call share in stream order. A matrix it hands out is valid until
/// the next request for the same slot.
template <class ExecSpace, class T>
class NnScratch {
 public:
  using acc_t = accumulator_t<T>;
  using memory_space = typename ExecSpace::memory_space;
  enum Slot { kProduct, kOperandA, kOperandB };

  NnOut2<acc_t, memory_space> matrix(const ExecSpace& space, Slot slot, std::size_t rows,
                                     std::size_t cols) {
    static const char* const labels[] = {"kfa::nn::fp32_product", "kfa::nn::fp32_operand_a",
                                         "kfa::nn::fp32_operand_b"};
    auto& buffer = m_buffers[slot];
    const std::size_t n = rows * cols;
    if (buffer.extent(0) < n) {
      // The old buffer may still be read by work enqueued on `space`.
      space.fence();
      buffer = Kokkos::View<acc_t*, memory_space>(
          Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(labels[slot])), n);
    }
    return NnOut2<acc_t, memory_space>(buffer.data(), rows, cols);
  }

  std::size_t bytes() const {
    std::size_t bytes = 0;
    for (const auto& buffer : m_buffers) bytes += buffer.span() * sizeof(acc_t);
    return bytes;
  }
  void release() {
    for (auto& buffer : m_buffers) buffer = Kokkos::View<acc_t*, memory_space>();
  }

 private:
  Kokkos::View<acc_t*, memory_space> m_buffers[3];
};

template <class ExecSpace, class T>
struct BiasAdd {
  using memory_space = typename ExecSpace::memory_space;
  NnOut2<T, memory_space> m_y;
  NnIn1<T, memory_space> m_bias;

  KOKKOS_FUNCTION void operator()(const int token, const int feature) const {
    using acc_t = accumulator_t<T>;
    m_y(token, feature) = from_acc<T>(to_acc<acc_t>(m_y(token, feature)) + to_acc<acc_t>(m_bias(feature)));
  }

  static void launch(const ExecSpace& space, const NnOut2<T, memory_space>& y,
                     const NnIn1<T, memory_space>& bias) {
    nn_for("kfa::nn::linear::bias", space, int(y.extent(0)), int(y.extent(1)), BiasAdd{y, bias});
  }
};

/// c = product (+ bias(column)) (+ c when accumulating), summed in fp32 and
/// rounded once: the epilogue of a 16-bit product.
template <class ExecSpace, class T>
struct StoreProduct {
  using memory_space = typename ExecSpace::memory_space;
  using acc_t = accumulator_t<T>;
  NnIn2<acc_t, memory_space> m_product;
  NnIn1<T, memory_space> m_bias;
  NnOut2<T, memory_space> m_c;
  bool m_accumulate;

  KOKKOS_FUNCTION void operator()(const int row, const int column) const {
    acc_t value = m_product(row, column);
    if (m_bias.extent(0) > 0) value += to_acc<acc_t>(m_bias(column));
    if (m_accumulate) value += to_acc<acc_t>(m_c(row, column));
    m_c(row, column) = from_acc<T>(value);
  }

  static void launch(const ExecSpace& space, const NnIn2<acc_t, memory_space>& product,
                     const NnIn1<T, memory_space>& bias, const NnOut2<T, memory_space>& c,
                     bool accumulate) {
    nn_for("kfa::nn::linear::store_fp32_product", space, int(c.extent(0)), int(c.extent(1)),
           StoreProduct{product, bias, c, accumulate});
  }
};

/// sum(column) += Σ_token m(token, column), summed in the accumulator type
/// (sum of type G: T, or fp32 gradients of a 16-bit T).
template <class ExecSpace, class T, class G = T>
struct ColumnSum {
  using memory_space = typename ExecSpace::memory_space;
  using acc_t = accumulator_t<T>;

  struct Term {
    NnIn2<T, memory_space> m_m;
    KOKKOS_FUNCTION Kokkos::Array<acc_t, 1> operator()(const int token, const int column) const {
      return {to_acc<acc_t>(m_m(token, column))};
    }
  };
  struct Finish {
    NnOut1<G, memory_space> m_sum;
    KOKKOS_FUNCTION void operator()(const int column, const Kokkos::Array<acc_t, 1>& s) const {
      m_sum(column) = from_acc<G>(to_acc<acc_t>(m_sum(column)) + s[0]);
    }
  };

  static void launch(const ExecSpace& space, const char* label,
                     const NnIn2<T, memory_space>& m, const NnOut1<G, memory_space>& sum) {
    nn_column_sums<acc_t, 1>(label, space, int(m.extent(0)), int(m.extent(1)), Term{m},
                             Finish{sum});
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
#if defined(KOKKOS_ENABLE_CUDA) && defined(KOKKOSKERNELS_ENABLE_TPL_CUBLAS)
  // Float and double on CUDA go to cuBLAS, which does not read C at beta 0.
  constexpr bool reads_c_at_beta_zero =
      !(std::is_same<ExecSpace, Kokkos::Cuda>::value &&
        (std::is_same<T, float>::value || std::is_same<T, double>::value));
#else
  constexpr bool reads_c_at_beta_zero = true;
#endif
  if (reads_c_at_beta_zero && beta == T(0)) {
    // BLAS reads C only when beta != 0, but a NaN left in C from earlier
    // work must not leak through 0·NaN in an implementation that does.
    Kokkos::deep_copy(space, c, T(0));
  }
  gemm(space, trans_a, trans_b, alpha, a, b, beta, c);
}

/// out = in in fp32: an operand of a 16-bit product.
template <class ExecSpace, class T>
struct ToAcc {
  using memory_space = typename ExecSpace::memory_space;
  using acc_t = accumulator_t<T>;
  NnIn2<T, memory_space> m_in;
  NnOut2<acc_t, memory_space> m_out;
  KOKKOS_FUNCTION void operator()(const int i, const int j) const {
    m_out(i, j) = to_acc<acc_t>(m_in(i, j));
  }

  static NnOut2<acc_t, memory_space> copy(const ExecSpace& space, NnScratch<ExecSpace, T>& scratch,
                                          typename NnScratch<ExecSpace, T>::Slot slot,
                                          const NnIn2<T, memory_space>& in) {
    const auto out = scratch.matrix(space, slot, in.extent(0), in.extent(1));
    if (in.size() > 0) {
      nn_for("kfa::nn::linear::fp32_operand", space, int(in.extent(0)), int(in.extent(1)),
             ToAcc{in, out});
    }
    return out;
  }
};

/// c [fp32] = op(a)·op(b) + beta·c for a, b of the value type T: 16-bit
/// operands are multiplied as fp32 copies.
template <class ExecSpace, class T>
void nn_gemm_acc(const ExecSpace& space, const char* trans_a, const char* trans_b,
                 const NnIn2<T, typename ExecSpace::memory_space>& a,
                 const NnIn2<T, typename ExecSpace::memory_space>& b, accumulator_t<T> beta,
                 const NnOut2<accumulator_t<T>, typename ExecSpace::memory_space>& c,
                 NnScratch<ExecSpace, T>& scratch) {
  using acc_t = accumulator_t<T>;
  using scratch_type = NnScratch<ExecSpace, T>;
  if (c.extent(0) == 0 || c.extent(1) == 0) return;
#ifdef KOKKOS_ENABLE_CUDA
  if constexpr (tensor_core_gemm_applies<ExecSpace, NnIn2<T, typename ExecSpace::memory_space>,
                                         NnIn2<T, typename ExecSpace::memory_space>,
                                         NnOut2<acc_t, typename ExecSpace::memory_space>>()) {
    if (tensor_core_gemm(space, trans_a, trans_b, 1.f, a, b, float(beta), c)) return;
  }
#endif
  if constexpr (nn_is_16bit<T>()) {
    nn_gemm(space, trans_a, trans_b, acc_t(1),
            ToAcc<ExecSpace, T>::copy(space, scratch, scratch_type::kOperandA, a),
            ToAcc<ExecSpace, T>::copy(space, scratch, scratch_type::kOperandB, b), beta, c);
  } else {
    nn_gemm(space, trans_a, trans_b, acc_t(1), a, b, beta, c);
  }
}

/// c = op(a)·op(b) (+ bias(column)) (+ c when accumulating), c of the value
/// type: straight into c for double and float and for the 16-bit types on
/// CUDA, through the fp32 scratch for the 16-bit types elsewhere.
template <class ExecSpace, class T>
void nn_product(const ExecSpace& space, const char* trans_a, const char* trans_b,
                const NnIn2<T, typename ExecSpace::memory_space>& a,
                const NnIn2<T, typename ExecSpace::memory_space>& b,
                const NnIn1<T, typename ExecSpace::memory_space>& bias,
                const NnOut2<T, typename ExecSpace::memory_space>& c, bool accumulate,
                NnScratch<ExecSpace, T>& scratch) {
  if (c.extent(0) == 0 || c.extent(1) == 0) return;
#ifdef KOKKOS_ENABLE_CUDA
  // Straight into c, rounded once by cuBLAS; a bias is added in fp32 by
  // cuBLASLt's epilogue before that rounding (else through the fp32 scratch).
  if constexpr (tensor_core_gemm_applies<ExecSpace, NnIn2<T, typename ExecSpace::memory_space>,
                                         NnIn2<T, typename ExecSpace::memory_space>,
                                         NnOut2<T, typename ExecSpace::memory_space>>()) {
    if (bias.extent(0) == 0 &&
        tensor_core_gemm(space, trans_a, trans_b, 1.f, a, b, accumulate ? 1.f : 0.f, c))
      return;
    if (bias.extent(0) > 0 &&
        tensor_core_gemm_bias(space, trans_a, trans_b, a, b, bias, accumulate, c))
      return;
  }
#endif
  if constexpr (!nn_is_16bit<T>()) {
    nn_gemm(space, trans_a, trans_b, T(1), a, b, accumulate ? T(1) : T(0), c);
    if (bias.extent(0) > 0) BiasAdd<ExecSpace, T>::launch(space, c, bias);
  } else {
    const auto product =
        scratch.matrix(space, NnScratch<ExecSpace, T>::kProduct, c.extent(0), c.extent(1));
    nn_gemm_acc<ExecSpace, T>(space, trans_a, trans_b, a, b, 0, product, scratch);
    StoreProduct<ExecSpace, T>::launch(space, product, bias, c, accumulate);
  }
}

/// y [tokens][out] = x [tokens][in] · weight [out][in]ᵀ (+ bias [out]).
template <class ExecSpace, class T>
void linear_forward_impl(const ExecSpace& space,
                         const NnIn2<T, typename ExecSpace::memory_space>& x,
                         const NnIn2<T, typename ExecSpace::memory_space>& weight,
                         const NnIn1<T, typename ExecSpace::memory_space>& bias,
                         const NnOut2<T, typename ExecSpace::memory_space>& y,
                         NnScratch<ExecSpace, T>& scratch) {
  nn_product<ExecSpace, T>(space, "N", "T", x, weight, bias, y, false, scratch);
}

/// dx = dy·weight (written, or added with accumulate_dx; skipped when dx is
/// empty), dweight += dyᵀ·x, dbias += Σ_tokens dy (skipped when empty). The
/// gradients dweight and dbias are of type G: T, or fp32 for a 16-bit T.
template <class ExecSpace, class T, class G = T>
void linear_backward_impl(const ExecSpace& space,
                          const NnIn2<T, typename ExecSpace::memory_space>& x,
                          const NnIn2<T, typename ExecSpace::memory_space>& weight,
                          const NnIn2<T, typename ExecSpace::memory_space>& dy,
                          const NnOut2<T, typename ExecSpace::memory_space>& dx,
                          const NnOut2<G, typename ExecSpace::memory_space>& dweight,
                          const NnOut1<G, typename ExecSpace::memory_space>& dbias,
                          NnScratch<ExecSpace, T>& scratch, bool accumulate_dx = false) {
  static_assert(std::is_same<G, T>::value || std::is_same<G, accumulator_t<T>>::value,
                "kfa::nn: gradients are of the value type or of its accumulator type");
  if (dx.extent(0) > 0)
    nn_product<ExecSpace, T>(space, "N", "N", dy, weight, {}, dx, accumulate_dx, scratch);
  if constexpr (std::is_same<G, accumulator_t<T>>::value) {
    nn_gemm_acc<ExecSpace, T>(space, "T", "N", dy, x, G(1), dweight, scratch);
  } else {
    nn_product<ExecSpace, T>(space, "T", "N", dy, x, {}, dweight, true, scratch);
  }
  if (dbias.extent(0) > 0)
    ColumnSum<ExecSpace, T, G>::launch(space, "kfa::nn::linear::dbias", dy, dbias);
}

}  // namespace Impl
}  // namespace kfa

#endif
