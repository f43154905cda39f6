#ifndef KFA_DETAIL_BACKEND_CUDA_PRIMITIVES_MMA_HPP
#define KFA_DETAIL_BACKEND_CUDA_PRIMITIVES_MMA_HPP

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

#include <cstddef>
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

// fp64 m16n8k8 (sm_90+): known to host code through the Kokkos build's
// architecture, so that the dispatch never picks it for older GPUs.
#if defined(KOKKOS_ARCH_HOPPER) || defined(KOKKOS_ARCH_BLACKWELL)
#define KFA_CUDA_FP64_M16 1
#else
#define KFA_CUDA_FP64_M16 0
#endif

// The calling thread's lane in its warp and warp in its team (teams are 32
// lanes in x, their warps in y).
#if KFA_CUDA_MMA_DEVICE
KOKKOS_FORCEINLINE_FUNCTION int lane_id() { return static_cast<int>(threadIdx.x); }
KOKKOS_FORCEINLINE_FUNCTION int warp_id() { return static_cast<int>(threadIdx.y); }
#else
KOKKOS_FORCEINLINE_FUNCTION int lane_id() { return 0; }
KOKKOS_FORCEINLINE_FUNCTION int warp_id() { return 0; }
#endif

/// The calling thread's index in its team: warp_id() · 32 + lane_id().
KOKKOS_FORCEINLINE_FUNCTION int team_thread_id() { return warp_id() * 32 + lane_id(); }

/// Marks the arguments of a device-only wrapper as used where the wrapper
/// compiles to nothing (the host pass, older architectures).
template <class... Args>
KOKKOS_FORCEINLINE_FUNCTION void unused(const Args&...) {}

KOKKOS_FORCEINLINE_FUNCTION std::uint32_t smem_address(const void* ptr) {
#if KFA_CUDA_MMA_DEVICE
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(ptr));
#else
  unused(ptr);
  return 0;
#endif
}

/// 16-byte asynchronous copy to the shared-memory address `dst`
/// (smem_address); src_bytes = 0 fills the destination with zeros (rows
/// past the end of the sequence).
KOKKOS_FORCEINLINE_FUNCTION void cp_async_16_shared(std::uint32_t dst, const void* src,
                                                    int src_bytes) {
#if KFA_CUDA_MMA_DEVICE
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
#else
  unused(dst, src, src_bytes);
#endif
}

/// The same to a shared-memory pointer.
KOKKOS_FORCEINLINE_FUNCTION void cp_async_16(void* dst, const void* src, int src_bytes) {
  cp_async_16_shared(smem_address(dst), src, src_bytes);
}

/// Bytes-byte asynchronous copy (4 or 8: lse and D values); src_bytes = 0
/// writes zeros.
template <int Bytes>
KOKKOS_FORCEINLINE_FUNCTION void cp_async_small(void* dst, const void* src, int src_bytes) {
  static_assert(Bytes == 4 || Bytes == 8, "kfa: cp.async.ca copies 4 or 8 bytes here");
#if KFA_CUDA_MMA_DEVICE
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(smem_address(dst)),
               "l"(src), "n"(Bytes), "r"(src_bytes));
#else
  unused(dst, src, src_bytes);
#endif
}

/// `raw` rounded up to 16 bytes, as a T*. The offset is added to the
/// pointer (not computed through an integer round trip), so that the
/// compiler still sees a pointer into shared memory and emits LDS/STS
/// instead of generic loads and stores with 64-bit addresses.
template <class T>
KOKKOS_FORCEINLINE_FUNCTION T* aligned_scratch(void* raw) {
  char* const p = static_cast<char*>(raw);
  return reinterpret_cast<T*>(p + ((16 - (reinterpret_cast<std::uintptr_t>(p) & 15)) & 15));
}

/// Team scratch for `bytes` of tiles carved from aligned_scratch: the tiles
/// and the up to 15 bytes that aligning `raw` skips.
KOKKOS_INLINE_FUNCTION constexpr std::size_t aligned_scratch_bytes(std::size_t bytes) {
  return bytes + 16;
}

