#ifndef KFA_DETAIL_BACKEND_CUDA_PRIMITIVES_FMA_TILES_HPP
#define KFA_DETAIL_BACKEND_CUDA_PRIMITIVES_FMA_TILES_HPP

// The score products of the exact fp32 kernels
// (kfa/detail/backend/cuda/forward/exact_fp32.hpp: S = Q·Kᵀ;
// kfa/detail/backend/cuda/backward/exact_fp32.hpp: Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ),
// two ways:
//  - dmma_row_products (sm_90+, the default there): on the fp64 tensor
//    cores, exact products summed in fp64, while the kernels' other
//    products run on the FMA pipe;
//  - exact_fp32_row_products: fp32 FMAs tiled in registers, laid out for the
//    cost of shared-memory loads, which bound them: on the H200 a 128-bit
//    load costs 2 wavefronts when each quarter-warp reads one or two
//    16-byte chunks and 4 otherwise (however many lanes share a chunk), and
//    an SM serves one wavefront per cycle against 4 warp FMAs.
// RowProducts<Dmma, ...> says where either leaves a lane's sums.

#include <kfa/detail/backend/cuda/primitives/mma.hpp>

namespace kfa {
namespace Impl {

/// Whether the library's exact fp32 kernels take their score products on
/// the fp64 tensor cores (fp64 m16n8k8: sm_90+ builds).
constexpr bool exact_fp32_dmma_scores() { return KFA_CUDA_FP64_M16 != 0; }

namespace cuda_mma {

#if KFA_CUDA_MMA_DEVICE
/// out[i][j] = Σ_d a[16·warp + 4·g + i][d] · b[tx + 8·j][d] over HeadDim,
/// for lane (g, tx) = (lane / 8, lane % 8) and rows of Pitch floats in
/// scratch. Each lane sums 8 rows of a (16·warp + 8·(g / 2)..) over the
/// float4 chunks of parity g % 2 only: quarters g and g ^ 1 read the same
/// rows at neighbouring chunks (one address each, 2 wavefronts for the
/// pair), and per step 8 + Cols loads, 16 + 4·Cols wavefronts a warp, feed
/// 32·Cols FMAs a lane (4 rows over every chunk: 8 + 4·Cols for 16·Cols).
/// Then it keeps 4 of those rows (parity 0 the first, 1 the last) and
/// trades the other 4 with lane ^ 8, which summed the other chunks.
template <int HeadDim, int Pitch, int Cols>
KOKKOS_FORCEINLINE_FUNCTION void exact_fp32_row_products(float (&out)[4][Cols], const float* a,
                                                   const float* b, int warp, int lane) {
  const int g = lane / 8, tx = lane % 8;
  const int parity = g & 1, a_row = 16 * warp + 8 * (g >> 1);
  float part[8][Cols];
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int j = 0; j < Cols; ++j) part[i][j] = 0.f;
#pragma unroll 2
  for (int d = 4 * parity; d < HeadDim; d += 8) {
    float4 ar[8], br[Cols];
#pragma unroll
    for (int i = 0; i < 8; ++i)
      ar[i] = *reinterpret_cast<const float4*>(a + (a_row + i) * Pitch + d);
#pragma unroll
    for (int j = 0; j < Cols; ++j)
      br[j] = *reinterpret_cast<const float4*>(b + (tx + 8 * j) * Pitch + d);
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int j = 0; j < Cols; ++j) {
        part[i][j] = fmaf(ar[i].x, br[j].x, part[i][j]);
        part[i][j] = fmaf(ar[i].y, br[j].y, part[i][j]);
        part[i][j] = fmaf(ar[i].z, br[j].z, part[i][j]);
        part[i][j] = fmaf(ar[i].w, br[j].w, part[i][j]);
      }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < Cols; ++j) {
      const float keep = parity ? part[i + 4][j] : part[i][j];
      const float send = parity ? part[i][j] : part[i + 4][j];
      out[i][j] = keep + shfl_xor(send, 8);
    }
}

/// out[i][2·n + c] = Σ_d a[16·warp + g + 8·i][d] · b[8·n + 2·t + c][d] over
/// HeadDim, for lane (g, t) = (lane / 4, lane % 4): the same products as
/// exact_fp32_row_products in the layout of an m16n8 accumulator, taken on the
/// fp64 tensor cores (mma m16n8k8 f64, sm_90): each fp32 operand converted
/// to fp64 exactly, every product exact, the sums in fp64, the result
/// rounded once to fp32; no precision is traded for the speed. The FMA
/// pipe stays free for the kernel's other products, which the fp64 tensor
/// pipe runs beside (the H200 has the same rate on both).
/// Lane (g, t) holds the head-dim pair 2t, 2t + 1 of every 8 as the
/// fragments' k = t and t + 4 (A and B agree, so the sum is unchanged):
/// one 8-byte load per row, and with Pitch % 32 == 8 the 8 rows a warp
/// reads fall on distinct banks in each half-warp.
template <int HeadDim, int Pitch, int NTiles>
KOKKOS_FORCEINLINE_FUNCTION void dmma_row_products(float (&out)[2][2 * NTiles], const float* a,
                                                   const float* b, int warp, int lane) {
  static_assert(Pitch % 32 == 8, "kfa: dmma_row_products reads rows 8 banks apart");
  const int g = lane / 4, t = lane % 4;
  const float* pa = a + (16 * warp + g) * Pitch + 2 * t;
  const float* pb = b + g * Pitch + 2 * t;
  double acc[NTiles][4];
#pragma unroll
  for (int n = 0; n < NTiles; ++n)
#pragma unroll
    for (int c = 0; c < 4; ++c) acc[n][c] = 0.0;
#pragma unroll
  for (int d = 0; d < HeadDim; d += 8) {
    const float2 lo = *reinterpret_cast<const float2*>(pa + d);
    const float2 hi = *reinterpret_cast<const float2*>(pa + 8 * Pitch + d);
    const double fa[4] = {lo.x, hi.x, lo.y, hi.y};
#pragma unroll
    for (int n = 0; n < NTiles; ++n) {
      const float2 fb = *reinterpret_cast<const float2*>(pb + 8 * n * Pitch + d);
      mma_1688_f64(acc[n], fa, fb.x, fb.y);
    }
  }
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int n = 0; n < NTiles; ++n) {
      out[i][2 * n] = static_cast<float>(acc[n][2 * i]);
      out[i][2 * n + 1] = static_cast<float>(acc[n][2 * i + 1]);
    }
}

