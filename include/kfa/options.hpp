#ifndef KFA_OPTIONS_HPP
#define KFA_OPTIONS_HPP

#include <cstdint>

namespace kfa {

/// How fp32 matrix products are formed on the CUDA backend (head_dim 64 and
/// 128; host backends always use fp32 FMAs).
enum class Fp32Matmul {
  /// fp32 FMAs: IEEE fp32 arithmetic, the error of a plain fp32
  /// implementation (the default).
  ieee,
  /// Each operand split into two tf32 parts, three tensor-core products per
  /// fp32 product (3xTF32, the arithmetic of PyTorch's efficient backend on
  /// sm_80+). Faster than ieee; each block's sums are added in fp32, so O's
  /// error stays near ieee's. Backward: dK and dV are summed inside the
  /// tensor core, with errors a few times ieee's (docs/performance.md).
  split_tf32,
  /// One tf32 product (11 significant bits): fastest, errors near 1e-3,
  /// for callers that accept tf32 precision.
  tf32
};

namespace Experimental {

/// Which kernel families a call may choose from. Applications keep the
/// defaults (the fastest family that serves the call); tests and benchmarks
/// pin a path with it.
struct KernelPolicy {
  /// Host backends run the vectorised per-thread kernels; false runs the
  /// portable TeamPolicy kernels there (the reference).
  bool host_tiled = true;
  /// Fused CUDA kernels may use opt-in shared memory (more team scratch than
  /// Kokkos' TeamPolicy grants). false keeps every kernel inside TeamPolicy
  /// scratch: the 16-bit forward's TeamPolicy shape, else the portable kernels.
  bool opt_in_shared_memory = true;
  /// The 16-bit kernels may take the Hopper (wgmma) path where the GPU and the
  /// device code have it; false runs the mma.sync kernels there too.
  bool wgmma = true;
  /// Teams per group of (batch, head) pairs in the leagues of the fused CUDA
  /// kernels, so that the teams running at once share a few heads in L2; 0
  /// puts every pair in one group.
  int league_group_teams = 256;
};

}  // namespace Experimental

/// Options shared by every attention entry point.
///
/// The score of query i and key j goes through, in this order:
///   s = softmax_scale · q_i·k_j
///   s = softcap · tanh(s / softcap)            (softcap > 0)
///   s = score_mod(batch, head, i, j, s)        (overloads taking a score modifier)
///   s = -inf where the causal / window mask hides key j from query i
///   P = softmax(s) per row (lse is taken here), then dropout on P.
struct AttentionOptions {
  /// Multiplies Q·Kᵀ before the softmax; 0 means 1/sqrt(head_dim).
  double softmax_scale = 0;
  /// Masks key j for query i when j > i + (seqlen_k - seqlen_q): the mask is
  /// aligned to the bottom-right corner, as in FlashAttention-2. Query rows
  /// that see no key get O = 0 and lse = -inf. Same as window_right = 0
  /// (and overrides window_right).
  bool causal = false;
  /// Backward pass bitwise reproducible from run to run: dQ is accumulated
  /// inside one team per query block instead of by floating-point atomics
  /// (about 1.4x the arithmetic of the default backward). dK and dV are
  /// always reproducible, with grouped-query attention too.
  bool deterministic = false;
  /// Threads per team; 0 lets kfa choose per backend. Host backends default
  /// to one thread per tile; a larger value runs the portable TeamPolicy
  /// kernels, whose teams share work through team barriers (the unit tests
  /// use it to exercise them).
  int team_size = 0;
  /// Sliding window (local attention): query i sees key j iff
  ///   i + off - window_left <= j <= i + off + window_right,
  /// off = seqlen_k - seqlen_q (bottom-right aligned like causal). -1 leaves
  /// that side unbounded; other negative values are rejected. Tiles outside
  /// the window are skipped, so the cost is O(seqlen · window).
  int window_left = -1;
  int window_right = -1;
  /// Soft capping of the scaled scores (Gemma 2, Grok): s becomes
  /// softcap · tanh(s / softcap). 0 turns it off; negative values are rejected.
  double softcap = 0;
  /// Dropout probability on the attention weights, in [0, 1): O =
  /// (Z ∘ P / (1 - p))·V with Z a keep mask; lse is that of the undropped P.
  /// Z is drawn by a counter-based generator keyed by (dropout_seed, batch,
  /// head, i, j), so the backward pass regenerates the forward's mask and
  /// every backend draws the same one; kfa::dropout_mask returns it.
  double dropout_p = 0;
  std::uint64_t dropout_seed = 0;
  /// fp32 products on tensor cores (see Fp32Matmul); host backends always use
  /// fp32 FMAs.
  Fp32Matmul fp32_matmul = Fp32Matmul::ieee;
  /// Which kernel families may serve the call (tests and benchmarks).
  Experimental::KernelPolicy kernel_policy;
};

}  // namespace kfa

#endif
