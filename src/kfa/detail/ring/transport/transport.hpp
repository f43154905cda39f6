#ifndef KFA_DETAIL_RING_TRANSPORT_TRANSPORT_HPP
#define KFA_DETAIL_RING_TRANSPORT_TRANSPORT_HPP

// Picks the exchange implementation for a RingTransport option.

#include <kfa/kfa_config.hpp>
#include <kfa/ring_communicator.hpp>
#include <kfa/ring_options.hpp>

#include <kfa/detail/ring/transport/nccl_exchange.hpp>
#include <kfa/detail/ring/transport/mpi_exchange.hpp>

#include <memory>
#include <stdexcept>
#include <type_traits>

namespace kfa {
namespace Impl {

/// Whether this build can run `transport` on ExecSpace.
template <class ExecSpace>
constexpr bool ring_transport_available(RingTransport transport) {
#if KFA_ENABLE_NCCL && defined(KOKKOS_ENABLE_CUDA)
  constexpr bool nccl = std::is_same<ExecSpace, Kokkos::Cuda>::value;
#else
  constexpr bool nccl = false;
#endif
  return transport != RingTransport::nccl || nccl;
}

/// The exchange for `transport`; `tag` keeps concurrent exchanges of one
/// ring apart on the MPI communicator.
template <class ExecSpace>
std::unique_ptr<RingExchange<ExecSpace>> make_ring_exchange(const RingCommunicator& comm,
                                                            RingTransport transport, int tag) {
  switch (transport) {
    case RingTransport::nccl:
#if KFA_ENABLE_NCCL && defined(KOKKOS_ENABLE_CUDA)
      if constexpr (std::is_same<ExecSpace, Kokkos::Cuda>::value) {
        return std::make_unique<NcclExchange>(comm);
      }
#endif
      throw std::invalid_argument(
          "kfa::ring: options.transport = nccl needs kfa built with KFA_ENABLE_NCCL=ON and a "
          "Kokkos::Cuda execution space");
    case RingTransport::mpi_host_staged:
      return std::make_unique<MpiExchange<ExecSpace>>(comm, tag, true);
    case RingTransport::mpi_device_direct:
      return std::make_unique<MpiExchange<ExecSpace>>(comm, tag, false);
    case RingTransport::mpi:
    default:
      return std::make_unique<MpiExchange<ExecSpace>>(comm, tag,
                                                      !mpi_takes_device_buffers<ExecSpace>());
  }
}

}  // namespace Impl
}  // namespace kfa

#endif
