#ifndef KFA_DETAIL_BACKEND_CUDA_FORWARD_WGMMA_HPP
#define KFA_DETAIL_BACKEND_CUDA_FORWARD_WGMMA_HPP

// Hopper forward for 16-bit types: warpgroup tensor cores (wgmma, sm_90a).
// A team of WarpGroups warpgroups (1 to 3, WgmmaFwdShape) owns 64 query
// rows per warpgroup; K and V blocks of BlockN keys stream through team
// scratch, double buffered. Per block j, every warpgroup
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
// or V. Scratch tiles are 128-byte swizzled
// (kfa/detail/backend/cuda/primitives/wgmma.hpp).
//
// How the tiles reach scratch:
// - Tma (the library's shapes, WgmmaFwdShape): by bulk tensor copies
//   (kfa/detail/backend/cuda/primitives/tma.hpp) that a producer issues,
//   each block's arrival and release told by barriers in scratch, so the
//   warpgroups issue no copies
//   and meet at no team barrier (FlashAttention-3's warp specialisation).
//   With Realloc the producer is a warpgroup that keeps 24 registers a
//   thread and the computing warpgroups take the rest (setmaxnreg), 240
//   each for two: S, P and O of 64 x 128 per warpgroup fit, so blocks are
//   128 keys. Without it the producer is one more warp, and the block's
//   warps share the registers evenly (168 a thread with nine warps, too
//   few for 128-key blocks). With Persistent one team per SM
//   runs tile after tile.
//   Scratch at head_dim 128, 128 rows, 128 keys: Q 32 KB, K and V
//   2 x 2 x 32 KB, 161 KB with the alignment slack and barriers; at 256,
//   64 keys: 193 KB; at 64, 192 rows: 89 KB.
// - Else every thread copies its share by cp.async and the team meets at a
//   barrier every block (WgmmaFwdShortCausalShape: 64 rows, 64 keys, 41 KB
//   at head_dim 64).

#include <kfa/detail/attention/mask.hpp>

#include <kfa/detail/backend/cuda/forward/softmax.hpp>
#include <kfa/detail/backend/cuda/primitives/launch.hpp>
#include <kfa/detail/backend/cuda/primitives/mma.hpp>
#include <kfa/detail/backend/cuda/primitives/tma.hpp>
#include <kfa/detail/backend/cuda/primitives/wgmma.hpp>
#include <kfa/detail/common/workspace.hpp>

#include <cstdint>
#include <type_traits>

