#ifndef KFA_TRAITS_HPP
#define KFA_TRAITS_HPP

// Every compile-time choice of the fused kernels: tile sizes per backend and
// head dimension, accumulator type, scratch level and the scratch tile types.

#include <kfa/types.hpp>

#include <impl/backend/kfa_backend.hpp>

#include <cstddef>

namespace kfa {
namespace Impl {

/// Head dimensions the kernels are compiled for; a run-time head_dim uses the
/// smallest bucket that holds it (its tiles are zero-padded).
constexpr int head_dim_bucket(int head_dim) {
  return head_dim <= 32 ? 32 : head_dim <= 64 ? 64 : head_dim <= 128 ? 128 : 256;
}

/// Scratch budget per team. GPU: what one block may use on sm_80/sm_90
/// with the opt-in limit, leaving room for a second block per SM at small
/// head dims. Host: team scratch is ordinary memory; keep tiles L2-sized.
template <bool Gpu>
constexpr std::size_t scratch_budget() {
  return Gpu ? std::size_t(160) * 1024 : std::size_t(4) * 1024 * 1024;
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
  // GPU tiles shrink as head_dim and the accumulator grow so that the forward
  // kernel's five tiles fit the scratch budget; host tiles are fixed.
  static constexpr int kBlockM =
      !kGpu ? 64 : (kAccBytes * HeadDim <= 4 * 64) ? 64 : (kAccBytes * HeadDim <= 4 * 128) ? 32 : 16;
  static constexpr int kBlockN =
      !kGpu ? 64 : (kAccBytes * HeadDim <= 4 * 128) ? 32 : 16;
  /// The backward kernels keep nine tiles: the key block shrinks first.
  static constexpr int kBwdBlockM = kBlockM;
  static constexpr int kBwdBlockN = (kGpu && kAccBytes * HeadDim >= 2048) ? 8 : kBlockN;
  static constexpr int kBwdBlockNPad = kBwdBlockN + 1;
  /// Transposed tiles get one extra column: the GPU lanes that write a
  /// transposed column then hit distinct shared-memory banks.
  static constexpr int kBlockNPad = kBlockN + 1;
  static constexpr int kScratchLevel = kGpu ? 0 : 1;
  static constexpr int kVectorLength = kGpu ? 32 : 1;
  static constexpr int kTeamSize = kGpu ? 8 : 1;

  using unmanaged = Kokkos::MemoryTraits<Kokkos::Unmanaged>;
  template <int Rows, int Cols>
  using Tile = Kokkos::View<acc_type[Rows][Cols], Kokkos::LayoutRight, scratch_space,
                            unmanaged>;
  template <int Rows>
  using Column = Kokkos::View<acc_type[Rows], scratch_space, unmanaged>;

  /// Forward: sQ, sKt, sV, sP, acc_o and three row vectors.
  static constexpr std::size_t forward_scratch_estimate() {
    return kAccBytes * (std::size_t(kBlockM) * kHeadDim + std::size_t(kHeadDim) * kBlockNPad +
                        std::size_t(kBlockN) * kHeadDim + std::size_t(kBlockM) * kBlockNPad +
                        std::size_t(kBlockM) * kHeadDim + 3 * kBlockM) +
           8 * 64;
  }
  /// Backward dK/dV: sQ, sdO, sK, sKt, sVt, sP, sdS, acc_dk, acc_dv, lse, delta.
  static constexpr std::size_t backward_scratch_estimate() {
    return kAccBytes *
               (2 * std::size_t(kBwdBlockM) * kHeadDim + std::size_t(kBwdBlockN) * kHeadDim +
                2 * std::size_t(kHeadDim) * kBwdBlockNPad +
                2 * std::size_t(kBwdBlockM) * kBwdBlockNPad +
                2 * std::size_t(kBwdBlockN) * kHeadDim + 2 * kBwdBlockM) +
           8 * 64;
  }
  static_assert(forward_scratch_estimate() <= scratch_budget<kGpu>(),
                "kfa: forward tiles exceed the scratch budget; shrink kBlockM/kBlockN");
  static_assert(backward_scratch_estimate() <= scratch_budget<kGpu>(),
                "kfa: backward tiles exceed the scratch budget; shrink kBlockM/kBlockN");
};

}  // namespace Impl
}  // namespace kfa

#endif
