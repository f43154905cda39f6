#ifndef KFA_DETAIL_COMMON_CHECKS_HPP
#define KFA_DETAIL_COMMON_CHECKS_HPP

// Argument checks shared by every entry point. Everything that is wrong is
// reported before any output is touched: rank, layout and accessibility
// problems throw at run time (and the kernels are then not even instantiated),
// extents are compared against the shapes derived from q and k, options and
// the offsets of packed batches are validated.

#include <kfa/options.hpp>
#include <kfa/types.hpp>

#include <kfa/detail/common/compat.hpp>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

namespace kfa {
namespace Impl {

/// The largest head dimension the kernels are built for.
constexpr int max_head_dim = 256;

template <class ExecSpace, class ViewType>
constexpr bool view_ok(int rank) {
  if constexpr (!Kokkos::is_view<ViewType>::value) {
    return false;
  } else {
    return view_rank<ViewType>() == rank &&
           std::is_same<typename ViewType::array_layout, Kokkos::LayoutRight>::value &&
           Kokkos::SpaceAccessibility<ExecSpace,
                                      typename ViewType::memory_space>::accessible;
  }
}

template <class ExecSpace, class Q, class K, class V, class O, class Lse>
constexpr bool forward_types_ok() {
  return view_ok<ExecSpace, Q>(4) && view_ok<ExecSpace, K>(4) &&
         view_ok<ExecSpace, V>(4) && view_ok<ExecSpace, O>(4) &&
         view_ok<ExecSpace, Lse>(3);
}

template <class ExecSpace, class Q, class K, class V, class O, class Lse, class DO,
          class DQ, class DK, class DV>
constexpr bool backward_types_ok() {
  return forward_types_ok<ExecSpace, Q, K, V, O, Lse>() && view_ok<ExecSpace, DO>(4) &&
         view_ok<ExecSpace, DQ>(4) && view_ok<ExecSpace, DK>(4) &&
         view_ok<ExecSpace, DV>(4);
}

template <class ViewType>
std::string extents_string(const ViewType& view) {
  std::ostringstream out;
  for (int r = 0; r < view_rank<ViewType>(); ++r) out << "[" << view.extent(r) << "]";
  return out.str();
}

[[noreturn]] inline void throw_invalid(const char* function, const std::string& what) {
  throw std::invalid_argument(std::string(function) + ": " + what);
}

/// Throws when `view` is not a rank-`rank` LayoutRight View accessible from
/// ExecSpace, naming the argument and the shape it must have.
template <class ExecSpace, class ViewType>
void check_view_kind(const char* function, const char* name, const char* shape, int rank) {
  static_assert(Kokkos::is_view<ViewType>::value,
                "kfa: every tensor argument must be a Kokkos::View");
  if (view_rank<ViewType>() != rank) {
    std::ostringstream out;
    out << name << " must be a rank-" << rank << " View " << shape << ", got a rank-"
        << view_rank<ViewType>() << " View";
    throw_invalid(function, out.str());
  }
  if (!std::is_same<typename ViewType::array_layout, Kokkos::LayoutRight>::value) {
    throw_invalid(function, std::string(name) + " " + shape +
                                " must be a LayoutRight View (contiguous head_dim)");
  }
  if (!Kokkos::SpaceAccessibility<ExecSpace, typename ViewType::memory_space>::accessible) {
    throw_invalid(function, std::string(name) + " " + shape + " lives in memory space " +
                                ViewType::memory_space::name() +
                                ", which the execution space " + ExecSpace::name() +
                                " cannot access");
  }
}

/// Throws unless `view` has exactly the extents `expected` (rank entries).
template <class ViewType>
void check_extents(const char* function, const char* name, const char* shape,
                   const ViewType& view, std::initializer_list<std::size_t> expected) {
  int r = 0;
  bool ok = true;
  for (std::size_t e : expected) ok = ok && view.extent(r++) == e;
  if (!ok) {
    std::ostringstream out;
    out << name << " must be " << shape << " = ";
    for (std::size_t e : expected) out << "[" << e << "]";
    out << ", got " << extents_string(view);
    throw_invalid(function, out.str());
  }
}

template <class A, class B>
bool overlaps(const A& a, const B& b) {
  if (a.span() == 0 || b.span() == 0) return false;
  auto a0 = reinterpret_cast<std::uintptr_t>(a.data());
  auto b0 = reinterpret_cast<std::uintptr_t>(b.data());
  auto a1 = a0 + a.span() * sizeof(typename A::value_type);
  auto b1 = b0 + b.span() * sizeof(typename B::value_type);
  return a0 < b1 && b0 < a1;
}


inline void check_options(const char* function, const AttentionOptions& options) {
  if (!std::isfinite(options.softmax_scale)) {
    throw_invalid(function, "options.softmax_scale must be finite (0 selects "
                            "1/sqrt(head_dim))");
  }
  if (options.team_size < 0) {
    throw_invalid(function, "options.team_size must be >= 0 (0 selects the default)");
  }
  if (options.window_left < -1 || options.window_right < -1) {
    std::ostringstream out;
    out << "options.window_left and options.window_right must be >= 0, or -1 for an "
           "unbounded side, got ("
        << options.window_left << ", " << options.window_right << ")";
    throw_invalid(function, out.str());
  }
  if (!(options.softcap >= 0) || !std::isfinite(options.softcap)) {
    std::ostringstream out;
    out << "options.softcap must be finite and >= 0 (0 turns it off), got " << options.softcap;
    throw_invalid(function, out.str());
  }
  if (!(options.dropout_p >= 0 && options.dropout_p < 1)) {
    std::ostringstream out;
    out << "options.dropout_p must be in [0, 1), got " << options.dropout_p;
    throw_invalid(function, out.str());
  }
}

inline void check_head_dim(const char* function, std::size_t head_dim, const std::string& q) {
  if (head_dim < 1 || head_dim > static_cast<std::size_t>(max_head_dim)) {
    std::ostringstream out;
    out << "head_dim (q's last extent) must be in 1.." << max_head_dim << ", got " << head_dim
        << " (q is " << q << ")";
    throw_invalid(function, out.str());
  }
}

/// The kernels index batch entries, rows and heads with int and tiles with
/// an int league: each extent, and the (batch, head, 64-row block) count,
/// below 2^31. Element offsets are 64-bit (any tensor size).
inline void check_index_limits(const char* function,
                               std::initializer_list<std::pair<const char*, std::size_t>> extents,
                               std::size_t tiles) {
  constexpr std::size_t limit = std::size_t(1) << 31;
  for (const auto& e : extents) {
    if (e.second >= limit) {
      std::ostringstream out;
      out << e.first << " must be below 2^31, got " << e.second;
      throw_invalid(function, out.str());
    }
  }
  if (tiles >= limit) {
    std::ostringstream out;
    out << "batch * heads * ceil(seqlen_q / 64) must be below 2^31, got " << tiles;
    throw_invalid(function, out.str());
  }
}

/// Grouped-query attention: every key/value head serves heads / heads_kv
/// query heads.
inline void check_heads(const char* function, std::size_t heads, std::size_t heads_kv) {
  if (heads_kv == 0 ? heads != 0 : heads % heads_kv != 0) {
    std::ostringstream out;
    out << "heads of q (" << heads << ") must be a multiple of heads_kv, the heads of k and v ("
        << heads_kv << ")";
    throw_invalid(function, out.str());
  }
}

template <class T, class K, class V, class O>
constexpr void check_input_types() {
  static_assert(is_supported_value_type<T>::value,
                "kfa: q's value type must be double, float, kfa::half or kfa::bfloat16");
  static_assert(std::is_same<typename K::non_const_value_type, T>::value &&
                    std::is_same<typename V::non_const_value_type, T>::value,
                "kfa: k and v must have q's value type");
}

/// Throws unless rank-4 `view` has the extents of `like`.
template <class ViewType, class Like>
void check_extents_like(const char* function, const char* name, const char* shape,
                        const ViewType& view, const Like& like) {
  check_extents(function, name, shape, view,
                {like.extent(0), like.extent(1), like.extent(2), like.extent(3)});
}

/// The expected shapes of the tensors, as the messages print them.
constexpr const char* kShapeQ = "[batch][seqlen_q][heads][head_dim]";
constexpr const char* kShapeK = "[batch][seqlen_k][heads_kv][head_dim]";
constexpr const char* kShapeLse = "[batch][heads][seqlen_q]";

/// The kinds (View, rank, layout, memory space) of the forward's tensors, which
/// the backward also takes.
template <class ExecSpace, class Q, class K, class V, class O, class Lse>
void check_forward_view_kinds(const char* function) {
  check_view_kind<ExecSpace, Q>(function, "q", kShapeQ, 4);
  check_view_kind<ExecSpace, K>(function, "k", kShapeK, 4);
  check_view_kind<ExecSpace, V>(function, "v", kShapeK, 4);
  check_view_kind<ExecSpace, O>(function, "o", kShapeQ, 4);
  check_view_kind<ExecSpace, Lse>(function, "lse", kShapeLse, 3);
}

/// head_dim, the head grouping, and the extents that q and k fix for k, v, o
/// and lse.
template <class Q, class K, class V, class O, class Lse>
void check_forward_extents(const char* function, const Q& q, const K& k, const V& v, const O& o,
                           const Lse& lse) {
  const std::size_t batch = q.extent(0), seqlen_q = q.extent(1), heads = q.extent(2),
                    head_dim = q.extent(3), seqlen_k = k.extent(1), heads_kv = k.extent(2);
  check_head_dim(function, head_dim, extents_string(q));
  check_heads(function, heads, heads_kv);
  check_index_limits(function,
                     {{"batch (q's extent 0)", batch},
                      {"seqlen_q (q's extent 1)", seqlen_q},
                      {"heads (q's extent 2)", heads},
                      {"seqlen_k (k's extent 1)", seqlen_k}},
                     batch * heads * ((seqlen_q + 63) / 64));
  check_extents(function, "k", kShapeK, k, {batch, seqlen_k, heads_kv, head_dim});
  check_extents(function, "v", kShapeK, v, {batch, seqlen_k, heads_kv, head_dim});
  check_extents(function, "o", kShapeQ, o, {batch, seqlen_q, heads, head_dim});
  check_extents(function, "lse", kShapeLse, lse, {batch, heads, seqlen_q});
}

template <class ExecSpace, class Q, class K, class V, class O, class Lse>
void check_forward_arguments(const char* function, const Q& q, const K& k, const V& v,
                             const O& o, const Lse& lse, const AttentionOptions& options) {
  check_forward_view_kinds<ExecSpace, Q, K, V, O, Lse>(function);
  if constexpr (forward_types_ok<ExecSpace, Q, K, V, O, Lse>()) {
    using T = typename Q::non_const_value_type;
    check_input_types<T, K, V, O>();
    static_assert(std::is_same<typename O::value_type, T>::value,
                  "kfa: o must be a non-const View of q's value type");
    static_assert(std::is_same<typename Lse::value_type, accumulator_t<T>>::value,
                  "kfa: lse must be a non-const View of kfa::accumulator_t<value type> "
                  "(double for double, float otherwise)");
    check_forward_extents(function, q, k, v, o, lse);
    if (overlaps(o, q) || overlaps(o, k) || overlaps(o, v) || overlaps(lse, q) ||
        overlaps(lse, k) || overlaps(lse, v) || overlaps(o, lse)) {
      throw_invalid(function, "the outputs o and lse must not overlap the inputs or "
                              "each other");
    }
    check_options(function, options);
  }
}

/// Throws when dq, dk or dv overlap an input of the backward or each other.
template <class Q, class K, class V, class O, class Lse, class DO, class DQ, class DK, class DV>
void check_gradients_disjoint(const char* function, const Q& q, const K& k, const V& v,
                              const O& o, const Lse& lse, const DO& d_o, const DQ& dq,
                              const DK& dk, const DV& dv) {
  auto overlaps_inputs = [&](const auto& out) {
    return overlaps(out, q) || overlaps(out, k) || overlaps(out, v) || overlaps(out, o) ||
           overlaps(out, lse) || overlaps(out, d_o);
  };
  if (overlaps_inputs(dq) || overlaps_inputs(dk) || overlaps_inputs(dv) || overlaps(dq, dk) ||
      overlaps(dq, dv) || overlaps(dk, dv)) {
    throw_invalid(function, "the outputs dq, dk and dv must not overlap the inputs or "
                            "each other");
  }
}

template <class ExecSpace, class Q, class K, class V, class O, class Lse, class DO,
          class DQ, class DK, class DV>
void check_backward_arguments(const char* function, const Q& q, const K& k, const V& v,
                              const O& o, const Lse& lse, const DO& d_o, const DQ& dq,
                              const DK& dk, const DV& dv, const AttentionOptions& options) {
  check_view_kind<ExecSpace, DO>(function, "d_o", kShapeQ, 4);
  check_view_kind<ExecSpace, DQ>(function, "dq", kShapeQ, 4);
  check_view_kind<ExecSpace, DK>(function, "dk", kShapeK, 4);
  check_view_kind<ExecSpace, DV>(function, "dv", kShapeK, 4);
  check_forward_view_kinds<ExecSpace, Q, K, V, O, Lse>(function);
  if constexpr (backward_types_ok<ExecSpace, Q, K, V, O, Lse, DO, DQ, DK, DV>()) {
    using T = typename Q::non_const_value_type;
    check_input_types<T, K, V, O>();
    static_assert(std::is_same<typename O::non_const_value_type, T>::value &&
                      std::is_same<typename DO::non_const_value_type, T>::value,
                  "kfa::flash_attention_backward: o and d_o must have q's value type");
    static_assert(std::is_same<typename DQ::value_type, T>::value &&
                      std::is_same<typename DK::value_type, T>::value &&
                      std::is_same<typename DV::value_type, T>::value,
                  "kfa::flash_attention_backward: dq, dk and dv must be non-const Views "
                  "of q's value type");
    static_assert(std::is_same<typename Lse::non_const_value_type, accumulator_t<T>>::value,
                  "kfa::flash_attention_backward: lse must be a View of "
                  "kfa::accumulator_t<value type>");
    check_forward_extents(function, q, k, v, o, lse);
    check_extents_like(function, "d_o", kShapeQ, d_o, q);
    check_extents_like(function, "dq", kShapeQ, dq, q);
    check_extents_like(function, "dk", kShapeK, dk, k);
    check_extents_like(function, "dv", kShapeK, dv, k);
    check_gradients_disjoint(function, q, k, v, o, lse, d_o, dq, dk, dv);
    check_options(function, options);
  }
}

// ---- packed variable-length batches ----

template <class ExecSpace, class Offsets>
constexpr bool offsets_ok() {
  if constexpr (!Kokkos::is_view<Offsets>::value) {
    return false;
  } else {
    return view_rank<Offsets>() == 1 &&
           Kokkos::SpaceAccessibility<ExecSpace, typename Offsets::memory_space>::accessible;
  }
}

/// cu_seqlens: a rank-1 View of int (any contiguous layout) in q's memory space.
template <class ExecSpace, class Offsets, class Q>
void check_offsets_kind(const char* function, const char* name) {
  static_assert(Kokkos::is_view<Offsets>::value,
                "kfa: cu_seqlens_q and cu_seqlens_k must be Kokkos::Views of int");
  if (view_rank<Offsets>() != 1) {
    throw_invalid(function, std::string(name) + " must be a rank-1 View [batch + 1] of int");
  }
  if (!std::is_same<typename Offsets::array_layout, Kokkos::LayoutRight>::value &&
      !std::is_same<typename Offsets::array_layout, Kokkos::LayoutLeft>::value) {
    throw_invalid(function, std::string(name) + " [batch + 1] must be a LayoutRight or "
                                                "LayoutLeft (contiguous) View");
  }
  if (!std::is_same<typename Offsets::memory_space, typename Q::memory_space>::value) {
    throw_invalid(function, std::string(name) + " [batch + 1] must live in q's memory space " +
                                Q::memory_space::name() + ", got " +
                                Offsets::memory_space::name());
  }
}

/// Reads offsets to the host (this fences) and checks that they describe
/// sequences packed back to back: offsets[0] = 0, non-decreasing, the last
/// equal to the packed tensor's rows, no length above max_seqlen.
template <class Offsets>
void check_offsets(const char* function, const char* name, const Offsets& offsets,
                   std::size_t total, const char* total_name, int max_seqlen,
                   const char* max_name) {
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), offsets);
  const std::size_t n = host.extent(0);
  std::ostringstream out;
  out << name << " [batch + 1] ";
  if (host(0) != 0) {
    out << "must start at 0, got " << name << "[0] = " << host(0);
    throw_invalid(function, out.str());
  }
  for (std::size_t b = 0; b + 1 < n; ++b) {
    const std::int64_t length = std::int64_t(host(b + 1)) - host(b);
    if (length < 0) {
      out << "must be non-decreasing, got " << name << "[" << b << "] = " << host(b) << " > "
          << name << "[" << b + 1 << "] = " << host(b + 1);
      throw_invalid(function, out.str());
    }
    if (length > max_seqlen) {
      out << "describes a sequence of length " << length << " (entry " << b << "), above "
          << max_name << " = " << max_seqlen;
      throw_invalid(function, out.str());
    }
  }
  if (static_cast<std::size_t>(host(n - 1)) != total) {
    out << "must end at " << total_name << " = " << total << ", got " << name << "[" << n - 1
        << "] = " << host(n - 1);
    throw_invalid(function, out.str());
  }
}

