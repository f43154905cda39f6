#ifndef KFA_NN_GRID_HPP
#define KFA_NN_GRID_HPP

/// What models of fields on grids (vision and weather transformers) add to
/// attention: axial rotary position embeddings and neighbourhood attention
/// for tokens that are the points of a 1D, 2D or 3D grid flattened row-major
/// (the last axis fastest). Options in kfa/nn/grid_options.hpp.

#include <kfa/nn/grid_options.hpp>
#include <kfa/score_mod.hpp>

#include <kfa/detail/nn/axial_rotary_kernels.hpp>
#include <kfa/detail/nn/checks.hpp>
#include <kfa/detail/nn/grid_boxes.hpp>

#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <type_traits>

namespace kfa {
namespace Impl {

/// "[5][7]": the first `axes` extents of a grid.
inline std::string grid_string(int axes, const int* extent) {
  std::ostringstream out;
  for (int a = 0; a < axes && a < 3; ++a) out << "[" << extent[a] << "]";
  return out.str();
}

/// Checks a grid's axes and extents (each >= min_extent); returns its points.
inline std::int64_t check_grid(const char* function, int axes, const int* extent, int min_extent) {
  if (axes < 1 || axes > 3) {
    throw_invalid(function, "options.axes must be 1, 2 or 3, got " + std::to_string(axes));
  }
  std::int64_t points = 1;
  for (int a = 0; a < axes; ++a) {
    if (extent[a] < min_extent) {
      throw_invalid(function, "options.extent[" + std::to_string(a) +
                                  "] must be >= " + std::to_string(min_extent) +
                                  ", got options.extent = " + grid_string(axes, extent));
    }
    points *= extent[a];
    if (points > std::numeric_limits<int>::max()) {
      throw_invalid(function, "options.extent = " + grid_string(axes, extent) +
                                  " holds more than 2^31 - 1 points");
    }
  }
  return points;
}

/// Checks the options of an axial rotary call on tokens [batch][seqlen]
/// [heads][head_dim] (`name` the input); returns the rotated features per head.
inline int check_axial_rotary(const char* function, const char* name, const std::string& extents,
                              int seqlen, int head_dim, const nn::AxialRotaryOptions& options) {
  const std::int64_t points = check_grid(function, options.axes, options.extent, 0);
  if (points != seqlen) {
    std::ostringstream out;
    out << name << " [batch][seqlen][heads][head_dim] = " << extents << " has seqlen " << seqlen
        << ", but options.extent = " << grid_string(options.axes, options.extent) << " holds "
        << points << " grid points";
    throw_invalid(function, out.str());
  }
  const int rotary_dim = options.rotary_dim == 0 ? head_dim : options.rotary_dim;
  if (rotary_dim < 0 || rotary_dim > head_dim || rotary_dim % (2 * options.axes) != 0) {
    std::ostringstream out;
    out << "options.rotary_dim (0: head_dim) must be in 0..head_dim = " << head_dim
        << " and split into options.axes = " << options.axes << " even shares (a multiple of "
        << 2 * options.axes << ": every axis rotates pairs of features), got "
        << options.rotary_dim;
    if (options.rotary_dim == 0) out << " (head_dim " << head_dim << ")";
    throw_invalid(function, out.str());
  }
  bool finite = options.base > 0 && std::isfinite(options.base);
  for (int a = 0; a < options.axes; ++a) finite = finite && std::isfinite(options.scale[a]);
  if (!finite) {
    throw_invalid(function, "options.base must be finite and > 0 and options.scale finite");
  }
  return rotary_dim;
}

template <class ExecSpace, class X, class Y>
void nn_axial_rotary(const char* function, const ExecSpace& space, const X& x, const Y& y,
                     const nn::AxialRotaryOptions& options, int sign) {
  ProfilingRegion region(function);
  const char* shape = "[batch][seqlen][heads][head_dim]";
  const char* in_name = sign > 0 ? "x" : "dy";
  const char* out_name = sign > 0 ? "y" : "dx";
  check_nn_view<ExecSpace, X>(function, in_name, shape, 4);
  check_nn_view<ExecSpace, Y>(function, out_name, shape, 4);
  if constexpr (view_ok<ExecSpace, X>(4) && view_ok<ExecSpace, Y>(4)) {
    using T = typename X::non_const_value_type;
    static_assert(same_value_type<T, Y>() && all_non_const<Y>(),
                  "kfa::nn::axial_rotary: the output must be a non-const View of the input's type");
    check_extents(function, out_name, shape, y,
                  {x.extent(0), x.extent(1), x.extent(2), x.extent(3)});
    const int head_dim = static_cast<int>(x.extent(3));
    const int rotary_dim = check_axial_rotary(function, in_name, extents_string(x),
                                              static_cast<int>(x.extent(1)), head_dim, options);
    check_alias_or_disjoint(function, out_name, y, in_name, x);
    axial_rotary_impl<ExecSpace, T>(space, in_tokens(x), out_tokens(y),
                                    static_cast<int>(x.extent(1)), static_cast<int>(x.extent(2)),
                                    head_dim, rotary_dim, options, sign);
  }
}

}  // namespace Impl

namespace nn {

/// Axial rotary position embeddings (2D/3D RoPE of vision and weather
/// transformers): token t of every sequence is the grid point of row-major
/// index t, at coordinates c; the first rotary_dim features of each head are
/// cut into options.axes chunks of w = rotary_dim / axes features, and pair j
/// of chunk a is rotated by scale[a]·(offset[a] + c[a])·base^(-2j / w), its
/// pairs formed as RotaryStyle says inside the chunk. With axes = 1 it is
/// rotary_forward with position_offset = offset[0].
///
/// x, y [batch][seqlen][heads][head_dim] (y may be x itself), seqlen = the
/// product of the extents: LayoutRight Views of double, float, kfa::half or
/// kfa::bfloat16 (rotated in float) accessible from ExecSpace. Enqueued on
/// `space`. Throws std::invalid_argument (nothing written) on bad shapes or
/// options: extents that do not hold seqlen points, rotary features that do
/// not split into even shares per axis.
template <class ExecSpace, class X, class Y>
void axial_rotary_forward(const ExecSpace& space, const X& x, const Y& y,
                          const AxialRotaryOptions& options) {
  Impl::nn_axial_rotary("kfa::nn::axial_rotary_forward", space, x, y, options, 1);
}

/// Backward of axial_rotary_forward: dx = the inverse rotation of dy (the
/// rotation by the negative angles; dx may be dy).
template <class ExecSpace, class DY, class DX>
void axial_rotary_backward(const ExecSpace& space, const DY& dy, const DX& dx,
                           const AxialRotaryOptions& options) {
  Impl::nn_axial_rotary("kfa::nn::axial_rotary_backward", space, dy, dx, options, -1);
}

/// Neighbourhood attention on a grid, as a score modifier for every
/// attention entry point (see kfa/score_mod.hpp): query token i sees key
/// token j iff their grid points are neighbours on every axis (see
/// GridWindow), else the score is masked. Its block predicate is exact: it
/// cuts each run of query rows and of keys into at most 5 boxes, so the
/// kernels skip every tile that holds no visible pair.
///
/// q and k must both be the grid's points (seqlen_q = seqlen_k = points();
/// in packed batches every sequence). The entry points cannot check this
/// before the call, so a sequence of another length gets NaN scores (O, lse
/// and the gradients NaN) instead of a silently wrong mask. Every query sees
/// at least itself, and neither causal masks nor windows hide the diagonal
/// of equal lengths: no row is fully masked.
///
/// Trivially copyable, without Views or virtual calls, so that device
/// kernels can take it by value.
class GridNeighbourhood {
 public:
  /// Throws std::invalid_argument on bad axes, extents or radii.
  explicit GridNeighbourhood(const GridNeighbourhoodOptions& options)
      : m_axes(options.axes), m_shifted(options.window == GridWindow::border_shifted) {
    const char* function = "kfa::nn::GridNeighbourhood";
    m_points = static_cast<int>(Impl::check_grid(function, options.axes, options.extent, 1));
    if (options.window != GridWindow::centred && !m_shifted) {
      Impl::throw_invalid(function, "options.window must be a GridWindow");
    }
    int stride = 1;
    for (int a = 2; a >= 0; --a) {
      m_extent[a] = a < m_axes ? options.extent[a] : 1;
      if (a < m_axes && options.radius[a] < 0) {
        Impl::throw_invalid(function, "options.radius[" + std::to_string(a) +
                                          "] must be >= 0, got " +
                                          std::to_string(options.radius[a]));
      }
      // A radius past the grid is the whole axis; clamped, the window's
      // arithmetic stays far from int overflow.
      m_radius[a] = a < m_axes ? Impl::imin(options.radius[a], m_extent[a] - 1) : 0;
      m_stride[a] = stride;
      stride *= m_extent[a];
    }
  }

