#ifndef KFA_DETAIL_BACKEND_CUDA_FORWARD_EXACT_FP32_HPP
#define KFA_DETAIL_BACKEND_CUDA_FORWARD_EXACT_FP32_HPP

// Exact fp32 forward on the CUDA backend (no tf32): S on the fp64 tensor
// cores (sm_90+; exact products, fp64 sums, rounded once to fp32) while
// P·V runs on fp32 FMAs, so the two pipes of equal rate work side by side;
// before sm_90 both on FMAs, tiled in registers and laid out for
// shared-memory bandwidth (kfa/detail/backend/cuda/primitives/fma_tiles.hpp).
// A team of 4 warps owns 64 query rows, 16 per warp:
//   S:   cuda_mma::RowProducts: a lane ends with 2 rows by kBlockN/4 keys
//        (the m16n8 accumulator's layout; 4 rows by kBlockN/8 keys from
//        the FMA product).
//   P:   the online softmax in registers (row max and sum reduced with
//        shuffles over the lanes that share a row; each exponential one
//        FFMA and ex2.approx), P written transposed to the warp's own slice
//        of scratch with the rows' rescale factors.
//   O:   lane owns the columns 4·(lane % (head_dim/4)).. of kRowsO of the
//        warp's rows (16 at head_dim 128, 8 at 64): per key one float4 of V
//        (distinct per lane) and kRowsO/4 float4s of P (one address per
//        quarter-warp): 4·kRowsO FMAs per 1 + kRowsO/4 loads, 4 + kRowsO/2
//        wavefronts (before: 4 rows by head_dim/8 columns, 18 wavefronts
//        for 64 FMAs at head_dim 128).
// K and V blocks are double buffered with cp.async (block j+1's copies
// issued after S_j); Q stays in scratch.
// Launched by launch_cuda_team with opt-in shared memory (exact_fp32_block_n,
// exact_fp32_teams_per_sm: three teams per SM with S on DMMA, two on FMAs).

#include <kfa/detail/attention/mask.hpp>
#include <kfa/detail/attention/traits.hpp>

#include <kfa/detail/backend/cuda/primitives/launch.hpp>
#include <kfa/detail/backend/cuda/primitives/mma.hpp>
#include <kfa/detail/backend/cuda/primitives/fma_tiles.hpp>

#include <cstdint>

