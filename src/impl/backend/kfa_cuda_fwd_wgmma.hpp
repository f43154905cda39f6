#ifndef KFA_CUDA_FWD_WGMMA_HPP
#define KFA_CUDA_FWD_WGMMA_HPP

// Hopper forward for 16-bit types: warpgroup tensor cores (wgmma, sm_90a).
// A team of WarpGroups warpgroups (1 to 3, WgmmaFwdShape) owns 64 query
// rows per warpgroup; K and V blocks of BlockN keys stream through team
// scratch, double buffered, by cp.async. Per block j, every warpgroup
//   S = Q·K_jᵀ    wgmma m64n{BlockN}k16, Q and K from scratch (K-major),
//   online softmax in registers (base 2, the scale folded into the FFMA),
//   O += P·V_j    wgmma m64n{head_dim}k16, P from registers (rounded to the
//                 operand format where it was computed), V from scratch
//                 (MN-major),
// P_{j-1}·V_{j-1} running on the tensor cores while the softmax of block j
// runs (FlashAttention-3's intra-warpgroup overlap).
// One wgmma instruction is a 64 x N x 16 product of a whole warpgroup,
// issued once instead of 4·N/8 mma.sync, with its operands read by the
// tensor cores from scratch: no ldmatrix, no fragment registers for Q, K
// or V. Scratch tiles are 128-byte swizzled (kfa_cuda_wgmma.hpp).
// Scratch at head_dim 128, 64 query rows, 64 keys: Q 16 KB, K and V
// 2 x 2 x 16 KB, 81 KB with the alignment slack (two teams per SM); at
// head_dim 256, 128 rows and 64 keys, 193 KB.

#include <kfa_mask.hpp>

#include <impl/backend/kfa_cuda_fwd_softmax.hpp>
#include <impl/backend/kfa_cuda_launch.hpp>
#include <impl/backend/kfa_cuda_mma.hpp>
#include <impl/backend/kfa_cuda_wgmma.hpp>

#include <cstdint>

namespace kfa {
namespace Impl {


/// Keys per block, teams per SM and warpgroups per team of the wgmma
/// forward, by head_dim. The warpgroups of one team meet at a barrier every
/// block, so their softmaxes run at the same time; teams do not, and while
/// one team is in its softmax another's products keep the tensor cores busy.
/// So at 64 and 128 a team is one warpgroup (64 query rows) with 64-key
/// blocks: four teams per SM at 64 (128 registers), two at 128 (214; 81 KB
/// of scratch each). RESULTS run 51: +3-7% at 128 and +3-5% at 64 over one
/// team of two warpgroups (128-key blocks) and two teams of two. At 256:
/// one team of two warpgroups and 64-key blocks (O alone takes 128
/// registers).
template <int HeadDim>
struct WgmmaFwdShape {
  static constexpr int kBlockN = 64;
  static constexpr int kMinBlocksPerSM = HeadDim == 64 ? 4 : HeadDim == 128 ? 2 : 1;
  static constexpr int kWarpGroups = HeadDim == 256 ? 2 : 1;
};

template <class ExecSpace, int HeadDim, class Format, class QView, class KView, class VView,
          class OView, class LseView, bool FoldScale = true,
          int BlockN = WgmmaFwdShape<HeadDim>::kBlockN,
          int MinBlocksPerSM = WgmmaFwdShape<HeadDim>::kMinBlocksPerSM,
          int WarpGroups = WgmmaFwdShape<HeadDim>::kWarpGroups>
class FlashForwardWgmmaKernel : public Fused16Forward {
 public:
  /// FoldScale: the softmax scale folded into the exponent's FFMA
  /// (fwd_softmax_scores_folded) instead of a multiply per score (+2-5% on
  /// the H200, RESULTS v12).
  static constexpr bool kFoldScale = FoldScale;
  static constexpr int kHeadDim = HeadDim;
  static constexpr int kWarpGroups = WarpGroups;
  static constexpr int kWarps = 4 * kWarpGroups;
  /// Threads that copy K and V: whole rows per thread step (a third
  /// warpgroup only computes).
  static constexpr int kLoadThreads = kWarpGroups == 3 ? 256 : 32 * kWarps;
  static constexpr int kBlockM = 64 * kWarpGroups;
  static constexpr int kBlockN = BlockN;
  static constexpr int kStages = 2;  // K/V buffers (launch_mma_kernel: opt-in scratch)
  static constexpr int kMinBlocksPerSM = MinBlocksPerSM;
  static_assert(kBlockN == 64 || kBlockN == 128, "kfa: the wgmma forward takes 64 or 128 keys");
  static_assert(kWarpGroups >= 1 && kWarpGroups <= 3,
                "kfa: the wgmma forward runs 1 to 3 warpgroups of 64 query rows");
  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256,
                "kfa: the wgmma forward runs head_dim 64, 128 or 256");
  static constexpr int kTileQ = kBlockM * kHeadDim;  // values per tile
  static constexpr int kTileKV = kBlockN * kHeadDim;
  using policy_t = Kokkos::TeamPolicy<ExecSpace>;

