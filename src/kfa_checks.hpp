#ifndef KFA_CHECKS_HPP
#define KFA_CHECKS_HPP

// Argument checks shared by every entry point. Everything that is wrong is
// reported before any output is touched: rank, layout and accessibility
// problems throw at run time (and the kernels are then not even instantiated),
// extents are compared against the shapes derived from q and k.

#include <kfa/options.hpp>
#include <kfa/types.hpp>

#include <kfa_compat.hpp>

#include <cmath>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>

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
}

template <class ExecSpace, class Q, class K, class V, class O, class Lse>
void check_forward_arguments(const char* function, const Q& q, const K& k, const V& v,
                             const O& o, const Lse& lse, const AttentionOptions& options) {
  check_view_kind<ExecSpace, Q>(function, "q", "[batch][seqlen_q][heads][head_dim]", 4);
  check_view_kind<ExecSpace, K>(function, "k", "[batch][seqlen_k][heads][head_dim]", 4);
  check_view_kind<ExecSpace, V>(function, "v", "[batch][seqlen_k][heads][head_dim]", 4);
  check_view_kind<ExecSpace, O>(function, "o", "[batch][seqlen_q][heads][head_dim]", 4);
  check_view_kind<ExecSpace, Lse>(function, "lse", "[batch][heads][seqlen_q]", 3);
  if constexpr (forward_types_ok<ExecSpace, Q, K, V, O, Lse>()) {
    using T = typename Q::non_const_value_type;
    static_assert(is_supported_value_type<T>::value,
                  "kfa: q's value type must be double, float, kfa::half or kfa::bfloat16");
    static_assert(std::is_same<typename K::non_const_value_type, T>::value &&
                      std::is_same<typename V::non_const_value_type, T>::value &&
                      std::is_same<typename O::value_type, T>::value,
                  "kfa: k, v and o must have q's value type (o non-const)");
    static_assert(std::is_same<typename Lse::value_type, accumulator_t<T>>::value,
                  "kfa: lse must be a non-const View of kfa::accumulator_t<value type> "
                  "(double for double, float otherwise)");
    const std::size_t batch = q.extent(0), seqlen_q = q.extent(1), heads = q.extent(2),
                      head_dim = q.extent(3), seqlen_k = k.extent(1);
    if (head_dim < 1 || head_dim > static_cast<std::size_t>(max_head_dim)) {
      std::ostringstream out;
      out << "head_dim (q.extent(3)) must be in 1.." << max_head_dim << ", got " << head_dim
          << " (q is " << extents_string(q) << ")";
      throw_invalid(function, out.str());
    }
    check_extents(function, "k", "[batch][seqlen_k][heads][head_dim]", k,
                  {batch, seqlen_k, heads, head_dim});
    check_extents(function, "v", "[batch][seqlen_k][heads][head_dim]", v,
                  {batch, seqlen_k, heads, head_dim});
    check_extents(function, "o", "[batch][seqlen_q][heads][head_dim]", o,
                  {batch, seqlen_q, heads, head_dim});
    check_extents(function, "lse", "[batch][heads][seqlen_q]", lse,
                  {batch, heads, seqlen_q});
    if (overlaps(o, q) || overlaps(o, k) || overlaps(o, v) || overlaps(lse, q) ||
        overlaps(lse, k) || overlaps(lse, v) || overlaps(o, lse)) {
      throw_invalid(function, "the outputs o and lse must not overlap the inputs or "
                              "each other");
    }
    check_options(function, options);
  }
}

template <class ExecSpace, class Q, class K, class V, class O, class Lse, class DO,
          class DQ, class DK, class DV>
