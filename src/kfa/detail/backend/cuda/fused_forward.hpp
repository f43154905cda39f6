#ifndef KFA_DETAIL_BACKEND_CUDA_FUSED_FORWARD_HPP
#define KFA_DETAIL_BACKEND_CUDA_FUSED_FORWARD_HPP

// The fused CUDA forwards of one call's View types, by kernel family: each
// family's kernel type per head dim and tile shape, whether its tiles fit the
// GPU of an execution space, and its launch. kernel_choice.hpp decides which
// family runs; this file only knows how each one is built. On host backends
// (and in host-compiled translation units) no family applies.

#include <kfa/options.hpp>

#include <kfa/detail/attention/kernel_family.hpp>

#include <kfa/detail/backend/cuda/forward/exact_fp32.hpp>
#include <kfa/detail/backend/cuda/forward/fp32_fp64.hpp>
#include <kfa/detail/backend/cuda/forward/mma_sync.hpp>
#include <kfa/detail/backend/cuda/forward/wgmma.hpp>

#include <type_traits>

namespace kfa {
namespace Impl {

/// What the fused kernels need of a call beyond its Views.
struct FusedCall {
  int head_dim;
  FusedWindow window;
  bool grouped;  // k and v with fewer heads than q
  Fp32Matmul fp32_matmul;
  int league_group_teams;
  /// Softcap, dropout or a score modifier (a kernel with FusedVariantParams).
  bool variant;
};

/// Returns f(std::integral_constant<int, D>) for D = head_dim, one of the
/// head dims of the fused CUDA kernels: 64, 128, and 256 where With256 (the
/// 16-bit kernels). The caller has checked head_dim.
template <bool With256 = false, class F>
decltype(auto) with_fused_head_dim(int head_dim, F&& f) {
  if constexpr (With256) {
    if (head_dim == 256) return f(std::integral_constant<int, 256>());
  }
  return head_dim == 64 ? f(std::integral_constant<int, 64>())
                        : f(std::integral_constant<int, 128>());
}

/// Calls f(atom) with the tensor-core atom of the fp32/fp64 kernels for
/// (ExecSpace, ValueType, fp32_matmul) and returns true, or returns false
/// where that family does not run (host backends, 16-bit types,
/// Fp32Matmul::ieee).
template <class ExecSpace, class ValueType, class F>
bool with_fp32_fp64_atom(Fp32Matmul fp32_matmul, F&& f) {
#ifdef KOKKOS_ENABLE_CUDA
  if constexpr (std::is_same<ExecSpace, Kokkos::Cuda>::value) {
    if constexpr (std::is_same<ValueType, double>::value) {
      f(cuda_mma::Fp64Atom{});
      return true;
    } else if constexpr (std::is_same<ValueType, float>::value) {
      switch (fp32_matmul) {
        case Fp32Matmul::split_tf32: f(cuda_mma::Tf32x3Atom{}); return true;
        case Fp32Matmul::tf32: f(cuda_mma::Tf32Atom<1>{}); return true;
        case Fp32Matmul::ieee: return false;
      }
    }
  }
#endif
  (void)fp32_matmul;
  (void)f;
  return false;
}

/// True where the exact fp32 kernels exist: fp32 on the CUDA backend.
template <class ExecSpace, class ValueType>
constexpr bool has_exact_fp32_kernels() {
#ifdef KOKKOS_ENABLE_CUDA
  return std::is_same<ExecSpace, Kokkos::Cuda>::value && std::is_same<ValueType, float>::value;
#else
  return false;
#endif
}

/// The wgmma row's fits(): the GPU of `space` runs this translation unit's
/// sm_90a device code, and `tile_fits(head_dim_tag)` holds at the call's
/// head dim.
template <class ExecSpace, class TileFits>
bool wgmma_family_fits(const ExecSpace& space, const FusedCall& call, TileFits&& tile_fits) {
#if defined(KOKKOS_ENABLE_CUDA) && defined(__CUDACC__)
  if constexpr (std::is_same<ExecSpace, Kokkos::Cuda>::value)
    return wgmma_available(space) && with_fused_head_dim<true>(call.head_dim, tile_fits);
#endif
  (void)space, (void)call, (void)tile_fits;
  return false;
}

/// fits() of the fp32_fp64 and exact_fp32 families, shared by the forward
/// and the backward: Kernels names their kernel types (fp32_fp64_t<Atom, D>,
/// exact_fp32_t<D>) and value_type.
template <class Kernels, class ExecSpace>
bool fp32_fp64_family_fits(KernelFamily family, const ExecSpace& space, const FusedCall& call) {
  using value_type = typename Kernels::value_type;
  bool fits = false;
  if (family == KernelFamily::fp32_fp64) {
    with_fp32_fp64_atom<ExecSpace, value_type>(call.fp32_matmul, [&](auto atom) {
      fits = with_fused_head_dim(call.head_dim, [&](auto d) {
        return Kernels::template fp32_fp64_t<decltype(atom), decltype(d)::value>::fits(space);
      });
    });
  }
  if constexpr (has_exact_fp32_kernels<ExecSpace, value_type>()) {
    if (family == KernelFamily::exact_fp32 && call.fp32_matmul == Fp32Matmul::ieee)
      fits = with_fused_head_dim(call.head_dim, [&](auto d) {
        return Kernels::template exact_fp32_t<decltype(d)::value>::fits(space);
      });
  }
  return fits;
}

template <class ExecSpace, class Q, class K, class V, class O, class Lse>
struct FusedForward {
  using value_type = typename Q::non_const_value_type;
  using Format = typename MmaFormat<ExecSpace, value_type>::type;
  /// fp16/bf16 on CUDA: the wgmma and mma.sync families.
  static constexpr bool k16Bit = !std::is_void<Format>::value;

