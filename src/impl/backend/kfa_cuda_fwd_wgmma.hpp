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
//
// Tma (not the library's shape; bench_device's wgmma_tma*): Q, K and V
// arrive by bulk tensor copies (kfa_cuda_tma.hpp) that one more warp of the
// team issues, each block's arrival and release told by barriers in
// scratch, so the warpgroups issue no copies and meet at no team barrier
// (FlashAttention-3's producer warp, without its register reallocation).
// RESULTS v37: at head_dim 128, teams of one warpgroup and the producer
// are level with the cp.async path (-0.3% to +2%), one team of two is 0 to
// 11% slower; at 64 both are 8-13% slower.

#include <kfa_mask.hpp>

#include <impl/backend/kfa_cuda_fwd_softmax.hpp>
#include <impl/backend/kfa_cuda_launch.hpp>
#include <impl/backend/kfa_cuda_mma.hpp>
#include <impl/backend/kfa_cuda_tma.hpp>
#include <impl/backend/kfa_cuda_wgmma.hpp>

#include <cstdint>
#include <type_traits>

namespace kfa {
namespace Impl {


/// Keys per block, teams per SM and warpgroups per team of the wgmma
/// forward, by head_dim. The warpgroups of one team meet at a barrier every
/// block, so their softmaxes run at the same time; teams do not, and while
/// one team is in its softmax another's products keep the tensor cores busy.
/// So at 64 and 128 a team is one warpgroup (64 query rows) with 64-key
/// blocks: four teams per SM at 64 (128 registers), two at 128 (230; 81 KB
/// of scratch each). RESULTS run 51: +3-7% at 128 and +3-5% at 64 over one
/// team of two warpgroups (128-key blocks) and two teams of two. At 256:
/// one team of two warpgroups and 64-key blocks (O alone takes 128
/// registers).
/// kTma, kStages: the cp.async path, double buffered (Tma is an opt-in
/// shape of the kernel, see above).
template <int HeadDim>
struct WgmmaFwdShape {
  static constexpr int kBlockN = 64;
  static constexpr int kMinBlocksPerSM = HeadDim == 64 ? 4 : HeadDim == 128 ? 2 : 1;
  static constexpr int kWarpGroups = HeadDim == 256 ? 2 : 1;
  static constexpr bool kTma = false;
  static constexpr int kStages = 2;
};

/// The tensor maps of q, k and v of a forward whose copies are bulk tensor
/// copies (FlashForwardWgmmaKernel's Tma), none otherwise.
template <bool Tma>
struct WgmmaFwdMaps {};
template <>
struct WgmmaFwdMaps<true> {
  TmaMap m_map_q, m_map_k, m_map_v;
};

template <class ExecSpace, int HeadDim, class Format, class QView, class KView, class VView,
          class OView, class LseView, bool FoldScale = true,
          int BlockN = WgmmaFwdShape<HeadDim>::kBlockN,
          int MinBlocksPerSM = WgmmaFwdShape<HeadDim>::kMinBlocksPerSM,
          int WarpGroups = WgmmaFwdShape<HeadDim>::kWarpGroups,
          bool Tma = WgmmaFwdShape<HeadDim>::kTma, int Stages = WgmmaFwdShape<HeadDim>::kStages>
class FlashForwardWgmmaKernel : public Fused16Forward, public WgmmaFwdMaps<Tma> {
 public:
  /// FoldScale: the softmax scale folded into the exponent's FFMA
  /// (fwd_softmax_scores_folded) instead of a multiply per score (+2-5% on
  /// the H200, RESULTS v12).
  static constexpr bool kFoldScale = FoldScale;
  static constexpr int kHeadDim = HeadDim;
  static constexpr int kWarpGroups = WarpGroups;
  /// Tma: K, V and Q reach scratch by bulk tensor copies that one more warp
  /// (the producer) issues, signalled by barriers in scratch; the
  /// warpgroups only compute and never meet at a team barrier
  /// (FlashForward's warp specialisation). Else every thread copies its
  /// share by cp.async and the team meets at a barrier every block.
  static constexpr bool kTma = Tma;
  static constexpr bool kTensorMaps = Tma;  // launch_cuda_team: __grid_constant__
  static constexpr int kWarps = 4 * kWarpGroups + (kTma ? 1 : 0);
  /// Threads that copy K and V: whole rows per thread step (a third
  /// warpgroup only computes).
  static constexpr int kLoadThreads = kWarpGroups == 3 ? 256 : 128 * kWarpGroups;
  static constexpr int kBlockM = 64 * kWarpGroups;
  static constexpr int kBlockN = BlockN;
  /// K/V buffers (launch_mma_kernel: opt-in scratch); more than two only
  /// with Tma (the cp.async path's order of copies is for two).
  static constexpr int kStages = Stages;
  static_assert(Stages == 2 || (Tma && Stages >= 2 && Stages <= 4),
                "kfa: the wgmma forward double-buffers K and V (2 to 4 stages with Tma)");
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
        m_num_q_blocks((m_p.seqlen_q + kBlockM - 1) / kBlockM) {
#if defined(KOKKOS_ENABLE_CUDA)
    if constexpr (kTma) {
      constexpr bool bf16 = std::is_same<Format, cuda_mma::Bf16>::value;
      const char* what = "kfa::fwd::wgmma_main_loop";
      this->m_map_q = make_tma_map_16(m_q, bf16, m_p.batch, m_p.seqlen_q, m_p.heads, kHeadDim,
                                      kBlockM, what);
      this->m_map_k = make_tma_map_16(m_k, bf16, m_p.batch, m_p.seqlen_k, m_kv.heads_kv,
                                      kHeadDim, kBlockN, what);
      this->m_map_v = make_tma_map_16(m_v, bf16, m_p.batch, m_p.seqlen_k, m_kv.heads_kv,
                                      kHeadDim, kBlockN, what);
    }
#endif
  }

