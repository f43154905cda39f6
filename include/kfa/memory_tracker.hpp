#ifndef KFA_MEMORY_TRACKER_HPP
#define KFA_MEMORY_TRACKER_HPP

/// Counts the bytes Kokkos allocates (every memory space) through the Kokkos
/// Tools allocation callbacks: live bytes, and the peak since reset(). One
/// tracker at a time (it owns those callbacks); not for use beside a Kokkos
/// Tools library that also takes allocation events.

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <map>
#include <mutex>

namespace kfa {
namespace Experimental {

class MemoryTracker {
 public:
  MemoryTracker() {
    Kokkos::Tools::Experimental::set_allocate_data_callback(&on_allocate);
    Kokkos::Tools::Experimental::set_deallocate_data_callback(&on_deallocate);
  }
  ~MemoryTracker() {
    Kokkos::Tools::Experimental::set_allocate_data_callback(nullptr);
    Kokkos::Tools::Experimental::set_deallocate_data_callback(nullptr);
  }
  MemoryTracker(const MemoryTracker&) = delete;
  MemoryTracker& operator=(const MemoryTracker&) = delete;

  /// Starts a new measurement: peak() is then relative to the bytes live now.
  void reset() {
    std::lock_guard<std::mutex> lock(state().mutex);
    state().base = state().current;
    state().peak = state().current;
  }
  /// Highest number of bytes live since reset(), beyond those live at reset().
  std::int64_t peak() const {
    std::lock_guard<std::mutex> lock(state().mutex);
    return state().peak - state().base;
  }
  std::int64_t current() const {
    std::lock_guard<std::mutex> lock(state().mutex);
    return state().current;
  }

 private:
  struct State {
    std::mutex mutex;
    std::int64_t current = 0, peak = 0, base = 0;
  };
  static State& state() {
    static State s;
    return s;
  }
  static void on_allocate(Kokkos::Tools::SpaceHandle, const char*, const void*,
                          std::uint64_t size) {
    std::lock_guard<std::mutex> lock(state().mutex);
    state().current += static_cast<std::int64_t>(size);
    if (state().current > state().peak) state().peak = state().current;
  }
  static void on_deallocate(Kokkos::Tools::SpaceHandle, const char*, const void*,
                            std::uint64_t size) {
    std::lock_guard<std::mutex> lock(state().mutex);
    state().current -= static_cast<std::int64_t>(size);
  }
};

}  // namespace Experimental
}  // namespace kfa

#endif
