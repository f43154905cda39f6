#ifndef KFA_DETAIL_BACKEND_HOST_ISA_CHECK_HPP
#define KFA_DETAIL_BACKEND_HOST_ISA_CHECK_HPP

// A build for the building machine's vector ISA (KFA_ARCH_NATIVE, or any
// -march the user passes) dies of an illegal instruction on a CPU without
// it. The host entry points call check_host_isa() first: it compares the
// ISA macros of this compilation with what the CPU reports and throws
// instead.

#include <stdexcept>
#include <string>

namespace kfa {
namespace Impl {
namespace Host {

/// The vector extensions this translation unit was compiled for that the
/// running CPU lacks, space-separated (empty when it has them all).
inline std::string missing_cpu_features() {
  std::string missing;
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
#if defined(__AVX512F__)
  if (!__builtin_cpu_supports("avx512f")) missing += " avx512f";
#endif
#if defined(__AVX512BW__)
  if (!__builtin_cpu_supports("avx512bw")) missing += " avx512bw";
#endif
#if defined(__AVX512DQ__)
  if (!__builtin_cpu_supports("avx512dq")) missing += " avx512dq";
#endif
#if defined(__AVX512VL__)
  if (!__builtin_cpu_supports("avx512vl")) missing += " avx512vl";
#endif
#if defined(__AVX2__)
  if (!__builtin_cpu_supports("avx2")) missing += " avx2";
#endif
#if defined(__FMA__)
  if (!__builtin_cpu_supports("fma")) missing += " fma";
#endif
#if defined(__AVX__)
  if (!__builtin_cpu_supports("avx")) missing += " avx";
#endif
#endif
  return missing;
}

/// Throws std::runtime_error when the CPU lacks an extension the build
/// targets. Checked once per process (a failed check is repeated).
inline void check_host_isa() {
  static const bool checked = [] {
    const std::string missing = missing_cpu_features();
    if (!missing.empty())
      throw std::runtime_error(
          "kfa: this program was compiled for CPU features that this CPU lacks:" + missing +
          ". Rebuild it on this machine, or configure kfa with -DKFA_ARCH_NATIVE=OFF (or a "
          "-march this CPU supports).");
    return true;
  }();
  (void)checked;
}

}  // namespace Host
}  // namespace Impl
}  // namespace kfa

#endif
