#ifndef KFA_CUDA_SIMT_HPP
#define KFA_CUDA_SIMT_HPP

// The register-tiled product shared by the exact fp32 kernels
// (kfa_cuda_fwd_simt.hpp, kfa_cuda_bwd_simt.hpp), laid out for the cost of
// shared-memory loads, which bounded them (RESULTS v29): on the H200 a
// 128-bit load costs 2 wavefronts when each quarter-warp reads one or two
// 16-byte chunks and 4 otherwise (however many lanes share a chunk), and
// an SM serves one wavefront per cycle against 4 warp FMAs.

#include <impl/backend/kfa_cuda_mma.hpp>

namespace kfa {
namespace Impl {
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
KOKKOS_FORCEINLINE_FUNCTION void simt_row_products(float (&out)[4][Cols], const float* a,
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
#endif

}  // namespace cuda_mma
}  // namespace Impl
}  // namespace kfa

#endif