  static bool fits(const ExecSpace& space) {
    return mma_kernel_fits<FlashForwardWgmmaKernel>(space);
  }

  void launch(const ExecSpace& space) const {
    launch_mma_kernel(space, "kfa::fwd::wgmma_main_loop", *this, m_p.league(m_num_q_blocks));
  }

  /// Q, then K and V per stage, and the slack that aligns the swizzle atoms
  /// to 1024 bytes.
  /// With Tma, the barriers after the tiles: Q's, and per stage K's and V's
  /// arrival and release.
  KOKKOS_INLINE_FUNCTION static constexpr std::size_t scratch_bytes() {
    return sizeof(std::uint16_t) * (std::size_t(kTileQ) + 2 * kStages * std::size_t(kTileKV)) +
           1024 + (kTma ? 8 * (1 + 4 * kStages) : 0);
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
    // One block's work once K_j is in scratch: S_j issued, and
    // P_{j-1}·V_{j-1} with it where j > 0 (pv_ready: V_{j-1} has landed),
    // then `issued` (the cp.async path's next copies); the softmax of block
    // j while P_{j-1}·V_{j-1} may still run (scores_done: S_j is done, K_j
    // no longer read), and O rescaled and P packed once that product is
    // done (pv_done: V_{j-1} no longer read).
    auto block_step = [&](int kv_block, auto&& pv_ready, auto&& issued, auto&& scores_done,
                          auto&& pv_done) {
      issue_scores(kv_block % kStages);
      if (kv_block > 0) {
        pv_ready();
        issue_pv((kv_block - 1) % kStages);
        issued();
        wgmma_wait<1>();  // S_j is done, P_{j-1}·V_{j-1} may still run
      } else {
        issued();
        wgmma_wait<0>();
      }
      scores_done();
      fence_operands(s_flat);
      float alpha[2];
      softmax(kv_block * kBlockN, alpha);
      wgmma_wait<0>();
      fence_operands(o_flat);
      if (kv_block > 0) pv_done();
      fwd_rescale(acc_o, alpha);
      pack_p();
    };
    // P·V of the last block.
    auto last_pv = [&] {
      issue_pv((num_kv_blocks - 1) % kStages);
      wgmma_wait<0>();
      fence_operands(o_flat);
    };

    if constexpr (kTma) {
      // Barriers: Q arrived; per stage K arrived, V arrived (the producer's
      // arrival with the bytes expected), K released, V released (one
      // arrival per computing warp once its wgmma that read it are done).
      const std::uint32_t bars = addr(sQ + kTileQ + 2 * kStages * kTileKV);
      const std::uint32_t full_q = bars;
      auto full_k = [&](int s) { return bars + 8 * (1 + s); };
      auto full_v = [&](int s) { return bars + 8 * (1 + kStages + s); };
      auto free_k = [&](int s) { return bars + 8 * (1 + 2 * kStages + s); };
      auto free_v = [&](int s) { return bars + 8 * (1 + 3 * kStages + s); };
      if (tid == 0) {
        mbarrier_init(full_q, 1);
        for (int s = 0; s < kStages; ++s) {
          mbarrier_init(full_k(s), 1);
          mbarrier_init(full_v(s), 1);
          mbarrier_init(free_k(s), 4 * kWarpGroups);
          mbarrier_init(free_v(s), 4 * kWarpGroups);
        }
        mbarrier_init_fence();
      }
      team.team_barrier();
      // Use i of a stage (block i, its (i / kStages)-th use) waits for phase
      // i / kStages of the arrival barrier, and for the release of use
      // i / kStages - 1 (a fresh barrier passes parity 1).
      auto parity = [](int block) { return std::uint32_t((block / kStages) & 1); };
      if (warp == 4 * kWarpGroups) {
        // The producer: Q, then K_0, and per block j K_{j+1} and V_j, the
        // order in which the warpgroups read them.
        if (lane == 0) {
          const int hk = m_kv.head(h);
          constexpr std::uint32_t kv_bytes = sizeof(std::uint16_t) * kTileKV;
          auto load_kv = [&](const TmaMap& map, std::uint32_t tile, std::uint32_t full,
                             std::uint32_t free, int kv_block) {
            if (kv_block >= kStages) mbarrier_wait(free, parity(kv_block) ^ 1);
            mbarrier_arrive_expect(full, kv_bytes);
#pragma unroll
            for (int c = 0; c < kHeadDim / 64; ++c)
              tma_load_box(tile + c * sw128_block_bytes(kBlockN), map, 64 * c, hk,
                           kv_block * kBlockN, b, full);
          };
          auto load_k = [&](int j) {
            load_kv(this->m_map_k, addr(sK(j % kStages)), full_k(j % kStages),
                    free_k(j % kStages), j);
          };
          auto load_v = [&](int j) {
            load_kv(this->m_map_v, addr(sV(j % kStages)), full_v(j % kStages),
                    free_v(j % kStages), j);
          };
          mbarrier_arrive_expect(full_q, sizeof(std::uint16_t) * kTileQ);
#pragma unroll
          for (int c = 0; c < kHeadDim / 64; ++c)
            tma_load_box(addr(sQ) + c * sw128_block_bytes(kBlockM), this->m_map_q, 64 * c, h,
                         row_begin, b, full_q);
          if (num_kv_blocks > 0) load_k(0);
          for (int j = 0; j < num_kv_blocks; ++j) {
            if (j + 1 < num_kv_blocks) load_k(j + 1);
            load_v(j);
          }
        }
        return;
      }
      mbarrier_wait(full_q, 0);
      for (int kv_block = 0; kv_block < num_kv_blocks; ++kv_block) {
        const int stage = kv_block % kStages, prev = (kv_block + kStages - 1) % kStages;
        mbarrier_wait(full_k(stage), parity(kv_block));
        block_step(
            kv_block, [&] { mbarrier_wait(full_v(prev), parity(kv_block - 1)); }, [] {},
            [&] {
              if (lane == 0) mbarrier_arrive(free_k(stage));
            },
            [&] {
              if (lane == 0) mbarrier_arrive(free_v(prev));
            });
      }
      if (num_kv_blocks > 0) {
        mbarrier_wait(full_v((num_kv_blocks - 1) % kStages), parity(num_kv_blocks - 1));
        last_pv();
      }
    } else {
      // Every thread's copies have landed and are visible to wgmma, for
      // every warpgroup (and every warpgroup is done with what the next
      // copies overwrite).
      auto sync_tiles = [&] {
        cp_async_wait<0>();
        fence_proxy_async();
        team.team_barrier();
      };
      Sw128TileLoader<kHeadDim, kBlockM, 128 * kWarpGroups>(tid).load(
          addr(sQ), gQ, row_stride, row_begin, m_p.seqlen_q);
      // K_j and V_{j-1} are read in iteration j, so the copies of iteration
      // j are K_{j+1} and V_j: K_{j+1} takes the stage of K_{j-1} (S_{j-1}
      // done in iteration j-1), V_j that of V_{j-2} (P_{j-2}·V_{j-2} done
      // in iteration j-1).
      const Sw128TileLoader<kHeadDim, kBlockN, kLoadThreads> kv_loader(tid);
      const bool loads_kv = kLoadThreads == 128 * kWarpGroups || tid < kLoadThreads;
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
        // and V_{j-2}, which no product in flight reads), so that the
        // tensor cores start without waiting for the copies' issue.
        auto load_next = [&] {
          if (kv_block + 1 < num_kv_blocks) load_k(kv_block + 1);
          load_v(kv_block);
          cp_async_commit();
        };
        block_step(kv_block, [] {}, load_next, [] {}, [] {});
      }
      if (num_kv_blocks > 0) {
        // V of the last block.
        sync_tiles();
        last_pv();
      }
      cp_async_wait<0>();
    }
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
