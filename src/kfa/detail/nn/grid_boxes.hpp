#ifndef KFA_DETAIL_NN_GRID_BOXES_HPP
#define KFA_DETAIL_NN_GRID_BOXES_HPP

// A run of consecutive tokens of a row-major grid as a few boxes (products of
// one interval per axis), for the block predicate of grid neighbourhoods: a
// neighbourhood mask is a product over the axes, so two boxes hold a visible
// pair iff every axis does, and the predicate on the boxes is exact.

#include <Kokkos_Core.hpp>

namespace kfa {
namespace Impl {

/// Coordinates lo[a]..hi[a] on every axis a (inclusive).
struct GridBox {
  int lo[3], hi[3];
};

/// The most boxes a run cuts into: a head and a tail piece per axis but the
/// first, and one piece of whole lines.
constexpr int kGridMaxBoxes = 5;

/// The box of `line` (a point of the grid of axes [0, a), row-major) times
/// [lo, hi] on axis a times every whole axis after a.
KOKKOS_INLINE_FUNCTION GridBox grid_line_box(int axes, const int* extent, int line, int a, int lo,
                                             int hi) {
  GridBox box;
  for (int b = a + 1; b < 3; ++b) {
    box.lo[b] = 0;
    box.hi[b] = b < axes ? extent[b] - 1 : 0;
  }
  box.lo[a] = lo;
  box.hi[a] = hi;
  for (int b = a - 1; b >= 0; --b) {
    box.lo[b] = box.hi[b] = line % extent[b];
    line /= extent[b];
  }
  return box;
}

/// Cuts tokens [begin, end) (0 <= begin <= end <= points) of the grid with
/// `axes` axes of `extent` points into at most kGridMaxBoxes disjoint boxes
/// whose union is the run; returns how many.
KOKKOS_INLINE_FUNCTION int grid_run_boxes(int axes, const int* extent, int begin, int end,
                                          GridBox* boxes) {
  int count = 0;
  // At level a, begin and end count lines of the axes after a (all whole),
  // i.e. points of the grid of axes [0, a].
  for (int a = axes - 1; begin < end; --a) {
    const int n = extent[a], first = begin / n, last = (end - 1) / n;
    if (first == last) {  // always so on axis 0, where the run is [begin, end) itself
      boxes[count++] = grid_line_box(axes, extent, first, a, begin % n, (end - 1) % n);
      break;
    }
    if (begin % n != 0) {
      boxes[count++] = grid_line_box(axes, extent, first, a, begin % n, n - 1);
      begin = (first + 1) * n;
    }
    if (end % n != 0) {
      boxes[count++] = grid_line_box(axes, extent, last, a, 0, (end - 1) % n);
      end = last * n;
    }
    begin /= n;
    end /= n;
  }
  return count;
}

}  // namespace Impl
}  // namespace kfa

#endif
