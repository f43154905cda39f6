#ifndef KFA_CUDA_BWD_WGMMA_HPP
#define KFA_CUDA_BWD_WGMMA_HPP

// Hopper backward for 16-bit types (dK, dV, and dQ added to an fp32
// accumulator, so not deterministic):
// warpgroup tensor cores (wgmma, sm_90a). A team of 2 warpgroups owns a
// block of 128 keys, 64 per warpgroup, and walks the query blocks (64 rows
// at head_dim 128, 128 at 64) that see them, the next block's Q, dO, lse
// and D loading (cp.async, double buffered) during the current one's
// products. Per query block, each warpgroup computes for its keys
//   Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ      wgmma m64n{M}k16, all operands from scratch
//   Pᵀ = exp2(Sᵀ·scale·log2e - lse·log2e), dSᵀ = Pᵀ ∘ (dPᵀ - D)  registers
//   dV += Pᵀ·dO, dK += dSᵀ·Q    wgmma m64n{d}k16, Pᵀ and dSᵀ from registers
//                               (rounded where computed), dO and Q N-major
// and stages dSᵀ in scratch; then dQ = dS·K·scale over all 128 keys, A =
// dS (M-major view of the dSᵀ tile), B = K (N-major): at head_dim 128 each
// warpgroup takes 64 of the head dims, at 64 its 64 of the 128 query rows.
// dQ goes to scratch (fp32, rows padded) and is
// added to the fp32 accumulator by the bulk copy engine, one
// cp.reduce.async.bulk per query row, issued after the next block's first
// barrier, instead of a red.global per value.
// Scratch at head_dim 128: K, V 2 x 32 KB, 2 x (Q, dO 2 x 16 KB, lse, D),
// the dSᵀ tile 16 KB, the dQ tile 34 KB: 179 KB; at 64: K, V 2 x 16 KB,
// 2 x (Q, dO 2 x 16 KB), dSᵀ 32 KB, dQ 36 KB: 167 KB. Tiles are 128-byte
// swizzled (kfa_cuda_wgmma.hpp); a dSᵀ tile is [M / 64][128 keys][64
// queries].

#include <kfa_mask.hpp>

#include <impl/backend/kfa_cuda_launch.hpp>
#include <impl/backend/kfa_cuda_mma.hpp>
#include <impl/backend/kfa_cuda_wgmma.hpp>

#include <cstdint>

namespace kfa {
namespace Impl {

template <class ExecSpace, int HeadDim, class Format, class QView, class KView, class VView,
          class DOView, class LseView, class DeltaView, class DQAccView, class DKView,
          class DVView>
class FlashBackwardWgmmaKernel : public Fused16Backward {
 public:
  static constexpr int kHeadDim = HeadDim;
  static constexpr int kWarps = 8;     // 2 warpgroups
  static constexpr int kBlockN = 128;  // keys per team, 64 per warpgroup
  /// Queries per step: 128 at head_dim 64 (Sᵀ and dPᵀ 64 registers each,
  /// dK and dV 32), 64 at 128 (32 and 64).
  static constexpr int kBlockM = HeadDim == 64 ? 128 : 64;
  static constexpr int kStages = 2;    // Q/dO buffers (launch_mma_kernel: opt-in scratch)
  static constexpr int kMinBlocksPerSM = 1;
  static_assert(kHeadDim == 64 || kHeadDim == 128,
                "kfa: the wgmma backward runs head_dim 64 or 128");
  /// dQ split over the warpgroups: by query rows (kBlockM 128) or by head
  /// dims (head_dim 128); either way 64 columns over all keys each.
  static constexpr bool kDqSplitRows = kBlockM == 128;
  static constexpr int kTileKV = kBlockN * kHeadDim;  // values per tile
  static constexpr int kTileQ = kBlockM * kHeadDim;
  static constexpr int kTileDS = kBlockN * kBlockM;
  /// The dQ tile in scratch, [kBlockM][kDqPitch] fp32 (8 floats of
  /// padding: a warp's 8 rows x 4 column pairs hit distinct banks in 2
  /// wavefronts; rows stay 16-byte aligned for the bulk copy).
  static constexpr int kDqPitch = kHeadDim + 8;
  static constexpr int kTileDQ = kBlockM * kDqPitch;
  using policy_t = Kokkos::TeamPolicy<ExecSpace>;

