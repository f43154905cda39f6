#include <kfa/detail/backend/cuda/tensor_core_gemm.hpp>

#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace kfa {
namespace Impl {

namespace {

// Every handle made, so that Kokkos::finalize destroys them while the CUDA
// context is still alive (a static destructor would run after it is gone).
std::mutex handles_mutex;
std::vector<cublasHandle_t> all_handles;
bool finalize_hook_set = false;
// Bumped at finalize: a thread's cached handles from before are stale.
unsigned long generation = 0;

void destroy_handles() {
  std::lock_guard<std::mutex> lock(handles_mutex);
  for (cublasHandle_t h : all_handles) cublasDestroy(h);
  all_handles.clear();
  finalize_hook_set = false;
  ++generation;
}

}  // namespace

void check_cublas(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string("kfa: ") + what + " failed: " +
                             cublasGetStatusString(status));
}

cublasHandle_t cublas_handle() {
  // One handle per thread and device: cublasSetStream on a shared handle
  // would race between host threads that enqueue on different streams.
  thread_local std::map<int, cublasHandle_t> mine;
  thread_local unsigned long my_generation = ~0ul;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess)
    throw std::runtime_error("kfa: cudaGetDevice failed before a cuBLAS call");
  std::lock_guard<std::mutex> lock(handles_mutex);
  if (my_generation != generation) {
    mine.clear();
    my_generation = generation;
  }
  auto found = mine.find(device);
  if (found != mine.end()) return found->second;
  cublasHandle_t h = nullptr;
  check_cublas(cublasCreate(&h), "cublasCreate");
  all_handles.push_back(h);
  mine[device] = h;
  if (!finalize_hook_set) {
    Kokkos::push_finalize_hook(destroy_handles);
    finalize_hook_set = true;
  }
  return h;
}

}  // namespace Impl
}  // namespace kfa
