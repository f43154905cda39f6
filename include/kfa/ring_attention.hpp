#ifndef KFA_RING_ATTENTION_HPP
#define KFA_RING_ATTENTION_HPP

// Ring attention: sequence parallelism over the ranks of an MPI
// communicator. Built when kfa is configured with KFA_ENABLE_MPI=ON.

#include <kfa/kfa_config.hpp>

#if !KFA_ENABLE_MPI
#error "kfa/ring_attention.hpp needs kfa configured with KFA_ENABLE_MPI=ON"
#endif

#include <kfa/options.hpp>
#include <kfa/ring_communicator.hpp>
#include <kfa/ring_options.hpp>
#include <kfa/types.hpp>

#include <kfa/detail/common/checks.hpp>
#include <kfa/detail/ring/ring_attention_impl.hpp>
#include <kfa/detail/ring/checks.hpp>
#include <kfa/detail/ring/layout.hpp>

#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <sstream>

namespace kfa {

/// Local sequence length of `rank` (of `ranks`) when a sequence of
/// `global_seqlen` positions is sharded with `sharding`: contiguous gives a
/// near-even split (the first global_seqlen % ranks ranks one longer);
/// zigzag gives global_seqlen / ranks and needs global_seqlen divisible by
/// 2·ranks. Throws std::invalid_argument otherwise.
inline std::size_t ring_local_seqlen(std::size_t global_seqlen, int rank, int ranks,
                                     RingSharding sharding) {
  const char* function = "kfa::ring_local_seqlen";
  if (ranks < 1 || rank < 0 || rank >= ranks) {
    std::ostringstream out;
    out << "rank must be in [0, ranks) with ranks >= 1, got rank " << rank << " of " << ranks;
    Impl::throw_invalid(function, out.str());
  }
  const std::size_t p = static_cast<std::size_t>(ranks);
  if (sharding == RingSharding::zigzag) {
    if (global_seqlen % (2 * p) != 0) {
      std::ostringstream out;
      out << "zigzag sharding cuts the sequence into 2·ranks = " << 2 * p
          << " equal chunks; global_seqlen " << global_seqlen << " is not divisible by " << 2 * p;
      Impl::throw_invalid(function, out.str());
    }
    return global_seqlen / p;
  }
  return global_seqlen / p + (static_cast<std::size_t>(rank) < global_seqlen % p ? 1 : 0);
}

/// Ring attention forward: attention of every rank's query slice over the
/// keys of the whole sequence, each rank holding one slice of q, k and v.
/// The K/V blocks travel around the ring of `comm`'s ranks while each rank
/// computes on the block it holds with the fused kernel; partial results are
/// merged exactly in the accumulator type (fp32, fp64 for double).
///
/// q, o [batch][seqlen_local][heads][head_dim], k, v [batch][seqlen_local]
/// [heads_kv][head_dim] (this rank's slice, sharded as options.sharding
/// says: ring_shard / ring_local_seqlen; heads_kv divides heads, fewer for
/// grouped-query attention), lse [batch][heads][seqlen_local]; types and
/// layouts as in flash_attention_forward. q, k and v are slices of one
/// sequence: seqlen_k == seqlen_q on every rank. batch, heads, heads_kv,
/// head_dim, value type and options must be the same on every rank; local lengths may differ with
/// contiguous sharding (zero included). options.causal masks by global
/// position (key j visible to query i iff j <= i).
///
/// Collective over `comm`. Before any block is sent the ranks agree on their
/// arguments: bad local arguments on any rank, or shapes or options that do
/// not fit together, throw the same std::invalid_argument on every rank,
/// with nothing written. A rank that fails after that agreement (an
/// allocation failure, a CUDA error) ends the job through MPI_Abort, with its
/// rank and error on stderr, rather than leave the other ranks waiting for
/// its blocks (docs/ring_attention.md). Work is enqueued on `space`; it is fenced where MPI
/// needs host-visible data: once per ring step (before a block written by
/// kernels is handed to MPI, and so that the buffer the next block lands in
/// is free), and around host staging copies.
///
/// Memory per rank, with n = batch·seqlen_local·heads·head_dim and n_kv the
/// same with heads_kv: two K/V blocks (4n_kv values), the o accumulator (n, accumulator type), one
/// chunk of o_step, and with zigzag sharding and batch > 1 a packed copy of q (n; a contiguous q of
/// batch 1 is read where it is); one workspace, which on CUDA stays allocated for the next call on
/// the same stream (see release_workspaces).
template <class ExecSpace, class Q, class K, class V, class O, class Lse>
void ring_attention_forward(const ExecSpace& space, const RingCommunicator& comm, const Q& q,
                            const K& k, const V& v, const O& o, const Lse& lse,
                            const RingOptions& options = {}) {
  static_assert(Kokkos::is_execution_space<ExecSpace>::value,
                "kfa::ring_attention_forward: space must be a Kokkos execution space instance");
  const auto call_start = std::chrono::steady_clock::now();
  const char* function = "kfa::ring_attention_forward";
  Impl::ProfilingRegion region(function);
  Impl::agree_on_local_checks(comm, [&] {
    Impl::check_forward_arguments<ExecSpace>(function, q, k, v, o, lse, options);
    Impl::check_ring_local<ExecSpace>(function, q, k, options);
  });
  if constexpr (Impl::forward_types_ok<ExecSpace, Q, K, V, O, Lse>()) {
    using T = typename Q::non_const_value_type;
    const Impl::RingLayout layout = Impl::agree_on_ring_arguments<T>(function, comm, q, k, options);
    Impl::run_ring_or_abort(function, comm, [&] {
      Impl::ring_forward(space, comm, layout, q, k, v, o, lse, options, call_start);
    });
  }
}

/// ring_attention_forward on a communicator duplicated for this call.
template <class ExecSpace, class Q, class K, class V, class O, class Lse>
void ring_attention_forward(const ExecSpace& space, MPI_Comm comm, const Q& q, const K& k,
                            const V& v, const O& o, const Lse& lse,
                            const RingOptions& options = {}) {
  const RingCommunicator ring(comm);
  ring_attention_forward(space, ring, q, k, v, o, lse, options);
}

/// Ring attention backward: dq, dk, dv of every rank's slice. The K/V
/// blocks travel around the ring as in the forward pass, followed one step
/// behind by accumulators of their dK/dV (accumulator type), which are back
/// on the block's owner after a full turn; dQ accumulates locally. The
/// forward pass is not recomputed: o and lse must be this rank's slices of
/// ring_attention_forward's outputs for the same q, k, v and options.
///
/// Shapes as in ring_attention_forward; d_o and dq like q, dk and dv like k.
/// Collective, checked and fenced as ring_attention_forward. With
/// options.deterministic the result is bitwise reproducible (the ring adds
/// the per-block gradients in a fixed order).
///
/// Memory per rank, with n and n_kv as above: two K/V blocks (4n_kv
/// values), two dK/dV accumulator blocks and this rank's contribution (6n_kv,
/// accumulator type),
/// the dq accumulator (n, accumulator type), per-chunk dq/dk/dv temporaries,
/// and with zigzag sharding packed copies of q, o and d_o (batch > 1) and of
/// lse (batch·heads > 1); contiguous inputs of batch 1 are read where they
/// are. One workspace, kept on CUDA as the forward's is.
template <class ExecSpace, class Q, class K, class V, class O, class Lse, class DO, class DQ,
          class DK, class DV>
void ring_attention_backward(const ExecSpace& space, const RingCommunicator& comm, const Q& q,
                             const K& k, const V& v, const O& o, const Lse& lse, const DO& d_o,
                             const DQ& dq, const DK& dk, const DV& dv,
                             const RingOptions& options = {}) {
  static_assert(Kokkos::is_execution_space<ExecSpace>::value,
                "kfa::ring_attention_backward: space must be a Kokkos execution space instance");
  const auto call_start = std::chrono::steady_clock::now();
  const char* function = "kfa::ring_attention_backward";
  Impl::ProfilingRegion region(function);
  Impl::agree_on_local_checks(comm, [&] {
    Impl::check_backward_arguments<ExecSpace>(function, q, k, v, o, lse, d_o, dq, dk, dv, options);
    Impl::check_ring_local<ExecSpace>(function, q, k, options);
  });
  if constexpr (Impl::backward_types_ok<ExecSpace, Q, K, V, O, Lse, DO, DQ, DK, DV>()) {
    using T = typename Q::non_const_value_type;
    const Impl::RingLayout layout = Impl::agree_on_ring_arguments<T>(function, comm, q, k, options);
    Impl::run_ring_or_abort(function, comm, [&] {
      Impl::ring_backward(space, comm, layout, q, k, v, o, lse, d_o, dq, dk, dv, options,
                          call_start);
    });
  }
}

/// ring_attention_backward on a communicator duplicated for this call.
template <class ExecSpace, class Q, class K, class V, class O, class Lse, class DO, class DQ,
          class DK, class DV>
void ring_attention_backward(const ExecSpace& space, MPI_Comm comm, const Q& q, const K& k,
                             const V& v, const O& o, const Lse& lse, const DO& d_o, const DQ& dq,
                             const DK& dk, const DV& dv, const RingOptions& options = {}) {
  const RingCommunicator ring(comm);
  ring_attention_backward(space, ring, q, k, v, o, lse, d_o, dq, dk, dv, options);
}

/// Copies this rank's slice of a global tensor, which every rank holds,
/// into `local`: global [batch][seqlen][heads][head_dim] -> local
/// [batch][seqlen_local][heads][head_dim], or lse-shaped global
/// [batch][heads][seqlen] -> local [batch][heads][seqlen_local]. The local
/// lengths decide the split: contiguous slices follow rank order with any
/// lengths (ring_local_seqlen gives the default); zigzag needs the same
/// even length everywhere. Collective over `comm` (the ranks agree on the
/// shapes; std::invalid_argument on every rank if the slices do not tile the
/// global sequence). Enqueued on `space`; no fence.
template <class ExecSpace, class Global, class Local>
void ring_shard(const ExecSpace& space, const RingCommunicator& comm, const Global& global,
                const Local& local, RingSharding sharding) {
  static_assert(Kokkos::is_view<Global>::value && Kokkos::is_view<Local>::value,
                "kfa::ring_shard: global and local must be Kokkos::Views");
  static_assert(Impl::view_rank<Local>() == 4 || Impl::view_rank<Local>() == 3,
                "kfa::ring_shard: local must be a rank-4 [batch][seqlen][heads][head_dim] or "
                "rank-3 [batch][heads][seqlen] View");
  static_assert(Impl::view_rank<Global>() == Impl::view_rank<Local>(),
                "kfa::ring_shard: global and local must have the same rank");
  static_assert(
      std::is_same<typename Global::non_const_value_type, typename Local::value_type>::value,
      "kfa::ring_shard: local must be non-const, with global's value type");
  static_assert(Kokkos::SpaceAccessibility<ExecSpace, typename Global::memory_space>::accessible &&
                    Kokkos::SpaceAccessibility<ExecSpace, typename Local::memory_space>::accessible,
                "kfa::ring_shard: global and local must be accessible from the execution space");
  const char* function = "kfa::ring_shard";
  Impl::ProfilingRegion region(function);
  using T = typename Local::value_type;
  const Impl::RingLayout layout =
      Impl::agree_on_shard_arguments<T>(function, comm, local, global, sharding);
  Impl::ring_shard_impl(space, layout, comm.rank(), global, local);
}

template <class ExecSpace, class Global, class Local>
void ring_shard(const ExecSpace& space, MPI_Comm comm, const Global& global, const Local& local,
                RingSharding sharding) {
  const RingCommunicator ring(comm);
  ring_shard(space, ring, global, local, sharding);
}

/// The inverse of ring_shard, on every rank: each rank's `local` slice is
/// written into its place in `global` (shapes as in ring_shard; `global`
/// may live in any memory space). Collective; goes through host memory and
/// MPI_Allgatherv, so it fences `space` before reading `local` and after
/// writing `global`. For tests, checkpoints and output, not for hot loops.
template <class ExecSpace, class Local, class Global>
void ring_gather(const ExecSpace& space, const RingCommunicator& comm, const Local& local,
                 const Global& global, RingSharding sharding) {
  static_assert(Kokkos::is_view<Global>::value && Kokkos::is_view<Local>::value,
                "kfa::ring_gather: global and local must be Kokkos::Views");
  static_assert(Impl::view_rank<Local>() == 4 || Impl::view_rank<Local>() == 3,
                "kfa::ring_gather: local must be a rank-4 [batch][seqlen][heads][head_dim] or "
                "rank-3 [batch][heads][seqlen] View");
  static_assert(Impl::view_rank<Global>() == Impl::view_rank<Local>(),
                "kfa::ring_gather: global and local must have the same rank");
  static_assert(
      std::is_same<typename Local::non_const_value_type, typename Global::value_type>::value,
      "kfa::ring_gather: global must be non-const, with local's value type");
  const char* function = "kfa::ring_gather";
  Impl::ProfilingRegion region(function);
  using T = typename Global::value_type;
  const Impl::RingLayout layout =
      Impl::agree_on_shard_arguments<T>(function, comm, local, global, sharding);
  Impl::ring_gather_impl(space, comm, layout, local, global, function);
}

template <class ExecSpace, class Local, class Global>
void ring_gather(const ExecSpace& space, MPI_Comm comm, const Local& local, const Global& global,
                 RingSharding sharding) {
  const RingCommunicator ring(comm);
  ring_gather(space, ring, local, global, sharding);
}

}  // namespace kfa

#endif
