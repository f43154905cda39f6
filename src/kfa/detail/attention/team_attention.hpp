#ifndef KFA_DETAIL_ATTENTION_TEAM_ATTENTION_HPP
#define KFA_DETAIL_ATTENTION_TEAM_ATTENTION_HPP

// The team-level attention that runs inside a caller's TeamPolicy kernel
// (include/kfa/team_attention.hpp): one small problem per call, its whole
// score matrix in a caller-provided buffer of the accumulator type. Phases
// alternate between two mappings of the team:
//   rows:  query rows over the team's threads, keys (scores) or the head
//          dimension (products) over each thread's vector lanes;
//   keys:  keys over the threads, the head dimension over the lanes, query
//          rows summed in order inside one thread (dK, dV: no atomics, the
//          same bits whatever the team shape).
// The buffer's rows have an odd stride, so that threads reading one column
// each of consecutive rows hit different shared-memory banks.

#include <kfa/types.hpp>

#include <kfa/detail/common/compat.hpp>
#include <kfa/detail/attention/mask.hpp>
#include <kfa/detail/attention/online_softmax.hpp>

#include <type_traits>

namespace kfa {
namespace Impl {

/// Row stride of the score buffer: nk rounded up to an odd number.
KOKKOS_INLINE_FUNCTION constexpr int team_scores_stride(int nk) { return nk | 1; }

// Compile-time checks only; __host__ __device__ so that device code may name
// them without relaxed constexpr.
template <class ViewType>
KOKKOS_INLINE_FUNCTION constexpr bool is_team_view(int rank) {
  if constexpr (!Kokkos::is_view<ViewType>::value) {
    return false;
  } else {
    return static_cast<int>(ViewType::rank) == rank;
  }
}

/// The compile-time checks of both entry points: q, k, v, o of one
/// supported value type T, lse and scratch of accumulator_t<T>.
template <class Q, class K, class V, class O, class Lse, class Scratch>
KOKKOS_INLINE_FUNCTION constexpr void check_team_attention_types() {
  static_assert(is_team_view<Q>(2) && is_team_view<K>(2) && is_team_view<V>(2) &&
                    is_team_view<O>(2),
                "kfa::Experimental::team_attention: q, k, v, o (and d_o, dq, dk, dv) must be "
                "rank-2 Kokkos Views [rows][head_dim]");
  static_assert(is_team_view<Lse>(1) && is_team_view<Scratch>(1),
                "kfa::Experimental::team_attention: lse and scratch must be rank-1 Kokkos Views");
  using T = typename Q::non_const_value_type;
  static_assert(is_supported_value_type<T>::value,
                "kfa::Experimental::team_attention: value type must be double, float, kfa::half "
                "or kfa::bfloat16");
  static_assert(std::is_same<typename K::non_const_value_type, T>::value &&
                    std::is_same<typename V::non_const_value_type, T>::value &&
                    std::is_same<typename O::non_const_value_type, T>::value,
                "kfa::Experimental::team_attention: q, k, v, o (and d_o, dq, dk, dv) must have "
                "one value type");
  static_assert(std::is_same<typename Lse::non_const_value_type, accumulator_t<T>>::value &&
                    std::is_same<typename Scratch::value_type, accumulator_t<T>>::value,
                "kfa::Experimental::team_attention: lse and scratch must hold "
                "kfa::accumulator_t of the value type (scratch non-const)");
}

/// One call's sizes, scale and mask, and the extent checks shared by forward
/// and backward. A failed check aborts: there is no exception on a device.
template <class Acc>
struct TeamProblem {
  int nq, nk, head_dim, ld;
  Acc scale;
  AttentionMask mask;

