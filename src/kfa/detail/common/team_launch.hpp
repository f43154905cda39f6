#ifndef KFA_DETAIL_COMMON_TEAM_LAUNCH_HPP
#define KFA_DETAIL_COMMON_TEAM_LAUNCH_HPP

// What every team kernel checks before its launch, portable or fused.

#include <cstddef>
#include <sstream>
#include <stdexcept>

namespace kfa {
namespace Impl {

/// Throws when a kernel's tiles do not fit the backend's team scratch.
template <class Policy>
void check_scratch(const char* kernel, int level, std::size_t bytes, int block_m,
                   int block_n, int head_dim) {
  const std::size_t max = Policy::scratch_size_max(level);
  if (bytes > max) {
    std::ostringstream out;
    out << kernel << ": tiles kBlockM=" << block_m << " kBlockN=" << block_n
        << " kHeadDim=" << head_dim << " need " << bytes << " bytes of level-" << level
        << " team scratch, the backend offers " << max;
    throw std::runtime_error(out.str());
  }
}

}  // namespace Impl
}  // namespace kfa

#endif
