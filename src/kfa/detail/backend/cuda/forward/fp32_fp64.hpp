#ifndef KFA_DETAIL_BACKEND_CUDA_FORWARD_FP32_FP64_HPP
#define KFA_DETAIL_BACKEND_CUDA_FORWARD_FP32_FP64_HPP

// Tensor-core forward for fp32 and fp64 on the CUDA backend, written once
// over a tensor-core atom (kfa/detail/backend/cuda/primitives/mma_atoms.hpp):
// DMMA for fp64, 3xTF32 for fp32 (fp32 precision; plain tf32 when the
// options ask for it). The
// shape is the 16-bit kernel's opt-in one: a team of Warps warps owns
// Warps·MTiles·kRows query rows kept in scratch; K and V blocks of BlockN
// keys are double buffered with cp.async, so block j+1 loads during all of
// block j's work (one barrier per block); S = Q·Kᵀ and O += P·V accumulate
// in registers in the value type (3xTF32 sums each block's P·V and each 4
// k-steps of S in fresh accumulators, added by fp32 adds: Atom::kFreshSums);
// the online softmax runs in registers
// (natural base in fp64, base 2 with the scale folded in for fp32); P feeds
// P·V from its accumulators. Scratch rows are padded by 4 elements, and
// fp64's tiles swizzled (swizzle_col), which makes every fragment load of
// both atoms conflict-free (two wavefronts, the minimum, for 64-bit loads;
// without the swizzle fp64's V fragments take four). Launched by
// launch_cuda_team with opt-in shared memory; where the GPU grants less, the
// portable kernels run.

#include <kfa/detail/attention/mask.hpp>
#include <kfa/detail/attention/traits.hpp>

#include <kfa/detail/backend/cuda/primitives/launch.hpp>
#include <kfa/detail/backend/cuda/primitives/mma_atoms.hpp>

#include <cstdint>

