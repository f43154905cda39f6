// Throughput of the Hopper warpgroup products (wgmma.mma_async m64nNk16,
// bf16 operands, fp32 accumulators) in the shapes the kfa kernels issue,
// with one team of 1-3 warpgroups per SM:
//  - ss: both operands from 128-byte-swizzled scratch, K-major (the
//    backward's Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ at N = 64, the forward's S at
//    N = 128);
//  - rs: A from registers, B N-major from scratch (the backward's dV, dK
//    at N = head_dim, the forward's P·V).
// Each warpgroup issues products of k = 128 (8 instructions into one
// accumulator, one commit group), with `chains` accumulators in flight.
// CUDA builds with KFA_CUDA_SM90A only (sm_90a device code):
//
//   bench_wgmma_shapes [--iters 4096]
//
// Prints TFLOP/s per shape and the fraction of the card's dense bf16 peak
// at the clock it reports (4096 flop per SM per cycle).
#include <kfa/detail/backend/cuda/primitives/wgmma.hpp>

#include "bench_cuda_check.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

using kfa::Impl::cuda_mma::Bf16;

constexpr int kK = 128;                      // reduction length of one product
constexpr int kScratch = 160 * 1024;         // one team per SM

/// `iters` rounds of `Chains` products m64nNk128 per warpgroup; RS: A from
/// registers. The sums are written only where `sink` says so (never), so
/// that nothing is dead code.
/// Warpgroups a team may have: 3 where the accumulators fit in 168
/// registers a thread, else 2.
template <int N, int Chains>
constexpr int max_warpgroups() {
  return N / 2 * Chains <= 64 ? 3 : 2;
}

template <int N, bool RS, int Chains>
__global__ void __launch_bounds__(128 * max_warpgroups<N, Chains>(), 1)
    shapes(int iters, float* sink, int write) {
#if KFA_CUDA_WGMMA_DEVICE
  using namespace kfa::Impl::cuda_mma;
  constexpr int kABytes = 64 * kK * 2;   // A: 64 rows x 128, K-major
  constexpr int kBBytes = 256 * kK * 2;  // B: up to 256 x 128
  extern __shared__ __align__(1024) unsigned char raw[];
  const std::uint32_t base = (smem_address(raw) + 1023) & ~std::uint32_t(1023);
  unsigned char* const tile = raw + (base - smem_address(raw));
  // Small finite bf16 values that vary (the tensor cores' power depends on them).
  for (int i = threadIdx.x; i < (kABytes + kBBytes) / 2; i += blockDim.x) {
    const std::uint32_t x = (i * 2654435761u) >> 20;
    const float f = (float(x & 0xFFF) - 2048.f) / 4096.f;
    reinterpret_cast<std::uint16_t*>(tile)[i] = std::uint16_t(__float_as_uint(f) >> 16);
  }
  __syncthreads();
  const std::uint32_t a_addr = base, b_addr = base + kABytes;
  float acc[Chains][N / 2];
  for (int c = 0; c < Chains; ++c)
    for (int i = 0; i < N / 2; ++i) acc[c][i] = 0.f;
  std::uint32_t a_frag[kK / 16][4];
  for (int k = 0; k < kK / 16; ++k)
    for (int j = 0; j < 4; ++j) {
      const float f = float((threadIdx.x * 7 + k * 3 + j) % 64) / 64.f - 0.5f;
      a_frag[k][j] = (__float_as_uint(f) >> 16) * 0x00010001u;
    }
  const std::uint64_t desc_a = sw128_descriptor(a_addr, 16, 1024);
  const std::uint64_t desc_b_k = sw128_descriptor(b_addr, 16, 1024);
  const std::uint64_t desc_b_n = sw128_descriptor(b_addr, sw128_block_bytes(kK), 1024);
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int c = 0; c < Chains; ++c) {
      fence_operands(acc[c]);
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < kK / 16; ++ks) {
        if constexpr (RS) {
          Wgmma<Bf16, N>::rs(acc[c], a_frag[ks], sw128_descriptor_add(desc_b_n, ks * 2048), 1);
        } else {
          const std::uint32_t off = (ks % 4) * 32;
          Wgmma<Bf16, N>::ss(acc[c],
                             sw128_descriptor_add(desc_a, (ks / 4) * sw128_block_bytes(64) + off),
                             sw128_descriptor_add(desc_b_k, (ks / 4) * sw128_block_bytes(N) + off),
                             1);
        }
      }
      wgmma_commit();
      // Chains products in flight: the next chain's previous one is done.
      wgmma_wait<Chains - 1>();
    }
  }
  wgmma_wait<0>();
  if (write) {
    float s = 0.f;
    for (int c = 0; c < Chains; ++c)
      for (int i = 0; i < N / 2; ++i) s += acc[c][i];
    sink[blockIdx.x * blockDim.x + threadIdx.x] = s;
  }
