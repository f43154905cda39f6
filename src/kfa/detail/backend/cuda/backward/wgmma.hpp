#ifndef KFA_DETAIL_BACKEND_CUDA_BACKWARD_WGMMA_HPP
#define KFA_DETAIL_BACKEND_CUDA_BACKWARD_WGMMA_HPP

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
// dQ goes to an fp32 tile in scratch and is added to the fp32 accumulator
// by the copy engine after the next block's first barrier, instead of a
// red.global per value: by bulk tensor reductions (cp.reduce.async.bulk.
// tensor, one thread issues the tile's head_dim / 8 boxes of [M][8] fp32;
// kDqTma, the library's) or one bulk reduction per query row.
// At head_dim 128 the library's shape (WgmmaBwdShape) is pipelined: one
// team barrier a block (before dQ's products), the next block's Sᵀ and dPᵀ
// issued right behind the dQ tile's stores, Q/dO in three stages and two
// dSᵀ tiles (226.5 KB of scratch), Pᵀ computed while dPᵀ's products run
// and dV's products issued before dSᵀ (kEarlyDv); its tensor reductions go
// in boxes of 32 fp32 a row, 128-byte swizzled (kDqWide: with boxes of 8 a
// row the issuing thread waits for the copy engine's queue every block).
// Scratch at head_dim 128: K, V 2 x 32 KB, 2 x (Q, dO 2 x 16 KB, lse, D),
// the dSᵀ tile 16 KB, the dQ tile 32 KB (34 KB with padded rows for the
// per-row reductions): 177 KB; at 64: K, V 2 x 16 KB, 2 x (Q, dO 2 x 16 KB),
// dSᵀ 32 KB, dQ 32 KB: 163 KB. Tiles are 128-byte swizzled
// (kfa/detail/backend/cuda/primitives/wgmma.hpp); a dSᵀ tile is [M / 64][128
// keys][64 queries].

#include <kfa/detail/attention/mask.hpp>

#include <kfa/detail/backend/cuda/backward/score_fragment.hpp>
#include <kfa/detail/backend/cuda/primitives/launch.hpp>
#include <kfa/detail/backend/cuda/primitives/mma.hpp>
#include <kfa/detail/backend/cuda/primitives/tma.hpp>
#include <kfa/detail/backend/cuda/primitives/wgmma.hpp>

#include <cstdint>
#include <type_traits>

namespace kfa {
namespace Impl {

/// The tensor map of the fp32 dQ accumulator of a backward whose dQ tiles
/// are added by bulk tensor reductions (WgmmaBwdShape's kDqTma), none
/// otherwise.
template <bool DqTma>
struct WgmmaBwdMaps {};
template <>
struct WgmmaBwdMaps<true> {
  TmaMap m_map_dq;
};

/// The choices of the wgmma backward at HeadDim (FlashBackwardWgmmaKernel's
/// Shape; perf_tests and the unit tests pass others):
/// - kDqTma: the dQ tile goes to the accumulator by bulk tensor reductions
///   that one thread issues (kHeadDim / 8 boxes of [kBlockM][8] fp32, each
///   dense in scratch), else by one bulk reduction per row.
/// - kEarlyDv: Sᵀ and dPᵀ in two commit groups; Pᵀ computed while dPᵀ's
///   products run, dV's products issued before dSᵀ is computed, dK's
///   before dSᵀ is stored, so that the exponentials, dSᵀ and its stores
///   overlap the tensor cores.
/// - kPipelined (head_dim 128, with kEarlyDv and kDqTma): one team barrier a
///   block instead of two (FlashBackwardWgmmaKernel::kStages).
/// - kDqWide (with kDqTma): the tensor reductions in boxes of 32 fp32 a row
///   (128 bytes, 128-byte swizzled in scratch), kHeadDim / 32 a tile,
///   instead of 8 a row: a quarter of the copy engine's row requests. At
///   head_dim 64 the boxes of 8 stay: there the wide ones are the slower
///   (why is not known).
template <int HeadDim>
struct WgmmaBwdShape {
  static constexpr bool kDqTma = true;
  static constexpr bool kEarlyDv = HeadDim == 128;
  static constexpr bool kPipelined = HeadDim == 128;
  static constexpr bool kDqWide = HeadDim == 128;
};

/// FlashBackwardWgmmaKernel's Probe, the library's: no hooks, no data. The
/// kernel derives from its probe (an empty base adds nothing) and calls, in
/// every thread (tid, of warpgroup wg, of the team of league rank `team`):
/// - team_event(team, tid, event) at 1 the team's start, 2 its first query
///   block's top, 3 the end of its last block, 4 its dK and dV stores
///   issued, 5 its end;
/// - block_event(team, tid, wg, block, event) in the team's block-th query
///   block (from 0) at 0 the block's top, 1 Sᵀ and dPᵀ issued and the
///   previous dQ tile handed over, 2 Sᵀ done, 3 Pᵀ computed and dV's
///   products issued, 4 dPᵀ done, 5 dSᵀ computed and dK's products issued,
///   6 dSᵀ stored and the copies waited for, 7 past the team barrier (dQ's
///   products issued), 8 dV, dK and dQ done, 9 the dQ tile stored (0, 1
///   and 6 to 9 with kPipelined only, 3 and 4 with kEarlyDv only).
/// perf_tests/bench_bwd_trace's probe reads the clock there.
struct NoProbe {
  KOKKOS_FORCEINLINE_FUNCTION void team_event(int, int, int) const {}
  KOKKOS_FORCEINLINE_FUNCTION void block_event(int, int, int, int, int) const {}
};

/// The copies of the wgmma backwards (FlashBackwardWgmmaKernel,
/// FlashBackwardWgmmaProductSplitKernel) into 128-byte-swizzled scratch, cp.async
/// by all Threads threads of a team: K and V of the team's BlockN keys,
/// and per query block Q, dO (BlockM rows) with their lse and D. Rows past
/// the end read 0: a query row past seqlen_q has S = dP = D = 0 and dO =
/// 0, so nothing of it reaches dK or dV, and its dQ is not added.
template <int HeadDim, int BlockN, int BlockM, int Threads>
class WgmmaBwdLoads {
 public:
  /// The loads of sequence `sq`, query head h.
  KOKKOS_FORCEINLINE_FUNCTION WgmmaBwdLoads(const Fused16Backward& kernel, int tid,
                                            const FusedSeq& sq, int h)
      : m_kernel(kernel),
        m_tid(tid),
        m_q_loader(tid),
        m_seqlen_q(sq.seqlen_q),
        m_seqlen_k(sq.seqlen_k),
        m_q_offset(kernel.m_p.q_offset(sq, h, HeadDim)),
        m_kv_offset(kernel.m_kv.offset(kernel.m_p, sq, h, HeadDim)),
        m_row_stride(long(kernel.m_p.heads) * HeadDim),
        m_lse(kernel.m_lse + kernel.m_p.lse_offset(sq, h)),
        m_delta(kernel.m_delta + kernel.m_p.lse_offset(sq, h)) {}

