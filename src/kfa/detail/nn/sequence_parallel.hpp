#ifndef KFA_DETAIL_NN_SEQUENCE_PARALLEL_HPP
#define KFA_DETAIL_NN_SEQUENCE_PARALLEL_HPP

// The layers' sequence-parallel mode: where a rank's tokens sit in the global
// sequence, argument checks that every rank of the ring passes or fails
// together, and the attention call (ring attention over the ranks, or the
// single-rank kernels when the mode is off). Without KFA_ENABLE_MPI only the
// single-rank path exists (the layers refuse a communicator at construction).

#include <kfa/kfa_config.hpp>
#include <kfa/flash_attention.hpp>
#include <kfa/nn/options.hpp>

#if KFA_ENABLE_MPI
#include <kfa/ring_attention.hpp>
#include <kfa/ring_communicator.hpp>

#include <kfa/detail/ring/checks.hpp>

#include <mpi.h>

#include <vector>
#endif

namespace kfa {
namespace Impl {

/// This rank's run of tokens in each sequence: positions [offset, offset +
/// seqlen) of seqlen_global. The whole sequence when the mode is off.
struct NnSequenceSlice {
  int offset = 0;
  int seqlen = 0;
  int seqlen_global = 0;
};

/// Runs `check` (argument checks that throw std::invalid_argument); in the
/// sequence-parallel mode every rank throws if any rank's check fails, so no
/// rank is left waiting in the ring for one that gave up.
template <class Check>
void nn_checks_on_every_rank(const nn::SequenceParallelOptions& options, Check&& check) {
#if KFA_ENABLE_MPI
  if (options.comm != nullptr) {
    agree_on_local_checks(*options.comm, check);
    return;
  }
#endif
  (void)options;
  check();
}

/// Where this rank's `seqlen` tokens sit: the lengths of the ranks before it
/// (one MPI_Allgather in the sequence-parallel mode).
inline NnSequenceSlice nn_sequence_slice(const nn::SequenceParallelOptions& options, int seqlen) {
  NnSequenceSlice slice{0, seqlen, seqlen};
#if KFA_ENABLE_MPI
  if (options.comm != nullptr) {
    const RingCommunicator& comm = *options.comm;
    std::vector<int> lengths(static_cast<std::size_t>(comm.size()));
    MPI_Allgather(&seqlen, 1, MPI_INT, lengths.data(), 1, MPI_INT, comm.comm());
    slice.offset = 0;
    slice.seqlen_global = 0;
    for (int r = 0; r < comm.size(); ++r) {
      if (r < comm.rank()) slice.offset += lengths[r];
      slice.seqlen_global += lengths[r];
    }
  }
#endif
  (void)options;
  return slice;
}

#if KFA_ENABLE_MPI
inline RingOptions nn_ring_options(const nn::SequenceParallelOptions& options,
                                   const AttentionOptions& attention) {
  RingOptions ring;
  static_cast<AttentionOptions&>(ring) = attention;
  ring.sharding = RingSharding::contiguous;
  ring.transport = options.transport;
  return ring;
}
#endif

/// The layer's attention forward: ring attention over the ranks in the
/// sequence-parallel mode (collective; fences, see ring_attention_forward),
/// flash attention otherwise. Ring attention takes no score modifier: the
/// layers refuse one in that mode before calling this.
template <class ExecSpace, class V4, class L3, class ScoreMod>
void nn_attention_forward(const ExecSpace& space, const nn::SequenceParallelOptions& options,
                          const V4& q, const V4& k, const V4& v, const V4& o, const L3& lse,
                          const AttentionOptions& attention, const ScoreMod& score_mod) {
#if KFA_ENABLE_MPI
  if constexpr (std::is_same<ScoreMod, NoScoreMod>::value) {
    if (options.comm != nullptr) {
      ring_attention_forward(space, *options.comm, q, k, v, o, lse,
                             nn_ring_options(options, attention));
      return;
    }
  }
#endif
  (void)options;
  flash_attention_forward(space, q, k, v, o, lse, attention, score_mod);
}

template <class ExecSpace, class V4, class L3, class ScoreMod>
void nn_attention_backward(const ExecSpace& space, const nn::SequenceParallelOptions& options,
                           const V4& q, const V4& k, const V4& v, const V4& o, const L3& lse,
                           const V4& d_o, const V4& dq, const V4& dk, const V4& dv,
                           const AttentionOptions& attention, const ScoreMod& score_mod) {
#if KFA_ENABLE_MPI
  if constexpr (std::is_same<ScoreMod, NoScoreMod>::value) {
    if (options.comm != nullptr) {
      ring_attention_backward(space, *options.comm, q, k, v, o, lse, d_o, dq, dk, dv,
                              nn_ring_options(options, attention));
      return;
    }
  }
#endif
  (void)options;
  flash_attention_backward(space, q, k, v, o, lse, d_o, dq, dk, dv, attention, score_mod);
}

/// Throws unless `options` can run: a communicator needs an MPI build, and
/// ring attention sees chunk-local positions, so no window and no
/// attention-weight dropout.
inline void nn_check_sequence_parallel(const char* function,
                                       const nn::SequenceParallelOptions& options,
                                       const AttentionOptions& attention) {
  if (options.comm == nullptr) return;
#if !KFA_ENABLE_MPI
  throw_invalid(function, "options.sequence_parallel.comm needs kfa built with "
                          "KFA_ENABLE_MPI=ON");
#endif
  if (attention.window_left != -1 || attention.window_right != -1 || attention.dropout_p != 0) {
    throw_invalid(function, "options.sequence_parallel needs options.attention.window_left = "
                            "window_right = -1 and dropout_p = 0 (ring attention supports "
                            "neither a window nor attention-weight dropout)");
  }
}

}  // namespace Impl
}  // namespace kfa

#endif
