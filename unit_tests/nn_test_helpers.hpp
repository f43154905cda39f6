#ifndef KFA_NN_TEST_HELPERS_HPP
#define KFA_NN_TEST_HELPERS_HPP

// Test machinery of kfa::nn: the (backend, value type) list, host tensors as
// device Views and back, and the fp64 host oracles of every step (sums in
// long double), written from the textbook definitions, independently of
// the kernels.

#include <kfa/nn.hpp>

#include "kfa_test_helpers.hpp"

#include <array>
#include <cmath>
#include <string>
#include <vector>

namespace kfa_test {

using NnConfigs = ::testing::Types<
#ifdef KOKKOS_ENABLE_CUDA
    Config<Kokkos::Cuda, double>, Config<Kokkos::Cuda, float>,
#endif
#ifdef KOKKOS_ENABLE_OPENMP
    Config<Kokkos::OpenMP, double>, Config<Kokkos::OpenMP, float>,
#endif
#ifdef KOKKOS_ENABLE_SERIAL
    Config<Kokkos::Serial, double>, Config<Kokkos::Serial, float>
#endif
    >;

template <class T, class Space>
using DeviceView1 = Kokkos::View<T*, Kokkos::LayoutRight, typename Space::memory_space>;

/// A host tensor as a device View of rank ViewType::rank (same extents).
template <class ViewType>
ViewType make_view(const Tensor& t, const std::string& label) {
  using T = typename ViewType::non_const_value_type;
  constexpr int rank = static_cast<int>(ViewType::rank);
  const auto e = [&](int r) { return r < int(t.ext.size()) ? std::size_t(t.ext[r]) : 0; };
  ViewType view;
  if constexpr (rank == 1) view = ViewType(label, e(0));
  if constexpr (rank == 2) view = ViewType(label, e(0), e(1));
  if constexpr (rank == 3) view = ViewType(label, e(0), e(1), e(2));
  if constexpr (rank == 4) view = ViewType(label, e(0), e(1), e(2), e(3));
  auto host = Kokkos::create_mirror_view(view);
  for (std::size_t n = 0; n < t.data.size(); ++n) host.data()[n] = static_cast<T>(t.data[n]);
  Kokkos::deep_copy(view, host);
  return view;
}

inline Tensor random_tensor(std::vector<int> ext, std::mt19937_64& rng, double scale = 1.0) {
  Tensor t(std::move(ext));
  fill_random(t, rng, scale);
  return t;
}

/// Rounds to T (inputs then are exact in the value type under test).
template <class T>
Tensor rounded(Tensor t) {
  for (double& x : t.data) x = static_cast<double>(static_cast<T>(x));
  return t;
}

/// Checks max|got - ref| <= factor·eps_T·max(1, max|ref|).
template <class T>
void expect_close_rel(const std::string& what, const Tensor& got, const Tensor& ref,
                      double factor) {
  ASSERT_EQ(got.data.size(), ref.data.size()) << what;
  const double err = max_abs_diff(got, ref);
  const double bound = factor * epsilon<T>() * std::max(1.0, max_abs(ref));
  EXPECT_LE(err, bound) << what << ": error " << err << ", bound " << bound << " (max|ref| "
                        << max_abs(ref) << ")";
}

using LD = long double;

inline int rows_of(const Tensor& t) { return int(t.data.size() / std::size_t(t.ext.back())); }
inline double& at2(Tensor& t, int r, int c) { return t.data[std::size_t(r) * t.ext.back() + c]; }
inline double at2(const Tensor& t, int r, int c) {
  return t.data[std::size_t(r) * t.ext.back() + c];
}

/// y [rows][out] = x·wᵀ + b (b may be empty).
inline Tensor ref_linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  const int rows = rows_of(x), in = x.ext.back(), out = w.ext[0];
  Tensor y({rows, out});
  for (int r = 0; r < rows; ++r)
    for (int o = 0; o < out; ++o) {
      LD s = b.data.empty() ? 0 : b.data[o];
      for (int i = 0; i < in; ++i) s += LD(at2(x, r, i)) * at2(w, o, i);
      at2(y, r, o) = double(s);
    }
  return y;
}

/// dx = dy·w; dw += dyᵀ·x; db += Σ dy.
inline void ref_linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor& dx,
                                Tensor& dw, Tensor& db) {
  const int rows = rows_of(x), in = x.ext.back(), out = w.ext[0];
  dx = Tensor({rows, in});
  for (int r = 0; r < rows; ++r)
    for (int i = 0; i < in; ++i) {
      LD s = 0;
      for (int o = 0; o < out; ++o) s += LD(at2(dy, r, o)) * at2(w, o, i);
      at2(dx, r, i) = double(s);
    }
  for (int o = 0; o < out; ++o) {
    for (int i = 0; i < in; ++i) {
      LD s = 0;
      for (int r = 0; r < rows; ++r) s += LD(at2(dy, r, o)) * at2(x, r, i);
      at2(dw, o, i) += double(s);
    }
    if (!db.data.empty()) {
      LD s = 0;
      for (int r = 0; r < rows; ++r) s += at2(dy, r, o);
      db.data[o] += double(s);
    }
  }
}