  /// K and V rows key_begin.. of query head h's k/v head.
  KOKKOS_FORCEINLINE_FUNCTION void kv(int key_begin, std::uint32_t k_addr,
                                      std::uint32_t v_addr) const {
    const Fused16Backward& p = m_kernel;
    const cuda_mma::Sw128TileLoader<HeadDim, BlockN, Threads> kv_loader(m_tid);
    const long kv_stride = p.m_kv.row_stride(HeadDim);
    kv_loader.load(k_addr, p.m_k + m_kv_offset, kv_stride, key_begin, m_seqlen_k);
    kv_loader.load(v_addr, p.m_v + m_kv_offset, kv_stride, key_begin, m_seqlen_k);
  }

  /// Q and dO of query block q_block to the tiles at q_addr and do_addr,
  /// its lse and D to stats[0, BlockM) and stats[BlockM, 2·BlockM).
  KOKKOS_FORCEINLINE_FUNCTION void q_block(int q_block, std::uint32_t q_addr,
                                           std::uint32_t do_addr, float* stats) const {
    const Fused16Backward& p = m_kernel;
    const int row_begin = q_block * BlockM;
    m_q_loader.load(q_addr, p.m_q + m_q_offset, m_row_stride, row_begin, m_seqlen_q);
    m_q_loader.load(do_addr, p.m_do + m_q_offset, m_row_stride, row_begin, m_seqlen_q);
    if (m_tid < BlockM) {
      const int row = row_begin + m_tid;
      const bool ok = row < m_seqlen_q;
      cuda_mma::cp_async_small<4>(stats + m_tid, m_lse + (ok ? row : 0), ok ? 4 : 0);
      cuda_mma::cp_async_small<4>(stats + BlockM + m_tid, m_delta + (ok ? row : 0), ok ? 4 : 0);
    }
  }

 private:
  const Fused16Backward& m_kernel;
  int m_tid;
  cuda_mma::Sw128TileLoader<HeadDim, BlockM, Threads> m_q_loader;
  int m_seqlen_q, m_seqlen_k;
  long m_q_offset, m_kv_offset, m_row_stride;
  const float* m_lse;
  const float* m_delta;
};

#if KFA_CUDA_WGMMA_DEVICE  // sm_90a device code only (float2, uint4: CUDA types)
/// A team's dK or dV rows on their way from a wgmma backward's m64nHeadDim
/// accumulators to memory through scratch (Elem: the 16-bit format's bits,
/// or float for the per-query-head buffers of grouped-query heads). put:
/// each thread its rows, rounded; store: after a team barrier, the rows
/// copied out 16 bytes a thread, 512 contiguous bytes a warp. A row holds
/// HeadDim values with its 16-byte chunk c at chunk c ^ (row % 8), so the
/// 8 rows of a warp's puts of one chunk fall in distinct banks. Stored
/// from the fragments instead, each warp store would write 8 rows x 16
/// bytes, partial lines that hold up the team's end.
template <class Elem, int HeadDim>
struct StagedRows {
  static constexpr int kRowBytes = HeadDim * int(sizeof(Elem));
  static constexpr int kChunks = kRowBytes / 16;  // per row

