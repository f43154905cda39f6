#ifndef KFA_MERGE_ATTENTION_HPP
#define KFA_MERGE_ATTENTION_HPP

#include <kfa/types.hpp>

#include <kfa/detail/common/checks.hpp>
#include <kfa/detail/attention/merge_kernels.hpp>

namespace kfa {

/// Merges two partial attentions over disjoint key sets, exactly (the
/// online-softmax merge): with w_a = exp(lse_a - lse), w_b = exp(lse_b - lse),
/// lse = log(exp(lse_a) + exp(lse_b)),
///   o_a <- w_a·o_a + w_b·o_b,   lse_a <- lse.
/// Rows where both sides saw no key (lse = -inf) stay O = 0, lse = -inf.
///
/// o_a, o_b [batch][seqlen_q][heads][head_dim] (o_a may be the accumulator
/// type while o_b is the value type, as ring attention does to merge in
/// fp32/fp64); lse_a, lse_b [batch][heads][seqlen_q] of the accumulator type.
/// Enqueued on `space`; no fence.
template <class ExecSpace, class OA, class LseA, class OB, class LseB>
void merge_attention(const ExecSpace& space, const OA& o_a, const LseA& lse_a, const OB& o_b,
                     const LseB& lse_b) {
  const char* function = "kfa::merge_attention";
  Impl::ProfilingRegion region(function);
  const char* shape_o = "[batch][seqlen_q][heads][head_dim]";
  const char* shape_lse = "[batch][heads][seqlen_q]";
  Impl::check_view_kind<ExecSpace, OA>(function, "o_a", shape_o, 4);
  Impl::check_view_kind<ExecSpace, LseA>(function, "lse_a", shape_lse, 3);
  Impl::check_view_kind<ExecSpace, OB>(function, "o_b", shape_o, 4);
  Impl::check_view_kind<ExecSpace, LseB>(function, "lse_b", shape_lse, 3);
  if constexpr (Impl::view_ok<ExecSpace, OA>(4) && Impl::view_ok<ExecSpace, LseA>(3) &&
                Impl::view_ok<ExecSpace, OB>(4) && Impl::view_ok<ExecSpace, LseB>(3)) {
    using acc_t = typename LseA::non_const_value_type;
    using value_a = typename OA::value_type;
    static_assert(std::is_same<typename LseA::value_type, acc_t>::value,
                  "kfa::merge_attention: lse_a must be non-const (it receives the result)");
    static_assert(std::is_same<typename LseB::non_const_value_type, acc_t>::value,
                  "kfa::merge_attention: lse_a and lse_b must have the same value type");
    static_assert(!std::is_const<value_a>::value,
                  "kfa::merge_attention: o_a must be non-const (it receives the result)");
    const std::size_t batch = o_a.extent(0), seqlen = o_a.extent(1), heads = o_a.extent(2),
                      head_dim = o_a.extent(3);
    Impl::check_extents(function, "o_b", shape_o, o_b, {batch, seqlen, heads, head_dim});
    Impl::check_extents(function, "lse_a", shape_lse, lse_a, {batch, heads, seqlen});
    Impl::check_extents(function, "lse_b", shape_lse, lse_b, {batch, heads, seqlen});
    Impl::merge_attention_into(space, o_a, lse_a, o_b, lse_b);
  }
}

}  // namespace kfa

#endif
