#ifndef KFA_DETAIL_BACKEND_CUDA_BACKWARD_SCORE_FRAGMENT_HPP
#define KFA_DETAIL_BACKEND_CUDA_BACKWARD_SCORE_FRAGMENT_HPP

// Pᵀ and dSᵀ of a 16-bit backward's Sᵀ fragment: a warp's 16 keys (rows)
// by 8·Tiles queries (columns) in the m16n8 accumulator layout, which is
// also a warp's share of a wgmma m64 accumulator. A lane holds keys key0
// and key0 + 8 (element e of n-tile n: key key0 + 8·(e / 2)) and queries
// row_begin + 8·n + 2·(lane % 4) + (e & 1). The wgmma backwards and the
// mma_sync backward compute their probabilities and a variant's P and dS
// here.

#include <kfa/detail/attention/mask.hpp>
#include <kfa/detail/attention/variant.hpp>

#include <kfa/detail/backend/cuda/primitives/mma.hpp>

#include <cstdint>
#include <type_traits>

namespace kfa {
namespace Impl {

/// The queries that see each of a lane's two keys key0 and key0 + 8 in a
/// backward's Sᵀ fragment, [first[r], last[r]] (AttentionMask::visible_rows;
/// rows past seqlen_q see none), moved to the lane's columns (row_of_lane:
/// its first query), so that an element's mask test compares a constant.
template <class Mask>
KOKKOS_FORCEINLINE_FUNCTION void bwd_visible_columns(const Mask& mask, int row_of_lane, int key0,
                                                     int (&first)[2], int (&last)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mask.visible_rows(key0 + 8 * r, first[r], last[r]);
    first[r] -= row_of_lane;
    last[r] -= row_of_lane;
  }
}

/// Pᵀ = exp2(Sᵀ·scale·log2e - lse·log2e) in place in a backward's
/// Sᵀ fragment (rows: the keys key0 and key0 + 8 of this lane;
/// columns: queries row_begin + 8·n + 2·(lane % 4) + (e & 1), whose lse
/// is s_lse[column]), 0 where the mask hides the pair; then(n, e, column)
/// after each value (dSᵀ where it is computed in the same pass). The tile
/// of queries [row_begin, +8·Tiles) and keys [key_begin, key_end) is
/// tested against the mask once (unswitch_mask).
template <int Tiles, class Mask, class Then>
KOKKOS_FORCEINLINE_FUNCTION void bwd_probabilities(float (&s)[Tiles][4], const float* s_lse,
                                                   float scale, const Mask& mask, int row_begin,
                                                   int key_begin, int key_end, int key0, int lane,
                                                   Then&& then) {
  constexpr float kLog2e = 1.4426950408889634f;
  const bool needs_mask =
      mask.tile_needs_mask(row_begin, row_begin + 8 * Tiles, key_begin, key_end);
  const float scale_log2 = scale * kLog2e;
  cuda_mma::unswitch_mask(needs_mask, [&](auto masked) {
    // Where masked: a value costs two compares of constants and a select.
    int first[2] = {0, 0}, last[2] = {0, 0};
    if constexpr (decltype(masked)::value)
      bwd_visible_columns(mask, row_begin + (lane % 4) * 2, key0, first, last);
#pragma unroll
    for (int n = 0; n < Tiles; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = n * 8 + (lane % 4) * 2 + (e & 1);
        float p = cuda_mma::exp2_fast(fmaf(s[n][e], scale_log2, -s_lse[col] * kLog2e));
        if constexpr (decltype(masked)::value) {
          const int c = n * 8 + (e & 1), r = e / 2;
          if (c < first[r] || c > last[r]) p = 0.f;
        }
        s[n][e] = p;
        then(n, e, col);
      }
  });
}

/// Keep bits of a thread's Tiles·4 elements (bit 4·n + e), for the second
/// half of a variant's backward softmax.
template <int Tiles>
struct BwdKeepBits {
  std::uint32_t bits[(Tiles * 4 + 31) / 32];
  KOKKOS_FORCEINLINE_FUNCTION bool kept(int n, int e) const {
    const int i = 4 * n + e;
    return (bits[i / 32] >> (i % 32)) & 1u;
  }
};

/// A variant's Pᵀ and dSᵀ in a 16-bit backward's Sᵀ fragment,
/// from the unscaled products Sᵀ, each query's lse and D, and the variant's
/// pipeline, with P = exp(pipeline(s) - lse) and Z the dropout mask:
/// - Fused (Sᵀ and dPᵀ both in): st <- Pᵀ ∘ Z/(1-p) (for dV), dpt <- dSᵀ =
///   Pᵀ ∘ (dPᵀ ∘ Z/(1-p) - D) ∘ pipeline' (ScorePipeline::p_and_ds's
///   arithmetic); p_frag and keep unused.
/// - else, from Sᵀ alone, so that dV's products start before dPᵀ is in
///   (kEarlyDv): p_frag <- Pᵀ ∘ Z/(1-p) rounded to Format (dV's A operand;
///   p_frag[kk] holds query columns 16·kk..), st <- Pᵀ ∘ pipeline' and keep
///   <- Z; bwd_variant_ds then finishes dSᵀ.
/// P is 0 (and so dS, whatever the pipeline's derivative) where the mask
/// hides the pair, past the sequences' ends and in rows that saw no key.
/// Layout as in bwd_probabilities.
template <bool Fused, class Format, int Tiles, class Variant>
KOKKOS_FORCEINLINE_FUNCTION void bwd_variant_p(
    float (&st)[Tiles][4], float (&dpt)[Tiles][4], std::uint32_t (&p_frag)[Tiles / 2][4],
    BwdKeepBits<Tiles>& keep, const float* s_lse, const float* s_delta,
    const Variant& variant, const AttentionMask& mask, int b, int h, int row_begin,
    int key_begin, int key_end, int key0, int lane) {
  constexpr float kLog2e = 1.4426950408889634f;
  const auto& pipe = variant.m_pipe;
  using Pipe = std::decay_t<decltype(pipe)>;
  const SequenceInfo seq = Variant::sequence(mask, b);
  const int row_end = row_begin + 8 * Tiles;
  const int row_of_lane = row_begin + (lane % 4) * 2;
  auto put = [&](int n, int e, float dropped, float p_grad, float ds) {
    if constexpr (Fused) {
      st[n][e] = dropped;
      dpt[n][e] = ds;
    } else {
      // The masked elements and hidden tiles: st, and e's half of the
      // p_frag pair that holds elements e & ~1 and e | 1.
      st[n][e] = p_grad;
      std::uint32_t& pair = p_frag[n / 2][(n % 2) * 2 + e / 2];
      const std::uint32_t bits = cuda_mma::pack2<Format>(dropped, dropped);
      pair = (e & 1) ? (pair & 0xffffu) | (bits & 0xffff0000u)
                     : (pair & 0xffff0000u) | (bits & 0xffffu);
    }
  };
  if constexpr (!Fused) {
#pragma unroll
    for (int w = 0; w < (Tiles * 4 + 31) / 32; ++w) keep.bits[w] = 0;
  }
  // A tile the modifier's block predicate hides has P = dS = 0.
  if (!pipe.visible(b, h, row_begin, imin(row_end, seq.seqlen_q), key_begin,
                    imin(key_end, seq.seqlen_k))) {
#pragma unroll
    for (int n = 0; n < Tiles; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) put(n, e, 0.f, 0.f, 0.f);
    return;
  }
  // A user modifier is called only inside both sequences (the forward's
  // promise): on tiles that cross an end, only for the unmasked elements.
  const bool inside = row_end <= seq.seqlen_q && key_end <= seq.seqlen_k;
  // The mask: taken after the element loop, on the tiles that need it.
  const bool needs_mask = !inside || mask.tile_needs_mask(row_begin, row_end, key_begin, key_end);
  // kfa::alibi: distances from one integer per lane and a constant per
  // element (ScorePipeline::score_alibi).
  [[maybe_unused]] const float slope = pipe.alibi_slope(b, h);
  [[maybe_unused]] const float base = float(row_of_lane + seq.seqlen_k - seq.seqlen_q - key0);
  // Dropout: lanes l and l ^ 4 hold keys 2m and 2m + 1 of the same
  // queries, whose keep bits are one draw (DropoutGenerator::pair_bits):
  // each lane draws for one of its two queries and swaps with its partner.
  const int parity = key0 & 1;
  const std::uint64_t dropout_head = pipe.dropout() ? pipe.dropout_head(b, h) : 0;

  // A tile the modifier promises to leave unchanged skips its calls: a
  // uniform branch, not a third copy of the element loop, which ptxas
  // cannot fit in the head_dim 256 product-split kernel's registers.
  [[maybe_unused]] const bool modify =
      !(Pipe::kScoreMod && !Pipe::kAlibi) ||
      !pipe.unchanged(b, h, row_begin, imin(row_end, seq.seqlen_q), key_begin,
                      imin(key_end, seq.seqlen_k));
  auto elements = [&](auto softcap, auto dropout, auto call_test) {
    constexpr bool kSoftcap = decltype(softcap)::value, kDropout = decltype(dropout)::value;
#pragma unroll
    for (int n = 0; n < Tiles; ++n) {
      std::uint32_t pair[2][2] = {{0u, 0u}, {0u, 0u}};  // [key r][query e & 1]
      [[maybe_unused]] float dropped_even = 0.f;
      if constexpr (kDropout) {
        const std::uint32_t row = static_cast<std::uint32_t>(
            Pipe::dropout_row_of(dropout_head, row_of_lane + n * 8 + parity));
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const std::uint32_t mine = DropoutGenerator::pair_bits(row, (key0 + 8 * r) >> 1);
          const std::uint32_t other = cuda_mma::shfl_xor(mine, 4);
          pair[r][parity] = mine;
          pair[r][1 - parity] = other;
        }
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = n * 8 + (e & 1), col = c + (lane % 4) * 2, r = e / 2;
        const float lse = s_lse[col];
        float x = st[n][e] * variant.m_variant_scale, grad = 1.f;
        if constexpr (kSoftcap) x = pipe.template softcapped<true>(x, grad);
        if constexpr (Pipe::kAlibi) {
          x -= slope * fabsf(base + float(c - 8 * r));
        } else if constexpr (Pipe::kScoreMod) {
          if (modify &&
              (!decltype(call_test)::value || !mask.masked(row_begin + col, key0 + 8 * r)))
            x = pipe.template modified<true>(seq, b, h, row_begin + col, key0 + 8 * r, x, grad);
        }
        float p = cuda_mma::exp2_fast(fmaf(x, kLog2e, -lse * kLog2e));
        if (lse == -INFINITY) p = 0.f;
        float z = 1.f;
        if constexpr (kDropout) {
          const bool kept = pipe.kept_bits(pair[r][e & 1], key0);
          z = kept ? pipe.keep_scale() : 0.f;
          if constexpr (!Fused)
            keep.bits[(4 * n + e) / 32] |= std::uint32_t(kept) << ((4 * n + e) % 32);
        }
        const float p_grad = p == 0.f ? 0.f : p * grad;
        if constexpr (Fused) {
          put(n, e, p * z, p_grad, p_grad * (dpt[n][e] * z - s_delta[col]));
        } else {
          st[n][e] = p_grad;
          if (e & 1)
            p_frag[n / 2][(n % 2) * 2 + e / 2] = cuda_mma::pack2<Format>(dropped_even, p * z);
          else
            dropped_even = p * z;
        }
      }
    }
  };
  auto with_test = [&](auto softcap, auto dropout) {
    if (Pipe::kScoreMod && !Pipe::kAlibi && !inside && modify)
      elements(softcap, dropout, std::true_type());
    else
      elements(softcap, dropout, std::false_type());
  };
  cuda_mma::unswitch2(pipe.softcap_on(), pipe.dropout(), with_test);
  if (needs_mask) {
    int first[2], last[2];
    bwd_visible_columns(mask, row_of_lane, key0, first, last);
#pragma unroll
    for (int n = 0; n < Tiles; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = n * 8 + (e & 1), r = e / 2;
        if (c < first[r] || c > last[r]) put(n, e, 0.f, 0.f, 0.f);
      }
  }
}

/// The second half after bwd_variant_p<false>: dSᵀ = st ∘ (dPᵀ ∘
/// Z/(1-p) - D) into ds (which may be st), dPᵀ's element (n, e) from
/// dp(n, e).
template <int Tiles, class Variant, class Dp>
KOKKOS_FORCEINLINE_FUNCTION void bwd_variant_ds(const float (&st)[Tiles][4], float (&ds)[Tiles][4],
                                                Dp&& dp, const BwdKeepBits<Tiles>& keep,
                                                const float* s_delta, const Variant& variant,
                                                int lane) {
  auto tile = [&](auto dropout) {
#pragma unroll
    for (int n = 0; n < Tiles; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = n * 8 + (lane % 4) * 2 + (e & 1);
        float x = dp(n, e);
        if constexpr (decltype(dropout)::value)
          x = keep.kept(n, e) ? x * variant.m_pipe.keep_scale() : 0.f;
        ds[n][e] = st[n][e] * (x - s_delta[col]);
      }
  };
  if (variant.m_pipe.dropout())
    tile(std::true_type());
  else
    tile(std::false_type());
}

}  // namespace Impl
}  // namespace kfa

#endif