#else
  (void)iters;
  (void)sink;
  (void)write;
  kfa::Impl::cuda_mma::trap_without_wgmma();
#endif
}

struct Result {
  double tflops, ms;
};

template <int N, bool RS, int Chains>
Result measure(int sms, int warpgroups, int iters, float* sink) {
  if (warpgroups > max_warpgroups<N, Chains>()) return {0, 0};
  auto kernel = shapes<N, RS, Chains>;
  KFA_CHECK_CUDA(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kScratch));
  std::vector<float> ms;
  cudaEvent_t start, stop;
  KFA_CHECK_CUDA(cudaEventCreate(&start));
  KFA_CHECK_CUDA(cudaEventCreate(&stop));
  for (int rep = 0; rep < 6; ++rep) {  // the first is warm-up
    KFA_CHECK_CUDA(cudaEventRecord(start));
    kernel<<<sms, 128 * warpgroups, kScratch>>>(iters, sink, 0);
    KFA_CHECK_CUDA(cudaGetLastError());
    KFA_CHECK_CUDA(cudaEventRecord(stop));
    KFA_CHECK_CUDA(cudaEventSynchronize(stop));
    float t = 0;
    KFA_CHECK_CUDA(cudaEventElapsedTime(&t, start, stop));
    if (rep > 0) ms.push_back(t);
  }
  KFA_CHECK_CUDA(cudaEventDestroy(start));
  KFA_CHECK_CUDA(cudaEventDestroy(stop));
  std::sort(ms.begin(), ms.end());
  const double t = ms[ms.size() / 2];
  const double flop = 2.0 * 64 * N * kK * Chains * double(iters) * warpgroups * sms;
  return {flop / (t * 1e-3) / 1e12, t};
}

}  // namespace

int main(int argc, char* argv[]) {
  int iters = 4096;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    if (s == "--iters" && i + 1 < argc) iters = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: bench_wgmma_shapes [--iters N]\n");
      return 1;
    }
  }
  int dev = 0, sms = 0, clock_khz = 0, major = 0;
  KFA_CHECK_CUDA(cudaGetDevice(&dev));
  KFA_CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  KFA_CHECK_CUDA(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, dev));
  KFA_CHECK_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  if (major != 9) {
    std::fprintf(stderr, "bench_wgmma_shapes: needs a Hopper GPU (sm_90a code)\n");
    return 1;
  }
  float* sink = nullptr;
  KFA_CHECK_CUDA(cudaMalloc(&sink, sizeof(float) * sms * 384));
  const double peak = 4096.0 * sms * clock_khz * 1e3 / 1e12;
  std::printf("# %d SMs, %.0f MHz: dense bf16 peak %.0f TFLOP/s; products m64nNk128, "
              "%d rounds a warpgroup, median of 5\n",
              sms, clock_khz / 1e3, peak, iters);
  std::printf("%-28s %12s %12s %12s\n", "shape", "1 warpgroup", "2 warpgroups", "3 warpgroups");
  auto row = [&](const char* name, auto fn) {
    std::printf("%-28s", name);
    for (int w = 1; w <= 3; ++w) {
      const Result r = fn(w);
      if (r.ms > 0) std::printf(" %7.1f %.2f", r.tflops, r.tflops / peak);
      else std::printf(" %12s", "-");
    }
    std::printf("\n");
    std::fflush(stdout);
  };
  row("ss n64, 1 in flight", [&](int w) { return measure<64, false, 1>(sms, w, iters, sink); });
  row("ss n64, 2 in flight", [&](int w) { return measure<64, false, 2>(sms, w, iters, sink); });
  row("ss n128, 1 in flight", [&](int w) { return measure<128, false, 1>(sms, w, iters, sink); });
  row("ss n128, 2 in flight", [&](int w) { return measure<128, false, 2>(sms, w, iters, sink); });
  row("rs n64, 1 in flight", [&](int w) { return measure<64, true, 1>(sms, w, iters, sink); });
  row("rs n64, 2 in flight", [&](int w) { return measure<64, true, 2>(sms, w, iters, sink); });
  row("rs n128, 1 in flight", [&](int w) { return measure<128, true, 1>(sms, w, iters, sink); });
  row("rs n128, 2 in flight", [&](int w) { return measure<128, true, 2>(sms, w, iters, sink); });
  row("rs n256, 1 in flight", [&](int w) { return measure<256, true, 1>(sms, w, iters, sink); });
  KFA_CHECK_CUDA(cudaFree(sink));
  return 0;
}
