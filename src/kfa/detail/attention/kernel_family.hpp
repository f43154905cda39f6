#ifndef KFA_DETAIL_ATTENTION_KERNEL_FAMILY_HPP
#define KFA_DETAIL_ATTENTION_KERNEL_FAMILY_HPP

// The kernel families a call can run, named for what they compute with.
// choose_forward_kernel / choose_backward_kernel (kernel_choice.hpp) pick
// one per call; the families' labels are the prefixes of their Kokkos Tools
// kernel names.

namespace kfa {
namespace Impl {

enum class KernelFamily {
  /// 16-bit, Hopper warpgroup tensor cores (wgmma, TMA): sm_90a device code,
  /// opt-in shared memory.
  wgmma,
  /// 16-bit, mma.sync tensor cores in the opt-in shared-memory tile shape.
  mma_sync,
  /// 16-bit, mma.sync tensor cores inside Kokkos' TeamPolicy scratch.
  mma_sync_team_policy,
  /// fp64 on DMMA, fp32 on 3xTF32 or TF32 tensor cores (Fp32Matmul).
  fp32_fp64,
  /// fp32 with IEEE products: fp32 FMAs, score products on the fp64 tensor
  /// cores where the GPU has them.
  exact_fp32,
  /// Host backends: one thread per tile, register-blocked products the
  /// compiler vectorises; every variant, head dim and type.
  host_tiled,
  /// The TeamPolicy kernels of every backend: every variant, head dim and type.
  portable
};

inline const char* to_string(KernelFamily family) {
  switch (family) {
    case KernelFamily::wgmma: return "wgmma";
    case KernelFamily::mma_sync: return "mma_sync";
    case KernelFamily::mma_sync_team_policy: return "mma_sync_team_policy";
    case KernelFamily::fp32_fp64: return "fp32_fp64";
    case KernelFamily::exact_fp32: return "exact_fp32";
    case KernelFamily::host_tiled: return "host_tiled";
    case KernelFamily::portable: return "portable";
  }
  return "unknown";
}

}  // namespace Impl
}  // namespace kfa

#endif
