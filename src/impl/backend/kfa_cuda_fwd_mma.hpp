#ifndef KFA_CUDA_FWD_MMA_HPP
#define KFA_CUDA_FWD_MMA_HPP

// Tensor-core forward for 16-bit types on the CUDA backend, called from a
// Kokkos TeamPolicy (4 teams threads x 32 vector lanes = 4 warps). Each warp
// owns 16 query rows of a 64-row query block; Q fragments stay in registers,
// K and V blocks of 64 keys stream through team scratch with cp.async (V_j
// and K_{j+1} load while the previous product runs), S = Q·Kᵀ and O += P·V
// run on mma.m16n8k16 with fp32 accumulation, the online softmax runs in
// registers in base 2 with the scale folded in, and P is rounded to the
// operand format in registers and fed straight into P·V. Scratch: K and V
// tiles with rows padded by 16 bytes so ldmatrix is conflict-free; 35 KB at
// head_dim 128, inside Kokkos' ~40 KB level-0 limit.

#include <kfa_mask.hpp>
#include <kfa_traits.hpp>

#include <impl/backend/kfa_cuda_mma.hpp>

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

/// Warps x 16 query rows per team (4 or 8: the Q block is staged through the
/// K and V tiles, 128 rows at most). MinBlocksPerSM becomes the launch bound:
/// it caps registers so that that many teams fit on a multiprocessor.
template <class ExecSpace, int HeadDim, class Format, class QView, class KView, class VView,
          class OView, class LseView, int Warps = 4, int MinBlocksPerSM = 8 / Warps>
class FlashForwardMmaKernel {
 public:
  using policy_t =
      Kokkos::TeamPolicy<ExecSpace, Kokkos::LaunchBounds<32 * Warps, MinBlocksPerSM>>;
  using member_t = typename policy_t::member_type;
  static constexpr int kHeadDim = HeadDim;
  static constexpr int kWarps = Warps;
  static constexpr int kBlockM = 16 * Warps;
  static constexpr int kBlockN = 64;
  static_assert(Warps == 4 || Warps == 8, "kfa: the mma forward runs 4 or 8 warps per team");
  static constexpr int kPitch = kHeadDim + 8;  // halves per scratch row
  static_assert(kHeadDim % 16 == 0, "kfa: the mma forward needs head_dim % 16 == 0");

  FlashForwardMmaKernel(const QView& q, const KView& k, const VView& v, const OView& o,
                        const LseView& lse, float scale, bool causal)
      : m_q(reinterpret_cast<const std::uint16_t*>(q.data())),
        m_k(reinterpret_cast<const std::uint16_t*>(k.data())),
        m_v(reinterpret_cast<const std::uint16_t*>(v.data())),
        m_o(reinterpret_cast<std::uint16_t*>(o.data())),
        m_lse(lse.data()),
        m_scale_log2(scale * 1.4426950408889634f),
        m_batch(static_cast<int>(q.extent(0))),
        m_seqlen_q(static_cast<int>(q.extent(1))),
        m_heads(static_cast<int>(q.extent(2))),
        m_seqlen_k(static_cast<int>(k.extent(1))),
        m_num_q_blocks((m_seqlen_q + kBlockM - 1) / kBlockM),
        m_mask(m_seqlen_q, m_seqlen_k, -1, causal ? 0 : -1) {}

  void launch(const ExecSpace& space) const {
    const int league = m_num_q_blocks * m_batch * m_heads;
    if (league == 0) return;
    policy_t policy(space, league, kWarps, 32);
    check_scratch<policy_t>("kfa::fwd::mma_main_loop", 0, scratch_bytes(), kBlockM, kBlockN,
                            kHeadDim);
    policy.set_scratch_size(0, Kokkos::PerTeam(scratch_bytes()));
    Kokkos::parallel_for("kfa::fwd::mma_main_loop", policy, *this);
  }

  KOKKOS_INLINE_FUNCTION static constexpr std::size_t scratch_bytes() {
    return 2 * std::size_t(kBlockN) * kPitch * sizeof(std::uint16_t) + 16;
  }

