#ifndef KFA_DETAIL_NN_ROTARY_KERNELS_HPP
#define KFA_DETAIL_NN_ROTARY_KERNELS_HPP

// Rotary position embeddings on rows of [tokens][heads·head_dim] (a
// LayoutRight [batch][seqlen][heads][head_dim] tensor, or a column range of a
// fused q|k|v projection). The angles p·base^(-2j/rotary_dim) are formed in
// fp64 once per (position, pair) into a small cos/sin table: in fp32, p·θ
// for positions in the thousands would lose several digits of the angle.
// The backward is the inverse rotation (the transpose of an orthogonal map),
// the same kernel with the sine negated.

#include <kfa/nn/options.hpp>
#include <kfa/types.hpp>

#include <kfa/detail/common/compat.hpp>
#include <kfa/detail/nn/policies.hpp>
#include <kfa/detail/nn/views.hpp>

#include <cstddef>
#include <cstdint>

namespace kfa {
namespace Impl {

/// table(position, pair, 0|1) = cos|sin of (position_offset + position)·θ_pair.
template <class ExecSpace, class Acc>
struct RotaryTable {
  using memory_space = typename ExecSpace::memory_space;
  Kokkos::View<Acc***, Kokkos::LayoutRight, memory_space> m_table;
  double m_base;
  int m_rotary_dim, m_position_offset;

  KOKKOS_FUNCTION void operator()(const int position, const int pair) const {
    const double inv_freq = math::pow(m_base, -2.0 * pair / m_rotary_dim);
    const double angle = double(m_position_offset + position) * inv_freq;
    m_table(position, pair, 0) = static_cast<Acc>(math::cos(angle));
    m_table(position, pair, 1) = static_cast<Acc>(math::sin(angle));
  }

  static Kokkos::View<Acc***, Kokkos::LayoutRight, memory_space> make(
      const ExecSpace& space, int seqlen, int rotary_dim, const nn::RotaryOptions& options) {
    Kokkos::View<Acc***, Kokkos::LayoutRight, memory_space> table(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("kfa::nn::rotary::table")), seqlen,
        rotary_dim / 2, 2);
    if (seqlen > 0 && rotary_dim > 0) {
      nn_for("kfa::nn::rotary::table", space, seqlen, rotary_dim / 2,
             RotaryTable{table, options.base, rotary_dim, options.position_offset});
    }
    return table;
  }
};

/// out(token, out_col0 + h·head_dim + d) = R·in(token, in_col0 + h·head_dim + d):
/// the first rotary_dim features of each head rotated in pairs, the rest
/// copied. Each thread reads both features of its pair before writing them,
/// so in and out may be the same columns of the same View.
template <class ExecSpace, class T>
struct RotaryApply {
  using memory_space = typename ExecSpace::memory_space;
  using acc_t = accumulator_t<T>;
  NnIn2<T, memory_space> m_in;
  NnOut2<T, memory_space> m_out;
  Kokkos::View<const acc_t***, Kokkos::LayoutRight, memory_space> m_table;
  int m_in_col0, m_out_col0, m_seqlen, m_head_dim, m_rotary_dim;
  bool m_interleaved;
  /// +1 rotates forward, -1 applies the inverse rotation (the backward).
  acc_t m_sign;
  /// Position of each token (packed batches, whose positions restart at
  /// every sequence); empty: token % seqlen.
  Kokkos::View<const int*, memory_space> m_positions;

  /// d2 < rotary_dim/2 is a pair, past it a pass-through feature.
  KOKKOS_FUNCTION void operator()(const int token, const int head, const int d2) const {
    const int in0 = m_in_col0 + head * m_head_dim, out0 = m_out_col0 + head * m_head_dim;
    const int half = m_rotary_dim / 2;
    if (d2 >= half) {
      const int d = m_rotary_dim + (d2 - half);
      m_out(token, out0 + d) = m_in(token, in0 + d);
      return;
    }
    const int first = m_interleaved ? 2 * d2 : d2, second = m_interleaved ? 2 * d2 + 1 : d2 + half;
    const int position = m_positions.extent(0) > 0 ? m_positions(token) : token % m_seqlen;
    const acc_t c = m_table(position, d2, 0), s = m_sign * m_table(position, d2, 1);
    const acc_t x1 = to_acc<acc_t>(m_in(token, in0 + first));
    const acc_t x2 = to_acc<acc_t>(m_in(token, in0 + second));
    m_out(token, out0 + first) = from_acc<T>(x1 * c - x2 * s);
    m_out(token, out0 + second) = from_acc<T>(x2 * c + x1 * s);
  }

