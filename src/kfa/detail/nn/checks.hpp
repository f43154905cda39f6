#ifndef KFA_DETAIL_NN_CHECKS_HPP
#define KFA_DETAIL_NN_CHECKS_HPP

// Argument checks of the kfa::nn functions, built on the attention entry
// points' checks: a wrong rank, layout or memory space throws before anything
// is instantiated, extents are compared against the shapes the inputs fix,
// and outputs may alias an input only where the function says so.

#include <kfa/types.hpp>

#include <kfa/detail/common/checks.hpp>

#include <sstream>
#include <string>
#include <type_traits>

namespace kfa {
namespace Impl {

/// The value types kfa::nn stores tensors in: double, float, kfa::half and
/// kfa::bfloat16 (the 16-bit types compute in float, see accumulator_t).
template <class T>
constexpr bool nn_value_type_ok() {
  return is_supported_value_type<std::remove_cv_t<T>>::value;
}

/// Whether T is one of the 16-bit storage types (accumulator wider than T).
template <class T>
constexpr bool nn_is_16bit() {
  return !std::is_same<std::remove_cv_t<T>, accumulator_t<std::remove_cv_t<T>>>::value;
}

/// The value types of Views checked as Views (else false, the runtime check
/// reports the problem).
template <class ViewType>
constexpr bool nn_view_value_ok() {
  if constexpr (!Kokkos::is_view<ViewType>::value) {
    return false;
  } else {
    return nn_value_type_ok<typename ViewType::value_type>();
  }
}

/// Throws unless every View in `views` is of kind (rank, LayoutRight,
/// accessible) described; one call per argument keeps the names.
template <class ExecSpace, class ViewType>
void check_nn_view(const char* function, const char* name, const char* shape, int rank) {
  check_view_kind<ExecSpace, ViewType>(function, name, shape, rank);
  static_assert(nn_view_value_ok<ViewType>(),
                "kfa::nn: Views must hold double, float, kfa::half or kfa::bfloat16");
}

/// Every View has value type T (const allowed for inputs).
template <class T, class... Views>
constexpr bool same_value_type() {
  return (std::is_same<typename Views::non_const_value_type, T>::value && ...);
}

/// Every View is non-const (outputs, gradients).
template <class... Views>
constexpr bool all_non_const() {
  return (!std::is_const<typename Views::value_type>::value && ...);
}

/// Output `out` may be the input `in` itself (elementwise steps) but must
/// not overlap it otherwise.
template <class Out, class In>
void check_alias_or_disjoint(const char* function, const char* out_name, const Out& out,
                             const char* in_name, const In& in) {
  const bool same = static_cast<const void*>(out.data()) == static_cast<const void*>(in.data()) &&
                    out.span() == in.span();
  if (overlaps(out, in) && !same) {
    throw_invalid(function, std::string(out_name) + " must be " + in_name +
                                " itself or not overlap it");
  }
}

template <class Out, class In>
void check_disjoint(const char* function, const char* out_name, const Out& out,
                    const char* in_name, const In& in) {
  if (overlaps(out, in)) {
    throw_invalid(function, std::string(out_name) + " must not overlap " + in_name);
  }
}

/// An optional vector (bias, beta): extent 0 means absent, else `expected`.
template <class ViewType>
void check_optional_vector(const char* function, const char* name, const char* shape,
                           const ViewType& view, std::size_t expected) {
  if (view.extent(0) != 0 && view.extent(0) != expected) {
    std::ostringstream out;
    out << name << " must be " << shape << " = [" << expected << "] or empty ([0], none), got "
        << extents_string(view);
    throw_invalid(function, out.str());
  }
}

inline void check_dropout_p(const char* function, const char* name, double p) {
  if (!(p >= 0 && p < 1)) {
    std::ostringstream out;
    out << name << " must be in [0, 1), got " << p;
    throw_invalid(function, out.str());
  }
}

/// A [rows][cols] Kokkos View over the contiguous data of a LayoutRight View
/// of any rank (tokens of [batch][seqlen][features] as [batch·seqlen][features]).
template <class Result, class ViewType>
Result as_matrix(const ViewType& view, std::size_t rows, std::size_t cols) {
  return Result(view.data(), rows, cols);
}

}  // namespace Impl
}  // namespace kfa

#endif
