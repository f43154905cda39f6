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
#include <kfa/detail/attention/padded_head_dim.hpp>
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
/// fused family, in the accumulator type of `params`.
template <class ScoreMod, class Acc, class MemorySpace, class F>
void dispatch_fused_variant(const AttentionOptions& options,
                            const KernelParams<Acc, MemorySpace>& params,
                            const ScoreMod& score_mod, F&& f) {
  dispatch_variant<ScoreMod>(options, [&](auto variant) {
    using variant_params = FusedVariantParams<decltype(variant), Acc>;
    if constexpr (variant_params::kVariant)
      f(variant_params(params, score_mod));
    else
      f(variant_params());
  });
}

/// Launches fused `family` on q..lse, whose head dim may be a padded one:
/// the scale is that of the caller's `head_dim`.
template <class ExecSpace, class Q, class K, class V, class O, class Lse, class ScoreMod>
void launch_fused_forward(KernelFamily family, const ExecSpace& space, const Q& q, const K& k,
                          const V& v, const O& o, const Lse& lse,
                          const Sequences<typename Q::memory_space>& seq,
                          const AttentionOptions& options, const ScoreMod& score_mod,
                          int head_dim) {
  using acc_t = typename Lse::non_const_value_type;
  using fused_t = FusedForward<ExecSpace, Q, K, V, O, Lse>;
  const int heads = static_cast<int>(q.extent(2)), heads_kv = static_cast<int>(k.extent(2));
  const auto params = make_params<acc_t>(options, seq, heads, heads_kv, head_dim);
  dispatch_fused_variant(options, params, score_mod, [&](const auto& variant) {
    fused_t::launch(family, space, q, k, v, o, lse, softmax_scale<double>(options, head_dim),
                    fused_call<ScoreMod>(options, seq, static_cast<int>(q.extent(3)), heads, heads_kv),
                    variant);
  });
}

/// A forward on zero-padded copies (padded_head_dim.hpp) with fused
/// `family` at `padded` head dim.
template <class ExecSpace, class Q, class K, class V, class O, class Lse, class ScoreMod>
void forward_padded(KernelFamily family, int padded, const ExecSpace& space, const Q& q,
                    const K& k, const V& v, const O& o, const Lse& lse,
                    const Sequences<typename Q::memory_space>& seq,
                    const AttentionOptions& options, const ScoreMod& score_mod) {
  PaddedTensors<ExecSpace> tensors(padded);
  const std::size_t at_q = tensors.add(q), at_k = tensors.add(k), at_v = tensors.add(v),
                    at_o = tensors.add(o);
  tensors.allocate(space, "kfa::fwd::padded_head_dim");
  copy_head_dim(space, "kfa::fwd::pad_q", q, tensors.writable(q, at_q));
  copy_head_dim(space, "kfa::fwd::pad_k", k, tensors.writable(k, at_k));
  copy_head_dim(space, "kfa::fwd::pad_v", v, tensors.writable(v, at_v));
  const O po = tensors.view(o, at_o);
  launch_fused_forward(family, space, tensors.view(q, at_q), tensors.view(k, at_k),
                       tensors.view(v, at_v), po, lse, seq, options, score_mod,
                       static_cast<int>(q.extent(3)));
  copy_head_dim(space, "kfa::fwd::crop_o", po, o);
}

