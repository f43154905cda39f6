#ifndef KFA_DETAIL_BACKEND_CUDA_BACKWARD_WGMMA_PRODUCT_SPLIT_HPP
#define KFA_DETAIL_BACKEND_CUDA_BACKWARD_WGMMA_PRODUCT_SPLIT_HPP

// Hopper backward for 16-bit types at head_dim 256 (dK, dV, and dQ added
// to an fp32 accumulator, so not deterministic): warpgroup tensor cores
// (wgmma, sm_90a). At head_dim 256 one warpgroup's dK and dV of 64 keys
// are 256 fp32 registers a thread, so the two warpgroups of a team share
// 64 keys and split the work by product instead of by keys:
//   warpgroup 0: Sᵀ = K·Qᵀ, Pᵀ = exp2(Sᵀ·scale·log2e - lse·log2e),
//                dSᵀ = Pᵀ ∘ (dPᵀ - D) (dPᵀ from warpgroup 1, fp32 through
//                scratch), dSᵀ to scratch, dV += Pᵀ·dO (a variant: its
//                pipeline's P and dS, bwd_variant_p / _ds)
//   warpgroup 1: dPᵀ = V·dOᵀ (to scratch), dK += dSᵀ·Q (dSᵀ read back
//                from scratch in its register fragments)
//   both:        dQ = dS·K·scale over the 64 keys, 128 head dims each
//                (A = dS, the M-major view of the dSᵀ tile; B = K
//                N-major), added to the accumulator by 16-byte
//                reductions (red.global.add.v4.f32) of whole rows, staged
//                through scratch warp by warp
// per block of 64 queries (m64n64k16 for Sᵀ and dPᵀ, m64n256k16 for dV
// and dK with Pᵀ and dSᵀ from registers, m64n128k16 for dQ). Each
// warpgroup holds one m64n256 accumulator (dV or dK: 128 registers), so
// dQ's 64 and a fragment's 16 fit beside it. Q, dO, lse and D of the next
// block load (cp.async, double buffered) during the current one's
// products. Scratch: K, V 2 x 32 KB, 2 x (Q, dO 2 x 32 KB, lse, D), the
// dSᵀ tile 8 KB and the fp32 dPᵀ exchange 16 KB: 218 KB (no room for
// FlashAttention-3's fp32 dQ tile of 64 KB and its bulk reductions, hence
// red.global, staged 2 KB a warp in the exchange). Tiles are 128-byte
// swizzled (kfa/detail/backend/cuda/primitives/wgmma.hpp). At the end dV and dK go to memory
// through K's and V's tiles, 16 bytes a thread (StagedRows).

#include <kfa/detail/attention/mask.hpp>

#include <kfa/detail/backend/cuda/backward/wgmma.hpp>
#include <kfa/detail/backend/cuda/primitives/launch.hpp>
#include <kfa/detail/backend/cuda/primitives/mma.hpp>
#include <kfa/detail/backend/cuda/primitives/tma.hpp>
#include <kfa/detail/backend/cuda/primitives/wgmma.hpp>

#include <cstdint>

