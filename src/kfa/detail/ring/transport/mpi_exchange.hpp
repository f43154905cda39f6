#ifndef KFA_DETAIL_RING_TRANSPORT_MPI_EXCHANGE_HPP
#define KFA_DETAIL_RING_TRANSPORT_MPI_EXCHANGE_HPP

// The transport of ring attention: one exchange moves a block to the next
// rank while the block of the previous rank arrives, in the background of
// the compute. start() posts it, progress() lets it advance, wait() ends it.
// Implementations: MPI on the device buffers (CUDA-aware MPI, or host
// memory), MPI through host staging buffers, NCCL (kfa/detail/ring/transport/nccl_exchange.hpp).

#include <kfa/kfa_config.hpp>
#include <kfa/ring_communicator.hpp>
#include <kfa/ring_options.hpp>

#include <kfa/detail/ring/transport/host_staging.hpp>

#include <Kokkos_Core.hpp>

#include <mpi.h>
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace kfa {
namespace Impl {

/// One exchange around the ring: `send_bytes` from `send` go to the next
/// rank while `recv_bytes` from the previous rank arrive in `recv`. Both
/// buffers live in the execution space's memory.
struct RingMessage {
  const void* send;
  std::size_t send_bytes;
  void* recv;
  std::size_t recv_bytes;
};

template <class ExecSpace>
class RingExchange {
 public:
  virtual ~RingExchange() = default;
  /// Posts the exchange. The data to send may have been written by work
  /// still enqueued on `space`; `recv` must not be in use by such work.
  virtual void start(const ExecSpace& space, const RingMessage& message) = 0;
  /// Lets a posted exchange advance (called while the device computes).
  virtual void progress() = 0;
  /// Ends the posted exchange (no-op when none is posted): afterwards the
  /// received block is visible to work enqueued on `space`, and both
  /// buffers may be reused.
  virtual void wait(const ExecSpace& space) = 0;
  virtual const char* name() const = 0;
};

/// True when the MPI library can read and write CUDA device memory, asked
/// at run time where the MPI offers a query (Open MPI's MPIX extension,
/// MPICH >= 4); false where it cannot be asked.
inline bool mpi_is_cuda_aware() {
#if defined(OMPI_HAVE_MPI_EXT_CUDA) && OMPI_HAVE_MPI_EXT_CUDA
  return MPIX_Query_cuda_support() == 1;
#elif defined(MPIX_GPU_SUPPORT_CUDA)
  int supported = 0;
  MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA, &supported);
  return supported == 1;
#else
  return false;
#endif
}

/// MPI point-to-point exchange. Direct: MPI reads and writes the device
/// buffers. Staged: the block is copied to a pinned host buffer, sent from
/// there, received into another and copied back; the copies are enqueued on
/// the execution space and the network transfer overlaps the compute.
template <class ExecSpace>
class MpiExchange final : public RingExchange<ExecSpace> {
 public:
  using memory_space = typename ExecSpace::memory_space;
  using staging_space = typename host_staging_space<memory_space>::type;
  using unmanaged = Kokkos::MemoryTraits<Kokkos::Unmanaged>;

  /// Messages are cut into pieces of at most this many bytes (MPI counts
  /// are int); pieces with one tag are matched in order.
  static constexpr std::size_t kPieceBytes = std::size_t(1) << 30;

  MpiExchange(const RingCommunicator& comm, int tag, bool staged)
      : m_comm(comm.comm()),
        m_next(comm.next()),
        m_prev(comm.prev()),
        m_tag(tag),
        m_staged(staged) {}

  ~MpiExchange() override {
    // A posted exchange must not outlive its buffers (only when unwinding).
    if (!m_requests.empty()) {
      MPI_Waitall(static_cast<int>(m_requests.size()), m_requests.data(), MPI_STATUSES_IGNORE);
    }
  }

  void start(const ExecSpace& space, const RingMessage& message) override {
    if (!m_staged) {
      // MPI reads the send buffer itself: the kernels that wrote it must be done.
      space.fence();
      post(message.send, message.send_bytes, message.recv, message.recv_bytes);
      return;
    }
    take(space, m_send_host, WorkspaceSlot::staging_send, message.send_bytes,
         "kfa::ring::staging_send");
    take(space, m_recv_host, WorkspaceSlot::staging_recv, message.recv_bytes,
         "kfa::ring::staging_recv");
    Kokkos::deep_copy(space, host_bytes(m_send_host, message.send_bytes),
                      device_bytes(message.send, message.send_bytes));
    // MPI reads host memory: the copy, and the copy back of the previous
    // exchange out of the receive buffer reposted below, must be done.
    space.fence();
    post(m_send_host.data(), message.send_bytes, m_recv_host.data(), message.recv_bytes);
    m_pending_recv = message.recv;
    m_pending_bytes = message.recv_bytes;
  }

  void progress() override {
    if (m_requests.empty()) return;
    int done = 0;
    MPI_Testall(static_cast<int>(m_requests.size()), m_requests.data(), &done, MPI_STATUSES_IGNORE);
  }

  void wait(const ExecSpace& space) override {
    if (!m_requests.empty()) {
      MPI_Waitall(static_cast<int>(m_requests.size()), m_requests.data(), MPI_STATUSES_IGNORE);
      m_requests.clear();
    }
    if (m_pending_recv != nullptr) {
      Kokkos::deep_copy(space, device_bytes(m_pending_recv, m_pending_bytes),
                        host_bytes(m_recv_host, m_pending_bytes));
      m_pending_recv = nullptr;
    }
  }

  const char* name() const override {
    return m_staged ? "mpi (host-staged)" : "mpi (device buffers)";
  }

 private:
  using HostBytes = Kokkos::View<unsigned char*, staging_space>;

  /// A staging buffer of at least `bytes` (staging_buffer: cached on CUDA).
  void take(const ExecSpace& space, HostBytes& buffer, WorkspaceSlot slot, std::size_t bytes,
            const char* label) const {
    if (buffer.extent(0) >= bytes) return;
    buffer = HostBytes();  // not held while asking, so the cache grows its own
    buffer = staging_buffer(space, m_tag, slot, bytes, label);
  }
  static Kokkos::View<char*, staging_space, unmanaged> host_bytes(const HostBytes& buffer,
                                                                  std::size_t bytes) {
    return Kokkos::View<char*, staging_space, unmanaged>(reinterpret_cast<char*>(buffer.data()),
                                                         bytes);
  }
  static Kokkos::View<char*, memory_space, unmanaged> device_bytes(void* data, std::size_t bytes) {
    return Kokkos::View<char*, memory_space, unmanaged>(static_cast<char*>(data), bytes);
  }
  static Kokkos::View<const char*, memory_space, unmanaged> device_bytes(const void* data,
                                                                         std::size_t bytes) {
    return Kokkos::View<const char*, memory_space, unmanaged>(static_cast<const char*>(data),
                                                              bytes);
  }

  void post(const void* send, std::size_t send_bytes, void* recv, std::size_t recv_bytes) {
    for (std::size_t offset = 0; offset < recv_bytes; offset += kPieceBytes) {
      const std::size_t n = recv_bytes - offset < kPieceBytes ? recv_bytes - offset : kPieceBytes;
      m_requests.emplace_back();
      MPI_Irecv(static_cast<char*>(recv) + offset, static_cast<int>(n), MPI_BYTE, m_prev, m_tag,
                m_comm, &m_requests.back());
    }
    for (std::size_t offset = 0; offset < send_bytes; offset += kPieceBytes) {
      const std::size_t n = send_bytes - offset < kPieceBytes ? send_bytes - offset : kPieceBytes;
      m_requests.emplace_back();
      MPI_Isend(static_cast<const char*>(send) + offset, static_cast<int>(n), MPI_BYTE, m_next,
                m_tag, m_comm, &m_requests.back());
    }
  }

  MPI_Comm m_comm;
  int m_next, m_prev, m_tag;
  bool m_staged;
  std::vector<MPI_Request> m_requests;
  HostBytes m_send_host, m_recv_host;
  void* m_pending_recv = nullptr;
  std::size_t m_pending_bytes = 0;
};

/// Whether MPI can be handed the memory of ExecSpace directly.
template <class ExecSpace>
bool mpi_takes_device_buffers() {
  return Kokkos::SpaceAccessibility<Kokkos::HostSpace,
                                    typename ExecSpace::memory_space>::accessible ||
         mpi_is_cuda_aware();
}

}  // namespace Impl
}  // namespace kfa

#endif
