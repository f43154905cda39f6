#ifndef KFA_DETAIL_BACKEND_CUDA_BACKWARD_EXACT_FP32_HPP
#define KFA_DETAIL_BACKEND_CUDA_BACKWARD_EXACT_FP32_HPP

// Exact fp32 backward on the CUDA backend (no tf32), in the decomposition of
// every fused backward (docs/design.md, "The fused CUDA backward"), dQ by
// fp32 atomics into dq: Sᵀ, dPᵀ and dQ on the fp64 tensor cores (sm_90+;
// exact products, fp64 sums) while dV and dK run on fp32 FMAs tiled in
// registers and laid out for shared-memory bandwidth as in the exact fp32
// forward (kfa/detail/backend/cuda/primitives/fma_tiles.hpp); before sm_90
// all five on FMAs. A team of 4 warps owns 64 keys, 16 per warp; per query
// block of kBlockM:
//   Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ   one after the other, each as the forward's S
//                             (cuda_mma::RowProducts): a lane ends with 2
//                             of the warp's keys by kBlockM/4 queries (4
//                             by kBlockM/8 from the FMA product)
//   Pᵀ = exp(Sᵀ·scale - lse), dSᵀ = Pᵀ ∘ (dPᵀ - D)      in registers
//   dV += Pᵀ·dO, dK += dSᵀ·Q  P and dS written [query][key] to scratch (the
//                             warp's own keys); a lane owns the columns
//                             4·(lane % (head_dim/4)).. of kRowsKV of the
//                             warp's keys: per query one float4 of dO and of
//                             Q, kRowsKV/4 of P and of dS (one address per
//                             quarter-warp)
//   dQ += dS·K·scale          after a team barrier, over the team's 64 keys:
//                             on DMMA 4 m16n8 tiles a warp, then 2-wide
//                             atomics (fp32 red.global.add.v2, sm_90); on
//                             FMAs 4 queries x 4 columns a thread.
// K and V stay in scratch; Q, dO, lse and D are double buffered (cp.async,
// the next block's copies issued after this block's Sᵀ and dPᵀ).

#include <kfa/detail/attention/mask.hpp>
#include <kfa/detail/attention/traits.hpp>

#include <kfa/detail/backend/cuda/primitives/launch.hpp>
#include <kfa/detail/backend/cuda/primitives/mma.hpp>
#include <kfa/detail/backend/cuda/primitives/fma_tiles.hpp>

#include <cstdint>