/// Mean (0 for RMSNorm) and rstd of row r.
inline void ref_norm_stats(const Tensor& x, int r, double eps, bool rms, LD& mean, LD& rstd) {
  const int n = x.ext.back();
  LD var = 0;
  mean = 0;
  if (!rms) {
    for (int j = 0; j < n; ++j) mean += at2(x, r, j);
    mean /= n;
  }
  for (int j = 0; j < n; ++j) var += (at2(x, r, j) - mean) * (at2(x, r, j) - mean);
  rstd = 1 / std::sqrt(var / n + eps);
}

/// LayerNorm (rms = false) or RMSNorm over the last extent.
inline Tensor ref_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps,
                       bool rms) {
  const int rows = rows_of(x), n = x.ext.back();
  Tensor y({rows, n});
  for (int r = 0; r < rows; ++r) {
    LD mean, rstd;
    ref_norm_stats(x, r, eps, rms, mean, rstd);
    for (int j = 0; j < n; ++j)
      at2(y, r, j) = double((at2(x, r, j) - mean) * rstd * gamma.data[j] +
                            (beta.data.empty() ? 0 : beta.data[j]));
  }
  return y;
}

/// dx of the norm (written); dgamma, dbeta accumulated.
inline void ref_norm_backward(const Tensor& x, const Tensor& gamma, double eps, bool rms,
                              const Tensor& dy, Tensor& dx, Tensor& dgamma, Tensor& dbeta) {
  const int rows = rows_of(x), n = x.ext.back();
  dx = Tensor({rows, n});
  for (int r = 0; r < rows; ++r) {
    LD mean, rstd;
    ref_norm_stats(x, r, eps, rms, mean, rstd);
    // dx_k = Σ_j dy_j γ_j ∂y_j/∂x_k with ∂x̂_j/∂x_k = rstd(δ_jk - [!rms]/n - x̂_j x̂_k / n).
    for (int k = 0; k < n; ++k) {
      const LD xk = (at2(x, r, k) - mean) * rstd;
      LD s = 0;
      for (int j = 0; j < n; ++j) {
        const LD xj = (at2(x, r, j) - mean) * rstd;
        const LD dxhat = rstd * ((j == k ? 1 : 0) - (rms ? 0 : LD(1) / n) - xj * xk / n);
        s += LD(at2(dy, r, j)) * gamma.data[j] * dxhat;
      }
      at2(dx, r, k) = double(s);
      dgamma.data[k] += double(LD(at2(dy, r, k)) * xk);
      if (!dbeta.data.empty()) dbeta.data[k] += at2(dy, r, k);
    }
  }
}

/// Rotary embedding of [batch][seqlen][heads][head_dim] (sign -1: inverse).
inline Tensor ref_rotary(const Tensor& x, const kfa::nn::RotaryOptions& o, int sign) {
  Tensor y = x;
  const int B = x.ext[0], S = x.ext[1], H = x.ext[2], D = x.ext[3];
  const int rd = o.rotary_dim == 0 ? D : o.rotary_dim;
  for (int b = 0; b < B; ++b)
    for (int i = 0; i < S; ++i)
      for (int h = 0; h < H; ++h)
        for (int j = 0; j < rd / 2; ++j) {
          const LD angle = LD(o.position_offset + i) * std::pow(LD(o.base), LD(-2.0) * j / rd);
          const LD c = std::cos(angle), s = sign * std::sin(angle);
          const bool inter = o.style == kfa::nn::RotaryStyle::interleaved;
          const int p1 = inter ? 2 * j : j, p2 = inter ? 2 * j + 1 : j + rd / 2;
          const LD x1 = x.at(b, i, h, p1), x2 = x.at(b, i, h, p2);
          y.at(b, i, h, p1) = double(x1 * c - x2 * s);
          y.at(b, i, h, p2) = double(x2 * c + x1 * s);
        }
  return y;
}

/// Row-major coordinates of token t of a grid with `axes` axes.
inline std::array<int, 3> ref_coordinates(int t, int axes, const int* extent) {
  std::array<int, 3> c{0, 0, 0};
  for (int a = axes - 1; a >= 0; --a) {
    c[a] = t % extent[a];
    t /= extent[a];
  }
  return c;
}

