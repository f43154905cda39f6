#ifndef KFA_CUDA_MMA_HPP
#define KFA_CUDA_MMA_HPP

// Tensor-core primitives for the CUDA backend (sm_80+): asynchronous global
// to shared copies (cp.async), shared-memory matrix loads (ldmatrix) and the
// m16n8k16 matrix product with fp32 accumulation (mma.sync), for bf16 and
// fp16 operands. Device-only; every function is called from team kernels
// whose blocks are (32 lanes) x (warps) threads.
//
// Fragment layouts of mma.m16n8k16 (lane = threadIdx.x, g = lane / 4,
// t = lane % 4):
//   A 16x16 row-major, 4 regs of 2 halves: (g, 2t..), (g+8, 2t..),
//     (g, 2t+8..), (g+8, 2t+8..)
//   B 16x8 "col": 2 regs: (k = 2t.., n = g), (k = 2t+8.., n = g)
//   C 16x8 fp32: c0, c1 at (g, 2t..), c2, c3 at (g+8, 2t..)

#include <Kokkos_Core.hpp>

#ifdef KOKKOS_ENABLE_CUDA
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

#include <cstdint>
#include <type_traits>

namespace kfa {
namespace Impl {
namespace cuda_mma {

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 800)
#define KFA_CUDA_MMA_DEVICE 1
#else
#define KFA_CUDA_MMA_DEVICE 0
#endif

KOKKOS_FORCEINLINE_FUNCTION std::uint32_t smem_address(const void* ptr) {
#if KFA_CUDA_MMA_DEVICE
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(ptr));
#else
  (void)ptr;
  return 0;
#endif
}

/// 16-byte asynchronous copy; src_bytes = 0 fills the destination with zeros
/// (rows past the end of the sequence).
KOKKOS_FORCEINLINE_FUNCTION void cp_async_16(void* dst, const void* src, int src_bytes) {
#if KFA_CUDA_MMA_DEVICE
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(dst)),
               "l"(src), "r"(src_bytes));
#else
  (void)dst;
  (void)src;
  (void)src_bytes;
#endif
}

KOKKOS_FORCEINLINE_FUNCTION void cp_async_commit() {
#if KFA_CUDA_MMA_DEVICE
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}

/// Waits until at most N committed groups of this thread are in flight.
template <int N>
KOKKOS_FORCEINLINE_FUNCTION void cp_async_wait() {
#if KFA_CUDA_MMA_DEVICE
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

KOKKOS_FORCEINLINE_FUNCTION void ldmatrix_x4(std::uint32_t (&r)[4], const void* ptr) {
#if KFA_CUDA_MMA_DEVICE
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(ptr)));
#else
  (void)ptr;
  r[0] = r[1] = r[2] = r[3] = 0;
#endif
}

KOKKOS_FORCEINLINE_FUNCTION void ldmatrix_x4_trans(std::uint32_t (&r)[4], const void* ptr) {
#if KFA_CUDA_MMA_DEVICE
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(ptr)));
#else
  (void)ptr;
  r[0] = r[1] = r[2] = r[3] = 0;
#endif
}

/// Operand tags: which 16-bit format the tensor cores read.
struct Bf16 {};
struct Fp16 {};

/// c += a·b for one m16n8k16 tile.
template <class Format>
KOKKOS_FORCEINLINE_FUNCTION void mma_16816(float (&c)[4], const std::uint32_t (&a)[4],
                                           std::uint32_t b0, std::uint32_t b1) {
#if KFA_CUDA_MMA_DEVICE
  if constexpr (std::is_same<Format, Bf16>::value) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
#else
  (void)c;
  (void)a;
  (void)b0;
  (void)b1;
#endif
}

/// Two floats rounded to the operand format, packed low-first.
template <class Format>
KOKKOS_FORCEINLINE_FUNCTION std::uint32_t pack2(float lo, float hi) {
#if KFA_CUDA_MMA_DEVICE
  if constexpr (std::is_same<Format, Bf16>::value) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<std::uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<std::uint32_t*>(&v);
  }
#else
  (void)lo;
  (void)hi;
  return 0;
#endif
}

KOKKOS_FORCEINLINE_FUNCTION float exp2_approx(float x) {
#if KFA_CUDA_MMA_DEVICE
  return exp2f(x);
#else
  return x;
#endif
}

KOKKOS_FORCEINLINE_FUNCTION float shfl_xor(float v, int mask) {
#if KFA_CUDA_MMA_DEVICE
  return __shfl_xor_sync(0xffffffffu, v, mask);
#else
  (void)mask;
  return v;
#endif
}

KOKKOS_FORCEINLINE_FUNCTION void block_sync() {
#if KFA_CUDA_MMA_DEVICE
  __syncthreads();
#endif
}

}  // namespace cuda_mma
}  // namespace Impl
}  // namespace kfa

#endif
