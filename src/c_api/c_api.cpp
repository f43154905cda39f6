// The C interface's state: the thread's error message, Kokkos
// initialisation, CUDA stream instances, option defaults.

#include "c_api_impl.hpp"

#include <kfa/nn/options.hpp>
#include <kfa/options.hpp>

#include <atomic>
#include <map>
#include <mutex>

namespace kfa {
namespace CApi {

namespace {
thread_local std::string last_error;
std::atomic<long> live_blocks{0};
// Kokkos cannot be initialised twice in a process: once kfa_finalize has
// finalised it, kfa_initialize refuses.
std::mutex init_mutex;
bool kfa_owns_kokkos = false;
bool kfa_finalized = false;
}  // namespace

void set_error(const std::string& message) { last_error = message; }
void clear_error() { last_error.clear(); }
void block_created() { ++live_blocks; }
void block_destroyed() { --live_blocks; }

#ifdef KOKKOS_ENABLE_CUDA
namespace {
std::mutex cuda_mutex;
// Instances made from a stream own scratch memory: one per stream, freed
// before Kokkos::finalize by the hook below.
std::map<void*, Kokkos::Cuda>* cuda_instances = nullptr;
}  // namespace

Kokkos::Cuda cuda_instance(void* stream) {
  std::lock_guard<std::mutex> lock(cuda_mutex);
  if (cuda_instances == nullptr) {
    cuda_instances = new std::map<void*, Kokkos::Cuda>();
    Kokkos::push_finalize_hook([] {
      std::lock_guard<std::mutex> hook_lock(cuda_mutex);
      delete cuda_instances;
      cuda_instances = nullptr;
    });
  }
  auto found = cuda_instances->find(stream);
  if (found == cuda_instances->end()) {
    found = cuda_instances->emplace(stream, Kokkos::Cuda(static_cast<cudaStream_t>(stream))).first;
  }
  return found->second;
}
#endif

}  // namespace CApi
}  // namespace kfa

using namespace kfa::CApi;

extern "C" {

const char* kfa_last_error(void) { return last_error.c_str(); }

kfa_status kfa_initialize(void) {
  try {
    std::lock_guard<std::mutex> lock(init_mutex);
    if (Kokkos::is_initialized()) {
      clear_error();
      return KFA_SUCCESS;
    }
    if (kfa_finalized) {
      set_error("kfa_initialize: Kokkos was finalised by kfa_finalize and cannot be "
                "initialised again in this process");
      return KFA_ERROR_INVALID_STATE;
    }
    Kokkos::initialize();
    kfa_owns_kokkos = true;
    clear_error();
    return KFA_SUCCESS;
  } catch (const std::exception& e) {
    set_error(std::string("kfa_initialize: ") + e.what());
    return KFA_ERROR_INTERNAL;
  } catch (...) {
    set_error("kfa_initialize: unknown exception");
    return KFA_ERROR_INTERNAL;
  }
}

kfa_status kfa_finalize(void) {
  try {
    std::lock_guard<std::mutex> lock(init_mutex);
    if (!kfa_owns_kokkos) {
      clear_error();
      return KFA_SUCCESS;
    }
    // The blocks' Views must be freed before Kokkos is.
    const long alive = live_blocks.load();
    if (alive > 0) {
      set_error("kfa_finalize: " + std::to_string(alive) +
                " block(s) still alive; kfa_block_destroy them first");
      return KFA_ERROR_INVALID_STATE;
    }
    Kokkos::finalize();
    kfa_owns_kokkos = false;
    kfa_finalized = true;
    clear_error();
    return KFA_SUCCESS;
  } catch (const std::exception& e) {
    set_error(std::string("kfa_finalize: ") + e.what());
    return KFA_ERROR_INTERNAL;
  } catch (...) {
    set_error("kfa_finalize: unknown exception");
    return KFA_ERROR_INTERNAL;
  }
}

kfa_status kfa_fence(kfa_space space, void* stream) {
  return guarded("kfa_fence", [&] {
    with_space(space, [&](auto tag) {
      using ExecSpace = decltype(tag);
      space_instance<ExecSpace>(stream).fence();
    });
  });
}

void kfa_attention_options_default(kfa_attention_options* options) {
  if (options == nullptr) return;
  const kfa::AttentionOptions d;
  options->softmax_scale = d.softmax_scale;
  options->causal = d.causal;
  options->deterministic = d.deterministic;
  options->window_left = d.window_left;
  options->window_right = d.window_right;
  options->softcap = d.softcap;
  options->dropout_p = d.dropout_p;
  options->dropout_seed = d.dropout_seed;
}

void kfa_block_options_default(kfa_block_options* options) {
  if (options == nullptr) return;
  const kfa::nn::TransformerBlockOptions d;
  options->d_model = d.attention.d_model;
  options->heads = d.attention.heads;
  options->kv_heads = d.attention.kv_heads;
  options->head_dim = d.attention.head_dim;
  options->d_ff = d.d_ff;
  options->norm = d.norm == kfa::nn::Norm::rms_norm ? KFA_RMS_NORM : KFA_LAYER_NORM;
  options->activation = KFA_GELU;
  options->bias = d.bias;
  options->fused_qkv = d.attention.fused_qkv;
  options->rotary = d.attention.rotary;
  options->rotary_style = KFA_ROTARY_HALF_SPLIT;
  options->rotary_dim = d.attention.rotary_options.rotary_dim;
  options->rotary_position_offset = d.attention.rotary_options.position_offset;
  options->reserved = 0;
  options->rotary_base = d.attention.rotary_options.base;
  options->norm_eps = d.norm_options.eps;
  options->dropout_p = d.dropout_p;
  options->init_seed = d.init_seed;
  kfa_attention_options_default(&options->attention);
}

void kfa_adamw_options_default(kfa_adamw_options* options) {
  if (options == nullptr) return;
  const kfa::nn::AdamWOptions d;
  options->lr = d.lr;
  options->beta1 = d.beta1;
  options->beta2 = d.beta2;
  options->eps = d.eps;
  options->weight_decay = d.weight_decay;
}

}  // extern "C"
