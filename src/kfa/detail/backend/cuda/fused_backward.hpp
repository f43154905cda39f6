#ifndef KFA_DETAIL_BACKEND_CUDA_FUSED_BACKWARD_HPP
#define KFA_DETAIL_BACKEND_CUDA_FUSED_BACKWARD_HPP

// The fused CUDA backwards of one call's View types, by kernel family (the
// backward of fused_forward.hpp): each family's kernel type per head dim,
// whether it fits the GPU, and its launch with the passes around it. Every
// fused backward adds dQ in no fixed order (atomics or bulk reductions), so
// deterministic calls never get here.

#include <kfa/detail/attention/backward_buffers.hpp>
#include <kfa/detail/attention/kernel_family.hpp>

#include <kfa/detail/backend/cuda/fused_forward.hpp>
#include <kfa/detail/backend/cuda/backward/exact_fp32.hpp>
#include <kfa/detail/backend/cuda/backward/fp32_fp64.hpp>
#include <kfa/detail/backend/cuda/backward/mma_sync.hpp>
#include <kfa/detail/backend/cuda/backward/prep.hpp>
#include <kfa/detail/backend/cuda/backward/wgmma.hpp>
#include <kfa/detail/backend/cuda/backward/wgmma_product_split.hpp>

#include <cstdint>
#include <type_traits>
#include <utility>

namespace kfa {
namespace Impl {

/// The per-query-head dK and dV buffers of a grouped-query backward (in the
/// call's workspace), [batch][seqlen_k][heads][head_dim] each in `Acc` (fp32
/// for the 16-bit kernels, the value type for fp32/fp64); none without
/// grouped heads.
template <class ExecSpace, class Acc>
struct GroupedDkDv {
  decltype(workspace(std::declval<const ExecSpace&>(), WorkspaceSlot::dkv_grouped, 0,
                     "")) bytes;
  Acc* data = nullptr;
  long half = 0;
  int heads = 0;

  template <class Q, class K>
  GroupedDkDv(const ExecSpace& space, const FusedCall& call, const Q& q, const K& k)
      : heads(static_cast<int>(q.extent(2))) {
    if (!call.grouped) return;
    half = long(q.extent(0)) * long(k.extent(1)) * heads * call.head_dim;
    bytes = workspace(space, WorkspaceSlot::dkv_grouped,
                      workspace_bytes<Acc>(2 * std::size_t(half)), "kfa::bwd::dkv_grouped");
    data = reinterpret_cast<Acc*>(bytes.data());
  }
  Acc* dk() const { return data; }
  Acc* dv() const { return data + half; }
  template <class DK, class DV>
  void sum(const ExecSpace& space, const DK& dk, const DV& dv) const {
    sum_grouped_dk_dv(space, data, half, heads, dk, dv);
  }
};

template <class ExecSpace, class Q, class K, class V, class O, class Lse, class DO, class DQ,
          class DK, class DV, class Delta>
struct FusedBackward {
  using value_type = typename Q::non_const_value_type;
  using Format = typename MmaFormat<ExecSpace, value_type>::type;
  static constexpr bool k16Bit = !std::is_void<Format>::value;
  /// The fp32 dQ accumulator of the 16-bit kernels.
  using AccView = Kokkos::View<float****, Kokkos::LayoutRight, typename ExecSpace::memory_space,
                               Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

  /// mma.sync with Stages 3 (opt-in shared memory; at head_dim 256 the
  /// head-dim split over warp pairs) or 1 (TeamPolicy scratch).
  template <int D, int Stages, class VariantT = PlainVariant>
  using mma_sync_t = FlashBackwardMmaKernel<ExecSpace, D, Format, Q, K, V, DO, Lse, Delta, AccView,
                                            DK, DV, Stages, VariantT>;
  template <int D, class VariantT = PlainVariant>
  using exact_fp32_t = FlashBackwardExactFp32Kernel<ExecSpace, D, Q, K, V, DO, Lse, Delta, DQ, DK,
                                                    DV, exact_fp32_dmma_scores(), VariantT>;
  template <class Atom, int D, class VariantT = PlainVariant>
  using fp32_fp64_t = FlashBackwardFp32Fp64Kernel<
      ExecSpace, D, cuda_mma::fp32_fp64_atom_t<Atom>, Q, K, V, DO, Lse, Delta, DQ, DK, DV,
      typename Fp32Fp64BwdDefaultShape<cuda_mma::fp32_fp64_atom_t<Atom>, D>::type, VariantT>;
#if defined(KOKKOS_ENABLE_CUDA) && defined(__CUDACC__)
  /// head_dim 64 and 128: keys split over the two warpgroups; 256: the
  /// products split over them (one warpgroup's dK and dV would not fit its
  /// registers). A variant's: the same kernels with its pipeline.
  template <int D, class VariantT = PlainVariant>
  using wgmma_t = std::conditional_t<
      D == 256,
      FlashBackwardWgmmaProductSplitKernel<ExecSpace, Format, Q, K, V, DO, Lse, Delta, AccView,
                                           DK, DV, false, true, VariantT>,
      FlashBackwardWgmmaKernel<ExecSpace, D, Format, Q, K, V, DO, Lse, Delta, AccView, DK, DV,
                               WgmmaBwdShape<D>, NoProbe, VariantT>>;
#endif

