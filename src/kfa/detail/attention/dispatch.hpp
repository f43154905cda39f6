#ifndef KFA_DETAIL_ATTENTION_DISPATCH_HPP
#define KFA_DETAIL_ATTENTION_DISPATCH_HPP

// Run-time choices become template arguments here, once:
//  - the head dimension selects a compiled tile shape (4 buckets);
//  - the variant: the default overloads compile two, the fast path
//    (PlainVariant) and one with softcap and dropout (Variant<true>), picked
//    by the options; the overloads that take a score modifier compile one,
//    Variant<true, ScoreMod>, so user functors never multiply the default
//    instantiations.
// Causal masking, windows, grouped-query heads and packed sequences stay
// run-time values: they decide which tiles run, whether a tile applies the
// element mask, and where a sequence's rows are.
//
// The kernels see every tensor as a [batch][rows][heads][head_dim] View of
// its value type (const for inputs) and lse as [batch][heads][rows]; packed
// variable-length tensors are [1][total][heads][head_dim]. Converting the
// caller's Views to these types first means Views that differ only in
// constness or memory traits share one set of kernels.

#include <kfa/options.hpp>

#include <kfa/detail/attention/backward_kernel.hpp>
#include <kfa/detail/attention/forward_kernel.hpp>
#include <kfa/detail/attention/sequences.hpp>
#include <kfa/detail/attention/variant.hpp>

#include <kfa/detail/backend/cuda/backward/mma_sync.hpp>
#include <kfa/detail/backend/cuda/backward/prep.hpp>
#include <kfa/detail/backend/cuda/backward/wgmma.hpp>
#include <kfa/detail/backend/cuda/backward/wgmma_product_split.hpp>
#include <kfa/detail/backend/cuda/forward/mma_sync.hpp>
#include <kfa/detail/backend/cuda/forward/wgmma.hpp>
#include <kfa/detail/backend/cuda/backward/fp32_fp64.hpp>
#include <kfa/detail/backend/cuda/backward/exact_fp32.hpp>
#include <kfa/detail/backend/cuda/forward/fp32_fp64.hpp>
#include <kfa/detail/backend/cuda/forward/exact_fp32.hpp>
#include <kfa/detail/common/workspace.hpp>

#include <cmath>

