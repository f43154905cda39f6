#include <kfa/kfa_config.hpp>
#include <kfa/version.hpp>

#include <Kokkos_Core.hpp>

#include <gtest/gtest.h>

#include <iostream>

#if KFA_ENABLE_MPI
#include <mpi.h>
#endif

int main(int argc, char* argv[]) {
#if KFA_ENABLE_MPI
  MPI_Init(&argc, &argv);
#endif
  int result = 0;
  {
    Kokkos::ScopeGuard guard(argc, argv);
    ::testing::InitGoogleTest(&argc, argv);
    std::cout << kfa::configuration() << "\n";
    result = RUN_ALL_TESTS();
  }
#if KFA_ENABLE_MPI
  MPI_Finalize();
#endif
  return result;
}