namespace kfa {
namespace Impl {

/// Keys per K/V block and teams per multiprocessor of the library's shapes.
/// S on the fp64 tensor cores (192 registers at two teams, 160-164 at
/// three): 32 keys at head_dim 64 and 16 at 128, three teams (63 and 73
/// KB; faster than two teams with 64 and 32 keys). S on
/// fp32 FMAs (234-254 registers): 64 and 32 keys, two teams (104, 110 KB).
template <int HeadDim, bool DmmaScores = exact_fp32_dmma_scores()>
constexpr int exact_fp32_block_n() {
  return (HeadDim <= 64 ? 64 : 32) / (DmmaScores ? 2 : 1);
}
template <bool DmmaScores = exact_fp32_dmma_scores()>
constexpr int exact_fp32_teams_per_sm() {
  return DmmaScores ? 3 : 2;
}

/// FastExp: the exponentials as one FFMA and ex2.approx (log2 e folded into
/// the shift; relative error 2^-22, as expf's 2 ulp) instead of expf's nine
/// instructions; false is bench_device's variant exact_fp32_expf.
/// DmmaScores: S on the fp64 tensor cores (cuda_mma::dmma_row_products:
/// exact products, fp64 sums), beside P·V on the FMA pipe; the default
/// where the build has fp64 m16n8k8 (sm_90+), false is bench_device's
/// variant exact_fp32_ffma (S by fp32 FMAs, exact_fp32_row_products).
template <class ExecSpace, int HeadDim, class QView, class KView, class VView, class OView,
          class LseView, int BlockN = exact_fp32_block_n<HeadDim>(),
          int MinBlocksPerSM = exact_fp32_teams_per_sm(), bool FastExp = true,
          bool DmmaScores = exact_fp32_dmma_scores(), class VariantT = PlainVariant>
class FlashForwardExactFp32Kernel
    : public FusedForwardOperands<float>,
      public FusedVariantParams<VariantT, float>,
      public FusedTeamLaunch<FlashForwardExactFp32Kernel<ExecSpace, HeadDim, QView, KView, VView,
                                                         OView, LseView, BlockN, MinBlocksPerSM,
                                                         FastExp, DmmaScores, VariantT>> {
 public:
  static constexpr const char* kLabel = "kfa::fwd::exact_fp32_main_loop";
  using variant_params = FusedVariantParams<VariantT, float>;
  static constexpr bool kVariant = variant_params::kVariant;
  static constexpr int kHeadDim = HeadDim;
  static constexpr int kWarps = 4;
  static constexpr int kMinBlocksPerSM = MinBlocksPerSM;
  static constexpr int kStages = 2;
  static constexpr int kBlockM = 64;     // 16 row groups of 4
  static constexpr int kBlockN = BlockN;  // keys per K/V block
  // S = Q·K_jᵀ: a lane's kScoreRows rows by kScoreKeys keys.
  using Scores = cuda_mma::RowProducts<DmmaScores, HeadDim, BlockN>;
  static constexpr int kScoreRows = Scores::kRows;
  static constexpr int kScoreKeys = Scores::kCols;
  static constexpr int kChunks = kHeadDim / 4;             // float4s per Q, K, V, O row
  static constexpr int kRowsO = 16 * kChunks / 32;         // a lane's O rows
  static constexpr int kPitch = kHeadDim + Scores::kPad;   // floats per Q, K, V row
  static constexpr int kPitchP = kBlockM + 4;              // floats per Pᵀ row
  static_assert(kHeadDim == 64 || kHeadDim == 128,
                "kfa: the exact fp32 forward's O tile needs head_dim 64 or 128");
  static_assert(kBlockN % 8 == 0, "kfa: the exact fp32 forward streams multiples of 8 keys");

  FlashForwardExactFp32Kernel(const QView& q, const KView& k, const VView& v, const OView& o,
                              const LseView& lse, float scale, FusedWindow window,
                              const variant_params& variant = variant_params())
      : FusedForwardOperands(q, k, v, o, lse, scale, window, kBlockM), variant_params(variant) {}

  /// Q, K and V per stage, Pᵀ and one row of per-row factors.
  KOKKOS_INLINE_FUNCTION static constexpr std::size_t scratch_bytes() {
    return cuda_mma::aligned_scratch_bytes(
        sizeof(float) * (std::size_t(kBlockM + 2 * kStages * kBlockN) * kPitch +
                         std::size_t(kBlockN + 1) * kPitchP));
  }

  template <class Team>
  KOKKOS_INLINE_FUNCTION void body(const Team& team, void* raw) const {
#if KFA_CUDA_MMA_DEVICE
    using namespace cuda_mma;
    const int lane = lane_id(), warp = warp_id(), tid = team_thread_id();
    // The block's rows and keys of this lane's scores.
    auto row_of = [&](int i) { return Scores::row(warp, lane, i); };
    auto key_of = [&](int j) { return Scores::col(lane, j); };
    const bool first_of_row = lane % Scores::kLanesPerRow == 0;
    // P·V: rows o_row.., columns o_col..
    const int o_row = 16 * warp + kRowsO * (lane / kChunks), o_col = 4 * (lane % kChunks);

    const FusedQueryTile team_tile = this->query_tile(team.league_rank(), kBlockM);
    if (team_tile.empty()) return;
    const int b = team_tile.b, h = team_tile.h, row_begin = team_tile.row_begin;
    const FusedSeq sq = team_tile.sq;
    const long row_stride = long(m_p.heads) * kHeadDim, kv_stride = m_kv.row_stride(kHeadDim);
    const float* gQ = m_q + m_p.q_offset(sq, h, kHeadDim);
    const float* gK = m_k + m_kv.offset(m_p, sq, h, kHeadDim);
    const float* gV = m_v + m_kv.offset(m_p, sq, h, kHeadDim);
    float* const sQ = aligned_scratch<float>(raw);
    float* const sP = sQ + (kBlockM + 2 * kStages * kBlockN) * kPitch;
    float* const sF = sP + kBlockN * kPitchP;  // a factor per row (rescale, then 1/sum)
    auto sK = [&](int stage) { return sQ + (kBlockM + 2 * stage * kBlockN) * kPitch; };
    auto sV = [&](int stage) { return sK(stage) + kBlockN * kPitch; };

    auto load_tile = [&](float* dst, const float* src, long stride, int first_row,
                         int rows_total, int rows) {
      load_rows_async<kHeadDim, kPitch>(dst, src, stride, first_row, rows, rows_total, tid,
                                        kWarps * 32);
    };
    auto load_kv = [&](int kv_block) {
      const int stage = kv_block % kStages;
      load_tile(sK(stage), gK, kv_stride, kv_block * kBlockN, sq.seqlen_k, kBlockN);
      load_tile(sV(stage), gV, kv_stride, kv_block * kBlockN, sq.seqlen_k, kBlockN);
    };

    const int rows = imin(kBlockM, sq.seqlen_q - row_begin);
    // The key blocks inside the mask's window (AttentionMask::key_blocks).
    int first_kv_block, end_kv_block;
    team_tile.key_blocks(rows, kBlockN, first_kv_block, end_kv_block, *this);
    // A variant's sequence lengths and dropout key of this head.
    [[maybe_unused]] SequenceInfo seq{};
    [[maybe_unused]] std::uint64_t dropout_head = 0;
    if constexpr (kVariant) {
      seq = variant_params::sequence(sq.mask, b);
      if (this->m_pipe.dropout()) dropout_head = this->m_pipe.dropout_head(b, h);
    }

    float acc_o[kRowsO][4];
#pragma unroll
    for (int i = 0; i < kRowsO; ++i)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc_o[i][c] = 0.f;
    float row_max[kScoreRows], row_sum[kScoreRows];
#pragma unroll
    for (int i = 0; i < kScoreRows; ++i) row_max[i] = -INFINITY, row_sum[i] = 0.f;

    load_tile(sQ, gQ, row_stride, row_begin, sq.seqlen_q, kBlockM);
    if (first_kv_block < end_kv_block) load_kv(first_kv_block);
    cp_async_commit();
    for (int kv_block = first_kv_block; kv_block < end_kv_block; ++kv_block) {
      const int key_begin = kv_block * kBlockN;
      const float* k_tile = sK(kv_block % kStages);
      const float* v_tile = sV(kv_block % kStages);
      cp_async_wait<0>();
      // K_j and V_j (and Q) are in scratch for every warp, and every warp is
      // done with block j-1, whose stage block j+1 now reuses.
      team.team_barrier();

      // S = Q·K_jᵀ: rows row_of(i), keys key_of(j).
      float s[kScoreRows][kScoreKeys];
      Scores::products(s, sQ, k_tile, warp, lane);
      // Block j+1's copies, into the stage block j-1 used, issued between
      // the S and the P·V products rather than in a burst right after the
      // barrier, where they would delay the first S loads.
      if (kv_block + 1 < end_kv_block) load_kv(kv_block + 1);
      cp_async_commit();

      // Scale, mask, online softmax; Scores::kLanesPerRow lanes share a row.
      const bool needs_mask =
          sq.mask.tile_needs_mask(row_begin, row_begin + kBlockM, key_begin, key_begin + kBlockN);
      // A variant: the modifier's block predicate may hide the whole tile.
      // `modify` false: the modifier leaves the tile unchanged.
      [[maybe_unused]] bool visible = true, modify = true;
      if constexpr (kVariant) {
        visible = this->m_pipe.visible(b, h, row_begin, row_begin + rows, key_begin,
                                       imin(key_begin + kBlockN, seq.seqlen_k));
        modify = !this->m_pipe.unchanged(b, h, row_begin, row_begin + rows, key_begin,
                                         imin(key_begin + kBlockN, seq.seqlen_k));
      }
      float alpha[kScoreRows];
#pragma unroll
      for (int i = 0; i < kScoreRows; ++i) {
        float block_max = row_max[i];
#pragma unroll
        for (int j = 0; j < kScoreKeys; ++j) {
          float x;
          if constexpr (kVariant) {
            // pipeline(scale·s) inside the sequence; the mask after it.
            const int row = row_begin + row_of(i), col = key_begin + key_of(j);
            x = s[i][j] * this->m_variant_scale;
            if (row < seq.seqlen_q && col < seq.seqlen_k) {
              float grad;
              x = this->m_pipe.template score<false>(seq, b, h, row, col, x, grad, modify);
            }
            if (!visible) x = -INFINITY;
          } else {
            x = s[i][j] * m_scale;
          }
          if (needs_mask && sq.mask.masked(row_begin + row_of(i), key_begin + key_of(j)))
            x = -INFINITY;
          s[i][j] = x;
          block_max = fmaxf(block_max, x);
        }
#pragma unroll
        for (int m = 1; m < Scores::kLanesPerRow; m *= 2)
          block_max = fmaxf(block_max, shfl_xor(block_max, m));
        // A row whose every score so far is masked keeps max -inf: shift by
        // 0 so exp(-inf - shift) = 0 instead of NaN.
        const float shift = block_max == -INFINITY ? 0.f : block_max;
        alpha[i] = row_max[i] == -INFINITY ? 0.f : exp_of(row_max[i] - shift);
        row_max[i] = block_max;
        const float shift2 = shift * kLog2e;
        float block_sum = 0.f;
#pragma unroll
        for (int j = 0; j < kScoreKeys; ++j) {
          s[i][j] = FastExp ? exp2_fast(fmaf(s[i][j], kLog2e, -shift2)) : expf(s[i][j] - shift);
          block_sum += s[i][j];
        }
        row_sum[i] = alpha[i] * row_sum[i] + block_sum;
        // Dropout on P after the row sum, which takes the undropped P.
        if constexpr (kVariant) {
          if (this->m_pipe.dropout()) {
            const std::uint64_t row_key =
                this->m_pipe.dropout_row_of(dropout_head, row_begin + row_of(i));
#pragma unroll
            for (int j = 0; j < kScoreKeys; ++j)
              s[i][j] *= this->m_pipe.keep_factor(row_key, key_begin + key_of(j));
          }
        }
      }
      // Pᵀ and the rescale factors into this warp's columns of scratch
      // (rows 16·warp.. belong to it); kPitchP keeps both layouts' stores
      // free of bank conflicts.
#pragma unroll
      for (int j = 0; j < kScoreKeys; ++j) {
        if constexpr (kScoreRows != 4) {
#pragma unroll
          for (int i = 0; i < kScoreRows; ++i) sP[key_of(j) * kPitchP + row_of(i)] = s[i][j];
        } else {
          *reinterpret_cast<float4*>(sP + key_of(j) * kPitchP + row_of(0)) =
              make_float4(s[0][j], s[1][j], s[2][j], s[3][j]);
        }
      }
      store_row_factors(sF, alpha, row_of, first_of_row);
      // The warp's Pᵀ slice is visible to its lanes (no other warp reads it).
      __syncwarp();
      scale_rows(acc_o, sF + o_row);

      // O += P·V_j: per key, kRowsO rows of P and this lane's 4 columns of V.
#pragma unroll 4
      for (int key = 0; key < kBlockN; ++key) {
        const float4 vv = *reinterpret_cast<const float4*>(v_tile + key * kPitch + o_col);
#pragma unroll
        for (int i4 = 0; i4 < kRowsO / 4; ++i4) {
          const float4 p = *reinterpret_cast<const float4*>(sP + key * kPitchP + o_row + 4 * i4);
          const float pr[4] = {p.x, p.y, p.z, p.w};
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            float* acc = acc_o[4 * i4 + i];
            acc[0] = fmaf(pr[i], vv.x, acc[0]);
            acc[1] = fmaf(pr[i], vv.y, acc[1]);
            acc[2] = fmaf(pr[i], vv.z, acc[2]);
            acc[3] = fmaf(pr[i], vv.w, acc[3]);
          }
        }
      }
      // Every lane is done reading the warp's Pᵀ and factors before the next
      // block's.
      __syncwarp();
    }
    cp_async_wait<0>();

    // lse = max + ln(sum) by the softmax's lanes, 1/sum through scratch to
    // the lanes holding the rows of O.
    float inv[kScoreRows];
#pragma unroll
    for (int i = 0; i < kScoreRows; ++i) {
      float sum = row_sum[i];
#pragma unroll
      for (int m = 1; m < Scores::kLanesPerRow; m *= 2) sum += shfl_xor(sum, m);
      // Sum 0: no key (O = 0, lse = -inf); a NaN sum stays NaN.
      inv[i] = sum == 0.f ? 0.f : 1.f / sum;
      const int row = row_begin + row_of(i);
      if (first_of_row && row < sq.seqlen_q)
        m_lse[m_p.lse_offset(sq, h) + row] = sum == 0.f ? -INFINITY : row_max[i] + logf(sum);
    }
    store_row_factors(sF, inv, row_of, first_of_row);
    __syncwarp();
    scale_rows(acc_o, sF + o_row);
    float* const gO = m_o + m_p.q_offset(sq, h, kHeadDim);
#pragma unroll
    for (int i = 0; i < kRowsO; ++i) {
      const int row = row_begin + o_row + i;
      if (row < sq.seqlen_q)
        *reinterpret_cast<float4*>(gO + row * row_stride + o_col) =
            make_float4(acc_o[i][0], acc_o[i][1], acc_o[i][2], acc_o[i][3]);
    }
#else
    (void)team;
    (void)raw;
#endif
  }