  KOKKOS_FORCEINLINE_FUNCTION static int at(int row, int byte) {
    return row * kRowBytes + ((byte / 16) ^ (row % 8)) * 16 + byte % 16;
  }

  /// This thread's rows row0 and row0 + 8 of an accumulator (n-tile n:
  /// columns 8n + 2·(lane % 4) and + 1), times scale, into tile.
  template <class Format>
  KOKKOS_FORCEINLINE_FUNCTION static void put(unsigned char* tile, int row0, int lane,
                                              const float (&acc)[HeadDim / 8][4], float scale) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = row0 + 8 * half;
#pragma unroll
      for (int n = 0; n < HeadDim / 8; ++n) {
        const int byte = (n * 8 + (lane % 4) * 2) * int(sizeof(Elem));
        const float x0 = acc[n][2 * half] * scale, x1 = acc[n][2 * half + 1] * scale;
        if constexpr (std::is_same<Elem, float>::value)
          *reinterpret_cast<float2*>(tile + at(row, byte)) = make_float2(x0, x1);
        else
          *reinterpret_cast<std::uint32_t*>(tile + at(row, byte)) = cuda_mma::pack2<Format>(x0, x1);
      }
    }
  }

  /// Rows [0, Rows) of tile to dst[offset + row·row_stride ..), by the
  /// Threads threads of a team (this one: tid); rows from `rows` on (past
  /// seqlen_k) are not stored.
  template <int Rows, int Threads>
  KOKKOS_FORCEINLINE_FUNCTION static void store(const unsigned char* tile, std::uint16_t* dst,
                                                long offset, long row_stride, int rows,
                                                int tid) {
    static_assert(Rows * kChunks % Threads == 0, "kfa: whole chunks per thread");
    Elem* const out = reinterpret_cast<Elem*>(dst) + offset;
#pragma unroll
    for (int j = 0; j < Rows * kChunks / Threads; ++j) {
      const int i = j * Threads + tid;
      const int row = i / kChunks, c = i % kChunks;
      if (row >= rows) continue;
      *reinterpret_cast<uint4*>(out + long(row) * row_stride + c * (16 / int(sizeof(Elem)))) =
          *reinterpret_cast<const uint4*>(tile + at(row, c * 16));
    }
  }
};

/// A wgmma backward's dK and dV for the BlockN keys of its tile, to the
/// kernel's m_dk and m_dv through `scratch` (ScratchBytes bytes, free once
/// every product and copy is done: dK's rows, then dV's). Every thread
/// calls it after its last product: it waits for the thread's copies and
/// passes a team barrier (which also covers K and V where no query block
/// saw these keys), then each thread puts its values with
/// put(StagedRows<Elem, HeadDim>(), tile_k, tile_v) (Elem: the 16-bit
/// format's bits, or float for the per-query-head buffers of grouped-query
/// heads), and after a second team barrier the Threads threads (this one:
/// tid) store the rows below seqlen_k.
template <int HeadDim, int BlockN, int Threads, std::size_t ScratchBytes, class Team, class Put>
KOKKOS_FORCEINLINE_FUNCTION void store_dk_dv_staged(const Fused16Backward& kernel,
                                                    const FusedKeyTile& tile, void* scratch,
                                                    int tid, const Team& team, Put&& put) {
  static_assert(2 * BlockN * StagedRows<float, HeadDim>::kRowBytes <= ScratchBytes,
                "kfa: dK and dV fit in the free scratch");
  cuda_mma::cp_async_wait<0>();
  team.team_barrier();
  auto staged = [&](auto elem) {
    using Rows = StagedRows<decltype(elem), HeadDim>;
    unsigned char* const tile_k = static_cast<unsigned char*>(scratch);
    unsigned char* const tile_v = tile_k + BlockN * Rows::kRowBytes;
    put(Rows(), tile_k, tile_v);
    team.team_barrier();
    const long offset = tile.k_offset + long(tile.key_begin) * tile.row_stride;
    const int rows = tile.sq.seqlen_k - tile.key_begin;
    Rows::template store<BlockN, Threads>(tile_k, kernel.m_dk, offset, tile.row_stride, rows,
                                          tid);
    Rows::template store<BlockN, Threads>(tile_v, kernel.m_dv, offset, tile.row_stride, rows,
                                          tid);
  };
  if (kernel.m_kv.group > 1)
    staged(float());
  else
    staged(std::uint16_t());
}
#endif

template <class ExecSpace, int HeadDim, class Format, class QView, class KView, class VView,
          class DOView, class LseView, class DeltaView, class DQAccView, class DKView,
          class DVView, class Shape = WgmmaBwdShape<HeadDim>, class Probe = NoProbe,
          class VariantT = PlainVariant>
