#ifndef KFA_DETAIL_RING_KERNELS_HPP
#define KFA_DETAIL_RING_KERNELS_HPP

// The small kernels around ring attention's fused calls: copies between the
// caller's layout and the chunk-major layout the ring works in, the
// accumulation of per-block gradients, and the shard copy.
//
// Chunk-major layout: a rank's local positions [0, len0) and [len0, seqlen)
// (zigzag's two chunks; contiguous sharding has only the first) are stored
// as two blocks one after the other, each an ordinary LayoutRight
// [batch][len][heads][head_dim] (lse: [batch][heads][len]) array, so that a
// chunk is a View the fused kernels take as it is. With one chunk the
// layout is the caller's own.

#include <kfa/types.hpp>

#include <kfa/detail/common/compat.hpp>
#include <kfa/detail/common/packs.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <type_traits>

namespace kfa {
namespace Impl {

/// Value conversion through the destination's accumulator type (exact
/// between a value type and its accumulator; rounds accumulator -> value).
template <class Dst, class Src>
KOKKOS_FORCEINLINE_FUNCTION Dst convert_value(const Src& x) {
  return from_acc<Dst>(to_acc<accumulator_t<Dst>>(x));
}

/// The packed path of ChunkCopy, for a contiguous user tensor. Both sides
/// are [outer][positions][inner] arrays (rank 4: outer = batch, inner =
/// heads·head_dim; lse: outer = batch·heads, inner = 1), so element n of the
/// user's span has one flat index, found with one division, and Width
/// consecutive elements, all in one run of one chunk (ChunkCopy checks
/// that every run's length is a multiple of Width), move as one pack.
template <class ExecSpace, class UserValue, class FlatValue, bool ToChunks, int Width>
class ChunkSpanCopy {
 public:
  using user_pointer = std::conditional_t<ToChunks, const UserValue*, UserValue*>;
  using flat_pointer = std::conditional_t<ToChunks, FlatValue*, const FlatValue*>;

  /// run = seqlen·inner elements (one outer index's positions), run0 =
  /// len0·inner (its first chunk's).
  ChunkSpanCopy(user_pointer user, flat_pointer flat, std::size_t outer, std::size_t run,
                std::size_t run0)
      : m_user(user),
        m_flat(flat),
        m_run(run),
        m_run0(run0),
        m_chunk1(outer * run0),
        m_packs(outer * run / Width) {}

  void launch(const ExecSpace& space) const {
    Kokkos::parallel_for(ToChunks ? "kfa::ring::pack_chunks" : "kfa::ring::unpack_chunks",
                         Kokkos::RangePolicy<ExecSpace>(space, 0, m_packs), *this);
  }

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t pack) const {
    const std::size_t n = pack * Width;
    const std::size_t outer = n / m_run, at = n - outer * m_run;
    const std::size_t f =
        at < m_run0 ? outer * m_run0 + at : m_chunk1 + outer * (m_run - m_run0) + (at - m_run0);
    if constexpr (ToChunks) {
      move(m_user + n, m_flat + f);
    } else {
      move(m_flat + f, m_user + n);
    }
  }

 private:
  template <class S, class D>
  KOKKOS_FORCEINLINE_FUNCTION static void move(const S* src, D* dst) {
    const Pack<S, Width> in = load_pack<Width>(src);
    Pack<D, Width> out;
    for (int e = 0; e < Width; ++e) out.v[e] = convert_value<D>(in.v[e]);
    store_pack<Width>(dst, out);
  }

  user_pointer m_user;
  flat_pointer m_flat;
  std::size_t m_run, m_run0, m_chunk1, m_packs;
};

/// Copies a rank-local tensor ([batch][seqlen][heads][head_dim], or lse
/// [batch][heads][seqlen]) into (ToChunks) or out of a flat chunk-major
/// array, converting the value type on the way. A contiguous user tensor
/// goes through ChunkSpanCopy, in packs where the runs and both pointers
/// allow, else one element a thread; a padded one (a subview) one element a
/// thread through the View, so that neighbouring threads touch neighbouring
/// elements on both sides (one thread a row would leave neighbouring threads
/// head_dim elements apart: uncoalesced).
template <class ExecSpace, class UserView, class FlatView, bool ToChunks>
class ChunkCopy {
 public:
  static constexpr int kRank = view_rank<UserView>();
  static_assert(kRank == 3 || kRank == 4, "kfa::ring: chunk copies take rank-3 or rank-4 Views");

  ChunkCopy(const UserView& user, const FlatView& flat, std::size_t len0)
      : m_user(user), m_flat(flat), m_len0(len0) {}