template <class ExecSpace, class Q, class K, class V, class O, class Lse, class ScoreMod>
void dispatch_forward(const ExecSpace& space, const Q& q, const K& k, const V& v, const O& o,
                      const Lse& lse, const Sequences<typename Q::memory_space>& seq,
                      const AttentionOptions& options, const ScoreMod& score_mod) {
  using acc_t = typename Lse::non_const_value_type;
  if constexpr (is_host_tiled_space<ExecSpace>()) Host::check_host_isa();
  const int head_dim = static_cast<int>(q.extent(3)), heads = static_cast<int>(q.extent(2)),
            heads_kv = static_cast<int>(k.extent(2));
  const KernelChoice choice =
      forward_kernel_choice<ScoreMod, ExecSpace, Q, K, V, O, Lse>(space, q, k, v, o, seq, options);
  if constexpr (!is_host_tiled_space<ExecSpace>()) {
    if (choice.padded()) {
      forward_padded(choice.family, choice.head_dim, space, q, k, v, o, lse, seq, options,
                     score_mod);
      return;
    }
  }
  const KernelFamily family = choice.family;
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
    launch_fused_forward(family, space, q, k, v, o, lse, seq, options, score_mod, head_dim);
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

/// Launches fused backward `family`, whose head dim may be a padded one
/// (see launch_fused_forward).
template <class ExecSpace, class Q, class K, class V, class O, class Lse, class DO, class DQ,
          class DK, class DV, class Delta, class Preprocess, class ScoreMod>
void launch_fused_backward(KernelFamily family, const ExecSpace& space, const Q& q, const K& k,
                           const V& v, const O& o, const Lse& lse, const DO& d_o, const DQ& dq,
                           const DK& dk, const DV& dv, const Delta& delta,
                           const Preprocess& preprocess,
                           const Sequences<typename Q::memory_space>& seq,
                           const AttentionOptions& options, const ScoreMod& score_mod,
                           int head_dim) {
  using acc_t = typename Lse::non_const_value_type;
  using fused_t = FusedBackward<ExecSpace, Q, K, V, O, Lse, DO, DQ, DK, DV, Delta>;
  const int heads = static_cast<int>(q.extent(2)), heads_kv = static_cast<int>(k.extent(2));
  const auto params = make_params<acc_t>(options, seq, heads, heads_kv, head_dim);
  dispatch_fused_variant(options, params, score_mod, [&](const auto& variant) {
    fused_t::launch(family, space, q, k, v, o, lse, d_o, dq, dk, dv, delta,
                    softmax_scale<double>(options, head_dim),
                    fused_call<ScoreMod>(options, seq, static_cast<int>(q.extent(3)), heads, heads_kv),
                    preprocess, variant);
  });
}

/// The backward of forward_padded: q, k, v, o and dO padded, dQ, dK and dV
/// computed padded and cropped; D from the caller's o and dO (`preprocess`)
/// or, in the 16-bit families, from the padded ones (zero columns add
/// nothing).
template <class ExecSpace, class Q, class K, class V, class O, class Lse, class DO, class DQ,
          class DK, class DV, class Delta, class Preprocess, class ScoreMod>
void backward_padded(KernelFamily family, int padded, const ExecSpace& space, const Q& q,
                     const K& k, const V& v, const O& o, const Lse& lse, const DO& d_o,
                     const DQ& dq, const DK& dk, const DV& dv, const Delta& delta,
                     const Preprocess& preprocess,
                     const Sequences<typename Q::memory_space>& seq,
                     const AttentionOptions& options, const ScoreMod& score_mod) {
  PaddedTensors<ExecSpace> tensors(padded);
  const std::size_t at_q = tensors.add(q), at_k = tensors.add(k), at_v = tensors.add(v),
                    at_o = tensors.add(o), at_do = tensors.add(d_o), at_dq = tensors.add(dq),
                    at_dk = tensors.add(dk), at_dv = tensors.add(dv);
  tensors.allocate(space, "kfa::bwd::padded_head_dim");
  copy_head_dim(space, "kfa::bwd::pad_q", q, tensors.writable(q, at_q));
  copy_head_dim(space, "kfa::bwd::pad_k", k, tensors.writable(k, at_k));
  copy_head_dim(space, "kfa::bwd::pad_v", v, tensors.writable(v, at_v));
  copy_head_dim(space, "kfa::bwd::pad_o", o, tensors.writable(o, at_o));
  copy_head_dim(space, "kfa::bwd::pad_do", d_o, tensors.writable(d_o, at_do));
  const DQ pdq = tensors.view(dq, at_dq);
  const DK pdk = tensors.view(dk, at_dk);
  const DV pdv = tensors.view(dv, at_dv);
  launch_fused_backward(family, space, tensors.view(q, at_q), tensors.view(k, at_k),
                        tensors.view(v, at_v), tensors.view(o, at_o), lse,
                        tensors.view(d_o, at_do), pdq, pdk, pdv, delta, preprocess, seq, options,
                        score_mod, static_cast<int>(q.extent(3)));
  copy_head_dim(space, "kfa::bwd::crop_dq", pdq, dq);
  copy_head_dim(space, "kfa::bwd::crop_dk", pdk, dk);
  copy_head_dim(space, "kfa::bwd::crop_dv", pdv, dv);
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
  const KernelChoice choice =
      backward_kernel_choice<ScoreMod, ExecSpace, Q, K, V, O, Lse, DO, DQ, DK, DV, Delta>(
          space, q, k, v, d_o, dq, dk, dv, seq, options);
  if constexpr (!is_host_tiled_space<ExecSpace>()) {
    if (choice.padded()) {
      backward_padded(choice.family, choice.head_dim, space, q, k, v, o, lse, d_o, dq, dk, dv,
                      delta, preprocess, seq, options, score_mod);
      return;
    }
  }
  const KernelFamily family = choice.family;
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
    launch_fused_backward(family, space, q, k, v, o, lse, d_o, dq, dk, dv, delta, preprocess, seq,
                          options, score_mod, head_dim);
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
