#ifndef KFA_DETAIL_NN_ALLREDUCE_KERNELS_HPP
#define KFA_DETAIL_NN_ALLREDUCE_KERNELS_HPP

// kfa::nn::allreduce_gradients: the gradients are packed in list order into
// one buffer of the accumulator type (16-bit gradients are summed in fp32,
// which MPI knows and adds, and rounded once at the end), reduced over the
// ranks by MPI (one MPI_Allreduce per piece of
// at most 2^30 values, MPI counts being int; or an MPI_Allgather and a sum in
// rank order), and unpacked, divided by the rank count for a mean. Device
// buffers go to MPI directly when it is CUDA-aware, otherwise through a host
// copy, as ring attention's transport does.

#include <kfa/nn/parameter.hpp>
#include <kfa/types.hpp>

#include <kfa/detail/common/checks.hpp>
#include <kfa/detail/common/compat.hpp>
#include <kfa/detail/ring/transport/mpi_exchange.hpp>

#include <Kokkos_Core.hpp>

#include <mpi.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

namespace kfa {
namespace Impl {

template <class T>
MPI_Datatype nn_mpi_type() {
  return std::is_same<T, double>::value ? MPI_DOUBLE : MPI_FLOAT;
}

/// sum(i) = gathered(i) + gathered(len + i) + ... over `ranks` rows of
/// `len`, added in rank order (the same bits on every rank).
template <class ExecSpace, class T>
struct RankOrderedSum {
  using memory_space = typename ExecSpace::memory_space;
  Kokkos::View<const T*, memory_space> m_gathered;
  using sum_view = Kokkos::View<T*, memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  sum_view m_sum;
  std::size_t m_len;
  int m_ranks;
  KOKKOS_FUNCTION void operator()(const std::int64_t i) const {
    T s = m_gathered(i);
    for (int r = 1; r < m_ranks; ++r) s += m_gathered(std::size_t(r) * m_len + i);
    m_sum(i) = s;
  }
};

/// buffer(offset + i) = grad(i) in the accumulator type: one parameter's
/// gradient (of T or fp32) into the packed buffer.
template <class Acc, class G, class MemorySpace>
struct GradientPack {
  Kokkos::View<Acc*, MemorySpace> m_buffer;
  Kokkos::View<const G*, MemorySpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> m_grad;
  std::size_t m_offset;
  KOKKOS_FUNCTION void operator()(const std::int64_t i) const {
    m_buffer(m_offset + i) = to_acc<Acc>(m_grad(i));
  }
};

/// grad(i) = buffer(offset + i) / divisor: one parameter out of the packed,
/// reduced buffer, rounded once to the gradient's type.
template <class Acc, class G, class MemorySpace>
struct GradientUnpack {
  Kokkos::View<const Acc*, MemorySpace> m_buffer;
  Kokkos::View<G*, MemorySpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> m_grad;
  std::size_t m_offset;
  Acc m_divisor;
  KOKKOS_FUNCTION void operator()(const std::int64_t i) const {
    m_grad(i) = from_acc<G>(m_buffer(m_offset + i) / m_divisor);
  }
};

/// Calls f(gradient View) with a parameter's gradient: grad_fp32 where the
/// layer keeps fp32 gradients, else grad.
template <class T, class MemorySpace, class F>
void nn_with_gradient(const nn::Parameter<T, MemorySpace>& p, F&& f) {
  if (p.grad_fp32.extent(0) > 0)
    f(p.grad_fp32);
  else
    f(p.grad);
}

/// Reduces data[0, n) over `comm` in place, on memory that `exec` can run
/// kernels on and MPI can read (fenced by the caller).
template <class Exec, class T>
void nn_reduce_in_place(const Exec& exec, T* data, std::size_t n, MPI_Comm comm, int ranks,
                        bool deterministic) {
  using memory_space = typename Exec::memory_space;
  constexpr std::size_t kPiece = std::size_t(1) << 30;
  const MPI_Datatype type = nn_mpi_type<T>();
  Kokkos::View<T*, memory_space> gathered;
  if (deterministic) {
    gathered = Kokkos::View<T*, memory_space>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing,
                           std::string("kfa::nn::allreduce_gradients::gathered")),
        std::size_t(ranks) * std::min(n, kPiece));
  }
  for (std::size_t offset = 0; offset < n; offset += kPiece) {
    const std::size_t len = std::min(n - offset, kPiece);
    if (!deterministic) {
      MPI_Allreduce(MPI_IN_PLACE, data + offset, static_cast<int>(len), type, MPI_SUM, comm);
      continue;
    }
    MPI_Allgather(data + offset, static_cast<int>(len), type, gathered.data(),
                  static_cast<int>(len), type, comm);
    const typename RankOrderedSum<Exec, T>::sum_view sum(data + offset, len);
    Kokkos::parallel_for("kfa::nn::allreduce_gradients::rank_ordered_sum",
                         Kokkos::RangePolicy<Exec, Kokkos::IndexType<std::int64_t>>(
                             exec, 0, static_cast<std::int64_t>(len)),
                         RankOrderedSum<Exec, T>{gathered, sum, len, ranks});
    // The next piece's MPI_Allgather overwrites `gathered`; the caller reads `data`.
    exec.fence();
  }
}

