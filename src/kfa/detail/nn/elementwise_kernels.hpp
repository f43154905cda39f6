#ifndef KFA_DETAIL_NN_ELEMENTWISE_KERNELS_HPP
#define KFA_DETAIL_NN_ELEMENTWISE_KERNELS_HPP

// Elementwise steps on [tokens][features]: GELU (erf and tanh forms), SwiGLU,
// dropout and residual + dropout, each forward and backward. One thread per
// element, or on GPUs per 16-byte pack of a row where the rows allow it
// (nn_for_packed), arithmetic in the accumulator type. Dropout draws its keep mask
// from the attention kernels' counter-based generator keyed by (seed, token,
// feature), so the backward regenerates it instead of storing it.

#include <kfa/nn/options.hpp>
#include <kfa/types.hpp>

#include <kfa/detail/attention/dropout_generator.hpp>
#include <kfa/detail/backend/host/vector_math.hpp>
#include <kfa/detail/common/compat.hpp>
#include <kfa/detail/nn/policies.hpp>
#include <kfa/detail/nn/views.hpp>

namespace kfa {
namespace Impl {

/// erf for GELU. Host code in float: Abramowitz and Stegun 7.1.26
/// (|error| <= 1.5e-7, the formula of PyTorch's vectorised CPU erf) with
/// the host kernels' polynomial exp, plain arithmetic that a row loop
/// vectorises (the library call took most of the block's GELU time);
/// elsewhere math::erf.
template <class A>
KOKKOS_FORCEINLINE_FUNCTION A gelu_erf(A x) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__) || defined(__SYCL_DEVICE_ONLY__)
  return math::erf(x);
#else
  if constexpr (std::is_same<A, float>::value) {
    const float ax = x < 0.f ? -x : x;
    const float t = 1.f / (1.f + 0.3275911f * ax);
    const float poly =
        ((((1.061405429f * t - 1.453152027f) * t + 1.421413741f) * t - 0.284496736f) * t +
         0.254829592f) *
        t;
    const float y = 1.f - poly * Host::exp(-ax * ax);
    return x < 0.f ? -y : y;
  } else {
    return math::erf(x);
  }
#endif
}

/// GELU and its derivative in arithmetic A.
template <class A>
struct Gelu {
  KOKKOS_FORCEINLINE_FUNCTION static A value(A x, bool tanh_form) {
    if (tanh_form) return A(0.5) * x * (A(1) + math::tanh(tanh_argument(x)));
    return A(0.5) * x * (A(1) + gelu_erf(x * A(0.70710678118654752440)));
  }
  KOKKOS_FORCEINLINE_FUNCTION static A derivative(A x, bool tanh_form) {
    if (tanh_form) {
      const A t = math::tanh(tanh_argument(x));
      return A(0.5) * (A(1) + t) + A(0.5) * x * (A(1) - t * t) * A(0.79788456080286535588) *
                                       (A(1) + A(3 * 0.044715) * x * x);
    }
    // Φ(x) + x·φ(x)
    return A(0.5) * (A(1) + gelu_erf(x * A(0.70710678118654752440))) +
           x * A(0.39894228040143267794) * gelu_exp(A(-0.5) * x * x);
  }
  /// exp(x), x <= 0: the host kernels' polynomial one in host code.
  KOKKOS_FORCEINLINE_FUNCTION static A gelu_exp(A x) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__) || defined(__SYCL_DEVICE_ONLY__)
    return math::exp(x);
#else
    return Host::exp(x);
#endif
  }
  /// sqrt(2/π)·(x + 0.044715·x³)
  KOKKOS_FORCEINLINE_FUNCTION static A tanh_argument(A x) {
    return A(0.79788456080286535588) * (x + A(0.044715) * x * x * x);
  }
};

/// The logistic function; exp(-x) overflowing to +inf gives 0, not NaN.
template <class A>
KOKKOS_FORCEINLINE_FUNCTION A sigmoid(A x) {
  return A(1) / (A(1) + math::exp(-x));
}

template <class ExecSpace, class T>
struct GeluForward {
  using memory_space = typename ExecSpace::memory_space;
  using acc_t = accumulator_t<T>;
  static constexpr int pack_width = nn_pack_width<T>();
  NnIn2<T, memory_space> m_x;
  NnOut2<T, memory_space> m_y;
  bool m_tanh;
  KOKKOS_FUNCTION void operator()(const int token, const int j) const { at(token, j, m_tanh); }
  KOKKOS_FORCEINLINE_FUNCTION void at(const int token, const int j, bool tanh_form) const {
    m_y(token, j) = from_acc<T>(Gelu<acc_t>::value(to_acc<acc_t>(m_x(token, j)), tanh_form));
  }
  bool packable() const { return nn_rows_packable(m_x) && nn_rows_packable(m_y); }
  KOKKOS_FUNCTION void pack(const int token, const int j0) const {
    T v[pack_width];
    nn_load_pack(m_x, token, j0, v);
    for (int k = 0; k < pack_width; ++k)
      v[k] = from_acc<T>(Gelu<acc_t>::value(to_acc<acc_t>(v[k]), m_tanh));
    nn_store_pack(m_y, token, j0, v);
  }
};

