#ifndef KFA_DETAIL_ATTENTION_KERNEL_CHOICE_HPP
#define KFA_DETAIL_ATTENTION_KERNEL_CHOICE_HPP

// The kernel-choice table: which kernel family serves a call. The rows are
// tried in order and the first whose conditions hold wins:
//
//   family                value types       needs
//   wgmma                 fp16, bf16        sm_90a device code on an sm_90 GPU,
//                                           opt-in shared memory, policy.wgmma
//   mma_sync              fp16, bf16        opt-in shared memory
//   mma_sync_team_policy  fp16, bf16        head_dim 64 or 128 in the backward
//   fp32_fp64             fp64; fp32 with   opt-in shared memory
//                         split_tf32/tf32
//   exact_fp32            fp32 with ieee    opt-in shared memory
//   host_tiled            all               a host execution space, no
//                                           explicit team size, policy.host_tiled
//   portable              all               nothing: every backend, variant,
//                                           head dim and type
//
// Every fused row (all but portable) also needs a call the fused kernels
// take (fused_shape_applies): head_dim 64 or 128 (and 256 for the 16-bit
// families; other head dims up to these run on zero-padded copies,
// padded_head_dim.hpp), no explicit team size, 16-byte aligned tensors, and
// for the backward not deterministic mode; and its kernel's tiles must fit
// the GPU (FusedForward::fits / FusedBackward::fits in backend/cuda/).
// Causal masks, windows, grouped-query heads and packed variable-length
// batches run on every fused family. Variants (softcap, dropout,
// score modifiers) run on every fused family but the mma_sync forward with
// grouped-query heads, which leaves them to the portable kernel. "opt-in shared
// memory" is more team scratch than Kokkos' TeamPolicy grants, which the
// call's KernelPolicy can forbid. Host backends have no fused row; their
// host_tiled row takes every shape and variant.

#include <kfa/options.hpp>

#include <kfa/detail/attention/kernel_family.hpp>
#include <kfa/detail/attention/kernel_views.hpp>
#include <kfa/detail/attention/padded_head_dim.hpp>
#include <kfa/detail/attention/sequences.hpp>
#include <kfa/detail/attention/variant.hpp>

#include <kfa/detail/backend/tile_primitives.hpp>
#include <kfa/detail/backend/cuda/fused_backward.hpp>
#include <kfa/detail/backend/cuda/fused_forward.hpp>

#include <array>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

