#ifndef KFA_NN_DISTRIBUTED_HPP
#define KFA_NN_DISTRIBUTED_HPP

// Training over MPI ranks: summing or averaging the layers' parameter
// gradients over a communicator. Built when kfa is configured with
// KFA_ENABLE_MPI=ON.

#include <kfa/kfa_config.hpp>

#if !KFA_ENABLE_MPI
#error "kfa/nn/distributed.hpp needs kfa configured with KFA_ENABLE_MPI=ON"
#endif

#include <kfa/nn/parameter.hpp>
#include <kfa/ring_communicator.hpp>

#include <kfa/detail/common/checks.hpp>
#include <kfa/detail/nn/allreduce_kernels.hpp>
#include <kfa/detail/nn/checks.hpp>

#include <mpi.h>

#include <vector>

namespace kfa {
namespace nn {

/// How allreduce_gradients combines the ranks' gradients.
enum class GradientReduction {
  /// The mean over the ranks: data parallelism, where every rank's
  /// gradient is the mean over its own samples.
  mean,
  /// The sum over the ranks: sequence parallelism, where every rank holds
  /// its part of the sum over the tokens of the same samples.
  sum
};

struct GradientAllreduceOptions {
  GradientReduction reduction = GradientReduction::mean;
  /// Add the ranks' gradients in rank order (0, 1, ..., P-1) instead of in
  /// the order MPI_Allreduce picks: bitwise the same result on every rank
  /// and in every run, whatever algorithm the MPI uses. Costs P times the
  /// buffer (an MPI_Allgather).
  bool deterministic = false;
  /// Stage the buffer through host memory even when MPI could take device
  /// memory (for MPIs whose GPU support is unreliable). Without a CUDA-aware
  /// MPI device buffers are always staged.
  bool host_staged = false;
};

/// Sums or averages (options.reduction) the gradients of `parameters` over
/// the ranks of `comm`, in place: every rank ends with the same values.
/// The gradients are packed in list order into one buffer and reduced with
/// one MPI call, so every rank must pass a list of the same tensors in the
/// same order (a layer's parameters(), or several layers' concatenated).
///
/// Collective over `comm`. The ranks first agree on the number of
/// parameters and values: a mismatch throws std::invalid_argument on every
/// rank with nothing written. Work is enqueued on `space`; it is fenced
/// before MPI reads the packed buffer and, with host staging (device memory
/// and an MPI that is not CUDA-aware, or options.host_staged), after the
/// copy back. One buffer of the total gradient size (P times that with
/// options.deterministic) is allocated per call, in kfa::accumulator_t<T>:
/// 16-bit gradients are summed in fp32 and rounded once. Each parameter's
/// gradient is its grad_fp32 where the layer keeps fp32 gradients, else its
/// grad.
template <class ExecSpace, class T, class MemorySpace>
void allreduce_gradients(const ExecSpace& space,
                         const std::vector<Parameter<T, MemorySpace>>& parameters, MPI_Comm comm,
                         const GradientAllreduceOptions& options = {}) {
  static_assert(Kokkos::is_execution_space<ExecSpace>::value,
                "kfa::nn::allreduce_gradients: space must be a Kokkos execution space instance");
  static_assert(Impl::nn_value_type_ok<T>(),
                "kfa::nn::allreduce_gradients: parameters must hold double, float, kfa::half "
                "or kfa::bfloat16");
  static_assert(Kokkos::SpaceAccessibility<ExecSpace, MemorySpace>::accessible,
                "kfa::nn::allreduce_gradients: the parameters must be accessible from the "
                "execution space");
  const char* function = "kfa::nn::allreduce_gradients";
  Impl::ProfilingRegion region(function);
  Impl::allreduce_gradients_impl(function, space, parameters, comm, options.deterministic,
                                 options.host_staged,
                                 options.reduction == GradientReduction::mean);
}

/// allreduce_gradients over the ranks of a RingCommunicator (the one a
/// sequence-parallel layer runs its ring on).
template <class ExecSpace, class T, class MemorySpace>
void allreduce_gradients(const ExecSpace& space,
                         const std::vector<Parameter<T, MemorySpace>>& parameters,
                         const RingCommunicator& comm,
                         const GradientAllreduceOptions& options = {}) {
  allreduce_gradients(space, parameters, comm.comm(), options);
}

}  // namespace nn
}  // namespace kfa

#endif
