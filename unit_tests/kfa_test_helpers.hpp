#ifndef KFA_TEST_HELPERS_HPP
#define KFA_TEST_HELPERS_HPP

// Shared test machinery: the backend x type list, an fp64 host oracle for
// forward and backward, a same-precision materialised backward (the baseline
// of the gradient error rule), random inputs with printed seeds, poisoning.

#include <kfa/kfa.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace kfa_test {

template <class Space, class T, bool HalfSlot = false>
struct Config {
  using space = Space;
  using value_type = T;
  static constexpr bool half_slot = HalfSlot;
};

#define KFA_TEST_CONFIGS_FOR(S)                                           \
  Config<S, double>, Config<S, float>, Config<S, kfa::half, true>, \
      Config<S, kfa::bfloat16>

using AllConfigs = ::testing::Types<
#ifdef KOKKOS_ENABLE_CUDA
    KFA_TEST_CONFIGS_FOR(Kokkos::Cuda),
#endif
#ifdef KOKKOS_ENABLE_OPENMP
    KFA_TEST_CONFIGS_FOR(Kokkos::OpenMP),
#endif
#ifdef KOKKOS_ENABLE_SERIAL
    KFA_TEST_CONFIGS_FOR(Kokkos::Serial)
#endif
    >;

/// Kokkos 3.4 host builds make kfa::half plain float: skip the duplicate.
template <class C>
bool is_duplicate_config() {
  return C::half_slot && std::is_same<kfa::half, float>::value;
}

template <class Space>
constexpr bool is_host_space() {
  return Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename Space::memory_space>::accessible;
}

/// Threads per team for tests: 2 on OpenMP (so team barriers really
/// synchronise), the backend default elsewhere.
template <class Space>
int test_team_size() {
#ifdef KOKKOS_ENABLE_OPENMP
  if (std::is_same<Space, Kokkos::OpenMP>::value)
    return std::min(2, static_cast<int>(Kokkos::OpenMP().concurrency()));
#endif
  return 0;
}

template <class T>
double epsilon() {
  if (std::is_same<T, double>::value) return std::numeric_limits<double>::epsilon();
  if (std::is_same<T, float>::value) return std::numeric_limits<float>::epsilon();
  if (std::is_same<T, kfa::bfloat16>::value) return 1.0 / 128;
  return 1.0 / 1024;  // half
}

template <class T>
std::string type_name() {
  if (std::is_same<T, double>::value) return "double";
  if (std::is_same<T, float>::value) return "float";
  if (std::is_same<T, kfa::bfloat16>::value) return "bfloat16";
  return "half";
}

template <class T>
T from_double(double x) {
  return kfa::Impl::from_acc<T>(static_cast<kfa::accumulator_t<T>>(x));
}
template <class T>
double to_double(T x) {
  return static_cast<double>(kfa::Impl::to_acc<kfa::accumulator_t<T>>(x));
}

struct Shape {
  int batch, seqlen_q, seqlen_k, heads, head_dim;
};

inline std::string to_string(const Shape& s) {
  return "batch=" + std::to_string(s.batch) + " seqlen_q=" + std::to_string(s.seqlen_q) +
         " seqlen_k=" + std::to_string(s.seqlen_k) + " heads=" + std::to_string(s.heads) +
         " head_dim=" + std::to_string(s.head_dim);
}

/// Host tensor of doubles in the library's [b][i][h][d] / [b][h][i] layouts.
struct Tensor {
  std::vector<int> ext;
  std::vector<double> data;
  Tensor() = default;
  explicit Tensor(std::vector<int> e) : ext(std::move(e)) {
    std::size_t n = 1;
    for (int x : ext) n *= static_cast<std::size_t>(x);
    data.assign(n, 0.0);
  }
  double& at(int a, int b, int c, int d) {
    return data[((std::size_t(a) * ext[1] + b) * ext[2] + c) * ext[3] + d];
  }
  double at(int a, int b, int c, int d) const {
    return data[((std::size_t(a) * ext[1] + b) * ext[2] + c) * ext[3] + d];
  }
  double& at(int a, int b, int c) { return data[(std::size_t(a) * ext[1] + b) * ext[2] + c]; }
  double at(int a, int b, int c) const {
    return data[(std::size_t(a) * ext[1] + b) * ext[2] + c];
  }
};

inline void fill_random(Tensor& t, std::mt19937_64& rng, double scale = 1.0) {
  std::normal_distribution<double> dist(0.0, scale);
  for (double& x : t.data) x = dist(rng);
}

/// Rounds every element to T and back (inputs then are exactly representable).
template <class T>
void round_to(Tensor& t) {
  for (double& x : t.data) x = to_double(from_double<T>(x));
}

