#ifndef KFA_DETAIL_BACKEND_HOST_TILES_HPP
#define KFA_DETAIL_BACKEND_HOST_TILES_HPP

// The host kernels' operand tiles from the user's [batch][rows][heads][d]
// Views. A block of rows is read in place when the View already holds it
// as the product needs it (the accumulator type, unit stride along d, every
// row and column the product reads present); otherwise it is converted into
// the thread's tile, zero-padded to whole register blocks. Rows go through
// a pointer where d has unit stride, so conversions run along contiguous
// memory instead of indexing the View per element.

#include <kfa/detail/backend/host/vector_math.hpp>
#include <kfa/detail/common/compat.hpp>

#include <cstddef>
#include <type_traits>

namespace kfa {
namespace Impl {
namespace Host {

/// A row-major operand: row r, column c at ptr[r * ld + c].
template <class Acc>
struct RowTile {
  const Acc* ptr;
  std::ptrdiff_t ld;
};

/// Rows [row0, row0 + count) of head h of a [vb][rows][heads][d] View into
/// dst [count_pad][ld], converted and times `scale`; head dims from
/// head_dim to ld and rows from count to count_pad are 0 (they reach the
/// register blocks, so they must be finite).
template <class Acc, class View>
void load_rows(const View& src, int vb, int row0, int h, int count, int count_pad, int head_dim,
               Acc scale, Acc* dst, int ld) {
  const bool unit_stride = src.stride(3) == 1;
  for (int i = 0; i < count_pad; ++i) {
    Acc* row = dst + std::size_t(i) * ld;
    int d = 0;
    if (i < count && unit_stride) {
      const auto* in = &src(vb, row0 + i, h, 0);
      KFA_HOST_SIMD
      for (d = 0; d < head_dim; ++d) row[d] = to_acc<Acc>(in[d]) * scale;
    } else if (i < count) {
      for (d = 0; d < head_dim; ++d) row[d] = to_acc<Acc>(src(vb, row0 + i, h, d)) * scale;
    }
    for (; d < ld; ++d) row[d] = Acc(0);
  }
}

/// The same rows transposed, dst [head_dim][ld] with dst[d * ld + i] =
/// scale · src row i, dim d; columns from count to ld are 0.
template <class Acc, class View>
void load_transposed(const View& src, int vb, int row0, int h, int count, int head_dim,
                     Acc scale, Acc* dst, int ld) {
  const bool unit_stride = src.stride(3) == 1;
  for (int i = 0; i < count; ++i) {
    if (unit_stride) {
      const auto* in = &src(vb, row0 + i, h, 0);
      for (int d = 0; d < head_dim; ++d) dst[std::size_t(d) * ld + i] = to_acc<Acc>(in[d]) * scale;
    } else {
      for (int d = 0; d < head_dim; ++d)
        dst[std::size_t(d) * ld + i] = to_acc<Acc>(src(vb, row0 + i, h, d)) * scale;
    }
  }
  for (int d = 0; d < head_dim; ++d)
    for (int i = count; i < ld; ++i) dst[std::size_t(d) * ld + i] = Acc(0);
}

/// Rows [row0, row0 + count) of head h as a row-major operand of which a
/// product reads count_pad rows and `width` columns: the View's memory
/// where it holds Acc with unit stride along d, count == count_pad and
/// width <= head_dim; else the rows converted into `tile` [count_pad][ld].
template <class Acc, class View>
RowTile<Acc> row_tile(const View& src, int vb, int row0, int h, int count, int count_pad,
                      int head_dim, int width, Acc* tile, int ld) {
  if constexpr (std::is_same<typename View::non_const_value_type, Acc>::value) {
    if (count > 0 && count == count_pad && width <= head_dim && src.stride(3) == 1)
      return {&src(vb, row0, h, 0), static_cast<std::ptrdiff_t>(src.stride(1))};
  }
  load_rows(src, vb, row0, h, count, count_pad, head_dim, Acc(1), tile, ld);
  return {tile, ld};
}

}  // namespace Host
}  // namespace Impl
}  // namespace kfa

#endif