  /// Grid points: the sequence length q and k must have.
  int points() const { return m_points; }
  int axes() const { return m_axes; }
  const int* extent() const { return m_extent; }

  /// The largest |i - j| of a visible pair. AttentionOptions::window_left =
  /// window_right = flat_window() gives the same result and lets the kernels
  /// stop visiting key blocks far outside the neighbourhood before asking the
  /// block predicate.
  int flat_window() const {
    int window = 0;
    for (int a = 0; a < m_axes; ++a) {
      const int reach = m_shifted ? Impl::imin(2 * m_radius[a], m_extent[a] - 1) : m_radius[a];
      window += reach * m_stride[a];
    }
    return window;
  }

  /// Whether key token j is visible to query token i (both < points()).
  KOKKOS_INLINE_FUNCTION bool sees(int i, int j) const {
    for (int a = 0; a < m_axes; ++a) {
      const int ci = i / m_stride[a] % m_extent[a], cj = j / m_stride[a] % m_extent[a];
      if (cj < window_lo(a, ci) || cj > window_hi(a, ci)) return false;
    }
    return true;
  }

  template <class Acc>
  KOKKOS_INLINE_FUNCTION Acc operator()(int, int, int i, int j, Acc score, int seqlen_q,
                                        int seqlen_k) const {
    if (seqlen_q != m_points || seqlen_k != m_points) return static_cast<Acc>(NAN);
    return sees(i, j) ? score : masked_score<Acc>();
  }

