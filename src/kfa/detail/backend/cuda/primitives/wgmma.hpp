#ifndef KFA_DETAIL_BACKEND_CUDA_PRIMITIVES_WGMMA_HPP
#define KFA_DETAIL_BACKEND_CUDA_PRIMITIVES_WGMMA_HPP

// Hopper (sm_90a) warpgroup tensor-core primitives: wgmma.mma_async with
// operands in shared memory through matrix descriptors (128-byte swizzle),
// the fences and waits around it, and the swizzled tile loads (cp.async)
// that produce its operand layout. Device code exists only where the
// translation unit is compiled for sm_90a (KFA_CUDA_WGMMA_DEVICE): Kokkos'
// HOPPER90 architecture compiles for sm_90, which has no wgmma; see
// KFA_CUDA_SM90A in CMakeLists.txt. wgmma_available() tells host code
// whether the device code that runs on a GPU has these kernels.
//
// A warpgroup is 4 consecutive warps (128 threads). Accumulator layout of
// wgmma.m64nNk16 for thread t of its warpgroup (w = t / 32 its warp, g =
// lane / 4, q = lane % 4): register 4j + e holds row 16w + g + 8·(e / 2),
// column 8j + 2q + (e % 2), which is mma.m16n8k16's C layout for n-tile j
// of m-tile w; the A operand from registers has m16n8k16's A layout. So the
// online softmax of the mma.sync forward applies unchanged.
//
// Operand tiles in scratch, for 16-bit values: rows of 64 values (128
// bytes) in atoms of 8 rows (1024 bytes, 1024-aligned), the 16-byte chunk c
// of row r stored at chunk c ^ (r % 8) (Swizzle<3,4,3>); a tile of R rows x
// D values is D / 64 such [R][64] column blocks, R · 128 bytes apart.
//  - K-major operand (the reduction runs along the rows: Q and K for
//    S = Q·Kᵀ): stride between 8-row groups (SBO) 1024 bytes; the k-th
//    16-value slice starts 32·(k % 4) bytes into column block k / 4.
//  - MN-major operand (V for O = P·V, the reduction runs down the rows):
//    SBO = 1024 bytes between 8-row (8-key) groups, LBO = R · 128 bytes
//    between the 64-value column blocks; the k-th 16-key slice starts
//    k · 2048 bytes in.

#include <kfa/detail/backend/cuda/primitives/mma.hpp>

#include <cstdint>

namespace kfa {
namespace Impl {
namespace cuda_mma {

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KFA_CUDA_WGMMA_DEVICE 1
#else
#define KFA_CUDA_WGMMA_DEVICE 0
#endif

/// The rest of a wgmma kernel's body where it is compiled without wgmma:
/// device code for another architecture than sm_90a stops the kernel (the
/// dispatch never launches it there: wgmma_available), the host pass does
/// nothing.
KOKKOS_FORCEINLINE_FUNCTION void trap_without_wgmma() {
#if defined(__CUDA_ARCH__)
  __trap();
#endif
}

/// Bytes of one [rows][64] column block of a swizzled 16-bit tile.
KOKKOS_INLINE_FUNCTION constexpr int sw128_block_bytes(int rows) { return rows * 128; }

/// Matrix descriptor of a 128-byte-swizzled operand at shared address
/// `addr` (16-byte units, the field holds 18 address bits), with leading
/// and stride byte offsets `lbo`, `sbo`.
KOKKOS_FORCEINLINE_FUNCTION std::uint64_t sw128_descriptor(std::uint32_t addr, std::uint32_t lbo,
                                                           std::uint32_t sbo) {
  return std::uint64_t((addr & 0x3FFFF) >> 4) | (std::uint64_t((lbo >> 4) & 0x3FFF) << 16) |
         (std::uint64_t((sbo >> 4) & 0x3FFF) << 32) | (std::uint64_t(1) << 62);
}

/// The descriptor `desc` (sw128_descriptor) moved `bytes` further (a
/// multiple of 16): one add on the start-address field, which cannot carry
/// out of its 14 bits while the address stays inside shared memory
/// (< 256 KB). So a loop of wgmma builds each operand's descriptor once and
/// steps it by constants.
KOKKOS_FORCEINLINE_FUNCTION std::uint64_t sw128_descriptor_add(std::uint64_t desc,
                                                               std::uint32_t bytes) {
  return desc + (bytes >> 4);
}

/// One thread's share of loading Rows rows of HeadDim 16-bit values of a
/// [b][i][h][d] tensor (rows `row_stride` elements apart) into a swizzled
/// tile (see above) by 16-byte cp.async, Threads threads a tile. Thread t
/// copies chunk t % (HeadDim / 8) of rows t / (HeadDim / 8) + k·kRowStep:
/// a row step that is a multiple of 8 keeps its swizzled chunk, so its
/// shared-memory offsets and the source step are set once here, and a
/// load is an add and a cp.async per chunk (the whole tile in range) or
/// with a bounds check per chunk (rows at or past `rows_total` read as 0).
template <int HeadDim, int Rows, int Threads>
class Sw128TileLoader {
 public:
  static constexpr int kChunks = HeadDim / 8;  // 16-byte chunks per row
  static constexpr int kRowStep = Threads / kChunks;
  static constexpr int kPerThread = Rows / kRowStep;
  static_assert(HeadDim % 64 == 0, "kfa: swizzled tiles hold head_dim in blocks of 64");
  static_assert(Threads % kChunks == 0 && Rows % kRowStep == 0 && kRowStep % 8 == 0,
                "kfa: a swizzled tile load needs whole rows per thread step, 8 rows apart");

