#ifndef KFA_DETAIL_BACKEND_CUDA_PRIMITIVES_MMA_ATOMS_HPP
#define KFA_DETAIL_BACKEND_CUDA_PRIMITIVES_MMA_ATOMS_HPP

// Tensor-core atoms for the 32- and 64-bit value types on the CUDA backend:
// the fragment loads from team scratch and the product of one tile, behind
// one interface, so the fused kernels are written once for both.
//
//  - Fp64Atom: mma.m8n8k4 in fp64 (DMMA), exact fp64 arithmetic;
//    Fp64x16Atom: mma.m16n8k8 in fp64 (sm_90), the same arithmetic at twice
//    the m8n8k4 rate on Hopper (m8n8k4 runs at A100's rate per SM).
//  - Tf32x3Atom: mma.m16n8k8 with tf32 operands, each fp32 operand split
//    into big + small tf32 parts and every product taken as
//    small·big + big·small + big·big (3xTF32), which keeps fp32 precision
//    (the small·small term is below it). Tf32Atom: one product of the big
//    parts, for callers that ask for tf32 speed and precision.
//
// Interface (lane = threadIdx.x, g = lane / 4, t = lane % 4):
//   kRows    rows of an atom (8 or 16); kDepth its k extent (4 or 8)
//   kC       accumulators per lane: c[j] at row g + 8·(j / 2), column 2t + j % 2
//   A, B     operand fragments
//   load_a(tile, pitch, row, k)    A = tile[row..+kRows][k..+kDepth] (row-major)
//   load_b_t(tile, pitch, n, k)    B = tileᵀ for tile[n..+8][k..+kDepth]
//                                  (B[kk][nn] = tile[n + nn][k + kk]: K rows)
//   load_b_perm(tile, pitch, key, slice, n)
//                                  B from 8 rows tile[key..+8][n..+8] (V rows),
//                                  the rows taken in the order a_from_c uses
//   load_a_t_perm(tile, pitch, row, key, slice)
//                                  A = tileᵀ for tile[key..+8][row..+kRows]
//                                  (A[r][kk] = tile[key + kk][row + r]), keys
//                                  in load_b_perm's order
//   a_from_c(c, slice)             the accumulator tile c of one 8-column
//                                  n-tile as the A operand of slice `slice`
//                                  (kSlices = 8 / kDepth per 8 columns)
//   mma(c, a, b)                   c += a·b
//   kFreshSums                     whether a kernel should sum products in
//                                  fresh accumulators per few k-steps and
//                                  add those in the value type (below)
//   kSwizzle                       whether the tiles the loads read are
//                                  stored with swizzle_col (the kernels'
//                                  copies and stores to them apply it too)
// a_from_c and load_b_perm permute the 8 keys of a tile the same way (keys
// 2t and 2t+1 are where lane t holds them in the accumulator), which leaves
// the sum over keys unchanged: P never leaves registers on its way to P·V.

#include <kfa/detail/backend/cuda/primitives/mma.hpp>

#include <cstdint>

