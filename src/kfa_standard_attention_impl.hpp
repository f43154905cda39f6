#ifndef KFA_STANDARD_ATTENTION_IMPL_HPP
#define KFA_STANDARD_ATTENTION_IMPL_HPP

// Materialised attention, the baseline: Q, K, V are gathered per (batch,
// head) into contiguous accumulator-type buffers, S = Q·Kᵀ·scale and O = P·V
// are KokkosBlas::gemm calls, and the softmax is a row kernel over S.

#include <kfa/options.hpp>

#include <kfa_compat.hpp>
#include <kfa_dispatch.hpp>
#include <kfa_mask.hpp>
#include <kfa_online_softmax.hpp>

namespace kfa {
namespace Impl {

template <class ExecSpace, class Q, class K, class V, class O, class Lse>
void standard_attention_forward_impl(const ExecSpace& space, const Q& q, const K& k,
                                     const V& v, const O& o, const Lse& lse,
                                     const AttentionOptions& options) {
  using value_type = typename Q::non_const_value_type;
  using acc_t = typename Lse::non_const_value_type;
  using memory_space = typename ExecSpace::memory_space;
  using Buffer = Kokkos::View<acc_t***, Kokkos::LayoutRight, memory_space>;
  using softmax = OnlineSoftmax<acc_t>;
  const int batch = static_cast<int>(q.extent(0)), seqlen_q = static_cast<int>(q.extent(1)),
            heads = static_cast<int>(q.extent(2)), head_dim = static_cast<int>(q.extent(3)),
            seqlen_k = static_cast<int>(k.extent(1));
  const int bh_count = batch * heads;
  if (bh_count == 0 || seqlen_q == 0) return;
  const acc_t scale = softmax_scale<acc_t>(options, head_dim);
  const CausalMask mask{options.causal, seqlen_k - seqlen_q, seqlen_k};

  auto alloc = [&](const char* label, int rows, int cols) {
    return Buffer(Kokkos::view_alloc(space, Kokkos::WithoutInitializing, std::string(label)), bh_count,
                  rows, cols);
  };
  Buffer q_buf = alloc("kfa::standard::q", seqlen_q, head_dim);
  Buffer k_buf = alloc("kfa::standard::k", seqlen_k, head_dim);
  Buffer v_buf = alloc("kfa::standard::v", seqlen_k, head_dim);
  Buffer o_buf = alloc("kfa::standard::o", seqlen_q, head_dim);
  Buffer s_buf = alloc("kfa::standard::scores", seqlen_q, seqlen_k);

  using Range3 = Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<3>>;
  Kokkos::parallel_for(
      "kfa::standard::gather_q", Range3(space, {0, 0, 0}, {bh_count, seqlen_q, head_dim}),
      KOKKOS_LAMBDA(const int bh, const int i, const int d) {
        q_buf(bh, i, d) = to_acc<acc_t>(q(bh / heads, i, bh % heads, d));
      });
  Kokkos::parallel_for(
      "kfa::standard::gather_kv", Range3(space, {0, 0, 0}, {bh_count, seqlen_k, head_dim}),
      KOKKOS_LAMBDA(const int bh, const int j, const int d) {
        k_buf(bh, j, d) = to_acc<acc_t>(k(bh / heads, j, bh % heads, d));
        v_buf(bh, j, d) = to_acc<acc_t>(v(bh / heads, j, bh % heads, d));
      });

  if (seqlen_k > 0) {
    for (int bh = 0; bh < bh_count; ++bh) {
      auto q_bh = Kokkos::subview(q_buf, bh, Kokkos::ALL(), Kokkos::ALL());
      auto k_bh = Kokkos::subview(k_buf, bh, Kokkos::ALL(), Kokkos::ALL());
      auto s_bh = Kokkos::subview(s_buf, bh, Kokkos::ALL(), Kokkos::ALL());
      gemm(space, "N", "T", scale, q_bh, k_bh, acc_t(0), s_bh);
    }
  }

  // Row softmax of S in place, mask applied; P is rounded to the value type
  // as a materialised implementation in that precision would store it.
  Kokkos::parallel_for(
      "kfa::standard::softmax",
      Kokkos::RangePolicy<ExecSpace>(space, 0, std::size_t(bh_count) * seqlen_q),
      KOKKOS_LAMBDA(const std::size_t row) {
        const int bh = static_cast<int>(row / seqlen_q), i = static_cast<int>(row % seqlen_q);
        acc_t m = math::neg_inf<acc_t>();
        for (int j = 0; j < seqlen_k; ++j) {
          if (mask.masked(i, j)) s_buf(bh, i, j) = math::neg_inf<acc_t>();
          m = s_buf(bh, i, j) > m ? s_buf(bh, i, j) : m;
        }
        const acc_t shift = softmax::shift(m);
        acc_t l = 0;
        for (int j = 0; j < seqlen_k; ++j) {
          const acc_t p = math::exp(s_buf(bh, i, j) - shift);
          s_buf(bh, i, j) = p;
          l += p;
        }
        const acc_t inv = l > acc_t(0) ? acc_t(1) / l : acc_t(0);
        for (int j = 0; j < seqlen_k; ++j)
          s_buf(bh, i, j) = to_acc<acc_t>(from_acc<value_type>(s_buf(bh, i, j) * inv));
        lse(bh / heads, bh % heads, i) = softmax::lse(m, l);
      });

  if (seqlen_k > 0) {
    for (int bh = 0; bh < bh_count; ++bh) {
      auto s_bh = Kokkos::subview(s_buf, bh, Kokkos::ALL(), Kokkos::ALL());
      auto v_bh = Kokkos::subview(v_buf, bh, Kokkos::ALL(), Kokkos::ALL());
      auto o_bh = Kokkos::subview(o_buf, bh, Kokkos::ALL(), Kokkos::ALL());
      gemm(space, "N", "N", acc_t(1), s_bh, v_bh, acc_t(0), o_bh);
    }
  } else {
    Kokkos::deep_copy(space, o_buf, acc_t(0));
  }
  Kokkos::parallel_for(
      "kfa::standard::scatter_o", Range3(space, {0, 0, 0}, {bh_count, seqlen_q, head_dim}),
      KOKKOS_LAMBDA(const int bh, const int i, const int d) {
        o(bh / heads, i, bh % heads, d) = from_acc<value_type>(o_buf(bh, i, d));
      });
}

}  // namespace Impl
}  // namespace kfa

#endif