  void launch(const ExecSpace& space) const {
    const std::size_t elements = m_user.size();
    if (elements == 0) return;
    constexpr int kWidth = pack_width<user_value, flat_value>();
    const std::size_t outer = kRank == 4 ? m_user.extent(0) : m_user.extent(0) * m_user.extent(1);
    const std::size_t seqlen = m_user.extent(kRank == 4 ? 1 : 2);
    const std::size_t inner = elements / (outer * seqlen);
    const std::size_t run = seqlen * inner, run0 = m_len0 * inner;
    if (m_user.span_is_contiguous()) {
      if (run % kWidth == 0 && run0 % kWidth == 0 && pack_aligned<kWidth>(m_user.data()) &&
          pack_aligned<kWidth>(m_flat.data())) {
        ChunkSpanCopy<ExecSpace, user_value, flat_value, ToChunks, kWidth>(
            m_user.data(), m_flat.data(), outer, run, run0)
            .launch(space);
      } else {
        ChunkSpanCopy<ExecSpace, user_value, flat_value, ToChunks, 1>(m_user.data(), m_flat.data(),
                                                                      outer, run, run0)
            .launch(space);
      }
      return;
    }
    Kokkos::parallel_for(ToChunks ? "kfa::ring::pack_chunks" : "kfa::ring::unpack_chunks",
                         Kokkos::RangePolicy<ExecSpace>(space, 0, elements), *this);
  }

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t n) const {
    if constexpr (kRank == 4) {
      const std::size_t batch = m_user.extent(0), seqlen = m_user.extent(1),
                        heads = m_user.extent(2), head_dim = m_user.extent(3);
      const std::size_t d = n % head_dim, row = n / head_dim;
      const std::size_t h = row % heads, i = row / heads % seqlen, b = row / heads / seqlen;
      const std::size_t chunk = i < m_len0 ? 0 : 1;
      const std::size_t len = chunk == 0 ? m_len0 : seqlen - m_len0;
      const std::size_t j = i - chunk * m_len0;
      copy(m_user(b, i, h, d), m_flat(chunk * batch * m_len0 * heads * head_dim +
                                      ((b * len + j) * heads + h) * head_dim + d));
    } else {
      const std::size_t batch = m_user.extent(0), heads = m_user.extent(1),
                        seqlen = m_user.extent(2);
      const std::size_t row = n;
      const std::size_t i = row % seqlen, h = row / seqlen % heads, b = row / seqlen / heads;
      const std::size_t chunk = i < m_len0 ? 0 : 1;
      const std::size_t len = chunk == 0 ? m_len0 : seqlen - m_len0;
      const std::size_t j = i - chunk * m_len0;
      copy(m_user(b, h, i), m_flat(chunk * batch * heads * m_len0 + (b * heads + h) * len + j));
    }
  }

 private:
  using user_value = typename UserView::non_const_value_type;
  using flat_value = typename FlatView::non_const_value_type;

  template <class U, class F>
  KOKKOS_FORCEINLINE_FUNCTION static void copy(U& user, F& flat) {
    if constexpr (ToChunks) {
      flat = convert_value<flat_value>(user);
    } else {
      user = convert_value<user_value>(flat);
    }
  }

  UserView m_user;
  FlatView m_flat;
  std::size_t m_len0;
};

/// acc(n) += src(n) in the accumulator type, over two flat ranges; Width
/// elements a thread (one pack each side) where the launch allows.
template <class ExecSpace, class AccView, class SrcView>
class Accumulate {
 public:
  using acc_t = typename AccView::non_const_value_type;
  using src_t = typename SrcView::non_const_value_type;
  static constexpr int kWidth = pack_width<acc_t, src_t>();

  Accumulate(const AccView& acc, const SrcView& src) : m_acc(acc), m_src(src) {}

  void launch(const ExecSpace& space) const {
    const std::size_t n = m_src.extent(0);
    if (n == 0) return;
    if (n % kWidth == 0 && pack_aligned<kWidth>(m_acc.data()) &&
        pack_aligned<kWidth>(m_src.data())) {
      Kokkos::parallel_for("kfa::ring::accumulate",
                           Kokkos::RangePolicy<ExecSpace, Packed>(space, 0, n / kWidth), *this);
    } else {
      Kokkos::parallel_for("kfa::ring::accumulate", Kokkos::RangePolicy<ExecSpace>(space, 0, n),
                           *this);
    }
  }

  struct Packed {};
  KOKKOS_INLINE_FUNCTION void operator()(Packed, const std::size_t pack) const {
    const std::size_t n = pack * kWidth;
    Pack<acc_t, kWidth> acc = load_pack<kWidth>(m_acc.data() + n);
    const Pack<src_t, kWidth> src = load_pack<kWidth>(m_src.data() + n);
    for (int e = 0; e < kWidth; ++e) acc.v[e] += to_acc<acc_t>(src.v[e]);
    store_pack<kWidth>(m_acc.data() + n, acc);
  }

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t n) const {
    m_acc(n) += to_acc<acc_t>(m_src(n));
  }

 private:
  AccView m_acc;
  SrcView m_src;
};

/// local = this rank's positions of global, through a ShardMap (rank-4
/// [batch][seqlen][heads][head_dim] or rank-3 [batch][heads][seqlen]), one
/// thread an element as in ChunkCopy.
template <class ExecSpace, class GlobalView, class LocalView, class Map>
class ShardCopy {
 public:
  static constexpr int kRank = view_rank<LocalView>();

  ShardCopy(const GlobalView& global, const LocalView& local, const Map& map)
      : m_global(global), m_local(local), m_map(map) {}

  void launch(const ExecSpace& space) const {
    const std::size_t elements = m_local.size();
    if (elements == 0) return;
    Kokkos::parallel_for("kfa::ring::shard", Kokkos::RangePolicy<ExecSpace>(space, 0, elements),
                         *this);
  }

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t n) const {
    if constexpr (kRank == 4) {
      const std::size_t seqlen = m_local.extent(1), heads = m_local.extent(2),
                        head_dim = m_local.extent(3);
      const std::size_t d = n % head_dim, row = n / head_dim;
      const std::size_t h = row % heads, i = row / heads % seqlen, b = row / heads / seqlen;
      m_local(b, i, h, d) = m_global(b, m_map.global(i), h, d);
    } else {
      const std::size_t heads = m_local.extent(1), seqlen = m_local.extent(2);
      const std::size_t row = n;
      const std::size_t i = row % seqlen, h = row / seqlen % heads, b = row / seqlen / heads;
      m_local(b, h, i) = m_global(b, h, m_map.global(i));
    }
  }

 private:
  GlobalView m_global;
  LocalView m_local;
  Map m_map;
};

}  // namespace Impl
}  // namespace kfa

#endif