class FlashBackwardWgmmaKernel : public Fused16Backward,
                                 public WgmmaBwdMaps<Shape::kDqTma>,
                                 public Probe,
                                 public FusedVariantParams<VariantT> {
 public:
  using variant_params = FusedVariantParams<VariantT>;
  /// Pᵀ and dSᵀ of the variant's pipeline: bwd_variant_p once Sᵀ is
  /// in, bwd_variant_ds once dPᵀ is.
  static constexpr bool kVariant = variant_params::kVariant;
  static constexpr int kHeadDim = HeadDim;
  static constexpr bool kDqTma = Shape::kDqTma;
  static constexpr bool kEarlyDv = Shape::kEarlyDv;
  static constexpr bool kPipelined = Shape::kPipelined;
  static constexpr bool kDqWide = Shape::kDqWide;
  static constexpr bool kTensorMaps = kDqTma;  // launch_cuda_team: __grid_constant__
  static_assert(!kPipelined || (kEarlyDv && kDqTma && HeadDim == 128),
                "kfa: the pipelined backward runs head_dim 128 with kEarlyDv and kDqTma");
  static_assert(!kDqWide || kDqTma, "kfa: the wide dQ boxes are tensor reductions (kDqTma)");
  static constexpr int kWarps = 8;     // 2 warpgroups
  static constexpr int kBlockN = 128;  // keys per team, 64 per warpgroup
  /// Queries per step: 128 at head_dim 64 (Sᵀ and dPᵀ 64 registers each,
  /// dK and dV 32), 64 at 128 (32 and 64).
  static constexpr int kBlockM = HeadDim == 64 ? 128 : 64;
  /// Q/dO buffers (launch_mma_kernel: opt-in scratch). kPipelined: three
  /// (a block loads the one after next behind its barrier, when every
  /// warpgroup is done with the block before) and two dSᵀ tiles (a block's
  /// dSᵀ is written while the other warpgroup's dQ of the block before may
  /// still read its tile), 226.5 KB of scratch; the next block's Sᵀ and dPᵀ
  /// are issued right behind this block's stores to the dQ tile, and a
  /// named barrier then hands the tile to the reductions.
  static constexpr int kStages = kPipelined ? 3 : 2;
  static constexpr int kDsTiles = kPipelined ? 2 : 1;
  static constexpr int kMinBlocksPerSM = 1;
  static constexpr int kDqBoxCols = kDqWide ? 32 : 8;
  static_assert(kHeadDim == 64 || kHeadDim == 128,
                "kfa: the wgmma backward runs head_dim 64 or 128");
  /// dQ split over the warpgroups: by query rows (kBlockM 128) or by head
  /// dims (head_dim 128); either way 64 columns over all keys each.
  static constexpr bool kDqSplitRows = kBlockM == 128;
  static constexpr int kTileKV = kBlockN * kHeadDim;  // values per tile
  static constexpr int kTileQ = kBlockM * kHeadDim;
  static constexpr int kTileDS = kBlockN * kBlockM;
  /// The dQ tile in scratch: with kDqTma [kHeadDim / kDqBoxCols][kBlockM]
  /// [kDqBoxCols] fp32 (store_dq), else [kBlockM][kDqPitch] (8 floats of
  /// padding: a warp's 8 rows x 4 column pairs hit distinct banks in 2
  /// wavefronts; rows stay 16-byte aligned for the bulk copy).
  static constexpr int kDqPitch = kHeadDim + 8;
  static constexpr int kTileDQ = kDqTma ? kBlockM * kHeadDim : kBlockM * kDqPitch;
  static_assert(!kDqWide || (2 * (2 * kTileKV + 2 * kStages * kTileQ + kDsTiles * kTileDS)) %
                                    1024 == 0,
                "kfa: the wide dQ boxes' swizzle needs the dQ tile 1024-byte aligned");
  using policy_t = Kokkos::TeamPolicy<ExecSpace>;

  FlashBackwardWgmmaKernel(const QView& q, const KView& k, const VView& v, const DOView& d_o,
                           const LseView& lse, const DeltaView& delta, const DQAccView& dq_acc,
                           const DKView& dk, const DVView& dv, float scale, FusedWindow window,
                           const variant_params& variant = variant_params())
      : Fused16Backward(q, k, v, d_o, lse, delta, dq_acc, dk, dv, scale, window, kBlockN),
        variant_params(variant) {
#if defined(KOKKOS_ENABLE_CUDA)
    // No map of an empty tensor (nothing is launched then).
    if constexpr (kDqTma)
      if (m_p.view_batch > 0 && m_p.heads > 0 && m_p.rows_q > 0)
        this->m_map_dq = make_tma_map_f32(m_dq, m_p.view_batch, m_p.rows_q, m_p.heads,
                                          kHeadDim, kBlockM, "kfa::bwd::wgmma_dk_dv", kDqWide);
#endif
  }

  /// The GPU gives a team its scratch (and, with kDqTma, the driver makes
  /// tensor maps).
  static bool fits(const ExecSpace& space) {
#if defined(KOKKOS_ENABLE_CUDA)
    if constexpr (kDqTma)
      if (!tma_available()) return false;
#endif
    return mma_kernel_fits<FlashBackwardWgmmaKernel>(space);
  }

  void launch(const ExecSpace& space) const {
    launch_mma_kernel(space, "kfa::bwd::wgmma_dk_dv", *this, m_p.league(m_num_kv_blocks));
  }

  /// K, V, per stage Q, dO, lse and D, the dSᵀ and dQ tiles, and the slack
  /// that aligns the swizzle atoms to 1024 bytes.
  KOKKOS_INLINE_FUNCTION static constexpr std::size_t scratch_bytes() {
    return sizeof(std::uint16_t) * (2 * std::size_t(kTileKV) + 2 * kStages * std::size_t(kTileQ) +
                                    kDsTiles * std::size_t(kTileDS)) +
           sizeof(float) * (std::size_t(kTileDQ) + 2 * kStages * kBlockM) + 1024;
  }

  /// Scratch free once every product and copy is done, from K's tile on:
  /// K's and V's tiles and the stages (dK's and dV's rows on their way out).
  static constexpr std::size_t kFreeScratchBytes =
      sizeof(std::uint16_t) * (2 * std::size_t(kTileKV) + 2 * kStages * std::size_t(kTileQ));

  template <class Team>
  KOKKOS_INLINE_FUNCTION void body(const Team& team, void* raw) const {
#if KFA_CUDA_WGMMA_DEVICE
    using namespace cuda_mma;
    constexpr int kTilesS = kBlockM / 8;   // n-tiles of Sᵀ (queries) per thread
    constexpr int kTilesD = kHeadDim / 8;  // n-tiles of dK, dV per thread
    constexpr int kDqN = 64;               // dQ columns per warpgroup
    const int lane = threadIdx.x, warp = threadIdx.y;
    const int tid = warp * 32 + lane;
    const int wg = warp / 4;

    const int league = team.league_rank();
    const FusedKeyTile team_tile = this->key_tile(league, kBlockN, kHeadDim);
    if (team_tile.empty()) return;
    const int b = team_tile.b, h = team_tile.h, key_begin = team_tile.key_begin;
    const FusedSeq sq = team_tile.sq;
    const long row_stride = team_tile.row_stride, q_offset = team_tile.q_offset;
    // The probe's team events (NoProbe).
    auto probe_team = [&](int event) { this->team_event(league, tid, event); };
    probe_team(1);

    const Sw128Scratch scratch(raw);
    std::uint16_t* const sK = scratch.base<std::uint16_t>();
    std::uint16_t* const sV = sK + kTileKV;
    std::uint16_t* const sQ0 = sV + kTileKV;  // stage s: Q, then dO
    std::uint16_t* const sdS = sQ0 + 2 * kStages * kTileQ;
    float* const sdQ = reinterpret_cast<float*>(sdS + kDsTiles * kTileDS);
    float* const s_stats0 = sdQ + kTileDQ;  // stage s: lse, D
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
    const int key0 = key_begin + warp * 16 + lane / 4;
    // The query blocks that see these keys: [first_q_block, num_q_blocks).
    int first_q_block, num_q_blocks;
    team_tile.query_blocks(kBlockN, kBlockM, first_q_block, num_q_blocks, *this);
    // The probe's events of query block q_block (NoProbe).
    auto probe_block = [&](int q_block, int event) {
      this->block_event(league, tid, wg, q_block - first_q_block, event);
    };
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
      // kEarlyDv: all of Sᵀ's k-steps, then all of dPᵀ's, one commit group
      // each; else interleaved in one group.
#pragma unroll
      for (int pass = 0; pass < (kEarlyDv ? 2 : 1); ++pass) {
#pragma unroll
        for (int ks = 0; ks < kHeadDim / 16; ++ks) {
          const std::uint32_t off = (ks % 4) * 32;
          const std::uint32_t col_kv = (ks / 4) * sw128_block_bytes(kBlockN) + off;
          const std::uint32_t col_q = (ks / 4) * sw128_block_bytes(kBlockM) + off;
          if (!kEarlyDv || pass == 0)
            Wgmma<Format, kBlockM>::ss(st_flat, sw128_descriptor_add(desc_k, col_kv),
                                       sw128_descriptor_add(desc_q, col_q), ks > 0);
          if (!kEarlyDv || pass == 1)
            Wgmma<Format, kBlockM>::ss(dpt_flat, sw128_descriptor_add(desc_v, col_kv),
                                       sw128_descriptor_add(desc_do, col_q), ks > 0);
        }
        wgmma_commit();
      }
    };

    // dQ of the query block at row dq_row_begin, from its tile in scratch
    // to the accumulator, one bulk reduction per row: lane l < kDqRowsPerWarp
    // of warp w adds row w · kDqRowsPerWarp + l. (A bulk copy's operands are
    // uniform: the compiler issues a warp's in a loop over its active lanes,
    // so rows spread over all warps take 8 turns a warp at head_dim 128,
    // where rows on warpgroup 0's threads would take 32 on two warps, which
    // the other warps would wait for at the next barrier.)
    // With kDqTma thread 0 adds the whole tile, box after box.
    constexpr int kDqRowsPerWarp = kBlockM / kWarps;
    const int dq_row = warp * kDqRowsPerWarp + lane;
    const bool dq_issuer = kDqTma ? tid == 0 : lane < kDqRowsPerWarp;
    auto add_dq = [&](int dq_row_begin, const float* tile) {
      if constexpr (kDqTma) {
        if (!dq_issuer) return;
#pragma unroll
        for (int box = 0; box < kHeadDim / kDqBoxCols; ++box)
          tma_reduce_add_box(this->m_map_dq, box * kDqBoxCols, h, sq.q_begin + dq_row_begin,
                             sq.view_b,
                             addr(tile + box * kBlockM * kDqBoxCols));
      } else {
        if (!dq_issuer || dq_row_begin + dq_row >= sq.seqlen_q) return;
        bulk_reduce_add_f32(m_dq + q_offset + long(dq_row_begin + dq_row) * row_stride,
                            addr(tile + dq_row * kDqPitch), kHeadDim * sizeof(float));
      }
      bulk_commit();
    };
    // A block's dSᵀ tile (kPipelined: alternating).
    auto ds_tile = [&](int q_block) {
      return sdS + ((q_block - first_q_block + kDsTiles) % kDsTiles) * kTileDS;
    };

    // dQ = dS·K over all keys of the dSᵀ tile `ds`, issued: A = dS, the
    // M-major view of dSᵀ (rows = keys = k; query rows [64·wg, +64) are
    // column block wg); B = K (N-major, head dims [64·wg, +64) are column
    // block wg).
    const int dq_row0 = kDqSplitRows ? 64 * wg : 0;
    const int dq_col0 = kDqSplitRows ? 0 : 64 * wg;
    auto issue_dq = [&](const std::uint16_t* ds) {
      constexpr std::uint32_t kKeyBlock = sw128_block_bytes(kBlockN);
      const std::uint64_t desc_ds =
          sw128_descriptor(addr(ds) + (dq_row0 / 64) * kKeyBlock, kKeyBlock, 1024);
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
    };
    // dQ (finished) to a tile: rows dq_row0 + 16·(warp in group) + lane / 4
    // (+ 8), columns dq_col0 + 8n + 2·(lane % 4); visible to the bulk copy
    // after the fence and the next barrier. With kDqTma, value (r, c) at
    // float (c / 8)·kBlockM·8 + r·8 + c % 8: a warp's 8 rows of a box are
    // 256 contiguous bytes, two wavefronts.
    // Rows past the sequence's end store 0: in a packed batch the bulk
    // reduction adds them to the next sequence's first rows, where 0·k must
    // not carry a non-finite k of this sequence.
    auto store_dq = [&](float* tile, int row_begin) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = (warp % 4) * 16 + lane / 4 + half * 8;
        const bool inside = row_begin + dq_row0 + r < sq.seqlen_q;
#pragma unroll
        for (int n = 0; n < kDqN / 8; ++n) {
          const float2 value =
              inside ? make_float2(dq[n][2 * half] * m_scale, dq[n][2 * half + 1] * m_scale)
                     : make_float2(0.f, 0.f);
          if constexpr (kDqWide) {
            // Row dq_row0 + r of box (dq_col0 + 8n) / 32, its 16-byte chunk
            // 2·(n % 4) + (lane % 4) / 2 XOR the row's r % 8 = lane / 4
            // (bit 0 and bits 1-2 apart): a warp's 8 rows x 32 bytes in 2
            // wavefronts.
            const int chunk_lo = ((lane % 4) / 2) ^ ((lane / 4) & 1);
            const int chunk_hi = (n % 4) ^ (lane / 8);
            *reinterpret_cast<float2*>(tile + (dq_col0 / 32 + n / 4) * (kBlockM * 32) +
                                       (dq_row0 + r) * 32 + (2 * chunk_hi + chunk_lo) * 4 +
                                       (lane % 2) * 2) = value;
          } else if constexpr (kDqTma) {
            *reinterpret_cast<float2*>(tile + (dq_col0 / 8 + n) * (kBlockM * 8) +
                                       (dq_row0 + r) * 8 + (lane % 4) * 2) = value;
          } else {
            float* const my_dq = tile + dq_row0 * kDqPitch + dq_col0;
            *reinterpret_cast<float2*>(my_dq + r * kDqPitch + n * 8 + (lane % 4) * 2) = value;
          }
        }
      }
      fence_proxy_async();
    };

    auto stage_of = [&](int q_block) { return (q_block - first_q_block) % kStages; };
    if (first_q_block < num_q_blocks) load_q_block(first_q_block, 0);
    if constexpr (kPipelined) {
      // K, V and the first block's stage waited for; the second block's
      // stage stays in flight during the first block, whose end waits for
      // it (the loop's wait before its barrier). Waiting for both here would
      // delay the team's first block.
      cp_async_commit();
      if (first_q_block + 1 < num_q_blocks) load_q_block(first_q_block + 1, 1);
      cp_async_commit();
      cp_async_wait<1>();
      fence_proxy_async();
      team.team_barrier();
    }
    cp_async_commit();
    for (int q_block = first_q_block; q_block < num_q_blocks; ++q_block) {
      const int row_begin = q_block * kBlockM;
      const int stage = stage_of(q_block);
      if (q_block == first_q_block) probe_team(2);
      if constexpr (kPipelined) {
        // This block's stage complete and visible since the previous
        // block's barrier (or the one above); issued right behind the
        // previous block's dQ stores, in the same iteration as its wait
        // (products in flight across the loop's back edge: ptxas
        // serializes the pipeline, C7514).
        probe_block(q_block, 0);
        issue_scores(stage);
        // The previous block's dQ tile, once every thread has stored its
        // part, to the accumulator while this block's products and softmax
        // run (its reads waited for before this block's barrier; issued
        // behind that barrier instead, they would hold up the next stores).
        if (q_block > first_q_block) {
          named_barrier_sync(1, kWarps * 32);
          add_dq(row_begin - kBlockM, sdQ);
        }
        probe_block(q_block, 1);
      } else {
        cp_async_wait<0>();
        fence_proxy_async();
        // This block's stage (and K, V) is in scratch for every warpgroup's
        // wgmma, and every warpgroup is done with the previous block (its
        // stage, which the next block now takes, and dSᵀ).
        team.team_barrier();
        issue_scores(stage);
        // While the tensor cores run: the dQ tile written before the barrier
        // (the previous block's) is added to the accumulator, and the next
        // block loads into the previous one's stage (no product in flight
        // reads it).
        if (q_block > first_q_block) add_dq(row_begin - kBlockM, sdQ);
        if (q_block + 1 < num_q_blocks) load_q_block(q_block + 1, stage_of(q_block + 1));
        cp_async_commit();
      }
      const std::uint32_t q_addr = addr(stage_q(stage));
      const std::uint32_t do_addr = q_addr + kTileQ * 2;
      const float* s_lse = stage_stats(stage);
      const float* s_delta = s_lse + kBlockM;
      // Sᵀ (kEarlyDv: dPᵀ's products still running), or both.
      if constexpr (kEarlyDv) {
        wgmma_wait<1>();
      } else {
        wgmma_wait<0>();
        fence_operands(dpt_flat);
      }
      fence_operands(st_flat);
      probe_block(q_block, 2);

      // dV += Pᵀ·dO, dK += dSᵀ·Q (reduction over the queries: dO and Q
      // N-major, 16 query rows per k-step, column blocks of 64 head dims):
      // both before the barrier, or with kEarlyDv dV as soon as Pᵀ is in
      // registers.
      std::uint32_t p_frag[kBlockM / 16][4], ds_frag[kBlockM / 16][4];
      const std::uint64_t desc_do_n =
          sw128_descriptor(do_addr, sw128_block_bytes(kBlockM), 1024);
      const std::uint64_t desc_q_n = sw128_descriptor(q_addr, sw128_block_bytes(kBlockM), 1024);
      auto issue_dv_dk = [&](bool dv, bool dk) {
        if (dv) fence_operands(dv_flat);
        if (dk) fence_operands(dk_flat);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kBlockM / 16; ++kk) {
          if (dv)
            Wgmma<Format, kHeadDim>::rs(dv_flat, p_frag[kk],
                                        sw128_descriptor_add(desc_do_n, kk * 2048), 1);
          if (dk)
            Wgmma<Format, kHeadDim>::rs(dk_flat, ds_frag[kk],
                                        sw128_descriptor_add(desc_q_n, kk * 2048), 1);
        }
        wgmma_commit();
      };

      // Pᵀ and dSᵀ in registers (rows = keys, columns = queries): in one
      // pass, or with kEarlyDv Pᵀ first, dV's products issued, then dSᵀ
      // once dPᵀ is in.
      [[maybe_unused]] BwdKeepBits<kTilesS> keep;
      if constexpr (kVariant) {
        bwd_variant_p<!kEarlyDv, Format>(st, dpt, p_frag, keep, s_lse, s_delta, *this, sq.mask, b,
                                         h, row_begin, key_begin, key_begin + kBlockN, key0,
                                         lane);
      } else {
        bwd_probabilities(st, s_lse, m_scale, sq.mask, row_begin, key_begin, key_begin + kBlockN,
                          key0, lane, [&](int n, int e, int col) {
                            if constexpr (!kEarlyDv)
                              dpt[n][e] = st[n][e] * (dpt[n][e] - s_delta[col]);
                          });
      }
      // 16 query columns per k-step: n-tiles 2·kk and 2·kk + 1.
      auto pack_frags = [&](bool p, bool ds) {
#pragma unroll
        for (int kk = 0; kk < kBlockM / 16; ++kk) {
          if (p) {
            p_frag[kk][0] = pack2<Format>(st[2 * kk][0], st[2 * kk][1]);
            p_frag[kk][1] = pack2<Format>(st[2 * kk][2], st[2 * kk][3]);
            p_frag[kk][2] = pack2<Format>(st[2 * kk + 1][0], st[2 * kk + 1][1]);
            p_frag[kk][3] = pack2<Format>(st[2 * kk + 1][2], st[2 * kk + 1][3]);
          }
          if (ds) {
            ds_frag[kk][0] = pack2<Format>(dpt[2 * kk][0], dpt[2 * kk][1]);
            ds_frag[kk][1] = pack2<Format>(dpt[2 * kk][2], dpt[2 * kk][3]);
            ds_frag[kk][2] = pack2<Format>(dpt[2 * kk + 1][0], dpt[2 * kk + 1][1]);
            ds_frag[kk][3] = pack2<Format>(dpt[2 * kk + 1][2], dpt[2 * kk + 1][3]);
          }
        }
      };
      // (kEarlyDv: a variant's Pᵀ is packed already.)
      if constexpr (kEarlyDv) {
        pack_frags(!kVariant, false);
        issue_dv_dk(true, false);
        probe_block(q_block, 3);
        wgmma_wait<1>();  // dPᵀ; dV runs on
        fence_operands(dpt_flat);
        probe_block(q_block, 4);
        if constexpr (kVariant) {
          bwd_variant_ds(st, dpt, [&](int n, int e) { return dpt[n][e]; }, keep, s_delta,
                               *this, lane);
        } else {
#pragma unroll
          for (int n = 0; n < kTilesS; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int col = n * 8 + (lane % 4) * 2 + (e & 1);
              dpt[n][e] = st[n][e] * (dpt[n][e] - s_delta[col]);
            }
        }
        pack_frags(false, true);
      } else {
        pack_frags(true, true);
      }
      // kEarlyDv: dK's products too before dSᵀ's stores (which read its
      // register operands).
      if constexpr (kEarlyDv) issue_dv_dk(false, true);
      probe_block(q_block, 5);
      // dSᵀ to scratch, swizzled: key r, queries 64·b + c, c + 1 at byte
      // b·(the bytes of a 128-key column block) + r·128 + ((c / 8) ^
      // (r % 8))·16 + (c % 8)·2.
      {
        const int r0 = warp * 16 + lane / 4;
        unsigned char* ds_bytes = reinterpret_cast<unsigned char*>(ds_tile(q_block));
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

      if constexpr (kPipelined) {
        // dSᵀ visible to wgmma, the next block's stage (loaded behind the
        // previous barrier) complete, the dQ tile read by the reductions.
        cp_async_wait<0>();
        fence_proxy_async();
        if (dq_issuer) bulk_wait_read();
        probe_block(q_block, 6);
        team.team_barrier();
        issue_dq(ds_tile(q_block));
        probe_block(q_block, 7);
        // While the tensor cores run: the block after next into the stage
        // of the block before, whose products every warpgroup waited for
        // before the barrier.
        if (q_block + 2 < num_q_blocks) load_q_block(q_block + 2, stage_of(q_block + 2));
        cp_async_commit();
        wgmma_wait<0>();  // dV, dK, dQ
        fence_operands(dv_flat);
        fence_operands(dk_flat);
        fence_operands(dq_flat);
        probe_block(q_block, 8);
        store_dq(sdQ, row_begin);
        probe_block(q_block, 9);
        continue;
      }
      if constexpr (!kEarlyDv) issue_dv_dk(true, true);

      fence_proxy_async();
      // The dQ tile's bulk reads (issued after the first barrier) are done
      // before anyone writes it again.
      if (dq_issuer) bulk_wait_read();
      // The whole dSᵀ tile is in scratch, visible to wgmma.
      team.team_barrier();
      issue_dq(ds_tile(q_block));
      wgmma_wait<0>();  // dQ, and dV, dK of this block
      fence_operands(dv_flat);
      fence_operands(dq_flat);
      store_dq(sdQ, row_begin);
      fence_operands(dk_flat);
    }
    probe_team(3);
    if (first_q_block < num_q_blocks) {
      const int last = num_q_blocks - 1;
      team.team_barrier();
      add_dq(last * kBlockM, sdQ);
    }
    // dK and dV to memory through scratch (StagedRows) while the copy
    // engine adds the last dQ tile.
    store_dk_dv_staged<kHeadDim, kBlockN, kWarps * 32, kFreeScratchBytes>(
        *this, team_tile, sK, tid, team,
        [&](auto rows, unsigned char* tile_k, unsigned char* tile_v) {
          using Rows = decltype(rows);
          const int row0 = warp * 16 + lane / 4;  // this thread's keys: row0, row0 + 8
          Rows::template put<Format>(tile_k, row0, lane, acc_dk[0], m_scale);
          Rows::template put<Format>(tile_v, row0, lane, acc_dv[0], 1.f);
        });
    probe_team(4);
    // The last dQ tile read by the copy engine before the team ends. The
    // reductions themselves need not be complete: the copy engine finishes
    // them before the kernel is (FlashAttention-3's and CUTLASS' epilogues
    // end the same way), and only a later kernel (convert_dq) reads the
    // accumulator.
    if (dq_issuer) bulk_wait_read();
    probe_team(5);
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
