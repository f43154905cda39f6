#ifndef KFA_C_API_IMPL_HPP
#define KFA_C_API_IMPL_HPP

// Shared by the C interface's translation units: the status/exception
// boundary, the space dispatch and the argument checks.

#include <kfa/c_api.h>
#include <kfa/options.hpp>
#include <kfa/types.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <exception>
#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace kfa {
namespace CApi {

/// A failure with its status; the message names the argument.
struct Error : std::runtime_error {
  Error(kfa_status s, const std::string& what) : std::runtime_error(what), status(s) {}
  kfa_status status;
};

void set_error(const std::string& message);
void clear_error();
/// Whether Kokkos::finalize may run now: no block is alive.
void block_created();
void block_destroyed();

/// Runs `body` and turns whatever it throws into a status and the thread's
/// message (prefixed by `function`): no exception leaves the C interface.
template <class Body>
kfa_status guarded(const char* function, Body&& body) noexcept {
  const auto fail = [&](kfa_status status, const char* what) {
    try {
      set_error(std::string(function) + ": " + what);
    } catch (...) {
    }
    return status;
  };
  try {
    if (!Kokkos::is_initialized()) {
      return fail(KFA_ERROR_NOT_INITIALIZED,
                  "Kokkos is not initialised (call kfa_initialize or Kokkos::initialize first)");
    }
    body();
    clear_error();
    return KFA_SUCCESS;
  } catch (const Error& e) {
    return fail(e.status, e.what());
  } catch (const std::invalid_argument& e) {
    return fail(KFA_ERROR_INVALID_ARGUMENT, e.what());
  } catch (const std::bad_alloc&) {
    return fail(KFA_ERROR_INTERNAL, "out of memory");
  } catch (const std::exception& e) {
    return fail(KFA_ERROR_INTERNAL, e.what());
  } catch (...) {
    return fail(KFA_ERROR_INTERNAL, "unknown exception");
  }
}

[[noreturn]] inline void invalid(const std::string& what) {
  throw Error(KFA_ERROR_INVALID_ARGUMENT, what);
}

using DeviceSpace = Kokkos::DefaultExecutionSpace;
using HostSpace = Kokkos::DefaultHostExecutionSpace;

/// The execution space instance for `stream`: a CUDA stream wrapped in a
/// Kokkos::Cuda instance (one per stream, kept until Kokkos::finalize),
/// otherwise the default instance.
#ifdef KOKKOS_ENABLE_CUDA
Kokkos::Cuda cuda_instance(void* stream);
#endif
template <class ExecSpace>
ExecSpace space_instance(void* stream) {
#ifdef KOKKOS_ENABLE_CUDA
  if constexpr (std::is_same<ExecSpace, Kokkos::Cuda>::value) {
    if (stream != nullptr) return cuda_instance(stream);
  }
#endif
  (void)stream;
  return ExecSpace();
}

/// Calls f(ExecSpace{}) for the space an enum names (one instantiation where
/// the default space is the host space).
template <class F>
void with_space(kfa_space space, F&& f) {
  if (space == KFA_SPACE_DEFAULT) {
    f(DeviceSpace());
  } else if (space == KFA_SPACE_HOST) {
    f(HostSpace());
  } else {
    invalid("space must be KFA_SPACE_DEFAULT or KFA_SPACE_HOST, got " +
            std::to_string(static_cast<int>(space)));
  }
}

/// kfa::half is a 16-bit type except on host builds of Kokkos 3.4, where it
/// is float: an f16 pointer cannot be viewed as it there.
constexpr bool f16_available() { return sizeof(kfa::half) == 2; }

/// Calls f(T{}) for the element type an enum names.
template <class F>
void with_dtype(kfa_dtype dtype, bool layers, F&& f) {
  switch (dtype) {
    case KFA_F64: f(double()); return;
    case KFA_F32: f(float()); return;
    case KFA_BF16:
    case KFA_F16:
      if (layers) {
        throw Error(KFA_ERROR_UNSUPPORTED,
                    "dtype must be KFA_F32 or KFA_F64 (the layers have no 16-bit types yet)");
      }
      if (dtype == KFA_BF16) {
        f(kfa::bfloat16());
        return;
      }
      if constexpr (f16_available()) {
        f(kfa::half());
        return;
      } else {
        throw Error(KFA_ERROR_UNSUPPORTED,
                    "dtype KFA_F16 is not available in this build (Kokkos' half_t is float "
                    "on host builds of Kokkos 3.4)");
      }
    default:
      invalid("dtype must be KFA_F64, KFA_F32, KFA_BF16 or KFA_F16, got " +
              std::to_string(static_cast<int>(dtype)));
  }
}

inline void check_size(const char* name, std::int64_t value, std::int64_t min) {
  if (value < min) {
    invalid(std::string(name) + " must be >= " + std::to_string(min) + ", got " +
            std::to_string(value));
  }
}

/// A pointer may be NULL only when its tensor is empty.
inline void check_pointer(const char* name, const void* pointer, const char* shape,
                          std::int64_t elements) {
  if (pointer == nullptr && elements > 0) {
    invalid(std::string(name) + " " + shape + " must not be NULL");
  }
}

/// A caller's pointer as a View (Data e.g. `const float****`).
template <class Data, class MemorySpace>
using Unmanaged = Kokkos::View<Data, Kokkos::LayoutRight, MemorySpace,
                               Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

/// NULL means the defaults; nonzero booleans are true.
inline kfa::AttentionOptions attention_options(const kfa_attention_options* c) {
  kfa::AttentionOptions o;
  if (c == nullptr) return o;
  o.softmax_scale = c->softmax_scale;
  o.causal = c->causal != 0;
  o.deterministic = c->deterministic != 0;
  o.window_left = c->window_left;
  o.window_right = c->window_right;
  o.softcap = c->softcap;
  o.dropout_p = c->dropout_p;
  o.dropout_seed = c->dropout_seed;
  return o;
}

}  // namespace CApi
}  // namespace kfa

#endif
