#ifndef KFA_RING_COMMUNICATOR_HPP
#define KFA_RING_COMMUNICATOR_HPP

#include <kfa/kfa_config.hpp>

#if !KFA_ENABLE_MPI
#error "kfa/ring_communicator.hpp needs kfa configured with KFA_ENABLE_MPI=ON"
#endif

#include <mpi.h>

#include <memory>

namespace kfa {

namespace Impl {
class NcclContext;
}

/// The ring of ranks that ring attention runs on: a duplicate of the
/// caller's communicator (so ring traffic never matches the caller's own
/// messages), and, once the NCCL transport is first used, the NCCL
/// communicator bootstrapped from it.
///
/// ring_attention_forward/backward accept a plain MPI_Comm and build one of
/// these per call; applications that call them repeatedly build it once
/// (MPI_Comm_dup and, above all, NCCL setup are collective and not free).
/// Construction and destruction are collective over `comm`.
class RingCommunicator {
 public:
  explicit RingCommunicator(MPI_Comm comm) {
    MPI_Comm_dup(comm, &m_comm);
    MPI_Comm_rank(m_comm, &m_rank);
    MPI_Comm_size(m_comm, &m_size);
  }
  ~RingCommunicator() {
    m_nccl.reset();
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&m_comm);
  }
  RingCommunicator(const RingCommunicator&) = delete;
  RingCommunicator& operator=(const RingCommunicator&) = delete;

  /// The duplicated communicator.
  MPI_Comm comm() const { return m_comm; }
  int rank() const { return m_rank; }
  int size() const { return m_size; }
  /// Ring neighbours: K/V blocks go to next() and come from prev().
  int next() const { return (m_rank + 1) % m_size; }
  int prev() const { return (m_rank + m_size - 1) % m_size; }

  /// Slot for the lazily created NCCL communicator (implementation detail).
  std::shared_ptr<Impl::NcclContext>& impl_nccl_context() const { return m_nccl; }

 private:
  MPI_Comm m_comm = MPI_COMM_NULL;
  int m_rank = 0, m_size = 1;
  mutable std::shared_ptr<Impl::NcclContext> m_nccl;
};

}  // namespace kfa

#endif
