#include <kfa/version.hpp>

#include <Kokkos_Core.hpp>

#include <sstream>

namespace kfa {

std::string version() { return KFA_VERSION_STRING; }

std::string configuration() {
  std::ostringstream out;
  out << "kfa " << KFA_VERSION_STRING << ", Kokkos " << KOKKOS_VERSION / 10000 << "."
      << KOKKOS_VERSION / 100 % 100 << "." << KOKKOS_VERSION % 100 << ", backends:";
#ifdef KOKKOS_ENABLE_SERIAL
  out << " Serial";
#endif
#ifdef KOKKOS_ENABLE_OPENMP
  out << " OpenMP";
#endif
#ifdef KOKKOS_ENABLE_CUDA
  out << " Cuda";
#endif
  out << ", MPI " << (KFA_ENABLE_MPI ? "on" : "off");
  out << ", NCCL " << (KFA_ENABLE_NCCL ? "on" : "off");
  return out.str();
}

}  // namespace kfa