namespace kfa {
namespace Impl {

template <class ExecSpace, class Format, class QView, class KView, class VView, class DOView,
          class LseView, class DeltaView, class DQAccView, class DKView, class DVView,
          bool DqOverlap = false, bool DqStaged = true, class VariantT = PlainVariant>
class FlashBackwardWgmmaProductSplitKernel : public Fused16Backward,
                                             public FusedVariantParams<VariantT> {
 public:
  using variant_params = FusedVariantParams<VariantT>;
  /// Pᵀ and dSᵀ of the variant's pipeline (warpgroup 0): bwd_variant_p
  /// from Sᵀ, bwd_variant_ds once warpgroup 1's dPᵀ is in.
  static constexpr bool kVariant = variant_params::kVariant;
  static constexpr int kHeadDim = 256;
  static constexpr int kWarps = 8;    // 2 warpgroups
  static constexpr int kBlockN = 64;  // keys per team, shared by both warpgroups
  static constexpr int kBlockM = 64;  // queries per step
  static constexpr int kStages = 2;   // Q/dO buffers (launch_mma_kernel: opt-in scratch)
  static constexpr int kMinBlocksPerSM = 1;
  static constexpr int kTileKV = kBlockN * kHeadDim;  // values per tile
  static constexpr int kTileQ = kBlockM * kHeadDim;
  static constexpr int kTileDS = kBlockN * kBlockM;
  /// DqOverlap: dQ's products issued while dV's or dK's run (their A
  /// fragments still live beside dQ's accumulators: ptxas spills 72 bytes),
  /// else after them.
  static constexpr bool kDqOverlap = DqOverlap;
  /// DqStaged: dQ's reductions go out in whole rows (each warp passes its
  /// fragments through 2 KB of scratch, 32 columns at a time, and adds 4
  /// rows of 128 bytes per instruction), else straight from the fragments
  /// (8 bytes of 8 rows per instruction: 4 times the L1 wavefronts).
  static constexpr bool kDqStaged = DqStaged;
  using policy_t = Kokkos::TeamPolicy<ExecSpace>;

  FlashBackwardWgmmaProductSplitKernel(const QView& q, const KView& k, const VView& v, const DOView& d_o,
                              const LseView& lse, const DeltaView& delta,
                              const DQAccView& dq_acc, const DKView& dk, const DVView& dv,
                              float scale, FusedWindow window,
                              const variant_params& variant = variant_params())
      : Fused16Backward(q, k, v, d_o, lse, delta, dq_acc, dk, dv, scale, window, kBlockN),
        variant_params(variant) {}

  /// The GPU gives a team its scratch.
  static bool fits(const ExecSpace& space) {
    return mma_kernel_fits<FlashBackwardWgmmaProductSplitKernel>(space);
  }

  void launch(const ExecSpace& space) const {
    launch_mma_kernel(space, "kfa::bwd::wgmma256_dk_dv", *this, m_p.league(m_num_kv_blocks));
  }

  /// K, V, per stage Q, dO, lse and D, the dSᵀ tile, the fp32 dPᵀ
  /// exchange, and the slack that aligns the swizzle atoms to 1024 bytes.
  KOKKOS_INLINE_FUNCTION static constexpr std::size_t scratch_bytes() {
    return sizeof(std::uint16_t) *
               (2 * std::size_t(kTileKV) + 2 * kStages * std::size_t(kTileQ) +
                std::size_t(kTileDS)) +
           sizeof(float) * (std::size_t(kTileDS) + 2 * kStages * kBlockM) + 1024;
  }
  static_assert(scratch_bytes() <= 227 * 1024,
                "kfa: the head_dim 256 wgmma backward's tiles exceed Hopper's 227 KB of "
                "shared memory a block");

  /// Scratch free once every product and copy is done, from K's tile on:
  /// K's and V's tiles and the stages (dK's and dV's rows on their way out).
  static constexpr std::size_t kFreeScratchBytes =
      sizeof(std::uint16_t) * (2 * std::size_t(kTileKV) + 2 * kStages * std::size_t(kTileQ));

  template <class Team>
  KOKKOS_INLINE_FUNCTION void body(const Team& team, void* raw) const {
#if KFA_CUDA_WGMMA_DEVICE
    using namespace cuda_mma;
    constexpr int kTilesS = kBlockM / 8;  // n-tiles of Sᵀ, dPᵀ (queries) per thread
    constexpr int kDqN = 128;             // dQ columns per warpgroup
    const int lane = lane_id(), warp = warp_id(), tid = team_thread_id();
    const int wg = warp / 4;
    const int wtid = tid % 128;  // thread in its warpgroup

    const FusedKeyTile team_tile = this->key_tile(team.league_rank(), kBlockN, kHeadDim);
    if (team_tile.empty()) return;
    const int b = team_tile.b, h = team_tile.h, key_begin = team_tile.key_begin;
    const FusedSeq sq = team_tile.sq;
    const long row_stride = team_tile.row_stride, q_offset = team_tile.q_offset;

    const Sw128Scratch scratch(raw);
    std::uint16_t* const sK = scratch.base<std::uint16_t>();
    std::uint16_t* const sV = sK + kTileKV;
    std::uint16_t* const sQ0 = sV + kTileKV;  // stage s: Q, then dO
    std::uint16_t* const sdS = sQ0 + 2 * kStages * kTileQ;
    float* const sdP = reinterpret_cast<float*>(sdS + kTileDS);  // the dPᵀ exchange
    float* const s_stats0 = sdP + kTileDS;                         // stage s: lse, D
    auto stage_q = [&](int s) { return sQ0 + 2 * s * kTileQ; };
    auto stage_stats = [&](int s) { return s_stats0 + 2 * s * kBlockM; };
    auto addr = [&](const void* p) { return scratch.addr(p); };

    const WgmmaBwdLoads<kHeadDim, kBlockN, kBlockM, kWarps * 32> loads(*this, tid, sq, h);
    loads.kv(key_begin, addr(sK), addr(sV));
    // Q, dO, lse and D of a query block into a stage.
    auto load_q_block = [&](int q_block, int stage) {
      loads.q_block(q_block, addr(stage_q(stage)), addr(stage_q(stage) + kTileQ),
                    stage_stats(stage));
    };

    // One m64n256 accumulator a warpgroup: dV (warpgroup 0) or dK (1).
    float acc[kHeadDim / 8][4];
#pragma unroll
    for (int n = 0; n < kHeadDim / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[n][e] = 0;
    auto& acc_flat = reinterpret_cast<float(&)[kHeadDim / 2]>(acc);
    // Sᵀ (warpgroup 0) or dPᵀ (1): rows = the team's keys, columns = queries.
    float sc[kTilesS][4];
    auto& sc_flat = reinterpret_cast<float(&)[4 * kTilesS]>(sc);
    float dq[kDqN / 8][4];
    auto& dq_flat = reinterpret_cast<float(&)[kDqN / 2]>(dq);

    // This thread's keys (rows of Sᵀ and dPᵀ), the same in both warpgroups.
    const int key_row0 = (warp % 4) * 16 + lane / 4;
    const int key0 = key_begin + key_row0;
    // The query blocks that see these keys: [first_q_block, num_q_blocks).
    int first_q_block, num_q_blocks;
    team_tile.query_blocks(kBlockN, kBlockM, first_q_block, num_q_blocks, *this);
    // Sᵀ = K·Qᵀ (warpgroup 0) or dPᵀ = V·dOᵀ (1) of a stage, issued
    // (reduction over head_dim, K-major).
    const std::uint32_t kv_addr = addr(wg == 0 ? sK : sV);
    auto issue_scores = [&](int stage) {
      const std::uint32_t qo_addr = addr(stage_q(stage) + wg * kTileQ);
      fence_operands(sc_flat);
      wgmma_fence();
      const std::uint64_t desc_a = sw128_descriptor(kv_addr, 16, 1024);
      const std::uint64_t desc_b = sw128_descriptor(qo_addr, 16, 1024);
#pragma unroll
      for (int ks = 0; ks < kHeadDim / 16; ++ks) {
        const std::uint32_t off = (ks % 4) * 32;
        Wgmma<Format, kBlockM>::ss(
            sc_flat, sw128_descriptor_add(desc_a, (ks / 4) * sw128_block_bytes(kBlockN) + off),
            sw128_descriptor_add(desc_b, (ks / 4) * sw128_block_bytes(kBlockM) + off), ks > 0);
      }
      wgmma_commit();
    };
    // dSᵀ tile addressing: key r, queries c, c + 1 at byte r·128 +
    // ((c / 8) ^ (r % 8))·16 + (c % 8)·2 (one 64-query column block). A
    // warp's 32 4-byte accesses of one call hit 32 distinct banks.
    auto tile_at = [&](std::uint16_t* tile, int r, int c) -> std::uint32_t* {
      return reinterpret_cast<std::uint32_t*>(reinterpret_cast<unsigned char*>(tile) + r * 128 +
                                              (((c / 8) ^ (r % 8)) * 16) + (c % 8) * 2);
    };
    // A fragment of k-step kk (queries 16·kk..+16) of an m64 product: this
    // thread's 4 pairs, packed from two n-tiles of an accumulator (lo = n-tile
    // 2·kk, hi = 2·kk + 1), to or from a tile.
    auto pack_frag = [&](const float(&lo)[4], const float(&hi)[4], std::uint32_t(&f)[4]) {
      f[0] = pack2<Format>(lo[0], lo[1]);
      f[1] = pack2<Format>(lo[2], lo[3]);
      f[2] = pack2<Format>(hi[0], hi[1]);
      f[3] = pack2<Format>(hi[2], hi[3]);
    };
    auto put_frag = [&](std::uint16_t* tile, int kk, const std::uint32_t(&f)[4]) {
      const int c = kk * 16 + (lane % 4) * 2;
      *tile_at(tile, key_row0, c) = f[0];
      *tile_at(tile, key_row0 + 8, c) = f[1];
      *tile_at(tile, key_row0, c + 8) = f[2];
      *tile_at(tile, key_row0 + 8, c + 8) = f[3];
    };
    auto get_frag = [&](std::uint16_t* tile, int kk, std::uint32_t(&f)[4]) {
      const int c = kk * 16 + (lane % 4) * 2;
      f[0] = *tile_at(tile, key_row0, c);
      f[1] = *tile_at(tile, key_row0 + 8, c);
      f[2] = *tile_at(tile, key_row0, c + 8);
      f[3] = *tile_at(tile, key_row0 + 8, c + 8);
    };
    // dQ = dS·K over the team's 64 keys, head dims [128·wg, +128), issued:
    // A = dS, the M-major view of dSᵀ; B = K, N-major.
    auto issue_dq = [&] {
      constexpr std::uint32_t kKeyBlock = sw128_block_bytes(kBlockN);
      const std::uint64_t desc_ds = sw128_descriptor(addr(sdS), kKeyBlock, 1024);
      const std::uint64_t desc_k_n =
          sw128_descriptor(addr(sK) + 2 * wg * kKeyBlock, kKeyBlock, 1024);
      fence_operands(dq_flat);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        const std::uint32_t key_off = kk * 16 * 128;
        Wgmma<Format, kDqN>::ss_mn(dq_flat, sw128_descriptor_add(desc_ds, key_off),
                                   sw128_descriptor_add(desc_k_n, key_off), kk > 0);
      }
      wgmma_commit();
    };
    // dQ (finished) of the block at row_begin added to the accumulator by
    // reductions (red.global.add). Straight from the fragments, a warp's
    // 8-byte reduction covers 8 rows: 8 partial lines, and the load/store
    // unit's queue, not L2, bounds the kernel. Staged (the library's), each warp
    // writes 32 columns of its 16 rows at a time to its 2 KB of the dPᵀ
    // exchange (free since barrier 2; 16-byte chunks XOR-swizzled by row),
    // then adds 4 whole 128-byte rows per instruction (16-byte
    // reductions, lane l: row l / 8, columns 4·(l % 8)..).
    auto add_dq = [&](int row_begin) {
      if constexpr (kDqStaged) {
        float* const stage = sdP + warp * 512;  // [16 rows][32 floats]
        auto chunk_at = [&](int row, int chunk) {  // 16-byte chunk of a row
          return stage + row * 32 + ((chunk ^ (row % 8)) * 4);
        };
        const int row0 = row_begin + (warp % 4) * 16;
#pragma unroll
        for (int c = 0; c < kDqN / 32; ++c) {
#pragma unroll
          for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int half = 0; half < 2; ++half) {
              const int row = lane / 4 + 8 * half, col = 8 * j + (lane % 4) * 2;
              *reinterpret_cast<float2*>(chunk_at(row, col / 4) + col % 4) =
                  make_float2(dq[4 * c + j][2 * half] * m_scale,
                              dq[4 * c + j][2 * half + 1] * m_scale);
            }
          __syncwarp();
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int row = 4 * i + lane / 8;
            const float4 v = *reinterpret_cast<const float4*>(chunk_at(row, lane % 8));
            if (row0 + row < sq.seqlen_q)
              atomicAdd(reinterpret_cast<float4*>(m_dq + q_offset +
                                                  long(row0 + row) * row_stride + wg * kDqN +
                                                  32 * c + 4 * (lane % 8)),
                        v);
          }
          __syncwarp();
        }
      } else {
        const int r = row_begin + (warp % 4) * 16 + lane / 4;
        float* const g_dq =
            m_dq + q_offset + long(r) * row_stride + wg * kDqN + (lane % 4) * 2;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          if (r + 8 * half >= sq.seqlen_q) continue;
          float* const g_row = g_dq + 8 * half * row_stride;
#pragma unroll
          for (int n = 0; n < kDqN / 8; ++n)
            atomicAdd(reinterpret_cast<float2*>(g_row + n * 8),
                      make_float2(dq[n][2 * half] * m_scale, dq[n][2 * half + 1] * m_scale));
        }
      }
    };