  /// Whether `family`'s kernel for the call fits `space`'s GPU (see
  /// FusedForward::fits).
  static bool fits(KernelFamily family, const ExecSpace& space, const FusedCall& call) {
    (void)space;
    switch (family) {
      case KernelFamily::wgmma:
#if defined(KOKKOS_ENABLE_CUDA) && defined(__CUDACC__)
        if constexpr (k16Bit)
          return wgmma_family_fits(space, call, [&](auto d) {
            constexpr int D = decltype(d)::value;
            return call.variant ? wgmma_t<D, Variant<true>>::fits(space)
                                : wgmma_t<D>::fits(space);
          });
#endif
        return false;
      case KernelFamily::mma_sync:
        if constexpr (k16Bit) {
          return with_fused_head_dim<true>(call.head_dim, [&](auto d) {
            constexpr int D = decltype(d)::value;
            return call.variant ? mma_sync_t<D, 3, Variant<true>>::fits(space)
                                : mma_sync_t<D, 3>::fits(space);
          });
        }
        return false;
      case KernelFamily::mma_sync_team_policy:
        return k16Bit && call.head_dim != 256;
      case KernelFamily::fp32_fp64:
      case KernelFamily::exact_fp32: return fp32_fp64_family_fits<FusedBackward>(family, space, call);
      case KernelFamily::portable: return false;
    }
    return false;
  }

  /// Launches `family`'s backward (one that fits) with the passes around
  /// it. `preprocess` computes D = rowsum(dO ∘ O) into `delta` with the
  /// portable kernel; the 16-bit families do it in their own pass where O is
  /// 16-byte aligned.
  template <class VariantT, class Acc, class Preprocess>
  static void launch(KernelFamily family, const ExecSpace& space, const Q& q, const K& k,
                     const V& v, const O& o, const Lse& lse, const DO& d_o, const DQ& dq,
                     const DK& dk, const DV& dv, const Delta& delta, double scale,
                     const FusedCall& call, const Preprocess& preprocess,
                     const FusedVariantParams<VariantT, Acc>& variant) {
    auto run = [&](auto kernel) {
      kernel.set_league_group_teams(call.league_group_teams);
      kernel.launch(space);
    };
    switch (family) {
      case KernelFamily::wgmma:
      case KernelFamily::mma_sync:
      case KernelFamily::mma_sync_team_policy:
        if constexpr (k16Bit) launch_16bit(family, space, q, k, v, o, lse, d_o, dq, dk, dv, delta,
                                           static_cast<float>(scale), call, preprocess, variant);
        return;
      case KernelFamily::fp32_fp64:
      case KernelFamily::exact_fp32: {
        if constexpr (std::is_same<value_type, float>::value ||
                      std::is_same<value_type, double>::value) {
          // Grouped-query heads: dK and dV per query head in the value type,
          // summed per k/v head after the kernel.
          GroupedDkDv<ExecSpace, value_type> grouped(space, call, q, k);
          auto run_grouped = [&](auto kernel) {
            if (call.grouped) kernel.write_grouped(grouped.dk(), grouped.dv());
            run(kernel);
          };
          preprocess();
          Kokkos::deep_copy(space, dq, value_type(0));
          // (The plain variant's params are empty: the kernel of
          // PlainVariant takes them like any other.)
          if (family == KernelFamily::fp32_fp64) {
            with_fp32_fp64_atom<ExecSpace, value_type>(call.fp32_matmul, [&](auto atom) {
              with_fused_head_dim(call.head_dim, [&](auto d) {
                run_grouped(fp32_fp64_t<decltype(atom), decltype(d)::value, VariantT>(
                    q, k, v, d_o, lse, delta, dq, dk, dv, static_cast<value_type>(scale),
                    call.window, variant));
              });
            });
          } else if constexpr (has_exact_fp32_kernels<ExecSpace, value_type>()) {
            with_fused_head_dim(call.head_dim, [&](auto d) {
              run_grouped(exact_fp32_t<decltype(d)::value, VariantT>(
                  q, k, v, d_o, lse, delta, dq, dk, dv, static_cast<float>(scale), call.window,
                  variant));
            });
          }
          if (call.grouped) grouped.sum(space, dk, dv);
        }
        return;
      }
      case KernelFamily::portable: return;
    }
  }