/// acc[n] += a·b over K, for one 16-row m-tile of a ([row][k], rows PitchA
/// floats apart) and NTiles 8-column n-tiles of b ([k][column], rows PitchB
/// floats apart, tile n at columns 8·n..), fp32 in scratch, on the fp64
/// tensor cores: exact products, fp64 sums. Scalar loads, each with no bank
/// conflict: a's rows g and g + 8 (PitchA = 4 mod 8) at k + t, b's rows
/// k + t (PitchB = 8 or 24 mod 32) at column g. Per 8 values of k a lane
/// loads and converts 4 values of a and 2 of b per n-tile.
template <int K, int PitchA, int PitchB, int NTiles>
KOKKOS_FORCEINLINE_FUNCTION void dmma_tile_products(double (&acc)[NTiles][4], const float* a,
                                                    const float* b, int lane) {
  static_assert(PitchA % 8 == 4, "kfa: dmma_tile_products reads a's rows 4 banks apart");
  static_assert(PitchB % 32 == 8 || PitchB % 32 == 24,
                "kfa: dmma_tile_products reads b's rows 8 banks apart");
  const int g = lane / 4, t = lane % 4;
  const float* pa = a + g * PitchA + t;
  const float* pb = b + t * PitchB + g;
#pragma unroll
  for (int k = 0; k < K; k += 8) {
    const double fa[4] = {pa[k], pa[8 * PitchA + k], pa[k + 4], pa[8 * PitchA + k + 4]};
#pragma unroll
    for (int n = 0; n < NTiles; ++n)
      mma_1688_f64(acc[n], fa, pb[k * PitchB + 8 * n], pb[(k + 4) * PitchB + 8 * n]);
  }
}
#endif

/// The 16 rows of a warp (16·warp.., of the a tile) against Cols rows of
/// the b tile, by dmma_row_products (Dmma) or exact_fp32_row_products: lane's
/// out[i][j] is row(i) against col(j), and kLanesPerRow lanes (adjacent,
/// lane ^ 1, ^ 2, ...) hold the other columns of its rows. kPad: floats
/// after HeadDim per row of both tiles, for the loads' banks.
template <bool Dmma, int HeadDim, int Cols>
struct RowProducts {
  static constexpr int kRows = Dmma ? 2 : 4;
  static constexpr int kCols = Dmma ? Cols / 4 : Cols / 8;
  static constexpr int kLanesPerRow = Dmma ? 4 : 8;
  static constexpr int kPad = Dmma ? 8 : 4;
  static_assert(Cols % 8 == 0, "kfa: the score products take multiples of 8 columns");
  KOKKOS_FORCEINLINE_FUNCTION static int row(int warp, int lane, int i) {
    return Dmma ? 16 * warp + lane / 4 + 8 * i : 16 * warp + 4 * (lane / 8) + i;
  }
  KOKKOS_FORCEINLINE_FUNCTION static int col(int lane, int j) {
    return Dmma ? 8 * (j / 2) + 2 * (lane % 4) + j % 2 : lane % 8 + 8 * j;
  }
#if KFA_CUDA_MMA_DEVICE
  KOKKOS_FORCEINLINE_FUNCTION static void products(float (&out)[kRows][kCols], const float* a,
                                                   const float* b, int warp, int lane) {
    constexpr int kPitch = HeadDim + kPad;
    if constexpr (Dmma)
      dmma_row_products<HeadDim, kPitch, Cols / 8>(out, a, b, warp, lane);
    else
      exact_fp32_row_products<HeadDim, kPitch>(out, a, b, warp, lane);
  }
#endif
};

}  // namespace cuda_mma
}  // namespace Impl
}  // namespace kfa

#endif