  template <class Q, class K, class V, class O, class Lse, class Scratch, class Options>
  KOKKOS_INLINE_FUNCTION TeamProblem(const Q& q, const K& k, const V& v, const O& o,
                                     const Lse& lse, const Scratch& scratch, const Options& opt)
      : nq(static_cast<int>(q.extent(0))),
        nk(static_cast<int>(k.extent(0))),
        head_dim(static_cast<int>(q.extent(1))),
        ld(team_scores_stride(nk)),
        scale(opt.softmax_scale != 0 ? static_cast<Acc>(opt.softmax_scale)
                                     : Acc(1) / math::sqrt(static_cast<Acc>(q.extent(1)))),
        mask(nq, nk, opt.window_left, opt.causal ? 0 : opt.window_right) {
    if (head_dim < 1 || static_cast<int>(k.extent(1)) != head_dim ||
        static_cast<int>(v.extent(1)) != head_dim || static_cast<int>(v.extent(0)) != nk) {
      Kokkos::abort(
          "kfa::Experimental::team_attention: k and v must be [nk][head_dim] with q "
          "[nq][head_dim], head_dim >= 1");
    }
    if (static_cast<int>(o.extent(0)) != nq || static_cast<int>(o.extent(1)) != head_dim ||
        static_cast<int>(lse.extent(0)) != nq) {
      Kokkos::abort("kfa::Experimental::team_attention: o must be [nq][head_dim], lse [nq]");
    }
    if (scratch.extent(0) < static_cast<std::size_t>(nq) * static_cast<std::size_t>(ld)) {
      Kokkos::abort(
          "kfa::Experimental::team_attention: scratch holds fewer than "
          "team_attention_scratch_size(nq, nk) elements");
    }
  }

  /// Scaled score of query row i and key j, -inf where the mask hides j.
  template <class Q, class K>
  KOKKOS_INLINE_FUNCTION Acc score(const Q& q, const K& k, int i, int j) const {
    if (mask.masked(i, j)) return math::neg_inf<Acc>();
    Acc dot = 0;
    for (int d = 0; d < head_dim; ++d) dot += to_acc<Acc>(q(i, d)) * to_acc<Acc>(k(j, d));
    return dot * scale;
  }
};

/// out[i][:] = factor · Σ_j w[i][j] · x[j][:] for row i of a rows × keys
/// weight matrix (or of its transpose, Transposed: w[j][i]), the head
/// dimension over the calling thread's vector lanes; terms summed in order.
template <bool Transposed, class Member, class Acc, class X, class Out>
KOKKOS_INLINE_FUNCTION void team_weighted_rows(const Member& team, const Acc* w, int ld, int i,
                                               int n, const X& x, Acc factor, const Out& out) {
  using T = typename Out::non_const_value_type;
  const int head_dim = static_cast<int>(out.extent(1));
  Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, head_dim), [&](const int d) {
    Acc acc = 0;
    for (int j = 0; j < n; ++j) {
      const Acc wj = Transposed ? w[j * ld + i] : w[i * ld + j];
      acc += wj * to_acc<Acc>(x(j, d));
    }
    out(i, d) = from_acc<T>(acc * factor);
  });
}

template <class Member, class Q, class K, class V, class O, class Lse, class Scratch,
          class Options>
KOKKOS_INLINE_FUNCTION void team_attention_forward(const Member& team, const Q& q, const K& k,
                                                   const V& v, const O& o, const Lse& lse,
                                                   const Scratch& scratch, const Options& opt) {
  using acc_t = typename Scratch::value_type;
  using softmax = OnlineSoftmax<acc_t>;
  const TeamProblem<acc_t> prob(q, k, v, o, lse, scratch, opt);
  acc_t* p = scratch.data();
  const int ld = prob.ld;

  // Rows: scores, their max, the weights exp(s - max) and lse. Each lane
  // rereads only the elements it wrote itself (ThreadVectorRange gives a lane
  // the same indices in every loop).
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, prob.nq), [&](const int i) {
    acc_t* row = p + i * ld;
    acc_t row_max;
    Kokkos::parallel_reduce(
        Kokkos::ThreadVectorRange(team, prob.nk),
        [&](const int j, acc_t& m) {
          const acc_t s = prob.score(q, k, i, j);
          row[j] = s;
          m = s > m ? s : m;
        },
        Kokkos::Max<acc_t>(row_max));
    const acc_t shift = softmax::shift(row_max);
    acc_t row_sum = 0;
    Kokkos::parallel_reduce(
        Kokkos::ThreadVectorRange(team, prob.nk),
        [&](const int j, acc_t& l) {
          const acc_t e = math::exp(row[j] - shift);
          row[j] = e;
          l += e;
        },
        row_sum);
    // A row that sees no key has row_sum = 0: its weights stay 0 and O = 0.
    const acc_t inv = row_sum > acc_t(0) ? acc_t(1) / row_sum : acc_t(0);
    Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, prob.nk),
                         [&](const int j) { row[j] *= inv; });
    Kokkos::single(Kokkos::PerThread(team), [&]() { lse(i) = softmax::lse(row_max, row_sum); });
  });
  // Every row of P is visible to every lane.
  team.team_barrier();
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, prob.nq), [&](const int i) {
    team_weighted_rows<false>(team, p, ld, i, prob.nk, v, acc_t(1), o);
  });
  // O and lse are visible to the whole team, and the buffer is free again.
  team.team_barrier();
}

