// Main of kfa_ring_tests, which ctest runs under mpiexec at 1-4 ranks:
// initialises MPI and Kokkos. Rank 0 prints GoogleTest's usual report, the
// other ranks only their failures, tagged with the rank; the exit status is
// the worst of all ranks.

#include <kfa/kfa_config.hpp>
#include <kfa/version.hpp>

#include <Kokkos_Core.hpp>

#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

namespace {

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : m_rank(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::printf("[rank %d] %s:%d: Failure\n%s\n", m_rank,
                result.file_name() ? result.file_name() : "?", result.line_number(),
                result.message());
    std::fflush(stdout);
  }

 private:
  int m_rank;
};

}  // namespace

int main(int argc, char* argv[]) {
  MPI_Init(&argc, &argv);
  int rank = 0, ranks = 1, result = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  {
    Kokkos::ScopeGuard guard(argc, argv);
    ::testing::InitGoogleTest(&argc, argv);
    if (rank != 0) {
      auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
      delete listeners.Release(listeners.default_result_printer());
      listeners.Append(new RankFailurePrinter(rank));
    } else {
      std::printf("%s, %d MPI rank(s)\n", kfa::configuration().c_str(), ranks);
    }
    result = RUN_ALL_TESTS();
  }
  MPI_Allreduce(MPI_IN_PLACE, &result, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return result;
}
