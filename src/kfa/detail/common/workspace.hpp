#ifndef KFA_DETAIL_COMMON_WORKSPACE_HPP
#define KFA_DETAIL_COMMON_WORKSPACE_HPP

// Temporary device memory of one call (the backward's D and its fp32 dQ
// accumulator, ring attention's blocks and accumulators; and the pinned
// host buffers of ring exchanges staged through the host). On CUDA a
// cudaMalloc and cudaFree per call cost more than the O(N) kernels that use
// the memory (cudaFree also waits for the whole device), so each slot is
// cached per CUDA stream and only grows; the caches are emptied by
// kfa::release_workspaces() and at Kokkos::finalize. Work on one stream
// runs in order, so a call may reuse the buffer of an earlier
// call on its stream once that call has returned (its kernels, still
// queued, run first); a call that finds the buffer held by a call still
// enqueueing (another host thread) gets a private one, and calls on other
// streams get their own. Host backends allocate per call (a host
// allocation is cheap next to a host kernel).

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <mutex>
#include <string>
#include <vector>

namespace kfa {
namespace Impl {

/// What a workspace holds; each slot of a stream is cached separately
/// (dkv_grouped: the fp32 dK and dV per query head of a grouped-query
/// backward on tensor cores, summed per k/v head afterwards; tile_counter:
/// the counter from which the persistent teams of a kernel take their
/// tiles; padded_head_dim: the zero-padded operands of a call whose head
/// dim has no fused kernel of its own; ring_forward, ring_backward: every buffer of a ring attention
/// call, carved with WorkspaceParts; staging_send, staging_recv: the pinned
/// host buffers of a ring exchange staged through the host; nn_column_sums:
/// the per-chunk partial sums of kfa::nn's column sums).
enum class WorkspaceSlot {
  delta,
  dq_accum,
  dkv_grouped,
  tile_counter,
  padded_head_dim,
  ring_forward,
  ring_backward,
  staging_send,
  staging_recv,
  nn_column_sums
};

/// Cached buffers of MemorySpace, one per (key, slot). get() returns the
/// cached buffer, grown if it is too small, unless a View of it is held
/// outside the cache (a call in flight), in which case it returns a
/// private buffer of its own.
template <class MemorySpace, class Key>
class WorkspaceCache {
 public:
  using buffer_t = Kokkos::View<unsigned char*, MemorySpace>;

  buffer_t get(const Key& key, WorkspaceSlot slot, std::size_t bytes, const char* label) {
    std::lock_guard<std::mutex> lock(m_mutex);
    for (Entry& entry : m_entries) {
      if (!(entry.key == key) || entry.slot != slot) continue;
      if (entry.buffer.use_count() > 1) return allocate(bytes, label);
      if (entry.buffer.extent(0) < bytes) {
        entry.buffer = buffer_t();  // the old one freed before the new one is taken
        entry.buffer = allocate(bytes, label);
      }
      return entry.buffer;
    }
    m_entries.push_back({key, slot, allocate(bytes, label)});
    return m_entries.back().buffer;
  }

  /// Drops every cached buffer (those still held are freed when released).
  void clear() {
    std::lock_guard<std::mutex> lock(m_mutex);
    m_entries.clear();
  }

  std::size_t size() {
    std::lock_guard<std::mutex> lock(m_mutex);
    return m_entries.size();
  }

 private:
  struct Entry {
    Key key;
    WorkspaceSlot slot;
    buffer_t buffer;
  };

  static buffer_t allocate(std::size_t bytes, const char* label) {
    return buffer_t(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), bytes);
  }

