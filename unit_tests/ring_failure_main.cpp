// A rank that throws inside a ring call after the argument agreement (an
// exception injected through the internal step hook on the last rank, at
// its first step, before it sends its block) must end the job with its
// error, not leave the other ranks waiting for that block.
// ctest runs it under mpiexec at 2 and 3 ranks with a timeout and expects the
// abort message; "returned" in the output means a rank got past the call.
// Argument: forward or backward.

#include <kfa/ring_attention.hpp>

#include <Kokkos_Core.hpp>
#include <mpi.h>

#include <cstdio>
#include <stdexcept>
#include <string>

int main(int argc, char* argv[]) {
  MPI_Init(&argc, &argv);
  {
    Kokkos::ScopeGuard guard(argc, argv);
    const bool backward = argc > 1 && std::string(argv[1]) == "backward";
    const kfa::RingCommunicator comm(MPI_COMM_WORLD);
    const int failing = comm.size() - 1;
    kfa::Impl::ring_step_hook() = [failing](int rank, int step) {
      if (rank == failing && step == 0) throw std::runtime_error("injected failure");
    };
    using View4 = Kokkos::View<double****, Kokkos::LayoutRight, Kokkos::HostSpace>;
    using View3 = Kokkos::View<double***, Kokkos::LayoutRight, Kokkos::HostSpace>;
    const int n = 16;
    View4 q("q", 1, n, 2, 8), k("k", 1, n, 2, 8), v("v", 1, n, 2, 8), o("o", 1, n, 2, 8);
    View4 d_o("d_o", 1, n, 2, 8), dq("dq", 1, n, 2, 8), dk("dk", 1, n, 2, 8), dv("dv", 1, n, 2, 8);
    View3 lse("lse", 1, 2, n);
    Kokkos::deep_copy(q, 0.5);
    Kokkos::deep_copy(k, 0.25);
    Kokkos::deep_copy(v, 1.0);
    Kokkos::deep_copy(d_o, 1.0);
    const Kokkos::DefaultHostExecutionSpace space;
    if (backward) {
      kfa::ring_attention_backward(space, comm, q, k, v, o, lse, d_o, dq, dk, dv);
    } else {
      kfa::ring_attention_forward(space, comm, q, k, v, o, lse);
    }
    std::printf("rank %d: the ring call returned\n", comm.rank());
  }
  MPI_Finalize();
  return 0;
}
