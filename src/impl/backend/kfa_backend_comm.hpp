#ifndef KFA_BACKEND_COMM_HPP
#define KFA_BACKEND_COMM_HPP

// Backend facts ring attention's transport needs: where host staging buffers
// live (pinned memory on CUDA, so that the copies are asynchronous DMA), and
// how to wait for an execution space while still driving MPI progress.

#include <Kokkos_Core.hpp>

namespace kfa {
namespace Impl {

/// Host memory space for staging buffers that mirror MemorySpace.
template <class MemorySpace>
struct host_staging_space {
  using type = Kokkos::HostSpace;
};
#ifdef KOKKOS_ENABLE_CUDA
template <>
struct host_staging_space<Kokkos::CudaSpace> {
  using type = Kokkos::CudaHostPinnedSpace;
};
#endif

/// Waits for everything enqueued on `space`, calling poll() until it is done.
/// MPI implementations without a progress thread only move a large message
/// forward inside MPI calls, so the host keeps calling MPI_Testall while the
/// device computes. Host backends run kernels synchronously: by the time
/// this is called they are done, and one poll is all there is room for.
template <class ExecSpace, class Poll>
void fence_polling(const ExecSpace& space, Poll&& poll) {
  poll();
  space.fence();
}

#ifdef KOKKOS_ENABLE_CUDA
template <class Poll>
void fence_polling(const Kokkos::Cuda& space, Poll&& poll) {
  while (cudaStreamQuery(space.cuda_stream()) == cudaErrorNotReady) poll();
  space.fence();
}
#endif

}  // namespace Impl
}  // namespace kfa

#endif
