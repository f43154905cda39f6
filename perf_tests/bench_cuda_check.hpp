#ifndef KFA_BENCH_CUDA_CHECK_HPP
#define KFA_BENCH_CUDA_CHECK_HPP

// The CUDA error check of the stand-alone CUDA benchmarks (bench_fp64_pipes,
// bench_wgmma_shapes): any error ends the program with its message and the
// source line.

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

#endif
