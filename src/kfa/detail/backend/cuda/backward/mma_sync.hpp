#ifndef KFA_DETAIL_BACKEND_CUDA_BACKWARD_MMA_SYNC_HPP
#define KFA_DETAIL_BACKEND_CUDA_BACKWARD_MMA_SYNC_HPP

// Tensor-core backward for 16-bit types on the CUDA backend (mma.m16n8k16,
// base-2 softmax), in the decomposition of every fused backward
// (docs/design.md, "The fused CUDA backward"). One team of 8 warps (4 in the
// TeamPolicy shape) owns a block of 128 keys (64), 16 per warp; its K and V
// rows are A fragments, read from scratch at use (held in registers in the
// TeamPolicy shape). dQ += dS·K·scale goes to an fp32 accumulator: with
// atomics, or (Stages >= 2 on sm_90+) through a dQ tile in scratch that the
// bulk copy engine adds, one cp.reduce.async.bulk per query row.
// Grouped-query heads: a team of query head h reads K and V of k/v head
// h / (heads / heads_kv) and writes its dK, dV in fp32 per query head, which
// the dispatch sums per k/v head (Fused16Backward::store_dk_dv).
// Scratch: K [Bc][d+8], Q and dO [Br][d+8], dSᵀ [Bc][Br+8], lse and D rows,
// with Stages >= 2 dQ [Br][d+8] fp32;
// Br = 64, but 32 at head_dim 128 in the TeamPolicy shape (registers: its K
// and V fragments and the dK, dV accumulators fill them) and at head_dim 256.
//
// Variants (softcap, dropout, score modifiers): P and dS
// of the variant's pipeline from Sᵀ and dPᵀ in registers (bwd_variant_p,
// score_fragment.hpp), with the modifier's block predicate skipping query
// blocks.
//
// Head dim 256 (staged shapes only) splits the head dimension over pairs of
// warps, as the fp32/fp64 backward's DimSplit 2 does: the dK and dV accumulators
// of 16 keys over 256 columns would take 256 registers of one warp. The two
// warps of a pair own the same 16 keys (64 per team); the first computes Sᵀ
// and Pᵀ, the second dPᵀ, they swap those fp32 tiles through scratch (a
// barrier of the two warps), and each accumulates dK and dV for its half of
// the head dimension. Scratch at Br = 32 with 3 stages: 225 KB.
//
// Stages = 1: launched through Kokkos' TeamPolicy (under its ~40 KB), the
// next query block's Q, dO, lse and D load after the current one is done.
// Stages = 2, 3: launched by launch_cuda_team with opt-in shared memory; K
// and V have tiles of their own, and Q, dO, lse and D go through 2 or 3
// buffers, so the next one or two query blocks load during the current
// one's products (the library runs 3: 194 KB at head_dim 128, one team of
// 8 warps per SM).

#include <kfa/detail/attention/mask.hpp>
#include <kfa/detail/attention/traits.hpp>

#include <kfa/detail/backend/cuda/backward/score_fragment.hpp>
#include <kfa/detail/backend/cuda/primitives/launch.hpp>
#include <kfa/detail/backend/cuda/primitives/mma.hpp>

#include <cstdint>