namespace kfa {
namespace Impl {

template <class Acc>
Acc softmax_scale(const AttentionOptions& options, int head_dim) {
  return options.softmax_scale != 0 ? static_cast<Acc>(options.softmax_scale)
                                    : static_cast<Acc>(1.0 / std::sqrt(double(head_dim)));
}

/// The kernels' View types for a caller's View type: inputs const, the
/// memory traits dropped.
template <class View>
using in4_t = Kokkos::View<const typename View::non_const_value_type****, Kokkos::LayoutRight,
                           typename View::memory_space>;
template <class View>
using out4_t = Kokkos::View<typename View::non_const_value_type****, Kokkos::LayoutRight,
                            typename View::memory_space>;
template <class View>
using in3_t = Kokkos::View<const typename View::non_const_value_type***, Kokkos::LayoutRight,
                           typename View::memory_space>;
template <class View>
using out3_t = Kokkos::View<typename View::non_const_value_type***, Kokkos::LayoutRight,
                            typename View::memory_space>;

/// A caller's tensor as the kernels see it: a fixed-length [batch][rows]
/// [heads][head_dim] View converted, a packed [total][heads][head_dim] one
/// reshaped to [1][total][heads][head_dim] (its contiguity is checked by the
/// entry points). lse: [batch][heads][rows], or packed [heads][total] as
/// [1][heads][total].
template <class Result, class View>
Result as_kernel_view(const View& view) {
  if constexpr (view_rank<View>() == view_rank<Result>()) {
    return Result(view);
  } else if constexpr (view_rank<View>() == 3) {
    return Result(view.data(), 1, view.extent(0), view.extent(1), view.extent(2));
  } else {
    return Result(view.data(), 1, view.extent(0), view.extent(1));
  }
}
template <class View>
in4_t<View> in4(const View& view) {
  return as_kernel_view<in4_t<View>>(view);
}
template <class View>
out4_t<View> out4(const View& view) {
  return as_kernel_view<out4_t<View>>(view);
}
template <class View>
in3_t<View> in3(const View& view) {
  return as_kernel_view<in3_t<View>>(view);
}
template <class View>
out3_t<View> out3(const View& view) {
  return as_kernel_view<out3_t<View>>(view);
}

/// Sequences of a fixed-length call: q [batch][seqlen_q].., k [batch][seqlen_k]..
template <class Q, class K>
Sequences<typename Q::memory_space> batch_sequences(const Q& q, const K& k) {
  return fixed_sequences<typename Q::memory_space>(
      static_cast<int>(q.extent(0)), static_cast<int>(q.extent(1)), static_cast<int>(k.extent(1)));
}

/// Sequences of a packed call (offsets already validated).
template <class Q, class CuQ, class CuK>
Sequences<typename Q::memory_space> varlen_sequences(const CuQ& cu_seqlens_q,
                                                     const CuK& cu_seqlens_k,
                                                     int max_seqlen_q, int max_seqlen_k) {
  using offsets_t = Kokkos::View<const int*, typename Q::memory_space>;
  return packed_sequences<typename Q::memory_space>(
      offsets_t(cu_seqlens_q.data(), cu_seqlens_q.extent(0)),
      offsets_t(cu_seqlens_k.data(), cu_seqlens_k.extent(0)), max_seqlen_q, max_seqlen_k);
}

template <class Acc, class MemorySpace>
KernelParams<Acc, MemorySpace> make_params(const AttentionOptions& options,
                                           const Sequences<MemorySpace>& seq, int heads,
                                           int heads_kv, int head_dim) {
  KernelParams<Acc, MemorySpace> p;
  p.seq = seq;
  p.heads = heads;
  p.heads_kv = heads_kv;
  p.head_dim = head_dim;
  p.window_left = options.window_left;
  p.window_right = options.causal ? 0 : options.window_right;
  p.scale = softmax_scale<Acc>(options, head_dim);
  p.softcap = static_cast<Acc>(options.softcap);
  p.dropout_p = options.dropout_p;
  p.dropout_seed = options.dropout_seed;
  return p;
}

/// True when the options need the softcap/dropout variant.
inline bool uses_modifiers(const AttentionOptions& options) {
  return options.softcap > 0 || options.dropout_p > 0;
}

/// Calls f(std::integral_constant<int, bucket>) for head_dim's bucket.
template <class F>
void dispatch_head_dim(int head_dim, F&& f) {
  switch (head_dim_bucket(head_dim)) {
    case 32: f(std::integral_constant<int, 32>{}); break;
    case 64: f(std::integral_constant<int, 64>{}); break;
    case 128: f(std::integral_constant<int, 128>{}); break;
    default: f(std::integral_constant<int, 256>{}); break;
  }
}

/// Calls f(variant) with the Variant type the options and the modifier need.
template <class ScoreMod, class F>
void dispatch_variant(const AttentionOptions& options, F&& f) {
  if constexpr (std::is_same<ScoreMod, NoScoreMod>::value) {
    if (uses_modifiers(options)) {
      f(Variant<true>{});
    } else {
      f(PlainVariant{});
    }
  } else {
    f(Variant<true, ScoreMod>{});
  }
}

/// dq = dq_acc, converted from the accumulator type (both LayoutRight, of
/// the same extents; dq_acc contiguous). A contiguous dq is converted as one
/// flat array, so that adjacent threads touch adjacent values; a strided one
/// with the last index fastest.
template <class ExecSpace, class AccView, class DQ>
void convert_dq(const ExecSpace& space, const AccView& dq_acc, const DQ& dq) {
  using value_type = typename DQ::non_const_value_type;
  if (dq.span_is_contiguous()) {
    value_type* const out = dq.data();
    const auto* const in = dq_acc.data();
    Kokkos::parallel_for(
        "kfa::bwd::convert_dq", Kokkos::RangePolicy<ExecSpace>(space, 0, dq.size()),
        KOKKOS_LAMBDA(const std::size_t i) { out[i] = from_acc<value_type>(in[i]); });
    return;
  }
  Kokkos::parallel_for(
      "kfa::bwd::convert_dq",
      Kokkos::MDRangePolicy<ExecSpace,
                            Kokkos::Rank<4, Kokkos::Iterate::Right, Kokkos::Iterate::Right>>(
          space, {0, 0, 0, 0}, {dq.extent(0), dq.extent(1), dq.extent(2), dq.extent(3)}),
      KOKKOS_LAMBDA(const int b, const int i, const int h, const int d) {
        dq(b, i, h, d) = from_acc<value_type>(dq_acc(b, i, h, d));
      });
}

/// Returns f(std::integral_constant<int, D>) for D = head_dim, one of the
/// head dims of the fused CUDA kernels (64, 128, and 256 where With256: the
/// 16-bit kernels; mma_shape_applies checked).
template <bool With256 = false, class F>
decltype(auto) with_fused_head_dim(int head_dim, F&& f) {
  if constexpr (With256) {
    if (head_dim == 256) return f(std::integral_constant<int, 256>());
  }
  return head_dim == 64 ? f(std::integral_constant<int, 64>())
                        : f(std::integral_constant<int, 128>());
}

/// dk and dv [batch][seqlen_k][heads_kv][head_dim] from fp32 dK and dV per
/// query head ([batch][seqlen_k][heads][head_dim], dV `half` floats after
/// dK): each k/v head's the sum over its group of query heads, rounded once.
/// One thread per output element, consecutive threads along head_dim.
template <class ExecSpace, class DK, class DV>
void sum_grouped_dk_dv(const ExecSpace& space, const float* dkv, long half, int heads,
                       const DK& dk, const DV& dv) {
  using value_type = typename DK::non_const_value_type;
  const int seqlen_k = static_cast<int>(dk.extent(1)), heads_kv = static_cast<int>(dk.extent(2)),
            head_dim = static_cast<int>(dk.extent(3));
  const int group = heads / heads_kv;
  Kokkos::parallel_for(
      "kfa::bwd::sum_grouped_dk_dv",
      Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<long>>(space, 0, long(dk.size())),
      KOKKOS_LAMBDA(const long i) {
        const int d = static_cast<int>(i % head_dim);
        const long r = i / head_dim;
        const int hk = static_cast<int>(r % heads_kv);
        const long row = r / heads_kv;  // b * seqlen_k + key
        const long from = (row * heads + long(hk) * group) * head_dim + d;
        float sum_k = 0, sum_v = 0;
        for (int g = 0; g < group; ++g) {
          sum_k += dkv[from + long(g) * head_dim];
          sum_v += dkv[half + from + long(g) * head_dim];
        }
        const int b = static_cast<int>(row / seqlen_k), key = static_cast<int>(row % seqlen_k);
        dk(b, key, hk, d) = from_acc<value_type>(sum_k);
        dv(b, key, hk, d) = from_acc<value_type>(sum_v);
      });
}

/// The dq accumulator of a backward call, in the call's workspace (`bytes`
/// keeps it alive); contents undefined.
template <class Acc, class ExecSpace, class DQ>
Kokkos::View<Acc****, Kokkos::LayoutRight, typename ExecSpace::memory_space,
             Kokkos::MemoryTraits<Kokkos::Unmanaged>>
dq_accumulator(const ExecSpace& space, const DQ& dq,
               Kokkos::View<unsigned char*, typename ExecSpace::memory_space>& bytes) {
  using view_t = Kokkos::View<Acc****, Kokkos::LayoutRight, typename ExecSpace::memory_space,
                              Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  bytes = workspace(space, WorkspaceSlot::dq_accum, workspace_bytes<Acc>(dq.size()),
                    "kfa::bwd::dq_accum");
  return workspace_view<view_t>(bytes, dq.extent(0), dq.extent(1), dq.extent(2), dq.extent(3));
}

/// dq_accumulator, zeroed on `space`.
template <class Acc, class ExecSpace, class DQ>
Kokkos::View<Acc****, Kokkos::LayoutRight, typename ExecSpace::memory_space,
             Kokkos::MemoryTraits<Kokkos::Unmanaged>>
zeroed_dq_accumulator(const ExecSpace& space, const DQ& dq,
                      Kokkos::View<unsigned char*, typename ExecSpace::memory_space>& bytes) {
  const auto acc = dq_accumulator<Acc>(space, dq, bytes);
  Kokkos::deep_copy(space, acc, Acc(0));
  return acc;
}

/// What a family of fused kernels takes beyond head_dim 64 and 128 with as
/// many k/v heads as q heads: head_dim 256, fewer k/v heads (grouped-query
/// attention); both only the 16-bit kernels, forward and backward.
struct FusedReach {
  bool head_dim_256 = false;
  bool grouped_heads = false;
};

/// True when a call's shape and options allow the tensor-core kernels: head_dim
/// 64 or 128 (or 256 where `reach` says), fixed-length batches, as many k/v
/// heads as q heads (or fewer where `reach` says), no score modifier,
/// softcap or dropout, no window other than causal, no explicit team size
/// (their teams are 4 or 8 warps by design), and 16-byte aligned rows.
template <class ScoreMod, class MemorySpace>
bool mma_shape_applies(const Sequences<MemorySpace>& seq, int heads_q, int heads_kv,
                       int head_dim, const AttentionOptions& options,
                       std::initializer_list<const void*> pointers, FusedReach reach = {}) {
  if constexpr (!std::is_same<ScoreMod, NoScoreMod>::value) {
    return false;
  } else {
    bool aligned = true;
    for (const void* p : pointers) aligned = aligned && reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
    return aligned &&
           (head_dim == 64 || head_dim == 128 || (reach.head_dim_256 && head_dim == 256)) &&
           !seq.packed && (heads_q == heads_kv || reach.grouped_heads) &&
           !uses_modifiers(options) && options.team_size == 0 &&
           options.window_left < 0 && (options.causal || options.window_right < 0);
  }
}

/// True when the 16-bit tensor-core path of the CUDA backend applies.
template <class ExecSpace, class ValueType, class ScoreMod, class MemorySpace>
bool mma_path_applies(const Sequences<MemorySpace>& seq, int heads_q, int heads_kv,
                      int head_dim, const AttentionOptions& options,
                      std::initializer_list<const void*> pointers, FusedReach reach = {}) {
  using Format = typename MmaFormat<ExecSpace, ValueType>::type;
  return !std::is_void<Format>::value &&
         mma_shape_applies<ScoreMod>(seq, heads_q, heads_kv, head_dim, options, pointers, reach);
}

/// Calls f(atom) with the tensor-core atom of the fp32/fp64 kernels for
/// (ExecSpace, ValueType, options) and returns true, or returns false where
/// those kernels do not run (host backends, 16-bit types, Fp32Matmul::ieee).
template <class ExecSpace, class ValueType, class F>
bool dispatch_fp32_fp64_atom(const AttentionOptions& options, F&& f) {
#ifdef KOKKOS_ENABLE_CUDA
  if constexpr (std::is_same<ExecSpace, Kokkos::Cuda>::value) {
    if constexpr (std::is_same<ValueType, double>::value) {
      f(cuda_mma::Fp64Atom{});
      return true;
    } else if constexpr (std::is_same<ValueType, float>::value) {
      switch (options.fp32_matmul) {
        case Fp32Matmul::split_tf32: f(cuda_mma::Tf32x3Atom{}); return true;
        case Fp32Matmul::tf32: f(cuda_mma::Tf32Atom<1>{}); return true;
        case Fp32Matmul::ieee: return false;
      }
    }
  }
#endif
  (void)options;
  (void)f;
  return false;
}

/// Whether the tensor-core kernels may use their opt-in shared-memory shapes
/// (launched by the backend layer) where the GPU grants them; false keeps
/// every kernel inside Kokkos' TeamPolicy scratch. A switch for tests and
/// for comparisons, process-wide, not thread-safe against running calls.
inline bool& use_opt_in_shared_memory() {
  static bool enabled = true;
  return enabled;
}

/// Whether the 16-bit kernels may take the Hopper (wgmma) path where the GPU
/// and the device code have it; false runs the mma.sync kernels there too.
/// Like use_opt_in_shared_memory: for tests and comparisons, process-wide.
inline bool& use_wgmma_kernels() {
  static bool enabled = true;
  return enabled;
}

/// launch_forward_mma for Grouped (k and v with fewer heads than q) or not.
template <class ExecSpace, int HeadDim, class Format, bool Grouped, class Q, class K, class V,
          class O, class Lse>
void launch_forward_mma_heads(const ExecSpace& space, const Q& q, const K& k, const V& v,
                              const O& o, const Lse& lse, float scale, bool causal) {
  using large_t = FlashForwardMmaKernel<ExecSpace, HeadDim, Format, Q, K, V, O, Lse,
                                        FwdMmaLargeShape<HeadDim>, Grouped>;
  using policy_t = FlashForwardMmaKernel<ExecSpace, HeadDim, Format, Q, K, V, O, Lse,
                                         FwdMmaPolicyShape<HeadDim>, Grouped>;
#if defined(KOKKOS_ENABLE_CUDA) && defined(__CUDACC__)
  if constexpr (std::is_same<ExecSpace, Kokkos::Cuda>::value) {
    using wgmma_t = FlashForwardWgmmaKernel<ExecSpace, HeadDim, Format, Q, K, V, O, Lse>;
    if (use_opt_in_shared_memory() && use_wgmma_kernels() && wgmma_available(space)) {
      if constexpr (HeadDim == 64) {
        using short_t = FlashForwardWgmmaKernelIn<WgmmaFwdShortCausalShape<HeadDim>, ExecSpace,
                                                  HeadDim, Format, Q, K, V, O, Lse>;
        if (wgmma_fwd_short_causal<HeadDim>(causal, long(k.extent(1))) && short_t::fits(space)) {
          short_t(q, k, v, o, lse, scale, causal).launch(space);
          return;
        }
      }
      if (wgmma_t::fits(space)) {
        wgmma_t(q, k, v, o, lse, scale, causal).launch(space);
        return;
      }
    }
  }
#endif
  if (use_opt_in_shared_memory() && large_t::fits(space))
    large_t(q, k, v, o, lse, scale, causal).launch(space);
  else
    policy_t(q, k, v, o, lse, scale, causal).launch(space);
}

/// The tensor-core forward: on Hopper with sm_90a device code the wgmma
/// kernel (in WgmmaFwdShortCausalShape for short causal sequences at
/// head_dim 64, else in WgmmaFwdShape), else mma.sync in its large shape
/// (opt-in shared memory) where the GPU grants it, else in the shape that
/// fits Kokkos' TeamPolicy (its Grouped instantiation where k and v have
/// fewer heads than q).
template <class ExecSpace, int HeadDim, class Format, class Q, class K, class V, class O,
          class Lse>
void launch_forward_mma(const ExecSpace& space, const Q& q, const K& k, const V& v, const O& o,
                        const Lse& lse, float scale, bool causal) {
  if (q.extent(2) != k.extent(2)) {
    launch_forward_mma_heads<ExecSpace, HeadDim, Format, true>(space, q, k, v, o, lse, scale,
                                                            causal);
  } else {
    launch_forward_mma_heads<ExecSpace, HeadDim, Format, false>(space, q, k, v, o, lse, scale,
                                                             causal);
  }
}

template <class ScoreMod, class ExecSpace, class Q, class K, class V, class O, class Lse>
bool try_forward_mma(const ExecSpace& space, const Q& q, const K& k, const V& v, const O& o,
                     const Lse& lse, const Sequences<typename Q::memory_space>& seq,
                     const AttentionOptions& options) {
  using value_type = typename Q::non_const_value_type;
  using Format = typename MmaFormat<ExecSpace, value_type>::type;
  const int head_dim = static_cast<int>(q.extent(3));
  if (!mma_path_applies<ExecSpace, value_type, ScoreMod>(
          seq, static_cast<int>(q.extent(2)), static_cast<int>(k.extent(2)), head_dim, options,
          {q.data(), k.data(), v.data(), o.data()}, FusedReach{true, true}))
    return false;
  if constexpr (!std::is_void<Format>::value) {
    const float scale = softmax_scale<float>(options, head_dim);
    with_fused_head_dim<true>(head_dim, [&](auto head_dim_tag) {
      launch_forward_mma<ExecSpace, decltype(head_dim_tag)::value, Format>(
          space, q, k, v, o, lse, scale, options.causal);
    });
  }
  return true;
}

/// The tensor-core backward (dQ added to an fp32 accumulator by atomics or
/// bulk reductions, in no fixed order, so not in deterministic mode): on
/// Hopper with sm_90a device code the wgmma kernels (head_dim 64, 128, and
/// 256: kfa/detail/backend/cuda/backward/wgmma_product_split.hpp, 218 KB of scratch), else mma.sync. Head
/// dim 256 needs opt-in shared memory (the staged mma.sync shape's
/// head-dim split takes 225 KB), else the portable kernels. Grouped-query
/// heads: each team reads its query head's k/v head and writes fp32 dK, dV
/// for its query head, summed per k/v head after.
template <class ScoreMod, class ExecSpace, class Q, class K, class V, class Lse, class DO,
          class DQ, class DK, class DV, class Delta, class O, class Preprocess>
bool try_backward_mma(const ExecSpace& space, const Q& q, const K& k, const V& v,
                      const Lse& lse, const DO& d_o, const DQ& dq, const DK& dk, const DV& dv,
                      const Delta& delta, const Sequences<typename Q::memory_space>& seq,
                      const AttentionOptions& options, const O& o,
                      const Preprocess& preprocess) {
  using value_type = typename Q::non_const_value_type;
  using Format = typename MmaFormat<ExecSpace, value_type>::type;
  const int head_dim = static_cast<int>(q.extent(3));
  if (options.deterministic ||
      !mma_path_applies<ExecSpace, value_type, ScoreMod>(
          seq, static_cast<int>(q.extent(2)), static_cast<int>(k.extent(2)), head_dim, options,
          {q.data(), k.data(), v.data(), d_o.data(), dk.data(), dv.data()},
          FusedReach{true, true}))
    return false;
  if constexpr (!std::is_void<Format>::value) {
    using AccView = Kokkos::View<float****, Kokkos::LayoutRight, typename ExecSpace::memory_space,
                                 Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
    using staged_256_t = FlashBackwardMmaKernel<ExecSpace, 256, Format, Q, K, V, DO, Lse, Delta,
                                                AccView, DK, DV, 3>;
    if (head_dim == 256 && !(use_opt_in_shared_memory() && staged_256_t::fits(space)))
      return false;
    const float scale = softmax_scale<float>(options, head_dim);
    Kokkos::View<unsigned char*, typename ExecSpace::memory_space> dq_bytes;
    AccView dq_acc;
    // D and a zeroed accumulator: on CUDA in one pass with 16-byte accesses
    // (kfa/detail/backend/cuda/backward/prep.hpp), elsewhere by the portable kernels.
    bool prepared = false;
#if defined(KOKKOS_ENABLE_CUDA) && defined(__CUDACC__)
    if constexpr (std::is_same<ExecSpace, Kokkos::Cuda>::value) {
      if (reinterpret_cast<std::uintptr_t>(o.data()) % 16 == 0) {
        dq_acc = dq_accumulator<float>(space, dq, dq_bytes);
        with_fused_head_dim<true>(head_dim, [&](auto head_dim_tag) {
          BackwardPrep16Kernel<Format, decltype(head_dim_tag)::value>(
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
    const int heads = static_cast<int>(q.extent(2));
    const bool grouped = heads != static_cast<int>(k.extent(2));
    const long dkv_half = grouped ? long(q.extent(0)) * long(k.extent(1)) * heads * head_dim : 0;
    Kokkos::View<unsigned char*, typename ExecSpace::memory_space> dkv_bytes;
    if (grouped)
      dkv_bytes = workspace(space, WorkspaceSlot::dkv_grouped,
                            workspace_bytes<float>(2 * std::size_t(dkv_half)),
                            "kfa::bwd::dkv_grouped");
    float* const dkv_grouped = grouped ? reinterpret_cast<float*>(dkv_bytes.data()) : nullptr;
    auto launch = [&](auto kernel) {
      if (grouped) kernel.write_grouped(dkv_grouped, dkv_grouped + dkv_half);
      kernel.launch(space);
    };
    auto run = [&](auto head_dim_tag) {
      constexpr int D = decltype(head_dim_tag)::value;
      using staged_t = FlashBackwardMmaKernel<ExecSpace, D, Format, Q, K, V, DO, Lse, Delta,
                                              AccView, DK, DV, 3>;
      if constexpr (D == 256) {
#if defined(KOKKOS_ENABLE_CUDA) && defined(__CUDACC__)
        if constexpr (std::is_same<ExecSpace, Kokkos::Cuda>::value) {
          using wgmma_t = FlashBackwardWgmmaProductSplitKernel<ExecSpace, Format, Q, K, V, DO, Lse, Delta,
                                                      AccView, DK, DV>;
          if (use_wgmma_kernels() && wgmma_available(space) && wgmma_t::fits(space)) {
            launch(wgmma_t(q, k, v, d_o, lse, delta, dq_acc, dk, dv, scale, options.causal));
            return;
          }
        }
#endif
        // Checked above: the staged shape fits.
        launch(staged_t(q, k, v, d_o, lse, delta, dq_acc, dk, dv, scale, options.causal));
      } else {
        using policy_t = FlashBackwardMmaKernel<ExecSpace, D, Format, Q, K, V, DO, Lse, Delta,
                                                AccView, DK, DV, 1>;
#if defined(KOKKOS_ENABLE_CUDA) && defined(__CUDACC__)
        if constexpr (std::is_same<ExecSpace, Kokkos::Cuda>::value) {
          // At head_dim 128 one team barrier a block (Pipelined, RESULTS
          // v47) and dQ's tensor reductions in boxes of 32 fp32 a row
          // (DqWide, v49; at 64 they lost 4-7%, and the boxes of 8 stay).
          using wgmma_t = FlashBackwardWgmmaKernel<ExecSpace, D, Format, Q, K, V, DO, Lse, Delta,
                                                   AccView, DK, DV>;
          if (use_opt_in_shared_memory() && use_wgmma_kernels() && wgmma_available(space) &&
              wgmma_t::fits(space)) {
            launch(wgmma_t(q, k, v, d_o, lse, delta, dq_acc, dk, dv, scale, options.causal));
            return;
          }
        }
#endif
        if (use_opt_in_shared_memory() && staged_t::fits(space))
          launch(staged_t(q, k, v, d_o, lse, delta, dq_acc, dk, dv, scale, options.causal));
        else
          launch(policy_t(q, k, v, d_o, lse, delta, dq_acc, dk, dv, scale, options.causal));
      }
    };
    with_fused_head_dim<true>(head_dim, run);
    if (grouped) sum_grouped_dk_dv(space, dkv_grouped, dkv_half, heads, dk, dv);
#if defined(KOKKOS_ENABLE_CUDA) && defined(__CUDACC__)
    if constexpr (std::is_same<ExecSpace, Kokkos::Cuda>::value) {
      if (dq.span_is_contiguous() && reinterpret_cast<std::uintptr_t>(dq.data()) % 16 == 0) {
        ConvertDq16Kernel<Format>(dq_acc.data(), reinterpret_cast<std::uint16_t*>(dq.data()),
                                  static_cast<long>(dq.size()))
            .launch(space);
        return true;
      }
    }
#endif
    convert_dq(space, dq_acc, dq);
  }
  return true;
}

/// The fp32/fp64 tensor-core forward, where the shape, the options and the
/// GPU's opt-in shared memory allow it.
template <class ScoreMod, class ExecSpace, class Q, class K, class V, class O, class Lse>
bool try_forward_fp32_fp64(const ExecSpace& space, const Q& q, const K& k, const V& v,
                          const O& o, const Lse& lse,
                          const Sequences<typename Q::memory_space>& seq,
                          const AttentionOptions& options) {
  using value_type = typename Q::non_const_value_type;
  const int head_dim = static_cast<int>(q.extent(3));
  if (!use_opt_in_shared_memory() ||
      !mma_shape_applies<ScoreMod>(seq, static_cast<int>(q.extent(2)),
                                   static_cast<int>(k.extent(2)), head_dim, options,
                                   {q.data(), k.data(), v.data(), o.data()}))
    return false;
  bool launched = false;
  dispatch_fp32_fp64_atom<ExecSpace, value_type>(options, [&](auto atom) {
    using Atom = decltype(atom);
    const auto scale = softmax_scale<value_type>(options, head_dim);
    launched = with_fused_head_dim(head_dim, [&](auto head_dim_tag) {
      using kernel_t =
          FlashForwardFp32Fp64Kernel<ExecSpace, decltype(head_dim_tag)::value,
                                    typename Fp32Fp64FwdAtom<Atom>::type, Q, K, V, O, Lse>;
      if (!kernel_t::fits(space)) return false;
      kernel_t(q, k, v, o, lse, scale, options.causal).launch(space);
      return true;
    });
  });
  return launched;
}

/// The fp32/fp64 tensor-core backward (dQ by atomics into dq, so not in
/// deterministic mode), where the shape, the options and the GPU's opt-in
/// shared memory allow it.
template <class ScoreMod, class ExecSpace, class Q, class K, class V, class Lse, class DO,
          class DQ, class DK, class DV, class Delta>
bool try_backward_fp32_fp64(const ExecSpace& space, const Q& q, const K& k, const V& v,
                           const Lse& lse, const DO& d_o, const DQ& dq, const DK& dk,
                           const DV& dv, const Delta& delta,
                           const Sequences<typename Q::memory_space>& seq,
                           const AttentionOptions& options) {
  using value_type = typename Q::non_const_value_type;
  const int head_dim = static_cast<int>(q.extent(3));
  if (options.deterministic || !use_opt_in_shared_memory() ||
      !mma_shape_applies<ScoreMod>(seq, static_cast<int>(q.extent(2)),
                                   static_cast<int>(k.extent(2)), head_dim, options,
                                   {q.data(), k.data(), v.data(), d_o.data(), dq.data(),
                                    dk.data(), dv.data()}))
    return false;
  bool launched = false;
  dispatch_fp32_fp64_atom<ExecSpace, value_type>(options, [&](auto atom) {
    using Atom = decltype(atom);
    const auto scale = softmax_scale<value_type>(options, head_dim);
    launched = with_fused_head_dim(head_dim, [&](auto head_dim_tag) {
      constexpr int D = decltype(head_dim_tag)::value;
      using kernel_t = FlashBackwardFp32Fp64Kernel<ExecSpace, D, typename Fp32Fp64BwdAtom<Atom, D>::type,
                                                  Q, K, V, DO, Lse, Delta, DQ, DK, DV>;
      if (!kernel_t::fits(space)) return false;
      Kokkos::deep_copy(space, dq, value_type(0));
      kernel_t(q, k, v, d_o, lse, delta, dq, dk, dv, scale, options.causal).launch(space);
      return true;
    });
  });
  return launched;
}

/// The exact fp32 forward of the CUDA backend (fp32 FMAs tiled in
/// registers), for Fp32Matmul::ieee, where the shape and the GPU's opt-in
/// shared memory allow it.
template <class ScoreMod, class ExecSpace, class Q, class K, class V, class O, class Lse>
bool try_forward_exact_fp32(const ExecSpace& space, const Q& q, const K& k, const V& v, const O& o,
                      const Lse& lse, const Sequences<typename Q::memory_space>& seq,
                      const AttentionOptions& options) {
#ifdef KOKKOS_ENABLE_CUDA
  using value_type = typename Q::non_const_value_type;
  if constexpr (std::is_same<ExecSpace, Kokkos::Cuda>::value &&
                std::is_same<value_type, float>::value) {
    const int head_dim = static_cast<int>(q.extent(3));
    if (options.fp32_matmul != Fp32Matmul::ieee || !use_opt_in_shared_memory() ||
        !mma_shape_applies<ScoreMod>(seq, static_cast<int>(q.extent(2)),
                                     static_cast<int>(k.extent(2)), head_dim, options,
                                     {q.data(), k.data(), v.data(), o.data()}))
      return false;
    const float scale = softmax_scale<float>(options, head_dim);
    return with_fused_head_dim(head_dim, [&](auto head_dim_tag) {
      using kernel_t =
          FlashForwardExactFp32Kernel<ExecSpace, decltype(head_dim_tag)::value, Q, K, V, O, Lse>;
      if (!kernel_t::fits(space)) return false;
      kernel_t(q, k, v, o, lse, scale, options.causal).launch(space);
      return true;
    });
  }
#endif
  (void)space, (void)q, (void)k, (void)v, (void)o, (void)lse, (void)seq, (void)options;
  return false;
}

/// The exact fp32 backward of the CUDA backend (Fp32Matmul::ieee; dQ by
/// atomics into dq, so not in deterministic mode).
template <class ScoreMod, class ExecSpace, class Q, class K, class V, class Lse, class DO,
          class DQ, class DK, class DV, class Delta>
bool try_backward_exact_fp32(const ExecSpace& space, const Q& q, const K& k, const V& v,
                       const Lse& lse, const DO& d_o, const DQ& dq, const DK& dk, const DV& dv,
                       const Delta& delta, const Sequences<typename Q::memory_space>& seq,
                       const AttentionOptions& options) {
#ifdef KOKKOS_ENABLE_CUDA
  using value_type = typename Q::non_const_value_type;
  if constexpr (std::is_same<ExecSpace, Kokkos::Cuda>::value &&
                std::is_same<value_type, float>::value) {
    const int head_dim = static_cast<int>(q.extent(3));
    if (options.fp32_matmul != Fp32Matmul::ieee || options.deterministic ||
        !use_opt_in_shared_memory() ||
        !mma_shape_applies<ScoreMod>(seq, static_cast<int>(q.extent(2)),
                                     static_cast<int>(k.extent(2)), head_dim, options,
                                     {q.data(), k.data(), v.data(), d_o.data(), dq.data(),
                                      dk.data(), dv.data()}))
      return false;
    const float scale = softmax_scale<float>(options, head_dim);
    return with_fused_head_dim(head_dim, [&](auto head_dim_tag) {
      using kernel_t = FlashBackwardExactFp32Kernel<ExecSpace, decltype(head_dim_tag)::value, Q, K, V,
                                               DO, Lse, Delta, DQ, DK, DV>;
      if (!kernel_t::fits(space)) return false;
      Kokkos::deep_copy(space, dq, 0.0f);
      kernel_t(q, k, v, d_o, lse, delta, dq, dk, dv, scale, options.causal).launch(space);
      return true;
    });
  }
#endif
  (void)space, (void)q, (void)k, (void)v, (void)lse, (void)d_o, (void)dq, (void)dk, (void)dv;
  (void)delta, (void)seq, (void)options;
  return false;
}

template <class ExecSpace, class Q, class K, class V, class O, class Lse, class ScoreMod>
void dispatch_forward(const ExecSpace& space, const Q& q, const K& k, const V& v, const O& o,
                      const Lse& lse, const Sequences<typename Q::memory_space>& seq,
                      const AttentionOptions& options, const ScoreMod& score_mod) {
  using acc_t = typename Lse::non_const_value_type;
  const int head_dim = static_cast<int>(q.extent(3));
  if (try_forward_mma<ScoreMod>(space, q, k, v, o, lse, seq, options)) return;
  if (try_forward_fp32_fp64<ScoreMod>(space, q, k, v, o, lse, seq, options)) return;
  if (try_forward_exact_fp32<ScoreMod>(space, q, k, v, o, lse, seq, options)) return;
  const auto params = make_params<acc_t>(options, seq, static_cast<int>(q.extent(2)),
                                         static_cast<int>(k.extent(2)), head_dim);
  dispatch_variant<ScoreMod>(options, [&](auto variant) {
    using VariantT = decltype(variant);
    dispatch_head_dim(head_dim, [&](auto bucket) {
      FlashForwardKernel<ExecSpace, decltype(bucket)::value, VariantT, Q, K, V, O, Lse> kernel(
          q, k, v, o, lse, params, score_mod);
      kernel.launch(space, options.team_size);
    });
  });
}

template <class ExecSpace, class Q, class K, class V, class O, class Lse, class DO, class DQ,
          class DK, class DV, class ScoreMod>
void dispatch_backward(const ExecSpace& space, const Q& q, const K& k, const V& v,
                       const O& o, const Lse& lse, const DO& d_o, const DQ& dq, const DK& dk,
                       const DV& dv, const Sequences<typename Q::memory_space>& seq,
                       const AttentionOptions& options, const ScoreMod& score_mod) {
  using value_type = typename Q::non_const_value_type;
  using acc_t = typename Lse::non_const_value_type;
  using memory_space = typename ExecSpace::memory_space;
  const int view_batch = static_cast<int>(q.extent(0)), rows = static_cast<int>(q.extent(1)),
            heads = static_cast<int>(q.extent(2)), head_dim = static_cast<int>(q.extent(3));
  const auto params =
      make_params<acc_t>(options, seq, heads, static_cast<int>(k.extent(2)), head_dim);

  // D has lse's layout: [batch][heads][seqlen_q], or [1][heads][total_q].
  const auto delta_bytes =
      workspace(space, WorkspaceSlot::delta,
                workspace_bytes<acc_t>(std::size_t(view_batch) * heads * rows), "kfa::bwd::delta");
  auto delta = workspace_view<Kokkos::View<acc_t***, Kokkos::LayoutRight, memory_space,
                                           Kokkos::MemoryTraits<Kokkos::Unmanaged>>>(
      delta_bytes, view_batch, heads, rows);
  auto preprocess = [&] {
    BackwardPreprocess<ExecSpace, O, DO, decltype(delta)>{o, d_o, delta, rows, heads, head_dim}
        .launch(space);
  };
  if (try_backward_mma<ScoreMod>(space, q, k, v, lse, d_o, dq, dk, dv, delta, seq, options, o,
                                 preprocess)) {
    return;
  }
  preprocess();
  if (try_backward_fp32_fp64<ScoreMod>(space, q, k, v, lse, d_o, dq, dk, dv, delta, seq,
                                      options) ||
      try_backward_exact_fp32<ScoreMod>(space, q, k, v, lse, d_o, dq, dk, dv, delta, seq, options)) {
    return;
  }
  // dQ accumulates with atomics in the accumulator type: in dq itself when
  // it has that type, otherwise in a temporary converted at the end.
  using AccView = Kokkos::View<acc_t****, Kokkos::LayoutRight, memory_space,
                               Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  using DQAcc = std::conditional_t<std::is_same<value_type, acc_t>::value, DQ, AccView>;
  DQAcc dq_acc;
  Kokkos::View<unsigned char*, memory_space> dq_bytes;
  if (!options.deterministic) {
    if constexpr (std::is_same<value_type, acc_t>::value) {
      Kokkos::deep_copy(space, dq, value_type(0));
      dq_acc = dq;
    } else {
      dq_acc = zeroed_dq_accumulator<acc_t>(space, dq, dq_bytes);
    }
  }
  dispatch_variant<ScoreMod>(options, [&](auto variant) {
    using VariantT = decltype(variant);
    dispatch_head_dim(head_dim, [&](auto bucket) {
      constexpr int kHeadDim = decltype(bucket)::value;
      FlashBackwardKVKernel<ExecSpace, kHeadDim, VariantT, Q, K, V, DO, Lse, decltype(delta),
                            DQAcc, DK, DV>(q, k, v, d_o, lse, delta, dq_acc, dk, dv, params,
                                           score_mod, !options.deterministic)
          .launch(space, options.team_size);
      if (options.deterministic) {
        FlashBackwardQKernel<ExecSpace, kHeadDim, VariantT, Q, K, V, DO, Lse, decltype(delta),
                             DQ>(q, k, v, d_o, lse, delta, dq, params, score_mod)
            .launch(space, options.team_size);
      }
    });
  });
  if constexpr (!std::is_same<value_type, acc_t>::value) {
    if (!options.deterministic) convert_dq(space, dq_acc, dq);
  }
}

}  // namespace Impl
}  // namespace kfa

#endif
