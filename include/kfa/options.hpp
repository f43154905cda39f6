#ifndef KFA_OPTIONS_HPP
#define KFA_OPTIONS_HPP

namespace kfa {

/// Options shared by every attention entry point.
struct AttentionOptions {
  /// Multiplies Q·Kᵀ before the softmax; 0 means 1/sqrt(head_dim).
  double softmax_scale = 0;
  /// Masks key j for query i when j > i + (seqlen_k - seqlen_q): the mask is
  /// aligned to the bottom-right corner, as in FlashAttention-2. Query rows
  /// that see no key get O = 0 and lse = -inf.
  bool causal = false;
  /// Backward pass bitwise reproducible from run to run: dQ is accumulated
  /// inside one team per query block instead of by floating-point atomics
  /// (about 1.4x the arithmetic of the default backward).
  bool deterministic = false;
  /// Threads per team; 0 lets kfa choose per backend. Host backends default
  /// to one thread per team; a larger value makes teams share work through
  /// team barriers (the unit tests use it to exercise them).
  int team_size = 0;
};

}  // namespace kfa

#endif