/// Packed tensors are reshaped by the kernels ([total][..] as [1][total][..]).
template <class ViewType>
void check_contiguous(const char* function, const char* name, const ViewType& view) {
  if (!view.span_is_contiguous()) {
    throw_invalid(function, std::string(name) +
                                " must be contiguous (a LayoutRight View without padding) in "
                                "a packed batch, got a View with strides");
  }
}

template <class ExecSpace, class Q, class K, class V, class CuQ, class CuK, class O, class Lse>
constexpr bool varlen_types_ok() {
  return view_ok<ExecSpace, Q>(3) && view_ok<ExecSpace, K>(3) && view_ok<ExecSpace, V>(3) &&
         view_ok<ExecSpace, O>(3) && view_ok<ExecSpace, Lse>(2) &&
         offsets_ok<ExecSpace, CuQ>() && offsets_ok<ExecSpace, CuK>();
}

/// Shapes and offsets of a packed (variable-length) call, forward or
/// backward: q [total_q][heads][head_dim], k, v [total_k][heads_kv][head_dim],
/// o like q, lse [heads][total_q], cu_seqlens [batch + 1]. Reads the offsets
/// on the host (this fences).
template <class ExecSpace, class Q, class K, class V, class CuQ, class CuK, class O, class Lse>
void check_varlen_arguments(const char* function, const Q& q, const K& k, const V& v,
                            const CuQ& cu_seqlens_q, const CuK& cu_seqlens_k,
                            int max_seqlen_q, int max_seqlen_k, const O& o, const Lse& lse,
                            const AttentionOptions& options) {
  const char* shape_q = "[total_q][heads][head_dim]";
  const char* shape_k = "[total_k][heads_kv][head_dim]";
  const char* shape_lse = "[heads][total_q]";
  check_view_kind<ExecSpace, Q>(function, "q", shape_q, 3);
  check_view_kind<ExecSpace, K>(function, "k", shape_k, 3);
  check_view_kind<ExecSpace, V>(function, "v", shape_k, 3);
  check_view_kind<ExecSpace, O>(function, "o", shape_q, 3);
  check_view_kind<ExecSpace, Lse>(function, "lse", shape_lse, 2);
  check_offsets_kind<ExecSpace, CuQ, Q>(function, "cu_seqlens_q");
  check_offsets_kind<ExecSpace, CuK, Q>(function, "cu_seqlens_k");
  if constexpr (varlen_types_ok<ExecSpace, Q, K, V, CuQ, CuK, O, Lse>()) {
    using T = typename Q::non_const_value_type;
    check_input_types<T, K, V, O>();
    static_assert(std::is_same<typename O::non_const_value_type, T>::value,
                  "kfa: o must have q's value type");
    static_assert(std::is_same<typename Lse::non_const_value_type, accumulator_t<T>>::value,
                  "kfa: lse must be a View of kfa::accumulator_t<value type>");
    static_assert(std::is_same<typename CuQ::non_const_value_type, int>::value &&
                      std::is_same<typename CuK::non_const_value_type, int>::value,
                  "kfa: cu_seqlens_q and cu_seqlens_k must be Views of int");
    const std::size_t total_q = q.extent(0), heads = q.extent(1), head_dim = q.extent(2),
                      total_k = k.extent(0), heads_kv = k.extent(1);
    check_head_dim(function, head_dim, extents_string(q));
    check_heads(function, heads, heads_kv);
    // cu_seqlens are int: totals past 2^31 cannot be described.
    check_index_limits(function,
                       {{"total_q (q's extent 0)", total_q},
                        {"heads (q's extent 1)", heads},
                        {"total_k (k's extent 0)", total_k}},
                       heads * ((total_q + 63) / 64 + cu_seqlens_q.extent(0)));
    check_extents(function, "v", shape_k, v, {total_k, heads_kv, head_dim});
    check_extents(function, "o", shape_q, o, {total_q, heads, head_dim});
    check_extents(function, "lse", shape_lse, lse, {heads, total_q});
    check_contiguous(function, "q", q);
    check_contiguous(function, "k", k);
    check_contiguous(function, "v", v);
    check_contiguous(function, "o", o);
    check_contiguous(function, "lse", lse);
    check_options(function, options);
    if (cu_seqlens_q.extent(0) < 1 || cu_seqlens_k.extent(0) != cu_seqlens_q.extent(0)) {
      std::ostringstream out;
      out << "cu_seqlens_q and cu_seqlens_k must both be [batch + 1] with batch >= 0, got ["
          << cu_seqlens_q.extent(0) << "] and [" << cu_seqlens_k.extent(0) << "]";
      throw_invalid(function, out.str());
    }
    if (max_seqlen_q < 0 || max_seqlen_k < 0) {
      std::ostringstream out;
      out << "max_seqlen_q and max_seqlen_k must be >= 0, got " << max_seqlen_q << " and "
          << max_seqlen_k;
      throw_invalid(function, out.str());
    }
    check_offsets(function, "cu_seqlens_q", cu_seqlens_q, total_q, "total_q (q.extent(0))",
                  max_seqlen_q, "max_seqlen_q");
    check_offsets(function, "cu_seqlens_k", cu_seqlens_k, total_k, "total_k (k.extent(0))",
                  max_seqlen_k, "max_seqlen_k");
  }
}

