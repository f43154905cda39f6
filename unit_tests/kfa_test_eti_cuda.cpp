// The test build's single instantiation of the entry points on the Cuda
// backend (see kfa_test_eti.hpp).

#include "kfa_test_eti.hpp"

#ifdef KOKKOS_ENABLE_CUDA
KFA_TEST_ETI_SPACE(, Kokkos::Cuda)
#endif