/// f(std::true_type()) for a tile with masked elements, f(std::false_type())
/// for one without: the backwards' P (and dS) code in two copies, the
/// unmasked one free of the per-element mask. Left to ptxas, that choice
/// comes and goes with the size of the kernels' parameters.
template <class F>
KOKKOS_FORCEINLINE_FUNCTION void unswitch_mask(bool needs_mask, F&& f) {
  if (needs_mask)
    f(std::true_type());
  else
    f(std::false_type());
}

/// f(a, b) with both flags as compile-time constants (std::true_type or
/// std::false_type): a loop in four copies, each free of two run-time tests.
template <class F>
KOKKOS_FORCEINLINE_FUNCTION void unswitch2(bool a, bool b, F&& f) {
  if (a) {
    if (b)
      f(std::true_type(), std::true_type());
    else
      f(std::true_type(), std::false_type());
  } else {
    if (b)
      f(std::false_type(), std::true_type());
    else
      f(std::false_type(), std::false_type());
  }
}

/// Barrier `id` (1-15; 0 is the team barrier's) for the `threads` threads,
/// whole warps, that call it: a barrier for some warps of a team. Also
/// orders their scratch accesses, as the team barrier does.
KOKKOS_FORCEINLINE_FUNCTION void named_barrier(int id, int threads) {
#if KFA_CUDA_MMA_DEVICE
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
#else
  unused(id, threads);
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

// Bulk copies (sm_90+): the engine behind TMA, here its 1-D form, which
// needs no tensor map. KFA_CUDA_BULK_DEVICE says whether the device code
// being compiled has them; the functions below are no-ops elsewhere.
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
#define KFA_CUDA_BULK_DEVICE 1
#else
#define KFA_CUDA_BULK_DEVICE 0
#endif

/// Makes this thread's shared-memory writes (cp.async, stores) visible to
/// the async proxy (wgmma operands, bulk copies).
KOKKOS_FORCEINLINE_FUNCTION void fence_proxy_async() {
#if KFA_CUDA_BULK_DEVICE
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

/// Adds `bytes` (a multiple of 16) of fp32 values at shared address `src`
/// to global `dst` (both 16-byte aligned) by the bulk copy engine: one
/// element-wise reduction in L2 instead of a red.global per value.
/// Asynchronous: part of this thread's bulk group (bulk_commit,
/// bulk_wait_read, bulk_wait).
KOKKOS_FORCEINLINE_FUNCTION void bulk_reduce_add_f32(float* dst, std::uint32_t src,
                                                     std::uint32_t bytes) {
#if KFA_CUDA_BULK_DEVICE
  asm volatile(
      "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst),
      "r"(src), "r"(bytes)
      : "memory");
#else
  unused(dst, src, bytes);
#endif
}
KOKKOS_FORCEINLINE_FUNCTION void bulk_commit() {
#if KFA_CUDA_BULK_DEVICE
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#endif
}
/// Waits until this thread's bulk groups have read their shared sources.
KOKKOS_FORCEINLINE_FUNCTION void bulk_wait_read() {
#if KFA_CUDA_BULK_DEVICE
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
#endif
}
/// Waits until this thread's bulk groups are complete.
KOKKOS_FORCEINLINE_FUNCTION void bulk_wait() {
#if KFA_CUDA_BULK_DEVICE
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
#endif
}

/// Column at which a tile stored with the 64-bit atoms' swizzle keeps
/// element (row, col): col ^ 4 in rows 4-7 of every 8. With rows of
/// 16·k + 4 doubles (an 8-bank step per row) both the fragments that read 4
/// consecutive rows (ldmatrix-like: load_a, load_b_t) and those that read
/// every other row (load_b_perm, load_a_t_perm) are conflict-free; without
/// it the second kind takes two wavefronts per half-warp.
template <bool Swizzle>
KOKKOS_FORCEINLINE_FUNCTION constexpr int swizzle_col(int row, int col) {
  return Swizzle ? col ^ (row & 4) : col;
}

/// `rows` rows of HeadDim values of a [b][i][h][d] tensor (rows `row_stride`
/// elements apart, from row `first_row` of `src`) into a scratch tile of
/// Pitch elements per row (columns swizzled by swizzle_col<Swizzle>), by
/// 16-byte asynchronous copies spread over `threads` threads from `tid`;
/// rows at or past `rows_total` are zero-filled.
/// The tile loads of every tensor-core and register-tiled kernel. The
/// kernels pass constant `rows` and `threads`: when a row's chunks divide
/// the threads and the threads the tile's chunks, a thread's column, first
/// row and both steps are fixed, so the (inlined, unrolled) load is an add
/// and a cp.async per chunk, with a bounds check per chunk only when the
/// tile crosses `rows_total` (against ~15 instructions of index arithmetic
/// per chunk in the general loop).
template <int HeadDim, int Pitch, bool Swizzle = false, class T>
KOKKOS_FORCEINLINE_FUNCTION void load_rows_async(T* dst, const T* src, long row_stride,
                                                 int first_row, int rows, int rows_total,
                                                 int tid, int threads) {
  constexpr int kPer = 16 / int(sizeof(T));
  constexpr int kChunks = HeadDim / kPer;
  if (threads % kChunks == 0 && (rows * kChunks) % threads == 0) {
    const int step = threads / kChunks, per_thread = rows * kChunks / threads;
    const int row = tid / kChunks, col = (tid % kChunks) * kPer;
    const T* from = src + long(first_row + row) * row_stride + col;
    T* to = dst + row * Pitch;
    auto at = [&](int k) {
      return to + k * step * Pitch + swizzle_col<Swizzle>(row + k * step, col);
    };
    if (first_row + rows <= rows_total) {
#pragma unroll
      for (int k = 0; k < per_thread; ++k)
        cp_async_16(at(k), from + k * step * row_stride, 16);
    } else {
#pragma unroll
      for (int k = 0; k < per_thread; ++k) {
        const bool ok = first_row + row + k * step < rows_total;
        cp_async_16(at(k), ok ? from + k * step * row_stride : src, ok ? 16 : 0);
      }
    }
    return;
  }
  for (int c = tid; c < rows * kChunks; c += threads) {
    const int r = c / kChunks, cc = c % kChunks;
    const bool ok = first_row + r < rows_total;
    const T* from = src + (ok ? long(first_row + r) * row_stride : 0) + cc * kPer;
    cp_async_16(dst + r * Pitch + swizzle_col<Swizzle>(r, cc * kPer), from, ok ? 16 : 0);
  }
}

/// A backward query block into a stage, as one commit group: BlockM rows of
/// Q at sQ and of dO right after them, lse at s_stats and D after it. lse
/// and D are copied raw and asynchronously too (a plain load would stall
/// the loading warps, and the team at the next barrier). Rows past
/// `seqlen_q` read 0: their Q and dO rows are zero, so S = 0, dP = D = 0
/// and nothing reaches dK or dV; their dQ is not stored. A row that saw no
/// key (lse = -inf) is masked in every tile it is in.
template <int HeadDim, int Pitch, int BlockM, bool Swizzle = false, class T, class S>
KOKKOS_FORCEINLINE_FUNCTION void load_query_block_async(T* sQ, S* s_stats, const T* gQ,
                                                        const T* gdO, const S* g_lse,
                                                        const S* g_delta, long row_stride,
                                                        int row_begin, int seqlen_q, int tid,
                                                        int threads) {
  load_rows_async<HeadDim, Pitch, Swizzle>(sQ, gQ, row_stride, row_begin, BlockM, seqlen_q, tid,
                                           threads);
  load_rows_async<HeadDim, Pitch, Swizzle>(sQ + BlockM * Pitch, gdO, row_stride, row_begin,
                                           BlockM, seqlen_q, tid, threads);
  if (tid < BlockM) {
    const int row = row_begin + tid;
    const bool ok = row < seqlen_q;
    const int bytes = ok ? int(sizeof(S)) : 0;
    cp_async_small<sizeof(S)>(s_stats + tid, g_lse + (ok ? row : 0), bytes);
    cp_async_small<sizeof(S)>(s_stats + BlockM + tid, g_delta + (ok ? row : 0), bytes);
  }
  cp_async_commit();
}

/// Four 8x8 16-bit matrices from scratch, one register each (Trans: each
/// transposed).
template <bool Trans = false>
KOKKOS_FORCEINLINE_FUNCTION void ldmatrix_x4(std::uint32_t (&r)[4], const void* ptr) {
#if KFA_CUDA_MMA_DEVICE
#define KFA_CUDA_LDMATRIX_X4(Op)                                                 \
  asm volatile("ldmatrix.sync.aligned.m8n8.x4" Op ".shared.b16 {%0, %1, %2, %3}, [%4];\n" \
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])              \
               : "r"(smem_address(ptr)))
  if constexpr (Trans) {
    KFA_CUDA_LDMATRIX_X4(".trans");
  } else {
    KFA_CUDA_LDMATRIX_X4("");
  }
#undef KFA_CUDA_LDMATRIX_X4
#else
  unused(ptr);
  r[0] = r[1] = r[2] = r[3] = 0;
#endif
}