template <class ExecSpace, class Q, class K, class V, class CuQ, class CuK, class O, class Lse>
void check_varlen_forward_arguments(const char* function, const Q& q, const K& k, const V& v,
                                    const CuQ& cu_seqlens_q, const CuK& cu_seqlens_k,
                                    int max_seqlen_q, int max_seqlen_k, const O& o,
                                    const Lse& lse, const AttentionOptions& options) {
  check_varlen_arguments<ExecSpace>(function, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                    max_seqlen_k, o, lse, options);
  if constexpr (varlen_types_ok<ExecSpace, Q, K, V, CuQ, CuK, O, Lse>()) {
    static_assert(!std::is_const<typename O::value_type>::value &&
                      !std::is_const<typename Lse::value_type>::value,
                  "kfa::flash_attention_varlen_forward: o and lse must be non-const Views");
    if (overlaps(o, q) || overlaps(o, k) || overlaps(o, v) || overlaps(lse, q) ||
        overlaps(lse, k) || overlaps(lse, v) || overlaps(o, lse)) {
      throw_invalid(function, "the outputs o and lse must not overlap the inputs or "
                              "each other");
    }
  }
}

template <class ExecSpace, class Q, class K, class V, class CuQ, class CuK, class O,
          class Lse, class DO, class DQ, class DK, class DV>