  KOKKOS_FORCEINLINE_FUNCTION explicit Sw128TileLoader(int tid)
      : m_row(tid / kChunks),
        m_col((tid % kChunks) * 8),
        m_offset(std::uint32_t(((tid % kChunks) / 8) * Rows * 128 + (tid / kChunks) * 128 +
                               (((tid % kChunks) % 8) ^ ((tid / kChunks) % 8)) * 16)) {}

  /// Rows first_row.. of `src` into the tile at shared address `dst`.
  KOKKOS_FORCEINLINE_FUNCTION void load(std::uint32_t dst, const std::uint16_t* src,
                                        long row_stride, int first_row, int rows_total) const {
    const std::uint16_t* from = src + long(first_row + m_row) * row_stride + m_col;
    const long step = long(kRowStep) * row_stride;
    dst += m_offset;
    if (first_row + Rows <= rows_total) {
#pragma unroll
      for (int k = 0; k < kPerThread; ++k)
        cp_async_16_shared(dst + k * kRowStep * 128, from + k * step, 16);
    } else {
#pragma unroll
      for (int k = 0; k < kPerThread; ++k) {
        const bool ok = first_row + m_row + k * kRowStep < rows_total;
        cp_async_16_shared(dst + k * kRowStep * 128, ok ? from + k * step : src, ok ? 16 : 0);
      }
    }
  }

 private:
  int m_row, m_col;
  std::uint32_t m_offset;
};

/// A team's scratch from its first 1024-byte boundary on, where the
/// 128-byte-swizzled tiles must start (the swizzle repeats every 8 rows of
/// 128 bytes), and the shared-memory address of a pointer into it, which
/// the wgmma descriptors and the bulk copies take.
class Sw128Scratch {
 public:
  KOKKOS_FORCEINLINE_FUNCTION explicit Sw128Scratch(void* raw)
      : m_raw_addr(smem_address(raw)),
        m_base_addr((m_raw_addr + 1023) & ~std::uint32_t(1023)),
        m_base(static_cast<unsigned char*>(raw) + (m_base_addr - m_raw_addr)) {}
  /// The aligned start, as T*.
  template <class T>
  KOKKOS_FORCEINLINE_FUNCTION T* base() const {
    return reinterpret_cast<T*>(m_base);
  }
  KOKKOS_FORCEINLINE_FUNCTION std::uint32_t addr(const void* p) const {
    return m_base_addr + std::uint32_t(static_cast<const unsigned char*>(p) - m_base);
  }