namespace kfa {
namespace Impl {

/// True when the call has a variant the fused kernels apply in registers:
/// softcap, dropout or a score modifier.
template <class ScoreMod>
bool is_variant_call(const AttentionOptions& options) {
  return !std::is_same<ScoreMod, NoScoreMod>::value || uses_modifiers(options);
}

/// True when the fused kernels take the call's shape and options (the
/// conditions above); `with_256`: head_dim 256 too (the 16-bit kernels).
inline bool fused_shape_applies(int head_dim, const AttentionOptions& options,
                                std::initializer_list<const void*> pointers, bool with_256) {
  bool aligned = true;
  for (const void* p : pointers)
    aligned = aligned && reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
  return aligned && fused_head_dim(head_dim, with_256) == head_dim && options.team_size == 0;
}

/// The mask of a fused call: the options' window, and a packed batch's
/// sequences.
template <class MemorySpace>
FusedWindow fused_window(const AttentionOptions& options, const Sequences<MemorySpace>& seq) {
  FusedWindow window(options.window_left, options.causal ? 0 : options.window_right);
  if (seq.packed) {
    window.cu_q = seq.cu_q.data();
    window.cu_k = seq.cu_k.data();
    window.sequences = seq.batch;
    window.max_seqlen_q = seq.max_seqlen_q;
    window.max_seqlen_k = seq.max_seqlen_k;
  }
  return window;
}

template <class ScoreMod, class MemorySpace>
FusedCall fused_call(const AttentionOptions& options, const Sequences<MemorySpace>& seq,
                     int head_dim, int heads_q, int heads_kv) {
  return {head_dim,
          fused_window(options, seq),
          heads_q != heads_kv,
          options.fp32_matmul,
          options.kernel_policy.league_group_teams,
          is_variant_call<ScoreMod>(options)};
}

/// The fused rows of the table that a value type can have, in order.
template <bool Is16Bit>
struct FusedRows {
  static constexpr std::array<KernelFamily, 2> rows = {KernelFamily::fp32_fp64,
                                                       KernelFamily::exact_fp32};
};
template <>
struct FusedRows<true> {
  static constexpr std::array<KernelFamily, 3> rows = {
      KernelFamily::wgmma, KernelFamily::mma_sync, KernelFamily::mma_sync_team_policy};
};

/// Whether the call's KernelPolicy lets `family` run.
inline bool policy_allows(KernelFamily family, const Experimental::KernelPolicy& policy) {
  switch (family) {
    case KernelFamily::wgmma: return policy.opt_in_shared_memory && policy.wgmma;
    case KernelFamily::mma_sync:
    case KernelFamily::fp32_fp64:
    case KernelFamily::exact_fp32: return policy.opt_in_shared_memory;
    case KernelFamily::host_tiled: return policy.host_tiled;
    case KernelFamily::mma_sync_team_policy:
    case KernelFamily::portable: return true;
  }
  return true;
}

/// The host row: every call on a host space, unless it asks for teams (an
/// explicit team size) or its policy forbids the family.
template <class ExecSpace>
constexpr bool is_host_tiled_space() {
  return !is_gpu_space<ExecSpace>::value;
}
inline KernelFamily host_kernel(const AttentionOptions& options) {
  return options.team_size == 0 && policy_allows(KernelFamily::host_tiled, options.kernel_policy)
             ? KernelFamily::host_tiled
             : KernelFamily::portable;
}

/// The family that runs a forward call on `space`.
template <class ScoreMod, class ExecSpace, class Q, class K, class V, class O, class Lse>
KernelFamily choose_forward_kernel(const ExecSpace& space, const Q& q, const K& k, const V& v,
                                   const O& o, const Sequences<typename Q::memory_space>& seq,
                                   const AttentionOptions& options) {
  if constexpr (is_host_tiled_space<ExecSpace>()) return host_kernel(options);
  using fused_t = FusedForward<ExecSpace, Q, K, V, O, Lse>;
  const int head_dim = static_cast<int>(q.extent(3)), heads = static_cast<int>(q.extent(2)),
            heads_kv = static_cast<int>(k.extent(2));
  if (!fused_shape_applies(head_dim, options, {q.data(), k.data(), v.data(), o.data()},
                           fused_t::k16Bit))
    return KernelFamily::portable;
  const FusedCall call = fused_call<ScoreMod>(options, seq, head_dim, heads, heads_kv);
  const long seqlen_k = seq.packed ? seq.max_seqlen_k : long(k.extent(1));
  for (const KernelFamily family : FusedRows<fused_t::k16Bit>::rows) {
    if (policy_allows(family, options.kernel_policy) &&
        fused_t::fits(family, space, call, seqlen_k))
      return family;
  }
  return KernelFamily::portable;
}

/// The family that runs a backward call on `space`.
template <class ScoreMod, class ExecSpace, class Q, class K, class V, class O, class Lse,
          class DO, class DQ, class DK, class DV, class Delta>
KernelFamily choose_backward_kernel(const ExecSpace& space, const Q& q, const K& k,
                                    const V& v, const DO& d_o, const DQ& dq, const DK& dk,
                                    const DV& dv, const Sequences<typename Q::memory_space>& seq,
                                    const AttentionOptions& options) {
  if constexpr (is_host_tiled_space<ExecSpace>()) return host_kernel(options);
  using fused_t = FusedBackward<ExecSpace, Q, K, V, O, Lse, DO, DQ, DK, DV, Delta>;
  const int head_dim = static_cast<int>(q.extent(3)), heads = static_cast<int>(q.extent(2)),
            heads_kv = static_cast<int>(k.extent(2));
  // The 16-bit kernels write dq from their own accumulator; the others add
  // into dq itself, so it must be aligned too.
  const void* dq_data = fused_t::k16Bit ? nullptr : dq.data();
  // A modifier that takes its gradient (add_grad) runs on the portable
  // kernels, which hand it each element once.
  if (options.deterministic || score_mod_takes_gradient<ScoreMod>() ||
      !fused_shape_applies(
          head_dim, options,
          {q.data(), k.data(), v.data(), d_o.data(), dq_data, dk.data(), dv.data()},
          fused_t::k16Bit))
    return KernelFamily::portable;
  const FusedCall call = fused_call<ScoreMod>(options, seq, head_dim, heads, heads_kv);
  for (const KernelFamily family : FusedRows<fused_t::k16Bit>::rows) {
    if (policy_allows(family, options.kernel_policy) && fused_t::fits(family, space, call))
      return family;
  }
  return KernelFamily::portable;
}

/// A family and the head dim its kernel computes the call at: the caller's,
/// or a padded one (padded_head_dim.hpp).
struct KernelChoice {
  KernelFamily family;
  int head_dim;
  bool padded() const { return family != KernelFamily::portable && head_dim > 0; }
};

/// The kernel a forward call runs: where the caller's head dim has no fused
/// kernel of its own, a GPU call with no explicit team size takes the fused
/// family that runs the zero-padded call, if any; else choose_forward_kernel.
/// (head_dim is 0 unless padded.)
template <class ScoreMod, class ExecSpace, class Q, class K, class V, class O, class Lse>
KernelChoice forward_kernel_choice(const ExecSpace& space, const Q& q, const K& k, const V& v,
                                   const O& o, const Sequences<typename Q::memory_space>& seq,
                                   const AttentionOptions& options) {
  if constexpr (!is_host_tiled_space<ExecSpace>()) {
    const int head_dim = static_cast<int>(q.extent(3));
    const int padded = fused_head_dim(head_dim, FusedForward<ExecSpace, Q, K, V, O, Lse>::k16Bit);
    if (padded != 0 && padded != head_dim && options.team_size == 0) {
      const KernelFamily family = choose_forward_kernel<ScoreMod, ExecSpace, Q, K, V, O, Lse>(
          space, padded_shape(q, padded), padded_shape(k, padded), padded_shape(v, padded),
          padded_shape(o, padded), seq, options);
      if (family != KernelFamily::portable) return {family, padded};
    }
  }
  return {choose_forward_kernel<ScoreMod, ExecSpace, Q, K, V, O, Lse>(space, q, k, v, o, seq,
                                                                      options),
          0};
}

/// The same for a backward call (deterministic calls are never padded:
/// no fused family takes them).
template <class ScoreMod, class ExecSpace, class Q, class K, class V, class O, class Lse,
          class DO, class DQ, class DK, class DV, class Delta>
KernelChoice backward_kernel_choice(const ExecSpace& space, const Q& q, const K& k, const V& v,
                                    const DO& d_o, const DQ& dq, const DK& dk, const DV& dv,
                                    const Sequences<typename Q::memory_space>& seq,
                                    const AttentionOptions& options) {
  auto choose = [&](const auto& q_, const auto& k_, const auto& v_, const auto& do_,
                    const auto& dq_, const auto& dk_, const auto& dv_) {
    return choose_backward_kernel<ScoreMod, ExecSpace, Q, K, V, O, Lse, DO, DQ, DK, DV, Delta>(
        space, q_, k_, v_, do_, dq_, dk_, dv_, seq, options);
  };
  if constexpr (!is_host_tiled_space<ExecSpace>()) {
    const int head_dim = static_cast<int>(q.extent(3));
    const int padded = fused_head_dim(
        head_dim, FusedBackward<ExecSpace, Q, K, V, O, Lse, DO, DQ, DK, DV, Delta>::k16Bit);
    if (padded != 0 && padded != head_dim && options.team_size == 0) {
      const KernelFamily family =
          choose(padded_shape(q, padded), padded_shape(k, padded), padded_shape(v, padded),
                 padded_shape(d_o, padded), padded_shape(dq, padded), padded_shape(dk, padded),
                 padded_shape(dv, padded));
      if (family != KernelFamily::portable) return {family, padded};
    }
  }
  return {choose(q, k, v, d_o, dq, dk, dv), 0};
}

}  // namespace Impl
}  // namespace kfa

#endif