inline bool ref_masked(bool causal, int i, int j, int seqlen_q, int seqlen_k) {
  return causal && j > i + (seqlen_k - seqlen_q);
}

inline double ref_scale(const kfa::AttentionOptions& opt, int head_dim) {
  return opt.softmax_scale != 0 ? opt.softmax_scale : 1.0 / std::sqrt(double(head_dim));
}

/// fp64 oracle, long double sums.
inline void reference_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                              const kfa::AttentionOptions& opt, Tensor& o, Tensor& lse) {
  const int B = q.ext[0], Sq = q.ext[1], H = q.ext[2], D = q.ext[3], Sk = k.ext[1];
  const double scale = ref_scale(opt, D);
  o = Tensor({B, Sq, H, D});
  lse = Tensor({B, H, Sq});
  std::vector<long double> s(Sk);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < Sq; ++i) {
        long double m = -INFINITY;
        for (int j = 0; j < Sk; ++j) {
          if (ref_masked(opt.causal, i, j, Sq, Sk)) {
            s[j] = -INFINITY;
            continue;
          }
          long double acc = 0;
          for (int d = 0; d < D; ++d) acc += (long double)q.at(b, i, h, d) * k.at(b, j, h, d);
          s[j] = acc * scale;
          m = std::max(m, s[j]);
        }
        long double l = 0;
        for (int j = 0; j < Sk; ++j) l += s[j] == -INFINITY ? 0 : std::exp(s[j] - m);
        for (int d = 0; d < D; ++d) {
          long double acc = 0;
          if (l > 0)
            for (int j = 0; j < Sk; ++j)
              if (s[j] != -INFINITY) acc += std::exp(s[j] - m) / l * v.at(b, j, h, d);
          o.at(b, i, h, d) = static_cast<double>(acc);
        }
        lse.at(b, h, i) = l > 0 ? static_cast<double>(m + std::log(l)) : -INFINITY;
      }
}

/// Attention backward in the arithmetic of value type T: products and sums in
/// T's accumulator, P, dS and D rounded to T as a materialised implementation
/// in that precision would store them. With T = double and long double sums
/// (Exact) it is the fp64 oracle.
template <class T, bool Exact = false>
void reference_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                        const Tensor& lse, const Tensor& d_o, const kfa::AttentionOptions& opt,
                        Tensor& dq, Tensor& dk, Tensor& dv) {
  using acc = std::conditional_t<Exact, long double, kfa::accumulator_t<T>>;
  auto rnd = [](acc x) -> acc { return Exact ? x : static_cast<acc>(to_double(from_double<T>(double(x)))); };
  const int B = q.ext[0], Sq = q.ext[1], H = q.ext[2], D = q.ext[3], Sk = k.ext[1];
  const acc scale = static_cast<acc>(ref_scale(opt, D));
  dq = Tensor({B, Sq, H, D});
  dk = Tensor({B, Sk, H, D});
  dv = Tensor({B, Sk, H, D});
  std::vector<acc> p(Sk), ds(Sk);
  std::vector<acc> dk_acc(std::size_t(Sk) * D), dv_acc(std::size_t(Sk) * D);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h) {
      std::fill(dk_acc.begin(), dk_acc.end(), acc(0));
      std::fill(dv_acc.begin(), dv_acc.end(), acc(0));
      for (int i = 0; i < Sq; ++i) {
        acc delta = 0;
        for (int d = 0; d < D; ++d) delta += acc(d_o.at(b, i, h, d)) * acc(o.at(b, i, h, d));
        delta = rnd(delta);
        const acc l = static_cast<acc>(lse.at(b, h, i));
        for (int j = 0; j < Sk; ++j) {
          if (ref_masked(opt.causal, i, j, Sq, Sk) || std::isinf(double(l))) {
            p[j] = ds[j] = 0;
            continue;
          }
          acc s = 0, dp = 0;
          for (int d = 0; d < D; ++d) {
            s += acc(q.at(b, i, h, d)) * acc(k.at(b, j, h, d));
            dp += acc(d_o.at(b, i, h, d)) * acc(v.at(b, j, h, d));
          }
          p[j] = rnd(std::exp(s * scale - l));
          ds[j] = rnd(p[j] * (dp - delta));
        }
        for (int d = 0; d < D; ++d) {
          acc g = 0;
          for (int j = 0; j < Sk; ++j) g += ds[j] * acc(k.at(b, j, h, d));
          dq.at(b, i, h, d) = double(g * scale);
        }
        for (int j = 0; j < Sk; ++j)
          for (int d = 0; d < D; ++d) {
            dv_acc[std::size_t(j) * D + d] += p[j] * acc(d_o.at(b, i, h, d));
            dk_acc[std::size_t(j) * D + d] += ds[j] * acc(q.at(b, i, h, d));
          }
      }
      for (int j = 0; j < Sk; ++j)
        for (int d = 0; d < D; ++d) {
          dk.at(b, j, h, d) = double(dk_acc[std::size_t(j) * D + d] * scale);
          dv.at(b, j, h, d) = double(dv_acc[std::size_t(j) * D + d]);
        }
    }
}

