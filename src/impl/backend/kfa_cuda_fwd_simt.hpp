#ifndef KFA_CUDA_FWD_SIMT_HPP
#define KFA_CUDA_FWD_SIMT_HPP

// Exact fp32 forward on the CUDA backend: fp32 FMAs (no tensor cores), tiled
// in registers the way SIMT matrix products are. A team of 4 warps owns 64
// query rows; thread (ty, tx) = (warp·4 + lane/8, lane%8) holds 4 rows
// (4·ty..) against the keys tx + 8·j of each K/V block, and for the output
// the same 4 rows against the columns 32·c + 4·tx + (0..3):
//   S:   per 4 head-dim steps, a float4 of Q per row (one address per 8
//        lanes: a broadcast) and a float4 of K per key (8 lanes read 8
//        consecutive rows: conflict-free with rows padded by 4 floats);
//        16·kKeys FMAs per 4 + kKeys shared-memory loads.
//   P:   the online softmax in registers (row max and sum reduced over the 8
//        lanes of a row group with shuffles; each exponential one FFMA and
//        ex2.approx), P written transposed to the warp's own slice of
//        scratch, read back a float4 of 4 rows per key.
//   O:   per key, that float4 of P and kCols/4 float4s of V: 4·kCols FMAs
//        per 1 + kCols/4 loads.
// K and V blocks are double buffered with cp.async (block j+1's copies
// issued after S_j); Q stays in scratch.
// Launched by launch_cuda_team with opt-in shared memory (~110 KB).

#include <kfa_mask.hpp>
#include <kfa_traits.hpp>

#include <impl/backend/kfa_cuda_launch.hpp>
#include <impl/backend/kfa_cuda_mma.hpp>

#include <cstdint>

namespace kfa {
namespace Impl {

/// Keys per K/V block and teams per multiprocessor of the library's shape:
/// 64 keys at head_dim 64 and 32 at 128 (104 and 110 KB), two teams.
template <int HeadDim>
constexpr int simt_block_n() {
  return HeadDim <= 64 ? 64 : 32;
}

/// FastExp: the exponentials as one FFMA and ex2.approx (log2 e folded into
/// the shift; relative error 2^-22, as expf's 2 ulp) instead of expf's nine
/// instructions (RESULTS v26); false is bench_device's variant simt_expf.
template <class ExecSpace, int HeadDim, class QView, class KView, class VView, class OView,
          class LseView, int BlockN = simt_block_n<HeadDim>(), int MinBlocksPerSM = 2,
          bool FastExp = true>
class FlashForwardSimtKernel {
 public:
  static constexpr int kHeadDim = HeadDim;
  static constexpr int kWarps = 4;
  static constexpr int kMinBlocksPerSM = MinBlocksPerSM;
  static constexpr int kStages = 2;
  static constexpr int kBlockM = 64;     // 16 row groups of 4
  static constexpr int kBlockN = BlockN;  // keys per K/V block
  static constexpr int kKeys = kBlockN / 8;                // keys per thread
  static constexpr int kCols = kHeadDim / 8;               // output columns per thread
  static constexpr int kPitch = kHeadDim + 4;              // floats per Q, K, V row
  static constexpr int kPitchP = kBlockM + 4;              // floats per Pᵀ row
  static_assert(kHeadDim % 32 == 0, "kfa: the simt forward needs head_dim % 32 == 0");
  static_assert(kBlockN % 8 == 0, "kfa: the simt forward streams multiples of 8 keys");

  FlashForwardSimtKernel(const QView& q, const KView& k, const VView& v, const OView& o,
                         const LseView& lse, float scale, bool causal)
      : m_q(q.data()),
        m_k(k.data()),
        m_v(v.data()),
        m_o(o.data()),
        m_lse(lse.data()),
        m_scale(scale),
        m_p(q, k, causal),
        m_num_q_blocks((m_p.seqlen_q + kBlockM - 1) / kBlockM) {}

  static bool fits(const ExecSpace& space) {
    return scratch_bytes() <= cuda_team_scratch_max(space);
  }

  void launch(const ExecSpace& space) const {
    launch_cuda_team(space, "kfa::fwd::simt_main_loop", *this,
                     m_p.league(m_num_q_blocks), scratch_bytes());
  }

  /// Q, K and V per stage, Pᵀ.
  KOKKOS_INLINE_FUNCTION static constexpr std::size_t scratch_bytes() {
    return sizeof(float) * (std::size_t(kBlockM + 2 * kStages * kBlockN) * kPitch +
                            std::size_t(kBlockN) * kPitchP) +
           16;
  }

