// Whether a GPU runs fp64 tensor-core products (DMMA: mma.sync m16n8k8 and
// m16n8k16 f64) and fp64 FMAs (DFMA) at the same time: the throughput of
// each alone and of both interleaved in one warp's instruction stream, at
// 4 and 8 warps per SM. If the two pipes were separate, DMMA + DFMA
// would add up; where they share the fp64 datapath the sum stays at (or
// below) DMMA's alone. CUDA builds only (sm_90+):
//
//   bench_fp64_pipes
//
// (RESULTS.md, "The fp64 datapath": on the H200 they share it.)
#include "bench_cuda_check.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

/// Per iteration: Mma independent fp64 mma.sync (K16: m16n8k16, else
/// m16n8k8) and Fma rounds of 16 independent DFMA per thread. The result
/// is stored only under a condition the inputs never meet, so that nothing
/// is dead code.
template <int Mma, int Fma, bool K16>
__global__ void pipes(double* out, int iters, double seed) {
  double c[8][4], a[8], b[4], f[16];
  for (int i = 0; i < 8; ++i) {
    a[i] = seed + threadIdx.x * 1e-3 + i;
    for (int j = 0; j < 4; ++j) c[i][j] = 0;
  }
  for (int i = 0; i < 4; ++i) b[i] = seed * 0.5 + i;
  for (int i = 0; i < 16; ++i) f[i] = seed + i * 1e-7;
  const double fm = 1.0 + 1e-9 * seed, fa = 1e-12;
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int m = 0; m < Mma; ++m) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      if constexpr (K16)
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f64.f64.f64.f64 {%0,%1,%2,%3}, "
            "{%4,%5,%6,%7,%8,%9,%10,%11}, {%12,%13,%14,%15}, {%0,%1,%2,%3};\n"
            : "+d"(c[m][0]), "+d"(c[m][1]), "+d"(c[m][2]), "+d"(c[m][3])
            : "d"(a[0]), "d"(a[1]), "d"(a[2]), "d"(a[3]), "d"(a[4]), "d"(a[5]), "d"(a[6]),
              "d"(a[7]), "d"(b[0]), "d"(b[1]), "d"(b[2]), "d"(b[3]));
      else
        asm volatile(
            "mma.sync.aligned.m16n8k8.row.col.f64.f64.f64.f64 {%0,%1,%2,%3}, "
            "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
            : "+d"(c[m][0]), "+d"(c[m][1]), "+d"(c[m][2]), "+d"(c[m][3])
            : "d"(a[m % 4]), "d"(a[(m + 1) % 4]), "d"(a[(m + 2) % 4]), "d"(a[(m + 3) % 4]),
              "d"(b[0]), "d"(b[1]));
#endif
    }
#pragma unroll
    for (int r = 0; r < Fma; ++r)
#pragma unroll
      for (int i = 0; i < 16; ++i)
        asm volatile("fma.rn.f64 %0, %0, %1, %2;" : "+d"(f[i]) : "d"(fm), "d"(fa));
  }
  double s = 0;
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 4; ++j) s += c[i][j];
  for (int i = 0; i < 16; ++i) s += f[i];
  if (s == 12345.678) out[threadIdx.x] = s;
}

/// Median of 7 timed launches (one warm-up), one block of `warps` warps per
/// SM, printed as TFLOP/s of each pipe and their sum.
template <int Mma, int Fma, bool K16>
void run(const char* name, int warps, int sms) {
  double* out;
  KFA_CHECK_CUDA(cudaMalloc(&out, 32 * 16 * sizeof(double)));
  const int iters = 4096;
  const dim3 grid(sms), block(32 * warps);
  cudaEvent_t e0, e1;
  KFA_CHECK_CUDA(cudaEventCreate(&e0));
  KFA_CHECK_CUDA(cudaEventCreate(&e1));
  pipes<Mma, Fma, K16><<<grid, block>>>(out, 16, 1.0);
  KFA_CHECK_CUDA(cudaGetLastError());
  KFA_CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<float> ms;
  for (int r = 0; r < 7; ++r) {
    KFA_CHECK_CUDA(cudaEventRecord(e0));
    pipes<Mma, Fma, K16><<<grid, block>>>(out, iters, 1.0);
    KFA_CHECK_CUDA(cudaGetLastError());
    KFA_CHECK_CUDA(cudaEventRecord(e1));
    KFA_CHECK_CUDA(cudaEventSynchronize(e1));
    float t;
    KFA_CHECK_CUDA(cudaEventElapsedTime(&t, e0, e1));
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  const double t = ms[ms.size() / 2];
  const double threads_warps = double(grid.x) * warps * iters;
  const double mma = threads_warps * Mma * (K16 ? 16.0 * 8 * 16 * 2 : 16.0 * 8 * 8 * 2);
  const double fma = threads_warps * Fma * 16 * 32 * 2.0;
  std::printf("| %-22s | %2d | %6.3f | %5.1f | %5.1f | %5.1f |\n", name, warps, t,
              mma / t * 1e-9, fma / t * 1e-9, (mma + fma) / t * 1e-9);
  KFA_CHECK_CUDA(cudaEventDestroy(e0));
  KFA_CHECK_CUDA(cudaEventDestroy(e1));
  KFA_CHECK_CUDA(cudaFree(out));
}

}  // namespace

int main() {
  int device = 0, sms = 0, major = 0;
  KFA_CHECK_CUDA(cudaGetDevice(&device));
  KFA_CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  KFA_CHECK_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  if (major < 9) {
    std::fprintf(stderr, "bench_fp64_pipes: needs an sm_90+ GPU (fp64 m16n8k8)\n");
    return 1;
  }
  std::printf("| instructions | warps/SM | ms | DMMA TFLOP/s | DFMA TFLOP/s | sum |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (int warps : {4, 8}) {
    run<8, 0, false>("m16n8k8", warps, sms);
    run<4, 0, true>("m16n8k16", warps, sms);
    run<0, 2, false>("DFMA", warps, sms);
    run<8, 1, false>("m16n8k8 + 16 DFMA", warps, sms);
    run<8, 2, false>("m16n8k8 + 32 DFMA", warps, sms);
    run<8, 4, false>("m16n8k8 + 64 DFMA", warps, sms);
    run<4, 2, true>("m16n8k16 + 32 DFMA", warps, sms);
  }
  return 0;
}