void check_varlen_backward_arguments(const char* function, const Q& q, const K& k,
                                     const V& v, const CuQ& cu_seqlens_q,
                                     const CuK& cu_seqlens_k, int max_seqlen_q,
                                     int max_seqlen_k, const O& o, const Lse& lse,
                                     const DO& d_o, const DQ& dq, const DK& dk, const DV& dv,
                                     const AttentionOptions& options) {
  const char* shape_q = "[total_q][heads][head_dim]";
  const char* shape_k = "[total_k][heads_kv][head_dim]";
  check_view_kind<ExecSpace, DO>(function, "d_o", shape_q, 3);
  check_view_kind<ExecSpace, DQ>(function, "dq", shape_q, 3);
  check_view_kind<ExecSpace, DK>(function, "dk", shape_k, 3);
  check_view_kind<ExecSpace, DV>(function, "dv", shape_k, 3);
  check_varlen_arguments<ExecSpace>(function, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                    max_seqlen_k, o, lse, options);
  if constexpr (varlen_types_ok<ExecSpace, Q, K, V, CuQ, CuK, O, Lse>() &&
                view_ok<ExecSpace, DO>(3) && view_ok<ExecSpace, DQ>(3) &&
                view_ok<ExecSpace, DK>(3) && view_ok<ExecSpace, DV>(3)) {
    using T = typename Q::non_const_value_type;
    static_assert(std::is_same<typename DO::non_const_value_type, T>::value,
                  "kfa::flash_attention_varlen_backward: d_o must have q's value type");
    static_assert(std::is_same<typename DQ::value_type, T>::value &&
                      std::is_same<typename DK::value_type, T>::value &&
                      std::is_same<typename DV::value_type, T>::value,
                  "kfa::flash_attention_varlen_backward: dq, dk and dv must be non-const "
                  "Views of q's value type");
    const std::size_t total_q = q.extent(0), heads = q.extent(1), head_dim = q.extent(2),
                      total_k = k.extent(0), heads_kv = k.extent(1);
    check_extents(function, "d_o", shape_q, d_o, {total_q, heads, head_dim});
    check_extents(function, "dq", shape_q, dq, {total_q, heads, head_dim});
    check_extents(function, "dk", shape_k, dk, {total_k, heads_kv, head_dim});
    check_extents(function, "dv", shape_k, dv, {total_k, heads_kv, head_dim});
    check_contiguous(function, "d_o", d_o);
    check_contiguous(function, "dq", dq);
    check_contiguous(function, "dk", dk);
    check_contiguous(function, "dv", dv);
    check_gradients_disjoint(function, q, k, v, o, lse, d_o, dq, dk, dv);
  }
}

}  // namespace Impl
}  // namespace kfa

#endif