  template <class Team>
  KOKKOS_INLINE_FUNCTION void body(const Team& team, void* raw) const {
#if KFA_CUDA_MMA_DEVICE
    using namespace cuda_mma;
    const int lane = threadIdx.x, warp = threadIdx.y;
    const int tid = warp * 32 + lane;
    const int ty = warp * 4 + lane / 8, tx = lane % 8;

    const int league = team.league_rank();
    int b, h;
    // Longest rows first under a causal mask.
    const int q_block = m_num_q_blocks - 1 - m_p.block_of(league, m_num_q_blocks, b, h);
    const int row_begin = q_block * kBlockM;
    const long row_stride = long(m_p.heads) * kHeadDim;
    const float* gQ = m_q + m_p.offset(b, h, m_p.seqlen_q, kHeadDim);
    const float* gK = m_k + m_p.offset(b, h, m_p.seqlen_k, kHeadDim);
    const float* gV = m_v + m_p.offset(b, h, m_p.seqlen_k, kHeadDim);
    float* const sQ = aligned_scratch<float>(raw);
    float* const sP = sQ + (kBlockM + 2 * kStages * kBlockN) * kPitch;
    auto sK = [&](int stage) { return sQ + (kBlockM + 2 * stage * kBlockN) * kPitch; };
    auto sV = [&](int stage) { return sK(stage) + kBlockN * kPitch; };

    auto load_tile = [&](float* dst, const float* src, int first_row, int rows_total,
                         int rows) {
      load_rows_async<kHeadDim, kPitch>(dst, src, row_stride, first_row, rows, rows_total, tid,
                                        kWarps * 32);
    };
    auto load_kv = [&](int kv_block) {
      const int stage = kv_block % kStages;
      load_tile(sK(stage), gK, kv_block * kBlockN, m_p.seqlen_k, kBlockN);
      load_tile(sV(stage), gV, kv_block * kBlockN, m_p.seqlen_k, kBlockN);
    };

    const int rows = imin(kBlockM, m_p.seqlen_q - row_begin);
    const int key_end = m_p.mask.key_end(row_begin + rows);
    const int num_kv_blocks = (key_end + kBlockN - 1) / kBlockN;
    const int row0 = row_begin + ty * 4;  // this thread's first row

    float acc_o[4][kCols];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int c = 0; c < kCols; ++c) acc_o[i][c] = 0.f;
    float row_max[4], row_sum[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) row_max[i] = -INFINITY, row_sum[i] = 0.f;

    load_tile(sQ, gQ, row_begin, m_p.seqlen_q, kBlockM);
    if (num_kv_blocks > 0) load_kv(0);
    cp_async_commit();
    for (int kv_block = 0; kv_block < num_kv_blocks; ++kv_block) {
      const int key_begin = kv_block * kBlockN;
      const float* k_tile = sK(kv_block % kStages);
      const float* v_tile = sV(kv_block % kStages);
      cp_async_wait<0>();
      // K_j and V_j (and Q) are in scratch for every warp, and every warp is
      // done with block j-1, whose stage block j+1 now reuses.
      team.team_barrier();

      // S = Q·K_jᵀ for rows 4·ty.. and keys tx + 8·j.
      float s[4][kKeys];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < kKeys; ++j) s[i][j] = 0.f;
#pragma unroll 4
      for (int d = 0; d < kHeadDim; d += 4) {
        float4 qv[4], kv[kKeys];
#pragma unroll
        for (int i = 0; i < 4; ++i)
          qv[i] = *reinterpret_cast<const float4*>(sQ + (ty * 4 + i) * kPitch + d);
#pragma unroll
        for (int j = 0; j < kKeys; ++j)
          kv[j] = *reinterpret_cast<const float4*>(k_tile + (tx + 8 * j) * kPitch + d);
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < kKeys; ++j) {
            s[i][j] = fmaf(qv[i].x, kv[j].x, s[i][j]);
            s[i][j] = fmaf(qv[i].y, kv[j].y, s[i][j]);
            s[i][j] = fmaf(qv[i].z, kv[j].z, s[i][j]);
            s[i][j] = fmaf(qv[i].w, kv[j].w, s[i][j]);
          }
      }
      // Block j+1's copies, into the stage block j-1 used, issued between
      // the S and the P·V products rather than in a burst right after the
      // barrier, where they delayed the first S loads (RESULTS v23: +6%).
      if (kv_block + 1 < num_kv_blocks) load_kv(kv_block + 1);
      cp_async_commit();

