#ifndef KFA_TEST_HELPERS_HPP
#define KFA_TEST_HELPERS_HPP

// Shared test machinery: the backend x type list, an fp64 host oracle for
// forward and backward (every variant: windows, softcap, grouped-query heads,
// dropout with a given keep mask, score modifiers), a same-precision
// materialised backward (the baseline of the gradient error rule), random
// inputs with printed seeds, poisoning.

#include <kfa/kfa.hpp>

#include <gtest/gtest.h>

#include "kfa_test_eti.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
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

/// Every enabled backend's execution space.
using AllSpaces = ::testing::Types<
#ifdef KOKKOS_ENABLE_CUDA
    Kokkos::Cuda,
#endif
#ifdef KOKKOS_ENABLE_OPENMP
    Kokkos::OpenMP,
#endif
#ifdef KOKKOS_ENABLE_SERIAL
    Kokkos::Serial
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

/// The team size a test pins for the check helpers (PinTeamSize), or -1.
inline int& pinned_team_size() {
  static int team_size = -1;
  return team_size;
}

/// Pins the team size of the check helpers while in scope: 0 sends OpenMP
/// calls to the host kernels (KernelFamily::host_tiled) instead of the
/// portable kernels' two-thread teams.
struct PinTeamSize {
  explicit PinTeamSize(int team_size) { pinned_team_size() = team_size; }
  ~PinTeamSize() { pinned_team_size() = -1; }
};

/// Threads per team for tests: 2 on OpenMP (so the portable kernels' team
/// barriers really synchronise), the backend default elsewhere (on host
/// backends: the host kernels); unless a test pins it.
template <class Space>
int test_team_size() {
  if (pinned_team_size() >= 0) return pinned_team_size();
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
  /// Heads of k and v (grouped-query attention); 0 means `heads`.
  int heads_kv = 0;
};

inline int kv_heads(const Shape& s) { return s.heads_kv > 0 ? s.heads_kv : s.heads; }

inline std::string to_string(const Shape& s) {
  return "batch=" + std::to_string(s.batch) + " seqlen_q=" + std::to_string(s.seqlen_q) +
         " seqlen_k=" + std::to_string(s.seqlen_k) + " heads=" + std::to_string(s.heads) +
         " head_dim=" + std::to_string(s.head_dim) +
         (s.heads_kv > 0 ? " heads_kv=" + std::to_string(s.heads_kv) : std::string());
}