KOKKOS_FORCEINLINE_FUNCTION void ldmatrix_x4_trans(std::uint32_t (&r)[4], const void* ptr) {
  ldmatrix_x4<true>(r, ptr);
}

/// Operand tags: which 16-bit format the tensor cores read.
struct Bf16 {};
struct Fp16 {};

// One m16n8 mma.sync with four accumulators, four A registers and two B
// registers, c += a·b: Op names the shape and types, Acc and Operand are the
// asm constraints of the accumulators and the operands.
#define KFA_CUDA_MMA_M16N8(Op, Acc, Operand)                                          \
  asm volatile("mma.sync.aligned." Op " {%0, %1, %2, %3}, "                          \
               "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"                     \
               : "+" Acc(c[0]), "+" Acc(c[1]), "+" Acc(c[2]), "+" Acc(c[3])          \
               : Operand(a[0]), Operand(a[1]), Operand(a[2]), Operand(a[3]), Operand(b0), \
                 Operand(b1))

/// c += a·b for one m16n8k16 tile.
template <class Format>
KOKKOS_FORCEINLINE_FUNCTION void mma_16816(float (&c)[4], const std::uint32_t (&a)[4],
                                           std::uint32_t b0, std::uint32_t b1) {
#if KFA_CUDA_MMA_DEVICE
  if constexpr (std::is_same<Format, Bf16>::value) {
    KFA_CUDA_MMA_M16N8("m16n8k16.row.col.f32.bf16.bf16.f32", "f", "r");
  } else {
    KFA_CUDA_MMA_M16N8("m16n8k16.row.col.f32.f16.f16.f32", "f", "r");
  }
#else
  unused(c, a, b0, b1);
#endif
}

