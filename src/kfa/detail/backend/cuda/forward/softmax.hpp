#ifndef KFA_DETAIL_BACKEND_CUDA_FORWARD_SOFTMAX_HPP
#define KFA_DETAIL_BACKEND_CUDA_FORWARD_SOFTMAX_HPP

// The online softmax and the output of the 16-bit tensor-core forwards
// (mma.sync and wgmma), on accumulators in the m16n8 C layout: a thread
// holds, per m-tile mt of 16 rows, the rows row0 + 16·mt (e = 0, 1) and
// row0 + 16·mt + 8 (e = 2, 3), and per n-tile n of 8 columns the columns
// 8n + 2·(lane % 4) + (e % 2). The 4 lanes of a quad share a row.

#include <kfa/detail/attention/mask.hpp>

#include <kfa/detail/backend/cuda/primitives/launch.hpp>
#include <kfa/detail/backend/cuda/primitives/mma.hpp>

#include <cstdint>

namespace kfa {
namespace Impl {

/// f(mt, n, e) for each of a thread's scores s[mt][n][e], unrolled.
template <int MTiles, int TilesS, class F>
KOKKOS_FORCEINLINE_FUNCTION void for_each_score(F&& f) {
#pragma unroll
  for (int mt = 0; mt < MTiles; ++mt)
#pragma unroll
    for (int n = 0; n < TilesS; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) f(mt, n, e);
}

/// A variant's scores in place of the raw products S = Q·Kᵀ of a fragment:
/// s <- pipeline(scale·s) (softcap, then the score modifier), in natural
/// units, for the elements inside both sequences (the modifier is called
/// nowhere else); the mask is applied after it, as the options promise.
/// The team's tile is rows [row_begin, +BlockM) x keys [key_begin,
/// +BlockN): where the modifier's block predicate hides it, every score is
/// -inf and the modifier is not called; where its `unchanged` predicate
/// holds, the modifier is not called either. Returns the scale, in log2 units,
/// that the softmax applies next: log2(e), or, where the pipeline leaves
/// the scores alone (dropout only), the softmax scale, which the scores
/// then still need.
template <int BlockM, int BlockN, class Variant, int MTiles, int TilesS>
KOKKOS_FORCEINLINE_FUNCTION float fwd_variant_scores(float (&s)[MTiles][TilesS][4],
                                                     const Variant& variant,
                                                     const AttentionMask& mask, int b, int h,
                                                     int row_begin, int row0, int key_begin) {
  constexpr float kLog2e = 1.4426950408889634f;
  if (!variant.m_pipe.modifies_scores()) return variant.m_variant_scale * kLog2e;
  const int col0 = key_begin + (cuda_mma::lane_id() % 4) * 2;
  const SequenceInfo seq = Variant::sequence(mask, b);
  if (!variant.m_pipe.visible(b, h, row_begin, imin(row_begin + BlockM, seq.seqlen_q), key_begin,
                              imin(key_begin + BlockN, seq.seqlen_k))) {
    for_each_score<MTiles, TilesS>([&](int mt, int n, int e) { s[mt][n][e] = -INFINITY; });
    return kLog2e;
  }
  using Pipe = std::decay_t<decltype(variant.m_pipe)>;
  if constexpr (Pipe::kScoreMod && !Pipe::kAlibi) {
    // A tile the modifier leaves unchanged: the softcap at most.
    if (variant.m_pipe.unchanged(b, h, row_begin, imin(row_begin + BlockM, seq.seqlen_q),
                                 key_begin, imin(key_begin + BlockN, seq.seqlen_k))) {
      if (!variant.m_pipe.softcap_on()) return variant.m_variant_scale * kLog2e;
      for_each_score<MTiles, TilesS>([&](int mt, int n, int e) {
        float grad;
        s[mt][n][e] =
            variant.m_pipe.template softcapped<false>(s[mt][n][e] * variant.m_variant_scale, grad);
      });
      return kLog2e;
    }
  }
  if constexpr (std::decay_t<decltype(variant.m_pipe)>::kAlibi) {
    // Distances from one integer per lane and a constant per element: no
    // conversion per score. Elements past a sequence's end take a finite
    // bias and are masked after.
    const float slope = variant.m_pipe.alibi_slope(b, h);
    const float base = float(row0 + seq.seqlen_k - seq.seqlen_q - col0);
    // Without softcap the bias goes in the raw products' units (slope /
    // scale) and the softmax applies the scale: one FMA per score. Scales
    // far from 1 keep the natural units, where slope / scale could leave
    // float's range.
    const float scale = variant.m_variant_scale, magnitude = fabsf(scale);
    if (!variant.m_pipe.softcap_on() && magnitude >= 0x1p-60f && magnitude <= 0x1p60f) {
      const float raw_slope = slope / scale;
      for_each_score<MTiles, TilesS>([&](int mt, int n, int e) {
        const float distance = fabsf(base + float(mt * 16 + (e / 2) * 8 - n * 8 - (e & 1)));
        s[mt][n][e] = fmaf(-raw_slope, distance, s[mt][n][e]);
      });
      return scale * kLog2e;
    }
    for_each_score<MTiles, TilesS>([&](int mt, int n, int e) {
      float grad;
      const float distance = fabsf(base + float(mt * 16 + (e / 2) * 8 - n * 8 - (e & 1)));
      s[mt][n][e] = variant.m_pipe.template score_alibi<false>(
          s[mt][n][e] * variant.m_variant_scale, slope, distance, grad);
    });
    return kLog2e;
  }
  // The softcap's run-time test and the per-element bounds test (only
  // where the tile crosses a sequence's end) outside the element loop.
  auto apply = [&](auto inside_test, auto softcap) {
    for_each_score<MTiles, TilesS>([&](int mt, int n, int e) {
      const int row = row0 + mt * 16 + (e / 2) * 8, col = col0 + n * 8 + (e & 1);
      float x = s[mt][n][e] * variant.m_variant_scale;
      if (!decltype(inside_test)::value || (row < seq.seqlen_q && col < seq.seqlen_k)) {
        float grad;
        if constexpr (decltype(softcap)::value)
          x = variant.m_pipe.template softcapped<false>(x, grad);
        x = variant.m_pipe.template modified<false>(seq, b, h, row, col, x, grad);
      }
      s[mt][n][e] = x;
    });
  };
  const bool inside = row_begin + BlockM <= seq.seqlen_q && key_begin + BlockN <= seq.seqlen_k;
  cuda_mma::unswitch2(variant.m_pipe.softcap_on(), inside, [&](auto softcap, auto in) {
    apply(std::integral_constant<bool, !decltype(in)::value>(), softcap);
  });
  return kLog2e;
}

/// Dropout on the probabilities P of a fragment (after the row sums, which
/// take the undropped P): each kept element scaled by 1/(1-p), the others
/// 0, drawn from the counter-based generator every backend shares.
template <class Variant, int MTiles, int TilesS>
KOKKOS_FORCEINLINE_FUNCTION void fwd_variant_dropout(float (&s)[MTiles][TilesS][4],
                                                     const Variant& variant, int b, int h,
                                                     int row0, int key_begin) {
  if (!variant.m_pipe.dropout()) return;
  // A lane's two keys of an 8-key group are a pair (key_begin is even):
  // one draw decides both.
  const int col0 = key_begin + (cuda_mma::lane_id() % 4) * 2;
  const std::uint64_t head = variant.m_pipe.dropout_head(b, h);
#pragma unroll
  for (int r = 0; r < 2 * MTiles; ++r) {
    const std::uint64_t row =
        variant.m_pipe.dropout_row_of(head, row0 + (r / 2) * 16 + (r % 2) * 8);
    const int mt = r / 2, e0 = (r % 2) * 2;
#pragma unroll
    for (int n = 0; n < TilesS; ++n) {
      float keep0, keep1;
      variant.m_pipe.keep_factors(row, col0 + n * 8, keep0, keep1);
      s[mt][n][e0] *= keep0;
      s[mt][n][e0 + 1] *= keep1;
    }
  }
}

/// The scores of S at masked (row, key) positions set to `value`. Called
/// under one test of the tile's needs_mask, so that a tile with no masked
/// element runs no per-element test: a test inside the elements' loop
/// became a branch (and a convergence barrier) per element where registers
/// were short. Each row's visible keys are taken once
/// (AttentionMask::visible_keys) and moved to this lane's columns, so that
/// a score costs a compare of its column (a constant of the unrolled loop)
/// and a select, two where a left window bounds the keys too.
template <int MTiles, int TilesS>
KOKKOS_FORCEINLINE_FUNCTION void fwd_mask_scores(float (&s)[MTiles][TilesS][4],
                                                 const AttentionMask& mask, int row0,
                                                 int key_begin, float value) {
  const int lane = cuda_mma::lane_id();
  const int col0 = key_begin + (lane % 4) * 2;
  int first[2 * MTiles], last[2 * MTiles];
#pragma unroll
  for (int r = 0; r < 2 * MTiles; ++r) {
    mask.visible_keys(row0 + (r / 2) * 16 + (r % 2) * 8, first[r], last[r]);
    first[r] -= col0;
    last[r] -= col0;
  }
  if (mask.has_left()) {
    for_each_score<MTiles, TilesS>([&](int mt, int n, int e) {
      const int c = n * 8 + (e & 1), r = 2 * mt + e / 2;
      if (c < first[r] || c > last[r]) s[mt][n][e] = value;
    });
  } else {
    for_each_score<MTiles, TilesS>([&](int mt, int n, int e) {
      if (n * 8 + (e & 1) > last[2 * mt + e / 2]) s[mt][n][e] = value;
    });
  }
}

/// Scale (base 2), mask, online softmax in registers: S becomes P and the
/// running max and sum move on; `alpha` receives the factors O must be
/// rescaled by (fwd_rescale), kept apart for a pipeline whose O is still
/// being written by the tensor cores. `needs_mask`: whether the tile may
/// hold masked elements (else the element mask is skipped).
/// MaskPerScore: the mask tested inside the loop over the scores, for the
/// mma.sync forward at head_dim 128 and up: at 255 registers, the separate
/// mask pass makes it spill more and run slower there (at 64 the separate
/// pass is the faster).
template <bool MaskPerScore = false, int MTiles, int TilesS>
KOKKOS_FORCEINLINE_FUNCTION void fwd_softmax_scores(float (&s)[MTiles][TilesS][4],
                                                    float (&row_max)[2 * MTiles],
                                                    float (&row_sum)[2 * MTiles],
                                                    float (&alpha)[2 * MTiles],
                                                    const AttentionMask& mask, bool needs_mask,
                                                    float scale_log2, int row0, int key_begin) {
  using namespace cuda_mma;
  constexpr int kRows = 2 * MTiles;
  float block_max[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) block_max[r] = row_max[r];
  if constexpr (MaskPerScore) {
    // Written out (not with for_each_score): this form keeps that kernel's
    // SASS identical to the tuned one.
    const int lane = lane_id();
#pragma unroll
    for (int mt = 0; mt < MTiles; ++mt)
#pragma unroll
      for (int n = 0; n < TilesS; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = row0 + mt * 16 + (e / 2) * 8;
          const int col = key_begin + n * 8 + (lane % 4) * 2 + (e & 1);
          float x = s[mt][n][e] * scale_log2;
          if (needs_mask && mask.masked(row, col)) x = -INFINITY;
          s[mt][n][e] = x;
          block_max[2 * mt + e / 2] = fmaxf(block_max[2 * mt + e / 2], x);
        }
  } else {
    for_each_score<MTiles, TilesS>([&](int mt, int n, int e) { s[mt][n][e] *= scale_log2; });
    if (needs_mask) fwd_mask_scores(s, mask, row0, key_begin, -INFINITY);
    for_each_score<MTiles, TilesS>([&](int mt, int n, int e) {
      block_max[2 * mt + e / 2] = fmaxf(block_max[2 * mt + e / 2], s[mt][n][e]);
    });
  }
  float shift[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    block_max[r] = fmaxf(block_max[r], shfl_xor(block_max[r], 1));
    block_max[r] = fmaxf(block_max[r], shfl_xor(block_max[r], 2));
    // A row whose every score so far is masked keeps max -inf: shift by
    // 0 so exp2(-inf - shift) = 0 instead of NaN.
    shift[r] = block_max[r] == -INFINITY ? 0.f : block_max[r];
    alpha[r] = row_max[r] == -INFINITY ? 0.f : exp2_fast(row_max[r] - shift[r]);
    row_max[r] = block_max[r];
  }
  float block_sum[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) block_sum[r] = 0;
  for_each_score<MTiles, TilesS>([&](int mt, int n, int e) {
    const float p = exp2_fast(s[mt][n][e] - shift[2 * mt + e / 2]);
    s[mt][n][e] = p;
    block_sum[2 * mt + e / 2] += p;
  });
#pragma unroll
  for (int r = 0; r < kRows; ++r) row_sum[r] = alpha[r] * row_sum[r] + block_sum[r];
}

/// fwd_softmax_scores with the scale folded into the exponent's FFMA: the
/// row max is taken on the raw scores (their minimum where the scale is
/// negative), so each score costs exp2(fma(s, scale, -shift)) instead of a
/// multiply, a max and a subtract (FlashAttention-3's form). Same results
/// up to rounding of the product.
template <bool PositiveScale, int MTiles, int TilesS>
KOKKOS_FORCEINLINE_FUNCTION void fwd_softmax_scores_folded_impl(
    float (&s)[MTiles][TilesS][4], float (&row_max)[2 * MTiles], float (&row_sum)[2 * MTiles],
    float (&alpha)[2 * MTiles], const AttentionMask& mask, bool needs_mask, float scale_log2,
    int row0, int key_begin) {
  using namespace cuda_mma;
  constexpr int kRows = 2 * MTiles;
  constexpr float kMasked = PositiveScale ? -INFINITY : INFINITY;
  float raw_best[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) raw_best[r] = kMasked;
  if (needs_mask) fwd_mask_scores(s, mask, row0, key_begin, kMasked);
  for_each_score<MTiles, TilesS>([&](int mt, int n, int e) {
    const float x = s[mt][n][e];
    raw_best[2 * mt + e / 2] = PositiveScale ? fmaxf(raw_best[2 * mt + e / 2], x)
                                             : fminf(raw_best[2 * mt + e / 2], x);
  });
  float shift[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    float best = raw_best[r];
    best = PositiveScale ? fmaxf(best, shfl_xor(best, 1)) : fminf(best, shfl_xor(best, 1));
    best = PositiveScale ? fmaxf(best, shfl_xor(best, 2)) : fminf(best, shfl_xor(best, 2));
    // In base-2 scaled units; a row masked so far keeps -inf (shift 0).
    const float block_max = fmaxf(row_max[r], best * scale_log2);
    shift[r] = block_max == -INFINITY ? 0.f : block_max;
    alpha[r] = row_max[r] == -INFINITY ? 0.f : exp2_fast(row_max[r] - shift[r]);
    row_max[r] = block_max;
  }
  float block_sum[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) block_sum[r] = 0;
  for_each_score<MTiles, TilesS>([&](int mt, int n, int e) {
    const float p = exp2_fast(fmaf(s[mt][n][e], scale_log2, -shift[2 * mt + e / 2]));
    s[mt][n][e] = p;
    block_sum[2 * mt + e / 2] += p;
  });
#pragma unroll
  for (int r = 0; r < kRows; ++r) row_sum[r] = alpha[r] * row_sum[r] + block_sum[r];
}

template <int MTiles, int TilesS>
KOKKOS_FORCEINLINE_FUNCTION void fwd_softmax_scores_folded(
    float (&s)[MTiles][TilesS][4], float (&row_max)[2 * MTiles], float (&row_sum)[2 * MTiles],
    float (&alpha)[2 * MTiles], const AttentionMask& mask, bool needs_mask, float scale_log2,
    int row0, int key_begin) {
  if (scale_log2 > 0)
    fwd_softmax_scores_folded_impl<true>(s, row_max, row_sum, alpha, mask, needs_mask,
                                         scale_log2, row0, key_begin);
  else
    fwd_softmax_scores_folded_impl<false>(s, row_max, row_sum, alpha, mask, needs_mask,
                                          scale_log2, row0, key_begin);
}

/// O rescaled by the factors of fwd_softmax_scores.
template <int MTiles, int TilesO>
KOKKOS_FORCEINLINE_FUNCTION void fwd_rescale(float (&acc_o)[MTiles][TilesO][4],
                                             const float (&alpha)[2 * MTiles]) {
#pragma unroll
  for (int mt = 0; mt < MTiles; ++mt)
#pragma unroll
    for (int n = 0; n < TilesO; ++n) {
      acc_o[mt][n][0] *= alpha[2 * mt];
      acc_o[mt][n][1] *= alpha[2 * mt];
      acc_o[mt][n][2] *= alpha[2 * mt + 1];
      acc_o[mt][n][3] *= alpha[2 * mt + 1];
    }
}

/// One online-softmax step: fwd_softmax_scores, then O rescaled.
template <bool MaskPerScore = false, int MTiles, int TilesS, int TilesO>
KOKKOS_FORCEINLINE_FUNCTION void fwd_softmax_update(
    float (&s)[MTiles][TilesS][4], float (&acc_o)[MTiles][TilesO][4],
    float (&row_max)[2 * MTiles], float (&row_sum)[2 * MTiles], const AttentionMask& mask,
    bool needs_mask, float scale_log2, int row0, int key_begin) {
  float alpha[2 * MTiles];
  fwd_softmax_scores<MaskPerScore>(s, row_max, row_sum, alpha, mask, needs_mask, scale_log2,
                                   row0, key_begin);
  fwd_rescale(acc_o, alpha);
}

/// O = acc_o / row_sum in the operand format, lse = ln(sum) + max (natural
/// log). `gO`: row 0 of this (batch, head) in O, rows `row_stride` apart;
/// `g_lse`: its lse row. Rows at or past `seqlen_q` are not stored.
template <class Format, int MTiles, int TilesO>
KOKKOS_FORCEINLINE_FUNCTION void fwd_write_output(const float (&acc_o)[MTiles][TilesO][4],
                                                  const float (&row_max)[2 * MTiles],
                                                  float (&row_sum)[2 * MTiles], int row0,
                                                  int seqlen_q, std::uint16_t* gO,
                                                  long row_stride, float* g_lse) {
  using namespace cuda_mma;
  constexpr int kRows = 2 * MTiles;
  const int lane = lane_id();
  quad_sums(row_sum);
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int mt = r / 2, half = r % 2;
    const int row = row0 + mt * 16 + half * 8;
    if (row >= seqlen_q) continue;
    // A row that saw no key has sum 0: O = 0, lse = -inf. A NaN sum (a
    // non-finite input reached the row) stays NaN in O and lse.
    const float inv = row_sum[r] == 0.f ? 0.f : 1.f / row_sum[r];
    std::uint16_t* o_row = gO + row * row_stride;
#pragma unroll
    for (int n = 0; n < TilesO; ++n) {
      const int d = n * 8 + (lane % 4) * 2;
      *reinterpret_cast<std::uint32_t*>(o_row + d) =
          pack2<Format>(acc_o[mt][n][2 * half] * inv, acc_o[mt][n][2 * half + 1] * inv);
    }
    if (lane % 4 == 0) {
      g_lse[row] = row_sum[r] == 0.f ? -INFINITY
                                     : (row_max[r] + log2f(row_sum[r])) * 0.6931471805599453f;
    }
  }
}

}  // namespace Impl
}  // namespace kfa

#endif