  FlashBackwardWgmmaKernel(const QView& q, const KView& k, const VView& v, const DOView& d_o,
                           const LseView& lse, const DeltaView& delta, const DQAccView& dq_acc,
                           const DKView& dk, const DVView& dv, float scale, bool causal)
      : Fused16Backward(q, k, v, d_o, lse, delta, dq_acc, dk, dv, scale, causal),
        m_num_kv_blocks((m_p.seqlen_k + kBlockN - 1) / kBlockN) {}

  static bool fits(const ExecSpace& space) {
    return mma_kernel_fits<FlashBackwardWgmmaKernel>(space);
  }

  void launch(const ExecSpace& space) const {
    launch_mma_kernel(space, "kfa::bwd::wgmma_dk_dv", *this, m_p.league(m_num_kv_blocks));
  }

  /// K, V, per stage Q, dO, lse and D, the dSᵀ and dQ tiles, and the slack
  /// that aligns the swizzle atoms to 1024 bytes.
  KOKKOS_INLINE_FUNCTION static constexpr std::size_t scratch_bytes() {
    return sizeof(std::uint16_t) * (2 * std::size_t(kTileKV) + 2 * kStages * std::size_t(kTileQ) +
                                    std::size_t(kTileDS)) +
           sizeof(float) * (std::size_t(kTileDQ) + 2 * kStages * kBlockM) + 1024;
  }

