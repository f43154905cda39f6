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

/// Materialised backward: P (from the forward's lse) and dP are stored as
/// [batch·heads][seqlen_q][seqlen_k] buffers; the four products are gemms.
template <class ExecSpace, class Q, class K, class V, class O, class Lse, class DO, class DQ,
          class DK, class DV>
void standard_attention_backward_impl(const ExecSpace& space, const Q& q, const K& k,
                                      const V& v, const O& o, const Lse& lse, const DO& d_o,
                                      const DQ& dq, const DK& dk, const DV& dv,
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
  if (bh_count == 0) return;
  const acc_t scale = softmax_scale<acc_t>(options, head_dim);
  const CausalMask mask{options.causal, seqlen_k - seqlen_q, seqlen_k};

  auto alloc = [&](const char* label, int rows, int cols) {
    return Buffer(Kokkos::view_alloc(space, Kokkos::WithoutInitializing, std::string(label)),
                  bh_count, rows, cols);
  };
  Buffer q_buf = alloc("kfa::standard::q", seqlen_q, head_dim);
  Buffer do_buf = alloc("kfa::standard::d_o", seqlen_q, head_dim);
  Buffer dq_buf = alloc("kfa::standard::dq", seqlen_q, head_dim);
  Buffer k_buf = alloc("kfa::standard::k", seqlen_k, head_dim);
  Buffer v_buf = alloc("kfa::standard::v", seqlen_k, head_dim);
  Buffer dk_buf = alloc("kfa::standard::dk", seqlen_k, head_dim);
  Buffer dv_buf = alloc("kfa::standard::dv", seqlen_k, head_dim);
  Buffer p_buf = alloc("kfa::standard::p", seqlen_q, seqlen_k);
  Buffer dp_buf = alloc("kfa::standard::dp", seqlen_q, seqlen_k);
  Kokkos::View<acc_t**, Kokkos::LayoutRight, memory_space> delta(
      Kokkos::view_alloc(space, Kokkos::WithoutInitializing, std::string("kfa::standard::delta")),
      bh_count, seqlen_q);

  using Range3 = Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<3>>;
  Kokkos::parallel_for(
      "kfa::standard::bwd_gather_q", Range3(space, {0, 0, 0}, {bh_count, seqlen_q, head_dim}),
      KOKKOS_LAMBDA(const int bh, const int i, const int d) {
        const int b = bh / heads, h = bh % heads;
        q_buf(bh, i, d) = to_acc<acc_t>(q(b, i, h, d));
        do_buf(bh, i, d) = to_acc<acc_t>(d_o(b, i, h, d));
      });
  Kokkos::parallel_for(
      "kfa::standard::bwd_gather_kv", Range3(space, {0, 0, 0}, {bh_count, seqlen_k, head_dim}),
      KOKKOS_LAMBDA(const int bh, const int j, const int d) {
        const int b = bh / heads, h = bh % heads;
        k_buf(bh, j, d) = to_acc<acc_t>(k(b, j, h, d));
        v_buf(bh, j, d) = to_acc<acc_t>(v(b, j, h, d));
      });
  Kokkos::parallel_for(
      "kfa::standard::bwd_delta",
      Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>>(space, {0, 0}, {bh_count, seqlen_q}),
      KOKKOS_LAMBDA(const int bh, const int i) {
        const int b = bh / heads, h = bh % heads;
        acc_t sum = 0;
        for (int d = 0; d < head_dim; ++d)
          sum += to_acc<acc_t>(d_o(b, i, h, d)) * to_acc<acc_t>(o(b, i, h, d));
        delta(bh, i) = sum;
      });

  auto mat = [](const Buffer& buf, int bh) {
    return Kokkos::subview(buf, bh, Kokkos::ALL(), Kokkos::ALL());
  };
  if (seqlen_k > 0 && seqlen_q > 0) {
    for (int bh = 0; bh < bh_count; ++bh) {
      gemm(space, "N", "T", scale, mat(q_buf, bh), mat(k_buf, bh), acc_t(0), mat(p_buf, bh));
      gemm(space, "N", "T", acc_t(1), mat(do_buf, bh), mat(v_buf, bh), acc_t(0),
           mat(dp_buf, bh));
    }
    // P from the saved lse, dS = P ∘ (dP - D) in place of dP; both rounded
    // to the value type as a materialised implementation would store them.
    Kokkos::parallel_for(
        "kfa::standard::bwd_softmax",
        Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<3>>(space, {0, 0, 0},
                                                          {bh_count, seqlen_q, seqlen_k}),
        KOKKOS_LAMBDA(const int bh, const int i, const int j) {
          const acc_t l = lse(bh / heads, bh % heads, i);
          const acc_t p = mask.masked(i, j) ? acc_t(0) : softmax::probability(p_buf(bh, i, j), l);
          const acc_t p_t = to_acc<acc_t>(from_acc<value_type>(p));
          p_buf(bh, i, j) = p_t;
          dp_buf(bh, i, j) = to_acc<acc_t>(from_acc<value_type>(p_t * (dp_buf(bh, i, j) - delta(bh, i))));
        });
    for (int bh = 0; bh < bh_count; ++bh) {
      gemm(space, "T", "N", acc_t(1), mat(p_buf, bh), mat(do_buf, bh), acc_t(0),
           mat(dv_buf, bh));
      gemm(space, "N", "N", scale, mat(dp_buf, bh), mat(k_buf, bh), acc_t(0), mat(dq_buf, bh));
      gemm(space, "T", "N", scale, mat(dp_buf, bh), mat(q_buf, bh), acc_t(0), mat(dk_buf, bh));
    }
  } else {
    Kokkos::deep_copy(space, dq_buf, acc_t(0));
    Kokkos::deep_copy(space, dk_buf, acc_t(0));
    Kokkos::deep_copy(space, dv_buf, acc_t(0));
  }
  Kokkos::parallel_for(
      "kfa::standard::bwd_scatter_dq", Range3(space, {0, 0, 0}, {bh_count, seqlen_q, head_dim}),
      KOKKOS_LAMBDA(const int bh, const int i, const int d) {
        dq(bh / heads, i, bh % heads, d) = from_acc<value_type>(dq_buf(bh, i, d));
      });
  Kokkos::parallel_for(
      "kfa::standard::bwd_scatter_dkdv", Range3(space, {0, 0, 0}, {bh_count, seqlen_k, head_dim}),
      KOKKOS_LAMBDA(const int bh, const int j, const int d) {
        dk(bh / heads, j, bh % heads, d) = from_acc<value_type>(dk_buf(bh, j, d));
        dv(bh / heads, j, bh % heads, d) = from_acc<value_type>(dv_buf(bh, j, d));
      });
}

}  // namespace Impl
}  // namespace kfa

#endif