  FlashForwardWgmmaKernel(const QView& q, const KView& k, const VView& v, const OView& o,
                          const LseView& lse, float scale, bool causal)
      : Fused16Forward(q, k, v, o, lse, scale, causal),
        m_num_q_blocks((m_p.seqlen_q + kBlockM - 1) / kBlockM) {}

  static bool fits(const ExecSpace& space) {
    return mma_kernel_fits<FlashForwardWgmmaKernel>(space);
  }

  void launch(const ExecSpace& space) const {
    launch_mma_kernel(space, "kfa::fwd::wgmma_main_loop", *this, m_p.league(m_num_q_blocks));
  }

  /// Q, then K and V per stage, and the slack that aligns the swizzle atoms
  /// to 1024 bytes.
  KOKKOS_INLINE_FUNCTION static constexpr std::size_t scratch_bytes() {
    return sizeof(std::uint16_t) * (std::size_t(kTileQ) + 2 * kStages * std::size_t(kTileKV)) +
           1024;
  }

  template <class Team>
  KOKKOS_INLINE_FUNCTION void body(const Team& team, void* raw) const {
#if KFA_CUDA_WGMMA_DEVICE
    using namespace cuda_mma;
    const int lane = threadIdx.x, warp = threadIdx.y;
    const int tid = warp * 32 + lane;
    const int wg = warp / 4;

    const int league = team.league_rank();
    int b, h;
    // Longest rows first under the causal mask.
    const int q_block = m_num_q_blocks - 1 - m_p.block_of(league, m_num_q_blocks, b, h);
    const int row_begin = q_block * kBlockM;
    const long row_stride = long(m_p.heads) * kHeadDim;
    const std::uint16_t* gQ = m_q + m_p.offset(b, h, m_p.seqlen_q, kHeadDim);
    const std::uint16_t* gK = m_k + m_kv.offset(m_p, b, h, kHeadDim);
    const std::uint16_t* gV = m_v + m_kv.offset(m_p, b, h, kHeadDim);
    const long kv_stride = m_kv.row_stride(kHeadDim);

    // Tiles at a 1024-aligned shared address.
    const std::uint32_t raw_addr = smem_address(raw);
    const std::uint32_t base_addr = (raw_addr + 1023) & ~std::uint32_t(1023);
    std::uint16_t* const sQ =
        reinterpret_cast<std::uint16_t*>(static_cast<unsigned char*>(raw) + (base_addr - raw_addr));
    auto sK = [&](int stage) { return sQ + kTileQ + 2 * stage * kTileKV; };
    auto sV = [&](int stage) { return sK(stage) + kTileKV; };
    auto addr = [&](const std::uint16_t* p) {
      return base_addr + std::uint32_t(reinterpret_cast<const unsigned char*>(p) -
                                       reinterpret_cast<const unsigned char*>(sQ));
    };

    const int rows = imin(kBlockM, m_p.seqlen_q - row_begin);
    const int key_end = m_p.mask.key_end(row_begin + rows);
    const int num_kv_blocks = (key_end + kBlockN - 1) / kBlockN;
    // This thread's rows: row0 and row0 + 8 (warp = 4·wg + warp in group).
    const int row0 = row_begin + warp * 16 + lane / 4;

    float acc_o[1][kTilesO][4];
    float s[1][kTilesS][4];
    for (int n = 0; n < kTilesO; ++n)
      acc_o[0][n][0] = acc_o[0][n][1] = acc_o[0][n][2] = acc_o[0][n][3] = 0;
    float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0, 0};
    auto& o_flat = reinterpret_cast<float(&)[4 * kTilesO]>(acc_o);
    auto& s_flat = reinterpret_cast<float(&)[4 * kTilesS]>(s);