  template <int D, bool Grouped, class VariantT = PlainVariant>
  using mma_sync_t = FlashForwardMmaKernel<ExecSpace, D, Format, Q, K, V, O, Lse,
                                           FwdMmaLargeShape<D>, Grouped, VariantT>;
  template <int D, bool Grouped>
  using mma_sync_team_policy_t = FlashForwardMmaKernel<ExecSpace, D, Format, Q, K, V, O, Lse,
                                                       FwdMmaPolicyShape<D>, Grouped>;
  template <int D, class VariantT = PlainVariant>
  using exact_fp32_t =
      FlashForwardExactFp32Kernel<ExecSpace, D, Q, K, V, O, Lse, exact_fp32_block_n<D>(),
                                  exact_fp32_teams_per_sm(), true, exact_fp32_dmma_scores(),
                                  VariantT>;
  template <class Atom, int D, class VariantT = PlainVariant>
  using fp32_fp64_t = FlashForwardFp32Fp64Kernel<
      ExecSpace, D, cuda_mma::fp32_fp64_atom_t<Atom>, Q, K, V, O, Lse,
      typename Fp32Fp64FwdDefaultShape<cuda_mma::fp32_fp64_atom_t<Atom>, D>::type, VariantT>;
#if defined(KOKKOS_ENABLE_CUDA) && defined(__CUDACC__)
  template <int D, class VariantT = PlainVariant>
  using wgmma_t = FlashForwardWgmmaKernelIn<WgmmaFwdShape<D>, ExecSpace, D, Format, Q, K, V, O,
                                            Lse, true, VariantT>;
  /// Short causal sequences at head_dim 64: teams of one warpgroup, so that
  /// the few query blocks still fill the GPU.
  template <int D>
  using wgmma_short_causal_t = FlashForwardWgmmaKernelIn<WgmmaFwdShortCausalShape<D>, ExecSpace, D,
                                                         Format, Q, K, V, O, Lse>;

  /// The wgmma tile shape for the call: 1 short causal, 0 the default, -1
  /// none fits.
  template <int D>
  static int wgmma_shape(const ExecSpace& space, const FusedCall& call, long seqlen_k) {
    if constexpr (D == 64) {
      if (!call.variant &&
          wgmma_fwd_short_causal<D>(call.window.causal(), seqlen_k,
                                    call.window.packed() ? call.window.max_seqlen_q : 0) &&
          wgmma_short_causal_t<D>::fits(space))
        return 1;
    }
    return wgmma_t<D>::fits(space) ? 0 : -1;
  }
#endif