  std::mutex m_mutex;
  std::vector<Entry> m_entries;
};

/// Bytes of device memory from `space`'s memory space, valid while the
/// returned View (which owns or shares them) lives. Contents are undefined.
/// Host backends: a new allocation per call.
template <class ExecSpace>
Kokkos::View<unsigned char*, typename ExecSpace::memory_space> workspace(const ExecSpace& space,
                                                                         WorkspaceSlot,
                                                                         std::size_t bytes,
                                                                         const char* label) {
  return Kokkos::View<unsigned char*, typename ExecSpace::memory_space>(
      Kokkos::view_alloc(space, Kokkos::WithoutInitializing, std::string(label)), bytes);
}

/// The process' cache of MemorySpace buffers by Key; emptied at
/// Kokkos::finalize (its Views must be gone before Kokkos is).
template <class MemorySpace, class Key>
WorkspaceCache<MemorySpace, Key>& process_workspace_cache() {
  static WorkspaceCache<MemorySpace, Key>* const cache = [] {
    auto* c = new WorkspaceCache<MemorySpace, Key>();
    Kokkos::push_finalize_hook([c] { c->clear(); });
    return c;
  }();
  return *cache;
}

#ifdef KOKKOS_ENABLE_CUDA
/// The process' CUDA device cache, keyed by stream.
inline WorkspaceCache<Kokkos::CudaSpace, cudaStream_t>& cuda_workspace_cache() {
  return process_workspace_cache<Kokkos::CudaSpace, cudaStream_t>();
}

/// CUDA: the buffer of `space`'s stream and this slot (see above).
inline Kokkos::View<unsigned char*, Kokkos::CudaSpace> workspace(const Kokkos::Cuda& space,
                                                                 WorkspaceSlot slot,
                                                                 std::size_t bytes,
                                                                 const char* label) {
  return cuda_workspace_cache().get(space.cuda_stream(), slot, bytes, label);
}

/// Pinned host buffers of host-staged ring exchanges (cudaHostAlloc costs
/// tens of milliseconds for a block), keyed by stream and message tag:
/// kfa/detail/ring/transport/host_staging.hpp's staging_buffer.
struct StagingKey {
  cudaStream_t stream;
  int tag;
  bool operator==(const StagingKey& other) const {
    return stream == other.stream && tag == other.tag;
  }
};
inline WorkspaceCache<Kokkos::CudaHostPinnedSpace, StagingKey>& cuda_staging_cache() {
  return process_workspace_cache<Kokkos::CudaHostPinnedSpace, StagingKey>();
}
#endif

/// Frees every cached workspace and staging buffer (CUDA); no-op elsewhere.
/// Buffers that a call in flight holds are freed when it returns.
inline void release_workspaces() {
#ifdef KOKKOS_ENABLE_CUDA
  cuda_workspace_cache().clear();
  cuda_staging_cache().clear();
#endif
}

/// A typed, unmanaged View with these extents over the start of `bytes`.
template <class ViewType, class Bytes, class... Extents>
ViewType workspace_view(const Bytes& bytes, Extents... extents) {
  return ViewType(reinterpret_cast<typename ViewType::pointer_type>(bytes.data()), extents...);
}

/// Bytes of `values` elements of T, rounded up to 256.
template <class T>
constexpr std::size_t workspace_bytes(std::size_t values) {
  return (values * sizeof(T) + 255) / 256 * 256;
}

/// Several typed buffers in one workspace: add<T>(values) reserves a part
/// (256-byte aligned from the workspace's start) and returns its offset;
/// bytes() is what to ask workspace() for, and part<T>(buffer, offset) the
/// part's first element in the workspace returned.
class WorkspaceParts {
 public:
  template <class T>
  std::size_t add(std::size_t values) {
    const std::size_t offset = m_bytes;
    m_bytes += workspace_bytes<T>(values);
    return offset;
  }
  std::size_t bytes() const { return m_bytes; }
  template <class T, class Bytes>
  static T* part(const Bytes& buffer, std::size_t offset) {
    return reinterpret_cast<T*>(buffer.data() + offset);
  }

 private:
  std::size_t m_bytes = 0;
};

}  // namespace Impl
}  // namespace kfa

#endif