 private:
  std::uint32_t m_raw_addr, m_base_addr;
  unsigned char* m_base;
};

#if KFA_CUDA_WGMMA_DEVICE

/// Orders this warpgroup's register accesses before the wgmma that follow.
__device__ inline void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ inline void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
/// Waits until at most N committed wgmma groups of the warpgroup are pending.
template <int N>
__device__ inline void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/// Keeps the compiler from moving accesses of `d` across this point (the
/// hardware writes wgmma accumulators asynchronously).
template <int N>
__device__ inline void fence_operands(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

/// wgmma.m64nNk16 with fp32 accumulators for operand format Format, in the
/// shapes the kernels use (S: N = 64, 128; O, dK, dV: N = head_dim; dQ: 64).
template <class Format, int N>
struct Wgmma;

// Operand lists of the wrappers: the accumulators d[i..] as "+f" operands,
// and the operand numbers %0.. of the instruction text in runs of 16.
#define KFA_WGMMA_D8(i)                                                                        \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
      "+f"(d[i + 6]), "+f"(d[i + 7])
#define KFA_WGMMA_D32_AT(i) \
  KFA_WGMMA_D8(i), KFA_WGMMA_D8(i + 8), KFA_WGMMA_D8(i + 16), KFA_WGMMA_D8(i + 24)
#define KFA_WGMMA_D32 KFA_WGMMA_D32_AT(0)
#define KFA_WGMMA_D64 KFA_WGMMA_D32_AT(0), KFA_WGMMA_D32_AT(32)
#define KFA_WGMMA_D128 KFA_WGMMA_D64, KFA_WGMMA_D32_AT(64), KFA_WGMMA_D32_AT(96)
#define KFA_WGMMA_R16_0 "%0, %1, %2, %3, %4, %5, %6, %7, " \
  "%8, %9, %10, %11, %12, %13, %14, %15"
#define KFA_WGMMA_R16_1 "%16, %17, %18, %19, %20, %21, %22, %23, " \
  "%24, %25, %26, %27, %28, %29, %30, %31"
#define KFA_WGMMA_R16_2 "%32, %33, %34, %35, %36, %37, %38, %39, " \
  "%40, %41, %42, %43, %44, %45, %46, %47"
#define KFA_WGMMA_R16_3 "%48, %49, %50, %51, %52, %53, %54, %55, " \
  "%56, %57, %58, %59, %60, %61, %62, %63"
#define KFA_WGMMA_R16_4 "%64, %65, %66, %67, %68, %69, %70, %71, " \
  "%72, %73, %74, %75, %76, %77, %78, %79"
#define KFA_WGMMA_R16_5 "%80, %81, %82, %83, %84, %85, %86, %87, " \
  "%88, %89, %90, %91, %92, %93, %94, %95"
#define KFA_WGMMA_R16_6 "%96, %97, %98, %99, %100, %101, %102, %103, " \
  "%104, %105, %106, %107, %108, %109, %110, %111"
#define KFA_WGMMA_R16_7 "%112, %113, %114, %115, %116, %117, %118, %119, " \
  "%120, %121, %122, %123, %124, %125, %126, %127"

// One wrapper, D = A·B (+ D if scale_d), for wgmma.m64n<N>k16 with R fp32
// accumulators (operands KFA_WGMMA_D<R>, numbered KFA_WGMMA_REGS_<R>). ss:
// A and B in scratch (Major: the transpose flags, "0, 0" K-major, "1, 1" A
// M-major and B N-major), operands %DescA, %DescB, %Pred; rs: A in
// registers %A0..%A3, B N-major in scratch %Desc, %Pred.
#define KFA_WGMMA_SS(Name, Type, N, R, DescA, DescB, Pred, Major)                              \
  __device__ static void Name(float (&d)[R], std::uint64_t desc_a, std::uint64_t desc_b,      \
                              int scale_d) {                                                  \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #Pred ", 0;\n"                          \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." Type "." Type " {"         \
                 KFA_WGMMA_REGS_##R "}, %" #DescA ", %" #DescB ", p, 1, 1, " Major ";\n}\n"   \
                 : KFA_WGMMA_D##R                                                             \
                 : "l"(desc_a), "l"(desc_b), "r"(scale_d));                                   \
  }
#define KFA_WGMMA_RS(Type, N, R, A0, A1, A2, A3, Desc, Pred)                                  \
  __device__ static void rs(float (&d)[R], const std::uint32_t (&a)[4], std::uint64_t desc_b, \
                            int scale_d) {                                                    \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #Pred ", 0;\n"                          \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." Type "." Type " {"         \
                 KFA_WGMMA_REGS_##R "}, {%" #A0 ", %" #A1 ", %" #A2 ", %" #A3 "}, %" #Desc    \
                 ", p, 1, 1, 1;\n}\n"                                                         \
                 : KFA_WGMMA_D##R                                                             \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));    \
  }
// ss, ss_mn and rs of the m64n<N>k16 shape: the R accumulators are operands
// %0..%(R-1), the instruction's other operands follow them.
#define KFA_WGMMA_SS_RS(Format, Type, N, R, X0, X1, X2, X3, X4, X5)                           \
  template <>                                                                                 \
  struct Wgmma<Format, N> {                                                                   \
    KFA_WGMMA_SS(ss, Type, N, R, X0, X1, X2, "0, 0")                                          \
    KFA_WGMMA_SS(ss_mn, Type, N, R, X0, X1, X2, "1, 1")                                       \
    KFA_WGMMA_RS(Type, N, R, X0, X1, X2, X3, X4, X5)                                          \
  };
#define KFA_WGMMA_REGS_32 KFA_WGMMA_R16_0 ", " KFA_WGMMA_R16_1
#define KFA_WGMMA_REGS_64 KFA_WGMMA_REGS_32 ", " KFA_WGMMA_R16_2 ", " KFA_WGMMA_R16_3
#define KFA_WGMMA_REGS_128                                                       \
  KFA_WGMMA_REGS_64 ", " KFA_WGMMA_R16_4 ", " KFA_WGMMA_R16_5 ", " KFA_WGMMA_R16_6 \
                    ", " KFA_WGMMA_R16_7

// The wrappers of one operand format (Type: its PTX type name), defined
// once and instantiated for both formats.
#define KFA_CUDA_WGMMA_FORMAT(Format, Type)                                 \
  KFA_WGMMA_SS_RS(Format, Type, 64, 32, 32, 33, 34, 35, 36, 37)             \
  KFA_WGMMA_SS_RS(Format, Type, 128, 64, 64, 65, 66, 67, 68, 69)            \
  template <>                                                               \
  struct Wgmma<Format, 256> {                                               \
    KFA_WGMMA_RS(Type, 256, 128, 128, 129, 130, 131, 132, 133)              \
  };

KFA_CUDA_WGMMA_FORMAT(Bf16, "bf16")
KFA_CUDA_WGMMA_FORMAT(Fp16, "f16")
#undef KFA_CUDA_WGMMA_FORMAT
#undef KFA_WGMMA_SS
#undef KFA_WGMMA_RS
#undef KFA_WGMMA_SS_RS
#undef KFA_WGMMA_REGS_32
#undef KFA_WGMMA_REGS_64
#undef KFA_WGMMA_REGS_128
#undef KFA_WGMMA_D8
#undef KFA_WGMMA_D32_AT
#undef KFA_WGMMA_D32
#undef KFA_WGMMA_D64
#undef KFA_WGMMA_D128
#undef KFA_WGMMA_R16_0
#undef KFA_WGMMA_R16_1
#undef KFA_WGMMA_R16_2
#undef KFA_WGMMA_R16_3
#undef KFA_WGMMA_R16_4
#undef KFA_WGMMA_R16_5
#undef KFA_WGMMA_R16_6
#undef KFA_WGMMA_R16_7

#endif  // KFA_CUDA_WGMMA_DEVICE

}  // namespace cuda_mma

#if defined(KOKKOS_ENABLE_CUDA) && defined(__CUDACC__)
// Writes 1 where the device code that runs is sm_90a's (it has the wgmma
// kernels), 0 elsewhere. static: one per translation unit, like the kernels.
__global__ static void kfa_wgmma_probe_kernel(int* flag) { *flag = KFA_CUDA_WGMMA_DEVICE; }

/// Whether the wgmma kernels of this translation unit run on `space`'s GPU:
/// a compute capability 9.0 device and device code compiled for sm_90a
/// (probed once per process and translation unit by a one-thread kernel,
/// since a fat binary may also carry sm_90 code, which has none).
static inline bool wgmma_available(const Kokkos::Cuda& space) {
  static const bool available = [&] {
    const auto& prop = space.cuda_device_prop();
    if (prop.major != 9 || prop.minor != 0) return false;
    Kokkos::View<int, Kokkos::CudaSpace> flag(Kokkos::view_alloc(space, "kfa::wgmma_probe"));
    kfa_wgmma_probe_kernel<<<1, 1, 0, space.cuda_stream()>>>(flag.data());
    if (cudaGetLastError() != cudaSuccess) return false;
    int host = 0;
    Kokkos::deep_copy(space, host, flag);
    space.fence("kfa::wgmma_probe");
    return host == 1;
  }();
  return available;
}
#endif

}  // namespace Impl
}  // namespace kfa

#endif
