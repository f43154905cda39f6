#ifndef KFA_DETAIL_BACKEND_CUDA_PRIMITIVES_TMA_HPP
#define KFA_DETAIL_BACKEND_CUDA_PRIMITIVES_TMA_HPP

// Hopper (sm_90) tensor memory accelerator: tensor maps of the
// [batch][rows][heads][head_dim] operands (16-bit, and the backward's fp32
// dQ accumulator), the bulk tensor copy (cp.async.bulk.tensor) of a
// [rows][64] box of one head into a 128-byte swizzled scratch tile (the
// layout of kfa/detail/backend/cuda/primitives/wgmma.hpp) and its reverse
// that adds a [rows][8] fp32 box to global memory
// (cp.reduce.async.bulk.tensor), and the shared-memory barriers (mbarrier)
// that tell a copy's arrival and a tile's release between a producer warp
// and the warps that compute.
//
// A tensor map is a 128-byte descriptor that the copy engine reads from
// kernel parameter, constant or global memory. The kernels that use one
// hold it in their functor and are launched with the functor as a
// __grid_constant__ parameter (launch_cuda_team), so its address is a
// parameter address. Rows past the tensor's end arrive as zeros and count
// toward the copy's bytes like the others, so a barrier always expects a
// whole box.

#include <Kokkos_Core.hpp>

#include <kfa/detail/backend/cuda/primitives/mma.hpp>

#if defined(KOKKOS_ENABLE_CUDA)
#include <cuda.h>
#include <cudaTypedefs.h>
#endif

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

