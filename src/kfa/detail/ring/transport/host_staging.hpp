#ifndef KFA_DETAIL_RING_TRANSPORT_HOST_STAGING_HPP
#define KFA_DETAIL_RING_TRANSPORT_HOST_STAGING_HPP

// Backend facts ring attention's transport needs: where host staging buffers
// live (pinned memory on CUDA, so that the copies are asynchronous DMA, and
// cached between calls), and how to wait for an execution space while still
// driving MPI progress.

#include <kfa/detail/common/workspace.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <string>
#include <type_traits>

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

/// `bytes` of host staging memory for the messages with tag `tag` that an
/// exchange on `space` sends (slot staging_send) or receives
/// (staging_recv). On CUDA, pinned and cached per (stream, tag) between
/// calls like the device workspaces (kfa/detail/common/workspace.hpp): a later exchange
/// on the stream fences it before MPI writes the buffer again, so the copy
/// that an earlier call left queued out of it is done. Elsewhere a new
/// allocation per call.
template <class ExecSpace>
auto staging_buffer(const ExecSpace& space, int tag, WorkspaceSlot slot, std::size_t bytes,
                    const char* label) {
  using staging_space = typename host_staging_space<typename ExecSpace::memory_space>::type;
#ifdef KOKKOS_ENABLE_CUDA
  if constexpr (std::is_same<ExecSpace, Kokkos::Cuda>::value &&
                std::is_same<staging_space, Kokkos::CudaHostPinnedSpace>::value) {
    return cuda_staging_cache().get({space.cuda_stream(), tag}, slot, bytes, label);
  } else
#endif
  {
    (void)space;
    (void)tag;
    (void)slot;
    return Kokkos::View<unsigned char*, staging_space>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), bytes);
  }
}

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