namespace kfa {
namespace Impl {
namespace cuda_mma {

/// What the fp64 atoms share: double operands and accumulators, summed in
/// place.
struct Fp64AtomBase {
  using value_type = double;
  static constexpr bool kFreshSums = false;
};

struct Fp64Atom : Fp64AtomBase {
  static constexpr int kRows = 8, kDepth = 4, kC = 2, kSlices = 2;
  static constexpr bool kSwizzle = false;
  struct A {
    double a;
  };
  struct B {
    double b;
  };
  KOKKOS_FORCEINLINE_FUNCTION static A load_a(const double* tile, int pitch, int row, int k) {
    const int lane = lane_id();
    return {tile[(row + lane / 4) * pitch + k + lane % 4]};
  }
  KOKKOS_FORCEINLINE_FUNCTION static B load_b_t(const double* tile, int pitch, int n, int k) {
    const int lane = lane_id();
    return {tile[(n + lane / 4) * pitch + k + lane % 4]};
  }
  KOKKOS_FORCEINLINE_FUNCTION static B load_b_perm(const double* tile, int pitch, int key,
                                                   int slice, int n) {
    const int lane = lane_id();
    return {tile[(key + 2 * (lane % 4) + slice) * pitch + n + lane / 4]};
  }
  KOKKOS_FORCEINLINE_FUNCTION static A load_a_t_perm(const double* tile, int pitch, int row,
                                                     int key, int slice) {
    const int lane = lane_id();
    return {tile[(key + 2 * (lane % 4) + slice) * pitch + row + lane / 4]};
  }
  KOKKOS_FORCEINLINE_FUNCTION static A a_from_c(const double (&c)[kC], int slice) {
    return {c[slice]};
  }
  KOKKOS_FORCEINLINE_FUNCTION static void mma(double (&c)[kC], const A& a, const B& b) {
    mma_884_f64(c, a.a, b.b);
  }
};

/// m16n8k8 fp64 (sm_90): the tf32 m16n8k8 fragment layout with doubles.
struct Fp64x16Atom : Fp64AtomBase {
  static constexpr int kRows = 16, kDepth = 8, kC = 4, kSlices = 1;
  /// Tiles are stored with swizzle_col (rows of 16·k + 4 doubles); `row`,
  /// `n`, `key` and `k` below are multiples of 8.
  static constexpr bool kSwizzle = true;
  struct A {
    double a[4];
  };
  struct B {
    double b0, b1;
  };
  KOKKOS_FORCEINLINE_FUNCTION static A load_a(const double* tile, int pitch, int row, int k) {
    const int lane = lane_id(), g = lane / 4;
    const double* p = tile + (row + g) * pitch + k;
    const int c = swizzle_col<kSwizzle>(g, lane % 4);
    return {{p[c], p[8 * pitch + c], p[c ^ 4], p[8 * pitch + (c ^ 4)]}};
  }
  KOKKOS_FORCEINLINE_FUNCTION static B load_b_t(const double* tile, int pitch, int n, int k) {
    const int lane = lane_id(), g = lane / 4;
    const double* p = tile + (n + g) * pitch + k;
    const int c = swizzle_col<kSwizzle>(g, lane % 4);
    return {p[c], p[c ^ 4]};
  }
  KOKKOS_FORCEINLINE_FUNCTION static B load_b_perm(const double* tile, int pitch, int key, int,
                                                   int n) {
    const int lane = lane_id(), r = 2 * (lane % 4);
    const double* p = tile + (key + r) * pitch + n + swizzle_col<kSwizzle>(r, lane / 4);
    return {p[0], p[pitch]};
  }
  KOKKOS_FORCEINLINE_FUNCTION static A load_a_t_perm(const double* tile, int pitch, int row,
                                                     int key, int) {
    const int lane = lane_id(), r = 2 * (lane % 4);
    const double* p = tile + (key + r) * pitch + row + swizzle_col<kSwizzle>(r, lane / 4);
    return {{p[0], p[8], p[pitch], p[pitch + 8]}};
  }
  KOKKOS_FORCEINLINE_FUNCTION static A a_from_c(const double (&c)[kC], int) {
    return {{c[0], c[2], c[1], c[3]}};
  }
  KOKKOS_FORCEINLINE_FUNCTION static void mma(double (&c)[kC], const A& a, const B& b) {
    mma_1688_f64(c, a.a, b.b0, b.b1);
  }
};

/// The atom the fp32/fp64 kernels run for the atom family the dispatch
/// picks: fp64 takes m16n8k8 (Fp64x16Atom), twice m8n8k4's rate on Hopper,
/// in builds for sm_90+.
template <class Atom>
struct Fp32Fp64KernelAtom {
  using type = Atom;
};
#if KFA_CUDA_FP64_M16
template <>
struct Fp32Fp64KernelAtom<Fp64Atom> {
  using type = Fp64x16Atom;
};
#endif
template <class Atom>
using fp32_fp64_atom_t = typename Fp32Fp64KernelAtom<Atom>::type;

/// Passes = 3: 3xTF32 (fp32 precision); Passes = 1: plain tf32.
/// FreshSums (3xTF32's default): the forward sums the products of a few
/// k-steps in zeroed accumulators and adds those to its running sums with
/// fp32 adds (round to nearest), instead of accumulating everything inside
/// the tensor core, whose accumulation loses precision the longer a sum
/// runs in it: with O accumulated over every K/V block there, 3xTF32's O
/// error grows many times over on long sequences.
template <int Passes, bool FreshSums = (Passes == 3)>
struct Tf32Atom {
  static_assert(Passes == 1 || Passes == 3, "kfa: tf32 products take 1 or 3 passes");
  using value_type = float;
  static constexpr int kRows = 16, kDepth = 8, kC = 4, kSlices = 1;
  static constexpr bool kFreshSums = FreshSums;
  static constexpr bool kSwizzle = false;
  static constexpr bool kSplit = Passes == 3;
  struct A {
    std::uint32_t big[4], small[kSplit ? 4 : 1];
  };
  struct B {
    std::uint32_t big[2], small[kSplit ? 2 : 1];
  };
  KOKKOS_FORCEINLINE_FUNCTION static void set(std::uint32_t* big, std::uint32_t* small, int i,
                                              float x) {
    if constexpr (kSplit) {
      split_tf32(x, big[i], small[i]);
    } else {
      (void)small;
      big[i] = to_tf32(x);
    }
  }
  KOKKOS_FORCEINLINE_FUNCTION static A load_a(const float* tile, int pitch, int row, int k) {
    const int lane = lane_id();
    const float* p = tile + (row + lane / 4) * pitch + k + lane % 4;
    A a;
    set(a.big, a.small, 0, p[0]);
    set(a.big, a.small, 1, p[8 * pitch]);
    set(a.big, a.small, 2, p[4]);
    set(a.big, a.small, 3, p[8 * pitch + 4]);
    return a;
  }
  KOKKOS_FORCEINLINE_FUNCTION static B load_b_t(const float* tile, int pitch, int n, int k) {
    const int lane = lane_id();
    const float* p = tile + (n + lane / 4) * pitch + k + lane % 4;
    B b;
    set(b.big, b.small, 0, p[0]);
    set(b.big, b.small, 1, p[4]);
    return b;
  }
  KOKKOS_FORCEINLINE_FUNCTION static B load_b_perm(const float* tile, int pitch, int key, int,
                                                   int n) {
    const int lane = lane_id();
    const float* p = tile + (key + 2 * (lane % 4)) * pitch + n + lane / 4;
    B b;
    set(b.big, b.small, 0, p[0]);
    set(b.big, b.small, 1, p[pitch]);
    return b;
  }
  KOKKOS_FORCEINLINE_FUNCTION static A load_a_t_perm(const float* tile, int pitch, int row,
                                                     int key, int) {
    const int lane = lane_id();
    const float* p = tile + (key + 2 * (lane % 4)) * pitch + row + lane / 4;
    A a;
    set(a.big, a.small, 0, p[0]);
    set(a.big, a.small, 1, p[8]);
    set(a.big, a.small, 2, p[pitch]);
    set(a.big, a.small, 3, p[pitch + 8]);
    return a;
  }
  // A (g, t) <- c0 (g, key 2t); (g+8, t) <- c2; (g, t+4) <- c1 (g, key 2t+1);
  // (g+8, t+4) <- c3.
  KOKKOS_FORCEINLINE_FUNCTION static A a_from_c(const float (&c)[kC], int) {
    A a;
    set(a.big, a.small, 0, c[0]);
    set(a.big, a.small, 1, c[2]);
    set(a.big, a.small, 2, c[1]);
    set(a.big, a.small, 3, c[3]);
    return a;
  }
  KOKKOS_FORCEINLINE_FUNCTION static void mma(float (&c)[kC], const A& a, const B& b) {
    if constexpr (kSplit) {
      mma_1688_tf32(c, a.small, b.big[0], b.big[1]);
      mma_1688_tf32(c, a.big, b.small[0], b.small[1]);
    }
    mma_1688_tf32(c, a.big, b.big[0], b.big[1]);
  }
};

using Tf32x3Atom = Tf32Atom<3>;

}  // namespace cuda_mma
}  // namespace Impl
}  // namespace kfa

#endif
