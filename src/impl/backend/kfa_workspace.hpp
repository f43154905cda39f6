#ifndef KFA_WORKSPACE_HPP
#define KFA_WORKSPACE_HPP

// Temporary device memory of one call (the backward's D and its fp32 dQ
// accumulator). On CUDA a cudaMalloc and cudaFree per call cost more than
// the O(N) kernels that use the memory (cudaFree also waits for the whole
// device), so each slot is cached per CUDA stream and only grows; the cache
// is emptied by kfa::release_workspaces() and at Kokkos::finalize. Work on
// one stream runs in order, so a call may reuse the buffer of the previous
// call on its stream; calls on other streams get their own. Host backends
// allocate per call (a host allocation is cheap next to a host kernel).

#include <Kokkos_Core.hpp>
#include <cstddef>
#include <mutex>
#include <string>
#include <vector>

namespace kfa {
namespace Impl {

/// What a workspace holds; each slot of a stream is cached separately.
enum class WorkspaceSlot { delta, dq_accum };

/// Bytes of device memory from `space`'s memory space, valid until the
/// returned View (which owns or shares them) is destroyed. Contents are
/// undefined. 256-byte aligned.
template <class ExecSpace>
Kokkos::View<unsigned char *, typename ExecSpace::memory_space> workspace(const ExecSpace &space,
                                                                          WorkspaceSlot,
                                                                          std::size_t bytes,
                                                                          const char *label) {
  return Kokkos::View<unsigned char *, typename ExecSpace::memory_space>(
      Kokkos::view_alloc(space, Kokkos::WithoutInitializing, std::string(label)), bytes);
}

#ifdef KOKKOS_ENABLE_CUDA
/// The cached CUDA buffers: one per (stream, slot).
struct CudaWorkspaceCache {
  using buffer_t = Kokkos::View<unsigned char *, Kokkos::CudaSpace>;
  struct Entry {
    cudaStream_t stream;
    WorkspaceSlot slot;
    buffer_t buffer;
  };
  std::mutex mutex;
  std::vector<Entry> entries;
  bool hooked = false;

  static CudaWorkspaceCache &instance() {
    static CudaWorkspaceCache cache;
    return cache;
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mutex);
    entries.clear();
  }
};

inline Kokkos::View<unsigned char *, Kokkos::CudaSpace> workspace(const Kokkos::Cuda &space,
                                                                  WorkspaceSlot slot,
                                                                  std::size_t bytes,
                                                                  const char *label) {
  CudaWorkspaceCache &cache = CudaWorkspaceCache::instance();
  std::lock_guard<std::mutex> lock(cache.mutex);
  if (!cache.hooked) {
    // Views must be gone before Kokkos is.
    Kokkos::push_finalize_hook([] { CudaWorkspaceCache::instance().clear(); });
    cache.hooked = true;
  }
  const cudaStream_t stream = space.cuda_stream();
  for (auto &entry : cache.entries) {
    if (entry.stream != stream || entry.slot != slot) continue;
    if (entry.buffer.extent(0) < bytes) {
      // Grown: the old buffer is freed once no call holds it (cudaFree waits
      // for the device, so work already enqueued on it finishes first).
      entry.buffer = CudaWorkspaceCache::buffer_t();
      entry.buffer = CudaWorkspaceCache::buffer_t(
          Kokkos::view_alloc(space, Kokkos::WithoutInitializing, std::string(label)), bytes);
    }
    return entry.buffer;
  }
  cache.entries.push_back(
      {stream, slot,
       CudaWorkspaceCache::buffer_t(
           Kokkos::view_alloc(space, Kokkos::WithoutInitializing, std::string(label)), bytes)});
  return cache.entries.back().buffer;
}
#endif

/// Frees every cached workspace (CUDA); no-op elsewhere. Buffers that a call
/// in flight holds are freed when it returns.
inline void release_workspaces() {
#ifdef KOKKOS_ENABLE_CUDA
  CudaWorkspaceCache::instance().clear();
#endif
}

/// A typed, unmanaged View with these extents over the start of `bytes`.
template <class ViewType, class Bytes, class... Extents>
ViewType workspace_view(const Bytes &bytes, Extents... extents) {
  return ViewType(reinterpret_cast<typename ViewType::pointer_type>(bytes.data()), extents...);
}

/// Bytes of `values` elements of T, rounded up to 256.
template <class T>
constexpr std::size_t workspace_bytes(std::size_t values) {
  return (values * sizeof(T) + 255) / 256 * 256;
}

}  // namespace Impl
}  // namespace kfa

#endif