  /// The 16-bit backward: D and the zeroed fp32 dQ accumulator, the kernel,
  /// the grouped-query sum of dK and dV, dq rounded from the accumulator.
  template <class VariantT, class Preprocess>
  static void launch_16bit(KernelFamily family, const ExecSpace& space, const Q& q, const K& k,
                           const V& v, const O& o, const Lse& lse, const DO& d_o, const DQ& dq,
                           const DK& dk, const DV& dv, const Delta& delta, float scale,
                           const FusedCall& call, const Preprocess& preprocess,
                           const FusedVariantParams<VariantT>& variant) {
    Kokkos::View<unsigned char*, typename ExecSpace::memory_space> dq_bytes;
    AccView dq_acc;
    // D and a zeroed accumulator: on CUDA in one pass with 16-byte accesses
    // (prep.hpp), elsewhere by the portable kernels.
    bool prepared = false;
#if defined(KOKKOS_ENABLE_CUDA) && defined(__CUDACC__)
    if constexpr (std::is_same<ExecSpace, Kokkos::Cuda>::value) {
      if (reinterpret_cast<std::uintptr_t>(o.data()) % 16 == 0) {
        dq_acc = dq_accumulator<float>(space, dq, dq_bytes);
        with_fused_head_dim<true>(call.head_dim, [&](auto d) {
          BackwardPrep16Kernel<Format, decltype(d)::value>(
              reinterpret_cast<const std::uint16_t*>(o.data()),
              reinterpret_cast<const std::uint16_t*>(d_o.data()), delta.data(), dq_acc.data(),
              static_cast<int>(q.extent(0)), static_cast<int>(q.extent(1)),
              static_cast<int>(q.extent(2)))
              .launch(space);
        });
        prepared = true;
      }
    }
#endif
    if (!prepared) {
      preprocess();
      dq_acc = zeroed_dq_accumulator<float>(space, dq, dq_bytes);
    }
    // Grouped-query heads: the kernels write fp32 dK and dV per query head,
    // summed per k/v head below (as FlashAttention-2 sums its expanded dK,
    // dV; here in fp32, so rounded once).
    const GroupedDkDv<ExecSpace, float> grouped(space, call, q, k);
    auto run = [&](auto kernel) {
      if (call.grouped) kernel.write_grouped(grouped.dk(), grouped.dv());
      kernel.set_league_group_teams(call.league_group_teams);
      kernel.launch(space);
    };
    with_fused_head_dim<true>(call.head_dim, [&](auto d) {
      constexpr int D = decltype(d)::value;
#if defined(KOKKOS_ENABLE_CUDA) && defined(__CUDACC__)
      if constexpr (std::is_same<ExecSpace, Kokkos::Cuda>::value) {
        if (family == KernelFamily::wgmma) {
          run(wgmma_t<D, VariantT>(q, k, v, d_o, lse, delta, dq_acc, dk, dv, scale, call.window,
                                   variant));
          return;
        }
      }
#endif
      if constexpr (D != 256) {
        if (family == KernelFamily::mma_sync_team_policy) {
          run(mma_sync_t<D, 1, VariantT>(q, k, v, d_o, lse, delta, dq_acc, dk, dv, scale,
                                         call.window, variant));
          return;
        }
      }
      run(mma_sync_t<D, 3, VariantT>(q, k, v, d_o, lse, delta, dq_acc, dk, dv, scale, call.window,
                                     variant));
    });
    if (call.grouped) grouped.sum(space, dk, dv);
#if defined(KOKKOS_ENABLE_CUDA) && defined(__CUDACC__)
    if constexpr (std::is_same<ExecSpace, Kokkos::Cuda>::value) {
      if (dq.span_is_contiguous() && reinterpret_cast<std::uintptr_t>(dq.data()) % 16 == 0) {
        ConvertDq16Kernel<Format>(dq_acc.data(), reinterpret_cast<std::uint16_t*>(dq.data()),
                                  static_cast<long>(dq.size()))
            .launch(space);
        return;
      }
    }
#endif
    convert_dq(space, dq_acc, dq);
  }
};

}  // namespace Impl
}  // namespace kfa

#endif
