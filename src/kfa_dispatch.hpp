#ifndef KFA_DISPATCH_HPP
#define KFA_DISPATCH_HPP

// Run-time choices become template arguments here, once: the head dimension
// selects a compiled tile shape. Causal masking stays a run-time value: it
// only decides which tiles run and whether a tile applies the element mask.

#include <kfa/options.hpp>

#include <kfa_bwd_kernel.hpp>
#include <kfa_fwd_kernel.hpp>

#include <impl/backend/kfa_cuda_bwd_mma.hpp>
#include <impl/backend/kfa_cuda_fwd_mma.hpp>

#include <cmath>

namespace kfa {
namespace Impl {

template <class Acc>
Acc softmax_scale(const AttentionOptions& options, int head_dim) {
  return options.softmax_scale != 0 ? static_cast<Acc>(options.softmax_scale)
                                    : static_cast<Acc>(1.0 / std::sqrt(double(head_dim)));
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

template <class ExecSpace, class Q, class K, class V, class O, class Lse>
void dispatch_forward(const ExecSpace& space, const Q& q, const K& k, const V& v, const O& o,
                      const Lse& lse, const AttentionOptions& options) {
  using acc_t = typename Lse::non_const_value_type;
  using value_type = typename Q::non_const_value_type;
  const int head_dim = static_cast<int>(q.extent(3));
  const acc_t scale = softmax_scale<acc_t>(options, head_dim);
  using Format = typename MmaFormat<ExecSpace, value_type>::type;
  if constexpr (!std::is_void<Format>::value) {
    // Tensor-core path: head_dim 64 or 128, 16-byte aligned rows, and no
    // explicit team size (the mma kernel's teams are 4 warps by design).
    auto aligned = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
    if ((head_dim == 64 || head_dim == 128) && options.team_size == 0 && aligned(q.data()) &&
        aligned(k.data()) && aligned(v.data()) && aligned(o.data())) {
      if (head_dim == 64)
        FlashForwardMmaKernel<ExecSpace, 64, Format, Q, K, V, O, Lse>(q, k, v, o, lse, scale,
                                                                     options.causal)
            .launch(space);
      else
        FlashForwardMmaKernel<ExecSpace, 128, Format, Q, K, V, O, Lse>(q, k, v, o, lse, scale,
                                                                      options.causal)
            .launch(space);
      return;
    }
  }
  dispatch_head_dim(head_dim, [&](auto bucket) {
    FlashForwardKernel<ExecSpace, decltype(bucket)::value, Q, K, V, O, Lse> kernel(
        q, k, v, o, lse, scale, options.causal);
    kernel.launch(space, options.team_size);
  });
}

/// dq = dq_acc, converted from the accumulator type.
template <class ExecSpace, class AccView, class DQ>
void convert_dq(const ExecSpace& space, const AccView& dq_acc, const DQ& dq) {
  using value_type = typename DQ::non_const_value_type;
  Kokkos::parallel_for(
      "kfa::bwd::convert_dq",
      Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<4>>(
          space, {0, 0, 0, 0},
          {dq.extent(0), dq.extent(1), dq.extent(2), dq.extent(3)}),
      KOKKOS_LAMBDA(const int b, const int i, const int h, const int d) {
        dq(b, i, h, d) = from_acc<value_type>(dq_acc(b, i, h, d));
      });
}

template <class ExecSpace, class Q, class K, class V, class O, class Lse, class DO, class DQ,
          class DK, class DV>
void dispatch_backward(const ExecSpace& space, const Q& q, const K& k, const V& v,
                       const O& o, const Lse& lse, const DO& d_o, const DQ& dq, const DK& dk,
                       const DV& dv, const AttentionOptions& options) {
  using value_type = typename Q::non_const_value_type;
  using acc_t = typename Lse::non_const_value_type;
  using memory_space = typename ExecSpace::memory_space;
  const int batch = static_cast<int>(q.extent(0)), seqlen_q = static_cast<int>(q.extent(1)),
            heads = static_cast<int>(q.extent(2)), head_dim = static_cast<int>(q.extent(3));
  const acc_t scale = softmax_scale<acc_t>(options, head_dim);

  Kokkos::View<acc_t***, Kokkos::LayoutRight, memory_space> delta(
      Kokkos::view_alloc(space, Kokkos::WithoutInitializing, std::string("kfa::bwd::delta")), batch, heads,
      seqlen_q);
  BackwardPreprocess<ExecSpace, O, DO, decltype(delta)>{o, d_o, delta, seqlen_q, heads,
                                                         head_dim}
      .launch(space);

  using AccView = Kokkos::View<acc_t****, Kokkos::LayoutRight, memory_space>;
  using Format = typename MmaFormat<ExecSpace, value_type>::type;
  if constexpr (!std::is_void<Format>::value) {
    // Tensor-core path (dQ by fp32 atomics): head_dim 64 or 128, 16-byte
    // aligned rows, not deterministic, no explicit team size.
    auto aligned = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
    if ((head_dim == 64 || head_dim == 128) && !options.deterministic &&
        options.team_size == 0 && aligned(q.data()) && aligned(k.data()) &&
        aligned(v.data()) && aligned(d_o.data()) && aligned(dk.data()) && aligned(dv.data())) {
      AccView dq_acc(Kokkos::view_alloc(space, std::string("kfa::bwd::dq_accum")), batch,
                     seqlen_q, heads, head_dim);
      if (head_dim == 64)
        FlashBackwardMmaKernel<ExecSpace, 64, Format, Q, K, V, DO, Lse, decltype(delta), AccView,
                               DK, DV>(q, k, v, d_o, lse, delta, dq_acc, dk, dv, scale,
                                       options.causal)
            .launch(space);
      else
        FlashBackwardMmaKernel<ExecSpace, 128, Format, Q, K, V, DO, Lse, decltype(delta),
                               AccView, DK, DV>(q, k, v, d_o, lse, delta, dq_acc, dk, dv, scale,
                                                options.causal)
            .launch(space);
      convert_dq(space, dq_acc, dq);
      return;
    }
  }
  dispatch_head_dim(head_dim, [&](auto bucket) {
    constexpr int kHeadDim = decltype(bucket)::value;
    // dQ accumulates with atomics in the accumulator type: in dq itself when
    // it has that type, otherwise in a temporary converted at the end.
    using DQAcc = std::conditional_t<std::is_same<value_type, acc_t>::value, DQ, AccView>;
    using KVKernel =
        FlashBackwardKVKernel<ExecSpace, kHeadDim, Q, K, V, DO, Lse, decltype(delta), DQAcc, DK, DV>;
    if (options.deterministic) {
      KVKernel(q, k, v, d_o, lse, delta, DQAcc(), dk, dv, scale, options.causal, false)
          .launch(space, options.team_size);
      FlashBackwardQKernel<ExecSpace, kHeadDim, Q, K, V, DO, Lse, decltype(delta), DQ>(
          q, k, v, d_o, lse, delta, dq, scale, options.causal)
          .launch(space, options.team_size);
    } else if constexpr (std::is_same<value_type, acc_t>::value) {
      Kokkos::deep_copy(space, dq, value_type(0));
      KVKernel(q, k, v, d_o, lse, delta, dq, dk, dv, scale, options.causal, true)
          .launch(space, options.team_size);
    } else {
      AccView dq_acc(Kokkos::view_alloc(space, std::string("kfa::bwd::dq_accum")), batch,
                     seqlen_q, heads, head_dim);
      KVKernel(q, k, v, d_o, lse, delta, dq_acc, dk, dv, scale, options.causal, true)
          .launch(space, options.team_size);
      convert_dq(space, dq_acc, dq);
    }
  });
}

}  // namespace Impl
}  // namespace kfa

#endif
