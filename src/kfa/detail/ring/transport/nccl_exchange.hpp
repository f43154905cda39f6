#ifndef KFA_DETAIL_RING_TRANSPORT_NCCL_EXCHANGE_HPP
#define KFA_DETAIL_RING_TRANSPORT_NCCL_EXCHANGE_HPP

// NCCL transport of ring attention (KFA_ENABLE_NCCL, CUDA builds): the NCCL
// communicator is bootstrapped from the ring's MPI communicator (rank 0's
// unique id is broadcast over MPI) and created once per RingCommunicator.
// Transfers run on a stream of their own, ordered after the compute stream
// with events, so they overlap the kernels without host fences.

#include <kfa/kfa_config.hpp>

#include <Kokkos_Core.hpp>

#if KFA_ENABLE_NCCL && defined(KOKKOS_ENABLE_CUDA)

#include <kfa/ring_communicator.hpp>

#include <kfa/detail/ring/transport/mpi_exchange.hpp>

#include <cuda_runtime.h>
#include <nccl.h>

#include <memory>
#include <stdexcept>
#include <string>

namespace kfa {
namespace Impl {

inline void check_nccl(ncclResult_t result, const char* call) {
  if (result != ncclSuccess) {
    throw std::runtime_error(std::string("kfa::ring (NCCL transport): ") + call +
                             " failed: " + ncclGetErrorString(result));
  }
}

inline void check_cuda(cudaError_t result, const char* call) {
  if (result != cudaSuccess) {
    throw std::runtime_error(std::string("kfa::ring (NCCL transport): ") + call +
                             " failed: " + cudaGetErrorString(result));
  }
}

/// NCCL communicator over the ranks of a RingCommunicator (same rank order)
/// and the stream its transfers run on. Collective to create.
class NcclContext {
 public:
  explicit NcclContext(const RingCommunicator& comm) {
    // Rank 0 makes the id; the status travels with it so that a failure
    // there becomes an exception on every rank instead of a hang.
    struct {
      int status;
      ncclUniqueId id;
    } root{};
    if (comm.rank() == 0) root.status = static_cast<int>(ncclGetUniqueId(&root.id));
    MPI_Bcast(&root, sizeof(root), MPI_BYTE, 0, comm.comm());
    check_nccl(static_cast<ncclResult_t>(root.status), "ncclGetUniqueId (on rank 0)");
    check_nccl(ncclCommInitRank(&m_comm, comm.size(), root.id, comm.rank()), "ncclCommInitRank");
    check_cuda(cudaStreamCreateWithFlags(&m_stream, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  ~NcclContext() {
    cudaStreamDestroy(m_stream);
    ncclCommDestroy(m_comm);
  }
  NcclContext(const NcclContext&) = delete;
  NcclContext& operator=(const NcclContext&) = delete;

  ncclComm_t comm() const { return m_comm; }
  cudaStream_t stream() const { return m_stream; }

 private:
  ncclComm_t m_comm = nullptr;
  cudaStream_t m_stream = nullptr;
};

/// The ring's NCCL context, created on first use (collective).
inline NcclContext& nccl_context(const RingCommunicator& comm) {
  std::shared_ptr<NcclContext>& slot = comm.impl_nccl_context();
  if (!slot) slot = std::make_shared<NcclContext>(comm);
  return *slot;
}

/// Exchanges through ncclSend/ncclRecv on the context's stream. Every
/// exchange of a ring (K/V and dK/dV alike) goes through that one stream, so
/// the NCCL operations are issued in the same order on every rank.
class NcclExchange final : public RingExchange<Kokkos::Cuda> {
 public:
  explicit NcclExchange(const RingCommunicator& comm)
      : m_context(nccl_context(comm)), m_next(comm.next()), m_prev(comm.prev()) {
    check_cuda(cudaEventCreateWithFlags(&m_ready, cudaEventDisableTiming), "cudaEventCreate");
    check_cuda(cudaEventCreateWithFlags(&m_done, cudaEventDisableTiming), "cudaEventCreate");
  }
  ~NcclExchange() override {
    if (m_posted) cudaEventSynchronize(m_done);
    cudaEventDestroy(m_ready);
    cudaEventDestroy(m_done);
  }

  void start(const Kokkos::Cuda& space, const RingMessage& message) override {
    // The transfer starts once the kernels enqueued so far (which wrote the
    // send buffer and read the receive buffer) are done; no host fence.
    check_cuda(cudaEventRecord(m_ready, space.cuda_stream()), "cudaEventRecord");
    check_cuda(cudaStreamWaitEvent(m_context.stream(), m_ready, 0), "cudaStreamWaitEvent");
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    if (message.send_bytes > 0)
      check_nccl(ncclSend(message.send, message.send_bytes, ncclUint8, m_next, m_context.comm(),
                          m_context.stream()),
                 "ncclSend");
    if (message.recv_bytes > 0)
      check_nccl(ncclRecv(message.recv, message.recv_bytes, ncclUint8, m_prev, m_context.comm(),
                          m_context.stream()),
                 "ncclRecv");
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
    check_cuda(cudaEventRecord(m_done, m_context.stream()), "cudaEventRecord");
    m_posted = true;
  }

  void progress() override {}

  void wait(const Kokkos::Cuda&) override {
    // Blocking on the host keeps the ring's timing honest (what is left of
    // the transfer after the compute is exposed) and frees both buffers.
    if (!m_posted) return;
    check_cuda(cudaEventSynchronize(m_done), "cudaEventSynchronize");
    m_posted = false;
  }

  const char* name() const override { return "nccl"; }

 private:
  NcclContext& m_context;
  int m_next, m_prev;
  cudaEvent_t m_ready = nullptr, m_done = nullptr;
  bool m_posted = false;
};

}  // namespace Impl
}  // namespace kfa

#endif

#endif