  template <class Team>
  KOKKOS_INLINE_FUNCTION void body(const Team& team, void* raw) const {
#if KFA_CUDA_WGMMA_DEVICE
    using namespace cuda_mma;
    constexpr float kLog2e = 1.4426950408889634f;
    constexpr int kTilesS = kBlockM / 8;   // n-tiles of Sᵀ (queries) per thread
    constexpr int kTilesD = kHeadDim / 8;  // n-tiles of dK, dV per thread
    constexpr int kDqN = 64;               // dQ columns per warpgroup
    const int lane = threadIdx.x, warp = threadIdx.y;
    const int tid = warp * 32 + lane;
    const int wg = warp / 4;

    const int league = team.league_rank();
    int b, h;
    const int kv_block = m_p.block_of(league, m_num_kv_blocks, b, h);
    const int key_begin = kv_block * kBlockN;
    const long row_stride = long(m_p.heads) * kHeadDim;
    const long q_offset = m_p.offset(b, h, m_p.seqlen_q, kHeadDim);
    const long k_offset = m_p.offset(b, h, m_p.seqlen_k, kHeadDim);
    const float* g_lse = m_lse + m_p.lse_offset(b, h);
    const float* g_delta = m_delta + m_p.lse_offset(b, h);

    const std::uint32_t raw_addr = smem_address(raw);
    const std::uint32_t base_addr = (raw_addr + 1023) & ~std::uint32_t(1023);
    std::uint16_t* const sK =
        reinterpret_cast<std::uint16_t*>(static_cast<unsigned char*>(raw) + (base_addr - raw_addr));
    std::uint16_t* const sV = sK + kTileKV;
    std::uint16_t* const sQ0 = sV + kTileKV;  // stage s: Q, then dO
    std::uint16_t* const sdS = sQ0 + 2 * kStages * kTileQ;
    float* const sdQ = reinterpret_cast<float*>(sdS + kTileDS);
    float* const s_stats0 = sdQ + kTileDQ;  // stage s: lse, D
    auto stage_q = [&](int s) { return sQ0 + 2 * s * kTileQ; };
    auto stage_stats = [&](int s) { return s_stats0 + 2 * s * kBlockM; };
    auto addr = [&](const void* p) {
      return base_addr + std::uint32_t(static_cast<const unsigned char*>(p) -
                                       reinterpret_cast<const unsigned char*>(sK));
    };

    {
      const Sw128TileLoader<kHeadDim, kBlockN, kWarps * 32> kv_loader(tid);
      // K and V rows of the query head's k/v head.
      const long kv_offset = m_kv.offset(m_p, b, h, kHeadDim);
      const long kv_stride = m_kv.row_stride(kHeadDim);
      kv_loader.load(addr(sK), m_k + kv_offset, kv_stride, key_begin, m_p.seqlen_k);
      kv_loader.load(addr(sV), m_v + kv_offset, kv_stride, key_begin, m_p.seqlen_k);
    }
    // Q, dO, lse and D of a query block into a stage. Rows past seqlen_q
    // read 0: S = dP = D = 0 there and dO = 0, so nothing reaches dK or dV,
    // and their dQ is not stored.
    const Sw128TileLoader<kHeadDim, kBlockM, kWarps * 32> q_loader(tid);
    auto load_q_block = [&](int q_block, int stage) {
      const int row_begin = q_block * kBlockM;
      q_loader.load(addr(stage_q(stage)), m_q + q_offset, row_stride, row_begin, m_p.seqlen_q);
      q_loader.load(addr(stage_q(stage) + kTileQ), m_do + q_offset, row_stride, row_begin,
                    m_p.seqlen_q);
      if (tid < kBlockM) {
        const int row = row_begin + tid;
        const bool ok = row < m_p.seqlen_q;
        float* stats = stage_stats(stage);
        cp_async_small<4>(stats + tid, g_lse + (ok ? row : 0), ok ? 4 : 0);
        cp_async_small<4>(stats + kBlockM + tid, g_delta + (ok ? row : 0), ok ? 4 : 0);
      }
    };

    float acc_dk[1][kTilesD][4], acc_dv[1][kTilesD][4];
#pragma unroll
    for (int n = 0; n < kTilesD; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_dk[0][n][e] = acc_dv[0][n][e] = 0;
    auto& dk_flat = reinterpret_cast<float(&)[4 * kTilesD]>(acc_dk);
    auto& dv_flat = reinterpret_cast<float(&)[4 * kTilesD]>(acc_dv);
    float st[kTilesS][4], dpt[kTilesS][4];
    auto& st_flat = reinterpret_cast<float(&)[4 * kTilesS]>(st);
    auto& dpt_flat = reinterpret_cast<float(&)[4 * kTilesS]>(dpt);
    float dq[kDqN / 8][4];
    auto& dq_flat = reinterpret_cast<float(&)[kDqN / 2]>(dq);

    // This thread's keys (rows of Sᵀ): warp = 4·wg + warp in group.
    const int key0 = key_begin + warp * 16 + lane / 4, key1 = key0 + 8;
    const int first_q_block = m_p.mask.row_begin(key_begin) / kBlockM;
    const int num_q_blocks = (m_p.seqlen_q + kBlockM - 1) / kBlockM;
    const std::uint32_t k_addr = addr(sK) + wg * 64 * 128;  // this warpgroup's 64 keys
    const std::uint32_t v_addr = addr(sV) + wg * 64 * 128;
    // Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ of a query block's stage, issued (reduction
    // over head_dim, K-major).
    auto issue_scores = [&](int stage) {
      const std::uint32_t q_addr = addr(stage_q(stage));
      const std::uint32_t do_addr = q_addr + kTileQ * 2;
      fence_operands(st_flat);
      fence_operands(dpt_flat);
      wgmma_fence();
      // Descriptors built once per operand, stepped by constants.
      const std::uint64_t desc_k = sw128_descriptor(k_addr, 16, 1024);
      const std::uint64_t desc_v = sw128_descriptor(v_addr, 16, 1024);
      const std::uint64_t desc_q = sw128_descriptor(q_addr, 16, 1024);
      const std::uint64_t desc_do = sw128_descriptor(do_addr, 16, 1024);
#pragma unroll
      for (int ks = 0; ks < kHeadDim / 16; ++ks) {
        const std::uint32_t off = (ks % 4) * 32;
        const std::uint32_t col_kv = (ks / 4) * sw128_block_bytes(kBlockN) + off;
        const std::uint32_t col_q = (ks / 4) * sw128_block_bytes(kBlockM) + off;
        Wgmma<Format, kBlockM>::ss(st_flat, sw128_descriptor_add(desc_k, col_kv),
                                   sw128_descriptor_add(desc_q, col_q), ks > 0);
        Wgmma<Format, kBlockM>::ss(dpt_flat, sw128_descriptor_add(desc_v, col_kv),
                                   sw128_descriptor_add(desc_do, col_q), ks > 0);
      }
      wgmma_commit();
    };

    // dQ of the query block at row dq_row_begin, from its tile in scratch
    // to the accumulator: thread r < kBlockM of warpgroup 0 adds row r (one
    // bulk reduction each). (The address keeps the term wg · kTileDQ, 0 for
    // every issuer: without it ptxas spills 16 bytes at head_dim 128.)
    const int dq_row = tid % 128;
    const bool dq_issuer = dq_row < kBlockM && wg < 1;
    auto add_dq = [&](int dq_row_begin) {
      if (!dq_issuer || dq_row_begin + dq_row >= m_p.seqlen_q) return;
      bulk_reduce_add_f32(m_dq_acc + q_offset + long(dq_row_begin + dq_row) * row_stride,
                          addr(sdQ + wg * kTileDQ + dq_row * kDqPitch),
                          kHeadDim * sizeof(float));
      bulk_commit();
    };

    auto stage_of = [&](int q_block) { return (q_block - first_q_block) % kStages; };
    if (first_q_block < num_q_blocks) load_q_block(first_q_block, 0);
    cp_async_commit();
    for (int q_block = first_q_block; q_block < num_q_blocks; ++q_block) {
      const int row_begin = q_block * kBlockM;
      const int stage = stage_of(q_block);
      cp_async_wait<0>();
      fence_proxy_async();
      // This block's stage (and K, V) is in scratch for every warpgroup's
      // wgmma, and every warpgroup is done with the previous block (its
      // stage, which the next block now takes, and dSᵀ).
      team.team_barrier();
      issue_scores(stage);
      // While the tensor cores run: the previous block's dQ tile (written
      // and fenced by every thread before the barrier) is added to the
      // accumulator, and the next block loads into the previous one's
      // stage (no product in flight reads it).
      if (q_block > first_q_block) add_dq(row_begin - kBlockM);
      if (q_block + 1 < num_q_blocks) load_q_block(q_block + 1, stage_of(q_block + 1));
      cp_async_commit();
      const std::uint32_t q_addr = addr(stage_q(stage));
      const std::uint32_t do_addr = q_addr + kTileQ * 2;
      const float* s_lse = stage_stats(stage);
      const float* s_delta = s_lse + kBlockM;
      wgmma_wait<0>();
      fence_operands(st_flat);
      fence_operands(dpt_flat);

      // Pᵀ and dSᵀ in registers (rows = keys, columns = queries).
      const bool needs_mask = m_p.mask.tile_needs_mask(row_begin, row_begin + kBlockM, key_begin,
                                                       key_begin + kBlockN);
      const float scale_log2 = m_scale * kLog2e;
      unswitch_mask(needs_mask, [&](auto masked) {
#pragma unroll
        for (int n = 0; n < kTilesS; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int col = n * 8 + (lane % 4) * 2 + (e & 1);
            const int key = e < 2 ? key0 : key1;
            float p = exp2_fast(fmaf(st[n][e], scale_log2, -s_lse[col] * kLog2e));
            if (decltype(masked)::value && m_p.mask.masked(row_begin + col, key)) p = 0.f;
            st[n][e] = p;
            dpt[n][e] = p * (dpt[n][e] - s_delta[col]);
          }
      });
      std::uint32_t p_frag[kBlockM / 16][4], ds_frag[kBlockM / 16][4];
#pragma unroll
      for (int kk = 0; kk < kBlockM / 16; ++kk) {
        p_frag[kk][0] = pack2<Format>(st[2 * kk][0], st[2 * kk][1]);
        p_frag[kk][1] = pack2<Format>(st[2 * kk][2], st[2 * kk][3]);
        p_frag[kk][2] = pack2<Format>(st[2 * kk + 1][0], st[2 * kk + 1][1]);
        p_frag[kk][3] = pack2<Format>(st[2 * kk + 1][2], st[2 * kk + 1][3]);
        ds_frag[kk][0] = pack2<Format>(dpt[2 * kk][0], dpt[2 * kk][1]);
        ds_frag[kk][1] = pack2<Format>(dpt[2 * kk][2], dpt[2 * kk][3]);
        ds_frag[kk][2] = pack2<Format>(dpt[2 * kk + 1][0], dpt[2 * kk + 1][1]);
        ds_frag[kk][3] = pack2<Format>(dpt[2 * kk + 1][2], dpt[2 * kk + 1][3]);
      }
      // dSᵀ to scratch, swizzled: key r, queries 64·b + c, c + 1 at byte
      // b·(the bytes of a 128-key column block) + r·128 + ((c / 8) ^
      // (r % 8))·16 + (c % 8)·2.
      {
        const int r0 = warp * 16 + lane / 4;
        unsigned char* ds_bytes = reinterpret_cast<unsigned char*>(sdS);
        auto put = [&](int r, int b, int c, std::uint32_t v) {
          *reinterpret_cast<std::uint32_t*>(ds_bytes + b * sw128_block_bytes(kBlockN) + r * 128 +
                                            (((c / 8) ^ (r % 8)) * 16) + (c % 8) * 2) = v;
        };
#pragma unroll
        for (int kk = 0; kk < kBlockM / 16; ++kk) {
          const int b = kk / 4, c = (kk % 4) * 16 + (lane % 4) * 2;
          put(r0, b, c, ds_frag[kk][0]);
          put(r0 + 8, b, c, ds_frag[kk][1]);
          put(r0, b, c + 8, ds_frag[kk][2]);
          put(r0 + 8, b, c + 8, ds_frag[kk][3]);
        }
      }

      // dV += Pᵀ·dO, dK += dSᵀ·Q (reduction over the queries: dO and Q
      // N-major, 16 query rows per k-step, column blocks of 64 head dims).
      fence_operands(dv_flat);
      fence_operands(dk_flat);
      wgmma_fence();
      const std::uint64_t desc_do_n =
          sw128_descriptor(do_addr, sw128_block_bytes(kBlockM), 1024);
      const std::uint64_t desc_q_n = sw128_descriptor(q_addr, sw128_block_bytes(kBlockM), 1024);
#pragma unroll
      for (int kk = 0; kk < kBlockM / 16; ++kk) {
        Wgmma<Format, kHeadDim>::rs(dv_flat, p_frag[kk],
                                    sw128_descriptor_add(desc_do_n, kk * 2048), 1);
        Wgmma<Format, kHeadDim>::rs(dk_flat, ds_frag[kk],
                                    sw128_descriptor_add(desc_q_n, kk * 2048), 1);
      }
      wgmma_commit();

      fence_proxy_async();
      // The dQ tile's bulk reads (issued after the first barrier) are done
      // before anyone writes it again.
      if (dq_issuer) bulk_wait_read();
      // The whole dSᵀ tile is in scratch, visible to wgmma.
      team.team_barrier();

      // dQ = dS·K over all keys: A = dS, the M-major view of dSᵀ (rows =
      // keys = k; query rows [64·wg, +64) are column block wg); B = K
      // (N-major, head dims [64·wg, +64) are column block wg).
      const int dq_row0 = kDqSplitRows ? 64 * wg : 0;
      const int dq_col0 = kDqSplitRows ? 0 : 64 * wg;
      constexpr std::uint32_t kKeyBlock = sw128_block_bytes(kBlockN);
      const std::uint64_t desc_ds =
          sw128_descriptor(addr(sdS) + (dq_row0 / 64) * kKeyBlock, kKeyBlock, 1024);
      const std::uint64_t desc_k_n =
          sw128_descriptor(addr(sK) + (dq_col0 / 64) * kKeyBlock, kKeyBlock, 1024);
      fence_operands(dq_flat);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        const std::uint32_t key_off = kk * 16 * 128;
        Wgmma<Format, kDqN>::ss_mn(dq_flat, sw128_descriptor_add(desc_ds, key_off),
                                   sw128_descriptor_add(desc_k_n, key_off), kk > 0);
      }
      wgmma_commit();
      wgmma_wait<0>();  // dQ, and dV, dK of this block
      fence_operands(dv_flat);
      fence_operands(dk_flat);
      fence_operands(dq_flat);

      // dQ to its tile: rows dq_row0 + 16·(warp in group) + lane / 4 (+ 8),
      // columns dq_col0 + 8n + 2·(lane % 4); visible to the bulk copy after
      // the fence and the next barrier.
      float* const my_dq = sdQ + dq_row0 * kDqPitch + dq_col0;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = (warp % 4) * 16 + lane / 4 + half * 8;
#pragma unroll
        for (int n = 0; n < kDqN / 8; ++n) {
          *reinterpret_cast<float2*>(my_dq + r * kDqPitch + n * 8 + (lane % 4) * 2) =
              make_float2(dq[n][2 * half] * m_scale, dq[n][2 * half + 1] * m_scale);
        }
      }
      fence_proxy_async();
    }
    if (first_q_block < num_q_blocks) {
      team.team_barrier();
      add_dq((num_q_blocks - 1) * kBlockM);
    }
    // No copy may still be in flight when the team ends (K and V, where no
    // query block sees these keys; the last dQ).
    cp_async_wait<0>();
    if (dq_issuer) bulk_wait();

#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int key = half == 0 ? key0 : key1;
      if (key >= m_p.seqlen_k) continue;
      const long at = k_offset + long(key) * row_stride + (lane % 4) * 2;
#pragma unroll
      for (int n = 0; n < kTilesD; ++n)
        store_dk_dv<Format>(at + n * 8, acc_dk[0][n][2 * half] * m_scale,
                            acc_dk[0][n][2 * half + 1] * m_scale, acc_dv[0][n][2 * half],
                            acc_dv[0][n][2 * half + 1]);
    }
#elif defined(__CUDA_ARCH__)
    // Device code without wgmma (not sm_90a): never launched there
    // (wgmma_available); a launch anyway stops the kernel.
    (void)team;
    (void)raw;
    __trap();
#else
    (void)team;
    (void)raw;
#endif
  }

 private:
  int m_num_kv_blocks;
};

}  // namespace Impl
}  // namespace kfa

#endif