void check_backward_arguments(const char* function, const Q& q, const K& k, const V& v,
                              const O& o, const Lse& lse, const DO& d_o, const DQ& dq,
                              const DK& dk, const DV& dv, const AttentionOptions& options) {
  check_view_kind<ExecSpace, DO>(function, "d_o", "[batch][seqlen_q][heads][head_dim]", 4);
  check_view_kind<ExecSpace, DQ>(function, "dq", "[batch][seqlen_q][heads][head_dim]", 4);
  check_view_kind<ExecSpace, DK>(function, "dk", "[batch][seqlen_k][heads][head_dim]", 4);
  check_view_kind<ExecSpace, DV>(function, "dv", "[batch][seqlen_k][heads][head_dim]", 4);
  check_view_kind<ExecSpace, Q>(function, "q", "[batch][seqlen_q][heads][head_dim]", 4);
  check_view_kind<ExecSpace, K>(function, "k", "[batch][seqlen_k][heads][head_dim]", 4);
  check_view_kind<ExecSpace, V>(function, "v", "[batch][seqlen_k][heads][head_dim]", 4);
  check_view_kind<ExecSpace, O>(function, "o", "[batch][seqlen_q][heads][head_dim]", 4);
  check_view_kind<ExecSpace, Lse>(function, "lse", "[batch][heads][seqlen_q]", 3);
  if constexpr (backward_types_ok<ExecSpace, Q, K, V, O, Lse, DO, DQ, DK, DV>()) {
    using T = typename Q::non_const_value_type;
    static_assert(is_supported_value_type<T>::value,
                  "kfa: q's value type must be double, float, kfa::half or kfa::bfloat16");
    static_assert(std::is_same<typename K::non_const_value_type, T>::value &&
                      std::is_same<typename V::non_const_value_type, T>::value &&
                      std::is_same<typename O::non_const_value_type, T>::value &&
                      std::is_same<typename DO::non_const_value_type, T>::value,
                  "kfa::flash_attention_backward: k, v, o and d_o must have q's value type");
    static_assert(std::is_same<typename DQ::value_type, T>::value &&
                      std::is_same<typename DK::value_type, T>::value &&
                      std::is_same<typename DV::value_type, T>::value,
                  "kfa::flash_attention_backward: dq, dk and dv must be non-const Views "
                  "of q's value type");
    static_assert(std::is_same<typename Lse::non_const_value_type, accumulator_t<T>>::value,
                  "kfa::flash_attention_backward: lse must be a View of "
                  "kfa::accumulator_t<value type>");
    const std::size_t batch = q.extent(0), seqlen_q = q.extent(1), heads = q.extent(2),
                      head_dim = q.extent(3), seqlen_k = k.extent(1);
    if (head_dim < 1 || head_dim > static_cast<std::size_t>(max_head_dim)) {
      std::ostringstream out;
      out << "head_dim (q.extent(3)) must be in 1.." << max_head_dim << ", got " << head_dim
          << " (q is " << extents_string(q) << ")";
      throw_invalid(function, out.str());
    }
    const char* shape_q = "[batch][seqlen_q][heads][head_dim]";
    const char* shape_k = "[batch][seqlen_k][heads][head_dim]";
    check_extents(function, "k", shape_k, k, {batch, seqlen_k, heads, head_dim});
    check_extents(function, "v", shape_k, v, {batch, seqlen_k, heads, head_dim});
    check_extents(function, "o", shape_q, o, {batch, seqlen_q, heads, head_dim});
    check_extents(function, "lse", "[batch][heads][seqlen_q]", lse,
                  {batch, heads, seqlen_q});
    check_extents(function, "d_o", shape_q, d_o, {batch, seqlen_q, heads, head_dim});
    check_extents(function, "dq", shape_q, dq, {batch, seqlen_q, heads, head_dim});
    check_extents(function, "dk", shape_k, dk, {batch, seqlen_k, heads, head_dim});
    check_extents(function, "dv", shape_k, dv, {batch, seqlen_k, heads, head_dim});
    auto overlaps_inputs = [&](const auto& out) {
      return overlaps(out, q) || overlaps(out, k) || overlaps(out, v) ||
             overlaps(out, o) || overlaps(out, lse) || overlaps(out, d_o);
    };
    if (overlaps_inputs(dq) || overlaps_inputs(dk) || overlaps_inputs(dv) ||
        overlaps(dq, dk) || overlaps(dq, dv) || overlaps(dk, dv)) {
      throw_invalid(function, "the outputs dq, dk and dv must not overlap the inputs or "
                              "each other");
    }
    check_options(function, options);
  }
}

}  // namespace Impl
}  // namespace kfa

#endif