      // Scale, mask, online softmax; the 8 lanes of a row group share rows.
      const bool needs_mask =
          m_p.mask.tile_needs_mask(row_begin, row_begin + kBlockM, key_begin, key_begin + kBlockN);
      float alpha[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float block_max = row_max[i];
#pragma unroll
        for (int j = 0; j < kKeys; ++j) {
          float x = s[i][j] * m_scale;
          if (needs_mask && m_p.mask.masked(row0 + i, key_begin + tx + 8 * j)) x = -INFINITY;
          s[i][j] = x;
          block_max = fmaxf(block_max, x);
        }
        block_max = fmaxf(block_max, shfl_xor(block_max, 1));
        block_max = fmaxf(block_max, shfl_xor(block_max, 2));
        block_max = fmaxf(block_max, shfl_xor(block_max, 4));
        // A row whose every score so far is masked keeps max -inf: shift by
        // 0 so exp(-inf - shift) = 0 instead of NaN.
        const float shift = block_max == -INFINITY ? 0.f : block_max;
        alpha[i] = row_max[i] == -INFINITY ? 0.f : exp_of(row_max[i] - shift);
        row_max[i] = block_max;
        const float shift2 = shift * kLog2e;
        float block_sum = 0.f;
#pragma unroll
        for (int j = 0; j < kKeys; ++j) {
          s[i][j] = FastExp ? exp2_fast(fmaf(s[i][j], kLog2e, -shift2)) : expf(s[i][j] - shift);
          block_sum += s[i][j];
        }
        row_sum[i] = alpha[i] * row_sum[i] + block_sum;
      }
      // Pᵀ into this warp's rows of scratch (rows 16·warp.. belong to it).
#pragma unroll
      for (int j = 0; j < kKeys; ++j)
        *reinterpret_cast<float4*>(sP + (tx + 8 * j) * kPitchP + ty * 4) =
            make_float4(s[0][j], s[1][j], s[2][j], s[3][j]);
      // The warp's Pᵀ slice is visible to its lanes (no other warp reads it).
      __syncwarp();
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int c = 0; c < kCols; ++c) acc_o[i][c] *= alpha[i];

      // O += P·V_j: per key, 4 rows of P and this thread's columns of V.
#pragma unroll 4
      for (int key = 0; key < kBlockN; ++key) {
        const float4 p = *reinterpret_cast<const float4*>(sP + key * kPitchP + ty * 4);
#pragma unroll
        for (int c4 = 0; c4 < kCols / 4; ++c4) {
          const float4 vv =
              *reinterpret_cast<const float4*>(v_tile + key * kPitch + c4 * 32 + tx * 4);
          const float pr[4] = {p.x, p.y, p.z, p.w};
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            acc_o[i][4 * c4 + 0] = fmaf(pr[i], vv.x, acc_o[i][4 * c4 + 0]);
            acc_o[i][4 * c4 + 1] = fmaf(pr[i], vv.y, acc_o[i][4 * c4 + 1]);
            acc_o[i][4 * c4 + 2] = fmaf(pr[i], vv.z, acc_o[i][4 * c4 + 2]);
            acc_o[i][4 * c4 + 3] = fmaf(pr[i], vv.w, acc_o[i][4 * c4 + 3]);
          }
        }
      }
      // Every lane is done reading the warp's Pᵀ before the next block's.
      __syncwarp();
    }
    cp_async_wait<0>();

    // O = acc_o / row_sum, lse = max + ln(sum).
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float sum = row_sum[i];
      sum += shfl_xor(sum, 1);
      sum += shfl_xor(sum, 2);
      sum += shfl_xor(sum, 4);
      const int row = row0 + i;
      if (row >= m_p.seqlen_q) continue;
      const float inv = sum > 0.f ? 1.f / sum : 0.f;
      float* gO = m_o + m_p.offset(b, h, m_p.seqlen_q, kHeadDim) + row * row_stride;
#pragma unroll
      for (int c4 = 0; c4 < kCols / 4; ++c4)
        *reinterpret_cast<float4*>(gO + c4 * 32 + tx * 4) =
            make_float4(acc_o[i][4 * c4] * inv, acc_o[i][4 * c4 + 1] * inv,
                        acc_o[i][4 * c4 + 2] * inv, acc_o[i][4 * c4 + 3] * inv);
      if (tx == 0)
        m_lse[m_p.lse_offset(b, h) + row] =
            sum > 0.f ? row_max[i] + logf(sum) : -INFINITY;
    }
#else
    (void)team;
    (void)raw;
#endif
  }

 private:
  static constexpr float kLog2e = 1.4426950408889634f;

#if KFA_CUDA_MMA_DEVICE
  KOKKOS_FORCEINLINE_FUNCTION static float exp_of(float x) {
    return FastExp ? cuda_mma::exp2_fast(x * kLog2e) : expf(x);
  }
#endif

  const float* m_q;
  const float* m_k;
  const float* m_v;
  float* m_o;
  float* m_lse;
  float m_scale;
  FusedProblem m_p;
  int m_num_q_blocks;
};

}  // namespace Impl
}  // namespace kfa

#endif