  /// Whether `family`'s kernel for the call has its tiles (and, for wgmma,
  /// its device code) on `space`'s GPU. The call's shape and options are
  /// checked by the choice table, not here.
  static bool fits(KernelFamily family, const ExecSpace& space, const FusedCall& call,
                   long seqlen_k) {
    (void)space, (void)seqlen_k;
    switch (family) {
      case KernelFamily::wgmma:
#if defined(KOKKOS_ENABLE_CUDA) && defined(__CUDACC__)
        if constexpr (k16Bit)
          return wgmma_family_fits(space, call, [&](auto d) {
            return wgmma_shape<decltype(d)::value>(space, call, seqlen_k) >= 0;
          });
#endif
        return false;
      case KernelFamily::mma_sync:
        // Variants: with as many k/v heads as query heads.
        if constexpr (k16Bit) {
          return with_fused_head_dim<true>(call.head_dim, [&](auto d) {
            constexpr int D = decltype(d)::value;
            return call.grouped ? !call.variant && mma_sync_t<D, true>::fits(space)
                                : mma_sync_t<D, false>::fits(space);
          });
        }
        return false;
      case KernelFamily::mma_sync_team_policy: return k16Bit && !call.variant;
      case KernelFamily::fp32_fp64:
      case KernelFamily::exact_fp32: return fp32_fp64_family_fits<FusedForward>(family, space, call);
      case KernelFamily::portable: return false;
    }
    return false;
  }

  /// Launches `family`'s kernel (one that fits) on the call. 16-bit
  /// kernels take the scale as float, the fp32/fp64 ones in their type;
  /// `variant` is the call's, in the accumulator type.
  template <class VariantT, class Acc>
  static void launch(KernelFamily family, const ExecSpace& space, const Q& q, const K& k,
                     const V& v, const O& o, const Lse& lse, double scale,
                     const FusedCall& call, const FusedVariantParams<VariantT, Acc>& variant) {
    constexpr bool kVariant = FusedVariantParams<VariantT, Acc>::kVariant;
    (void)variant;
    auto run = [&](auto kernel) {
      kernel.set_league_group_teams(call.league_group_teams);
      kernel.launch(space);
    };
    const float scale16 = static_cast<float>(scale);
    switch (family) {
      case KernelFamily::wgmma:
#if defined(KOKKOS_ENABLE_CUDA) && defined(__CUDACC__)
        if constexpr (k16Bit && std::is_same<ExecSpace, Kokkos::Cuda>::value) {
          with_fused_head_dim<true>(call.head_dim, [&](auto d) {
            constexpr int D = decltype(d)::value;
            if constexpr (kVariant) {
              run(wgmma_t<D, VariantT>(q, k, v, o, lse, scale16, call.window, variant));
            } else {
              if constexpr (D == 64) {
                const long seqlen_k =
                    call.window.packed() ? call.window.max_seqlen_k : long(k.extent(1));
                if (wgmma_shape<D>(space, call, seqlen_k) == 1) {
                  run(wgmma_short_causal_t<D>(q, k, v, o, lse, scale16, call.window));
                  return;
                }
              }
              run(wgmma_t<D>(q, k, v, o, lse, scale16, call.window));
            }
          });
        }
#endif
        return;
      case KernelFamily::mma_sync:
      case KernelFamily::mma_sync_team_policy:
        if constexpr (k16Bit) {
          const bool large = family == KernelFamily::mma_sync;
          with_fused_head_dim<true>(call.head_dim, [&](auto d) {
            constexpr int D = decltype(d)::value;
            if constexpr (kVariant)
              run(mma_sync_t<D, false, VariantT>(q, k, v, o, lse, scale16, call.window, variant));
            else if (large && call.grouped)
              run(mma_sync_t<D, true>(q, k, v, o, lse, scale16, call.window));
            else if (large)
              run(mma_sync_t<D, false>(q, k, v, o, lse, scale16, call.window));
            else if (call.grouped)
              run(mma_sync_team_policy_t<D, true>(q, k, v, o, lse, scale16, call.window));
            else
              run(mma_sync_team_policy_t<D, false>(q, k, v, o, lse, scale16, call.window));
          });
        }
        return;
      case KernelFamily::fp32_fp64:
        with_fp32_fp64_atom<ExecSpace, value_type>(call.fp32_matmul, [&](auto atom) {
          with_fused_head_dim(call.head_dim, [&](auto d) {
            run(fp32_fp64_t<decltype(atom), decltype(d)::value, VariantT>(
                q, k, v, o, lse, static_cast<value_type>(scale), call.window, variant));
          });
        });
        return;
      case KernelFamily::exact_fp32:
        if constexpr (has_exact_fp32_kernels<ExecSpace, value_type>()) {
          with_fused_head_dim(call.head_dim, [&](auto d) {
            run(exact_fp32_t<decltype(d)::value, VariantT>(q, k, v, o, lse,
                                                           static_cast<float>(scale),
                                                           call.window, variant));
          });
        }
        return;
      case KernelFamily::portable: return;
    }
  }
};

}  // namespace Impl
}  // namespace kfa

#endif
