// kfa score modifiers: what FlexAttention's score_mod and mask_mod give
// PyTorch users, as C++ functors on Kokkos Views. Two modifiers:
//
//  - DocumentMask: packed documents attend only within themselves (a mask,
//    with a block predicate so that tiles across documents are skipped);
//  - RelativePositionBias: a learned bias per head and clamped relative
//    distance (T5), added to every score.
//
// Both are additive (they return score + bias, or mask), so the backward
// pass needs no derivative hook. Each runs forward and backward through the
// fused kernels and through the materialised standard attention, and the
// example fails when they disagree.
//
//   score_mod [--seqlen N] [--heads H] [--head-dim D] [--doc-length L] [--causal]

#include <kfa/kfa.hpp>

#include "example_common.hpp"

#include <Kokkos_Core.hpp>
#include <Kokkos_Random.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#if KFA_ENABLE_MPI
#include <mpi.h>
#endif

// A named namespace: the modifiers become template arguments of kernels,
// which nvcc wants to have external linkage.
namespace score_mod_example {

using Space = Kokkos::DefaultExecutionSpace;
using memory_space = Space::memory_space;

/// Tokens of a packed sequence see only the tokens of their own document.
struct DocumentMask {
  Kokkos::View<const int*, memory_space> doc;  // document id per position, non-decreasing

  template <class Acc>
  KOKKOS_FUNCTION Acc operator()(int, int, int i, int j, Acc score) const {
    return doc(i) == doc(j) ? score : kfa::masked_score<Acc>();
  }

  /// A tile is fully masked when its rows' documents and its keys' documents
  /// do not overlap; kfa then skips it (forward and backward).
  KOKKOS_FUNCTION bool visible(int, int, int row_begin, int row_end, int key_begin,
                               int key_end) const {
    return doc(row_begin) <= doc(key_end - 1) && doc(key_begin) <= doc(row_end - 1);
  }
};

/// T5-style relative position bias: bias(h, clamp(j - i)) added to the score.
struct RelativePositionBias {
  Kokkos::View<const float**, memory_space> table;  // [heads][2 * max_distance + 1]
  int max_distance;

