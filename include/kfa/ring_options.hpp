#ifndef KFA_RING_OPTIONS_HPP
#define KFA_RING_OPTIONS_HPP

#include <kfa/options.hpp>

#include <string>
#include <vector>

namespace kfa {

/// How one sequence of global length N is cut into the ranks' local slices.
enum class RingSharding {
  /// Rank r holds one contiguous slice; the slices follow rank order and may
  /// have any lengths (ring_local_seqlen gives a near-even split). Causal
  /// work is unbalanced: the last rank does P times the work of the first.
  contiguous,
  /// The sequence is cut into 2P equal chunks and rank r holds chunks r and
  /// 2P-1-r, in that order (local length N/P). Causal work is the same on
  /// every rank at every ring step. Needs N divisible by 2P.
  zigzag
};

/// How K/V blocks (and dK/dV accumulators) travel around the ring.
enum class RingTransport {
  /// MPI point-to-point. Device buffers go to MPI directly when MPI is
  /// CUDA-aware (queried at run time) or the memory is host memory,
  /// otherwise through pinned host mirrors.
  mpi,
  /// MPI through host mirror buffers, even when MPI could take the device
  /// buffers (for MPIs whose GPU support is unreliable, and for testing).
  mpi_host_staged,
  /// MPI on device buffers without asking MPI whether it can (for MPIs
  /// that have no CUDA-awareness query but are CUDA-aware).
  mpi_device_direct,
  /// NCCL send/receive on device buffers, bootstrapped from the MPI
  /// communicator. Needs kfa built with KFA_ENABLE_NCCL and a Kokkos::Cuda
  /// execution space, and at most one rank per GPU.
  nccl
};

namespace Experimental {

/// Host-clock timings of one ring_attention_forward/backward call, filled
/// when RingOptions::profile points at one. Per ring step:
/// exposed_comm_seconds is the time blocked waiting for the step's exchanges
/// after its kernels finished (communication not hidden behind the compute;
/// a wait after the last step counts to the last step); compute_seconds is
/// the rest of the step: posting the exchanges, enqueueing the kernels and
/// waiting for them while driving MPI progress.
struct RingProfile {
  std::vector<double> compute_seconds;
  std::vector<double> exposed_comm_seconds;
  /// Whole call, from the argument checks to the last kernel enqueued.
  double total_seconds = 0;
  /// The transport that ran: "mpi (device buffers)", "mpi (host-staged)", "nccl".
  std::string transport;
};

}  // namespace Experimental

/// Options of ring attention: the single-rank options (applied to the
/// global sequence: causal means global key j is visible to global query i
/// iff j <= i), plus the sharding and the transport. Every rank must pass
/// the same values. The sliding window (window_left, window_right) and
/// dropout (dropout_p) are not supported and must stay off: the ring's
/// fused calls see chunk-local positions (std::invalid_argument otherwise).
struct RingOptions : AttentionOptions {
  RingSharding sharding = RingSharding::contiguous;
  RingTransport transport = RingTransport::mpi;
  /// Optional per-step timings of this rank (not compared across ranks).
  Experimental::RingProfile* profile = nullptr;
};

}  // namespace kfa

#endif
