#ifndef KFA_VERSION_HPP
#define KFA_VERSION_HPP

#include <kfa/kfa_config.hpp>

#include <string>

namespace kfa {

/// "major.minor.patch" of the kfa library that was linked.
std::string version();

/// One line describing the build: kfa and Kokkos versions, enabled backends, MPI.
std::string configuration();

}  // namespace kfa

#endif
