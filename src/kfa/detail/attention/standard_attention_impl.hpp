#ifndef KFA_DETAIL_ATTENTION_STANDARD_ATTENTION_IMPL_HPP
#define KFA_DETAIL_ATTENTION_STANDARD_ATTENTION_IMPL_HPP

// Materialised attention, the baseline: Q, K, V are gathered per (sequence,
// query head) into contiguous accumulator-type buffers padded to the longest
// sequence, S = Q·Kᵀ·scale and O = P·V are KokkosBlas::gemm calls, and the
// softmax is a row kernel over S applying the same mask and score pipeline
// as the fused kernels (softcap, score modifier, dropout). Grouped-query
// heads are gathered per query head; dK and dV are summed over the group when
// they are scattered back. The baseline compiles a single variant (every
// feature in, switched at run time): it is the yardstick, not the fast path.

#include <kfa/options.hpp>

#include <kfa/detail/common/compat.hpp>
#include <kfa/detail/attention/kernel_views.hpp>
#include <kfa/detail/attention/mask.hpp>
#include <kfa/detail/attention/online_softmax.hpp>
#include <kfa/detail/attention/sequences.hpp>
#include <kfa/detail/attention/variant.hpp>

namespace kfa {
namespace Impl {

/// Gathers q-shaped rows of head h of each sequence into buf[b·heads + h]
/// [max_rows][head_dim], zero past the sequence.
template <class ExecSpace, class Buffer, class View, class Seq>
void standard_gather_rows(const ExecSpace& space, const char* label, const Buffer& buf,
                          const View& src, const Seq& seq, int heads, bool key_rows,
                          int head_group) {
  using acc_t = typename Buffer::non_const_value_type;
  const int max_rows = static_cast<int>(buf.extent(1)), head_dim = static_cast<int>(buf.extent(2));
  Kokkos::parallel_for(
      label,
      Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<3>>(
          space, {0, 0, 0}, {static_cast<int>(buf.extent(0)), max_rows, head_dim}),
      KOKKOS_LAMBDA(const int bh, const int i, const int d) {
        const SequenceInfo s = seq(bh / heads);
        const int rows = key_rows ? s.seqlen_k : s.seqlen_q;
        const int r0 = key_rows ? s.k_begin : s.q_begin;
        buf(bh, i, d) =
            i < rows ? to_acc<acc_t>(src(s.view_batch, r0 + i, (bh % heads) / head_group, d))
                     : acc_t(0);
      });
}

/// Scatters buf[b·heads + h][i][d] back to the q-shaped rows of each sequence.
template <class ExecSpace, class Buffer, class View, class Seq>
void standard_scatter_rows(const ExecSpace& space, const char* label, const Buffer& buf,
                           const View& dst, const Seq& seq, int heads) {
  using value_type = typename View::non_const_value_type;
  const int max_rows = static_cast<int>(buf.extent(1)), head_dim = static_cast<int>(buf.extent(2));
  Kokkos::parallel_for(
      label,
      Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<3>>(
          space, {0, 0, 0}, {static_cast<int>(buf.extent(0)), max_rows, head_dim}),
      KOKKOS_LAMBDA(const int bh, const int i, const int d) {
        const SequenceInfo s = seq(bh / heads);
        if (i < s.seqlen_q) dst(s.view_batch, s.q_begin + i, bh % heads, d) = from_acc<value_type>(buf(bh, i, d));
      });
}

/// Scatters per-query-head key gradients buf[b·heads + h][j][d] to the key
/// rows of each sequence, summing the `group` query heads of each key/value
/// head in a fixed order.
template <class ExecSpace, class Buffer, class View, class Seq>
void standard_scatter_keys(const ExecSpace& space, const char* label, const Buffer& buf,
                           const View& dst, const Seq& seq, int heads, int group) {
  using value_type = typename View::non_const_value_type;
  using acc_t = typename Buffer::non_const_value_type;
  const int heads_kv = heads / group;
  const int max_rows = static_cast<int>(buf.extent(1)), head_dim = static_cast<int>(buf.extent(2));
  Kokkos::parallel_for(
      label,
      Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<3>>(
          space, {0, 0, 0}, {seq.batch * heads_kv, max_rows, head_dim}),
      KOKKOS_LAMBDA(const int bh_kv, const int j, const int d) {
        const int b = bh_kv / heads_kv, h_kv = bh_kv % heads_kv;
        const SequenceInfo s = seq(b);
        if (j >= s.seqlen_k) return;
        acc_t sum = 0;
        for (int g = 0; g < group; ++g) sum += buf(b * heads + h_kv * group + g, j, d);
        dst(s.view_batch, s.k_begin + j, h_kv, d) = from_acc<value_type>(sum);
      });
}

template <class ExecSpace, class Q, class K, class V, class O, class Lse, class ScoreMod>
void standard_attention_forward_impl(const ExecSpace& space, const Q& q, const K& k,
                                     const V& v, const O& o, const Lse& lse,
                                     const Sequences<typename Q::memory_space>& seq,
                                     const AttentionOptions& options,
                                     const ScoreMod& score_mod) {
  using value_type = typename Q::non_const_value_type;
  using acc_t = typename Lse::non_const_value_type;
  using memory_space = typename ExecSpace::memory_space;
  using Buffer = Kokkos::View<acc_t***, Kokkos::LayoutRight, memory_space>;
  using softmax = OnlineSoftmax<acc_t>;
  using pipeline_t = ScorePipeline<Variant<true, ScoreMod>, acc_t>;
  const int heads = static_cast<int>(q.extent(2)), head_dim = static_cast<int>(q.extent(3));
  const auto params =
      make_params<acc_t>(options, seq, heads, static_cast<int>(k.extent(2)), head_dim);
  const int max_q = seq.max_seqlen_q, max_k = seq.max_seqlen_k;
  const int bh_count = seq.batch * heads;
  if (bh_count == 0 || max_q == 0) return;
  const pipeline_t pipeline(params, score_mod);
  const int window_left = params.window_left, window_right = params.window_right;

  auto alloc = [&](const char* label, int rows, int cols) {
    return Buffer(Kokkos::view_alloc(space, Kokkos::WithoutInitializing, std::string(label)),
                  bh_count, rows, cols);
  };
  Buffer q_buf = alloc("kfa::standard::q", max_q, head_dim);
  Buffer k_buf = alloc("kfa::standard::k", max_k, head_dim);
  Buffer v_buf = alloc("kfa::standard::v", max_k, head_dim);
  Buffer o_buf = alloc("kfa::standard::o", max_q, head_dim);
  Buffer s_buf = alloc("kfa::standard::scores", max_q, max_k);

  standard_gather_rows(space, "kfa::standard::gather_q", q_buf, q, seq, heads, false, 1);
  standard_gather_rows(space, "kfa::standard::gather_k", k_buf, k, seq, heads, true,
                       params.group());
  standard_gather_rows(space, "kfa::standard::gather_v", v_buf, v, seq, heads, true,
                       params.group());

  if (max_k > 0) {
    for (int bh = 0; bh < bh_count; ++bh) {
      auto q_bh = Kokkos::subview(q_buf, bh, Kokkos::ALL(), Kokkos::ALL());
      auto k_bh = Kokkos::subview(k_buf, bh, Kokkos::ALL(), Kokkos::ALL());
      auto s_bh = Kokkos::subview(s_buf, bh, Kokkos::ALL(), Kokkos::ALL());
      gemm(space, "N", "T", params.scale, q_bh, k_bh, acc_t(0), s_bh);
    }
  }

  // Row softmax of S in place, mask and score pipeline applied; the dropped,
  // rescaled P is rounded to the value type as a materialised implementation
  // in that precision would store it. lse is that of the undropped P.
  Kokkos::parallel_for(
      "kfa::standard::softmax",
      Kokkos::RangePolicy<ExecSpace>(space, 0, std::size_t(bh_count) * max_q),
      KOKKOS_LAMBDA(const std::size_t row) {
        const int bh = static_cast<int>(row / max_q), i = static_cast<int>(row % max_q);
        const int b = bh / heads, h = bh % heads;
        const SequenceInfo s = seq(b);
        if (i >= s.seqlen_q) return;
        const AttentionMask mask(s.seqlen_q, s.seqlen_k, window_left, window_right);
        acc_t m = math::neg_inf<acc_t>();
        for (int j = 0; j < max_k; ++j) {
          acc_t unused;
          const acc_t x = mask.masked(i, j) ? math::neg_inf<acc_t>()
                                            : pipeline.template score<false>(
                                                  s, b, h, i, j, s_buf(bh, i, j), unused);
          s_buf(bh, i, j) = x;
          m = x > m ? x : m;
        }
        const acc_t shift = softmax::shift(m);
        acc_t l = 0;
        for (int j = 0; j < max_k; ++j) {
          const acc_t p = math::exp(s_buf(bh, i, j) - shift);
          s_buf(bh, i, j) = p;
          l += p;
        }
        const acc_t inv = l > acc_t(0) ? acc_t(1) / l : acc_t(0);
        const bool dropout = pipeline.dropout();
        const std::uint64_t dropout_row = dropout ? pipeline.dropout_row(b, h, i) : 0;
        for (int j = 0; j < max_k; ++j) {
          const acc_t keep = dropout ? pipeline.keep_factor(dropout_row, j) : acc_t(1);
          s_buf(bh, i, j) = to_acc<acc_t>(from_acc<value_type>(s_buf(bh, i, j) * inv * keep));
        }
        lse(s.view_batch, h, s.q_begin + i) = softmax::lse(m, l);
      });

  if (max_k > 0) {
    for (int bh = 0; bh < bh_count; ++bh) {
      auto s_bh = Kokkos::subview(s_buf, bh, Kokkos::ALL(), Kokkos::ALL());
      auto v_bh = Kokkos::subview(v_buf, bh, Kokkos::ALL(), Kokkos::ALL());
      auto o_bh = Kokkos::subview(o_buf, bh, Kokkos::ALL(), Kokkos::ALL());
      gemm(space, "N", "N", acc_t(1), s_bh, v_bh, acc_t(0), o_bh);
    }
  } else {
    Kokkos::deep_copy(space, o_buf, acc_t(0));
  }
  standard_scatter_rows(space, "kfa::standard::scatter_o", o_buf, o, seq, heads);
}

/// Materialised backward: P (from the forward's lse) and dP are stored as
/// [batch·heads][max_seqlen_q][max_seqlen_k] buffers; the four products are
/// gemms.
template <class ExecSpace, class Q, class K, class V, class O, class Lse, class DO, class DQ,
          class DK, class DV, class ScoreMod>
void standard_attention_backward_impl(const ExecSpace& space, const Q& q, const K& k,
                                      const V& v, const O& o, const Lse& lse, const DO& d_o,
                                      const DQ& dq, const DK& dk, const DV& dv,
                                      const Sequences<typename Q::memory_space>& seq,
                                      const AttentionOptions& options,
                                      const ScoreMod& score_mod) {
  using value_type = typename Q::non_const_value_type;
  using acc_t = typename Lse::non_const_value_type;
  using memory_space = typename ExecSpace::memory_space;
  using Buffer = Kokkos::View<acc_t***, Kokkos::LayoutRight, memory_space>;
  using softmax = OnlineSoftmax<acc_t>;
  using pipeline_t = ScorePipeline<Variant<true, ScoreMod>, acc_t>;
  const int heads = static_cast<int>(q.extent(2)), head_dim = static_cast<int>(q.extent(3));
  const auto params =
      make_params<acc_t>(options, seq, heads, static_cast<int>(k.extent(2)), head_dim);
  const int max_q = seq.max_seqlen_q, max_k = seq.max_seqlen_k;
  const int bh_count = seq.batch * heads;
  if (bh_count == 0) return;
  const pipeline_t pipeline(params, score_mod);
  const int window_left = params.window_left, window_right = params.window_right;
  const acc_t scale = params.scale;

  auto alloc = [&](const char* label, int rows, int cols) {
    return Buffer(Kokkos::view_alloc(space, Kokkos::WithoutInitializing, std::string(label)),
                  bh_count, rows, cols);
  };
  Buffer q_buf = alloc("kfa::standard::q", max_q, head_dim);
  Buffer do_buf = alloc("kfa::standard::d_o", max_q, head_dim);
  Buffer o_buf = alloc("kfa::standard::o", max_q, head_dim);
  Buffer dq_buf = alloc("kfa::standard::dq", max_q, head_dim);
  Buffer k_buf = alloc("kfa::standard::k", max_k, head_dim);
  Buffer v_buf = alloc("kfa::standard::v", max_k, head_dim);
  Buffer dk_buf = alloc("kfa::standard::dk", max_k, head_dim);
  Buffer dv_buf = alloc("kfa::standard::dv", max_k, head_dim);
  Buffer p_buf = alloc("kfa::standard::p", max_q, max_k);
  Buffer dp_buf = alloc("kfa::standard::dp", max_q, max_k);
  Kokkos::View<acc_t**, Kokkos::LayoutRight, memory_space> delta(
      Kokkos::view_alloc(space, Kokkos::WithoutInitializing, std::string("kfa::standard::delta")),
      bh_count, max_q);

  const int group = params.group();
  standard_gather_rows(space, "kfa::standard::bwd_gather_q", q_buf, q, seq, heads, false, 1);
  standard_gather_rows(space, "kfa::standard::bwd_gather_d_o", do_buf, d_o, seq, heads, false,
                       1);
  standard_gather_rows(space, "kfa::standard::bwd_gather_o", o_buf, o, seq, heads, false, 1);
  standard_gather_rows(space, "kfa::standard::bwd_gather_k", k_buf, k, seq, heads, true, group);
  standard_gather_rows(space, "kfa::standard::bwd_gather_v", v_buf, v, seq, heads, true, group);
  Kokkos::parallel_for(
      "kfa::standard::bwd_delta",
      Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>>(space, {0, 0}, {bh_count, max_q}),
      KOKKOS_LAMBDA(const int bh, const int i) {
        acc_t sum = 0;
        for (int d = 0; d < head_dim; ++d) sum += do_buf(bh, i, d) * o_buf(bh, i, d);
        delta(bh, i) = sum;
      });

  auto mat = [](const Buffer& buf, int bh) {
    return Kokkos::subview(buf, bh, Kokkos::ALL(), Kokkos::ALL());
  };
  if (max_k > 0 && max_q > 0) {
    for (int bh = 0; bh < bh_count; ++bh) {
      gemm(space, "N", "T", scale, mat(q_buf, bh), mat(k_buf, bh), acc_t(0), mat(p_buf, bh));
      gemm(space, "N", "T", acc_t(1), mat(do_buf, bh), mat(v_buf, bh), acc_t(0),
           mat(dp_buf, bh));
    }
    // P from the saved lse, the dropped P̃ in place of P (for dV) and
    // dS = P ∘ (dP∘Z/(1-p) - D) ∘ pipeline' in place of dP; both rounded to
    // the value type as a materialised implementation would store them.
    Kokkos::parallel_for(
        "kfa::standard::bwd_softmax",
        Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<3>>(space, {0, 0, 0},
                                                          {bh_count, max_q, max_k}),
        KOKKOS_LAMBDA(const int bh, const int i, const int j) {
          const int b = bh / heads, h = bh % heads;
          const SequenceInfo s = seq(b);
          const AttentionMask mask(s.seqlen_q, s.seqlen_k, window_left, window_right);
          acc_t p = 0, grad = 1;
          if (!mask.masked(i, j)) {
            const acc_t x = pipeline.template score<true>(s, b, h, i, j, p_buf(bh, i, j), grad);
            p = softmax::probability(x, lse(s.view_batch, h, s.q_begin + i));
          }
          const acc_t keep = pipeline.dropout()
                                 ? pipeline.keep_factor(pipeline.dropout_row(b, h, i), j)
                                 : acc_t(1);
          const acc_t ds_score = p * (dp_buf(bh, i, j) * keep - delta(bh, i));
          if (p != acc_t(0)) pipeline.add_grad(b, h, i, j, ds_score);
          const acc_t ds = p == acc_t(0) ? acc_t(0) : ds_score * grad;
          p_buf(bh, i, j) = to_acc<acc_t>(from_acc<value_type>(p * keep));
          dp_buf(bh, i, j) = to_acc<acc_t>(from_acc<value_type>(ds));
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
  standard_scatter_rows(space, "kfa::standard::bwd_scatter_dq", dq_buf, dq, seq, heads);
  standard_scatter_keys(space, "kfa::standard::bwd_scatter_dk", dk_buf, dk, seq, heads, group);
  standard_scatter_keys(space, "kfa::standard::bwd_scatter_dv", dv_buf, dv, seq, heads, group);
}

}  // namespace Impl
}  // namespace kfa

#endif
