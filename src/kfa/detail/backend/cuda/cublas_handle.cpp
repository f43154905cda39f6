#include <kfa/detail/backend/cuda/tensor_core_gemm.hpp>

#include <cublasLt.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

namespace kfa {
namespace Impl {

namespace {

// Every handle and workspace made, so that Kokkos::finalize releases them
// while the CUDA context is still alive (a static destructor would run after
// it is gone).
std::mutex handles_mutex;
std::vector<cublasHandle_t> all_handles;
std::vector<cublasLtHandle_t> all_lt_handles;
std::vector<void*> all_workspaces;
bool finalize_hook_set = false;
// Bumped at finalize: a thread's cached handles and plans from before are
// stale.
std::atomic<unsigned long> generation{0};

void destroy_handles() {
  std::lock_guard<std::mutex> lock(handles_mutex);
  for (cublasHandle_t h : all_handles) cublasDestroy(h);
  for (cublasLtHandle_t h : all_lt_handles) cublasLtDestroy(h);
  for (void* w : all_workspaces) cudaFree(w);
  all_handles.clear();
  all_lt_handles.clear();
  all_workspaces.clear();
  finalize_hook_set = false;
  ++generation;
}

// Call with handles_mutex held.
void set_finalize_hook() {
  if (!finalize_hook_set) {
    Kokkos::push_finalize_hook(destroy_handles);
    finalize_hook_set = true;
  }
}

int current_device() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess)
    throw std::runtime_error("kfa: cudaGetDevice failed before a cuBLAS call");
  return device;
}

// A shape's cuBLASLt descriptors and the algorithm the heuristic chose.
struct LtPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool found = false;
  LtPlan() = default;
  LtPlan(const LtPlan&) = delete;
  LtPlan& operator=(const LtPlan&) = delete;
  ~LtPlan() {
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

// cuBLASLt's suggested workspace for Hopper.
constexpr std::size_t kLtWorkspaceBytes = std::size_t(32) << 20;

// The largest power of two up to 256 dividing a pointer and a leading
// dimension in bytes: what the plan may assume of the operand's alignment.
std::uint32_t alignment_of(const void* p, long long ld, std::size_t element_bytes) {
  const auto bits = reinterpret_cast<std::uintptr_t>(p) | std::uintptr_t(ld * element_bytes) |
                    std::uintptr_t(256);
  return std::uint32_t(bits & (~bits + 1));
}

std::size_t bytes_of(cudaDataType t) { return t == CUDA_R_32F ? 4 : 2; }

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
  const int device = current_device();
  if (my_generation != generation.load()) {
    mine.clear();
    my_generation = generation.load();
  }
  auto found = mine.find(device);
  if (found != mine.end()) return found->second;
  cublasHandle_t h = nullptr;
  check_cublas(cublasCreate(&h), "cublasCreate");
  std::lock_guard<std::mutex> lock(handles_mutex);
  all_handles.push_back(h);
  mine[device] = h;
  set_finalize_hook();
  return h;
}

bool cublaslt_bias_product(const LtBiasProduct& p) {
  // Per thread: the handle and the plans of each device, and a workspace per
  // stream (two streams must not share one while both run).
  using Key = std::tuple<int, bool, bool, long long, long long, long long, long long, long long,
                         long long, int, int, int, std::uint32_t, std::uint32_t, std::uint32_t,
                         std::uint32_t>;
  thread_local std::map<int, cublasLtHandle_t> handles;
  thread_local std::map<std::pair<int, cudaStream_t>, void*> workspaces;
  thread_local std::map<Key, std::unique_ptr<LtPlan>> plans;
  thread_local unsigned long my_generation = ~0ul;
  if (my_generation != generation.load()) {
    handles.clear();
    workspaces.clear();
    plans.clear();
    my_generation = generation.load();
  }
  const int device = current_device();
  cublasLtHandle_t handle = nullptr;
  if (auto h = handles.find(device); h != handles.end()) {
    handle = h->second;
  } else {
    check_cublas(cublasLtCreate(&handle), "cublasLtCreate");
    std::lock_guard<std::mutex> lock(handles_mutex);
    all_lt_handles.push_back(handle);
    handles[device] = handle;
    set_finalize_hook();
  }
  void*& workspace = workspaces[{device, p.stream}];
  if (!workspace) {
    if (cudaMalloc(&workspace, kLtWorkspaceBytes) != cudaSuccess) {
      workspace = nullptr;
      throw std::runtime_error("kfa: cudaMalloc of the cuBLASLt workspace failed");
    }
    std::lock_guard<std::mutex> lock(handles_mutex);
    all_workspaces.push_back(workspace);
    set_finalize_hook();
  }

  const std::uint32_t align_a = alignment_of(p.a, p.lda, bytes_of(p.ab_type)),
                      align_b = alignment_of(p.b, p.ldb, bytes_of(p.ab_type)),
                      align_d = alignment_of(p.d, p.ldd, bytes_of(p.d_type)),
                      align_bias = alignment_of(p.bias, 0, bytes_of(p.bias_type));
  const Key key{device, p.trans_a, p.trans_b, p.m, p.n, p.k, p.lda, p.ldb, p.ldd,
                int(p.ab_type) * 64 + int(p.d_type), int(p.bias_type), p.beta != 0.f,
                align_a, align_b, align_d, align_bias};
  auto& plan = plans[key];
  if (!plan) {
    plan = std::make_unique<LtPlan>();
    check_cublas(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                 "cublasLtMatmulDescCreate");
    const cublasOperation_t op_a = p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                            op_b = p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    const cudaDataType bias_type = p.bias_type;
    check_cublas(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a,
                                                sizeof(op_a)),
                 "cublasLtMatmulDescSetAttribute(TRANSA)");
    check_cublas(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b,
                                                sizeof(op_b)),
                 "cublasLtMatmulDescSetAttribute(TRANSB)");
    check_cublas(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                &epilogue, sizeof(epilogue)),
                 "cublasLtMatmulDescSetAttribute(EPILOGUE)");
    check_cublas(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                &bias_type, sizeof(bias_type)),
                 "cublasLtMatmulDescSetAttribute(BIAS_DATA_TYPE)");
    check_cublas(cublasLtMatrixLayoutCreate(&plan->a, p.ab_type, p.trans_a ? p.k : p.m,
                                            p.trans_a ? p.m : p.k, p.lda),
                 "cublasLtMatrixLayoutCreate(A)");
    check_cublas(cublasLtMatrixLayoutCreate(&plan->b, p.ab_type, p.trans_b ? p.n : p.k,
                                            p.trans_b ? p.k : p.n, p.ldb),
                 "cublasLtMatrixLayoutCreate(B)");
    check_cublas(cublasLtMatrixLayoutCreate(&plan->d, p.d_type, p.m, p.n, p.ldd),
                 "cublasLtMatrixLayoutCreate(D)");
    cublasLtMatmulPreference_t pref = nullptr;
    check_cublas(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    const std::size_t workspace_bytes = kLtWorkspaceBytes;
    const std::array<std::pair<cublasLtMatmulPreferenceAttributes_t, std::uint32_t>, 4> aligns{
        {{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a},
         {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b},
         {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_d},
         {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_d}}};
    cublasStatus_t status = cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes, sizeof(workspace_bytes));
    for (const auto& a : aligns) {
      if (status == CUBLAS_STATUS_SUCCESS)
        status = cublasLtMatmulPreferenceSetAttribute(pref, a.first, &a.second, sizeof(a.second));
    }
    cublasLtMatmulHeuristicResult_t result{};
    int count = 0;
    if (status == CUBLAS_STATUS_SUCCESS)
      status = cublasLtMatmulAlgoGetHeuristic(handle, plan->desc, plan->a, plan->b, plan->d,
                                              plan->d, pref, 1, &result, &count);
    cublasLtMatmulPreferenceDestroy(pref);
    plan->found = status == CUBLAS_STATUS_SUCCESS && count > 0 &&
                  result.state == CUBLAS_STATUS_SUCCESS;
    if (plan->found) plan->algo = result.algo;
  }
  // The bias pointer's alignment is part of the key; its address changes.
  if (!plan->found || align_bias < bytes_of(p.bias_type)) return false;
  check_cublas(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                              &p.bias, sizeof(p.bias)),
               "cublasLtMatmulDescSetAttribute(BIAS_POINTER)");
  const float alpha = 1.f;
  const cublasStatus_t status =
      cublasLtMatmul(handle, plan->desc, &alpha, p.a, plan->a, p.b, plan->b, &p.beta, p.d,
                     plan->d, p.d, plan->d, &plan->algo, workspace, kLtWorkspaceBytes, p.stream);
  // Refused before anything was enqueued (e.g. the bias' alignment): the
  // caller's fallback computes the same product.
  if (status == CUBLAS_STATUS_NOT_SUPPORTED || status == CUBLAS_STATUS_INVALID_VALUE) return false;
  check_cublas(status, "cublasLtMatmul");
  return true;
}

}  // namespace Impl
}  // namespace kfa