/// c0 += a·b and c1 += a·b for the two n-tiles of B that one ldmatrix_x4
/// loads: b[0], b[1] the first, b[2], b[3] the second.
template <class Format>
KOKKOS_FORCEINLINE_FUNCTION void mma_16816_x2(float (&c0)[4], float (&c1)[4],
                                              const std::uint32_t (&a)[4],
                                              const std::uint32_t (&b)[4]) {
  mma_16816<Format>(c0, a, b[0], b[1]);
  mma_16816<Format>(c1, a, b[2], b[3]);
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
  unused(lo, hi);
  return 0;
#endif
}

/// c += a·b for one m8n8k4 fp64 tile (DMMA). Fragments (g = lane / 4,
/// t = lane % 4): A (g, t), B (k = t, n = g), C c0, c1 at (g, 2t..).
KOKKOS_FORCEINLINE_FUNCTION void mma_884_f64(double (&c)[2], double a, double b) {
#if KFA_CUDA_MMA_DEVICE
  asm volatile(
      "mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0, %1}, {%2}, {%3}, {%0, %1};\n"
      : "+d"(c[0]), "+d"(c[1])
      : "d"(a), "d"(b));
#else
  unused(c, a, b);
#endif
}

/// c += a·b for one m16n8k8 fp64 tile (sm_90: twice the DMMA rate of
/// m8n8k4 on Hopper). Fragments as for tf32 m16n8k8: A (g, t), (g+8, t),
/// (g, t+4), (g+8, t+4); B (k = t, n = g), (k = t+4, n = g); C c0, c1 at
/// (g, 2t..), c2, c3 at (g+8, 2t..).
KOKKOS_FORCEINLINE_FUNCTION void mma_1688_f64(double (&c)[4], const double (&a)[4], double b0,
                                              double b1) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  KFA_CUDA_MMA_M16N8("m16n8k8.row.col.f64.f64.f64.f64", "d", "d");