namespace kfa {
namespace Impl {

/// DmmaScores: Sᵀ, dPᵀ and dQ on the fp64 tensor cores
/// (cuda_mma::dmma_row_products, dmma_tile_products: exact products, fp64
/// sums), beside dV and dK on the FMA pipe; the default where the build has
/// fp64 m16n8k8 (sm_90+), false is bench_device's variant exact_fp32_ffma (all
/// five on FMAs).
template <class ExecSpace, int HeadDim, class QView, class KView, class VView, class DOView,
          class LseView, class DeltaView, class DQView, class DKView, class DVView,
          bool DmmaScores = exact_fp32_dmma_scores(), class VariantT = PlainVariant>
class FlashBackwardExactFp32Kernel
    : public FusedBackwardOperands<float>,
      public FusedVariantParams<VariantT, float>,
      public FusedTeamLaunch<FlashBackwardExactFp32Kernel<ExecSpace, HeadDim, QView, KView, VView,
                                                          DOView, LseView, DeltaView, DQView,
                                                          DKView, DVView, DmmaScores, VariantT>> {
 public:
  static constexpr const char* kLabel = "kfa::bwd::exact_fp32_dk_dv";
  using variant_params = FusedVariantParams<VariantT, float>;
  static constexpr bool kVariant = variant_params::kVariant;
  static constexpr int kHeadDim = HeadDim;
  static constexpr int kWarps = 4;
  static constexpr int kMinBlocksPerSM = 2;
  static constexpr int kStages = 2;
  static constexpr int kBlockN = 64;                      // keys per team
  static constexpr int kBlockM = HeadDim <= 64 ? 32 : 16;  // queries per step
  // Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ: a lane's kScoreKeys keys by kScoreQueries
  // queries.
  using Scores = cuda_mma::RowProducts<DmmaScores, HeadDim, kBlockM>;
  static constexpr int kScoreKeys = Scores::kRows;
  static constexpr int kScoreQueries = Scores::kCols;
  static constexpr int kChunks = kHeadDim / 4;             // float4s per row
  static constexpr int kRowsKV = 16 * kChunks / 32;        // a lane's dK, dV rows
  static constexpr int kPitch = kHeadDim + Scores::kPad;   // floats per K, V, Q, dO row
  static constexpr int kPitchP = kBlockN + 4;              // floats per P, dS row
  static constexpr int kChunksDQ = kHeadDim / 4;           // float4 columns of dQ
  static_assert(kHeadDim == 64 || kHeadDim == 128,
                "kfa: the exact fp32 backward's dK, dV tile needs head_dim 64 or 128");
  static_assert(kBlockM / 4 * kChunksDQ == 32 * kWarps,
                "kfa: the exact fp32 backward gives each thread 4 x 4 of dQ");
  static_assert(kBlockM / 16 * kHeadDim / 8 == 4 * kWarps,
                "kfa: the exact fp32 backward's dQ on DMMA gives each warp 4 m16n8 tiles");

  FlashBackwardExactFp32Kernel(const QView& q, const KView& k, const VView& v, const DOView& d_o,
                          const LseView& lse, const DeltaView& delta, const DQView& dq,
                          const DKView& dk, const DVView& dv, float scale, FusedWindow window,
                          const variant_params& variant = variant_params())
      : FusedBackwardOperands(q, k, v, d_o, lse, delta, dq, dk, dv, scale, window, kBlockN),
        variant_params(variant) {}

  /// K, V; per stage Q, dO, lse and D; P and dS.
  KOKKOS_INLINE_FUNCTION static constexpr std::size_t scratch_bytes() {
    return cuda_mma::aligned_scratch_bytes(
        sizeof(float) * (2 * std::size_t(kBlockN) * kPitch +
                         2 * kStages * std::size_t(kBlockM) * kPitch + 2 * kStages * kBlockM +
                         2 * std::size_t(kBlockM) * kPitchP));
  }

  template <class Team>
  KOKKOS_INLINE_FUNCTION void body(const Team& team, void* raw) const {
#if KFA_CUDA_MMA_DEVICE
    using namespace cuda_mma;
    const int lane = lane_id(), warp = warp_id(), tid = team_thread_id();
    // The team's keys and the block's queries of this lane's Sᵀ and dPᵀ.
    auto key_of = [&](int i) { return Scores::row(warp, lane, i); };
    auto query_of = [&](int j) { return Scores::col(lane, j); };
    // dK, dV: keys kv_key.., columns kv_col..
    const int kv_key = 16 * warp + kRowsKV * (lane / kChunks), kv_col = 4 * (lane % kChunks);

    const FusedKeyTile team_tile = this->key_tile(team.league_rank(), kBlockN, kHeadDim);
    if (team_tile.empty()) return;
    const int b = team_tile.b, h = team_tile.h, key_begin = team_tile.key_begin;
    const FusedSeq sq = team_tile.sq;
    const long row_stride = team_tile.row_stride;
    const long q_offset = team_tile.q_offset, k_offset = team_tile.k_offset;
    const float* g_lse = m_lse + m_p.lse_offset(sq, h);
    const float* g_delta = m_delta + m_p.lse_offset(sq, h);

    float* const sK = aligned_scratch<float>(raw);
    float* const sV = sK + kBlockN * kPitch;
    float* const sQ0 = sV + kBlockN * kPitch;  // per stage: Q rows, then dO rows
    float* const s_lse0 = sQ0 + 2 * kStages * kBlockM * kPitch;  // per stage: lse, D
    float* const sP = s_lse0 + 2 * kStages * kBlockM;            // [query][key]
    float* const sdS = sP + kBlockM * kPitchP;                    // [query][key]
    auto stage_q = [&](int s) { return sQ0 + 2 * s * kBlockM * kPitch; };
    auto stage_lse = [&](int s) { return s_lse0 + 2 * s * kBlockM; };

    // K or V rows (rows past rows_total zero-filled).
    auto load_rows = [&](float* dst, const float* src, int first_row, int rows,
                         int rows_total) {
      load_rows_async<kHeadDim, kPitch>(dst, src, m_kv.row_stride(kHeadDim), first_row, rows,
                                        rows_total, tid, kWarps * 32);
    };
    // Q, dO, lse and D of a query block into a stage (one commit group).
    auto load_q_block = [&](int q_block, int stage) {
      load_query_block_async<kHeadDim, kPitch, kBlockM>(
          stage_q(stage), stage_lse(stage), m_q + q_offset, m_do + q_offset, g_lse, g_delta,
          row_stride, q_block * kBlockM, sq.seqlen_q, tid, kWarps * 32);
    };

    // K and V of query head h's k/v head; dK and dV go to query head h's
    // rows (k_offset).
    const long kv_offset = m_kv.offset(m_p, sq, h, kHeadDim);
    load_rows(sK, m_k + kv_offset, key_begin, kBlockN, sq.seqlen_k);
    load_rows(sV, m_v + kv_offset, key_begin, kBlockN, sq.seqlen_k);
    cp_async_commit();
    float acc_dk[kRowsKV][4], acc_dv[kRowsKV][4];
#pragma unroll
    for (int i = 0; i < kRowsKV; ++i)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc_dk[i][c] = acc_dv[i][c] = 0.f;

    // The query blocks that see these keys: [first_q_block, num_q_blocks).
    int first_q_block, num_q_blocks;
    team_tile.query_blocks(kBlockN, kBlockM, first_q_block, num_q_blocks, *this);
    // A variant's sequence lengths and dropout key of this head.
    [[maybe_unused]] SequenceInfo seq{};
    [[maybe_unused]] std::uint64_t dropout_head = 0;
    if constexpr (kVariant) {
      seq = variant_params::sequence(sq.mask, b);
      if (this->m_pipe.dropout()) dropout_head = this->m_pipe.dropout_head(b, h);
    }
    if (first_q_block < num_q_blocks) load_q_block(first_q_block, 0);

    for (int q_block = first_q_block; q_block < num_q_blocks; ++q_block) {
      const int row_begin = q_block * kBlockM;
      const int stage = (q_block - first_q_block) % 2;
      cp_async_wait<0>();
      // K, V and this block's stage are in scratch for every warp, and every
      // thread is done with the previous block (its stage, P and dS).
      team.team_barrier();
      const float* sQ = stage_q(stage);
      const float* sdO = sQ + kBlockM * kPitch;
      const float* s_lse = stage_lse(stage);
      const float* s_delta = s_lse + kBlockM;

      // Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ: keys key_of(i), queries query_of(j).
      float st[kScoreKeys][kScoreQueries], dpt[kScoreKeys][kScoreQueries];
      Scores::products(st, sK, sQ, warp, lane);
      Scores::products(dpt, sV, sdO, warp, lane);
      // The next block's copies, into the stage the previous block used,
      // issued after the Sᵀ and dPᵀ products rather than right after the
      // barrier (as in the exact fp32 forward).
      if (q_block + 1 < num_q_blocks) load_q_block(q_block + 1, 1 - stage);

      // Pᵀ, dSᵀ; written [query][key] to the warp's own keys of P and dS.
      const bool needs_mask = sq.mask.tile_needs_mask(row_begin, row_begin + kBlockM, key_begin,
                                                     key_begin + kBlockN);
      // A variant: the modifier's block predicate may hide the whole tile.
      // `modify` false: the modifier leaves the tile unchanged.
      [[maybe_unused]] bool visible = true, modify = true;
      if constexpr (kVariant) {
        visible = this->m_pipe.visible(b, h, row_begin, imin(row_begin + kBlockM, sq.seqlen_q),
                                       key_begin, imin(key_begin + kBlockN, sq.seqlen_k));
        modify = !this->m_pipe.unchanged(b, h, row_begin, imin(row_begin + kBlockM, sq.seqlen_q),
                                         key_begin, imin(key_begin + kBlockN, sq.seqlen_k));
      }
      // kPitchP keeps both layouts' stores free of bank conflicts.
      unswitch_mask(needs_mask, [&](auto masked) {
#pragma unroll
        for (int j = 0; j < kScoreQueries; ++j) {
          const int col = query_of(j);
          float p[kScoreKeys], ds[kScoreKeys];
          if constexpr (kVariant) {
            // P (dropped, for dV) and dS through the score pipeline.
            const int query = row_begin + col;
            const std::uint64_t dropout_row =
                this->m_pipe.dropout() ? this->m_pipe.dropout_row_of(dropout_head, query) : 0;
#pragma unroll
            for (int i = 0; i < kScoreKeys; ++i) {
              const int key = key_begin + key_of(i);
              const bool hidden = !visible || query >= sq.seqlen_q || key >= sq.seqlen_k ||
                                  (decltype(masked)::value && sq.mask.masked(query, key));
              this->m_pipe.p_and_ds(seq, b, h, query, key, hidden, dropout_row,
                                    st[i][j] * this->m_variant_scale, s_lse[col], s_delta[col],
                                    dpt[i][j], p[i], ds[i], modify);
            }
          } else {
#pragma unroll
            for (int i = 0; i < kScoreKeys; ++i) {
              p[i] = expf(st[i][j] * m_scale - s_lse[col]);
              if (decltype(masked)::value &&
                  sq.mask.masked(row_begin + col, key_begin + key_of(i)))
                p[i] = 0.f;
              ds[i] = p[i] * (dpt[i][j] - s_delta[col]);
            }
          }
          if constexpr (kScoreKeys != 4) {
#pragma unroll
            for (int i = 0; i < kScoreKeys; ++i) {
              sP[col * kPitchP + key_of(i)] = p[i];
              sdS[col * kPitchP + key_of(i)] = ds[i];
            }
          } else {
            *reinterpret_cast<float4*>(sP + col * kPitchP + key_of(0)) =
                make_float4(p[0], p[1], p[2], p[3]);
            *reinterpret_cast<float4*>(sdS + col * kPitchP + key_of(0)) =
                make_float4(ds[0], ds[1], ds[2], ds[3]);
          }
        }
      });
      // The warp's keys of P and dS are visible to its lanes.
      __syncwarp();

      // dV += Pᵀ·dO and dK += dSᵀ·Q over this block's queries: per query
      // kRowsKV keys of P and dS, this lane's 4 columns of dO and Q.
#pragma unroll 2
      for (int qq = 0; qq < kBlockM; ++qq) {
        const float4 o4 = *reinterpret_cast<const float4*>(sdO + qq * kPitch + kv_col);
        const float4 q4 = *reinterpret_cast<const float4*>(sQ + qq * kPitch + kv_col);
#pragma unroll
        for (int i4 = 0; i4 < kRowsKV / 4; ++i4) {
          const float4 p = *reinterpret_cast<const float4*>(sP + qq * kPitchP + kv_key + 4 * i4);
          const float4 ds =
              *reinterpret_cast<const float4*>(sdS + qq * kPitchP + kv_key + 4 * i4);
          const float pr[4] = {p.x, p.y, p.z, p.w}, dsr[4] = {ds.x, ds.y, ds.z, ds.w};
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            float* dv = acc_dv[4 * i4 + i];
            float* dk = acc_dk[4 * i4 + i];
            dv[0] = fmaf(pr[i], o4.x, dv[0]);
            dv[1] = fmaf(pr[i], o4.y, dv[1]);
            dv[2] = fmaf(pr[i], o4.z, dv[2]);
            dv[3] = fmaf(pr[i], o4.w, dv[3]);
            dk[0] = fmaf(dsr[i], q4.x, dk[0]);
            dk[1] = fmaf(dsr[i], q4.y, dk[1]);
            dk[2] = fmaf(dsr[i], q4.z, dk[2]);
            dk[3] = fmaf(dsr[i], q4.w, dk[3]);
          }
        }
      }
      // dS of every warp (all 64 keys) is in scratch.
      team.team_barrier();

      if constexpr (DmmaScores) {
        // dQ on the fp64 tensor cores (exact products, fp64 sums): the
        // warp's 4 m16n8 tiles of the kBlockM x head_dim block, A = dS
        // [query][key], B = K [key][column], over the team's keys.
        constexpr int kTiles = 4, kTilesN = kHeadDim / 8;
        const int m_tile = kTiles * warp / kTilesN, n_tile = kTiles * warp % kTilesN;
        double acc[kTiles][4];
#pragma unroll
        for (int n = 0; n < kTiles; ++n)
#pragma unroll
          for (int c = 0; c < 4; ++c) acc[n][c] = 0.0;
        dmma_tile_products<kBlockN, kPitchP, kPitch>(acc, sdS + 16 * m_tile * kPitchP,
                                                     sK + 8 * n_tile, lane);
        // A lane's sums: rows g and g + 8 of its m-tile, columns 2t, 2t + 1
        // of each n-tile.
        const int g = lane / 4, t = lane % 4;
        const double scale = m_scale;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int row = row_begin + 16 * m_tile + g + 8 * i;
          if (row >= sq.seqlen_q) continue;
          float* g_dq = m_dq + q_offset + long(row) * row_stride + 8 * n_tile + 2 * t;
#pragma unroll
          for (int n = 0; n < kTiles; ++n)
            atomicAdd(reinterpret_cast<float2*>(g_dq + 8 * n),
                      make_float2(static_cast<float>(acc[n][2 * i] * scale),
                                  static_cast<float>(acc[n][2 * i + 1] * scale)));
        }
      } else {
        // dQ rows dq_row.., columns dq_col..: 4 x 4 over the team's keys.
        const int dq_row = 4 * (tid / kChunksDQ), dq_col = 4 * (tid % kChunksDQ);
        float acc_dq[4][4];
#pragma unroll
        for (int r = 0; r < 4; ++r)
#pragma unroll
          for (int c = 0; c < 4; ++c) acc_dq[r][c] = 0.f;
#pragma unroll 2
        for (int key = 0; key < kBlockN; key += 4) {
          float4 dsr[4], kr[4];
#pragma unroll
          for (int r = 0; r < 4; ++r)
            dsr[r] = *reinterpret_cast<const float4*>(sdS + (dq_row + r) * kPitchP + key);
#pragma unroll
          for (int kk = 0; kk < 4; ++kk)
            kr[kk] = *reinterpret_cast<const float4*>(sK + (key + kk) * kPitch + dq_col);
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            const float w[4] = {dsr[r].x, dsr[r].y, dsr[r].z, dsr[r].w};
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) {
              acc_dq[r][0] = fmaf(w[kk], kr[kk].x, acc_dq[r][0]);
              acc_dq[r][1] = fmaf(w[kk], kr[kk].y, acc_dq[r][1]);
              acc_dq[r][2] = fmaf(w[kk], kr[kk].z, acc_dq[r][2]);
              acc_dq[r][3] = fmaf(w[kk], kr[kk].w, acc_dq[r][3]);
            }
          }
        }
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int row = row_begin + dq_row + r;
          if (row >= sq.seqlen_q) continue;
          float* g_dq = m_dq + q_offset + long(row) * row_stride + dq_col;
#pragma unroll
          for (int c = 0; c < 4; ++c) atomicAdd(g_dq + c, acc_dq[r][c] * m_scale);
        }
      }
    }

#pragma unroll
    for (int i = 0; i < kRowsKV; ++i) {
      const int key = key_begin + kv_key + i;
      if (key >= sq.seqlen_k) continue;
      const long at = k_offset + long(key) * row_stride + kv_col;
      *reinterpret_cast<float4*>(m_dk + at) =
          make_float4(acc_dk[i][0] * m_scale, acc_dk[i][1] * m_scale, acc_dk[i][2] * m_scale,
                      acc_dk[i][3] * m_scale);
      *reinterpret_cast<float4*>(m_dv + at) =
          make_float4(acc_dv[i][0], acc_dv[i][1], acc_dv[i][2], acc_dv[i][3]);
    }
    cp_async_wait<0>();
#else
    (void)team;
    (void)raw;
#endif
  }
};

}  // namespace Impl
}  // namespace kfa

#endif