/// The options' variant settings, for messages.
inline std::string to_string(const kfa::AttentionOptions& o) {
  std::string r;
  if (o.causal) r += " causal";
  if (o.window_left >= 0 || o.window_right >= 0)
    r += " window=(" + std::to_string(o.window_left) + "," + std::to_string(o.window_right) + ")";
  if (o.softcap > 0) r += " softcap=" + std::to_string(o.softcap);
  if (o.dropout_p > 0)
    r += " dropout=" + std::to_string(o.dropout_p) + " seed=" + std::to_string(o.dropout_seed);
  if (o.deterministic) r += " deterministic";
  return r;
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

/// Key j hidden from query i by the causal / window mask (bottom-right aligned).
inline bool ref_masked(const kfa::AttentionOptions& opt, int i, int j, int seqlen_q,
                       int seqlen_k) {
  const int off = seqlen_k - seqlen_q;
  const int right = opt.causal ? 0 : opt.window_right, left = opt.window_left;
  return (right >= 0 && j > i + off + right) || (left >= 0 && j < i + off - left);
}

inline double ref_scale(const kfa::AttentionOptions& opt, int head_dim) {
  return opt.softmax_scale != 0 ? opt.softmax_scale : 1.0 / std::sqrt(double(head_dim));
}

/// What the oracle needs beyond AttentionOptions: the dropout keep mask (from
/// kfa::dropout_mask, [batch][heads][>= seqlen_q][>= seqlen_k] of 0/1) and a
/// score modifier with its derivative (empty: additive, derivative 1).
/// Packed batches run the oracle one sequence at a time: `batch_offset` is
/// the sequence index of batch entry 0.
struct RefExtras {
  const Tensor* keep = nullptr;
  std::function<double(int b, int h, int i, int j, double s, int seqlen_q, int seqlen_k)> mod;
  std::function<double(int b, int h, int i, int j, double s)> mod_grad;
  int batch_offset = 0;
  /// Where set, reference_backward writes dL/d(modified score) of every
  /// element here, [batch][heads][seqlen_q][seqlen_k] (0 where P = 0).
  Tensor* dscore = nullptr;
};

/// The score pipeline in arithmetic A: softcap, then the modifier; `grad`
/// gets d(result)/ds.
template <class A>
A ref_score(const kfa::AttentionOptions& opt, const RefExtras& x, int b, int h, int i, int j,
            int seqlen_q, int seqlen_k, A s, A& grad) {
  grad = 1;
  if (opt.softcap > 0) {
    const A c = static_cast<A>(opt.softcap);
    const A t = std::tanh(s / c);
    s = c * t;
    grad = A(1) - t * t;
  }
  if (x.mod) {
    const int bb = b + x.batch_offset;
    if (x.mod_grad) grad *= static_cast<A>(x.mod_grad(bb, h, i, j, double(s)));
    s = static_cast<A>(x.mod(bb, h, i, j, double(s), seqlen_q, seqlen_k));
  }
  return s;
}

/// Dropout factor of element (b, h, i, j): 1/(1-p) or 0; 1 without dropout.
template <class A>
A ref_keep(const kfa::AttentionOptions& opt, const RefExtras& x, int b, int h, int i, int j) {
  if (opt.dropout_p <= 0) return 1;
  return x.keep->at(b + x.batch_offset, h, i, j) != 0 ? static_cast<A>(1.0 / (1.0 - opt.dropout_p))
                                                      : A(0);
}

/// Attention forward in arithmetic A: with long double (the default) the
/// fp64 oracle; with float or double the plain implementation in that
/// precision (the yardstick of FlashAttention's 2x rule). k, v may have
/// fewer heads than q (grouped-query attention).
template <class A = long double>
void reference_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                       const kfa::AttentionOptions& opt, Tensor& o, Tensor& lse,
                       const RefExtras& extras = {}) {
  const int B = q.ext[0], Sq = q.ext[1], H = q.ext[2], D = q.ext[3], Sk = k.ext[1];
  const int group = H / k.ext[2];
  const A scale = static_cast<A>(ref_scale(opt, D));
  o = Tensor({B, Sq, H, D});
  lse = Tensor({B, H, Sq});
  std::vector<A> s(Sk), w(Sk);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < Sq; ++i) {
        const int hk = h / group;
        A m = -INFINITY;
        for (int j = 0; j < Sk; ++j) {
          if (ref_masked(opt, i, j, Sq, Sk)) {
            s[j] = -INFINITY;
            continue;
          }
          A acc = 0;
          for (int d = 0; d < D; ++d) acc += A(q.at(b, i, h, d)) * A(k.at(b, j, hk, d));
          A grad;
          s[j] = ref_score<A>(opt, extras, b, h, i, j, Sq, Sk, acc * scale, grad);
          m = std::max(m, s[j]);
        }
        A l = 0;
        for (int j = 0; j < Sk; ++j) l += s[j] == A(-INFINITY) ? A(0) : std::exp(s[j] - m);
        for (int j = 0; j < Sk; ++j)
          w[j] = s[j] == A(-INFINITY) || l == 0
                     ? A(0)
                     : std::exp(s[j] - m) / l * ref_keep<A>(opt, extras, b, h, i, j);
        for (int d = 0; d < D; ++d) {
          A acc = 0;
          for (int j = 0; j < Sk; ++j)
            if (w[j] != 0) acc += w[j] * A(v.at(b, j, hk, d));
          o.at(b, i, h, d) = static_cast<double>(acc);
        }
        lse.at(b, h, i) = l == 0 ? -INFINITY : static_cast<double>(m + std::log(l));
      }
}