template <class T, class Space>
using DeviceView4 = Kokkos::View<T****, Kokkos::LayoutRight, typename Space::memory_space>;
template <class T, class Space>
using DeviceView3 = Kokkos::View<T***, Kokkos::LayoutRight, typename Space::memory_space>;

template <class T, class Space>
DeviceView4<T, Space> to_device(const Tensor& t, const std::string& label) {
  DeviceView4<T, Space> view(label, t.ext[0], t.ext[1], t.ext[2], t.ext[3]);
  auto host = Kokkos::create_mirror_view(view);
  for (std::size_t n = 0; n < t.data.size(); ++n) host.data()[n] = from_double<T>(t.data[n]);
  Kokkos::deep_copy(view, host);
  return view;
}

template <class ViewType>
Tensor to_host(const ViewType& view) {
  std::vector<int> ext;
  for (int r = 0; r < static_cast<int>(ViewType::rank); ++r)
    ext.push_back(static_cast<int>(view.extent(r)));
  Tensor t(ext);
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), view);
  for (std::size_t n = 0; n < t.data.size(); ++n) t.data[n] = to_double(host.data()[n]);
  return t;
}

/// Fills a View with NaN (or a large sentinel), so an unwritten element fails.
template <class ViewType>
void poison(const ViewType& view) {
  using T = typename ViewType::non_const_value_type;
  Kokkos::deep_copy(view, from_double<T>(std::numeric_limits<double>::quiet_NaN()));
}

inline std::uint64_t test_seed(const std::string& what) {
  std::uint64_t h = 1469598103934665603ull;
  for (char c : what) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}

/// Copies of every tensor a case needs: inputs rounded to T, fp64 oracle
/// outputs.
struct Case {
  Shape shape;
  kfa::AttentionOptions options;
  Tensor q, k, v, d_o, o_ref, lse_ref;
};

template <class T>
Case make_case(const Shape& s, const kfa::AttentionOptions& options, const std::string& tag) {
  Case c{s, options, Tensor({s.batch, s.seqlen_q, s.heads, s.head_dim}),
         Tensor({s.batch, s.seqlen_k, s.heads, s.head_dim}),
         Tensor({s.batch, s.seqlen_k, s.heads, s.head_dim}),
         Tensor({s.batch, s.seqlen_q, s.heads, s.head_dim}), Tensor(), Tensor()};
  const std::uint64_t seed = test_seed(tag + to_string(s) + (options.causal ? "c" : "n"));
  std::mt19937_64 rng(seed);
  fill_random(c.q, rng);
  fill_random(c.k, rng);
  fill_random(c.v, rng);
  fill_random(c.d_o, rng);
  round_to<T>(c.q);
  round_to<T>(c.k);
  round_to<T>(c.v);
  round_to<T>(c.d_o);
  reference_forward(c.q, c.k, c.v, options, c.o_ref, c.lse_ref);
  return c;
}

/// Max |a - b|; a NaN anywhere (an element never written) gives +inf.
inline double max_abs_diff(const Tensor& a, const Tensor& b) {
  double err = 0;
  for (std::size_t n = 0; n < a.data.size(); ++n) {
    const double x = a.data[n], y = b.data[n];
    if (std::isnan(x) || std::isnan(y)) return INFINITY;
    if (std::isinf(x) || std::isinf(y)) {
      if (x != y) return INFINITY;
      continue;
    }
    err = std::max(err, std::abs(x - y));
  }
  return err;
}

inline double max_abs(const Tensor& a) {
  double m = 0;
  for (double x : a.data)
    if (std::isfinite(x)) m = std::max(m, std::abs(x));
  return m;
}

/// The error rule of FlashAttention's tests: flash's error against the fp64
/// oracle may be at most twice the error of the plain implementation in the
/// same precision, plus a floor of a few units in the last place of the
/// value type (relative to the output's magnitude).
template <class T>
double allowed_error(double baseline_error, const Tensor& ref) {
  const double ulps = std::is_same<T, double>::value ? 64 : std::is_same<T, float>::value ? 8 : 1;
  return 2 * baseline_error + ulps * epsilon<T>() * std::max(1.0, max_abs(ref));
}

}  // namespace kfa_test

#endif
