#ifndef KFA_DETAIL_ATTENTION_PADDED_HEAD_DIM_HPP
#define KFA_DETAIL_ATTENTION_PADDED_HEAD_DIM_HPP

// Head dims the fused GPU kernels are not compiled for (anything but 64,
// 128 and, for the 16-bit families, 256) run on the kernel of the next
// compiled head dim up, on zero-padded copies of the operands in workspace
// memory: a zero column adds nothing to q·k, and gives a zero column of O,
// dQ, dK and dV that is not copied back. The softmax scale stays that of
// the caller's head dim. The copies cost a pass over the operands, small
// next to attention's O(N²) work, and the caller's Views are only read and
// written in their own shape.

#include <kfa/detail/attention/kernel_views.hpp>
#include <kfa/detail/common/workspace.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <type_traits>

namespace kfa {
namespace Impl {

/// The head dim the fused kernels compute a call of `head_dim` at: 64, 128,
/// or 256 where `with_256` (the 16-bit families); 0 where none holds it.
constexpr int fused_head_dim(int head_dim, bool with_256) {
  return head_dim <= 0     ? 0
         : head_dim <= 64  ? 64
         : head_dim <= 128 ? 128
         : (with_256 && head_dim <= 256) ? 256
                                         : 0;
}

/// A View of `view`'s type and extents but head dim `head_dim`, with no
/// data: what the kernel choice sees of a padded call.
template <class View>
View padded_shape(const View& view, int head_dim) {
  return View(static_cast<typename View::pointer_type>(nullptr), view.extent(0), view.extent(1),
              view.extent(2), head_dim);
}

/// 16 bytes of a row, the unit copy_head_dim moves where it can: one
/// 2-byte element per thread left the copies bound by instruction issue.
struct alignas(16) HeadDimChunk {
  unsigned int word[4];
};

/// dst = src with columns [src.extent(3), dst.extent(3)) zero (pad), or
/// dst = the first dst.extent(3) columns of src (crop); both contiguous
/// [batch][rows][heads][head_dim], as the fused kernels take them, so that
/// they are copied as [batch·rows·heads][head_dim] matrices. One flat range
/// over the padded side, whose row length is a power of two, so that an
/// element's row and column are a shift and a mask (a 2D MDRangePolicy ran
/// these copies several times slower than memory allows). Where both sides
/// hold one value type, their rows are whole 16-byte chunks and both are
/// 16-byte aligned, a thread moves a chunk instead of an element.
template <class ExecSpace, class Src, class Dst>
void copy_head_dim(const ExecSpace& space, const char* label, const Src& src, const Dst& dst) {
  using value_type = typename Dst::non_const_value_type;
  using src_value_type = typename Src::non_const_value_type;
  const long rows = long(dst.extent(0)) * long(dst.extent(1)) * long(dst.extent(2));
  const long d_src = long(src.extent(3)), d_dst = long(dst.extent(3));
  const long padded = d_dst > d_src ? d_dst : d_src;
  const long narrow = d_dst > d_src ? d_src : d_dst;
  auto shift_of = [](long length) {
    int shift = 0;
    while ((long(1) << shift) < length) ++shift;
    if ((long(1) << shift) != length)
      throw std::logic_error("kfa: a padded head dim must be a power of two");
    return shift;
  };
  constexpr long kChunk = long(sizeof(HeadDimChunk));
  const bool chunks = std::is_same<value_type, src_value_type>::value &&
                      (narrow * long(sizeof(value_type))) % kChunk == 0 &&
                      (padded * long(sizeof(value_type))) % kChunk == 0 &&
                      reinterpret_cast<std::uintptr_t>(src.data()) % kChunk == 0 &&
                      reinterpret_cast<std::uintptr_t>(dst.data()) % kChunk == 0;
  if (chunks) {
    const long per_row = padded * long(sizeof(value_type)) / kChunk;
    const long kept = narrow * long(sizeof(value_type)) / kChunk;
    const int shift = shift_of(per_row);
    const auto* from = reinterpret_cast<const HeadDimChunk*>(src.data());
    auto* to = reinterpret_cast<HeadDimChunk*>(dst.data());
    const bool pad = d_dst == padded;
    Kokkos::parallel_for(
        label, Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<long>>(space, 0, rows << shift),
        KOKKOS_LAMBDA(const long i) {
          const long r = i >> shift, c = i & (per_row - 1);
          if (pad) {
            HeadDimChunk chunk = {{0u, 0u, 0u, 0u}};
            if (c < kept) chunk = from[r * kept + c];
            to[i] = chunk;
          } else if (c < kept) {
            to[r * kept + c] = from[i];
          }
        });
    return;
  }
  const int shift = shift_of(padded);
  const auto* from = src.data();
  auto* to = dst.data();
  if (d_dst == padded) {  // pad: the destination's rows are 2^shift long
    Kokkos::parallel_for(
        label, Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<long>>(space, 0, rows << shift),
        KOKKOS_LAMBDA(const long i) {
          const long r = i >> shift, c = i & (padded - 1);
          to[i] = c < d_src ? static_cast<value_type>(from[r * d_src + c])
                            : static_cast<value_type>(0.0f);
        });
  } else {  // crop: the source's rows are 2^shift long
    Kokkos::parallel_for(
        label, Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<long>>(space, 0, rows << shift),
        KOKKOS_LAMBDA(const long i) {
          const long r = i >> shift, c = i & (padded - 1);
          if (c < d_dst) to[r * d_dst + c] = static_cast<value_type>(from[i]);
        });
  }
}

/// Padded copies of a call's [batch][rows][heads][head_dim] tensors in one
/// workspace: add() reserves a tensor's place, allocate() takes the memory,
/// then view() gives each copy's View over it.
template <class ExecSpace>
class PaddedTensors {
 public:
  PaddedTensors(int head_dim) : m_head_dim(head_dim) {}

  /// Reserves the padded copy of `like`; returns its place.
  template <class View>
  std::size_t add(const View& like) {
    return m_parts.add<typename View::non_const_value_type>(
        std::size_t(like.extent(0)) * like.extent(1) * like.extent(2) * m_head_dim);
  }

  void allocate(const ExecSpace& space, const char* label) {
    m_bytes = workspace(space, WorkspaceSlot::padded_head_dim, m_parts.bytes(), label);
  }

  /// The padded copy of `like` at `slot`, as a View of like's type (or of
  /// its writable type, out4_t).
  template <class Result = void, class View>
  auto view(const View& like, std::size_t slot) const {
    using result_t = std::conditional_t<std::is_void<Result>::value, View, Result>;
    using value_type = typename View::non_const_value_type;
    return result_t(WorkspaceParts::part<value_type>(m_bytes, slot), like.extent(0),
                    like.extent(1), like.extent(2), m_head_dim);
  }
  template <class View>
  out4_t<View> writable(const View& like, std::size_t slot) const {
    return view<out4_t<View>>(like, slot);
  }

 private:
  int m_head_dim;
  WorkspaceParts m_parts;
  Kokkos::View<unsigned char*, typename ExecSpace::memory_space> m_bytes;
};

}  // namespace Impl
}  // namespace kfa

#endif