 private:
  static constexpr float kLog2e = 1.4426950408889634f;

#if KFA_CUDA_MMA_DEVICE
  /// A factor per score row into the row-indexed scratch row sF, by the
  /// first lane of each row.
  template <class RowOf>
  KOKKOS_FORCEINLINE_FUNCTION static void store_row_factors(float* sF,
                                                            const float (&factor)[kScoreRows],
                                                            const RowOf& row_of, bool first) {
    if (!first) return;
    if constexpr (kScoreRows == 4) {
      *reinterpret_cast<float4*>(sF + row_of(0)) =
          make_float4(factor[0], factor[1], factor[2], factor[3]);
    } else {
#pragma unroll
      for (int i = 0; i < kScoreRows; ++i) sF[row_of(i)] = factor[i];
    }
  }

  /// acc_o's rows times the factors of scratch (one address per quarter-warp).
  KOKKOS_FORCEINLINE_FUNCTION static void scale_rows(float (&acc_o)[kRowsO][4],
                                                     const float* factor) {
#pragma unroll
    for (int i4 = 0; i4 < kRowsO / 4; ++i4) {
      const float4 f = *reinterpret_cast<const float4*>(factor + 4 * i4);
      const float fr[4] = {f.x, f.y, f.z, f.w};
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc_o[4 * i4 + i][c] *= fr[i];
    }
  }

  KOKKOS_FORCEINLINE_FUNCTION static float exp_of(float x) {
    return FastExp ? cuda_mma::exp2_fast(x * kLog2e) : expf(x);
  }
#endif
};

}  // namespace Impl
}  // namespace kfa

#endif