#elif defined(__CUDA_ARCH__)
  // Never reached: the dispatch picks this atom only for sm_90+ builds
  // (KFA_CUDA_FP64_M16); a call on an older device stops the kernel.
  unused(c, a, b0, b1);
  __trap();
#else
  unused(c, a, b0, b1);
#endif
}

/// c += a·b for one m16n8k8 tile with tf32 operands and fp32 accumulation.
/// Fragments: A (g, t), (g+8, t), (g, t+4), (g+8, t+4); B (k = t, n = g),
/// (k = t+4, n = g); C as for m16n8k16.
KOKKOS_FORCEINLINE_FUNCTION void mma_1688_tf32(float (&c)[4], const std::uint32_t (&a)[4],
                                               std::uint32_t b0, std::uint32_t b1) {
#if KFA_CUDA_MMA_DEVICE
  KFA_CUDA_MMA_M16N8("m16n8k8.row.col.f32.tf32.tf32.f32", "f", "r");
#else
  unused(c, a, b0, b1);
#endif
}
#undef KFA_CUDA_MMA_M16N8

/// x rounded to tf32 (10 mantissa bits, round to nearest), as a 32-bit
/// pattern the tensor cores read.
KOKKOS_FORCEINLINE_FUNCTION std::uint32_t to_tf32(float x) {
#if KFA_CUDA_MMA_DEVICE
  std::uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
#else
  unused(x);
  return 0;
#endif
}

/// x = big + small with both parts tf32: big carries the top 11 significant
/// bits, small the next 11, so big·big' + big·small' + small·big' keeps a
/// product to about fp32 precision (the 3xTF32 split).
KOKKOS_FORCEINLINE_FUNCTION void split_tf32(float x, std::uint32_t& big, std::uint32_t& small) {
#if KFA_CUDA_MMA_DEVICE
  big = to_tf32(x);
  small = to_tf32(x - __uint_as_float(big));
#else
  unused(x);
  big = small = 0;
#endif
}

/// 2^x on the special-function unit (ex2.approx.ftz: relative error about
/// 2^-22, results below 2^-126 flushed to zero, which the softmax never
/// needs: they are below fp32's precision of the row sum).
KOKKOS_FORCEINLINE_FUNCTION float exp2_fast(float x) {
#if KFA_CUDA_MMA_DEVICE
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
  return r;
#else
  return x;
#endif
}

/// v of lane (lane_id() ^ mask) of the warp.
template <class T>
KOKKOS_FORCEINLINE_FUNCTION T shfl_xor(T v, int mask) {
  static_assert(std::is_same<T, float>::value || std::is_same<T, double>::value ||
                    std::is_same<T, std::uint32_t>::value,
                "shfl_xor: float, double or std::uint32_t");
#if KFA_CUDA_MMA_DEVICE
  return __shfl_xor_sync(0xffffffffu, v, mask);
#else
  unused(mask);
  return v;
#endif
}

/// Each x[r] summed over the 4 lanes of its quad, which hold one
/// accumulator row of an m16n8 tile.
template <class T, int N>
KOKKOS_FORCEINLINE_FUNCTION void quad_sums(T (&x)[N]) {
#pragma unroll
  for (int r = 0; r < N; ++r) {
    x[r] += shfl_xor(x[r], 1);
    x[r] += shfl_xor(x[r], 2);
  }
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