namespace kfa {
namespace Impl {

/// The shape of the wgmma forward, by head_dim: teams of 128 query rows
/// (two warpgroups; 192, three, at 64) fed by a producer warpgroup's bulk
/// tensor copies, whose registers the others take (Realloc: 240 a thread
/// for two, 160 for three; S, P and O of 64 rows x 128 keys fit without
/// spills), 128-key blocks (64 at 256, where O alone takes 128 registers).
/// At 64 and 128 one persistent team per SM (Persistent), at 256 a team per
/// tile.
template <int HeadDim>
struct WgmmaFwdShape {
  static constexpr int kBlockN = HeadDim == 256 ? 64 : 128;
  static constexpr int kMinBlocksPerSM = 1;
  static constexpr int kWarpGroups = HeadDim == 64 ? 3 : 2;
  static constexpr bool kTma = true;
  static constexpr int kStages = 2;
  static constexpr bool kRealloc = true;
  static constexpr bool kPersistent = HeadDim != 256;
};

/// The shape for short sequences under the causal mask (head_dim 64;
/// wgmma_fwd_short_causal): teams of one warpgroup (64 query rows) with
/// 64-key blocks by cp.async, four per SM at 64 (two at 128), whose tiles
/// of few key blocks overlap on an SM.
template <int HeadDim>
struct WgmmaFwdShortCausalShape {
  static constexpr int kBlockN = 64;
  static constexpr int kMinBlocksPerSM = HeadDim == 64 ? 4 : 2;
  static constexpr int kWarpGroups = 1;
  static constexpr bool kTma = false;
  static constexpr int kStages = 2;
  static constexpr bool kRealloc = false;
  static constexpr bool kPersistent = false;
};

/// Whether a forward at HeadDim over seqlen_k keys takes
/// WgmmaFwdShortCausalShape: causal, head_dim 64 and at most 1024 keys,
/// where its overlapping teams beat WgmmaFwdShape's persistent ones (from
/// 2048 keys at 64, and at every length at 128, the persistent shape is
/// the faster).
/// Packed batches whose sequences are all 128 rows or shorter take it too
/// (`max_seqlen_q`, 0 for fixed-length batches): a 192-row team would leave
/// most of its rows empty.
template <int HeadDim>
inline bool wgmma_fwd_short_causal(bool causal, long seqlen_k, int max_seqlen_q = 0) {
  return HeadDim == 64 &&
         ((causal && seqlen_k <= 1024) || (max_seqlen_q > 0 && max_seqlen_q <= 128));
}

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
          bool Tma = WgmmaFwdShape<HeadDim>::kTma, int Stages = WgmmaFwdShape<HeadDim>::kStages,
          bool Realloc = WgmmaFwdShape<HeadDim>::kRealloc,
          bool Persistent = WgmmaFwdShape<HeadDim>::kPersistent, class VariantT = PlainVariant>
class FlashForwardWgmmaKernel : public Fused16Forward,
                                public WgmmaFwdMaps<Tma>,
                                public FusedVariantParams<VariantT> {
 public:
  using variant_params = FusedVariantParams<VariantT>;
  /// The variant's pipeline applied to each score fragment (fwd_variant_*):
  /// the scale is then applied before it, not folded into the exponent.
  static constexpr bool kVariant = variant_params::kVariant;
  /// FoldScale: the softmax scale folded into the exponent's FFMA
  /// (fwd_softmax_scores_folded) instead of a multiply per score.
  static constexpr bool kFoldScale = FoldScale;
  static constexpr int kHeadDim = HeadDim;
  static constexpr int kWarpGroups = WarpGroups;
  /// Tma: K, V and Q reach scratch by bulk tensor copies that a producer
  /// warp issues, signalled by barriers in scratch; the warpgroups only
  /// compute and never meet at a team barrier (FlashAttention-3's warp
  /// specialisation). Else every thread copies its share by cp.async and
  /// the team meets at a barrier every block.
  static constexpr bool kTma = Tma;
  static constexpr bool kTensorMaps = Tma;  // launch_cuda_team: __grid_constant__
  /// Realloc (with Tma): the producer is a warpgroup of its own (one warp
  /// of it copies) that gives its registers up to kProducerRegs, and the
  /// computing warpgroups take them, up to kConsumerRegs (setmaxnreg): the
  /// block's registers split unevenly, as 128-key blocks at head_dim 128
  /// need (FlashAttention-3's register reallocation).
  static constexpr bool kRealloc = Realloc;
  /// Persistent (with Tma): one team per SM (kMinBlocksPerSM) that runs
  /// tile after tile, the producer loading the next tile's Q, K and V while
  /// the warpgroups finish the current one, instead of a team per tile
  /// whose start waits for its first copies. A team's first tile is its
  /// league rank, the next ones come from a counter in device memory
  /// (atomicAdd, in league order), so that the longest tiles go first and
  /// each next one to the first team free, as the block scheduler hands
  /// out teams (a fixed round robin leaves teams idle under the causal
  /// mask, whose tiles differ in length).
  static constexpr bool kPersistent = Persistent;
  static_assert(!Persistent || Tma, "kfa: persistent teams need the producer (Tma)");
  static_assert(!Realloc || Tma, "kfa: register reallocation needs the producer (Tma)");
  static constexpr int kWarps = 4 * kWarpGroups + (kRealloc ? 4 : kTma ? 1 : 0);
  static constexpr int kProducerRegs = 24;
  /// What the block's 64K registers leave to a computing thread, in steps
  /// of 8 (at most 256).
  static constexpr int kConsumerRegs =
      imin(256, (65536 / MinBlocksPerSM - 128 * kProducerRegs) / (128 * kWarpGroups) / 8 * 8);
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
                          const LseView& lse, float scale, FusedWindow window,
                          const variant_params& variant = variant_params())
      : Fused16Forward(q, k, v, o, lse, scale, window, kBlockM),
        variant_params(variant),
        m_num_tiles(m_p.league(m_num_q_blocks)) {
#if defined(KOKKOS_ENABLE_CUDA)
    // No map of an empty tensor (the driver takes no zero extent): without
    // query rows nothing is launched, without keys no key block is read.
    if constexpr (kTma) {
      constexpr bool bf16 = std::is_same<Format, cuda_mma::Bf16>::value;
      const char* what = "kfa::fwd::wgmma_main_loop";
      if (m_p.view_batch > 0 && m_p.heads > 0 && m_p.rows_q > 0)
        this->m_map_q = make_tma_map_16(m_q, bf16, m_p.view_batch, m_p.rows_q, m_p.heads,
                                        kHeadDim, kBlockM, what);
      if (m_p.view_batch > 0 && m_kv.heads_kv > 0 && m_p.rows_k > 0) {
        this->m_map_k = make_tma_map_16(m_k, bf16, m_p.view_batch, m_p.rows_k, m_kv.heads_kv,
                                        kHeadDim, kBlockN, what);
        this->m_map_v = make_tma_map_16(m_v, bf16, m_p.view_batch, m_p.rows_k, m_kv.heads_kv,
                                        kHeadDim, kBlockN, what);
      }
    }
#endif
  }