    // This warpgroup's 64 Q rows: 64 · 128 bytes into each column block.
    const std::uint32_t q_addr = addr(sQ) + wg * 64 * 128;
    // S = Q·K_jᵀ issued (not waited for): head_dim / 16 k-steps, 4 per
    // 64-value column block.
    // Descriptors are built once per operand and stepped by constants.
    const std::uint64_t desc_q0 = sw128_descriptor(q_addr, 16, 1024);
    auto issue_scores = [&](int stage) {
      const std::uint64_t desc_k0 = sw128_descriptor(addr(sK(stage)), 16, 1024);
      fence_operands(s_flat);
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < kHeadDim / 16; ++ks) {
        const std::uint32_t col = ks / 4, step = (ks % 4) * 32;
        Wgmma<Format, kBlockN>::ss(
            s_flat, sw128_descriptor_add(desc_q0, col * sw128_block_bytes(kBlockM) + step),
            sw128_descriptor_add(desc_k0, col * sw128_block_bytes(kBlockN) + step),
            ks > 0 ? 1 : 0);
      }
      wgmma_commit();
    };
    // O += P·V issued: P's 16-key slice kk is the A operand of k-step kk.
    std::uint32_t p[kBlockN / 16][4];
    auto issue_pv = [&](int stage) {
      const std::uint64_t desc_v0 =
          sw128_descriptor(addr(sV(stage)), sw128_block_bytes(kBlockN), 1024);
      fence_operands(o_flat);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk)
        Wgmma<Format, kHeadDim>::rs(o_flat, p[kk], sw128_descriptor_add(desc_v0, kk * 16 * 128),
                                    1);
      wgmma_commit();
    };
    auto pack_p = [&] {
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        p[kk][0] = pack2<Format>(s[0][2 * kk][0], s[0][2 * kk][1]);
        p[kk][1] = pack2<Format>(s[0][2 * kk][2], s[0][2 * kk][3]);
        p[kk][2] = pack2<Format>(s[0][2 * kk + 1][0], s[0][2 * kk + 1][1]);
        p[kk][3] = pack2<Format>(s[0][2 * kk + 1][2], s[0][2 * kk + 1][3]);
      }
    };
    auto softmax = [&](int key_begin, float (&alpha)[2]) {
      const bool needs_mask =
          m_p.mask.tile_needs_mask(row_begin, row_begin + kBlockM, key_begin, key_begin + kBlockN);
      if constexpr (kFoldScale)
        fwd_softmax_scores_folded(s, row_max, row_sum, alpha, m_p.mask, needs_mask, m_scale_log2,
                                  row0, key_begin);
      else
        fwd_softmax_scores(s, row_max, row_sum, alpha, m_p.mask, needs_mask, m_scale_log2, row0,
                           key_begin);
    };
    // Every thread's copies have landed and are visible to wgmma, for every
    // warpgroup (and every warpgroup is done with what the next copies
    // overwrite).
    auto sync_tiles = [&] {
      cp_async_wait<0>();
      fence_proxy_async();
      team.team_barrier();
    };

    Sw128TileLoader<kHeadDim, kBlockM, kWarps * 32>(tid).load(addr(sQ), gQ, row_stride,
                                                              row_begin, m_p.seqlen_q);
    // K_j and V_{j-1} are read in iteration j, so the copies of iteration
    // j are K_{j+1} and V_j: K_{j+1} takes the stage of K_{j-1} (S_{j-1}
    // done in iteration j-1), V_j that of V_{j-2} (P_{j-2}·V_{j-2} done
    // in iteration j-1).
    const Sw128TileLoader<kHeadDim, kBlockN, kLoadThreads> kv_loader(tid);
    const bool loads_kv = kLoadThreads == 32 * kWarps || tid < kLoadThreads;
    auto load_k = [&](int kv_block) {
      if (loads_kv)
        kv_loader.load(addr(sK(kv_block % kStages)), gK, kv_stride, kv_block * kBlockN,
                       m_p.seqlen_k);
    };
    auto load_v = [&](int kv_block) {
      if (loads_kv)
        kv_loader.load(addr(sV(kv_block % kStages)), gV, kv_stride, kv_block * kBlockN,
                       m_p.seqlen_k);
    };
    if (num_kv_blocks > 0) load_k(0);
    cp_async_commit();
    for (int kv_block = 0; kv_block < num_kv_blocks; ++kv_block) {
      sync_tiles();
      // The products first, then the copies (into the stages of K_{j-1}
      // and V_{j-2}, which no product in flight reads), so that the tensor
      // cores start without waiting for the copies' issue.
      issue_scores(kv_block % kStages);
      auto load_next = [&] {
        if (kv_block + 1 < num_kv_blocks) load_k(kv_block + 1);
        load_v(kv_block);
        cp_async_commit();
      };
      if (kv_block > 0) {
        issue_pv((kv_block - 1) % kStages);
        load_next();
        wgmma_wait<1>();  // S_j is done, P_{j-1}·V_{j-1} may still run
      } else {
        load_next();
        wgmma_wait<0>();
      }
      fence_operands(s_flat);
      float alpha[2];
      softmax(kv_block * kBlockN, alpha);
      wgmma_wait<0>();
      fence_operands(o_flat);
      fwd_rescale(acc_o, alpha);
      pack_p();
    }
    if (num_kv_blocks > 0) {
      // V of the last block.
      sync_tiles();
      issue_pv((num_kv_blocks - 1) % kStages);
      wgmma_wait<0>();
      fence_operands(o_flat);
    }
    cp_async_wait<0>();
    fwd_write_output<Format>(acc_o, row_max, row_sum, row0, m_p.seqlen_q,
                             m_o + m_p.offset(b, h, m_p.seqlen_q, kHeadDim), row_stride,
                             m_lse + m_p.lse_offset(b, h));
#elif defined(__CUDA_ARCH__)
    // Device code without wgmma (not sm_90a): the dispatch never launches
    // this kernel there (wgmma_available); a launch anyway stops it.
    (void)team;
    (void)raw;
    __trap();
#else
    (void)team;
    (void)raw;
#endif
  }

 private:
  static constexpr int kTilesS = kBlockN / 8;   // n-tiles of S per thread
  static constexpr int kTilesO = kHeadDim / 8;  // n-tiles of O per thread

  int m_num_q_blocks;
};

}  // namespace Impl
}  // namespace kfa

#endif