template <class ExecSpace, class T>
struct GeluBackward {
  using memory_space = typename ExecSpace::memory_space;
  using acc_t = accumulator_t<T>;
  static constexpr int pack_width = nn_pack_width<T>();
  NnIn2<T, memory_space> m_x, m_dy;
  NnOut2<T, memory_space> m_dx;
  bool m_tanh;
  KOKKOS_FUNCTION void operator()(const int token, const int j) const { at(token, j, m_tanh); }
  KOKKOS_FORCEINLINE_FUNCTION void at(const int token, const int j, bool tanh_form) const {
    m_dx(token, j) = from_acc<T>(to_acc<acc_t>(m_dy(token, j)) *
                                 Gelu<acc_t>::derivative(to_acc<acc_t>(m_x(token, j)), tanh_form));
  }
  bool packable() const {
    return nn_rows_packable(m_x) && nn_rows_packable(m_dy) && nn_rows_packable(m_dx);
  }
  KOKKOS_FUNCTION void pack(const int token, const int j0) const {
    T x[pack_width], dy[pack_width];
    nn_load_pack(m_x, token, j0, x);
    nn_load_pack(m_dy, token, j0, dy);
    for (int k = 0; k < pack_width; ++k)
      x[k] = from_acc<T>(to_acc<acc_t>(dy[k]) * Gelu<acc_t>::derivative(to_acc<acc_t>(x[k]), m_tanh));
    nn_store_pack(m_dx, token, j0, x);
  }
};

/// y(t, j) = silu(x(t, j))·x(t, hidden + j): gate in the first half of x's
/// columns, up in the second.
template <class ExecSpace, class T>
struct SwigluForward {
  using memory_space = typename ExecSpace::memory_space;
  using acc_t = accumulator_t<T>;
  NnIn2<T, memory_space> m_x;
  NnOut2<T, memory_space> m_y;
  KOKKOS_FUNCTION void operator()(const int token, const int j) const {
    const acc_t gate = to_acc<acc_t>(m_x(token, j));
    const acc_t up = to_acc<acc_t>(m_x(token, int(m_y.extent(1)) + j));
    m_y(token, j) = from_acc<T>(gate * sigmoid(gate) * up);
  }
};

/// d gate = dy·up·σ(gate)·(1 + gate·(1 - σ(gate))), d up = dy·silu(gate).
template <class ExecSpace, class T>
struct SwigluBackward {
  using memory_space = typename ExecSpace::memory_space;
  using acc_t = accumulator_t<T>;
  NnIn2<T, memory_space> m_x, m_dy;
  NnOut2<T, memory_space> m_dx;
  KOKKOS_FUNCTION void operator()(const int token, const int j) const {
    const int hidden = static_cast<int>(m_dy.extent(1));
    const acc_t gate = to_acc<acc_t>(m_x(token, j)), up = to_acc<acc_t>(m_x(token, hidden + j));
    const acc_t dy = to_acc<acc_t>(m_dy(token, j));
    const acc_t s = sigmoid(gate);
    m_dx(token, j) = from_acc<T>(dy * up * s * (acc_t(1) + gate * (acc_t(1) - s)));
    m_dx(token, hidden + j) = from_acc<T>(dy * gate * s);
  }
};

/// Which token of the whole batch a rank's token is: a rank holding
/// positions [offset, offset + seqlen) of sequences of seqlen_global
/// (sequence parallelism) has token t at (t / seqlen)·seqlen_global + offset
/// + t % seqlen. Dropout masks are keyed by it, so that ranks sharing a
/// sequence draw the masks one rank would. The default is the identity.
struct NnTokenMap {
  int seqlen = 0, seqlen_global = 0, offset = 0;
  KOKKOS_FORCEINLINE_FUNCTION int global(int token) const {
    if (seqlen == seqlen_global) return token;
    return (token / seqlen) * seqlen_global + offset + token % seqlen;
  }
};

/// y = residual + Z∘x/(1 - p) (no residual: y = Z∘x/(1 - p)); also the
/// dropout backward (dx = Z∘dy/(1 - p)). y may be x or residual itself.
template <class ExecSpace, class T>
struct ResidualDropout {
  using memory_space = typename ExecSpace::memory_space;
  using acc_t = accumulator_t<T>;
  NnIn2<T, memory_space> m_residual, m_x;
  NnOut2<T, memory_space> m_y;
  DropoutGenerator m_generator;
  acc_t m_keep_scale;
  bool m_dropout;
  NnTokenMap m_tokens;
  static constexpr int pack_width = nn_pack_width<T>();
  KOKKOS_FUNCTION void operator()(const int token, const int j) const {
    acc_t x = to_acc<acc_t>(m_x(token, j));
    if (m_dropout) {
      const std::uint64_t row = m_generator.row_key(0, 0, m_tokens.global(token));
      x = m_generator.kept(row, j) ? x * m_keep_scale : acc_t(0);
    }
    m_y(token, j) =
        from_acc<T>(m_residual.extent(0) > 0 ? to_acc<acc_t>(m_residual(token, j)) + x : x);
  }
  bool packable() const {
    return nn_rows_packable(m_residual) && nn_rows_packable(m_x) && nn_rows_packable(m_y);
  }
  KOKKOS_FUNCTION void pack(const int token, const int j0) const {
    T x[pack_width], r[pack_width];
    nn_load_pack(m_x, token, j0, x);
    const bool has_residual = m_residual.extent(0) > 0;
    if (has_residual) nn_load_pack(m_residual, token, j0, r);
    const std::uint64_t row = m_dropout ? m_generator.row_key(0, 0, m_tokens.global(token)) : 0;
    for (int k = 0; k < pack_width; ++k) {
      acc_t v = to_acc<acc_t>(x[k]);
      if (m_dropout) v = m_generator.kept(row, j0 + k) ? v * m_keep_scale : acc_t(0);
      x[k] = from_acc<T>(has_residual ? to_acc<acc_t>(r[k]) + v : v);
    }
    nn_store_pack(m_y, token, j0, x);
  }
};


