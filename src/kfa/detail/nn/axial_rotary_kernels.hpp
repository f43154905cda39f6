#ifndef KFA_DETAIL_NN_AXIAL_ROTARY_KERNELS_HPP
#define KFA_DETAIL_NN_AXIAL_ROTARY_KERNELS_HPP

// Axial rotary embeddings of tokens that are the points of a row-major grid:
// the rotary features of each head are cut into one chunk per axis, and axis
// a's chunk is a 1D rotary embedding (its own frequencies, for a chunk of
// that width) of the token's coordinate along a. The angles are formed in
// fp64 once per (axis, coordinate, pair) into a small table, for the reason
// the 1D rotary's are; the backward is the same kernel with the sine negated.

#include <kfa/nn/grid_options.hpp>
#include <kfa/types.hpp>

#include <kfa/detail/common/compat.hpp>
#include <kfa/detail/nn/policies.hpp>
#include <kfa/detail/nn/views.hpp>

namespace kfa {
namespace Impl {

/// table(axis, c, pair, 0|1) = cos|sin of scale[axis]·(offset[axis] + c)·
/// base^(-2·pair / axis_dim), for c < extent[axis] (the rest is unused).
template <class ExecSpace, class Acc>
struct AxialRotaryTable {
  using memory_space = typename ExecSpace::memory_space;
  using table_type = Kokkos::View<Acc****, Kokkos::LayoutRight, memory_space>;
  table_type m_table;
  double m_base;
  int m_axis_dim;
  int m_extent[3], m_offset[3];
  double m_scale[3];

  KOKKOS_FUNCTION void operator()(const int axis, const int c, const int pair) const {
    if (c >= m_extent[axis]) return;
    const double inv_freq = math::pow(m_base, -2.0 * pair / m_axis_dim);
    const double angle = m_scale[axis] * (double(m_offset[axis]) + double(c)) * inv_freq;
    m_table(axis, c, pair, 0) = static_cast<Acc>(math::cos(angle));
    m_table(axis, c, pair, 1) = static_cast<Acc>(math::sin(angle));
  }

  static table_type make(const ExecSpace& space, int axis_dim,
                         const nn::AxialRotaryOptions& options) {
    int max_extent = 0;
    for (int a = 0; a < options.axes; ++a) max_extent = imax(max_extent, options.extent[a]);
    table_type table(Kokkos::view_alloc(Kokkos::WithoutInitializing,
                                        std::string("kfa::nn::axial_rotary::table")),
                     options.axes, max_extent, axis_dim / 2, 2);
    AxialRotaryTable fill{table, options.base, axis_dim, {}, {}, {}};
    for (int a = 0; a < 3; ++a) {
      fill.m_extent[a] = a < options.axes ? options.extent[a] : 1;
      fill.m_offset[a] = options.offset[a];
      fill.m_scale[a] = options.scale[a];
    }
    if (max_extent > 0 && axis_dim > 0) {
      nn_for("kfa::nn::axial_rotary::table", space, options.axes, max_extent, axis_dim / 2, fill);
    }
    return table;
  }
};

/// out(token, h·head_dim + d) = R·in(token, h·head_dim + d): pair p of the
/// rotary features belongs to axis p / (axis_dim/2) and rotates by the
/// token's coordinate along it; features past rotary_dim are copied. Each
/// thread reads both features of its pair before writing them, so in and out
/// may be the same View.
template <class ExecSpace, class T>
struct AxialRotaryApply {
  using memory_space = typename ExecSpace::memory_space;
  using acc_t = accumulator_t<T>;
  NnIn2<T, memory_space> m_in;
  NnOut2<T, memory_space> m_out;
  Kokkos::View<const acc_t****, Kokkos::LayoutRight, memory_space> m_table;
  int m_seqlen, m_head_dim, m_rotary_dim, m_axis_dim;
  /// Grid index of each sequence's first token (a rank's run of a sequence
  /// split over ranks; 0 otherwise).
  int m_token_offset;
  /// Points per step along each axis (row-major: the last axis is 1).
  int m_extent[3], m_stride[3];
  bool m_interleaved;
  /// +1 rotates forward, -1 applies the inverse rotation (the backward).
  acc_t m_sign;

  /// d2 < rotary_dim/2 is a pair, past it a pass-through feature.
  KOKKOS_FUNCTION void operator()(const int token, const int head, const int d2) const {
    const int base = head * m_head_dim, half = m_rotary_dim / 2;
    if (d2 >= half) {
      const int d = base + m_rotary_dim + (d2 - half);
      m_out(token, d) = m_in(token, d);
      return;
    }
    const int pairs = m_axis_dim / 2, axis = d2 / pairs, pair = d2 % pairs;
    // Interleaved pairs (2p, 2p + 1) stay inside their axis's chunk; split
    // pairs are (j, j + axis_dim/2) of the chunk, as the 1D rotary on it.
    const int first = base + (m_interleaved ? 2 * d2 : axis * m_axis_dim + pair);
    const int second = m_interleaved ? first + 1 : first + pairs;
    const int c = (token % m_seqlen + m_token_offset) / m_stride[axis] % m_extent[axis];
    const acc_t cs = m_table(axis, c, pair, 0), sn = m_sign * m_table(axis, c, pair, 1);
    const acc_t x1 = to_acc<acc_t>(m_in(token, first)), x2 = to_acc<acc_t>(m_in(token, second));
    m_out(token, first) = from_acc<T>(x1 * cs - x2 * sn);
    m_out(token, second) = from_acc<T>(x2 * cs + x1 * sn);
  }
};

/// Rotates (sign +1) or rotates back (sign -1) the heads of in ([batch·seqlen]
/// [heads·head_dim]) into out; options already checked. Token t of a
/// sequence is grid point token_offset + t.
template <class ExecSpace, class T>
void axial_rotary_impl(const ExecSpace& space, const NnIn2<T, typename ExecSpace::memory_space>& in,
                       const NnOut2<T, typename ExecSpace::memory_space>& out, int seqlen,
                       int heads, int head_dim, int rotary_dim,
                       const nn::AxialRotaryOptions& options, int sign, int token_offset = 0) {
  using acc_t = accumulator_t<T>;
  const int axis_dim = rotary_dim / options.axes;
  const auto table = AxialRotaryTable<ExecSpace, acc_t>::make(space, axis_dim, options);
  AxialRotaryApply<ExecSpace, T> apply{in, out, table, imax(seqlen, 1), head_dim, rotary_dim,
                                       axis_dim, token_offset, {}, {}, false, acc_t(sign)};
  int stride = 1;
  for (int a = 2; a >= 0; --a) {
    apply.m_extent[a] = a < options.axes ? imax(options.extent[a], 1) : 1;
    apply.m_stride[a] = stride;
    stride *= apply.m_extent[a];
  }
  apply.m_interleaved = options.style == nn::RotaryStyle::interleaved;
  const int tokens = static_cast<int>(out.extent(0));
  if (tokens == 0 || heads == 0 || head_dim == 0) return;
  nn_for(sign > 0 ? "kfa::nn::axial_rotary::forward" : "kfa::nn::axial_rotary::backward", space,
         tokens, heads, head_dim - rotary_dim / 2, apply);
}

}  // namespace Impl
}  // namespace kfa

#endif