    auto stage_of = [&](int q_block) { return (q_block - first_q_block) % kStages; };
    if (first_q_block < num_q_blocks) load_q_block(first_q_block, 0);
    cp_async_commit();
    for (int q_block = first_q_block; q_block < num_q_blocks; ++q_block) {
      const int row_begin = q_block * kBlockM;
      const int stage = stage_of(q_block);
      cp_async_wait<0>();
      fence_proxy_async();
      // This block's stage (and K, V) is in scratch for both warpgroups'
      // wgmma, and both are done with the previous block (its stage, which
      // the next block now takes, the dSᵀ tile and the dPᵀ exchange).
      team.team_barrier();
      issue_scores(stage);
      if (q_block + 1 < num_q_blocks) load_q_block(q_block + 1, stage_of(q_block + 1));
      cp_async_commit();
      const std::uint32_t q_addr = addr(stage_q(stage));
      const std::uint32_t do_addr = q_addr + kTileQ * 2;
      const float* s_lse = stage_stats(stage);
      const float* s_delta = s_lse + kBlockM;
      wgmma_wait<0>();
      fence_operands(sc_flat);

      // Pᵀ (warpgroup 0) or dSᵀ (1) as A fragments of the m64n256 product:
      // k-step kk covers queries 16·kk..+16.
      std::uint32_t frag[kBlockM / 16][4];
      if (wg == 1) {
        // dPᵀ to warpgroup 0 (float4 i of thread t at float 4·(128·i + t):
        // a warp's stores are 512 contiguous bytes), then dSᵀ back from
        // the tile once warpgroup 0 wrote it.
#pragma unroll
        for (int n = 0; n < kTilesS; ++n)
          *reinterpret_cast<float4*>(sdP + 4 * (128 * n + wtid)) =
              make_float4(sc[n][0], sc[n][1], sc[n][2], sc[n][3]);
        // A sync, not an arrive, at barrier 1: this warpgroup has nothing to
        // do before barrier 2 anyway, and racecheck follows only syncs (with
        // an arrive it reports the dSᵀ tile's hand-off at barrier 2 as a race).
        named_barrier_sync(1, 256);
        named_barrier_sync(2, 256);
#pragma unroll
        for (int kk = 0; kk < kBlockM / 16; ++kk) get_frag(sdS, kk, frag[kk]);
      } else {
        [[maybe_unused]] BwdKeepBits<kTilesS> keep;
        if constexpr (kVariant) {
          // (sc as Sᵀ in, Pᵀ ∘ pipeline' out; the dPᵀ argument is not used.)
          bwd_variant_p<false, Format>(sc, sc, frag, keep, s_lse, s_delta, *this, sq.mask, b, h,
                                       row_begin, key_begin, key_begin + kBlockN, key0, lane);
        } else {
          bwd_probabilities(sc, s_lse, m_scale, sq.mask, row_begin, key_begin,
                            key_begin + kBlockN, key0, lane, [](int, int, int) {});
#pragma unroll
          for (int kk = 0; kk < kBlockM / 16; ++kk)
            pack_frag(sc[2 * kk], sc[2 * kk + 1], frag[kk]);
        }
        // dSᵀ = Pᵀ ∘ (dPᵀ - D) from warpgroup 1's dPᵀ, to the tile.
        named_barrier_sync(1, 256);
        if constexpr (kVariant) {
          bwd_variant_ds(
              sc, sc, [&](int n, int e) { return sdP[4 * (128 * n + wtid) + e]; }, keep, s_delta,
              *this, lane);
        } else {
#pragma unroll
          for (int n = 0; n < kTilesS; ++n) {
            const float4 dp = *reinterpret_cast<const float4*>(sdP + 4 * (128 * n + wtid));
            const int col = n * 8 + (lane % 4) * 2;
            sc[n][0] *= dp.x - s_delta[col];
            sc[n][1] *= dp.y - s_delta[col + 1];
            sc[n][2] *= dp.z - s_delta[col];
            sc[n][3] *= dp.w - s_delta[col + 1];
          }
        }
#pragma unroll
        for (int kk = 0; kk < kBlockM / 16; ++kk) {
          std::uint32_t ds[4];
          pack_frag(sc[2 * kk], sc[2 * kk + 1], ds);
          put_frag(sdS, kk, ds);
        }
        // The tile visible to warpgroup 1 and to both warpgroups' wgmma
        // (warpgroup 1 waits at barrier 2 already: it passed barrier 1 with
        // this warpgroup).
        fence_proxy_async();
        named_barrier_sync(2, 256);
      }
      // dV += Pᵀ·dO (warpgroup 0) or dK += dSᵀ·Q (1): reduction over the
      // queries, dO or Q N-major, 16 query rows per k-step.
      {
        const std::uint64_t desc_b =
            sw128_descriptor(wg == 0 ? do_addr : q_addr, sw128_block_bytes(kBlockM), 1024);
        fence_operands(acc_flat);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kBlockM / 16; ++kk)
          Wgmma<Format, kHeadDim>::rs(acc_flat, frag[kk], sw128_descriptor_add(desc_b, kk * 2048),
                                      1);
        wgmma_commit();
      }
      // dQ reads the whole dSᵀ tile, complete for both warpgroups since
      // barrier 2: issued behind dV or dK (DqOverlap, which spills)
      // or once they are done.
      if constexpr (!kDqOverlap) {
        wgmma_wait<0>();  // frag free before dQ's 64 accumulators are live
        fence_operands(acc_flat);
      }
      issue_dq();
      wgmma_wait<0>();
      fence_operands(acc_flat);
      fence_operands(dq_flat);
      add_dq(row_begin);
    }
    // dV (warpgroup 0) and dK (1, times the scale) to memory through
    // scratch (StagedRows).
    store_dk_dv_staged<kHeadDim, kBlockN, kWarps * 32, kFreeScratchBytes>(
        *this, team_tile, sK, tid, team,
        [&](auto rows, unsigned char* tile_k, unsigned char* tile_v) {
          using Rows = decltype(rows);
          Rows::template put<Format>(wg == 0 ? tile_v : tile_k, key_row0, lane, acc,
                                     wg == 0 ? 1.f : m_scale);
        });
#else
    (void)team;
    (void)raw;
    cuda_mma::trap_without_wgmma();  // not sm_90a
#endif
  }

};

}  // namespace Impl
}  // namespace kfa

#endif