/// f(row, j, tanh_form) along each row of a [rows][n] matrix, a loop per
/// row and GELU form on host spaces (so that the erf form's loop has no
/// library call and vectorises); nn_for_packed(f) elsewhere.
template <class ExecSpace, class F>
void gelu_for_rows(const char* label, const ExecSpace& space, int rows, int n, const F& f) {
  if constexpr (nn_host_space<ExecSpace>()) {
    Kokkos::parallel_for(label, Kokkos::RangePolicy<ExecSpace>(space, 0, rows),
                         [=](const int row) {
                           if (f.m_tanh) {
                             for (int j = 0; j < n; ++j) f.at(row, j, true);
                           } else {
                             KFA_HOST_SIMD
                             for (int j = 0; j < n; ++j) f.at(row, j, false);
                           }
                         });
  } else {
    nn_for_packed(label, space, rows, n, f);
  }
}

template <class ExecSpace, class T>
void gelu_forward_impl(const ExecSpace& space, const NnIn2<T, typename ExecSpace::memory_space>& x,
                       const NnOut2<T, typename ExecSpace::memory_space>& y, bool tanh_form) {
  if (x.size() == 0) return;
  gelu_for_rows("kfa::nn::gelu::forward", space, int(x.extent(0)), int(x.extent(1)),
                GeluForward<ExecSpace, T>{x, y, tanh_form});
}

template <class ExecSpace, class T>
void gelu_backward_impl(const ExecSpace& space, const NnIn2<T, typename ExecSpace::memory_space>& x,
                        const NnIn2<T, typename ExecSpace::memory_space>& dy,
                        const NnOut2<T, typename ExecSpace::memory_space>& dx, bool tanh_form) {
  if (x.size() == 0) return;
  gelu_for_rows("kfa::nn::gelu::backward", space, int(x.extent(0)), int(x.extent(1)),
                GeluBackward<ExecSpace, T>{x, dy, dx, tanh_form});
}

template <class ExecSpace, class T>
void swiglu_forward_impl(const ExecSpace& space,
                         const NnIn2<T, typename ExecSpace::memory_space>& x,
                         const NnOut2<T, typename ExecSpace::memory_space>& y) {
  if (y.size() == 0) return;
  nn_for("kfa::nn::swiglu::forward", space, int(y.extent(0)), int(y.extent(1)), SwigluForward<ExecSpace, T>{x, y});
}

template <class ExecSpace, class T>
void swiglu_backward_impl(const ExecSpace& space,
                          const NnIn2<T, typename ExecSpace::memory_space>& x,
                          const NnIn2<T, typename ExecSpace::memory_space>& dy,
                          const NnOut2<T, typename ExecSpace::memory_space>& dx) {
  if (dy.size() == 0) return;
  nn_for("kfa::nn::swiglu::backward", space, int(dy.extent(0)), int(dy.extent(1)), SwigluBackward<ExecSpace, T>{x, dy, dx});
}

/// y = residual + dropout(x) (residual empty: y = dropout(x)); p = 0 adds or
/// copies. `tokens` places x's rows in the batch (sequence parallelism).
template <class ExecSpace, class T>
void residual_dropout_impl(const ExecSpace& space, const char* label,
                           const NnIn2<T, typename ExecSpace::memory_space>& residual,
                           const NnIn2<T, typename ExecSpace::memory_space>& x,
                           const NnOut2<T, typename ExecSpace::memory_space>& y,
                           const nn::DropoutOptions& options, const NnTokenMap& tokens = {}) {
  using acc_t = accumulator_t<T>;
  if (x.size() == 0) return;
  const bool dropout = options.p > 0;
  // Dropout off, no residual, in place: nothing to do.
  if (!dropout && residual.extent(0) == 0 && x.data() == y.data()) return;
  nn_for_packed(label, space, int(x.extent(0)), int(x.extent(1)), ResidualDropout<ExecSpace, T>{
                           residual, x, y, DropoutGenerator(options.p, options.seed),
                           dropout ? acc_t(1.0 / (1.0 - options.p)) : acc_t(1), dropout, tokens});
}

}  // namespace Impl
}  // namespace kfa

#endif