  /// The GPU gives a team its scratch (and, with Tma, the driver makes
  /// tensor maps).
  static bool fits(const ExecSpace& space) {
#if defined(KOKKOS_ENABLE_CUDA)
    if constexpr (kTma)
      if (!tma_available()) return false;
#endif
    return mma_kernel_fits<FlashForwardWgmmaKernel>(space);
  }

  /// With Persistent, kMinBlocksPerSM teams per SM (at most one per tile)
  /// that take the tiles from a zeroed counter (the workspace of `space`'s
  /// stream).
  void launch(const ExecSpace& space) const {
    const char* label = "kfa::fwd::wgmma_main_loop";
#if defined(KOKKOS_ENABLE_CUDA)
    if constexpr (kPersistent) {
      if (m_num_tiles == 0) return;
      const auto counter =
          workspace(space, WorkspaceSlot::tile_counter, sizeof(int), "kfa::fwd::tile_counter");
      const cudaError_t err =
          cudaMemsetAsync(counter.data(), 0, sizeof(int), space.cuda_stream());
      if (err != cudaSuccess)
        throw std::runtime_error(std::string(label) + ": cudaMemsetAsync of the tile counter " +
                                 "failed: " + cudaGetErrorString(err));
      FlashForwardWgmmaKernel kernel(*this);
      kernel.m_tile_counter = reinterpret_cast<int*>(counter.data());
      launch_mma_kernel(
          space, label, kernel,
          imin(m_num_tiles, space.cuda_device_prop().multiProcessorCount * kMinBlocksPerSM));
      return;
    }
#endif
    launch_mma_kernel(space, label, *this, m_num_tiles);
  }

  /// Q, then K and V per stage, and the slack that aligns the swizzle atoms
  /// to 1024 bytes.
  /// With Tma, the barriers after the tiles: Q's arrival and release, and
  /// per stage K's and V's; then the index of the tile whose Q arrives.
  KOKKOS_INLINE_FUNCTION static constexpr std::size_t scratch_bytes() {
    return sizeof(std::uint16_t) * (std::size_t(kTileQ) + 2 * kStages * std::size_t(kTileKV)) +
           1024 + (kTma ? 8 * (3 + 4 * kStages) : 0);
  }

