#ifndef KFA_DETAIL_BACKEND_CUDA_BACKWARD_PREP_HPP
#define KFA_DETAIL_BACKEND_CUDA_BACKWARD_PREP_HPP

// The O(N) passes around the fused 16-bit backward on CUDA, with 16-byte
// accesses (the portable BackwardPreprocess and convert_dq move 2 or 4
// bytes per thread and access, about 1 TB/s on an H200):
//  - BackwardPrep16Kernel: D = rowsum(dO ∘ O) in fp32, and the same rows of
//    the fp32 dQ accumulator zeroed, in one pass. A thread per 8 values of a
//    row (one 16-byte load of O and of dO, two 16-byte stores of zeros); the
//    head_dim / 8 threads of a row sum D with shuffles.
//  - ConvertDq16Kernel: dq = dq_acc rounded to the 16-bit format, 8 values
//    per thread (two 16-byte loads, one 16-byte store).
// Rows are (b, i, h) in memory order: q-shaped tensors [batch][seqlen][heads]
// [head_dim], contiguous, 16-byte aligned; D [batch][heads][seqlen].

#include <kfa/detail/backend/cuda/primitives/launch.hpp>
#include <kfa/detail/backend/cuda/primitives/mma.hpp>

#include <cstdint>

namespace kfa {
namespace Impl {

#if defined(KOKKOS_ENABLE_CUDA) && defined(__CUDACC__)
/// Two 16-bit values (low first) as floats.
template <class Format>
KOKKOS_FORCEINLINE_FUNCTION void unpack2(std::uint32_t v, float& lo, float& hi) {
#if KFA_CUDA_MMA_DEVICE
  if constexpr (std::is_same<Format, cuda_mma::Bf16>::value) {
    lo = __uint_as_float(v << 16);
    hi = __uint_as_float(v & 0xffff0000u);
  } else {
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&v));
    lo = f.x;
    hi = f.y;
  }
#else
  cuda_mma::unused(v);
  lo = hi = 0.f;
#endif
}

template <class Format, int HeadDim>
class BackwardPrep16Kernel : public FusedTeamLaunch<BackwardPrep16Kernel<Format, HeadDim>> {
 public:
  static constexpr const char* kLabel = "kfa::bwd::preprocess_16";
  static constexpr int kWarps = 8;
  static constexpr int kMinBlocksPerSM = 1;
  static constexpr int kThreadsPerRow = HeadDim / 8;
  static constexpr int kRowsPerTeam = 32 * kWarps / kThreadsPerRow;
  static_assert(HeadDim % 8 == 0 && 32 % kThreadsPerRow == 0,
                "kfa: the CUDA backward preprocess takes head_dim 8 to 256, a multiple of 8 "
                "dividing 256");

  BackwardPrep16Kernel(const std::uint16_t* o, const std::uint16_t* d_o, float* delta,
                       float* dq_acc, int batch, int rows, int heads)
      : m_o(o),
        m_do(d_o),
        m_delta(delta),
        m_dq_acc(dq_acc),
        m_rows(rows),
        m_heads(heads),
        m_total(long(batch) * rows * heads) {}

  int league_size() const { return static_cast<int>((m_total + kRowsPerTeam - 1) / kRowsPerTeam); }
  KOKKOS_INLINE_FUNCTION static constexpr std::size_t scratch_bytes() { return 0; }

  template <class Team>
  KOKKOS_INLINE_FUNCTION void body(const Team& team, void*) const {
#if KFA_CUDA_MMA_DEVICE
    const int tid = cuda_mma::team_thread_id();
    const long row = long(team.league_rank()) * kRowsPerTeam + tid / kThreadsPerRow;
    const int part = tid % kThreadsPerRow;
    float sum = 0.f;
    if (row < m_total) {
      const long at = row * HeadDim + part * 8;
      const uint4 o = *reinterpret_cast<const uint4*>(m_o + at);
      const uint4 g = *reinterpret_cast<const uint4*>(m_do + at);
      const std::uint32_t ov[4] = {o.x, o.y, o.z, o.w}, gv[4] = {g.x, g.y, g.z, g.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        float o0, o1, g0, g1;
        unpack2<Format>(ov[j], o0, o1);
        unpack2<Format>(gv[j], g0, g1);
        sum = fmaf(g0, o0, sum);
        sum = fmaf(g1, o1, sum);
      }
      float4* const acc = reinterpret_cast<float4*>(m_dq_acc + at);
      acc[0] = make_float4(0.f, 0.f, 0.f, 0.f);
      acc[1] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    // Every lane takes part (rows past the end with 0): a row's threads are
    // kThreadsPerRow consecutive lanes of one warp.
#pragma unroll
    for (int m = kThreadsPerRow / 2; m > 0; m /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, m);
    if (row < m_total && part == 0) {
      const int h = static_cast<int>(row % m_heads);
      const long bi = row / m_heads;  // b·rows + i
      const long b = bi / m_rows, i = bi % m_rows;
      m_delta[(b * m_heads + h) * m_rows + i] = sum;
    }
#else
    (void)team;
#endif
  }

 private:
  const std::uint16_t* m_o;
  const std::uint16_t* m_do;
  float* m_delta;
  float* m_dq_acc;
  int m_rows, m_heads;
  long m_total;
};

template <class Format>
class ConvertDq16Kernel : public FusedTeamLaunch<ConvertDq16Kernel<Format>> {
 public:
  static constexpr const char* kLabel = "kfa::bwd::convert_dq_16";
  static constexpr int kWarps = 8;
  static constexpr int kMinBlocksPerSM = 1;
  static constexpr int kValuesPerTeam = 32 * kWarps * 8;

  /// `values` a multiple of 8.
  ConvertDq16Kernel(const float* dq_acc, std::uint16_t* dq, long values)
      : m_dq_acc(dq_acc), m_dq(dq), m_values(values) {}

  int league_size() const {
    return static_cast<int>((m_values + kValuesPerTeam - 1) / kValuesPerTeam);
  }
  KOKKOS_INLINE_FUNCTION static constexpr std::size_t scratch_bytes() { return 0; }

  template <class Team>
  KOKKOS_INLINE_FUNCTION void body(const Team& team, void*) const {
#if KFA_CUDA_MMA_DEVICE
    const long at = (long(team.league_rank()) * 32 * kWarps + threadIdx.y * 32 + threadIdx.x) * 8;
    if (at >= m_values) return;
    const float4 a = reinterpret_cast<const float4*>(m_dq_acc + at)[0];
    const float4 b = reinterpret_cast<const float4*>(m_dq_acc + at)[1];
    *reinterpret_cast<uint4*>(m_dq + at) =
        make_uint4(cuda_mma::pack2<Format>(a.x, a.y), cuda_mma::pack2<Format>(a.z, a.w),
                   cuda_mma::pack2<Format>(b.x, b.y), cuda_mma::pack2<Format>(b.z, b.w));
#else
    (void)team;
#endif
  }

 private:
  const float* m_dq_acc;
  std::uint16_t* m_dq;
  long m_values;
};
#endif

}  // namespace Impl
}  // namespace kfa

#endif