namespace kfa {
namespace Impl {

/// Tile shape of the fp32/fp64 tensor-core forward (always two stages).
template <int Warps, int MTiles, int BlockN, int MinBlocksPerSM>
using Fp32Fp64FwdShape = FusedFwdShape<Warps, MTiles, BlockN, 2, MinBlocksPerSM>;

/// The library's shapes: fp64 m16n8k8 at head_dim 64 with 64 query rows
/// (16 per warp) and 32-key blocks, two teams per multiprocessor; at 128
/// one team of 8 warps (128 rows) with 16-key blocks (203 KB), which reads
/// Q's fragments once per 16 keys instead of 8 (faster than two 4-warp
/// teams with 8-key blocks or one with 16 keys). fp32: 64 rows at head_dim
/// 128 and 128 at 64 (32-key blocks), two teams per multiprocessor; m8n8k4
/// fp64: two teams at 64, one at 128.
template <class Atom, int HeadDim>
struct Fp32Fp64FwdDefaultShape;
template <int HeadDim>
struct Fp32Fp64FwdDefaultShape<cuda_mma::Fp64Atom, HeadDim> {
  using type = std::conditional_t<(HeadDim <= 64), Fp32Fp64FwdShape<4, 2, 32, 2>,
                                  Fp32Fp64FwdShape<4, 2, 16, 1>>;
};
template <int HeadDim>
struct Fp32Fp64FwdDefaultShape<cuda_mma::Fp64x16Atom, HeadDim> {
  using type = std::conditional_t<(HeadDim <= 64), Fp32Fp64FwdShape<4, 1, 32, 2>,
                                  Fp32Fp64FwdShape<8, 1, 16, 1>>;
};
template <int Passes, bool FreshSums, int HeadDim>
struct Fp32Fp64FwdDefaultShape<cuda_mma::Tf32Atom<Passes, FreshSums>, HeadDim> {
  using type = std::conditional_t<(HeadDim <= 64), Fp32Fp64FwdShape<4, 2, 32, 2>,
                                  Fp32Fp64FwdShape<4, 1, 32, 2>>;
};

template <class ExecSpace, int HeadDim, class Atom, class QView, class KView, class VView,
          class OView, class LseView,
          class Shape = typename Fp32Fp64FwdDefaultShape<Atom, HeadDim>::type,
          class VariantT = PlainVariant>
class FlashForwardFp32Fp64Kernel
    : public FusedForwardOperands<typename Atom::value_type>,
      public FusedVariantParams<VariantT, typename Atom::value_type>,
      public FusedTeamLaunch<FlashForwardFp32Fp64Kernel<ExecSpace, HeadDim, Atom, QView, KView,
                                                        VView, OView, LseView, Shape, VariantT>> {
 public:
  static constexpr const char* kLabel = "kfa::fwd::fp32_fp64_main_loop";
  using value_type = typename Atom::value_type;
  using operands = FusedForwardOperands<value_type>;
  using variant_params = FusedVariantParams<VariantT, value_type>;
  static constexpr bool kVariant = variant_params::kVariant;
  static constexpr int kHeadDim = HeadDim;
  static constexpr int kWarps = Shape::kWarps;
  static constexpr int kMTiles = Shape::kMTiles;
  static constexpr int kMinBlocksPerSM = Shape::kMinBlocksPerSM;
  static constexpr int kStages = 2;
  static constexpr int kWarpRows = Atom::kRows * kMTiles;
  static constexpr int kBlockM = kWarpRows * kWarps;
  static constexpr int kBlockN = Shape::kBlockN;
  static constexpr int kPitch = kHeadDim + 4;  // elements per scratch row
  static constexpr int kScratchRows = kBlockM + 2 * kStages * kBlockN;
  static_assert(kHeadDim % 32 == 0, "kfa: the fp32/fp64 forward needs head_dim % 32 == 0");
  static_assert(kBlockN % 8 == 0, "kfa: the fp32/fp64 forward streams multiples of 8 keys");

  FlashForwardFp32Fp64Kernel(const QView& q, const KView& k, const VView& v, const OView& o,
                            const LseView& lse, value_type scale, FusedWindow window,
                            const variant_params& variant = variant_params())
      : operands(q, k, v, o, lse, kBase2 ? scale * value_type(1.4426950408889634) : scale,
                 window, kBlockM),
        variant_params(variant) {}

  KOKKOS_INLINE_FUNCTION static constexpr std::size_t scratch_bytes() {
    return cuda_mma::aligned_scratch_bytes(std::size_t(kScratchRows) * kPitch * sizeof(value_type));
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
    const long row_stride = long(m_p.heads) * kHeadDim, kv_stride = m_kv.row_stride(kHeadDim);
    const value_type* gQ = m_q + m_p.q_offset(sq, h, kHeadDim);
    const value_type* gK = m_k + m_kv.offset(m_p, sq, h, kHeadDim);
    const value_type* gV = m_v + m_kv.offset(m_p, sq, h, kHeadDim);
    value_type* sQ = aligned_scratch<value_type>(raw);
    auto sK = [&](int stage) { return sQ + (kBlockM + 2 * stage * kBlockN) * kPitch; };
    auto sV = [&](int stage) { return sK(stage) + kBlockN * kPitch; };

    // `rows` rows x head_dim of a [b][i][h][d] tensor into a scratch tile,
    // rows past `rows_total` zero-filled.
    auto load_tile = [&](value_type* dst, const value_type* src, long stride, int first_row,
                         int rows_total, int rows) {
      load_rows_async<kHeadDim, kPitch, Atom::kSwizzle>(dst, src, stride, first_row, rows,
                                                        rows_total, tid, kWarps * 32);
    };
    auto load_kv = [&](int kv_block) {
      const int stage = kv_block % kStages;
      load_tile(sK(stage), gK, kv_stride, kv_block * kBlockN, sq.seqlen_k, kBlockN);
      load_tile(sV(stage), gV, kv_stride, kv_block * kBlockN, sq.seqlen_k, kBlockN);
    };

    const int rows = imin(kBlockM, sq.seqlen_q - row_begin);
    // The key blocks inside the mask's window (AttentionMask::key_blocks).
    int first_kv_block, end_kv_block;
    team_tile.key_blocks(rows, kBlockN, first_kv_block, end_kv_block, *this);
    // Rows of accumulator element (mt, j): row0 + mt·kRows + (j / 2)·8.
    const int row0 = row_begin + warp * kWarpRows + lane / 4;

    Tiles<kTilesO> acc_o;
    zero(acc_o);
    value_type row_max[kRows], row_sum[kRows];
    #pragma unroll
    for (int r = 0; r < kRows; ++r) row_max[r] = -INFINITY, row_sum[r] = 0;
    Tiles<kTilesS> s;

    load_tile(sQ, gQ, row_stride, row_begin, sq.seqlen_q, kBlockM);
    if (first_kv_block < end_kv_block) load_kv(first_kv_block);
    cp_async_commit();
    for (int kv_block = first_kv_block; kv_block < end_kv_block; ++kv_block) {
      const int key_begin = kv_block * kBlockN;
      cp_async_wait<0>();
      // K_j and V_j (and Q) are in scratch for every warp, and every warp is
      // done with block j-1, whose stage block j+1 now reuses.
      team.team_barrier();
      // Right after the barrier: issued after S_j instead (as the exact
      // fp32 forward does), the copies gain nothing here.
      if (kv_block + 1 < end_kv_block) load_kv(kv_block + 1);
      cp_async_commit();
      scores(s, sQ, sK(kv_block % kStages), warp);
      if constexpr (kVariant) variant_scores(s, sq.mask, b, h, row_begin, row0, key_begin);
      softmax_update(s, acc_o, row_max, row_sum, sq.mask, row_begin, row0, key_begin);
      if constexpr (kVariant) variant_dropout(s, b, h, row0, key_begin);
      accumulate_pv(s, acc_o, sV(kv_block % kStages));
    }
    cp_async_wait<0>();
    write_output(acc_o, row_max, row_sum, row0, sq, h);
#else
    (void)team;
    (void)raw;
#endif
  }

 private:
  static constexpr bool kBase2 = sizeof(value_type) == 4;
  /// fp64 rescales lazily: the running max (the shift of P, O and the sum)
  /// moves only when a row of the warp's rows rises above it by more than
  /// kLazyRescale (a warp vote), else P is taken against the old max (P <=
  /// e^16) and the rescale factor is 1: as exact, since P stays fp64
  /// through P·V, and most blocks skip the fp64 exponential of the factor
  /// and the multiplies of O by it. fp32 rescales every block: there P is
  /// rounded to tf32 for P·V, where the exact max keeps the largest P at
  /// exactly 1 (with a stale max the 16-bit forward's error doubles).
  static constexpr bool kLazy = !kBase2;
  static constexpr double kLazyRescale = 16;
  static constexpr int kSteps = kHeadDim / Atom::kDepth;  // k-steps of Q·Kᵀ
  static constexpr int kFreshSteps = 4;                    // k-steps per fresh sum of S
  static constexpr int kTilesS = kBlockN / 8;              // n-tiles of S per atom
  static constexpr int kTilesO = kHeadDim / 8;             // n-tiles of O per atom
  static constexpr int kHalves = Atom::kC / 2;             // 8-row halves per atom
  static constexpr int kRows = kMTiles * kHalves;          // rows per lane: mt·kHalves + j/2
  /// A lane's accumulators of N n-tiles per m-tile, and their fresh partial
  /// sums (Tiles<N> with Atom::kFreshSums, else unused).
  template <int N>
  using Tiles = value_type[kMTiles][N][Atom::kC];
  template <int N>
  using Part = std::conditional_t<Atom::kFreshSums, Tiles<N>, value_type[1][1][1]>;

#if KFA_CUDA_MMA_DEVICE
  KOKKOS_FORCEINLINE_FUNCTION static value_type exp_base(value_type x) {
    if constexpr (kBase2) {
      return cuda_mma::exp2_fast(x);
    } else {
      return exp(x);
    }
  }

  KOKKOS_FORCEINLINE_FUNCTION static value_type vmax(value_type x, value_type y) {
    return x > y ? x : y;
  }

  KOKKOS_FORCEINLINE_FUNCTION static value_type log_base(value_type x) {
    if constexpr (kBase2) {
      return log2f(x) * 0.6931471805599453f;
    } else {
      return log(x);
    }
  }

  /// S = Q·K_jᵀ for this warp's atoms of rows. With Atom::kFreshSums the
  /// products of each kFreshSteps k-steps are summed in zeroed accumulators
  /// and added to S by fp32 adds.
  KOKKOS_FORCEINLINE_FUNCTION void scores(Tiles<kTilesS>& s, const value_type* sQ,
                                          const value_type* sK, int warp) const {
    zero(s);
    constexpr int kGroup = Atom::kFreshSums ? kFreshSteps : kSteps;
    static_assert(kSteps % kGroup == 0, "kfa: k-steps per fresh sum must divide head_dim");
    #pragma unroll
    for (int ks0 = 0; ks0 < kSteps; ks0 += kGroup) {
      Part<kTilesS> part;
      Tiles<kTilesS>& acc = sum_target(s, part);
      #pragma unroll
      for (int ks = ks0; ks < ks0 + kGroup; ++ks) {
        typename Atom::A a[kMTiles];
        #pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt)
          a[mt] =
              Atom::load_a(sQ, kPitch, warp * kWarpRows + mt * Atom::kRows, ks * Atom::kDepth);
        #pragma unroll
        for (int n = 0; n < kTilesS; ++n) {
          const typename Atom::B kb = Atom::load_b_t(sK, kPitch, n * 8, ks * Atom::kDepth);
          #pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt) Atom::mma(acc[mt][n], a[mt], kb);
        }
      }
      add_part(s, part);
    }
  }

  /// A variant's scores in place of S = Q·K_jᵀ: pipeline(scale·s) (softcap,
  /// then the score modifier) in natural units for the elements inside the
  /// sequence, then in the softmax's base; -inf everywhere where the
  /// modifier's block predicate hides the tile. The mask comes after, in
  /// softmax_update.
  KOKKOS_FORCEINLINE_FUNCTION void variant_scores(Tiles<kTilesS>& s, const AttentionMask& mask,
                                                  int b, int h, int row_begin, int row0,
                                                  int key_begin) const {
    const int lane = threadIdx.x;
    const SequenceInfo seq = variant_params::sequence(mask, b);
    const bool visible =
        this->m_pipe.visible(b, h, row_begin, imin(row_begin + kBlockM, seq.seqlen_q), key_begin,
                             imin(key_begin + kBlockN, seq.seqlen_k));
    const bool modify =
        !this->m_pipe.unchanged(b, h, row_begin, imin(row_begin + kBlockM, seq.seqlen_q),
                                key_begin, imin(key_begin + kBlockN, seq.seqlen_k));
    const value_type to_base = kBase2 ? value_type(1.4426950408889634) : value_type(1);
    for_each_element<kTilesS>([&](int mt, int n, int j) {
      const int row = row0 + mt * Atom::kRows + (j / 2) * 8;
      const int col = key_begin + n * 8 + (lane % 4) * 2 + (j & 1);
      value_type x = s[mt][n][j] * this->m_variant_scale;
      if (row < seq.seqlen_q && col < seq.seqlen_k) {
        value_type grad;
        x = this->m_pipe.template score<false>(seq, b, h, row, col, x, grad, modify);
      }
      s[mt][n][j] = visible ? x * to_base : value_type(-INFINITY);
    });
  }

  /// Dropout on P (after the row sums, which take the undropped P): kept
  /// elements scaled by 1/(1-p), the others 0, from the generator every
  /// backend shares; a lane's keys j, j + 1 of a row are a pair (one draw).
  KOKKOS_FORCEINLINE_FUNCTION void variant_dropout(Tiles<kTilesS>& s, int b, int h, int row0,
                                                   int key_begin) const {
    if (!this->m_pipe.dropout()) return;
    const int lane = threadIdx.x;
    const std::uint64_t head = this->m_pipe.dropout_head(b, h);
    #pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
      #pragma unroll
      for (int half = 0; half < kHalves; ++half) {
        const std::uint64_t row =
            this->m_pipe.dropout_row_of(head, row0 + mt * Atom::kRows + half * 8);
        #pragma unroll
        for (int n = 0; n < kTilesS; ++n) {
          value_type keep0, keep1;
          this->m_pipe.keep_factors(row, key_begin + n * 8 + (lane % 4) * 2, keep0, keep1);
          s[mt][n][2 * half] *= keep0;
          s[mt][n][2 * half + 1] *= keep1;
        }
      }
  }

  /// Scale, mask, online softmax in registers: S becomes P, the running max
  /// and sum move on, O is rescaled. Row max and sum are reduced over the 4
  /// lanes (a quad) that share a row.
  KOKKOS_FORCEINLINE_FUNCTION void softmax_update(Tiles<kTilesS>& s, Tiles<kTilesO>& acc_o,
                                                  value_type (&row_max)[kRows],
                                                  value_type (&row_sum)[kRows],
                                                  const AttentionMask& mask, int row_begin,
                                                  int row0, int key_begin) const {
    using namespace cuda_mma;
    const int lane = threadIdx.x;
    const bool needs_mask =
        mask.tile_needs_mask(row_begin, row_begin + kBlockM, key_begin, key_begin + kBlockN);
    value_type block_max[kRows];
    #pragma unroll
    for (int r = 0; r < kRows; ++r) block_max[r] = row_max[r];
    for_each_element<kTilesS>([&](int mt, int n, int j) {
      // A variant's scores come scaled and in the softmax's base
      // (variant_scores).
      value_type x = kVariant ? s[mt][n][j] : s[mt][n][j] * m_scale;
      if (needs_mask) {
        const int row = row0 + mt * Atom::kRows + (j / 2) * 8;
        const int col = key_begin + n * 8 + (lane % 4) * 2 + (j & 1);
        if (mask.masked(row, col)) x = -INFINITY;
      }
      s[mt][n][j] = x;
      block_max[mt * kHalves + j / 2] = vmax(block_max[mt * kHalves + j / 2], x);
    });
    value_type shift[kRows], alpha[kRows];
    bool grows = false;
    #pragma unroll
    for (int r = 0; r < kRows; ++r) {
      block_max[r] = vmax(block_max[r], shfl_xor(block_max[r], 1));
      block_max[r] = vmax(block_max[r], shfl_xor(block_max[r], 2));
      // -inf + kLazyRescale = -inf: a row's first finite max always grows.
      grows = grows || block_max[r] > row_max[r] + value_type(kLazyRescale);
    }
    const bool rescale = !kLazy || __any_sync(0xffffffffu, grows);
    #pragma unroll
    for (int r = 0; r < kRows; ++r) {
      // A row whose every score so far is masked keeps max -inf: shift by
      // 0 so exp(-inf - shift) = 0 instead of NaN.
      if (rescale) {
        shift[r] = block_max[r] == -INFINITY ? value_type(0) : block_max[r];
        alpha[r] = row_max[r] == -INFINITY ? value_type(0) : exp_base(row_max[r] - shift[r]);
        row_max[r] = block_max[r];
      } else {
        shift[r] = row_max[r] == -INFINITY ? value_type(0) : row_max[r];
        alpha[r] = 1;
      }
    }
    value_type block_sum[kRows];
    #pragma unroll
    for (int r = 0; r < kRows; ++r) block_sum[r] = 0;
    for_each_element<kTilesS>([&](int mt, int n, int j) {
      const value_type p = exp_base(s[mt][n][j] - shift[mt * kHalves + j / 2]);
      s[mt][n][j] = p;
      block_sum[mt * kHalves + j / 2] += p;
    });
    #pragma unroll
    for (int r = 0; r < kRows; ++r) row_sum[r] = alpha[r] * row_sum[r] + block_sum[r];
    // With the lazy rescale, O moves only with the max (a warp-uniform
    // branch; its multiplies are 64 fp64 operations per lane and block at
    // head_dim 128).
    if (rescale || Shape::kRescaleOAlways) {
      for_each_element<kTilesO>(
          [&](int mt, int n, int j) { acc_o[mt][n][j] *= alpha[mt * kHalves + j / 2]; });
    }
  }

  /// O += P·V_j, P straight from the S accumulators (keys permuted within
  /// each 8-key tile alike in P and V). With Atom::kFreshSums the block's
  /// products are summed in zeroed accumulators and added to O by fp32 adds.
  KOKKOS_FORCEINLINE_FUNCTION void accumulate_pv(const Tiles<kTilesS>& s, Tiles<kTilesO>& acc_o,
                                                 const value_type* sV) const {
    Part<kTilesO> part;
    Tiles<kTilesO>& acc = sum_target(acc_o, part);
    #pragma unroll
    for (int kt = 0; kt < kTilesS; ++kt)
      #pragma unroll
      for (int slice = 0; slice < Atom::kSlices; ++slice) {
        typename Atom::A p[kMTiles];
        #pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) p[mt] = Atom::a_from_c(s[mt][kt], slice);
        #pragma unroll
        for (int n = 0; n < kTilesO; ++n) {
          const typename Atom::B vb = Atom::load_b_perm(sV, kPitch, kt * 8, slice, n * 8);
          #pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt) Atom::mma(acc[mt][n], p[mt], vb);
        }
      }
    add_part(acc_o, part);
  }

  /// f(mt, n, j) for every element (m-tile, n-tile, accumulator) of a
  /// Tiles<N>, unrolled.
  template <int N, class F>
  KOKKOS_FORCEINLINE_FUNCTION static void for_each_element(F&& f) {
    #pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
      #pragma unroll
      for (int n = 0; n < N; ++n)
        #pragma unroll
        for (int j = 0; j < Atom::kC; ++j) f(mt, n, j);
  }

  template <int N>
  KOKKOS_FORCEINLINE_FUNCTION static void zero(Tiles<N>& x) {
    for_each_element<N>([&](int mt, int n, int j) { x[mt][n][j] = 0; });
  }

  /// Where a product sums: a zeroed `part` with fresh sums, else `sum` itself.
  template <int N>
  KOKKOS_FORCEINLINE_FUNCTION static Tiles<N>& sum_target(Tiles<N>& sum, Part<N>& part) {
    if constexpr (Atom::kFreshSums) {
      zero(part);
      return part;
    } else {
      (void)part;
      return sum;
    }
  }

  /// sum += part by adds in the value type (nothing without fresh sums).
  template <int N>
  KOKKOS_FORCEINLINE_FUNCTION static void add_part(Tiles<N>& sum, const Part<N>& part) {
    if constexpr (Atom::kFreshSums) {
      for_each_element<N>([&](int mt, int n, int j) { sum[mt][n][j] += part[mt][n][j]; });
    } else {
      (void)sum;
      (void)part;
    }
  }

  /// O = acc_o / row_sum, lse = ln(sum) + max (natural log).
  KOKKOS_FORCEINLINE_FUNCTION void write_output(
      const Tiles<kTilesO>& acc_o, const value_type (&row_max)[kRows],
      value_type (&row_sum)[kRows], int row0, const FusedSeq& sq, int h) const {
    using namespace cuda_mma;
    const int lane = threadIdx.x;
    const long row_stride = long(m_p.heads) * kHeadDim;
    quad_sums(row_sum);
    #pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int mt = r / kHalves, half = r % kHalves;
      const int row = row0 + mt * Atom::kRows + half * 8;
      if (row >= sq.seqlen_q) continue;
      // Sum 0: no key (O = 0, lse = -inf); a NaN sum stays NaN.
      const value_type inv = row_sum[r] == 0 ? value_type(0) : value_type(1) / row_sum[r];
      value_type* gO = m_o + m_p.q_offset(sq, h, kHeadDim) + row * row_stride;
      #pragma unroll
      for (int n = 0; n < kTilesO; ++n) {
        const int d = n * 8 + (lane % 4) * 2;
        gO[d] = acc_o[mt][n][2 * half] * inv;
        gO[d + 1] = acc_o[mt][n][2 * half + 1] * inv;
      }
      if (lane % 4 == 0) {
        // lse in the natural base: row_max is in the softmax's base.
        m_lse[m_p.lse_offset(sq, h) + row] =
            row_sum[r] == 0 ? value_type(-INFINITY)
                            : (kBase2 ? row_max[r] * value_type(0.6931471805599453) : row_max[r]) +
                                  log_base(row_sum[r]);
      }
    }
  }
#endif

  // The operands (a dependent base); m_scale is the softmax scale, times
  // log2(e) in base 2.
  using operands::m_q, operands::m_k, operands::m_v, operands::m_o, operands::m_lse,
      operands::m_scale, operands::m_p, operands::m_kv, operands::m_num_q_blocks;
};

}  // namespace Impl
}  // namespace kfa

#endif
