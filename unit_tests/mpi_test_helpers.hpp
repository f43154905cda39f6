#ifndef KFA_MPI_TEST_HELPERS_HPP
#define KFA_MPI_TEST_HELPERS_HPP

// What the tests that run under mpiexec share.

#include <mpi.h>

namespace kfa_test {

inline int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}
inline int world_size() {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

}  // namespace kfa_test

#endif