template <class ExecSpace, class T, class MemorySpace>
void allreduce_gradients_impl(const char* function, const ExecSpace& space,
                              const std::vector<nn::Parameter<T, MemorySpace>>& parameters,
                              MPI_Comm comm, bool deterministic, bool host_staged, bool mean) {
  if (comm == MPI_COMM_NULL) throw_invalid(function, "comm must not be MPI_COMM_NULL");
  int ranks = 1;
  MPI_Comm_size(comm, &ranks);
  using acc_t = accumulator_t<T>;
  std::size_t n = 0;
  for (const auto& p : parameters) n += std::max(p.grad.extent(0), p.grad_fp32.extent(0));
  // Every rank must reduce the same buffer: agree on its shape first, so a
  // mismatch throws everywhere instead of corrupting or hanging.
  long long shape[4] = {static_cast<long long>(parameters.size()), static_cast<long long>(n),
                        -static_cast<long long>(parameters.size()), -static_cast<long long>(n)};
  MPI_Allreduce(MPI_IN_PLACE, shape, 4, MPI_LONG_LONG, MPI_MAX, comm);
  if (shape[0] != -shape[2] || shape[1] != -shape[3]) {
    std::ostringstream out;
    out << "every rank must pass the same parameters; between " << -shape[2] << " and "
        << shape[0] << " parameters of between " << -shape[3] << " and " << shape[1]
        << " values in all (this rank: " << parameters.size() << " parameters, " << n
        << " values)";
    throw_invalid(function, out.str());
  }
  if (n == 0) return;

  using buffer_type = Kokkos::View<acc_t*, MemorySpace>;
  const buffer_type buffer(Kokkos::view_alloc(Kokkos::WithoutInitializing,
                                              std::string("kfa::nn::allreduce_gradients::buffer")),
                           n);
  std::size_t offset = 0;
  for (const auto& p : parameters) {
    nn_with_gradient(p, [&](const auto& grad) {
      using G = typename std::decay_t<decltype(grad)>::non_const_value_type;
      const std::size_t len = grad.extent(0);
      if (len > 0) {
        Kokkos::parallel_for("kfa::nn::allreduce_gradients::pack",
                             Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(
                                 space, 0, static_cast<std::int64_t>(len)),
                             GradientPack<acc_t, G, MemorySpace>{buffer, grad, offset});
      }
      offset += len;
    });
  }
  constexpr bool host_memory = Kokkos::SpaceAccessibility<Kokkos::HostSpace,
                                                          MemorySpace>::accessible;
  const bool staged = host_staged || (!host_memory && !mpi_is_cuda_aware());
  Kokkos::View<acc_t*, Kokkos::HostSpace> host;
  if (staged) {
    host = Kokkos::View<acc_t*, Kokkos::HostSpace>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing,
                           std::string("kfa::nn::allreduce_gradients::host_buffer")),
        n);
    Kokkos::deep_copy(space, host, buffer);
    // MPI reads the host copy.
    space.fence();
    nn_reduce_in_place(Kokkos::DefaultHostExecutionSpace(), host.data(), n, comm, ranks,
                       deterministic);
    Kokkos::deep_copy(space, buffer, host);
  } else {
    // MPI reads the packed buffer.
    space.fence();
    nn_reduce_in_place(space, buffer.data(), n, comm, ranks, deterministic);
  }
  const acc_t divisor = mean ? static_cast<acc_t>(ranks) : acc_t(1);
  offset = 0;
  for (const auto& p : parameters) {
    nn_with_gradient(p, [&](const auto& grad) {
      using G = typename std::decay_t<decltype(grad)>::non_const_value_type;
      const std::size_t len = grad.extent(0);
      if (len > 0) {
        Kokkos::parallel_for("kfa::nn::allreduce_gradients::unpack",
                             Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(
                                 space, 0, static_cast<std::int64_t>(len)),
                             GradientUnpack<acc_t, G, MemorySpace>{buffer, grad, offset, divisor});
      }
      offset += len;
    });
  }
  // The copy back out of the host buffer must be done before it is freed.
  if (staged) space.fence();
}

}  // namespace Impl
}  // namespace kfa

#endif
