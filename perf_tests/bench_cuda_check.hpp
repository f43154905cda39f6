#ifndef KFA_BENCH_CUDA_CHECK_HPP
#define KFA_BENCH_CUDA_CHECK_HPP

// The CUDA error check of the CUDA benchmarks (bench_fp64_pipes,
// bench_wgmma_shapes, bench_bwd_trace, bench_device on CUDA): any error ends
// the program with its message and the source line. And their GPU time of
// a call (gpu_time_ms).

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define KFA_CHECK_CUDA(x)                                                                    \
  do {                                                                                       \
    cudaError_t e_ = (x);                                                                    \
    if (e_ != cudaSuccess) {                                                                 \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));       \
      std::exit(1);                                                                          \
    }                                                                                        \
  } while (0)

/// Keeps the GPU busy for `cycles` clock cycles (gpu_time_ms).
__global__ void kfa_bench_spin(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

/// Milliseconds of GPU time of f's work on `stream`: between two events
/// recorded behind a kernel that spins for ~1 ms, so that the GPU is still
/// busy while the host enqueues f's work and host-side costs that the GPU
/// does not wait for are not counted (as in bench_device.py's timings of
/// PyTorch, behind torch.cuda._sleep).
template <class F>
double gpu_time_ms(cudaStream_t stream, F&& f) {
  cudaEvent_t start, stop;
  KFA_CHECK_CUDA(cudaEventCreate(&start));
  KFA_CHECK_CUDA(cudaEventCreate(&stop));
  kfa_bench_spin<<<1, 1, 0, stream>>>(2000000);
  KFA_CHECK_CUDA(cudaGetLastError());
  KFA_CHECK_CUDA(cudaEventRecord(start, stream));
  f();
  KFA_CHECK_CUDA(cudaEventRecord(stop, stream));
  KFA_CHECK_CUDA(cudaEventSynchronize(stop));
  float ms = 0;
  KFA_CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
  KFA_CHECK_CUDA(cudaEventDestroy(start));
  KFA_CHECK_CUDA(cudaEventDestroy(stop));
  return ms;
}

#endif
