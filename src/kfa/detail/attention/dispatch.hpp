#ifndef KFA_DETAIL_ATTENTION_DISPATCH_HPP
#define KFA_DETAIL_ATTENTION_DISPATCH_HPP

// The one place where a call becomes kernels: the kernel-choice table
// (kernel_choice.hpp) picks a family, then the fused family launches
// (backend/cuda/fused_*.hpp), the host kernels run (backend/host/) or the
// portable kernels run. For the host and portable kernels the run-time
// choices become template arguments here, once (the host kernels take the
// head dimension at run time, so only the variant):
//  - the head dimension selects a compiled tile shape (4 buckets);
//  - the variant: the default overloads compile two, the fast path
//    (PlainVariant) and one with softcap and dropout (Variant<true>), picked
//    by the options; the overloads that take a score modifier compile one,
//    Variant<true, ScoreMod>, so user functors never multiply the default
//    instantiations.
// Causal masking, windows, grouped-query heads and packed sequences stay
// run-time values: they decide which tiles run, whether a tile applies the
// element mask, and where a sequence's rows are.

#include <kfa/options.hpp>

#include <kfa/detail/attention/backward_buffers.hpp>
#include <kfa/detail/attention/backward_kernel.hpp>
#include <kfa/detail/attention/forward_kernel.hpp>
#include <kfa/detail/attention/kernel_choice.hpp>
#include <kfa/detail/attention/kernel_views.hpp>
#include <kfa/detail/attention/sequences.hpp>
#include <kfa/detail/attention/variant.hpp>
#include <kfa/detail/backend/host/backward.hpp>
#include <kfa/detail/backend/host/forward.hpp>
#include <kfa/detail/backend/host/isa_check.hpp>
#include <kfa/detail/common/workspace.hpp>

namespace kfa {
namespace Impl {

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

/// Calls f(variant) with the FusedVariantParams of the call's variant for a
/// fused family: the 16-bit families take every variant, the others only the
/// plain one (the choice table gives them no other).
template <bool Is16Bit, class ScoreMod, class Params, class F>
void dispatch_fused_variant(const AttentionOptions& options, const Params& params,
                            const ScoreMod& score_mod, F&& f) {
  if constexpr (Is16Bit) {
    dispatch_variant<ScoreMod>(options, [&](auto variant) {
      using variant_params = FusedVariantParams<decltype(variant)>;
      if constexpr (variant_params::kVariant)
        f(variant_params(params, score_mod));
      else
        f(variant_params());
    });
  } else {
    (void)options, (void)params, (void)score_mod;
    f(FusedVariantParams<PlainVariant>());
  }
}

template <class ExecSpace, class Q, class K, class V, class O, class Lse, class ScoreMod>
void dispatch_forward(const ExecSpace& space, const Q& q, const K& k, const V& v, const O& o,
                      const Lse& lse, const Sequences<typename Q::memory_space>& seq,
                      const AttentionOptions& options, const ScoreMod& score_mod) {
  using acc_t = typename Lse::non_const_value_type;
  if constexpr (is_host_tiled_space<ExecSpace>()) Host::check_host_isa();
  const int head_dim = static_cast<int>(q.extent(3)), heads = static_cast<int>(q.extent(2)),
            heads_kv = static_cast<int>(k.extent(2));
  const KernelFamily family =
      choose_forward_kernel<ScoreMod, ExecSpace, Q, K, V, O, Lse>(space, q, k, v, o, seq, options);
  const auto params = make_params<acc_t>(options, seq, heads, heads_kv, head_dim);
  if constexpr (is_host_tiled_space<ExecSpace>()) {
    if (family == KernelFamily::host_tiled) {
      dispatch_variant<ScoreMod>(options, [&](auto variant) {
        Host::ForwardKernel<ExecSpace, decltype(variant), Q, K, V, O, Lse>(q, k, v, o, lse,
                                                                            params, score_mod)
            .launch(space);
      });
      return;
    }
  }
  if (family != KernelFamily::portable) {
    using fused_t = FusedForward<ExecSpace, Q, K, V, O, Lse>;
    dispatch_fused_variant<fused_t::k16Bit>(options, params, score_mod, [&](const auto& variant) {
      fused_t::launch(family, space, q, k, v, o, lse, softmax_scale<double>(options, head_dim),
                      fused_call<ScoreMod>(options, head_dim, heads, heads_kv), variant);
    });
    return;
  }
  dispatch_variant<ScoreMod>(options, [&](auto variant) {
    dispatch_head_dim(head_dim, [&](auto bucket) {
      FlashForwardKernel<ExecSpace, decltype(bucket)::value, decltype(variant), Q, K, V, O, Lse>(
          q, k, v, o, lse, params, score_mod)
          .launch(space, options.team_size);
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
  if constexpr (is_host_tiled_space<ExecSpace>()) Host::check_host_isa();
  const int view_batch = static_cast<int>(q.extent(0)), rows = static_cast<int>(q.extent(1)),
            heads = static_cast<int>(q.extent(2)), head_dim = static_cast<int>(q.extent(3)),
            heads_kv = static_cast<int>(k.extent(2));

  // D has lse's layout: [batch][heads][seqlen_q], or [1][heads][total_q].
  const auto delta_bytes =
      workspace(space, WorkspaceSlot::delta,
                workspace_bytes<acc_t>(std::size_t(view_batch) * heads * rows), "kfa::bwd::delta");
  using Delta = Kokkos::View<acc_t***, Kokkos::LayoutRight, memory_space,
                             Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  const auto delta = workspace_view<Delta>(delta_bytes, view_batch, heads, rows);
  auto preprocess = [&] {
    BackwardPreprocess<ExecSpace, O, DO, Delta>{o, d_o, delta, rows, heads, head_dim}.launch(
        space);
  };
  using fused_t = FusedBackward<ExecSpace, Q, K, V, O, Lse, DO, DQ, DK, DV, Delta>;
  const KernelFamily family =
      choose_backward_kernel<ScoreMod, ExecSpace, Q, K, V, O, Lse, DO, DQ, DK, DV, Delta>(
          space, q, k, v, d_o, dq, dk, dv, seq, options);
  const auto params = make_params<acc_t>(options, seq, heads, heads_kv, head_dim);
  if constexpr (is_host_tiled_space<ExecSpace>()) {
    if (family == KernelFamily::host_tiled) {
      preprocess();
      dispatch_variant<ScoreMod>(options, [&](auto variant) {
        Host::backward<ExecSpace, decltype(variant)>(space, q, k, v, d_o, lse, delta, dq, dk, dv,
                                                     params, score_mod);
      });
      return;
    }
  }
  if (family != KernelFamily::portable) {
    dispatch_fused_variant<fused_t::k16Bit>(options, params, score_mod, [&](const auto& variant) {
      fused_t::launch(family, space, q, k, v, o, lse, d_o, dq, dk, dv, delta,
                      softmax_scale<double>(options, head_dim),
                      fused_call<ScoreMod>(options, head_dim, heads, heads_kv), preprocess,
                      variant);
    });
    return;
  }
  preprocess();
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
      FlashBackwardKVKernel<ExecSpace, kHeadDim, VariantT, Q, K, V, DO, Lse, Delta, DQAcc, DK,
                            DV>(q, k, v, d_o, lse, delta, dq_acc, dk, dv, params, score_mod,
                                !options.deterministic)
          .launch(space, options.team_size);
      if (options.deterministic) {
        FlashBackwardQKernel<ExecSpace, kHeadDim, VariantT, Q, K, V, DO, Lse, Delta, DQ>(
            q, k, v, d_o, lse, delta, dq, params, score_mod)
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