  template <class Team>
  KOKKOS_INLINE_FUNCTION void body(const Team& team, void* raw) const {
#if KFA_CUDA_WGMMA_DEVICE
    using namespace cuda_mma;
    const int lane = threadIdx.x, warp = threadIdx.y;
    const int tid = warp * 32 + lane;
    const int wg = warp / 4;

    const long row_stride = long(m_p.heads) * kHeadDim;

    const Sw128Scratch scratch(raw);
    std::uint16_t* const sQ = scratch.base<std::uint16_t>();
    auto sK = [&](int stage) { return sQ + kTileQ + 2 * stage * kTileKV; };
    auto sV = [&](int stage) { return sK(stage) + kTileKV; };
    auto addr = [&](const std::uint16_t* p) { return scratch.addr(p); };

    // The tile in hand (`tile` of the league, FusedProblem::block_of): its
    // batch, head, first query row and key blocks, and this thread's rows
    // row0 and row0 + 8 (warp = 4·wg + warp in group).
    // Key blocks first_kv_block + [0, num_kv_blocks) are those inside the
    // mask's window; the loops count them from 0. `sq` is the tile's
    // sequence; a packed batch's shorter ones have fewer blocks than the
    // league (`rows` <= 0: nothing to compute or write).
    int b = 0, h = 0, row_begin = 0, rows = 0, first_kv_block = 0, num_kv_blocks = 0, row0 = 0;
    FusedSeq sq = m_p.sequence(0);
    auto set_tile = [&](int tile) {
      // Longest rows first under the causal mask.
      row_begin = (m_num_q_blocks - 1 - m_p.block_of(tile, m_num_q_blocks, b, h)) * kBlockM;
      sq = m_p.sequence(b);
      rows = imin(kBlockM, sq.seqlen_q - row_begin);
      int end_kv_block = 0;
      first_kv_block = 0;
      if (rows > 0) {
        sq.mask.key_blocks(row_begin, row_begin + rows, kBlockN, first_kv_block, end_kv_block);
        this->trim_key_blocks(sq.mask, b, h, row_begin, row_begin + rows, kBlockN,
                              first_kv_block, end_kv_block);
      }
      num_kv_blocks = imax(0, end_kv_block - first_kv_block);
      row0 = row_begin + warp * 16 + lane / 4;
    };

    float acc_o[1][kTilesO][4];
    float s[1][kTilesS][4];
    float row_max[2], row_sum[2];
    auto start_rows = [&] {
      for (int n = 0; n < kTilesO; ++n)
        acc_o[0][n][0] = acc_o[0][n][1] = acc_o[0][n][2] = acc_o[0][n][3] = 0;
      row_max[0] = row_max[1] = -INFINITY;
      row_sum[0] = row_sum[1] = 0;
    };
    auto write_rows = [&] {
      if (rows > 0)
        fwd_write_output<Format>(acc_o, row_max, row_sum, row0, sq.seqlen_q,
                                 m_o + m_p.q_offset(sq, h, kHeadDim), row_stride,
                                 m_lse + m_p.lse_offset(sq, h));
    };
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
      const AttentionMask& mask = sq.mask;
      const bool needs_mask =
          mask.tile_needs_mask(row_begin, row_begin + kBlockM, key_begin, key_begin + kBlockN);
      if constexpr (kVariant) {
        const float scale_log2 = fwd_variant_scores<kBlockM, kBlockN>(s, *this, mask, b, h,
                                                                      row_begin, row0, key_begin);
        fwd_softmax_scores(s, row_max, row_sum, alpha, mask, needs_mask, scale_log2, row0,
                           key_begin);
        fwd_variant_dropout(s, *this, b, h, row0, key_begin);
      } else if constexpr (kFoldScale)
        fwd_softmax_scores_folded(s, row_max, row_sum, alpha, mask, needs_mask, m_scale,
                                  row0, key_begin);
      else
        fwd_softmax_scores(s, row_max, row_sum, alpha, mask, needs_mask, m_scale, row0,
                           key_begin);
    };
    // One block's work once K_j is in scratch: S_j issued, and
    // P_{j-1}·V_{j-1} with it where j > 0 (pv_ready: V_{j-1} has landed),
    // then `issued` (the cp.async path's next copies); the softmax of block
    // j while P_{j-1}·V_{j-1} may still run (scores_done: S_j is done, K_j
    // no longer read), and O rescaled and P packed once that product is
    // done (pv_done: V_{j-1} no longer read).
    // kv_block: the block of the tile; gj: of the team's tiles (its stage
    // gj % kStages).
    auto block_step = [&](int kv_block, int gj, auto&& pv_ready, auto&& issued,
                          auto&& scores_done, auto&& pv_done) {
      issue_scores(gj % kStages);
      if (kv_block > 0) {
        pv_ready();
        issue_pv((gj - 1) % kStages);
        issued();
        wgmma_wait<1>();  // S_j is done, P_{j-1}·V_{j-1} may still run
      } else {
        issued();
        wgmma_wait<0>();
      }
      scores_done();
      fence_operands(s_flat);
      float alpha[2];
      softmax((first_kv_block + kv_block) * kBlockN, alpha);
      wgmma_wait<0>();
      fence_operands(o_flat);
      if (kv_block > 0) pv_done();
      fwd_rescale(acc_o, alpha);
      pack_p();
    };
    // P·V of the last block (V in `stage`).
    auto last_pv = [&](int stage, auto&& issued) {
      issue_pv(stage);
      issued();
      wgmma_wait<0>();
      fence_operands(o_flat);
    };