namespace kfa {
namespace Impl {

/// The bytes of a CUtensorMap (its alignment included), in a type that host
/// builds without CUDA headers also know.
struct alignas(64) TmaMap {
  unsigned char bytes[128];
};

#if defined(KOKKOS_ENABLE_CUDA)
/// The driver's cuTensorMapEncodeTiled (through the runtime's entry-point
/// query, so no -lcuda), or null where the driver has none.
inline PFN_cuTensorMapEncodeTiled_v12000 tma_encoder() {
  using encode_t = PFN_cuTensorMapEncodeTiled_v12000;
  static const encode_t encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      fn = nullptr;
    return reinterpret_cast<encode_t>(fn);
  }();
  return encode;
}

/// Whether tensor maps can be made (the kernels that need them are not
/// launched otherwise).
inline bool tma_available() { return tma_encoder() != nullptr; }

/// The tensor map of a [batch][rows][heads][head_dim] tensor of `type`
/// (values of `bytes` bytes) at `data`, whose copies are boxes of
/// `box_rows` rows by `box_cols` values of one head, laid out in scratch
/// with `swizzle`. Throws std::runtime_error naming `what` where the driver
/// refuses.
inline TmaMap make_tma_map(const void* data, CUtensorMapDataType type, int bytes, int batch,
                           int rows, int heads, int head_dim, int box_cols, int box_rows,
                           CUtensorMapSwizzle swizzle, const char* what) {
  const auto encode = tma_encoder();
  if (!encode) throw std::runtime_error(std::string(what) + ": no cuTensorMapEncodeTiled in the driver");
  const cuuint64_t dims[4] = {cuuint64_t(head_dim), cuuint64_t(heads), cuuint64_t(rows),
                              cuuint64_t(batch)};
  const cuuint64_t strides[3] = {cuuint64_t(head_dim) * bytes,
                                 cuuint64_t(head_dim) * heads * bytes,
                                 cuuint64_t(head_dim) * heads * rows * bytes};
  const cuuint32_t box[4] = {cuuint32_t(box_cols), 1, cuuint32_t(box_rows), 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  CUtensorMap map;
  const CUresult err =
      encode(&map, type, 4, const_cast<void*>(data), dims, strides, box, element_strides,
             CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (err != CUDA_SUCCESS)
    throw std::runtime_error(std::string(what) + ": cuTensorMapEncodeTiled failed (CUresult " +
                             std::to_string(int(err)) + ")");
  static_assert(sizeof(CUtensorMap) == sizeof(TmaMap), "kfa: a CUtensorMap is 128 bytes");
  TmaMap out;
  std::memcpy(out.bytes, &map, sizeof(out.bytes));
  return out;
}

/// make_tma_map of a 16-bit (bf16 or fp16, `bf16` tells which) tensor:
/// boxes of 64 values (128 bytes a row), 128-byte swizzled.
inline TmaMap make_tma_map_16(const void* data, bool bf16, int batch, int rows, int heads,
                              int head_dim, int box_rows, const char* what) {
  return make_tma_map(data,
                      bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                      2, batch, rows, heads, head_dim, 64, box_rows, CU_TENSOR_MAP_SWIZZLE_128B,
                      what);
}

/// make_tma_map of an fp32 tensor: boxes of 8 values (32 bytes a row, rows
/// one after another in scratch), or with `wide` of 32 values (128 bytes a
/// row, 128-byte swizzled: the 16-byte chunk c of row r at chunk c ^ (r %
/// 8), the box 1024-byte aligned in scratch).
inline TmaMap make_tma_map_f32(const float* data, int batch, int rows, int heads, int head_dim,
                               int box_rows, const char* what, bool wide = false) {
  return make_tma_map(data, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, batch, rows, heads, head_dim,
                      wide ? 32 : 8, box_rows,
                      wide ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE, what);
}
#endif

namespace cuda_mma {

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)

/// Barrier at shared address `bar` expecting `count` arrivals a phase.
__device__ inline void mbarrier_init(std::uint32_t bar, std::uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
/// Makes the barriers' initialisation visible to the copy engine (followed
/// by a barrier of the block before any use).
__device__ inline void mbarrier_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ inline void mbarrier_arrive(std::uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
/// Arrives and adds `bytes` to the bytes the current phase waits for.
__device__ inline void mbarrier_arrive_expect(std::uint32_t bar, std::uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
/// Waits until the phase of parity `parity` of the barrier has completed
/// (a fresh barrier counts the phase of parity 1 as completed).
__device__ inline void mbarrier_wait(std::uint32_t bar, std::uint32_t parity) {
  std::uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

/// Named barrier `id` (1 to 15; __syncthreads is 0) of `threads` threads:
/// sync waits for the phase to complete, arrive counts this warp's threads
/// and goes on. Warp-specialised kernels meet at these from different
/// places in the code, which the .aligned forms (bar.sync, bar.arrive)
/// forbid: every thread of the block would have to run the same
/// instruction. So these are the unaligned forms.
__device__ inline void named_barrier_sync(int id, int threads) {
  asm volatile("barrier.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ inline void named_barrier_arrive(int id, int threads) {
  asm volatile("barrier.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

/// Register reallocation within a block (every warp of a warpgroup runs
/// the same one): dec gives the registers above Regs back to the block's
/// pool, inc waits until the pool has those that take this warp to Regs.
template <int Regs>
__device__ inline void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Regs));
}
template <int Regs>
__device__ inline void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Regs));
}

/// The box of `map` (make_tma_map_16) at column `col`, head `head`, row
/// `row`, batch `b` into scratch at `dst` (1024-aligned), its bytes counted
/// on the barrier `bar`.
__device__ inline void tma_load_box(std::uint32_t dst, const TmaMap& map, int col, int head,
                                    int row, int b, std::uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<std::uint64_t>(&map)), "r"(col), "r"(head), "r"(row), "r"(b),
      "r"(bar)
      : "memory");
}

/// Adds the box of `map` (make_tma_map_f32) at column `col`, head `head`,
/// row `row`, batch `b` from scratch at `src` (16-byte aligned, rows one
/// after another) into global memory; rows past the tensor's end are not
/// written. Part of this thread's bulk group (bulk_commit, bulk_wait_read,
/// bulk_wait).
__device__ inline void tma_reduce_add_box(const TmaMap& map, int col, int head, int row, int b,
                                          std::uint32_t src) {
  asm volatile(
      "cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group"
      " [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(reinterpret_cast<std::uint64_t>(&map)),
      "r"(src), "r"(col), "r"(head), "r"(row), "r"(b)
      : "memory");
}

#endif

}  // namespace cuda_mma
}  // namespace Impl
}  // namespace kfa

#endif