/// Axial rotary embedding of [batch][seqlen][heads][head_dim] (sign -1: inverse),
/// written from the definition: chunk a of the rotary features is a 1D rotary
/// embedding of coordinate scale[a]·(offset[a] + c[a]).
inline Tensor ref_axial_rotary(const Tensor& x, const kfa::nn::AxialRotaryOptions& o, int sign) {
  Tensor y = x;
  const int B = x.ext[0], S = x.ext[1], H = x.ext[2], D = x.ext[3];
  const int rd = o.rotary_dim == 0 ? D : o.rotary_dim, w = rd / o.axes;
  const bool inter = o.style == kfa::nn::RotaryStyle::interleaved;
  for (int b = 0; b < B; ++b)
    for (int i = 0; i < S; ++i) {
      const auto c = ref_coordinates(i, o.axes, o.extent);
      for (int h = 0; h < H; ++h)
        for (int a = 0; a < o.axes; ++a)
          for (int j = 0; j < w / 2; ++j) {
            const LD angle =
                LD(o.scale[a]) * (LD(o.offset[a]) + c[a]) * std::pow(LD(o.base), LD(-2.0) * j / w);
            const LD cs = std::cos(angle), sn = sign * std::sin(angle);
            const int p1 = a * w + (inter ? 2 * j : j),
                      p2 = a * w + (inter ? 2 * j + 1 : j + w / 2);
            const LD x1 = x.at(b, i, h, p1), x2 = x.at(b, i, h, p2);
            y.at(b, i, h, p1) = double(x1 * cs - x2 * sn);
            y.at(b, i, h, p2) = double(x2 * cs + x1 * sn);
          }
    }
  return y;
}

inline LD ref_gelu(LD x, bool tanh_form) {
  if (tanh_form) {
    const LD k = std::sqrt(LD(2) / LD(M_PI));
    return LD(0.5) * x * (1 + std::tanh(k * (x + LD(0.044715) * x * x * x)));
  }
  return LD(0.5) * x * (1 + std::erf(x / std::sqrt(LD(2))));
}
inline LD ref_gelu_grad(LD x, bool tanh_form) {
  if (tanh_form) {
    const LD k = std::sqrt(LD(2) / LD(M_PI)), t = std::tanh(k * (x + LD(0.044715) * x * x * x));
    return LD(0.5) * (1 + t) + LD(0.5) * x * (1 - t * t) * k * (1 + 3 * LD(0.044715) * x * x);
  }
  return LD(0.5) * (1 + std::erf(x / std::sqrt(LD(2)))) +
         x * std::exp(-x * x / 2) / std::sqrt(2 * LD(M_PI));
}
inline LD ref_sigmoid(LD x) { return 1 / (1 + std::exp(-x)); }

/// act(u): GELU forms elementwise, SwiGLU silu(gate)·up over [gate | up].
inline Tensor ref_activation(const Tensor& u, kfa::nn::Activation act) {
  const int rows = rows_of(u), n = u.ext.back();
  const bool glu = act == kfa::nn::Activation::swiglu;
  const int out = glu ? n / 2 : n;
  Tensor g({rows, out});
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < out; ++j) {
      const LD a = at2(u, r, j);
      at2(g, r, j) = glu ? double(a * ref_sigmoid(a) * at2(u, r, out + j))
                         : double(ref_gelu(a, act == kfa::nn::Activation::gelu_tanh));
    }
  return g;
}

inline Tensor ref_activation_backward(const Tensor& u, const Tensor& dg,
                                      kfa::nn::Activation act) {
  const int rows = rows_of(u), n = u.ext.back();
  const bool glu = act == kfa::nn::Activation::swiglu;
  const int out = glu ? n / 2 : n;
  Tensor du({rows, n});
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < out; ++j) {
      const LD a = at2(u, r, j), d = at2(dg, r, j);
      if (glu) {
        const LD b = at2(u, r, out + j), s = ref_sigmoid(a);
        at2(du, r, j) = double(d * b * (s + a * s * (1 - s)));
        at2(du, r, out + j) = double(d * a * s);
      } else {
        at2(du, r, j) = double(d * ref_gelu_grad(a, act == kfa::nn::Activation::gelu_tanh));
      }
    }
  return du;
}

/// Copies a device parameter View to the host.
template <class ViewType>
Tensor param(const ViewType& v) {
  if (v.size() == 0) return Tensor();
  return to_host(v);
}

/// Fills a parameter with random values (a test's weights, rounded to T).
template <class ViewType>
void randomize(const ViewType& v, std::mt19937_64& rng, double scale) {
  using T = typename ViewType::non_const_value_type;
  auto host = Kokkos::create_mirror_view(v);
  std::normal_distribution<double> dist(0.0, scale);
  for (std::size_t n = 0; n < v.size(); ++n) host.data()[n] = static_cast<T>(dist(rng));
  Kokkos::deep_copy(v, host);
}

/// `call` must throw std::invalid_argument with `needle` in its message.
template <class Call>
void expect_invalid_argument(Call&& call, const std::string& needle) {
  try {
    call();
    ADD_FAILURE() << "no exception; expected one mentioning " << needle;
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace kfa_test

#endif
