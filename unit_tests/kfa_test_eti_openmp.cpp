// The test build's single instantiation of the entry points on the OpenMP
// backend (see kfa_test_eti.hpp).

#include "kfa_test_eti.hpp"

#ifdef KOKKOS_ENABLE_OPENMP
KFA_TEST_ETI_SPACE(, Kokkos::OpenMP)
#endif