  void launch(const ExecSpace& space, int heads) const {
    const int tokens = static_cast<int>(m_out.extent(0));
    if (tokens == 0 || heads == 0 || m_head_dim == 0) return;
    nn_for(m_sign > 0 ? "kfa::nn::rotary::forward" : "kfa::nn::rotary::backward", space, tokens,
           heads, m_head_dim - m_rotary_dim / 2, *this);
  }
};

/// out(token, out_col0 + c) = in(token, in_col0 + c) for c < cols, one Word
/// (T, or 16 bytes where both sides are aligned for it) per thread.
template <class T, class Word>
struct CopyColumns {
  const T* m_in;
  T* m_out;
  std::size_t m_in_stride, m_out_stride;  // in T

  KOKKOS_FUNCTION void operator()(const int token, const int word) const {
    reinterpret_cast<Word*>(m_out + token * m_out_stride)[word] =
        reinterpret_cast<const Word*>(m_in + token * m_in_stride)[word];
  }
};

struct alignas(16) NnWord16 {
  std::uint32_t v[4];
};

template <class ExecSpace, class T>
void copy_columns_impl(const ExecSpace& space, const NnIn2<T, typename ExecSpace::memory_space>& in,
                       int in_col0, const NnOut2<T, typename ExecSpace::memory_space>& out,
                       int out_col0, int cols) {
  const int tokens = int(out.extent(0));
  if (tokens == 0 || cols == 0) return;
  const T* src = in.data() + in_col0;
  T* dst = out.data() + out_col0;
  const std::size_t in_stride = in.extent(1), out_stride = out.extent(1);
  auto aligned = [](const void* p, std::size_t bytes) {
    return reinterpret_cast<std::uintptr_t>(p) % 16 == 0 && bytes % 16 == 0;
  };
  if (16 % sizeof(T) == 0 && aligned(src, in_stride * sizeof(T)) &&
      aligned(dst, out_stride * sizeof(T)) && (cols * sizeof(T)) % 16 == 0) {
    nn_for("kfa::nn::copy_columns", space, tokens, int(cols * sizeof(T) / 16),
           CopyColumns<T, NnWord16>{src, dst, in_stride, out_stride});
  } else {
    nn_for("kfa::nn::copy_columns", space, tokens, cols,
           CopyColumns<T, T>{src, dst, in_stride, out_stride});
  }
}

/// Rotates (sign +1) or rotates back (sign -1) `heads` heads of in's columns
/// from in_col0 into out's from out_col0; rotary_dim 0 copies. Token t sits
/// at position positions(t) (< seqlen) when `positions` is not empty, else
/// at t % seqlen.
template <class ExecSpace, class T>
void rotary_apply_impl(const ExecSpace& space, const NnIn2<T, typename ExecSpace::memory_space>& in,
                       int in_col0, const NnOut2<T, typename ExecSpace::memory_space>& out,
                       int out_col0, int seqlen, int heads, int head_dim, int rotary_dim,
                       const nn::RotaryOptions& options, int sign,
                       const Kokkos::View<const int*, typename ExecSpace::memory_space>&
                           positions = {}) {
  using acc_t = accumulator_t<T>;
  if (rotary_dim == 0) {
    if (in.data() + in_col0 != out.data() + out_col0 || in.extent(1) != out.extent(1))
      copy_columns_impl<ExecSpace, T>(space, in, in_col0, out, out_col0, heads * head_dim);
    return;
  }
  const auto table = RotaryTable<ExecSpace, acc_t>::make(space, seqlen, rotary_dim, options);
  RotaryApply<ExecSpace, T>{in,
                            out,
                            table,
                            in_col0,
                            out_col0,
                            seqlen > 0 ? seqlen : 1,
                            head_dim,
                            rotary_dim,
                            options.style == nn::RotaryStyle::interleaved,
                            acc_t(sign),
                            positions}
      .launch(space, heads);
}

}  // namespace Impl
}  // namespace kfa

#endif