  template <class Acc>
  KOKKOS_FUNCTION Acc operator()(int, int h, int i, int j, Acc score) const {
    const int r = j - i < -max_distance ? -max_distance : (j - i > max_distance ? max_distance : j - i);
    return score + static_cast<Acc>(table(h, r + max_distance));
  }
};

/// The common flags (--batch, --repeat and --double are read but not used:
/// this example runs one float sequence) and --doc-length.
struct Args : kfa_example::CommonArgs {
  int doc_length = 300;
};

Args parse(int argc, char* argv[]) {
  return kfa_example::parse_args(argc, argv, Args{},
                                 [](Args& a, const std::string& s, auto&& next) {
                                   if (s != "--doc-length") return false;
                                   a.doc_length = std::max(1, next());
                                   return true;
                                 });
}

using kfa_example::max_abs_diff;

using View4 = Kokkos::View<float****, Kokkos::LayoutRight, memory_space>;
using View3 = Kokkos::View<float***, Kokkos::LayoutRight, memory_space>;

/// Flash vs standard attention, forward and backward, with one modifier.
template <class Mod>
bool run(const char* name, const Mod& mod, const View4& q, const View4& k, const View4& v,
         const View4& d_o, const kfa::AttentionOptions& options) {
  const int B = q.extent(0), N = q.extent(1), H = q.extent(2), D = q.extent(3);
  View4 o_f("o_f", B, N, H, D), o_s("o_s", B, N, H, D), dq_f("dq_f", B, N, H, D),
      dk_f("dk_f", B, N, H, D), dv_f("dv_f", B, N, H, D), dq_s("dq_s", B, N, H, D),
      dk_s("dk_s", B, N, H, D), dv_s("dv_s", B, N, H, D);
  View3 lse_f("lse_f", B, H, N), lse_s("lse_s", B, H, N);
  const Space space;
  const auto t0 = std::chrono::steady_clock::now();
  kfa::flash_attention_forward(space, q, k, v, o_f, lse_f, options, mod);
  kfa::flash_attention_backward(space, q, k, v, o_f, lse_f, d_o, dq_f, dk_f, dv_f, options, mod);
  space.fence();
  const auto t1 = std::chrono::steady_clock::now();
  kfa::standard_attention_forward(space, q, k, v, o_s, lse_s, options, mod);
  kfa::standard_attention_backward(space, q, k, v, o_s, lse_s, d_o, dq_s, dk_s, dv_s, options,
                                    mod);
  space.fence();
  const auto t2 = std::chrono::steady_clock::now();
  const double err_o = max_abs_diff(o_f, o_s), err_lse = max_abs_diff(lse_f, lse_s);
  const double err_g = std::max({max_abs_diff(dq_f, dq_s), max_abs_diff(dk_f, dk_s),
                                 max_abs_diff(dv_f, dv_s)});
  const bool ok = err_o < 1e-4 && err_lse < 1e-4 && err_g < 1e-3;
  std::printf("  %-24s flash %8.1f ms, standard %8.1f ms (forward + backward); max |flash - "
              "standard|: O %.2g, lse %.2g, gradients %.2g  %s\n",
              name, 1e3 * std::chrono::duration<double>(t1 - t0).count(),
              1e3 * std::chrono::duration<double>(t2 - t1).count(), err_o, err_lse, err_g,
              ok ? "OK" : "FAILED");
  return ok;
}

int run_all(const Args& a) {
  const int B = 1, N = a.seqlen, H = a.heads, D = a.head_dim;
  std::printf("kfa %s score modifiers on %s: seqlen %d, heads %d, head_dim %d, documents of "
              "about %d tokens%s\n",
              kfa::version().c_str(), Space::name(), N, H, D, a.doc_length,
              a.causal ? ", causal" : "");
  View4 q("q", B, N, H, D), k("k", B, N, H, D), v("v", B, N, H, D), d_o("d_o", B, N, H, D);
  Kokkos::Random_XorShift64_Pool<Space> pool(/*seed=*/20261130);
  Kokkos::fill_random(q, pool, -1.f, 1.f);
  Kokkos::fill_random(k, pool, -1.f, 1.f);
  Kokkos::fill_random(v, pool, -1.f, 1.f);
  Kokkos::fill_random(d_o, pool, -1.f, 1.f);

  // Documents of a fixed-seed random length around --doc-length.
  Kokkos::View<int*, memory_space> doc("doc", N);
  auto doc_h = Kokkos::create_mirror_view(doc);
  std::srand(7);
  for (int i = 0, id = 0, left = 0; i < N; ++i, --left) {
    if (left == 0) {
      ++id;
      left = a.doc_length / 2 + std::rand() % a.doc_length + 1;
    }
    doc_h(i) = id;
  }
  Kokkos::deep_copy(doc, doc_h);

  const int max_distance = 64;
  Kokkos::View<float**, memory_space> table("bias", H, 2 * max_distance + 1);
  Kokkos::fill_random(table, pool, -1.f, 1.f);

  kfa::AttentionOptions options;
  options.causal = a.causal;
  bool ok = run("document mask", DocumentMask{doc}, q, k, v, d_o, options);
  ok = run("relative position bias", RelativePositionBias{table, max_distance}, q, k, v, d_o,
           options) && ok;
  std::printf("  %s\n", ok ? "OK: flash attention matches standard attention"
                           : "FAILED: flash and standard attention disagree");
  return ok ? 0 : 1;
}

}  // namespace score_mod_example

int main(int argc, char* argv[]) {
#if KFA_ENABLE_MPI
  MPI_Init(&argc, &argv);
#endif
  int status = 0;
  {
    Kokkos::ScopeGuard guard(argc, argv);
    status = score_mod_example::run_all(score_mod_example::parse(argc, argv));
  }
#if KFA_ENABLE_MPI
  MPI_Finalize();
#endif
  return status;
}
