#ifndef KFA_DETAIL_BACKEND_CUDA_BACKWARD_FP32_FP64_HPP
#define KFA_DETAIL_BACKEND_CUDA_BACKWARD_FP32_FP64_HPP

// Tensor-core backward for fp32 and fp64 on the CUDA backend, over the atoms
// of kfa/detail/backend/cuda/primitives/mma_atoms.hpp: DMMA for fp64, 3xTF32
// (or tf32) for fp32, in the decomposition of every fused backward
// (docs/design.md, "The fused CUDA backward"), dQ by atomics into dq. A
// team of 4-8 warps owns kBlockN keys (one atom of rows per warp, or per
// pair of warps with DimSplit 2: 64 keys in fp64, 128 in fp32, so Q, dO and
// the dQ atomics pass through L2 once per that many keys); K and V stay in
// scratch. With DimSplit 2 the pair's first warp computes Sᵀ, the second
// dPᵀ; they swap half of them through scratch (a barrier of the two warps),
// each computes Pᵀ and dSᵀ for half the query tiles, they swap those, and
// each accumulates dK and dV for half the head dimension. Q, dO, lse and
// D are double buffered: the next query block loads during the current
// one's products. The softmax is in the natural base in fp64 and in base 2
// (scale and lse times log2 e) in fp32.
//
// Scratch: K, V [kBlockN][d+4], per stage Q and dO [kBlockM][d+4] and lse,
// D [kBlockM], dSᵀ [kBlockN][kBlockM+4], with DimSplit 2 the swap (a warp's
// tile per warp); launched by launch_cuda_team with opt-in shared memory.

#include <kfa/detail/attention/mask.hpp>
#include <kfa/detail/attention/traits.hpp>

#include <kfa/detail/backend/cuda/primitives/launch.hpp>
#include <kfa/detail/backend/cuda/primitives/mma_atoms.hpp>

#include <cstdint>