  /// False iff no query of rows [row_begin, row_end) sees a key of [key_begin,
  /// key_end). The windows are monotone in the query's coordinate, so the
  /// keys a query interval sees along an axis are one interval.
  KOKKOS_INLINE_FUNCTION bool visible(int, int, int row_begin, int row_end, int key_begin,
                                      int key_end) const {
    // Past the grid: let the scores report the mismatched length.
    if (row_end > m_points || key_end > m_points) return true;
    Impl::GridBox rows[Impl::kGridMaxBoxes], keys[Impl::kGridMaxBoxes];
    const int row_boxes = Impl::grid_run_boxes(m_axes, m_extent, row_begin, row_end, rows);
    const int key_boxes = Impl::grid_run_boxes(m_axes, m_extent, key_begin, key_end, keys);
    for (int r = 0; r < row_boxes; ++r)
      for (int k = 0; k < key_boxes; ++k) {
        bool near = true;
        for (int a = 0; a < m_axes; ++a) {
          near = near && keys[k].lo[a] <= window_hi(a, rows[r].hi[a]) &&
                 keys[k].hi[a] >= window_lo(a, rows[r].lo[a]);
        }
        if (near) return true;
      }
    return false;
  }

 private:
  /// The keys query coordinate c sees along axis a: [window_lo, window_hi],
  /// both non-decreasing in c.
  KOKKOS_INLINE_FUNCTION int window_lo(int a, int c) const {
    if (!m_shifted) return c - m_radius[a];
    return Impl::imax(0, Impl::imin(c - m_radius[a], m_extent[a] - 2 * m_radius[a] - 1));
  }
  KOKKOS_INLINE_FUNCTION int window_hi(int a, int c) const {
    return m_shifted ? window_lo(a, c) + 2 * m_radius[a] : c + m_radius[a];
  }

  int m_axes;
  bool m_shifted;
  int m_points = 0;
  int m_extent[3] = {1, 1, 1}, m_stride[3] = {1, 1, 1}, m_radius[3] = {0, 0, 0};
};

static_assert(std::is_trivially_copyable<GridNeighbourhood>::value,
              "kfa::nn::GridNeighbourhood must be trivially copyable to reach device kernels");

}  // namespace nn

namespace Impl {

/// The layers' check of a score modifier (kfa/nn/score_mods.hpp), which
/// knows the sequence lengths: a grid of another size is refused before
/// anything is written. Declared before the layers, as <kfa/nn.hpp> does.
template <class ExecSpace>
void nn_check_score_mod(const char* function, const nn::GridNeighbourhood& mod, int, int,
                        int seqlen_q, int seqlen_k) {
  if (seqlen_q != mod.points() || seqlen_k != mod.points()) {
    std::ostringstream out;
    out << "the grid neighbourhood's options.extent = " << grid_string(mod.axes(), mod.extent())
        << " holds " << mod.points() << " points, but seqlen_q = " << seqlen_q
        << " and seqlen_k = " << seqlen_k << " (both must be the grid's points)";
    throw_invalid(function, out.str());
  }
}

}  // namespace Impl
}  // namespace kfa

#endif
