// Memory: the fused forward allocates nothing that grows with seqlen², while
// the materialised baseline does (which also shows the tracker sees Kokkos'
// allocations).

#include <kfa/memory_tracker.hpp>

#include "kfa_test_helpers.hpp"

namespace kfa_test {
namespace {

using HostSpace = Kokkos::DefaultHostExecutionSpace;

// The host kernels' per-thread tiles at the small head dims below, which
// Kokkos allocates as team scratch: constant in seqlen, so allowed beside
// the O(N) bounds.
std::int64_t host_tile_bytes() {
  return std::int64_t(HostSpace().concurrency()) * 256 * 1024;
}

TEST(Memory, FlashForwardAllocatesNoSeqlenSquaredMemory) {
  kfa::Experimental::MemoryTracker tracker;
  kfa::AttentionOptions opt;
  opt.causal = true;
  const int head_dim = 32;
  for (const int n : {4096, 32768}) {
    DeviceView4<float, HostSpace> q("q", 1, n, 1, head_dim), k("k", 1, n, 1, head_dim),
        v("v", 1, n, 1, head_dim), o("o", 1, n, 1, head_dim);
    DeviceView3<float, HostSpace> lse("lse", 1, 1, n);
    Kokkos::deep_copy(q, 0.5f);
    Kokkos::deep_copy(k, 0.25f);
    Kokkos::deep_copy(v, 1.0f);
    poison(o);
    tracker.reset();
    kfa::flash_attention_forward(HostSpace(), q, k, v, o, lse, opt);
    HostSpace().fence();
    const std::int64_t flash_peak = tracker.peak();
    // O(N) at most; the kernel in fact allocates nothing beyond team scratch
    // (on host backends each thread's tiles, which do not grow with seqlen).
    EXPECT_LE(flash_peak, std::int64_t(64) * n + host_tile_bytes()) << "seqlen " << n;
    // All keys equal: every output element is exactly v = 1.
    const Tensor oh = to_host(o);
    double worst = 0;
    for (double x : oh.data) worst = std::isnan(x) ? INFINITY : std::max(worst, std::abs(x - 1));
    EXPECT_LE(worst, 1e-5) << "seqlen " << n;
    std::cout << "[ memory   ] seqlen " << n << ": flash forward peak extra bytes "
              << flash_peak << "\n";
    if (n == 4096) {
      tracker.reset();
      kfa::standard_attention_forward(HostSpace(), q, k, v, o, lse, opt);
      HostSpace().fence();
      const std::int64_t standard_peak = tracker.peak();
      EXPECT_GE(standard_peak, std::int64_t(n) * n * static_cast<std::int64_t>(sizeof(float)));
      std::cout << "[ memory   ] seqlen " << n << ": standard forward peak extra bytes "
                << standard_peak << "\n";
    }
  }
}

TEST(Memory, BackwardTemporariesAreLinearInSeqlen) {
  kfa::Experimental::MemoryTracker tracker;
  const int n = 2048, head_dim = 16;
  DeviceView4<float, HostSpace> q("q", 1, n, 2, head_dim), k("k", 1, n, 2, head_dim),
      v("v", 1, n, 2, head_dim), o("o", 1, n, 2, head_dim), d_o("d_o", 1, n, 2, head_dim),
      dq("dq", 1, n, 2, head_dim), dk("dk", 1, n, 2, head_dim), dv("dv", 1, n, 2, head_dim);
  DeviceView3<float, HostSpace> lse("lse", 1, 2, n);
  Kokkos::deep_copy(q, 0.5f);
  Kokkos::deep_copy(k, 0.25f);
  Kokkos::deep_copy(v, 1.0f);
  Kokkos::deep_copy(d_o, 1.0f);
  kfa::flash_attention_forward(HostSpace(), q, k, v, o, lse);
  tracker.reset();
  kfa::flash_attention_backward(HostSpace(), q, k, v, o, lse, d_o, dq, dk, dv);
  HostSpace().fence();
  // rowsum(dO ∘ O): one float per (head, row); on host backends with more
  // than one key chunk (kfa/detail/backend/host/backward.hpp) a dQ
  // accumulator per chunk.
  const int chunks = kfa::Impl::Host::key_chunks(
      Kokkos::DefaultHostExecutionSpace().concurrency(), 2,
      (n + kfa::Impl::Host::BackwardTileTraits<float>::kBlockN - 1) /
          kfa::Impl::Host::BackwardTileTraits<float>::kBlockN);
  const std::int64_t dq_chunks =
      chunks > 1 ? std::int64_t(chunks) * std::int64_t(dq.size() * sizeof(float)) : 0;
  EXPECT_LE(tracker.peak(), std::int64_t(2) * n * 8 + dq_chunks + host_tile_bytes());
}

}  // namespace
}  // namespace kfa_test
