#ifndef KFA_DETAIL_BACKEND_CUDA_FORWARD_MMA_SYNC_HPP
#define KFA_DETAIL_BACKEND_CUDA_FORWARD_MMA_SYNC_HPP

// Tensor-core forward for 16-bit types on the CUDA backend. A team of Warps
// warps (32 lanes in x, warps in y) owns a block of query rows, MTiles x 16
// rows per warp; K and V blocks of BlockN keys stream through team scratch
// with cp.async; S = Q·Kᵀ and O += P·V run on mma.m16n8k16 with fp32
// accumulation; the online softmax runs in registers in base 2 with the scale
// folded in; P is rounded to the operand format in registers and fed straight
// into P·V. A K or V fragment read from scratch feeds MTiles products, so two
// m-tiles per warp halve the scratch traffic per flop. Scratch rows are padded
// by 16 bytes so ldmatrix is conflict-free.
//
// Two pipelines (FwdMmaShape):
//  - Stages = 1, launched through Kokkos' TeamPolicy, inside its ~40 KB of
//    level-0 scratch: Q staged once into registers, one K and one V buffer;
//    V_j and K_{j+1} load while the previous product runs.
//  - Stages = 2, launched by launch_cuda_team with opt-in shared memory (the
//    FlashAttention-2 shape): Q stays in scratch, K and V are double
//    buffered, so block j+1 loads during all of block j's work. ~104 KB at
//    head_dim 128.

#include <kfa/detail/attention/mask.hpp>
#include <kfa/detail/attention/traits.hpp>

#include <kfa/detail/backend/cuda/forward/softmax.hpp>
#include <kfa/detail/backend/cuda/primitives/launch.hpp>
#include <kfa/detail/backend/cuda/primitives/mma.hpp>

#include <cstdint>