namespace kfa {
namespace Impl {

template <class ExecSpace, int HeadDim, class Format, class QView, class KView, class VView,
          class DOView, class LseView, class DeltaView, class DQAccView, class DKView,
          class DVView, int Stages = 1, class VariantT = PlainVariant>
class FlashBackwardMmaKernel
    : public Fused16Backward,
      public FusedVariantParams<VariantT>,
      public MmaTeamLaunch<FlashBackwardMmaKernel<ExecSpace, HeadDim, Format, QView, KView, VView,
                                                  DOView, LseView, DeltaView, DQAccView, DKView,
                                                  DVView, Stages, VariantT>,
                           Kokkos::TeamPolicy<ExecSpace>> {
 public:
  using variant_params = FusedVariantParams<VariantT>;
  static constexpr bool kVariant = variant_params::kVariant;
  static constexpr const char* kLabel = "kfa::bwd::mma_dk_dv";
  static constexpr int kStages = Stages;
  static_assert(Stages >= 1 && Stages <= 3, "kfa: the mma backward has 1 to 3 stages");
  static constexpr int kMinBlocksPerSM = 1;
  static constexpr int kHeadDim = HeadDim;
  /// Warps per team, 16 keys each: 8 (128 keys) with opt-in shared memory,
  /// which halves the Q and dO reads and the dQ atomics per key against 4
  /// warps (L2 traffic that bounds the 4-warp team); 4 (64 keys) inside the
  /// TeamPolicy's scratch.
  static constexpr int kWarps = Stages >= 2 ? 8 : 4;
  /// Warps that share 16 keys, each owning dK and dV for 1/kSplit of the
  /// head dimension: 2 at head_dim 256, else 1.
  static constexpr int kSplit = HeadDim > 128 ? 2 : 1;
  static_assert(kSplit == 1 || Stages >= 2,
                "kfa: the mma backward at head_dim 256 needs the staged (opt-in scratch) shape");
  static constexpr int kBlockN = 16 * kWarps / kSplit;     // keys per team
  /// Queries per step: 64, but 32 at head_dim 128 in the TeamPolicy shape,
  /// whose K and V fragments live in registers, and at head_dim 256
  /// (scratch: Q and dO stages, the dQ tile and the swap scale with it).
  static constexpr int kBlockM = HeadDim > 128 ? 32 : (HeadDim <= 64 || Stages >= 2) ? 64 : 32;
  static constexpr int kPitch = kHeadDim + 8;  // halves per row of K, Q, dO
  static constexpr int kPitchS = kBlockM + 8;  // halves per row of dSᵀ
  static_assert(kHeadDim % 16 == 0, "kfa: the mma backward needs head_dim % 16 == 0");
  /// K and V tiles kept in scratch: with 2 stages both (their A fragments
  /// are read at use, which frees the 64 registers that made the 8-warp
  /// shape spill); with 1, K only (V goes through the Q and dO tiles into
  /// registers, with K's fragments).
  static constexpr int kKVTiles = kStages >= 2 ? 2 : 1;
  static_assert(kStages >= 2 || 2 * kStages * kBlockM >= kBlockN,
                "kfa: the mma backward stages V through the Q and dO tiles");
  /// Whether the shape has a dQ tile in scratch (added by bulk reductions
  /// where the device code has them, sm_90+; by atomics elsewhere).
  static constexpr bool kDqTile = kStages >= 2;
  static constexpr int kPitchDQ = kHeadDim + 8;  // floats per dQ row (conflict-free stores)
  /// Floats of the Pᵀ / dPᵀ swap per warp (kSplit 2): its 16 x kBlockM
  /// tile, lane-major.
  static constexpr int kSwap = kSplit == 1 ? 0 : 16 * kBlockM;

  FlashBackwardMmaKernel(const QView& q, const KView& k, const VView& v, const DOView& d_o,
                         const LseView& lse, const DeltaView& delta, const DQAccView& dq_acc,
                         const DKView& dk, const DVView& dv, float scale, FusedWindow window,
                         const variant_params& variant = variant_params())
      : Fused16Backward(q, k, v, d_o, lse, delta, dq_acc, dk, dv, scale, window, kBlockN),
        variant_params(variant) {}

  /// K (and V with 2 stages), per stage Q and dO, dSᵀ, per stage lse and D,
  /// the dQ tile, the swap.
  KOKKOS_INLINE_FUNCTION static constexpr std::size_t scratch_bytes() {
    return cuda_mma::aligned_scratch_bytes(
        sizeof(std::uint16_t) * (std::size_t(kKVTiles * kBlockN) * kPitch +
                                 2 * kStages * std::size_t(kBlockM) * kPitch +
                                 std::size_t(kBlockN) * kPitchS) +
        sizeof(float) * (2 * kStages * kBlockM + (kDqTile ? kBlockM * kPitchDQ : 0) +
                         std::size_t(kWarps) * kSwap));
  }

  /// The kernel for one team: `team` gives league_rank() and team_barrier(),
  /// `raw` the team's scratch_bytes() of shared memory.
  template <class Team>
  KOKKOS_INLINE_FUNCTION void body(const Team& member, void* raw) const {
#if KFA_CUDA_MMA_DEVICE
    using namespace cuda_mma;
    constexpr int kSteps = kHeadDim / 16;  // k-steps over head_dim
    constexpr int kTilesS = kBlockM / 8;   // n-tiles of Sᵀ (queries) per warp
    constexpr int kTilesD = kHeadDim / 8;  // n-tiles of the head dim
    constexpr int kTilesDW = kTilesD / kSplit;  // n-tiles of dK, dV per warp
    // dQ = dS·K: warps split the query rows (16 each) and, when the query
    // block has fewer than 64 rows, the head dimension.
    constexpr int kRowGroups = kBlockM / 16;
    constexpr int kDimGroups = kWarps / kRowGroups;
    constexpr int kTilesDQ = kTilesD / kDimGroups;
    constexpr float kLog2e = 1.4426950408889634f;
    const int lane = lane_id(), warp = warp_id(), tid = team_thread_id();

    const FusedKeyTile team_tile = this->key_tile(member.league_rank(), kBlockN, kHeadDim);
    if (team_tile.empty()) return;
    const int b = team_tile.b, h = team_tile.h, key_begin = team_tile.key_begin;
    const FusedSeq sq = team_tile.sq;
    const long row_stride = team_tile.row_stride;
    const long q_offset = team_tile.q_offset, k_offset = team_tile.k_offset;
    const float* g_lse = m_lse + m_p.lse_offset(sq, h);
    const float* g_delta = m_delta + m_p.lse_offset(sq, h);

    std::uint16_t* sK = aligned_scratch<std::uint16_t>(raw);
    // Stage s: Q rows, then dO rows, lse and D (stage 0 also stages V on its
    // way into registers when kKVTiles == 1).
    std::uint16_t* const sQ0 = sK + kKVTiles * kBlockN * kPitch;
    std::uint16_t* const sV = kKVTiles == 2 ? sK + kBlockN * kPitch : sQ0;
    std::uint16_t* const sdS = sQ0 + 2 * kStages * kBlockM * kPitch;
    float* const s_lse0 = reinterpret_cast<float*>(sdS + kBlockN * kPitchS);
    auto stage_q = [&](int s) { return sQ0 + 2 * s * kBlockM * kPitch; };
    auto stage_lse = [&](int s) { return s_lse0 + 2 * s * kBlockM; };
    float* const sdQ = s_lse0 + 2 * kStages * kBlockM;
    float* const sSwap = sdQ + (kDqTile ? kBlockM * kPitchDQ : 0);  // kSwap per warp
    // This warp's 16 keys (shared by the kSplit warps of a group) and its
    // part of the head dimension for dK and dV.
    const int group = warp / kSplit, part = warp % kSplit;
    const int d_first = part * kTilesDW;  // first n-tile of dK, dV
    // dQ of the query block at row dq_row_begin from the tile to the
    // accumulator: thread r < kBlockM adds row r (one bulk reduction).
    constexpr bool kBulkDq = kDqTile && KFA_CUDA_BULK_DEVICE;
    const bool dq_issuer = kBulkDq && tid < kBlockM;
    auto add_dq = [&](int dq_row_begin) {
      if (!dq_issuer || dq_row_begin + tid >= sq.seqlen_q) return;
      bulk_reduce_add_f32(m_dq + q_offset + long(dq_row_begin + tid) * row_stride,
                          smem_address(sdQ + tid * kPitchDQ), kHeadDim * sizeof(float));
      bulk_commit();
    };

    // K and V rows (of the query head's k/v head).
    auto load_rows = [&](std::uint16_t* dst, const std::uint16_t* src, int first_row,
                         int rows, int rows_total) {
      load_rows_async<kHeadDim, kPitch>(dst, src, m_kv.row_stride(kHeadDim), first_row, rows,
                                        rows_total, tid, kWarps * 32);
    };

    // K and V rows of this warp as A fragments: read from scratch at use
    // (kKVTiles == 2), or once into registers (V staged through stage 0).
    constexpr int kFragSteps = kKVTiles == 2 ? 1 : kSteps;
    auto a_offset = [&](int ks) {
      return (group * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * kPitch + ks * 16 + (lane / 16) * 8;
    };
    load_rows(sK, m_k + m_kv.offset(m_p, sq, h, kHeadDim), key_begin, kBlockN, sq.seqlen_k);
    load_rows(sV, m_v + m_kv.offset(m_p, sq, h, kHeadDim), key_begin, kBlockN, sq.seqlen_k);
    cp_async_commit();
    std::uint32_t k_frag[kFragSteps][4], v_frag[kFragSteps][4];
    if constexpr (kKVTiles == 1) {
      cp_async_wait<0>();
      // K and V tiles are in scratch.
      member.team_barrier();
      for (int ks = 0; ks < kSteps; ++ks) {
        ldmatrix_x4(k_frag[ks], sK + a_offset(ks));
        ldmatrix_x4(v_frag[ks], sV + a_offset(ks));
      }
    }
    float acc_dk[kTilesDW][4], acc_dv[kTilesDW][4];
    for (int n = 0; n < kTilesDW; ++n)
      for (int e = 0; e < 4; ++e) acc_dk[n][e] = acc_dv[n][e] = 0;

    const int key0 = key_begin + group * 16 + lane / 4, key1 = key0 + 8;
    // The query blocks that see these keys: [first_q_block, num_q_blocks).
    int first_q_block, num_q_blocks;
    team_tile.query_blocks(kBlockN, kBlockM, first_q_block, num_q_blocks, *this);
    // Q, dO, lse and D of a query block into a stage (one commit group).
    auto load_q_block = [&](int q_block, int stage) {
      load_query_block_async<kHeadDim, kPitch, kBlockM>(
          stage_q(stage), stage_lse(stage), m_q + q_offset, m_do + q_offset, g_lse, g_delta,
          row_stride, q_block * kBlockM, sq.seqlen_q, tid, kWarps * 32);
    };
    if constexpr (kStages >= 2) {
      // K and V have their own tiles: the first kStages - 1 query blocks may
      // load at once. One commit group per block (empty past the end), so
      // that waiting for all but the newest kStages - 2 groups means the
      // current block (and, first, K and V) has landed.
      for (int s = 0; s + 1 < kStages; ++s) {
        if (first_q_block + s < num_q_blocks)
          load_q_block(first_q_block + s, s);
        else
          cp_async_commit();
      }
    }
    for (int q_block = first_q_block; q_block < num_q_blocks; ++q_block) {
      const int row_begin = q_block * kBlockM;
      const int stage = kStages == 1 ? 0 : (q_block - first_q_block) % kStages;
      if constexpr (kStages == 1) {
        // Every warp is done with the previous block's Q, dO, dSᵀ (and, on
        // the first pass, with the V tile staged in stage 0).
        member.team_barrier();
        load_q_block(q_block, 0);
        cp_async_wait<0>();
        // Q, dO, lse and D of this query block are in scratch.
        member.team_barrier();
      } else {
        cp_async_wait<(kStages >= 2 ? kStages - 2 : 0)>();
        // This block's stage is in scratch for every warp, and every warp is
        // done with the previous block (its stage, which the block kStages - 1
        // ahead now reuses, and dSᵀ); the previous block's dQ tile is
        // written and fenced, for the bulk reductions.
        member.team_barrier();
        if (kBulkDq && q_block > first_q_block) add_dq(row_begin - kBlockM);
        const int ahead = q_block + kStages - 1;
        if (ahead < num_q_blocks)
          load_q_block(ahead, (ahead - first_q_block) % kStages);
        else
          cp_async_commit();
      }
      const std::uint16_t* sQ = stage_q(stage);
      const std::uint16_t* sdO = sQ + kBlockM * kPitch;
      const float* s_lse = stage_lse(stage);
      const float* s_delta = s_lse + kBlockM;

      float st[kTilesS][4], dpt[kTilesS][4];
      for (int n = 0; n < kTilesS; ++n)
        for (int e = 0; e < 4; ++e) st[n][e] = dpt[n][e] = 0;
      if constexpr (kSplit == 2) {
        // The pair's first warp Sᵀ = K·Qᵀ, the second dPᵀ = V·dOᵀ (into st).
        const std::uint16_t* a_tile = part == 0 ? sK : sV;
        const std::uint16_t* b_tile = part == 0 ? sQ : sdO;
        for (int ks = 0; ks < kSteps; ++ks) {
          std::uint32_t a[4];
          ldmatrix_x4(a, a_tile + a_offset(ks));
          for (int np = 0; np < kTilesS / 2; ++np) {
            std::uint32_t b[4];
            ldmatrix_x4(b, b_tile + (np * 16 + (lane % 8) + (lane / 16) * 8) * kPitch + ks * 16 +
                               ((lane / 8) % 2) * 8);
            mma_16816_x2<Format>(st[2 * np], st[2 * np + 1], a, b);
          }
        }
      } else {
        for (int ks = 0; ks < kSteps; ++ks) {
          std::uint32_t ka[4], va[4];
          if constexpr (kKVTiles == 2) {
            ldmatrix_x4(ka, sK + a_offset(ks));
            ldmatrix_x4(va, sV + a_offset(ks));
          } else {
            for (int i = 0; i < 4; ++i) ka[i] = k_frag[ks][i], va[i] = v_frag[ks][i];
          }
          for (int np = 0; np < kTilesS / 2; ++np) {
            const int offset =
                (np * 16 + (lane % 8) + (lane / 16) * 8) * kPitch + ks * 16 + ((lane / 8) % 2) * 8;
            std::uint32_t qb[4], ob[4];
            ldmatrix_x4(qb, sQ + offset);
            ldmatrix_x4(ob, sdO + offset);
            mma_16816_x2<Format>(st[2 * np], st[2 * np + 1], ka, qb);
            mma_16816_x2<Format>(dpt[2 * np], dpt[2 * np + 1], va, ob);
          }
        }
      }

      // Pᵀ and dSᵀ in registers (rows = keys, columns = queries).
      const bool needs_mask = sq.mask.tile_needs_mask(row_begin, row_begin + kBlockM, key_begin,
                                                     key_begin + kBlockN);
      const float scale_log2 = m_scale * kLog2e;
      auto to_p = [&](auto masked) {
        float lse_log2[kTilesS][2];
        for (int n = 0; n < kTilesS; ++n)
          for (int j = 0; j < 2; ++j) lse_log2[n][j] = s_lse[n * 8 + (lane % 4) * 2 + j] * kLog2e;
        for (int n = 0; n < kTilesS; ++n)
          for (int e = 0; e < 4; ++e) {
            const int col = n * 8 + (lane % 4) * 2 + (e & 1);
            const int key = e < 2 ? key0 : key1;
            float p = exp2_fast(fmaf(st[n][e], scale_log2, -lse_log2[n][e & 1]));
            if (decltype(masked)::value && sq.mask.masked(row_begin + col, key)) p = 0.f;
            st[n][e] = p;
          }
      };
      // (A variant: Sᵀ and dPᵀ stay raw until both are in this warp.)
      if (!kVariant && (kSplit == 1 || part == 0)) unswitch_mask(needs_mask, to_p);
      if constexpr (kSplit == 2) {
        // Swap the pair's tiles: the same lane of both warps holds the same
        // (key, query) elements, so each lane writes its own and reads its
        // partner's, lane-major (conflict-free). The previous block's reads
        // of the swap ended before the team barrier after its dSᵀ stores.
        float* swap = sSwap + group * 2 * kSwap;
        for (int n = 0; n < kTilesS; ++n)
          for (int e = 0; e < 4; ++e) swap[part * kSwap + (n * 4 + e) * 32 + lane] = st[n][e];
        // Both tiles of the pair are in scratch.
        named_barrier(1 + group, 64);
        for (int n = 0; n < kTilesS; ++n)
          for (int e = 0; e < 4; ++e) {
            const float other = swap[(1 - part) * kSwap + (n * 4 + e) * 32 + lane];
            dpt[n][e] = part == 0 ? other : st[n][e];
            st[n][e] = part == 0 ? st[n][e] : other;
          }
      }
      if constexpr (kVariant) {
        // Pᵀ ∘ Z/(1-p) into st, dSᵀ into dpt (both warps of a pair alike).
        std::uint32_t unused_frag[kTilesS / 2][4];
        BwdKeepBits<kTilesS> unused_keep;
        bwd_variant_p<true, Format>(st, dpt, unused_frag, unused_keep, s_lse, s_delta, *this,
                                    sq.mask, b, h, row_begin, key_begin, key_begin + kBlockN,
                                    key0, lane);
      } else {
        for (int n = 0; n < kTilesS; ++n)
          for (int e = 0; e < 4; ++e) {
            const int col = n * 8 + (lane % 4) * 2 + (e & 1);
            dpt[n][e] = st[n][e] * (dpt[n][e] - s_delta[col]);
          }
      }

      // dV += Pᵀ·dO and dK += dSᵀ·Q: A from the accumulators, B = dO, Q
      // rows (k = query) through ldmatrix.trans.
      for (int kk = 0; kk < kBlockM / 16; ++kk) {
        const std::uint32_t p_frag[4] = {pack2<Format>(st[2 * kk][0], st[2 * kk][1]),
                                         pack2<Format>(st[2 * kk][2], st[2 * kk][3]),
                                         pack2<Format>(st[2 * kk + 1][0], st[2 * kk + 1][1]),
                                         pack2<Format>(st[2 * kk + 1][2], st[2 * kk + 1][3])};
        const std::uint32_t ds_frag[4] = {pack2<Format>(dpt[2 * kk][0], dpt[2 * kk][1]),
                                          pack2<Format>(dpt[2 * kk][2], dpt[2 * kk][3]),
                                          pack2<Format>(dpt[2 * kk + 1][0], dpt[2 * kk + 1][1]),
                                          pack2<Format>(dpt[2 * kk + 1][2], dpt[2 * kk + 1][3])};
        for (int np = 0; np < kTilesDW / 2; ++np) {
          const int offset = (kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * kPitch +
                             d_first * 8 + np * 16 + (lane / 16) * 8;
          std::uint32_t ob[4], qb[4];
          ldmatrix_x4_trans(ob, sdO + offset);
          ldmatrix_x4_trans(qb, sQ + offset);
          mma_16816_x2<Format>(acc_dv[2 * np], acc_dv[2 * np + 1], p_frag, ob);
          mma_16816_x2<Format>(acc_dk[2 * np], acc_dk[2 * np + 1], ds_frag, qb);
        }
        // dSᵀ rows of this warp to scratch for dQ = dS·K (with kSplit 2 each
        // warp of the pair writes every other 16 queries).
        if (kSplit == 2 && kk % 2 != part) continue;
        const int r = group * 16 + lane / 4;
        const int c = kk * 16 + (lane % 4) * 2;
        *reinterpret_cast<std::uint32_t*>(sdS + r * kPitchS + c) = ds_frag[0];
        *reinterpret_cast<std::uint32_t*>(sdS + (r + 8) * kPitchS + c) = ds_frag[1];
        *reinterpret_cast<std::uint32_t*>(sdS + r * kPitchS + c + 8) = ds_frag[2];
        *reinterpret_cast<std::uint32_t*>(sdS + (r + 8) * kPitchS + c + 8) = ds_frag[3];
      }
      // The dQ tile's bulk reads are done before it is written again.
      if (dq_issuer) bulk_wait_read();
      // The whole dSᵀ tile is in scratch.
      member.team_barrier();

      // dQ rows [16·(warp % kRowGroups), +16), head-dim tiles of group
      // warp / kRowGroups: A = dS (ldmatrix.trans of dSᵀ), B = K rows.
      const int q0 = (warp % kRowGroups) * 16;
      const int n_first = (warp / kRowGroups) * kTilesDQ;
      float acc_dq[kTilesDQ][4];
      for (int n = 0; n < kTilesDQ; ++n)
        for (int e = 0; e < 4; ++e) acc_dq[n][e] = 0;
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        std::uint32_t a[4];
        ldmatrix_x4_trans(a, sdS + (kk * 16 + (lane % 8) + (lane / 16) * 8) * kPitchS + q0 +
                                 ((lane / 8) % 2) * 8);
        for (int np = 0; np < kTilesDQ / 2; ++np) {
          std::uint32_t kb[4];
          ldmatrix_x4_trans(kb, sK + (kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * kPitch +
                                    (n_first + 2 * np) * 8 + (lane / 16) * 8);
          mma_16816_x2<Format>(acc_dq[2 * np], acc_dq[2 * np + 1], a, kb);
        }
      }
      if constexpr (kBulkDq) {
        // To the dQ tile, visible to the bulk copies after the fence and
        // the next barrier.
        for (int half = 0; half < 2; ++half) {
          const int r = q0 + lane / 4 + half * 8;
          for (int n = 0; n < kTilesDQ; ++n)
            *reinterpret_cast<float2*>(sdQ + r * kPitchDQ + (n_first + n) * 8 + (lane % 4) * 2) =
                make_float2(acc_dq[n][2 * half] * m_scale, acc_dq[n][2 * half + 1] * m_scale);
        }
        fence_proxy_async();
      } else {
        for (int half = 0; half < 2; ++half) {
          const int row = row_begin + q0 + lane / 4 + half * 8;
          if (row >= sq.seqlen_q) continue;
          float* g_dq = m_dq + q_offset + long(row) * row_stride;
          for (int n = 0; n < kTilesDQ; ++n) {
            const int d = (n_first + n) * 8 + (lane % 4) * 2;
            atomicAdd(g_dq + d, acc_dq[n][2 * half] * m_scale);
            atomicAdd(g_dq + d + 1, acc_dq[n][2 * half + 1] * m_scale);
          }
        }
      }
    }
    if (kBulkDq && first_q_block < num_q_blocks) {
      member.team_barrier();
      add_dq((num_q_blocks - 1) * kBlockM);
    }
    // No copy may still be in flight when the team ends (K and V, where no
    // query block sees these keys).
    cp_async_wait<0>();

    for (int half = 0; half < 2; ++half) {
      const int key = (half == 0 ? key0 : key1);
      if (key >= sq.seqlen_k) continue;
      const long at = k_offset + long(key) * row_stride + (lane % 4) * 2;
      for (int n = 0; n < kTilesDW; ++n)
        store_dk_dv<Format>(at + (d_first + n) * 8, acc_dk[n][2 * half] * m_scale,
                            acc_dk[n][2 * half + 1] * m_scale, acc_dv[n][2 * half],
                            acc_dv[n][2 * half + 1]);
    }
    // The last dQ tile read by the copy engine before the team ends (its
    // reductions complete before the kernel does, as in the wgmma
    // backward).
    if (dq_issuer) bulk_wait_read();
#else
    (void)member;
    (void)raw;
#endif
  }

};

}  // namespace Impl
}  // namespace kfa

#endif