    if constexpr (kTma) {
      // Barriers: Q arrived, Q released; per stage K arrived, V arrived (the
      // producer's arrival with the bytes expected), K released, V released
      // (one arrival per computing warp once its wgmma that read it are
      // done).
      const std::uint32_t bars = addr(sQ + kTileQ + 2 * kStages * kTileKV);
      const std::uint32_t full_q = bars, free_q = bars + 8;
      auto full_k = [&](int s) { return bars + 8 * (2 + s); };
      auto full_v = [&](int s) { return bars + 8 * (2 + kStages + s); };
      auto free_k = [&](int s) { return bars + 8 * (2 + 2 * kStages + s); };
      auto free_v = [&](int s) { return bars + 8 * (2 + 3 * kStages + s); };
      if (tid == 0) {
        mbarrier_init(full_q, 1);
        mbarrier_init(free_q, 4 * kWarpGroups);
        for (int s = 0; s < kStages; ++s) {
          mbarrier_init(full_k(s), 1);
          mbarrier_init(full_v(s), 1);
          mbarrier_init(free_k(s), 4 * kWarpGroups);
          mbarrier_init(free_v(s), 4 * kWarpGroups);
        }
        mbarrier_init_fence();
      }
      team.team_barrier();
      // Key blocks are counted over the team's tiles (g): block g takes
      // stage g % kStages, its (g / kStages)-th use, which waits for phase
      // g / kStages of the arrival barrier and for the release of the use
      // before (a fresh barrier passes parity 1). Q's barriers count tiles.
      auto parity = [](int g) { return std::uint32_t((g / kStages) & 1); };
      // This team's tiles: its league rank, and with Persistent those it
      // takes from the counter; m_num_tiles or more ends the team. The
      // producer warp hands tile n's index to the warpgroups in scratch slot
      // n % 2 and all of them meet at one named barrier per tile: the index
      // is written before the barrier of its tile and after the barrier of
      // the tile before, when the slot's last reader has passed it. The
      // producer issues a tile's Q, K_0, K_1 and V_0 (whose stages the
      // tile before released) before that tile's barrier, the rest after
      // it. Every side waits at barrier.sync, which racecheck follows (an
      // mbarrier or a bar.arrive it does not).
      volatile int* const tile_slot = reinterpret_cast<volatile int*>(
          reinterpret_cast<unsigned char*>(sQ) + (bars + 8 * (2 + 4 * kStages) - addr(sQ)));
      constexpr int kTileBarrier = 1, kTileThreads = 32 + 128 * kWarpGroups;
      static_assert(kStages >= 2, "kfa: a tile's K_1 and V_0 load before its barrier");
      if (warp >= 4 * kWarpGroups) {
        if constexpr (kRealloc) setmaxnreg_dec<kProducerRegs>();
        // The producer: per tile Q (once the previous tile's is released),
        // then K_0, and per block j K_{j+1} and V_j, the order in which the
        // warpgroups read them; lane 0 issues the copies.
        if (warp == 4 * kWarpGroups) {
          constexpr std::uint32_t kv_bytes = sizeof(std::uint16_t) * kTileKV;
          int g = 0;
          int tile = team.league_rank();
          if (lane == 0) tile_slot[0] = tile;
          auto load_kv = [&](const TmaMap& map, bool is_v, int j) {
            const int stage = (g + j) % kStages;
            const std::uint32_t full = is_v ? full_v(stage) : full_k(stage);
            if (g + j >= kStages)
              mbarrier_wait(is_v ? free_v(stage) : free_k(stage), parity(g + j) ^ 1);
            mbarrier_arrive_expect(full, kv_bytes);
            const std::uint32_t tile_addr = addr(is_v ? sV(stage) : sK(stage));
#pragma unroll
            for (int c = 0; c < kHeadDim / 64; ++c)
              tma_load_box(tile_addr + c * sw128_block_bytes(kBlockN), map, 64 * c, m_kv.head(h),
                           sq.k_begin + (first_kv_block + j) * kBlockN, sq.view_b, full);
          };
          for (int n = 0;; ++n) {
            if (tile >= m_num_tiles) {
              named_barrier_sync(kTileBarrier, kTileThreads);
              break;
            }
            int next = m_num_tiles;
            if (lane == 0) {
              if (n > 0) mbarrier_wait(free_q, std::uint32_t((n - 1) & 1));
              set_tile(tile);
              if (rows > 0) {
                mbarrier_arrive_expect(full_q, sizeof(std::uint16_t) * kTileQ);
#pragma unroll
                for (int c = 0; c < kHeadDim / 64; ++c)
                  tma_load_box(addr(sQ) + c * sw128_block_bytes(kBlockM), this->m_map_q, 64 * c,
                               h, sq.q_begin + row_begin, sq.view_b, full_q);
              } else {
                mbarrier_arrive(full_q);  // a packed batch's empty tile: no Q
              }
              // The next tile, fetched while this one's copies are issued.
              if constexpr (kPersistent) next = int(gridDim.x) + atomicAdd(m_tile_counter, 1);
              if (num_kv_blocks > 0) {
                load_kv(this->m_map_k, false, 0);
                if (num_kv_blocks > 1) load_kv(this->m_map_k, false, 1);
                load_kv(this->m_map_v, true, 0);
              }
            }
            named_barrier_sync(kTileBarrier, kTileThreads);
            if (lane == 0) {
              tile_slot[(n + 1) & 1] = next;
              for (int j = 1; j < num_kv_blocks; ++j) {
                if (j + 1 < num_kv_blocks) load_kv(this->m_map_k, false, j + 1);
                load_kv(this->m_map_v, true, j);
              }
              g += num_kv_blocks;
            }
            tile = __shfl_sync(0xffffffffu, next, 0);
          }
        }
        return;
      }
      if constexpr (kRealloc) setmaxnreg_inc<kConsumerRegs>();
      int g = 0;
      for (int n = 0;; ++n) {
        named_barrier_sync(kTileBarrier, kTileThreads);
        const int tile = tile_slot[n & 1];
        if (tile >= m_num_tiles) break;
        mbarrier_wait(full_q, std::uint32_t(n & 1));
        set_tile(tile);
        start_rows();
        // Q is released once the last S that reads it is done.
        if (num_kv_blocks == 0 && lane == 0) mbarrier_arrive(free_q);
        for (int kv_block = 0; kv_block < num_kv_blocks; ++kv_block) {
          const int gj = g + kv_block;
          const int stage = gj % kStages, prev = (gj + kStages - 1) % kStages;
          mbarrier_wait(full_k(stage), parity(gj));
          block_step(
              kv_block, gj, [&] { mbarrier_wait(full_v(prev), parity(gj - 1)); }, [] {},
              [&] {
                if (lane == 0) {
                  mbarrier_arrive(free_k(stage));
                  if (kv_block == num_kv_blocks - 1) mbarrier_arrive(free_q);
                }
              },
              [&] {
                if (lane == 0) mbarrier_arrive(free_v(prev));
              });
        }
        if (num_kv_blocks > 0) {
          const int last = g + num_kv_blocks - 1;
          mbarrier_wait(full_v(last % kStages), parity(last));
          last_pv(last % kStages, [] {});
          if (lane == 0) mbarrier_arrive(free_v(last % kStages));
        }
        write_rows();
        g += num_kv_blocks;
      }
    } else {
      set_tile(team.league_rank());
      start_rows();
      if (rows <= 0) return;
      const std::uint16_t* gQ = m_q + m_p.q_offset(sq, h, kHeadDim);
      const std::uint16_t* gK = m_k + m_kv.offset(m_p, sq, h, kHeadDim);
      const std::uint16_t* gV = m_v + m_kv.offset(m_p, sq, h, kHeadDim);
      const long kv_stride = m_kv.row_stride(kHeadDim);
      // Every thread's copies have landed and are visible to wgmma, for
      // every warpgroup (and every warpgroup is done with what the next
      // copies overwrite).
      auto sync_tiles = [&] {
        cp_async_wait<0>();
        fence_proxy_async();
        team.team_barrier();
      };
      Sw128TileLoader<kHeadDim, kBlockM, 128 * kWarpGroups>(tid).load(
          addr(sQ), gQ, row_stride, row_begin, sq.seqlen_q);
      // K_j and V_{j-1} are read in iteration j, so the copies of iteration
      // j are K_{j+1} and V_j: K_{j+1} takes the stage of K_{j-1} (S_{j-1}
      // done in iteration j-1), V_j that of V_{j-2} (P_{j-2}·V_{j-2} done
      // in iteration j-1).
      const Sw128TileLoader<kHeadDim, kBlockN, kLoadThreads> kv_loader(tid);
      const bool loads_kv = kLoadThreads == 128 * kWarpGroups || tid < kLoadThreads;
      auto load_k = [&](int kv_block) {
        if (loads_kv)
          kv_loader.load(addr(sK(kv_block % kStages)), gK, kv_stride,
                         (first_kv_block + kv_block) * kBlockN, sq.seqlen_k);
      };
      auto load_v = [&](int kv_block) {
        if (loads_kv)
          kv_loader.load(addr(sV(kv_block % kStages)), gV, kv_stride,
                         (first_kv_block + kv_block) * kBlockN, sq.seqlen_k);
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
        block_step(kv_block, kv_block, [] {}, load_next, [] {}, [] {});
      }
      if (num_kv_blocks > 0) {
        // V of the last block.
        sync_tiles();
        last_pv((num_kv_blocks - 1) % kStages, [] {});
      }
      cp_async_wait<0>();
      write_rows();
    }
#else
    (void)team;
    (void)raw;
    cuda_mma::trap_without_wgmma();  // not sm_90a
#endif
  }

 private:
  static constexpr int kTilesS = kBlockN / 8;   // n-tiles of S per thread
  static constexpr int kTilesO = kHeadDim / 8;  // n-tiles of O per thread

  int m_num_tiles;  // query blocks of every (batch, head)
  int* m_tile_counter = nullptr;  // Persistent: tiles handed out past the first wave
};

/// FlashForwardWgmmaKernel in `Shape` (WgmmaFwdShape's members), the scale
/// folded or not.
template <class Shape, class ExecSpace, int HeadDim, class Format, class QView, class KView,
          class VView, class OView, class LseView, bool FoldScale = true,
          class VariantT = PlainVariant>
using FlashForwardWgmmaKernelIn =
    FlashForwardWgmmaKernel<ExecSpace, HeadDim, Format, QView, KView, VView, OView, LseView,
                            FoldScale, Shape::kBlockN, Shape::kMinBlocksPerSM,
                            Shape::kWarpGroups, Shape::kTma, Shape::kStages, Shape::kRealloc,
                            Shape::kPersistent, VariantT>;

}  // namespace Impl
}  // namespace kfa

#endif