namespace kfa {
namespace Impl {

/// Tile shape of the fp32/fp64 backward: warps per team, query rows per step,
/// and DimSplit, the warps that share one atom of keys. With DimSplit 1 a
/// warp owns its keys' dK and dV over the whole head dimension and computes
/// their Sᵀ and dPᵀ itself. With DimSplit 2 (for accumulators that would
/// not fit in one warp's registers) two warps own the same keys: the first
/// computes Sᵀ and Pᵀ, the second dPᵀ, they swap those tiles through
/// scratch, and each accumulates dK and dV for half the head dimension.
/// The pairs are adjacent warps (2g, 2g + 1); pairs (g, g + Warps/2), which
/// would put both warps of a pair on one scheduler, are slower.
/// Stages: buffers of Q and dO (2: the next block's copies overlap this
/// block's work; 1: they overlap only dQ = dS·K, and two teams share an SM
/// where one stage lets their scratch fit).
/// kSharedSoftmax (DimSplit 2): after the first swap each warp of a pair
/// holds Sᵀ and dPᵀ for half the query tiles and computes their Pᵀ and dSᵀ
/// (half the exponentials each), and a second swap completes both; false
/// (a shape derived from this one, for the bench): the first warp computes
/// every exponential while the second waits.
template <int Warps, int BlockM, int DimSplit, int Stages = 2>
struct Fp32Fp64BwdShape : FusedTeamShape<Warps, Stages> {
  static constexpr int kBlockM = BlockM;
  static constexpr int kDimSplit = DimSplit;
  static constexpr bool kSharedSoftmax = true;
};

/// The library's shapes: 8 warps, but 4 for fp64 m16n8k8 at head_dim 64 (64
/// keys, one stage of Q and dO so that two teams share an SM: faster than
/// two stages and one team, than 8 warps and 128 keys, whose dQ pass reads
/// dSᵀ once per 8 columns, and than DimSplit 2), and at head_dim 128 8
/// warps in pairs (DimSplit 2, 64 keys: faster than m8n8k4 with 8 keys per
/// warp). Query rows per step are bound by registers
/// (the dK and dV accumulators, the Sᵀ and dPᵀ tiles) and, at head_dim 128,
/// by scratch (230 KB).
template <class Atom, int HeadDim>
struct Fp32Fp64BwdDefaultShape {
  static constexpr bool kFp64 = sizeof(typename Atom::value_type) == 8;
  static constexpr bool kFp64x16 = kFp64 && Atom::kRows == 16;
  static constexpr bool kWideHead = HeadDim > 64;
  using type = Fp32Fp64BwdShape<(kFp64x16 && !kWideHead) ? 4 : 8,
                            kFp64 ? ((Atom::kRows == 16 || kWideHead) ? 16 : 32)
                                  : (kWideHead ? 32 : 64),
                            (kFp64x16 && kWideHead) ? 2 : 1, (kFp64x16 && !kWideHead) ? 1 : 2>;
};

template <class ExecSpace, int HeadDim, class Atom, class QView, class KView, class VView,
          class DOView, class LseView, class DeltaView, class DQView, class DKView,
          class DVView, class Shape = typename Fp32Fp64BwdDefaultShape<Atom, HeadDim>::type,
          class VariantT = PlainVariant>
class FlashBackwardFp32Fp64Kernel
    : public FusedBackwardOperands<typename Atom::value_type>,
      public FusedVariantParams<VariantT, typename Atom::value_type>,
      public FusedTeamLaunch<FlashBackwardFp32Fp64Kernel<ExecSpace, HeadDim, Atom, QView, KView,
                                                         VView, DOView, LseView, DeltaView, DQView,
                                                         DKView, DVView, Shape, VariantT>> {
 public:
  static constexpr const char* kLabel = "kfa::bwd::fp32_fp64_dk_dv";
  using value_type = typename Atom::value_type;
  using operands = FusedBackwardOperands<value_type>;
  using variant_params = FusedVariantParams<VariantT, value_type>;
  static constexpr bool kVariant = variant_params::kVariant;
  static constexpr int kHeadDim = HeadDim;
  static constexpr int kWarps = Shape::kWarps;
  static constexpr int kSplit = Shape::kDimSplit;  // warps per atom of keys
  static constexpr int kStages = Shape::kStages;
  static constexpr int kMinBlocksPerSM = kStages == 1 ? 2 : 1;
  static constexpr int kBlockN = kWarps / kSplit * Atom::kRows;  // keys per team
  static constexpr int kBlockM = Shape::kBlockM;
  static constexpr int kPitch = kHeadDim + 4;   // elements per row of K, V, Q, dO
  static constexpr int kPitchS = kBlockM + 4;   // elements per row of dSᵀ
  /// Elements of the Pᵀ / dPᵀ swap per warp (DimSplit 2): its tile, lane-major.
  static constexpr int kSwap = kSplit == 1 ? 0 : Atom::kRows * kBlockM;
  static_assert(kHeadDim % 32 == 0, "kfa: the fp32/fp64 backward needs head_dim % 32 == 0");
  static_assert(kBlockM % Atom::kRows == 0 && kBlockM / Atom::kRows <= kWarps,
                "kfa: the fp32/fp64 backward splits dQ rows over the warps");
  static_assert(kSplit == 1 || (kSplit == 2 && kWarps % 2 == 0 && kWarps / 2 <= 15),
                "kfa: the fp32/fp64 backward shares an atom of keys between 1 or 2 warps");
  static_assert(kSplit == 1 || !Shape::kSharedSoftmax || kBlockM % 16 == 0,
                "kfa: a pair of the fp32/fp64 backward shares the softmax by 8-query tiles");
  static_assert(!kVariant || kSplit == 1 || Shape::kSharedSoftmax,
                "kfa: a variant's P and dS need both Sᵀ and dPᵀ in one warp");

  FlashBackwardFp32Fp64Kernel(const QView& q, const KView& k, const VView& v, const DOView& d_o,
                             const LseView& lse, const DeltaView& delta, const DQView& dq,
                             const DKView& dk, const DVView& dv, value_type scale, FusedWindow window,
                             const variant_params& variant = variant_params())
      : operands(q, k, v, d_o, lse, delta, dq, dk, dv, scale, window, kBlockN),
        variant_params(variant) {}

  KOKKOS_INLINE_FUNCTION static constexpr std::size_t scratch_bytes() {
    return cuda_mma::aligned_scratch_bytes(
        sizeof(value_type) *
        (2 * std::size_t(kBlockN) * kPitch + 2 * kStages * std::size_t(kBlockM) * kPitch +
         std::size_t(kBlockN) * kPitchS + 2 * kStages * std::size_t(kBlockM) +
         std::size_t(kWarps) * kSwap));
  }

  template <class Team>
  KOKKOS_INLINE_FUNCTION void body(const Team& team, void* raw) const {
#if KFA_CUDA_MMA_DEVICE
    using namespace cuda_mma;
    constexpr int kSteps = kHeadDim / Atom::kDepth;  // k-steps over head_dim
    constexpr int kTilesQ = kBlockM / 8;             // 8-query tiles of Sᵀ
    constexpr int kTilesD = kHeadDim / 8;            // n-tiles of the head dim
    constexpr int kTilesDW = kTilesD / kSplit;       // n-tiles of dK, dV per warp
    constexpr int kTilesK = kBlockN / 8;             // 8-key tiles of dQ = dS·K
    constexpr int kRowGroups = kBlockM / Atom::kRows;
    constexpr int kDimGroups = kWarps / kRowGroups;
    constexpr int kTilesDQ = kTilesD / kDimGroups;
    constexpr value_type kLog2e = value_type(1.4426950408889634);
    const int lane = lane_id(), warp = warp_id(), tid = team_thread_id();

    const FusedKeyTile team_tile = this->key_tile(team.league_rank(), kBlockN, kHeadDim);
    if (team_tile.empty()) return;
    const int b = team_tile.b, h = team_tile.h, key_begin = team_tile.key_begin;
    const FusedSeq sq = team_tile.sq;
    const long row_stride = team_tile.row_stride;
    const long q_offset = team_tile.q_offset, k_offset = team_tile.k_offset;
    const value_type* g_lse = m_lse + m_p.lse_offset(sq, h);
    const value_type* g_delta = m_delta + m_p.lse_offset(sq, h);

    value_type* const sK = aligned_scratch<value_type>(raw);
    value_type* const sV = sK + kBlockN * kPitch;
    value_type* const sQ0 = sV + kBlockN * kPitch;  // per stage: Q rows, then dO rows
    value_type* const sdS = sQ0 + 2 * kStages * kBlockM * kPitch;
    value_type* const s_lse0 = sdS + kBlockN * kPitchS;  // per stage: lse, then D
    value_type* const sSwap = s_lse0 + 2 * kStages * kBlockM;  // kSwap per warp
    auto stage_q = [&](int s) { return sQ0 + 2 * s * kBlockM * kPitch; };
    auto stage_lse = [&](int s) { return s_lse0 + 2 * s * kBlockM; };

    // K or V rows (rows past rows_total zero-filled).
    auto load_rows = [&](value_type* dst, const value_type* src, int first_row, int rows,
                         int rows_total) {
      load_rows_async<kHeadDim, kPitch, Atom::kSwizzle>(dst, src, m_kv.row_stride(kHeadDim),
                                                        first_row, rows, rows_total, tid,
                                                        kWarps * 32);
    };
    // Q, dO, lse and D of a query block into a stage (one commit group).
    auto load_q_block = [&](int q_block, int stage) {
      load_query_block_async<kHeadDim, kPitch, kBlockM, Atom::kSwizzle>(
          stage_q(stage), stage_lse(stage), m_q + q_offset, m_do + q_offset, g_lse, g_delta,
          row_stride, q_block * kBlockM, sq.seqlen_q, tid, kWarps * 32);
    };

    // K and V of query head h's k/v head; dK and dV go to query head h's
    // rows (k_offset).
    const long kv_offset = m_kv.offset(m_p, sq, h, kHeadDim);
    load_rows(sK, m_k + kv_offset, key_begin, kBlockN, sq.seqlen_k);
    load_rows(sV, m_v + kv_offset, key_begin, kBlockN, sq.seqlen_k);
    cp_async_commit();
    value_type acc_dk[kTilesDW][Atom::kC], acc_dv[kTilesDW][Atom::kC];
#pragma unroll
    for (int n = 0; n < kTilesDW; ++n)
#pragma unroll
      for (int j = 0; j < Atom::kC; ++j) acc_dk[n][j] = acc_dv[n][j] = 0;

    const int group = warp / kSplit, part = warp % kSplit;
    const int warp_key = group * Atom::kRows;  // this warp's first key in the block
    const int d_first = part * kTilesDW;       // this warp's first n-tile of dK, dV
    // The query blocks that see these keys: [first_q_block, num_q_blocks).
    int first_q_block, num_q_blocks;
    team_tile.query_blocks(kBlockN, kBlockM, first_q_block, num_q_blocks, *this);
    if (first_q_block < num_q_blocks) load_q_block(first_q_block, 0);
    const value_type scale = kBase2 ? m_scale * kLog2e : m_scale;

    for (int q_block = first_q_block; q_block < num_q_blocks; ++q_block) {
      const int row_begin = q_block * kBlockM;
      const int stage = (q_block - first_q_block) % kStages;
      cp_async_wait<0>();
      // K, V and this block's stage are in scratch for every warp, and every
      // warp is done with the previous block (its stage and dSᵀ).
      team.team_barrier();
      if (kStages == 2 && q_block + 1 < num_q_blocks) load_q_block(q_block + 1, 1 - stage);
      const value_type* sQ = stage_q(stage);
      const value_type* sdO = sQ + kBlockM * kPitch;
      const value_type* s_lse = stage_lse(stage);
      const value_type* s_delta = s_lse + kBlockM;

      // Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ for this warp's keys (with DimSplit 2 the
      // first warp of the pair computes Sᵀ, the second dPᵀ).
      value_type st[kTilesQ][Atom::kC], dpt[kTilesQ][Atom::kC];
#pragma unroll
      for (int n = 0; n < kTilesQ; ++n)
#pragma unroll
        for (int j = 0; j < Atom::kC; ++j) st[n][j] = dpt[n][j] = 0;
      if constexpr (kSplit == 1) {
#pragma unroll
        for (int ks = 0; ks < kSteps; ++ks) {
          const typename Atom::A ka = Atom::load_a(sK, kPitch, warp_key, ks * Atom::kDepth);
          const typename Atom::A va = Atom::load_a(sV, kPitch, warp_key, ks * Atom::kDepth);
#pragma unroll
          for (int n = 0; n < kTilesQ; ++n) {
            Atom::mma(st[n], ka, Atom::load_b_t(sQ, kPitch, n * 8, ks * Atom::kDepth));
            Atom::mma(dpt[n], va, Atom::load_b_t(sdO, kPitch, n * 8, ks * Atom::kDepth));
          }
        }
      } else {
        const value_type* a_tile = part == 0 ? sK : sV;
        const value_type* b_tile = part == 0 ? sQ : sdO;
#pragma unroll
        for (int ks = 0; ks < kSteps; ++ks) {
          const typename Atom::A a = Atom::load_a(a_tile, kPitch, warp_key, ks * Atom::kDepth);
#pragma unroll
          for (int n = 0; n < kTilesQ; ++n)
            Atom::mma(st[n], a, Atom::load_b_t(b_tile, kPitch, n * 8, ks * Atom::kDepth));
        }
      }

      // Pᵀ and dSᵀ in registers (rows = keys, columns = queries).
      const bool needs_mask = sq.mask.tile_needs_mask(row_begin, row_begin + kBlockM, key_begin,
                                                     key_begin + kBlockN);
      // f(n, j, col) for the elements j of the query tiles n with owns(n);
      // col: the element's query in the block.
      auto for_owned = [&](auto owns, auto&& f) {
#pragma unroll
        for (int n = 0; n < kTilesQ; ++n)
#pragma unroll
          for (int j = 0; j < Atom::kC; ++j) {
            if (!owns(n)) continue;
            f(n, j, n * 8 + (lane % 4) * 2 + (j & 1));
          }
      };
      // Pᵀ of the query tiles n with owns(n).
      auto to_p = [&](auto owns) {
        unswitch_mask(needs_mask, [&](auto masked) {
          for_owned(owns, [&](int n, int j, int col) {
            value_type p =
                exp_base(st[n][j] * scale - (kBase2 ? s_lse[col] * kLog2e : s_lse[col]));
            if (decltype(masked)::value &&
                sq.mask.masked(row_begin + col, key_begin + warp_key + lane / 4 + (j / 2) * 8))
              p = 0;
            st[n][j] = p;
          });
        });
      };
      // dSᵀ = Pᵀ ∘ (dPᵀ − D) of the query tiles n with owns(n), a quad's
      // D for its 2 queries of a tile read as one pair.
      auto to_ds = [&](auto owns) {
#pragma unroll
        for (int n = 0; n < kTilesQ; ++n) {
          if (!owns(n)) continue;
          const value_type* d = s_delta + n * 8 + (lane % 4) * 2;
#pragma unroll
          for (int j = 0; j < Atom::kC; ++j) dpt[n][j] = st[n][j] * (dpt[n][j] - d[j & 1]);
        }
      };
      // A variant's Pᵀ (dropped, for dV) and dSᵀ of the query tiles n with
      // owns(n), from Sᵀ and dPᵀ together (ScorePipeline::p_and_ds).
      auto to_p_ds = [&](auto owns) {
        if constexpr (kVariant) {
          const auto& pipe = this->m_pipe;
          const SequenceInfo seq = variant_params::sequence(sq.mask, b);
          const bool visible =
              pipe.visible(b, h, row_begin, imin(row_begin + kBlockM, sq.seqlen_q), key_begin,
                           imin(key_begin + kBlockN, sq.seqlen_k));
          const bool modify =
              !pipe.unchanged(b, h, row_begin, imin(row_begin + kBlockM, sq.seqlen_q), key_begin,
                              imin(key_begin + kBlockN, sq.seqlen_k));
          const std::uint64_t head = pipe.dropout() ? pipe.dropout_head(b, h) : 0;
          for_owned(owns, [&](int n, int j, int col) {
            const int query = row_begin + col;
            const int key = key_begin + warp_key + lane / 4 + (j / 2) * 8;
            const bool masked = !visible || query >= sq.seqlen_q || key >= sq.seqlen_k ||
                                (needs_mask && sq.mask.masked(query, key));
            value_type p, ds;
            pipe.p_and_ds(seq, b, h, query, key, masked,
                          pipe.dropout() ? pipe.dropout_row_of(head, query) : 0,
                          st[n][j] * this->m_variant_scale, s_lse[col], s_delta[col], dpt[n][j],
                          p, ds, modify);
            st[n][j] = p;
            dpt[n][j] = ds;
          });
        } else {
          to_p(owns);
          to_ds(owns);
        }
      };
      auto all_tiles = [](int) { return true; };
      // The pair's swaps go lane-major through scratch: the same lane of
      // both warps holds the same (key, query) elements, so each lane writes
      // its own and reads its partner's (conflict-free). Slot i of a lane in
      // a warp's region: element i of what it sends, in tile order.
      value_type* const mine = sSwap + group * 2 * kSwap + part * kSwap;
      value_type* const theirs = sSwap + group * 2 * kSwap + (1 - part) * kSwap;
      auto slot = [&](int i) { return i * 32 + lane; };
      if constexpr (kSplit == 1) {
        to_p_ds(all_tiles);
      } else if constexpr (!Shape::kSharedSoftmax) {
        // The first warp takes every exponential; one swap.
        if (part == 0) to_p(all_tiles);
#pragma unroll
        for (int n = 0; n < kTilesQ; ++n)
#pragma unroll
          for (int j = 0; j < Atom::kC; ++j) mine[slot(n * Atom::kC + j)] = st[n][j];
        cuda_mma::named_barrier(1 + group, 64);
#pragma unroll
        for (int n = 0; n < kTilesQ; ++n)
#pragma unroll
          for (int j = 0; j < Atom::kC; ++j) {
            const value_type other = theirs[slot(n * Atom::kC + j)];
            dpt[n][j] = part == 0 ? other : st[n][j];
            st[n][j] = part == 0 ? st[n][j] : other;
          }
        to_ds(all_tiles);
      } else {
        // Warp `part` owns the query tiles n % 2 == part. Swap 1: each warp
        // sends its Sᵀ (first warp) or dPᵀ (second) of the tiles it does
        // not own, so that each holds both for its own tiles and computes
        // their Pᵀ and dSᵀ. Swap 2: each sends those into the region it read
        // in swap 1 (its reads of it are done, and its partner wrote it
        // before the first barrier) and reads its partner's from its own.
        auto owned = [&](int n) { return n % 2 == part; };
        auto not_owned = [&](int n) { return n % 2 != part; };
#pragma unroll
        for (int n = 0; n < kTilesQ; ++n)
#pragma unroll
          for (int j = 0; j < Atom::kC; ++j)
            if (not_owned(n)) mine[slot((n / 2) * Atom::kC + j)] = st[n][j];
        cuda_mma::named_barrier(1 + group, 64);
#pragma unroll
        for (int n = 0; n < kTilesQ; ++n)
#pragma unroll
          for (int j = 0; j < Atom::kC; ++j) {
            if (!owned(n)) continue;
            const value_type other = theirs[slot((n / 2) * Atom::kC + j)];
            dpt[n][j] = part == 0 ? other : st[n][j];
            st[n][j] = part == 0 ? st[n][j] : other;
          }
        to_p_ds(owned);
#pragma unroll
        for (int n = 0; n < kTilesQ; ++n)
#pragma unroll
          for (int j = 0; j < Atom::kC; ++j)
            if (owned(n)) {
              theirs[slot((n / 2) * 2 * Atom::kC + j)] = st[n][j];
              theirs[slot((n / 2) * 2 * Atom::kC + Atom::kC + j)] = dpt[n][j];
            }
        cuda_mma::named_barrier(1 + group, 64);
#pragma unroll
        for (int n = 0; n < kTilesQ; ++n)
#pragma unroll
          for (int j = 0; j < Atom::kC; ++j)
            if (not_owned(n)) {
              st[n][j] = mine[slot((n / 2) * 2 * Atom::kC + j)];
              dpt[n][j] = mine[slot((n / 2) * 2 * Atom::kC + Atom::kC + j)];
            }
      }

      // dV += Pᵀ·dO and dK += dSᵀ·Q (k = queries), A from the accumulators.
#pragma unroll
      for (int qt = 0; qt < kTilesQ; ++qt)
#pragma unroll
        for (int slice = 0; slice < Atom::kSlices; ++slice) {
          const typename Atom::A pa = Atom::a_from_c(st[qt], slice);
          const typename Atom::A dsa = Atom::a_from_c(dpt[qt], slice);
#pragma unroll
          for (int n = 0; n < kTilesDW; ++n) {
            const int d0 = (d_first + n) * 8;
            Atom::mma(acc_dv[n], pa, Atom::load_b_perm(sdO, kPitch, qt * 8, slice, d0));
            Atom::mma(acc_dk[n], dsa, Atom::load_b_perm(sQ, kPitch, qt * 8, slice, d0));
          }
        }
      // dSᵀ rows of this warp's keys to scratch for dQ = dS·K (with DimSplit
      // 2 each warp of the pair writes every other query tile).
#pragma unroll
      for (int n = 0; n < kTilesQ; ++n) {
        if (kSplit == 2 && n % 2 != part) continue;
#pragma unroll
        for (int j = 0; j < Atom::kC; ++j) {
          const int row = warp_key + lane / 4 + (j / 2) * 8;
          sdS[row * kPitchS +
              swizzle_col<Atom::kSwizzle>(row, n * 8 + (lane % 4) * 2 + (j & 1))] = dpt[n][j];
        }
      }
      // The whole dSᵀ tile is in scratch.
      team.team_barrier();
      // One stage: dQ reads only dSᵀ and K, so the next block's Q, dO, lse
      // and D may replace this one's now.
      if (kStages == 1 && q_block + 1 < num_q_blocks) load_q_block(q_block + 1, 0);

      // dQ rows [kRows·(warp % kRowGroups), +kRows), head-dim tiles of group
      // warp / kRowGroups: A = dS (dSᵀ read transposed), B = K rows.
      const int q0 = (warp % kRowGroups) * Atom::kRows;
      const int n_first = (warp / kRowGroups) * kTilesDQ;
      value_type acc_dq[kTilesDQ][Atom::kC];
#pragma unroll
      for (int n = 0; n < kTilesDQ; ++n)
#pragma unroll
        for (int j = 0; j < Atom::kC; ++j) acc_dq[n][j] = 0;
#pragma unroll
      for (int kt = 0; kt < kTilesK; ++kt)
#pragma unroll
        for (int slice = 0; slice < Atom::kSlices; ++slice) {
          const typename Atom::A a = Atom::load_a_t_perm(sdS, kPitchS, q0, kt * 8, slice);
#pragma unroll
          for (int n = 0; n < kTilesDQ; ++n)
            Atom::mma(acc_dq[n], a,
                      Atom::load_b_perm(sK, kPitch, kt * 8, slice, (n_first + n) * 8));
        }
#pragma unroll
      for (int half = 0; half < Atom::kC / 2; ++half) {
        const int row = row_begin + q0 + lane / 4 + half * 8;
        if (row >= sq.seqlen_q) continue;
        value_type* g_dq = m_dq + q_offset + long(row) * row_stride;
#pragma unroll
        for (int n = 0; n < kTilesDQ; ++n) {
          const int d = (n_first + n) * 8 + (lane % 4) * 2;
          atomicAdd(g_dq + d, acc_dq[n][2 * half] * m_scale);
          atomicAdd(g_dq + d + 1, acc_dq[n][2 * half + 1] * m_scale);
        }
      }
    }

#pragma unroll
    for (int half = 0; half < Atom::kC / 2; ++half) {
      const int key = key_begin + warp_key + lane / 4 + half * 8;
      if (key >= sq.seqlen_k) continue;
      value_type* g_dk = m_dk + k_offset + long(key) * row_stride;
      value_type* g_dv = m_dv + k_offset + long(key) * row_stride;
#pragma unroll
      for (int n = 0; n < kTilesDW; ++n) {
        const int d = (d_first + n) * 8 + (lane % 4) * 2;
        g_dk[d] = acc_dk[n][2 * half] * m_scale;
        g_dk[d + 1] = acc_dk[n][2 * half + 1] * m_scale;
        g_dv[d] = acc_dv[n][2 * half];
        g_dv[d + 1] = acc_dv[n][2 * half + 1];
      }
    }
    cp_async_wait<0>();
#else
    (void)team;
    (void)raw;
#endif
  }

 private:
  static constexpr bool kBase2 = sizeof(value_type) == 4;

#if KFA_CUDA_MMA_DEVICE
  KOKKOS_FORCEINLINE_FUNCTION static value_type exp_base(value_type x) {
    if constexpr (kBase2) {
      return cuda_mma::exp2_fast(x);
    } else {
      return exp(x);
    }
  }
#endif

  // The operands: a dependent base.
  using operands::m_q, operands::m_k, operands::m_v, operands::m_do, operands::m_lse,
      operands::m_delta, operands::m_dq, operands::m_dk, operands::m_dv, operands::m_scale,
      operands::m_p, operands::m_kv, operands::m_num_kv_blocks;
};

}  // namespace Impl
}  // namespace kfa

#endif