  KOKKOS_INLINE_FUNCTION void operator()(const member_t& member) const {
#if KFA_CUDA_MMA_DEVICE
    using namespace cuda_mma;
    constexpr int kSteps = kHeadDim / 16;  // k-steps of Q·Kᵀ
    constexpr int kTilesS = kBlockN / 8;   // n-tiles of S per warp
    constexpr int kTilesO = kHeadDim / 8;  // n-tiles of O per warp
    const int lane = threadIdx.x, warp = threadIdx.y;
    const int tid = warp * 32 + lane;

    const int league = member.league_rank();
    const int bh = league % (m_batch * m_heads);
    const int q_block = m_num_q_blocks - 1 - league / (m_batch * m_heads);
    const int b = bh / m_heads, h = bh % m_heads;
    const int row_begin = q_block * kBlockM;
    const long row_stride = long(m_heads) * kHeadDim;
    const std::uint16_t* gQ = m_q + (long(b) * m_seqlen_q * m_heads + h) * kHeadDim;
    const std::uint16_t* gK = m_k + (long(b) * m_seqlen_k * m_heads + h) * kHeadDim;
    const std::uint16_t* gV = m_v + (long(b) * m_seqlen_k * m_heads + h) * kHeadDim;

    char* raw = static_cast<char*>(member.team_scratch(0).get_shmem(scratch_bytes()));
    std::uint16_t* sK = reinterpret_cast<std::uint16_t*>(
        (reinterpret_cast<std::uintptr_t>(raw) + 15) & ~std::uintptr_t(15));
    std::uint16_t* sV = sK + kBlockN * kPitch;

    // `rows` rows x head_dim of a [b][i][h][d] tensor into a scratch tile,
    // rows past `rows_total` zero-filled.
    auto load_tile = [&](std::uint16_t* dst, const std::uint16_t* src, int first_row,
                         int rows_total, int rows = kBlockN) {
      constexpr int kChunks = kHeadDim / 8;
      for (int c = tid; c < rows * kChunks; c += kWarps * 32) {
        const int r = c / kChunks, cc = c % kChunks;
        const bool ok = first_row + r < rows_total;
        const std::uint16_t* from = src + (ok ? long(first_row + r) * row_stride : 0) + cc * 8;
        cp_async_16(dst + r * kPitch + cc * 8, from, ok ? 16 : 0);
      }
    };

    // Q block through scratch into registers (A fragments), once.
    // (sK and sV are contiguous: 128 rows.)
    load_tile(sK, gQ, row_begin, m_seqlen_q, kBlockM);
    cp_async_commit();
    cp_async_wait<0>();
    // The Q tile is in scratch for every warp.
    member.team_barrier();
    std::uint32_t q_frag[kSteps][4];
    for (int ks = 0; ks < kSteps; ++ks)
      ldmatrix_x4(q_frag[ks], sK + (warp * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * kPitch +
                                  ks * 16 + (lane / 16) * 8);
    // Every warp holds its Q fragments; the tile may be overwritten by K.
    member.team_barrier();

    const int rows = imin(kBlockM, m_seqlen_q - row_begin);
    const int key_end = m_mask.key_end(row_begin + rows);
    const int num_kv_blocks = (key_end + kBlockN - 1) / kBlockN;
    const int row0 = row_begin + warp * 16 + lane / 4, row1 = row0 + 8;

    float acc_o[kTilesO][4];
    for (int n = 0; n < kTilesO; ++n) acc_o[n][0] = acc_o[n][1] = acc_o[n][2] = acc_o[n][3] = 0;
    float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0, 0};

    if (num_kv_blocks > 0) load_tile(sK, gK, 0, m_seqlen_k);
    cp_async_commit();
    for (int kv_block = 0; kv_block < num_kv_blocks; ++kv_block) {
      const int key_begin = kv_block * kBlockN;
      load_tile(sV, gV, key_begin, m_seqlen_k);
      cp_async_commit();
      cp_async_wait<1>();
      // K_j is in scratch (V_j may still be in flight).
      member.team_barrier();

      float s[kTilesS][4];
      for (int n = 0; n < kTilesS; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0;
      for (int ks = 0; ks < kSteps; ++ks)
        for (int np = 0; np < kTilesS / 2; ++np) {
          std::uint32_t kb[4];
          ldmatrix_x4(kb, sK + (np * 16 + (lane % 8) + (lane / 16) * 8) * kPitch + ks * 16 +
                              ((lane / 8) % 2) * 8);
          mma_16816<Format>(s[2 * np], q_frag[ks], kb[0], kb[1]);
          mma_16816<Format>(s[2 * np + 1], q_frag[ks], kb[2], kb[3]);
        }
      // Every warp is done reading K_j: K_{j+1} may land in its place.
      member.team_barrier();
      if (kv_block + 1 < num_kv_blocks) load_tile(sK, gK, key_begin + kBlockN, m_seqlen_k);
      cp_async_commit();

      // Scale (base 2), mask, online softmax in registers. Row max and the
      // rescale are reduced over the 4 lanes (a quad) that share a row.
      const bool needs_mask = m_mask.tile_needs_mask(row_begin, row_begin + kBlockM, key_begin, key_begin + kBlockN);
      float block_max[2] = {row_max[0], row_max[1]};
      for (int n = 0; n < kTilesS; ++n)
        for (int e = 0; e < 4; ++e) {
          const int row = e < 2 ? row0 : row1;
          const int col = key_begin + n * 8 + (lane % 4) * 2 + (e & 1);
          float x = s[n][e] * m_scale_log2;
          if (needs_mask && m_mask.masked(row, col)) x = -INFINITY;
          s[n][e] = x;
          block_max[e / 2] = fmaxf(block_max[e / 2], x);
        }
      float shift[2], alpha[2];
      for (int r = 0; r < 2; ++r) {
        block_max[r] = fmaxf(block_max[r], shfl_xor(block_max[r], 1));
        block_max[r] = fmaxf(block_max[r], shfl_xor(block_max[r], 2));
        // A row whose every score so far is masked keeps max -inf: shift by
        // 0 so exp2(-inf - shift) = 0 instead of NaN.
        shift[r] = block_max[r] == -INFINITY ? 0.f : block_max[r];
        alpha[r] = row_max[r] == -INFINITY ? 0.f : exp2_approx(row_max[r] - shift[r]);
        row_max[r] = block_max[r];
      }
      float block_sum[2] = {0, 0};
      for (int n = 0; n < kTilesS; ++n)
        for (int e = 0; e < 4; ++e) {
          const float p = exp2_approx(s[n][e] - shift[e / 2]);
          s[n][e] = p;
          block_sum[e / 2] += p;
        }
      for (int r = 0; r < 2; ++r) row_sum[r] = alpha[r] * row_sum[r] + block_sum[r];
      for (int n = 0; n < kTilesO; ++n) {
        acc_o[n][0] *= alpha[0];
        acc_o[n][1] *= alpha[0];
        acc_o[n][2] *= alpha[1];
        acc_o[n][3] *= alpha[1];
      }

      cp_async_wait<1>();
      // V_j is in scratch for every warp.
      member.team_barrier();
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        // The S accumulators of n-tiles 2kk, 2kk+1 are exactly the A fragment
        // of the 16-key slice kk: P never leaves registers.
        const std::uint32_t p_frag[4] = {pack2<Format>(s[2 * kk][0], s[2 * kk][1]),
                                         pack2<Format>(s[2 * kk][2], s[2 * kk][3]),
                                         pack2<Format>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                         pack2<Format>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
        for (int np = 0; np < kTilesO / 2; ++np) {
          std::uint32_t vb[4];
          ldmatrix_x4_trans(vb, sV + (kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * kPitch +
                                    np * 16 + (lane / 16) * 8);
          mma_16816<Format>(acc_o[2 * np], p_frag, vb[0], vb[1]);
          mma_16816<Format>(acc_o[2 * np + 1], p_frag, vb[2], vb[3]);
        }
      }
      // Every warp is done reading V_j before V_{j+1} is loaded.
      member.team_barrier();
    }
    cp_async_wait<0>();

    for (int r = 0; r < 2; ++r) {
      row_sum[r] += shfl_xor(row_sum[r], 1);
      row_sum[r] += shfl_xor(row_sum[r], 2);
    }
    for (int r = 0; r < 2; ++r) {
      const int row = r == 0 ? row0 : row1;
      if (row >= m_seqlen_q) continue;
      const float inv = row_sum[r] > 0.f ? 1.f / row_sum[r] : 0.f;
      std::uint16_t* gO = m_o + (long(b) * m_seqlen_q * m_heads + h) * kHeadDim + row * row_stride;
      for (int n = 0; n < kTilesO; ++n) {
        const int d = n * 8 + (lane % 4) * 2;
        *reinterpret_cast<std::uint32_t*>(gO + d) =
            pack2<Format>(acc_o[n][2 * r] * inv, acc_o[n][2 * r + 1] * inv);
      }
      if (lane % 4 == 0) {
        m_lse[(long(b) * m_heads + h) * m_seqlen_q + row] =
            row_sum[r] > 0.f ? (row_max[r] + log2f(row_sum[r])) * 0.6931471805599453f
                             : -INFINITY;
      }
    }
#else
    (void)member;
#endif
  }

 private:
  const std::uint16_t* m_q;
  const std::uint16_t* m_k;
  const std::uint16_t* m_v;
  std::uint16_t* m_o;
  float* m_lse;
  float m_scale_log2;
  int m_batch, m_seqlen_q, m_heads, m_seqlen_k, m_num_q_blocks;
  AttentionMask m_mask;
};

}  // namespace Impl
}  // namespace kfa

#endif