namespace kfa {
namespace Impl {

/// The operand format of the tensor-core path for (ExecSpace, value type),
/// void where there is none (host backends, fp32, fp64).
template <class ExecSpace, class T>
struct MmaFormat {
  using type = void;
};
#ifdef KOKKOS_ENABLE_CUDA
template <>
struct MmaFormat<Kokkos::Cuda, Kokkos::Experimental::half_t> {
  using type = cuda_mma::Fp16;
};
template <>
struct MmaFormat<Kokkos::Cuda, Kokkos::Experimental::bhalf_t> {
  using type = cuda_mma::Bf16;
};
#endif

/// A tile shape of the mma.sync forward (m-tiles of 16 query rows).
template <int Warps, int MTiles, int BlockN, int Stages, int MinBlocksPerSM>
using FwdMmaShape = FusedFwdShape<Warps, MTiles, BlockN, Stages, MinBlocksPerSM>;

/// The library's shapes: the FlashAttention-2 shape (128 query rows, 64 keys,
/// double buffered) where the GPU grants the shared memory, else the shape
/// that fits Kokkos' TeamPolicy scratch. At head_dim 256 a warp keeps one
/// m-tile (its O accumulators already take 128 registers) and streams
/// 32-key blocks: 64 query rows, 101 KB (large) or 34 KB (policy).
template <int HeadDim>
using FwdMmaLargeShape = std::conditional_t<(HeadDim > 128), FwdMmaShape<4, 1, 32, 2, 2>,
                                            FwdMmaShape<4, 2, 64, 2, 2>>;
template <int HeadDim>
using FwdMmaPolicyShape = std::conditional_t<(HeadDim > 128), FwdMmaShape<4, 1, 32, 1, 1>,
                                             FwdMmaShape<4, 1, 64, 1, 2>>;

/// Grouped: fewer k/v heads than query heads (K and V read from the query
/// head's k/v head with their own row stride). A template parameter, not a
/// run-time value: a second stride in every K/V load slows this kernel (its
/// d 128 shape already spills), so the call with as many
/// k/v heads as query heads keeps the single-stride code.
template <class ExecSpace, int HeadDim, class Format, class QView, class KView, class VView,
          class OView, class LseView, class Shape = FwdMmaPolicyShape<HeadDim>,
          bool Grouped = false, class VariantT = PlainVariant>
class FlashForwardMmaKernel
    : public Fused16Forward,
      public FusedVariantParams<VariantT>,
      public MmaTeamLaunch<FlashForwardMmaKernel<ExecSpace, HeadDim, Format, QView, KView, VView,
                                                 OView, LseView, Shape, Grouped, VariantT>,
                           Kokkos::TeamPolicy<ExecSpace, Kokkos::LaunchBounds<
                                                             32 * Shape::kWarps,
                                                             Shape::kMinBlocksPerSM>>> {
 public:
  static constexpr const char* kLabel = "kfa::fwd::mma_main_loop";
  using variant_params = FusedVariantParams<VariantT>;
  /// The variant's pipeline applied to each score fragment (fwd_variant_*).
  static constexpr bool kVariant = variant_params::kVariant;
  static constexpr int kHeadDim = HeadDim;
  static constexpr int kWarps = Shape::kWarps;
  static constexpr int kMTiles = Shape::kMTiles;
  static constexpr int kStages = Shape::kStages;
  static constexpr int kMinBlocksPerSM = Shape::kMinBlocksPerSM;
  static constexpr int kWarpRows = 16 * kMTiles;
  static constexpr int kBlockM = kWarpRows * kWarps;
  static constexpr int kBlockN = Shape::kBlockN;
  static_assert(kWarps == 4 || kWarps == 8, "kfa: the mma forward runs 4 or 8 warps per team");
  static_assert(kMTiles == 1 || kMTiles == 2, "kfa: the mma forward runs 1 or 2 m-tiles per warp");
  static_assert(kBlockN == 32 || kBlockN == 64, "kfa: the mma forward streams 32 or 64 keys");
  static_assert(kStages == 1 || kStages == 2, "kfa: the mma forward has 1 or 2 stages");
  static_assert(kHeadDim % 16 == 0, "kfa: the mma forward needs head_dim % 16 == 0");
  static constexpr int kPitch = kHeadDim + 8;  // halves per scratch row
  /// Scratch rows. Stages 1: K and V blocks, with room to stage the Q block
  /// through them once. Stages 2: the Q block, then K and V per stage.
  static constexpr int kScratchRows = kStages == 1
                                          ? (2 * kBlockN > kBlockM ? 2 * kBlockN : kBlockM)
                                          : kBlockM + 2 * kStages * kBlockN;

  FlashForwardMmaKernel(const QView& q, const KView& k, const VView& v, const OView& o,
                        const LseView& lse, float scale, FusedWindow window,
                        const variant_params& variant = variant_params())
      : Fused16Forward(q, k, v, o, lse, scale, window, kBlockM), variant_params(variant) {}

  KOKKOS_INLINE_FUNCTION static constexpr std::size_t scratch_bytes() {
    return cuda_mma::aligned_scratch_bytes(std::size_t(kScratchRows) * kPitch *
                                           sizeof(std::uint16_t));
  }

  /// The kernel for one team: `team` gives league_rank() and team_barrier(),
  /// `raw` the team's scratch_bytes() of shared memory.
  template <class Team>
  KOKKOS_INLINE_FUNCTION void body(const Team& team, void* raw) const {
#if KFA_CUDA_MMA_DEVICE
    using namespace cuda_mma;
    const int lane = lane_id(), warp = warp_id(), tid = team_thread_id();

    const FusedQueryTile team_tile = this->query_tile(team.league_rank(), kBlockM);
    if (team_tile.empty()) return;
    const int b = team_tile.b, h = team_tile.h, row_begin = team_tile.row_begin;
    const FusedSeq sq = team_tile.sq;
    const std::uint16_t* gQ = m_q + m_p.q_offset(sq, h, kHeadDim);
    const long kv_offset =
        Grouped ? m_kv.offset(m_p, sq, h, kHeadDim) : m_p.k_offset(sq, h, kHeadDim);
    const std::uint16_t* gK = m_k + kv_offset;
    const std::uint16_t* gV = m_v + kv_offset;
    std::uint16_t* scratch = aligned_scratch<std::uint16_t>(raw);

    const long row_stride = long(m_p.heads) * kHeadDim;
    const long kv_stride = Grouped ? m_kv.row_stride(kHeadDim) : row_stride;
    // `rows` rows x head_dim of q (Q) or of k, v (K, V) into a scratch
    // tile, rows past `rows_total` zero-filled.
    auto load_tile = [&](std::uint16_t* dst, const std::uint16_t* src, int first_row,
                         int rows_total, int rows, bool q_rows) {
      load_rows_async<kHeadDim, kPitch>(dst, src, q_rows ? row_stride : kv_stride, first_row,
                                        rows, rows_total, tid, kWarps * 32);
    };

    const int rows = imin(kBlockM, sq.seqlen_q - row_begin);
    // The key blocks inside the mask's window (AttentionMask::key_blocks).
    int first_kv_block, end_kv_block;
    team_tile.key_blocks(rows, kBlockN, first_kv_block, end_kv_block, *this);
    // Rows of accumulator element (mt, e): row0 + mt * 16 + (e / 2) * 8.
    const int row0 = row_begin + warp * kWarpRows + lane / 4;

    float acc_o[kMTiles][kTilesO][4];
    for (int mt = 0; mt < kMTiles; ++mt)
      for (int n = 0; n < kTilesO; ++n)
        acc_o[mt][n][0] = acc_o[mt][n][1] = acc_o[mt][n][2] = acc_o[mt][n][3] = 0;
    float row_max[kRows], row_sum[kRows];
    for (int r = 0; r < kRows; ++r) row_max[r] = -INFINITY, row_sum[r] = 0;
    float s[kMTiles][kTilesS][4];

    if constexpr (kStages == 1) {
      std::uint16_t* sK = scratch;
      std::uint16_t* sV = sK + kBlockN * kPitch;
      // Q block through scratch into registers (A fragments), once. (The
      // scratch holds kScratchRows >= kBlockM rows from sK on.)
      load_tile(sK, gQ, row_begin, sq.seqlen_q, kBlockM, true);
      cp_async_commit();
      cp_async_wait<0>();
      // The Q tile is in scratch for every warp.
      team.team_barrier();
      std::uint32_t q_frag[kMTiles][kSteps][4];
      for (int mt = 0; mt < kMTiles; ++mt)
        for (int ks = 0; ks < kSteps; ++ks)
          ldmatrix_x4(q_frag[mt][ks], sK + a_fragment_offset(warp * kWarpRows + mt * 16, ks, lane));
      // Every warp holds its Q fragments; the tile may be overwritten by K.
      team.team_barrier();

      if (first_kv_block < end_kv_block)
        load_tile(sK, gK, first_kv_block * kBlockN, sq.seqlen_k, kBlockN, false);
      cp_async_commit();
      for (int kv_block = first_kv_block; kv_block < end_kv_block; ++kv_block) {
        const int key_begin = kv_block * kBlockN;
        load_tile(sV, gV, key_begin, sq.seqlen_k, kBlockN, false);
        cp_async_commit();
        cp_async_wait<1>();
        // K_j is in scratch (V_j may still be in flight).
        team.team_barrier();
        scores(s, sK, [&](int mt, int ks, std::uint32_t(&a)[4]) {
          for (int i = 0; i < 4; ++i) a[i] = q_frag[mt][ks][i];
        });
        // Every warp is done reading K_j: K_{j+1} may land in its place.
        team.team_barrier();
        if (kv_block + 1 < end_kv_block)
          load_tile(sK, gK, key_begin + kBlockN, sq.seqlen_k, kBlockN, false);
        cp_async_commit();
        softmax_update(s, acc_o, row_max, row_sum, sq, b, h, row_begin, row0, key_begin);
        cp_async_wait<1>();
        // V_j is in scratch for every warp.
        team.team_barrier();
        accumulate_pv(s, acc_o, sV);
        // Every warp is done reading V_j before V_{j+1} is loaded.
        team.team_barrier();
      }
      cp_async_wait<0>();
    } else {
      std::uint16_t* sQ = scratch;
      auto sK = [&](int stage) { return scratch + (kBlockM + 2 * stage * kBlockN) * kPitch; };
      auto sV = [&](int stage) { return sK(stage) + kBlockN * kPitch; };
      auto load_kv = [&](int kv_block) {
        const int stage = kv_block % kStages;
        load_tile(sK(stage), gK, kv_block * kBlockN, sq.seqlen_k, kBlockN, false);
        load_tile(sV(stage), gV, kv_block * kBlockN, sq.seqlen_k, kBlockN, false);
      };
      load_tile(sQ, gQ, row_begin, sq.seqlen_q, kBlockM, true);
      if (first_kv_block < end_kv_block) load_kv(first_kv_block);
      cp_async_commit();
      for (int kv_block = first_kv_block; kv_block < end_kv_block; ++kv_block) {
        const int key_begin = kv_block * kBlockN;
        cp_async_wait<0>();
        // K_j and V_j (and Q) are in scratch for every warp, and every warp
        // is done with block j-1, whose stage block j+1 now reuses.
        team.team_barrier();
        if (kv_block + 1 < end_kv_block) load_kv(kv_block + 1);
        cp_async_commit();
        scores(s, sK(kv_block % kStages), [&](int mt, int ks, std::uint32_t(&a)[4]) {
          ldmatrix_x4(a, sQ + a_fragment_offset(warp * kWarpRows + mt * 16, ks, lane));
        });
        softmax_update(s, acc_o, row_max, row_sum, sq, b, h, row_begin, row0, key_begin);
        accumulate_pv(s, acc_o, sV(kv_block % kStages));
      }
      cp_async_wait<0>();
    }
    write_output(acc_o, row_max, row_sum, row0, sq, h);
#else
    (void)team;
    (void)raw;
#endif
  }

 private:
  static constexpr int kSteps = kHeadDim / 16;  // k-steps of Q·Kᵀ
  static constexpr int kTilesS = kBlockN / 8;   // n-tiles of S per m-tile
  static constexpr int kTilesO = kHeadDim / 8;  // n-tiles of O per m-tile
  static constexpr int kRows = 2 * kMTiles;     // rows per thread, r = 2 * mt + e / 2

#if KFA_CUDA_MMA_DEVICE
  /// Offset of this lane's ldmatrix row for the A fragment (16 x 16) at
  /// tile row `row`, k-step `ks`.
  KOKKOS_FORCEINLINE_FUNCTION static int a_fragment_offset(int row, int ks, int lane) {
    return (row + (lane % 8) + ((lane / 8) % 2) * 8) * kPitch + ks * 16 + (lane / 16) * 8;
  }

  /// S = Q·K_jᵀ for this warp's m-tiles; `q_fragment(mt, ks, a)` provides
  /// the A fragment of Q (from registers or scratch).
  template <class QFragment>
  KOKKOS_FORCEINLINE_FUNCTION void scores(float (&s)[kMTiles][kTilesS][4],
                                          const std::uint16_t* sK,
                                          const QFragment& q_fragment) const {
    using namespace cuda_mma;
    const int lane = threadIdx.x;
    for (int mt = 0; mt < kMTiles; ++mt)
      for (int n = 0; n < kTilesS; ++n) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0;
    for (int ks = 0; ks < kSteps; ++ks) {
      std::uint32_t a[kMTiles][4];
      for (int mt = 0; mt < kMTiles; ++mt) q_fragment(mt, ks, a[mt]);
      for (int np = 0; np < kTilesS / 2; ++np) {
        std::uint32_t kb[4];
        ldmatrix_x4(kb, sK + (np * 16 + (lane % 8) + (lane / 16) * 8) * kPitch + ks * 16 +
                            ((lane / 8) % 2) * 8);
        for (int mt = 0; mt < kMTiles; ++mt) {
          mma_16816_x2<Format>(s[mt][2 * np], s[mt][2 * np + 1], a[mt], kb);
        }
      }
    }
  }

  /// The online softmax of block key_begin (fwd_softmax_update): S becomes
  /// P, O is rescaled.
  KOKKOS_FORCEINLINE_FUNCTION void softmax_update(float (&s)[kMTiles][kTilesS][4],
                                                  float (&acc_o)[kMTiles][kTilesO][4],
                                                  float (&row_max)[kRows],
                                                  float (&row_sum)[kRows], const FusedSeq& sq,
                                                  int b, int h, int row_begin, int row0,
                                                  int key_begin) const {
    const AttentionMask& mask = sq.mask;
    const bool needs_mask =
        mask.tile_needs_mask(row_begin, row_begin + kBlockM, key_begin, key_begin + kBlockN);
    if constexpr (kVariant) {
      const float scale_log2 = fwd_variant_scores<kBlockM, kBlockN>(s, *this, mask, b, h,
                                                                    row_begin, row0, key_begin);
      fwd_softmax_update<(kHeadDim >= 128)>(s, acc_o, row_max, row_sum, mask, needs_mask,
                                            scale_log2, row0, key_begin);
      fwd_variant_dropout(s, *this, b, h, row0, key_begin);
    } else {
      // The mask inside the loop over the scores at head_dim 128 and up
      // (fwd_softmax_scores' MaskPerScore).
      fwd_softmax_update<(kHeadDim >= 128)>(s, acc_o, row_max, row_sum, mask, needs_mask,
                                            m_scale, row0, key_begin);
    }
  }

  /// O += P·V_j. The S accumulators of n-tiles 2kk, 2kk+1 are exactly the A
  /// fragment of the 16-key slice kk: P never leaves registers.
  KOKKOS_FORCEINLINE_FUNCTION void accumulate_pv(const float (&s)[kMTiles][kTilesS][4],
                                                 float (&acc_o)[kMTiles][kTilesO][4],
                                                 const std::uint16_t* sV) const {
    using namespace cuda_mma;
    const int lane = threadIdx.x;
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      std::uint32_t p_frag[kMTiles][4];
      for (int mt = 0; mt < kMTiles; ++mt) {
        p_frag[mt][0] = pack2<Format>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
        p_frag[mt][1] = pack2<Format>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
        p_frag[mt][2] = pack2<Format>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
        p_frag[mt][3] = pack2<Format>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
      }
      for (int np = 0; np < kTilesO / 2; ++np) {
        std::uint32_t vb[4];
        ldmatrix_x4_trans(vb, sV + (kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * kPitch +
                                  np * 16 + (lane / 16) * 8);
        for (int mt = 0; mt < kMTiles; ++mt) {
          mma_16816_x2<Format>(acc_o[mt][2 * np], acc_o[mt][2 * np + 1], p_frag[mt], vb);
        }
      }
    }
  }

  /// O and lse of this thread's rows (fwd_write_output).
  KOKKOS_FORCEINLINE_FUNCTION void write_output(const float (&acc_o)[kMTiles][kTilesO][4],
                                                const float (&row_max)[kRows],
                                                float (&row_sum)[kRows], int row0,
                                                const FusedSeq& sq, int h) const {
    fwd_write_output<Format>(acc_o, row_max, row_sum, row0, sq.seqlen_q,
                             m_o + m_p.q_offset(sq, h, kHeadDim), long(m_p.heads) * kHeadDim,
                             m_lse + m_p.lse_offset(sq, h));
  }
#endif
};

}  // namespace Impl
}  // namespace kfa

#endif