template <class Member, class Q, class K, class V, class O, class Lse, class DO, class DQ,
          class DK, class DV, class Scratch, class Options>
KOKKOS_INLINE_FUNCTION void team_attention_backward(const Member& team, const Q& q, const K& k,
                                                    const V& v, const O& o, const Lse& lse,
                                                    const DO& d_o, const DQ& dq, const DK& dk,
                                                    const DV& dv, const Scratch& scratch,
                                                    const Options& opt) {
  using acc_t = typename Scratch::value_type;
  using softmax = OnlineSoftmax<acc_t>;
  const TeamProblem<acc_t> prob(q, k, v, o, lse, scratch, opt);
  if (d_o.extent(0) != o.extent(0) || d_o.extent(1) != o.extent(1) ||
      dq.extent(0) != q.extent(0) || dq.extent(1) != q.extent(1) ||
      dk.extent(0) != k.extent(0) || dk.extent(1) != k.extent(1) ||
      dv.extent(0) != v.extent(0) || dv.extent(1) != v.extent(1)) {
    Kokkos::abort(
        "kfa::Experimental::team_attention_backward: d_o and dq must be shaped like q, dk "
        "and dv like k");
  }
  acc_t* buf = scratch.data();
  const int ld = prob.ld;

  // Rows: P = exp(s - lse) recomputed from the forward's lse (0 where
  // masked and on rows that saw no key).
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, prob.nq), [&](const int i) {
    const acc_t row_lse = lse(i);
    Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, prob.nk), [&](const int j) {
      buf[i * ld + j] = softmax::probability(prob.score(q, k, i, j), row_lse);
    });
  });
  // P is visible to every thread.
  team.team_barrier();
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, prob.nk), [&](const int j) {
    team_weighted_rows<true>(team, buf, ld, j, prob.nq, d_o, acc_t(1), dv);
  });
  // dV has read P: the buffer may now take dS.
  team.team_barrier();
  // Rows: dS = P ∘ (dP - D), D = rowsum(dO ∘ O), dP = dO·vᵀ. A zero P (a
  // masked key) gives dS = 0 whatever dP is.
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, prob.nq), [&](const int i) {
    acc_t delta = 0;
    Kokkos::parallel_reduce(
        Kokkos::ThreadVectorRange(team, prob.head_dim),
        [&](const int d, acc_t& sum) { sum += to_acc<acc_t>(d_o(i, d)) * to_acc<acc_t>(o(i, d)); },
        delta);
    Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, prob.nk), [&](const int j) {
      acc_t& element = buf[i * ld + j];
      const acc_t pij = element;
      if (pij == acc_t(0)) return;
      acc_t dp = 0;
      for (int d = 0; d < prob.head_dim; ++d) dp += to_acc<acc_t>(d_o(i, d)) * to_acc<acc_t>(v(j, d));
      element = pij * (dp - delta);
    });
  });
  // dS is visible to every thread.
  team.team_barrier();
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, prob.nq), [&](const int i) {
    team_weighted_rows<false>(team, buf, ld, i, prob.nk, k, prob.scale, dq);
  });
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, prob.nk), [&](const int j) {
    team_weighted_rows<true>(team, buf, ld, j, prob.nq, q, prob.scale, dk);
  });
  // dQ, dK, dV are visible to the whole team, and the buffer is free again.
  team.team_barrier();
}

}  // namespace Impl
}  // namespace kfa

#endif