/// Attention backward in the arithmetic of value type T: products and sums in
/// T's accumulator, P, dS and D rounded to T as a materialised implementation
/// in that precision would store them. With T = double and long double sums
/// (Exact) it is the fp64 oracle. dk and dv sum over the query heads of each
/// key/value head.
template <class T, bool Exact = false>
void reference_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                        const Tensor& lse, const Tensor& d_o, const kfa::AttentionOptions& opt,
                        Tensor& dq, Tensor& dk, Tensor& dv, const RefExtras& extras = {}) {
  using acc = std::conditional_t<Exact, long double, kfa::accumulator_t<T>>;
  auto rnd = [](acc x) -> acc { return Exact ? x : static_cast<acc>(to_double(from_double<T>(double(x)))); };
  const int B = q.ext[0], Sq = q.ext[1], H = q.ext[2], D = q.ext[3], Sk = k.ext[1];
  const int Hkv = k.ext[2], group = H / Hkv;
  const acc scale = static_cast<acc>(ref_scale(opt, D));
  dq = Tensor({B, Sq, H, D});
  dk = Tensor({B, Sk, Hkv, D});
  dv = Tensor({B, Sk, Hkv, D});
  std::vector<acc> p(Sk), ds(Sk);
  std::vector<acc> dk_acc(std::size_t(Sk) * D), dv_acc(std::size_t(Sk) * D);
  if (extras.dscore) *extras.dscore = Tensor({B, H, Sq, Sk});
  for (int b = 0; b < B; ++b)
    for (int hk = 0; hk < Hkv; ++hk) {
      std::fill(dk_acc.begin(), dk_acc.end(), acc(0));
      std::fill(dv_acc.begin(), dv_acc.end(), acc(0));
      for (int h = hk * group; h < (hk + 1) * group; ++h)
        for (int i = 0; i < Sq; ++i) {
          acc delta = 0;
          for (int d = 0; d < D; ++d) delta += acc(d_o.at(b, i, h, d)) * acc(o.at(b, i, h, d));
          delta = rnd(delta);
          const acc l = static_cast<acc>(lse.at(b, h, i));
          for (int j = 0; j < Sk; ++j) {
            if (ref_masked(opt, i, j, Sq, Sk) || std::isinf(double(l))) {
              p[j] = ds[j] = 0;
              continue;
            }
            acc s = 0, dp = 0;
            for (int d = 0; d < D; ++d) {
              s += acc(q.at(b, i, h, d)) * acc(k.at(b, j, hk, d));
              dp += acc(d_o.at(b, i, h, d)) * acc(v.at(b, j, hk, d));
            }
            acc grad;
            const acc x = ref_score<acc>(opt, extras, b, h, i, j, Sq, Sk, s * scale, grad);
            const acc pr = x == acc(-INFINITY) ? acc(0) : std::exp(x - l);
            const acc keep = ref_keep<acc>(opt, extras, b, h, i, j);
            p[j] = rnd(pr * keep);
            ds[j] = pr == acc(0) ? acc(0) : rnd(pr * (dp * keep - delta) * grad);
            if (extras.dscore && pr != acc(0))
              extras.dscore->at(b, h, i, j) = double(pr * (dp * keep - delta));
          }
          for (int d = 0; d < D; ++d) {
            acc g = 0;
            for (int j = 0; j < Sk; ++j) g += ds[j] * acc(k.at(b, j, hk, d));
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
          dk.at(b, j, hk, d) = double(dk_acc[std::size_t(j) * D + d] * scale);
          dv.at(b, j, hk, d) = double(dv_acc[std::size_t(j) * D + d]);
        }
    }
}

template <class T, class Space>
using DeviceView4 = Kokkos::View<T****, Kokkos::LayoutRight, typename Space::memory_space>;
template <class T, class Space>
using DeviceView3 = Kokkos::View<T***, Kokkos::LayoutRight, typename Space::memory_space>;
template <class T, class Space>
using DeviceView2 = Kokkos::View<T**, Kokkos::LayoutRight, typename Space::memory_space>;

template <class T, class Space>
DeviceView4<T, Space> to_device(const Tensor& t, const std::string& label) {
  DeviceView4<T, Space> view(label, t.ext[0], t.ext[1], t.ext[2], t.ext[3]);
  auto host = Kokkos::create_mirror_view(view);
  for (std::size_t n = 0; n < t.data.size(); ++n) host.data()[n] = from_double<T>(t.data[n]);
  Kokkos::deep_copy(view, host);
  return view;
}

/// A rank-3 host tensor on the device (packed [total][heads][head_dim]).
template <class T, class Space>
DeviceView3<T, Space> to_device3(const Tensor& t, const std::string& label) {
  DeviceView3<T, Space> view(label, t.ext[0], t.ext[1], t.ext[2]);
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
Case make_case(const Shape& s, const kfa::AttentionOptions& options, const std::string& tag,
               const RefExtras& extras = {}) {
  const int hk = kv_heads(s);
  Case c{s, options, Tensor({s.batch, s.seqlen_q, s.heads, s.head_dim}),
         Tensor({s.batch, s.seqlen_k, hk, s.head_dim}),
         Tensor({s.batch, s.seqlen_k, hk, s.head_dim}),
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
  reference_forward(c.q, c.k, c.v, options, c.o_ref, c.lse_ref, extras);
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
/// value type relative to `magnitude`: the output's, or for gradients the
/// larger magnitude of the terms that cancel in them (gradient_magnitude).
/// In float and double the floor grows with `terms`, the terms of the sums
/// behind the result (2·head_dim + seqlen_k for dQ: dP = dO·Vᵀ and D =
/// rowsum(dO ∘ O), which cancel in dS, then dS·K; dK the same with the
/// group's query rows for seqlen_k; head_dim + those rows for dV;
/// head_dim + seqlen_k for the forward's O and lse): two
/// correct implementations that sum in other orders differ by about
/// terms·eps·magnitude, and the 2x rule against a baseline a few units in
/// the last place off would otherwise be decided by compiler flags. 16-bit
/// types keep one ulp (their eps would make that floor vacuous).
template <class T>
double allowed_error(double baseline_error, double magnitude, int terms = 0) {
  const bool fp64 = std::is_same<T, double>::value, fp32 = std::is_same<T, float>::value;
  const double ulps = fp64 ? std::max(64, terms) : fp32 ? std::max(8, terms) : 1;
  return 2 * baseline_error + ulps * epsilon<T>() * std::max(1.0, magnitude);
}

template <class T>
double allowed_error(double baseline_error, const Tensor& ref) {
  return allowed_error<T>(baseline_error, max_abs(ref));
}

/// dS = P ∘ (dP − D) cancels: where P is one-hot (a window of one key), the
/// exact gradient is 0 while dP = dO·vᵀ and D = rowsum(dO ∘ o) are of the
/// size of scale·sqrt(d)·|dO|·|v|, and a plain implementation may round
/// both the same way (error 0) where a tiled one, summing in another order,
/// cannot. The floor of the gradient checks is relative to that size, times
/// |q| or |k| (what dS multiplies).
inline double gradient_magnitude(const Tensor& q, const Tensor& k, const Tensor& v,
                                 const Tensor& d_o, const kfa::AttentionOptions& opt) {
  const int d = q.ext.back();
  const double scale = opt.softmax_scale != 0 ? opt.softmax_scale : 1.0 / std::sqrt(double(d));
  return scale * std::sqrt(double(d)) * max_abs(d_o) * max_abs(v) *
         std::max({1.0, max_abs(q), max_abs(k)});
}

/// allowed_error's terms for dQ, dK and dV: `keys` summed in dQ, the
/// `group_rows` (query rows of every head of a k/v head) in dK and dV.
struct GradientTerms {
  int dq, dk, dv;
};
inline GradientTerms gradient_terms(int head_dim, int keys, int group_rows) {
  return {2 * head_dim + keys, 2 * head_dim + group_rows, head_dim + group_rows};
}

/// The baseline of a comparison must itself be close to the oracle: a broken
/// baseline would otherwise make the error rule vacuous. `size` and `terms`
/// as for allowed_error: a correct plain gradient is off by up to about
/// terms·eps·size where its sums cancel.
template <class T>
double baseline_sanity_bound(double size, int terms = 0) {
  return std::max(256, 4 * terms) * epsilon<T>() * std::max(1.0, size);
}

/// Checks `got` against the oracle `ref` with the error rule, `baseline`
/// being the same-precision plain implementation's result; `terms`: see
/// allowed_error.
template <class T>
void expect_close(const std::string& what, const char* name, const Tensor& got,
                  const Tensor& baseline, const Tensor& ref, double magnitude = -1,
                  int terms = 0) {
  const double err = max_abs_diff(got, ref), err_base = max_abs_diff(baseline, ref);
  const double size = std::max(magnitude, max_abs(ref));
  EXPECT_LE(err, allowed_error<T>(err_base, size, terms))
      << what << ": " << name << " error " << err << ", baseline's " << err_base;
  EXPECT_LE(err_base, baseline_sanity_bound<T>(size, terms))
      << what << ": " << name << " baseline error " << err_base << " is not plausible";
}

/// What the forward bounds grow with. score_abs bounds |scale|·Σ_d |q_d·k_d|
/// for every score (Cauchy-Schwarz on the largest row norms); seqlen_k is
/// the longest row of keys. plain_o, plain_lse: the errors of the plain
/// forward in the value type (float, double), -1 where there is none.
struct ForwardMagnitudes {
  int head_dim = 1, seqlen_k = 0;
  double score_abs = 0, max_v = 0;
  double plain_o = -1, plain_lse = -1;
};

inline double max_row_norm(const Tensor& t) {
  const std::size_t d = static_cast<std::size_t>(t.ext.back());
  double m = 0;
  for (std::size_t r = 0; d > 0 && r * d < t.data.size(); ++r) {
    double n = 0;
    for (std::size_t x = r * d; x < (r + 1) * d; ++x) n += t.data[x] * t.data[x];
    m = std::max(m, n);
  }
  return std::sqrt(m);
}

inline ForwardMagnitudes forward_magnitudes(const Tensor& q, const Tensor& k, const Tensor& v,
                                            const kfa::AttentionOptions& opt, int seqlen_k) {
  ForwardMagnitudes f;
  f.head_dim = q.ext.back();
  f.seqlen_k = seqlen_k;
  f.score_abs = std::abs(ref_scale(opt, f.head_dim)) * max_row_norm(q) * max_row_norm(k);
  f.max_v = max_abs(v);
  return f;
}

template <class T>
constexpr bool has_plain_forward() {
  return std::is_same<T, double>::value || std::is_same<T, float>::value;
}

/// The errors of the plain forward in T against the oracle, into f.
template <class T>
void add_plain_forward(ForwardMagnitudes& f, const Tensor& q, const Tensor& k, const Tensor& v,
                       const kfa::AttentionOptions& opt, const Tensor& o_ref,
                       const Tensor& lse_ref, const RefExtras& extras = {}) {
  if (!has_plain_forward<T>()) return;
  using A = std::conditional_t<std::is_same<T, double>::value, double, float>;
  Tensor o, lse;
  reference_forward<A>(q, k, v, opt, o, lse, extras);
  f.plain_o = std::max(f.plain_o, max_abs_diff(o, o_ref));
  f.plain_lse = std::max(f.plain_lse, max_abs_diff(lse, lse_ref));
}

/// Forward error bounds against the fp64 oracle that no GEMM enters (the
/// style of Kokkos Kernels' batched GEMM tests: a k-term sum in precision
/// eps is off by at most about k·eps times the sum of |terms|). A score is
/// a head_dim-term sum, off by head_dim·eps·score_abs; each weight exp(s -
/// max) takes that twice (score and max) plus eps·|s - max|; the row sum
/// and P·V are seqlen_k-term sums of weights times |v| <= max|v|. In 16-bit
/// types P and O are rounded to T: eps_T·(max|v| + max|O|).
template <class T>
double forward_o_bound(const ForwardMagnitudes& f, double max_o) {
  const double ea = epsilon<kfa::accumulator_t<T>>(), v = std::max(1.0, f.max_v);
  const double weight = 2.0 * (f.head_dim + 1) * f.score_abs + 4;
  return ea * (weight + 2.0 * f.seqlen_k + 8) * v + epsilon<T>() * (v + max_o);
}

/// lse = max + log(Σ weights): the weights' relative errors and the sum's,
/// plus the rounding of lse itself; held in the accumulator type.
template <class T>
double forward_lse_bound(const ForwardMagnitudes& f, double max_lse) {
  const double ea = epsilon<kfa::accumulator_t<T>>();
  const double weight = 2.0 * (f.head_dim + 1) * f.score_abs + 4;
  return ea * (weight + 2.0 * f.seqlen_k + 8 + std::max(1.0, max_lse));
}

/// Checks a forward's O and lse against the oracle: within the bounds
/// above, and, for float and double with `twice_plain`, within
/// FlashAttention's rule of twice the plain forward's error in T (with
/// allowed_error's floor).
template <class T>
void expect_forward_close(const std::string& what, const Tensor& o, const Tensor& lse,
                          const Tensor& o_ref, const Tensor& lse_ref, const ForwardMagnitudes& f,
                          bool twice_plain = true) {
  using Acc = kfa::accumulator_t<T>;
  const double err_o = max_abs_diff(o, o_ref), err_lse = max_abs_diff(lse, lse_ref);
  const double bound_o = forward_o_bound<T>(f, max_abs(o_ref));
  const double bound_lse = forward_lse_bound<T>(f, max_abs(lse_ref));
  EXPECT_LE(err_o, bound_o) << what << ": O error " << err_o << " (bound " << bound_o << ")";
  EXPECT_LE(err_lse, bound_lse) << what << ": lse error " << err_lse << " (bound " << bound_lse
                                << ")";
  if (twice_plain && f.plain_o >= 0) {
    // The floor counts the score's head_dim terms and the row's seqlen_k:
    // on small shapes the plain forward's largest error is one sample of
    // few, and a kernel summing in another order (vector lanes, the scale
    // folded into Q) draws another, up to ~2.5x apart in float.
    const int terms = f.head_dim + f.seqlen_k;
    EXPECT_LE(err_o, allowed_error<T>(f.plain_o, max_abs(o_ref), terms))
        << what << ": O error " << err_o << ", the plain forward's " << f.plain_o;
    EXPECT_LE(err_lse, allowed_error<Acc>(f.plain_lse, max_abs(lse_ref), terms))
        << what << ": lse error " << err_lse << ", the plain forward's " << f.plain_lse;
  }
}

/// A case's forward magnitudes with its plain forward's errors.
template <class T>
ForwardMagnitudes forward_magnitudes(const Case& c, const RefExtras& extras = {}) {
  ForwardMagnitudes f = forward_magnitudes(c.q, c.k, c.v, c.options, c.k.ext[1]);
  add_plain_forward<T>(f, c.q, c.k, c.v, c.options, c.o_ref, c.lse_ref, extras);
  return f;
}

/// Every output of flash forward then backward on the device, on the host.
struct FlashOutputs {
  Tensor o, lse, dq, dk, dv;
};

template <class T, class Space>
FlashOutputs run_flash(const Case& c, const kfa::AttentionOptions& opt) {
  using Acc = kfa::accumulator_t<T>;
  const Shape& s = c.shape;
  auto q = to_device<T, Space>(c.q, "q");
  auto k = to_device<T, Space>(c.k, "k");
  auto v = to_device<T, Space>(c.v, "v");
  auto d_o = to_device<T, Space>(c.d_o, "d_o");
  DeviceView4<T, Space> o("o", s.batch, s.seqlen_q, s.heads, s.head_dim);
  DeviceView3<Acc, Space> lse("lse", s.batch, s.heads, s.seqlen_q);
  DeviceView4<T, Space> dq("dq", s.batch, s.seqlen_q, s.heads, s.head_dim),
      dk("dk", s.batch, s.seqlen_k, kv_heads(s), s.head_dim),
      dv("dv", s.batch, s.seqlen_k, kv_heads(s), s.head_dim);
  poison(o);
  poison(lse);
  poison(dq);
  poison(dk);
  poison(dv);
  kfa::flash_attention_forward(Space(), q, k, v, o, lse, opt);
  kfa::flash_attention_backward(Space(), q, k, v, o, lse, d_o, dq, dk, dv, opt);
  Space().fence();
  return {to_host(o), to_host(lse), to_host(dq), to_host(dk), to_host(dv)};
}

/// The dropout keep mask kfa draws for `opt`, [batch][heads][seqlen_q][seqlen_k].
template <class Space>
Tensor dropout_keep_mask(int batch, int heads, int seqlen_q, int seqlen_k,
                         const kfa::AttentionOptions& opt) {
  Kokkos::View<std::uint8_t****, Kokkos::LayoutRight, typename Space::memory_space> mask(
      "mask", batch, heads, seqlen_q, seqlen_k);
  kfa::dropout_mask(Space(), mask, opt);
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), mask);
  Tensor t({batch, heads, seqlen_q, seqlen_k});
  for (std::size_t n = 0; n < t.data.size(); ++n) t.data[n] = host.data()[n];
  return t;
}

/// Runs one variant case on the device, fused and materialised, forward and
/// backward (with and without a score modifier), and checks every output
/// against the fp64 oracle with the error rule: forward against the
/// materialised forward's error, gradients against the same-precision host
/// backward's error; the materialised backward is held to the same rule.
template <class C, class Mod = kfa::Impl::NoScoreMod>
void check_variant(const Shape& s, kfa::AttentionOptions opt, const std::string& tag,
                   const Mod& mod = Mod(), RefExtras extras = {}) {
  using Space = typename C::space;
  using T = typename C::value_type;
  using Acc = kfa::accumulator_t<T>;
  opt.team_size = test_team_size<Space>();
  Tensor keep;
  if (opt.dropout_p > 0) {
    keep = dropout_keep_mask<Space>(s.batch, s.heads, s.seqlen_q, s.seqlen_k, opt);
    extras.keep = &keep;
  }
  const Case c = make_case<T>(s, opt, tag, extras);
  const std::string what = tag + " " + type_name<T>() + " " + Space::name() + " " +
                           to_string(s) + to_string(opt) + " seed " +
                           std::to_string(test_seed(tag + to_string(s) + (opt.causal ? "c" : "n")));
  const int hk = kv_heads(s);
  auto q = to_device<T, Space>(c.q, "q");
  auto k = to_device<T, Space>(c.k, "k");
  auto v = to_device<T, Space>(c.v, "v");
  auto d_o = to_device<T, Space>(c.d_o, "d_o");
  DeviceView4<T, Space> o_flash("o_flash", s.batch, s.seqlen_q, s.heads, s.head_dim),
      o_std("o_std", s.batch, s.seqlen_q, s.heads, s.head_dim);
  DeviceView3<Acc, Space> lse_flash("lse_flash", s.batch, s.heads, s.seqlen_q),
      lse_std("lse_std", s.batch, s.heads, s.seqlen_q);
  DeviceView4<T, Space> dq("dq", s.batch, s.seqlen_q, s.heads, s.head_dim),
      dk("dk", s.batch, s.seqlen_k, hk, s.head_dim), dv("dv", s.batch, s.seqlen_k, hk, s.head_dim);

  poison(o_flash);
  poison(lse_flash);
  poison(o_std);
  poison(lse_std);
  kfa::flash_attention_forward(Space(), q, k, v, o_flash, lse_flash, opt, mod);
  kfa::standard_attention_forward(Space(), q, k, v, o_std, lse_std, opt, mod);
  Space().fence();
  const ForwardMagnitudes f = forward_magnitudes<T>(c, extras);
  expect_forward_close<T>(what + " flash", to_host(o_flash), to_host(lse_flash), c.o_ref,
                          c.lse_ref, f);
  expect_forward_close<T>(what + " standard", to_host(o_std), to_host(lse_std), c.o_ref,
                          c.lse_ref, f, false);

  Tensor dq_ref, dk_ref, dv_ref, dq_plain, dk_plain, dv_plain;
  reference_backward<double, true>(c.q, c.k, c.v, c.o_ref, c.lse_ref, c.d_o, opt, dq_ref, dk_ref,
                                   dv_ref, extras);
  const double grad_magnitude = gradient_magnitude(c.q, c.k, c.v, c.d_o, opt);
  const GradientTerms terms =
      gradient_terms(c.q.ext.back(), c.k.ext[1], c.q.ext[1] * (c.q.ext[2] / c.k.ext[2]));
  Tensor o_t = c.o_ref;
  round_to<T>(o_t);
  reference_backward<T>(c.q, c.k, c.v, o_t, c.lse_ref, c.d_o, opt, dq_plain, dk_plain, dv_plain,
                        extras);
  for (int pass = 0; pass < 2; ++pass) {
    poison(dq);
    poison(dk);
    poison(dv);
    if (pass == 0) {
      kfa::flash_attention_backward(Space(), q, k, v, o_flash, lse_flash, d_o, dq, dk, dv, opt,
                                    mod);
    } else {
      kfa::standard_attention_backward(Space(), q, k, v, o_flash, lse_flash, d_o, dq, dk, dv,
                                       opt, mod);
    }
    Space().fence();
    const std::string who = what + (pass == 0 ? " flash" : " standard");
    expect_close<T>(who, "dq", to_host(dq), dq_plain, dq_ref, grad_magnitude, terms.dq);
    expect_close<T>(who, "dk", to_host(dk), dk_plain, dk_ref, grad_magnitude, terms.dk);
    expect_close<T>(who, "dv", to_host(dv), dv_plain, dv_ref, -1, terms.dv);
  }
}

/// A packed batch: sequence b has len_q[b] query rows and len_k[b] keys.
/// max_q, max_k: the bounds passed to kfa (0: the actual maxima).
struct VarlenShape {
  std::vector<int> len_q, len_k;
  int heads, heads_kv, head_dim;
  int max_q = 0, max_k = 0;
};

inline std::string to_string(const VarlenShape& s) {
  std::string r = "lengths (q,k):";
  for (std::size_t b = 0; b < s.len_q.size(); ++b)
    r += " (" + std::to_string(s.len_q[b]) + "," + std::to_string(s.len_k[b]) + ")";
  return r + " heads=" + std::to_string(s.heads) + " heads_kv=" + std::to_string(s.heads_kv) +
         " head_dim=" + std::to_string(s.head_dim) + " max=(" + std::to_string(s.max_q) + "," +
         std::to_string(s.max_k) + ")";
}

inline std::vector<int> offsets_of(const std::vector<int>& lengths) {
  std::vector<int> cu(1, 0);
  for (int l : lengths) cu.push_back(cu.back() + l);
  return cu;
}

template <class Space>
Kokkos::View<int*, typename Space::memory_space> offsets_to_device(const std::vector<int>& cu,
                                                                  const std::string& label) {
  Kokkos::View<int*, typename Space::memory_space> view(label, cu.size());
  auto host = Kokkos::create_mirror_view(view);
  for (std::size_t n = 0; n < cu.size(); ++n) host(n) = cu[n];
  Kokkos::deep_copy(view, host);
  return view;
}

/// Rows [begin, begin + len) of a packed [total][heads][d] tensor as a
/// [1][len][heads][d] batch, and back.
inline Tensor rows_of(const Tensor& packed, int begin, int len) {
  Tensor t({1, len, packed.ext[1], packed.ext[2]});
  const std::size_t row = std::size_t(packed.ext[1]) * packed.ext[2];
  std::copy(packed.data.begin() + begin * row, packed.data.begin() + (begin + len) * row,
            t.data.begin());
  return t;
}
inline void put_rows(Tensor& packed, const Tensor& t, int begin) {
  const std::size_t row = std::size_t(packed.ext[1]) * packed.ext[2];
  std::copy(t.data.begin(), t.data.end(), packed.data.begin() + begin * row);
}
/// lse [1][heads][len] of one sequence into the packed [heads][total_q].
inline void put_lse(Tensor& packed, const Tensor& t, int begin) {
  const int heads = packed.ext[0], total = packed.ext[1], len = t.ext[2];
  for (int h = 0; h < heads; ++h)
    for (int i = 0; i < len; ++i) packed.data[std::size_t(h) * total + begin + i] = t.at(0, h, i);
}

/// check_variant for a packed batch: fused and materialised varlen entry
/// points against the oracle run one sequence at a time.
template <class C, class Mod = kfa::Impl::NoScoreMod>
void check_varlen(VarlenShape vs, kfa::AttentionOptions opt, const std::string& tag,
                  const Mod& mod = Mod(), RefExtras extras = {}) {
  using Space = typename C::space;
  using T = typename C::value_type;
  using Acc = kfa::accumulator_t<T>;
  opt.team_size = test_team_size<Space>();
  const int nseq = static_cast<int>(vs.len_q.size());
  const int H = vs.heads, Hkv = vs.heads_kv, D = vs.head_dim;
  for (int b = 0; b < nseq; ++b) {
    vs.max_q = std::max(vs.max_q, vs.len_q[b]);
    vs.max_k = std::max(vs.max_k, vs.len_k[b]);
  }
  const std::vector<int> cu_q = offsets_of(vs.len_q), cu_k = offsets_of(vs.len_k);
  const int total_q = cu_q.back(), total_k = cu_k.back();
  const std::string what = tag + " " + type_name<T>() + " " + Space::name() + " " +
                           to_string(vs) + to_string(opt);

  Tensor q({total_q, H, D}), k({total_k, Hkv, D}), v({total_k, Hkv, D}), d_o({total_q, H, D});
  std::mt19937_64 rng(test_seed(tag + to_string(vs) + to_string(opt)));
  for (Tensor* t : {&q, &k, &v, &d_o}) {
    fill_random(*t, rng);
    round_to<T>(*t);
  }
  Tensor keep;
  if (opt.dropout_p > 0) {
    keep = dropout_keep_mask<Space>(nseq, H, vs.max_q, vs.max_k, opt);
    extras.keep = &keep;
  }
  // The oracle, one sequence at a time.
  Tensor o_ref({total_q, H, D}), lse_ref({H, total_q}), dq_ref({total_q, H, D}),
      dk_ref({total_k, Hkv, D}), dv_ref({total_k, Hkv, D}), dq_plain = dq_ref,
      dk_plain = dk_ref, dv_plain = dv_ref;
  ForwardMagnitudes f = forward_magnitudes(q, k, v, opt, vs.max_k);
  for (int b = 0; b < nseq; ++b) {
    RefExtras x = extras;
    x.batch_offset = b;
    const Tensor qb = rows_of(q, cu_q[b], vs.len_q[b]), kb = rows_of(k, cu_k[b], vs.len_k[b]),
                 vb = rows_of(v, cu_k[b], vs.len_k[b]), dob = rows_of(d_o, cu_q[b], vs.len_q[b]);
    Tensor ob, lseb, g[3];
    reference_forward(qb, kb, vb, opt, ob, lseb, x);
    add_plain_forward<T>(f, qb, kb, vb, opt, ob, lseb, x);
    put_rows(o_ref, ob, cu_q[b]);
    put_lse(lse_ref, lseb, cu_q[b]);
    reference_backward<double, true>(qb, kb, vb, ob, lseb, dob, opt, g[0], g[1], g[2], x);
    put_rows(dq_ref, g[0], cu_q[b]);
    put_rows(dk_ref, g[1], cu_k[b]);
    put_rows(dv_ref, g[2], cu_k[b]);
    round_to<T>(ob);
    reference_backward<T>(qb, kb, vb, ob, lseb, dob, opt, g[0], g[1], g[2], x);
    put_rows(dq_plain, g[0], cu_q[b]);
    put_rows(dk_plain, g[1], cu_k[b]);
    put_rows(dv_plain, g[2], cu_k[b]);
  }

  auto q_d = to_device3<T, Space>(q, "q");
  auto k_d = to_device3<T, Space>(k, "k");
  auto v_d = to_device3<T, Space>(v, "v");
  auto do_d = to_device3<T, Space>(d_o, "d_o");
  auto cu_q_d = offsets_to_device<Space>(cu_q, "cu_seqlens_q");
  auto cu_k_d = offsets_to_device<Space>(cu_k, "cu_seqlens_k");
  DeviceView3<T, Space> o_flash("o_flash", total_q, H, D), o_std("o_std", total_q, H, D);
  DeviceView2<Acc, Space> lse_flash("lse_flash", H, total_q), lse_std("lse_std", H, total_q);
  DeviceView3<T, Space> dq("dq", total_q, H, D), dk("dk", total_k, Hkv, D),
      dv("dv", total_k, Hkv, D);
  poison(o_flash);
  poison(lse_flash);
  poison(o_std);
  poison(lse_std);
  kfa::flash_attention_varlen_forward(Space(), q_d, k_d, v_d, cu_q_d, cu_k_d, vs.max_q,
                                      vs.max_k, o_flash, lse_flash, opt, mod);
  kfa::standard_attention_varlen_forward(Space(), q_d, k_d, v_d, cu_q_d, cu_k_d, vs.max_q,
                                         vs.max_k, o_std, lse_std, opt, mod);
  Space().fence();
  expect_forward_close<T>(what + " flash", to_host(o_flash), to_host(lse_flash), o_ref, lse_ref,
                          f);
  expect_forward_close<T>(what + " standard", to_host(o_std), to_host(lse_std), o_ref, lse_ref,
                          f, false);
  const double grad_magnitude = gradient_magnitude(q, k, v, d_o, opt);
  const GradientTerms terms = gradient_terms(D, vs.max_k, vs.max_q * (H / Hkv));
  for (int pass = 0; pass < 2; ++pass) {
    poison(dq);
    poison(dk);
    poison(dv);
    if (pass == 0) {
      kfa::flash_attention_varlen_backward(Space(), q_d, k_d, v_d, cu_q_d, cu_k_d, vs.max_q,
                                           vs.max_k, o_flash, lse_flash, do_d, dq, dk, dv, opt,
                                           mod);
    } else {
      kfa::standard_attention_varlen_backward(Space(), q_d, k_d, v_d, cu_q_d, cu_k_d, vs.max_q,
                                              vs.max_k, o_flash, lse_flash, do_d, dq, dk, dv,
                                              opt, mod);
    }
    Space().fence();
    const std::string who = what + (pass == 0 ? " flash" : " standard");
    expect_close<T>(who, "dq", to_host(dq), dq_plain, dq_ref, grad_magnitude, terms.dq);
    expect_close<T>(who, "dk", to_host(dk), dk_plain, dk_ref, grad_magnitude, terms.dk);
    expect_close<T>(who, "dv", to_host(dv), dv_plain, dv_ref, -1, terms.dv);
  }
}

}  // namespace kfa_test

#endif
