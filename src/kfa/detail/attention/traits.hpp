#ifndef KFA_DETAIL_ATTENTION_TRAITS_HPP
#define KFA_DETAIL_ATTENTION_TRAITS_HPP

// Every compile-time choice of the fused kernels: tile sizes per backend and
// head dimension, accumulator type, scratch level and the scratch tile types.

#include <kfa/types.hpp>

#include <kfa/detail/backend/tile_primitives.hpp>

#include <cstddef>

namespace kfa {
namespace Impl {

/// Head dimensions the kernels are compiled for; a run-time head_dim uses the
/// smallest bucket that holds it (its tiles are zero-padded).
constexpr int head_dim_bucket(int head_dim) {
  return head_dim <= 32 ? 32 : head_dim <= 64 ? 64 : head_dim <= 128 ? 128 : 256;
}

/// Scratch budget per team. GPU: Kokkos' CUDA team policy caps level-0
/// scratch at the 48 KiB static shared-memory limit minus what it reserves
/// for team reductions (40936 bytes on sm_90 with Kokkos 4.6), so the tiles
/// are sized for 40000 bytes. Host: team scratch is ordinary memory; keep
/// the tiles L2-sized.
template <bool Gpu>
constexpr std::size_t scratch_budget() {
  return Gpu ? std::size_t(40000) : std::size_t(4) * 1024 * 1024;
}

/// Bytes of the forward kernel's tiles: sQ, acc_o [M][D], sKt [D][N+1],
/// sV [N][D], sP [M][N+1], three row vectors; plus alignment slack.
constexpr std::size_t forward_tile_bytes(std::size_t acc, int m, int n, int d) {
  return acc * (2 * std::size_t(m) * d + std::size_t(d) * (n + 1) + std::size_t(n) * d +
                std::size_t(m) * (n + 1) + 3 * std::size_t(m)) +
         8 * 16;
}

/// Bytes of the larger of the two backward kernels' tiles: sQ, sdO (and
/// acc_dq) [M][D], sKt, sVt [D][N+1], sP, sdS [M][N+1], acc_dk, acc_dv (or
/// sK) [N][D], lse and D rows; plus alignment slack.
constexpr std::size_t backward_tile_bytes(std::size_t acc, int m, int n, int d) {
  const std::size_t common = 2 * std::size_t(m) * d + 2 * std::size_t(d) * (n + 1) +
                             2 * std::size_t(m) * (n + 1) + 2 * std::size_t(m);
  const std::size_t kv = common + 2 * std::size_t(n) * d;
  const std::size_t q = common + std::size_t(m) * d + std::size_t(n) * d;
  return acc * (kv > q ? kv : q) + 8 * 16;
}

/// Tile shape (rows of the query block M, keys per block N) chosen from a
/// list of candidates, largest first, as the first that fits the budget.
struct TileShape {
  int m, n;
};

template <bool Backward>
constexpr TileShape gpu_tile_shape(std::size_t acc, int d) {
  constexpr TileShape candidates[] = {{64, 32}, {32, 32}, {32, 16}, {16, 16}, {16, 8},
                                      {8, 8},   {8, 4},   {4, 4},   {4, 2},   {2, 2}};
  for (const TileShape& c : candidates) {
    const std::size_t bytes =
        Backward ? backward_tile_bytes(acc, c.m, c.n, d) : forward_tile_bytes(acc, c.m, c.n, d);
    if (bytes <= scratch_budget<true>()) return c;
  }
  return {1, 1};
}

template <class ExecSpace, class T, int HeadDim>
struct KernelTraits {
  using value_type = T;
  using acc_type = accumulator_t<T>;
  using backend_tag = backend_tag_t<ExecSpace>;
  using scratch_space = typename ExecSpace::scratch_memory_space;
  static constexpr bool kGpu = is_gpu_space<ExecSpace>::value;

  static constexpr int kHeadDim = HeadDim;
  static constexpr std::size_t kAccBytes = sizeof(acc_type);
  // GPU tiles shrink as head_dim and the accumulator grow so that every
  // kernel's tiles fit the scratch budget; host tiles are fixed.
  static constexpr TileShape kFwdShape =
      kGpu ? gpu_tile_shape<false>(kAccBytes, HeadDim) : TileShape{64, 64};
  static constexpr TileShape kBwdShape =
      kGpu ? gpu_tile_shape<true>(kAccBytes, HeadDim) : TileShape{64, 64};
  static constexpr int kBlockM = kFwdShape.m;
  static constexpr int kBlockN = kFwdShape.n;
  static constexpr int kBwdBlockM = kBwdShape.m;
  static constexpr int kBwdBlockN = kBwdShape.n;
  static constexpr int kBwdBlockNPad = kBwdBlockN + 1;
  /// Transposed tiles get one extra column: the GPU lanes that write a
  /// transposed column then hit distinct shared-memory banks.
  static constexpr int kBlockNPad = kBlockN + 1;
  static constexpr int kScratchLevel = kGpu ? 0 : 1;
  static constexpr int kVectorLength = kGpu ? 32 : 1;
  /// GPU: one thread (of kVectorLength lanes) per query row, up to 16.
  static constexpr int kTeamSize = kGpu ? (kBlockM < 16 ? kBlockM : 16) : 1;
  static constexpr int kBwdTeamSize = kGpu ? (kBwdBlockM < 16 ? kBwdBlockM : 16) : 1;

  using unmanaged = Kokkos::MemoryTraits<Kokkos::Unmanaged>;
  template <int Rows, int Cols>
  using Tile = Kokkos::View<acc_type[Rows][Cols], Kokkos::LayoutRight, scratch_space,
                            unmanaged>;
  template <int Rows>
  using Column = Kokkos::View<acc_type[Rows], scratch_space, unmanaged>;

  static_assert(forward_tile_bytes(kAccBytes, kBlockM, kBlockN, kHeadDim) <=
                    scratch_budget<kGpu>(),
                "kfa: forward tiles exceed the scratch budget");
  static_assert(backward_tile_bytes(kAccBytes, kBwdBlockM, kBwdBlockN, kHeadDim) <=
                    scratch_budget<kGpu>(),
                "kfa: backward tiles exceed the scratch budget");
};

}  // namespace Impl
}  // namespace kfa

#endif
