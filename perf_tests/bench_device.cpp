// Device side of the GPU harness (perf_tests/bench_device.py drives it):
// reads q, k, v, d_o written by PyTorch as raw little-endian arrays, runs kfa
// on the default execution space, times forward, backward and
// forward+backward (median of --iters runs after --warmup; GPU time between
// events on CUDA, time_ms), writes
// o, lse, dq, dk, dv back for the comparison, and prints one JSON line.
//
//   bench_device --dtype bf16|fp16|fp32|fp64 --batch B --seqlen N --heads H
//                [--heads-kv HKV] --head-dim D [--causal] [--iters 20] [--warmup 3] [--no-bwd]
//                [--fwd-variant NAME] [--bwd-variant NAME] [--no-wgmma]
//                [--league-group TEAMS] [--timing sequential|interleaved] [--trace]
//                [--window LEFT,RIGHT] [--softcap X] [--dropout P]
//                [--mod alibi|relbias|document] [--packed S]
//                --dir /dev/shm/kfa_bench | --random
//
// --packed S: a packed variable-length batch of S sequences in the --seqlen
// rows (--batch 1), their offsets (S + 1 int32, cu_seqlens) read from
// --dir/cu.bin, run by the varlen entry points.
// Variants (bench_variants.py): --window, --softcap, --dropout set the
// options; --mod passes a score modifier (bf16 only): kfa::alibi with the
// slopes 2^(-8(h+1)/H), a relative-position bias table read from rel.bin
// (float [H][2·128+1]), or a document mask from doc.bin (int32 [B][N],
// non-decreasing ids) with its block predicate.
//
// --timing: sequential (default) times --iters forwards, then --iters
// backwards, then --iters pairs; interleaved takes one of each in turn, so
// that a drift of the card's clocks over the run falls on all three alike.
// Both also time the pair with a fence between its halves (pair_fenced_ms).
// --trace adds every sample (ms, in the order taken) to the JSON line.
// --no-wgmma: the mma.sync kernels where the library would run the Hopper
// ones; --league-group: KernelPolicy::league_group_teams (0: the teams of a
// block index side by side over every (batch, head)).

#include <kfa/kfa.hpp>

#include "bench_fill.hpp"
#if defined(KOKKOS_ENABLE_CUDA) && defined(__CUDACC__)
#include "bench_cuda_check.hpp"
#endif

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace {

struct Args {
  std::string dtype = "bf16", dir = "/dev/shm/kfa_bench";
  int batch = 1, seqlen = 1024, heads = 16, head_dim = 128, iters = 20, warmup = 3;
  /// Heads of k and v (grouped-query attention); 0: as many as q.
  int heads_kv = 0;
  bool causal = false, backward = true;
  /// Random inputs drawn here instead of files from --dir, and no outputs
  /// written (for profilers: `ncu ... bench_device --random --iters 1`).
  bool random = false;
  /// AttentionOptions::fp32_matmul of the default forward and backward.
  std::string fp32_matmul = "ieee";
  /// Forward kernel variant for experiments on the tensor-core path:
  /// "default" (the library's dispatch), or a tile shape of
  /// mma_forward_variant(). (Earlier variants, lb3 and w8, are in RESULTS.md.)
  std::string fwd_variant = "default";
  /// Backward kernel variant (backward_variant()), after the library's
  /// forward: "default" or a tile shape of the fp32/fp64 backward at fp64.
  std::string bwd_variant = "default";
  /// Whether the library's 16-bit kernels may take the Hopper (wgmma) path.
  bool wgmma = true;
  int league_group = kfa::Experimental::KernelPolicy{}.league_group_teams;
  bool interleaved = false, trace = false;
  int window_left = -1, window_right = -1;
  double softcap = 0, dropout = 0;
  std::string mod = "none";
  /// Sequences of a packed batch (0: a fixed-length batch).
  int packed = 0;
};

Args parse(int argc, char* argv[]) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument("missing value after " + s);
      return argv[++i];
    };
    if (s == "--dtype") a.dtype = next();
    else if (s == "--dir") a.dir = next();
    else if (s == "--batch") a.batch = std::stoi(next());
    else if (s == "--seqlen") a.seqlen = std::stoi(next());
    else if (s == "--heads") a.heads = std::stoi(next());
    else if (s == "--heads-kv") a.heads_kv = std::stoi(next());
    else if (s == "--head-dim") a.head_dim = std::stoi(next());
    else if (s == "--iters") a.iters = std::stoi(next());
    else if (s == "--warmup") a.warmup = std::stoi(next());
    else if (s == "--causal") a.causal = true;
    else if (s == "--no-bwd") a.backward = false;
    else if (s == "--random") a.random = true;
    else if (s == "--fp32-matmul") a.fp32_matmul = next();
    else if (s == "--fwd-variant") a.fwd_variant = next();
    else if (s == "--bwd-variant") a.bwd_variant = next();
    else if (s == "--no-wgmma") a.wgmma = false;
    else if (s == "--league-group") a.league_group = std::stoi(next());
    else if (s == "--timing") {
      const std::string t = next();
      if (t != "sequential" && t != "interleaved")
        throw std::invalid_argument("--timing must be sequential or interleaved");
      a.interleaved = t == "interleaved";
    } else if (s == "--trace") a.trace = true;
    else if (s == "--window") {
      const std::string w = next();
      const auto comma = w.find(',');
      if (comma == std::string::npos) throw std::invalid_argument("--window takes LEFT,RIGHT");
      a.window_left = std::stoi(w.substr(0, comma));
      a.window_right = std::stoi(w.substr(comma + 1));
    } else if (s == "--softcap") a.softcap = std::stod(next());
    else if (s == "--dropout") a.dropout = std::stod(next());
    else if (s == "--packed") a.packed = std::stoi(next());
    else if (s == "--mod") {
      a.mod = next();
      if (a.mod != "none" && a.mod != "alibi" && a.mod != "relbias" && a.mod != "document")
        throw std::invalid_argument("--mod must be none, alibi, relbias or document");
    } else throw std::invalid_argument("unknown argument " + s);
  }
  return a;
}

template <class View>
void read_into(const View& view, const std::string& path) {
  auto host = Kokkos::create_mirror_view(view);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  in.read(reinterpret_cast<char*>(host.data()),
          static_cast<std::streamsize>(host.size() * sizeof(typename View::value_type)));
  if (!in) throw std::runtime_error("short read from " + path);
  Kokkos::deep_copy(view, host);
}

template <class View>
void write_from(const View& view, const std::string& path) {
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), view);
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(host.data()),
            static_cast<std::streamsize>(host.size() * sizeof(typename View::value_type)));
  if (!out) throw std::runtime_error("cannot write " + path);
}

/// Milliseconds of one call of f. On CUDA: GPU time on the default
/// instance's stream (gpu_time_ms, behind ~1 ms of a spinning kernel).
/// Elsewhere: a host clock around f and a fence.
template <class F>
double time_ms(F&& f) {
#if defined(KOKKOS_ENABLE_CUDA) && defined(__CUDACC__)
  if constexpr (std::is_same<Kokkos::DefaultExecutionSpace, Kokkos::Cuda>::value)
    return gpu_time_ms(Kokkos::Cuda().cuda_stream(), f);
#endif
  const auto t0 = std::chrono::steady_clock::now();
  f();
  Kokkos::fence();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> t) {
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

/// Samples of each of fs (after `warmup` calls of each): `iters` of the
/// first, then of the second, ... or, interleaved, one of each in turn.
std::vector<std::vector<double>> sample_ms(int warmup, int iters, bool interleaved,
                                           const std::vector<std::function<void()>>& fs) {
  std::vector<std::vector<double>> t(fs.size());
  if (interleaved) {
    for (int w = 0; w < warmup; ++w)
      for (const auto& f : fs) f();
    Kokkos::fence();
    for (int r = 0; r < iters; ++r)
      for (std::size_t i = 0; i < fs.size(); ++i) t[i].push_back(time_ms(fs[i]));
  } else {
    for (std::size_t i = 0; i < fs.size(); ++i) {
      for (int w = 0; w < warmup; ++w) fs[i]();
      Kokkos::fence();
      for (int r = 0; r < iters; ++r) t[i].push_back(time_ms(fs[i]));
    }
  }
  return t;
}

std::string json_list(const std::vector<double>& t) {
  std::string s = "[";
  for (std::size_t i = 0; i < t.size(); ++i) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%s%.4f", i ? ", " : "", t[i]);
    s += buf;
  }
  return s + "]";
}

/// The tensor-core forward with a tile shape other than the library's
/// choice (launch_forward_mma), for experiments.
template <class Shape, class T, class View4, class View3>
std::function<void()> mma_forward_shape(const Args& a, View4 q, View4 k, View4 v, View4 o,
                                        View3 lse) {
  using Space = Kokkos::DefaultExecutionSpace;
  using Format = typename kfa::Impl::MmaFormat<Space, T>::type;
  if constexpr (std::is_void<Format>::value) {
    throw std::invalid_argument("--fwd-variant needs bf16 or fp16 on CUDA");
  } else {
    using kfa::Impl::FlashForwardMmaKernel;
    const float scale = 1.0f / std::sqrt(float(a.head_dim));
    const bool causal = a.causal;
    if (a.head_dim == 64)
      return [=] {
        FlashForwardMmaKernel<Space, 64, Format, View4, View4, View4, View4, View3, Shape>(
            q, k, v, o, lse, scale, causal)
            .launch(Space());
      };
    if (a.head_dim == 128)
      return [=] {
        FlashForwardMmaKernel<Space, 128, Format, View4, View4, View4, View4, View3, Shape>(
            q, k, v, o, lse, scale, causal)
            .launch(Space());
      };
    throw std::invalid_argument("--fwd-variant needs head_dim 64 or 128");
  }
}

/// Shapes of the Hopper forward for experiments, by head_dim (`at<D>`): the
/// library's (kfa::Impl::WgmmaFwdShape), one fixed shape at every head_dim,
/// and the library's before RESULTS run 51 (two warpgroups a team; 128-key
/// blocks at head_dim 128, two teams per SM at 64).
struct LibraryWgmmaShape {
  template <int HeadDim>
  using at = kfa::Impl::WgmmaFwdShape<HeadDim>;
};
template <int BlockN, int MinBlocks, int WarpGroups, bool Tma = false, int Stages = 2,
          bool Realloc = false, bool Persistent = false>
struct FixedWgmmaShape {
  template <int HeadDim>
  struct at {
    static constexpr int kBlockN = BlockN;
    static constexpr int kMinBlocksPerSM = MinBlocks;
    static constexpr int kWarpGroups = WarpGroups;
    static constexpr bool kTma = Tma;
    static constexpr int kStages = Stages;
    static constexpr bool kRealloc = Realloc;
    static constexpr bool kPersistent = Persistent;
  };
};
/// Bulk tensor copies by a producer warp, one team per SM: at head_dim 128
/// two warpgroups and 64-key blocks, at 64 WarpGroups64 and BlockN64.
template <int WarpGroups64, int BlockN64, int Stages = 2, int WarpGroups128 = 2,
          int Teams64 = 1, int Teams128 = 1>
struct TmaWgmmaShape {
  template <int HeadDim>
  using at = typename FixedWgmmaShape<HeadDim == 64 ? BlockN64 : 64,
                                      HeadDim == 64 ? Teams64 : Teams128,
                                      HeadDim == 64 ? WarpGroups64 : WarpGroups128, true,
                                      Stages>::template at<HeadDim>;
};
struct Run50WgmmaShape {
  template <int HeadDim>
  using at = typename FixedWgmmaShape<HeadDim == 128 ? 128 : 64, HeadDim == 64 ? 2 : 1,
                                      2>::template at<HeadDim>;
};

/// The library's shape at head_dim 64 and 128 before RESULTS v38: teams of
/// one warpgroup with 64-key blocks by cp.async, four per SM at 64, two at
/// 128.
struct CpAsyncWgmmaShape {
  template <int HeadDim>
  using at = typename FixedWgmmaShape<64, HeadDim == 64 ? 4 : 2, 1>::template at<HeadDim>;
};
/// A producer warpgroup whose registers the others take: Warpgroups
/// warpgroups, BlockN keys (at head_dim 256: 64), persistent teams or not.
template <int WarpGroups, int BlockN, int Stages = 2, bool Persistent = true>
struct WsWgmmaShape {
  template <int HeadDim>
  using at = typename FixedWgmmaShape<HeadDim == 256 ? 64 : BlockN, 1, WarpGroups, true, Stages,
                                      true, Persistent>::template at<HeadDim>;
};
template <bool Persistent = true>
struct Ws3WgmmaShape {
  template <int HeadDim>
  using at =
      typename WsWgmmaShape<3, HeadDim == 64 ? 128 : 64, 2, Persistent>::template at<HeadDim>;
};

/// The Hopper (wgmma) forward with the scale folded or not, in one of the
/// shapes above (head_dim 256: the library's, and others where At256).
template <bool FoldScale, class T, class Shapes = LibraryWgmmaShape, bool At256 = false,
          class View4, class View3>
std::function<void()> wgmma_forward(const Args& a, View4 q, View4 k, View4 v, View4 o,
                                    View3 lse) {
  using Space = Kokkos::DefaultExecutionSpace;
  using Format = typename kfa::Impl::MmaFormat<Space, T>::type;
#ifdef KOKKOS_ENABLE_CUDA
  if constexpr (!std::is_void<Format>::value) {
    if (!kfa::Impl::wgmma_available(Space()))
      throw std::invalid_argument("--fwd-variant wgmma_*: no sm_90a code for this GPU");
    const float scale = 1.0f / std::sqrt(float(a.head_dim));
    const bool causal = a.causal;
    auto make = [&](auto head_dim) -> std::function<void()> {
      constexpr int kD = decltype(head_dim)::value;
      using Shape = typename Shapes::template at<kD>;
      using Kernel = kfa::Impl::FlashForwardWgmmaKernelIn<Shape, Space, kD, Format, View4, View4,
                                                          View4, View4, View3, FoldScale>;
      return [=] { Kernel(q, k, v, o, lse, scale, causal).launch(Space()); };
    };
    if (a.head_dim == 64) return make(std::integral_constant<int, 64>());
    if (a.head_dim == 128) return make(std::integral_constant<int, 128>());
    if (a.head_dim == 256) {
      if constexpr (At256 || std::is_same<Shapes, LibraryWgmmaShape>::value)
        return make(std::integral_constant<int, 256>());
      throw std::invalid_argument("--fwd-variant wgmma_<shape>: head_dim 64 or 128");
    }
    throw std::invalid_argument("--fwd-variant wgmma_* needs head_dim 64, 128 or 256");
  }
#endif
  (void)q, (void)k, (void)v, (void)o, (void)lse;
  throw std::invalid_argument("--fwd-variant wgmma_* needs bf16 or fp16 on CUDA");
}

kfa::Fp32Matmul fp32_matmul(const std::string& name) {
  if (name == "ieee") return kfa::Fp32Matmul::ieee;
  if (name == "split_tf32") return kfa::Fp32Matmul::split_tf32;
  if (name == "tf32") return kfa::Fp32Matmul::tf32;
  throw std::invalid_argument("--fp32-matmul must be ieee, split_tf32 or tf32");
}

/// The fp32/fp64 tensor-core forward at head_dim D in tile shape Shape.
template <int D, class Shape, class Atom, class View4, class View3>
std::function<void()> fp32_fp64_forward_at(const Args& a, View4 q, View4 k, View4 v, View4 o,
                                      View3 lse) {
  using Space = Kokkos::DefaultExecutionSpace;
  using T = typename View4::non_const_value_type;
  const T scale = T(1) / std::sqrt(T(D));
  const bool causal = a.causal;
  return [=] {
    kfa::Impl::FlashForwardFp32Fp64Kernel<Space, D, Atom, View4, View4, View4, View4, View3, Shape>(
        q, k, v, o, lse, scale, causal)
        .launch(Space());
  };
}

/// The fp32/fp64 tensor-core forward with another tile shape than the
/// library's (Fp32Fp64FwdDefaultShape), for experiments.
template <class Shape, class Atom, class View4, class View3>
std::function<void()> fp32_fp64_forward_shape(const Args& a, View4 q, View4 k, View4 v, View4 o,
                                         View3 lse) {
  if (a.head_dim == 64) return fp32_fp64_forward_at<64, Shape, Atom>(a, q, k, v, o, lse);
  if (a.head_dim == 128) return fp32_fp64_forward_at<128, Shape, Atom>(a, q, k, v, o, lse);
  throw std::invalid_argument("--fwd-variant needs head_dim 64 or 128");
}

/// An fp32/fp64 forward shape that multiplies O by fp64's lazy rescale factor in
/// every block (the "rescale_o" variant, the library before RESULTS v33).
template <class Shape>
struct RescaleOAlwaysShape : Shape {
  static constexpr bool kRescaleOAlways = true;
};

/// The fp32/fp64 tensor-core forward with `Atom` in the library's shape for
/// the run's head_dim (instantiated for that head_dim only).
template <class Atom, class View4, class View3>
std::function<void()> fp32_fp64_forward_default(const Args& a, View4 q, View4 k, View4 v, View4 o,
                                           View3 lse) {
  using kfa::Impl::Fp32Fp64FwdDefaultShape;
  if (a.head_dim == 64)
    return fp32_fp64_forward_at<64, typename Fp32Fp64FwdDefaultShape<Atom, 64>::type, Atom>(a, q, k, v, o,
                                                                                   lse);
  if (a.head_dim == 128)
    return fp32_fp64_forward_at<128, typename Fp32Fp64FwdDefaultShape<Atom, 128>::type, Atom>(a, q, k, v,
                                                                                     o, lse);
  throw std::invalid_argument("--fwd-variant needs head_dim 64 or 128");
}

/// The exact fp32 forward (FlashForwardExactFp32Kernel) with keys per block
/// BlockN64 / BlockN128 at head_dim 64 / 128, teams per SM, FastExp and
/// DmmaScores other than the library's, for experiments.
template <int BlockN64, int BlockN128, int MinBlocksPerSM, bool FastExp,
          bool DmmaScores = kfa::Impl::exact_fp32_dmma_scores(), class View4, class View3>
std::function<void()> exact_fp32_forward(const Args& a, View4 q, View4 k, View4 v, View4 o,
                                   View3 lse) {
  using Space = Kokkos::DefaultExecutionSpace;
  using kfa::Impl::FlashForwardExactFp32Kernel;
  const float scale = 1.0f / std::sqrt(float(a.head_dim));
  const bool causal = a.causal;
  if (a.head_dim == 64)
    return [=] {
      FlashForwardExactFp32Kernel<Space, 64, View4, View4, View4, View4, View3, BlockN64,
                             MinBlocksPerSM, FastExp, DmmaScores>(q, k, v, o, lse, scale, causal)
          .launch(Space());
    };
  if (a.head_dim == 128)
    return [=] {
      FlashForwardExactFp32Kernel<Space, 128, View4, View4, View4, View4, View3, BlockN128,
                             MinBlocksPerSM, FastExp, DmmaScores>(q, k, v, o, lse, scale, causal)
          .launch(Space());
    };
  throw std::invalid_argument("--fwd-variant exact_fp32_* needs head_dim 64 or 128");
}

/// A backward kernel other than the library's: D (delta) by the library's
/// preprocess kernel, dq zeroed, then the kernel, as dispatch_backward runs
/// them.
template <class Kernel, int D, class View4, class View3>
std::function<void()> backward_kernel_at(const Args& a, View4 q, View4 k, View4 v, View4 o,
                                         View3 lse, View4 d_o, View4 dq, View4 dk, View4 dv) {
  using Space = Kokkos::DefaultExecutionSpace;
  using T = typename View4::non_const_value_type;
  View3 delta("bench_device::delta", q.extent(0), q.extent(2), q.extent(1));
  const int rows = int(q.extent(1)), heads = int(q.extent(2));
  const T scale = T(1) / std::sqrt(T(D));
  const bool causal = a.causal;
  if (!Kernel::fits(Space())) throw std::invalid_argument("--bwd-variant: scratch too large");
  return [=] {
    const Space space;
    kfa::Impl::BackwardPreprocess<Space, View4, View4, View3>{o, d_o, delta, rows, heads, D}
        .launch(space);
    Kokkos::deep_copy(space, dq, T(0));
    Kernel(q, k, v, d_o, lse, delta, dq, dk, dv, scale, causal).launch(space);
  };
}

/// A DimSplit-2 backward shape whose first warp of a pair takes every
/// exponential (the "one_softmax" variant, the library before RESULTS v35).
template <class Shape>
struct OneWarpSoftmaxShape : Shape {
  static constexpr bool kSharedSoftmax = false;
};

/// The fp32/fp64 tensor-core backward with another tile shape (or atom)
/// than the library's.
template <int D, class Shape, class Atom, class View4, class View3>
std::function<void()> fp32_fp64_backward_at(const Args& a, View4 q, View4 k, View4 v, View4 o,
                                       View3 lse, View4 d_o, View4 dq, View4 dk, View4 dv) {
  using Kernel =
      kfa::Impl::FlashBackwardFp32Fp64Kernel<Kokkos::DefaultExecutionSpace, D, Atom, View4, View4,
                                            View4, View4, View3, View3, View4, View4, View4, Shape>;
  return backward_kernel_at<Kernel, D>(a, q, k, v, o, lse, d_o, dq, dk, dv);
}

#ifdef KOKKOS_ENABLE_CUDA
/// The exact fp32 backward with DmmaScores other than the library's.
template <int D, bool DmmaScores, class View4, class View3>
std::function<void()> exact_fp32_backward_at(const Args& a, View4 q, View4 k, View4 v, View4 o,
                                       View3 lse, View4 d_o, View4 dq, View4 dk, View4 dv) {
  using Kernel =
      kfa::Impl::FlashBackwardExactFp32Kernel<Kokkos::DefaultExecutionSpace, D, View4, View4, View4,
                                         View4, View3, View3, View4, View4, View4, DmmaScores>;
  return backward_kernel_at<Kernel, D>(a, q, k, v, o, lse, d_o, dq, dk, dv);
}
#endif

#if defined(KOKKOS_ENABLE_CUDA) && defined(__CUDACC__)
/// The Hopper (wgmma) backwards' kernels: FlashBackwardWgmmaKernel in the
/// shape of DqTma, EarlyDv, Pipelined and DqWide (kfa::Impl::WgmmaBwdShape's
/// members; head_dim 64 or 128), and FlashBackwardWgmmaProductSplitKernel
/// with DqOverlap and DqStaged (head_dim 256).
template <bool DqTma, bool EarlyDv = false, bool Pipelined = false, bool DqWide = false>
struct WgmmaBwdPick {
  static constexpr bool kD256 = false;
  static constexpr bool kD64 = !Pipelined;  // Pipelined runs head_dim 128 only
  struct Shape {
    static constexpr bool kDqTma = DqTma, kEarlyDv = EarlyDv, kPipelined = Pipelined,
                          kDqWide = DqWide;
  };
  template <int D, class Format, class View4, class View3, class Acc>
  using kernel = kfa::Impl::FlashBackwardWgmmaKernel<Kokkos::DefaultExecutionSpace, D, Format,
                                                     View4, View4, View4, View4, View3, View3,
                                                     Acc, View4, View4, Shape>;
};
template <bool DqOverlap, bool DqStaged = true>
struct Wgmma256BwdPick {
  static constexpr bool kD256 = true;
  template <int D, class Format, class View4, class View3, class Acc>
  using kernel =
      kfa::Impl::FlashBackwardWgmmaProductSplitKernel<Kokkos::DefaultExecutionSpace, Format, View4, View4,
                                             View4, View4, View3, View3, Acc, View4, View4,
                                             DqOverlap, DqStaged>;
};

/// A Hopper (wgmma) backward kernel of Pick (bf16 or fp16, as many k/v
/// heads as q heads), run as dispatch_backward runs the library's: D and
/// the zeroed fp32 dQ accumulator in one pass, the kernel, dQ rounded into
/// dq.
template <class Pick, class T, class View4, class View3>
std::function<void()> wgmma_backward(const Args& a, View4 q, View4 k, View4 v, View4 o,
                                     View3 lse, View4 d_o, View4 dq, View4 dk, View4 dv) {
  using Space = Kokkos::DefaultExecutionSpace;
  using Format = typename kfa::Impl::MmaFormat<Space, T>::type;
  if constexpr (!std::is_void<Format>::value) {
    if (!kfa::Impl::wgmma_available(Space()))
      throw std::invalid_argument("--bwd-variant wgmma_*: no sm_90a code for this GPU");
    if (q.extent(2) != k.extent(2))
      throw std::invalid_argument("--bwd-variant wgmma_*: as many k/v heads as q heads");
    using Acc = Kokkos::View<float****, Kokkos::LayoutRight, Space::memory_space>;
    const Acc acc("bench_device::dq_acc", q.extent(0), q.extent(1), q.extent(2), q.extent(3));
    const View3 delta("bench_device::delta", q.extent(0), q.extent(2), q.extent(1));
    const float scale = 1.0f / std::sqrt(float(a.head_dim));
    const bool causal = a.causal;
    auto make = [&](auto head_dim) -> std::function<void()> {
      constexpr int kD = decltype(head_dim)::value;
      using Kernel = typename Pick::template kernel<kD, Format, View4, View3, Acc>;
      if (!Kernel::fits(Space())) throw std::invalid_argument("--bwd-variant: scratch too large");
      return [=] {
        const Space space;
        kfa::Impl::BackwardPrep16Kernel<Format, kD>(
            reinterpret_cast<const std::uint16_t*>(o.data()),
            reinterpret_cast<const std::uint16_t*>(d_o.data()), delta.data(), acc.data(),
            int(q.extent(0)), int(q.extent(1)), int(q.extent(2)))
            .launch(space);
        Kernel(q, k, v, d_o, lse, delta, acc, dk, dv, scale, causal).launch(space);
        kfa::Impl::ConvertDq16Kernel<Format>(acc.data(), reinterpret_cast<std::uint16_t*>(dq.data()),
                                             long(dq.size()))
            .launch(space);
      };
    };
    if constexpr (Pick::kD256) {
      if (a.head_dim == 256) return make(std::integral_constant<int, 256>());
      throw std::invalid_argument("--bwd-variant wgmma256* needs head_dim 256");
    } else {
      if constexpr (Pick::kD64)
        if (a.head_dim == 64) return make(std::integral_constant<int, 64>());
      if (a.head_dim == 128) return make(std::integral_constant<int, 128>());
      throw std::invalid_argument(Pick::kD64 ? "--bwd-variant wgmma_* needs head_dim 64 or 128"
                                             : "--bwd-variant wgmma_pipelined needs head_dim 128");
    }
  }
  (void)q, (void)k, (void)v, (void)o, (void)lse, (void)d_o, (void)dq, (void)dk, (void)dv;
  throw std::invalid_argument("--bwd-variant wgmma_* needs bf16 or fp16");
}
#endif

/// fp64 backward variants at head_dim 64 (RESULTS v25): "w8" (m16n8k8 with
/// 8 warps, 128 keys per team, instead of 4 and 64); "split" (m16n8k8 with
/// two warps per 16 keys, each holding dK and dV for half the head
/// dimension: the library's shape at head_dim 128); "s2" (the library's
/// shape with two stages of Q and dO and one team per SM, the default
/// before run 46); at head_dim 128 "one_softmax" (the first warp of a pair
/// takes every exponential, before RESULTS v35). fp32: "exact_fp32_ffma" (the
/// exact kernel with Sᵀ and dPᵀ by fp32 FMAs, before RESULTS v30).
/// bf16/fp16 on a build with sm_90a code (RESULTS v41-v43): "wgmma" (the
/// Hopper backward with one bulk reduction per dQ row, v41), "wgmma_dqtma"
/// (bulk tensor reductions: the library's at head_dim 64, and at 128
/// before v47), "wgmma_early_dv" (Pᵀ while dPᵀ's products run, dV's
/// products before dSᵀ, v46), "wgmma_pipelined" (early_dv with one team
/// barrier a block, the next block's products issued behind dQ's stores,
/// head_dim 128: the library's there from v47 to v49),
/// "wgmma_pipelined_wide" and "wgmma_dqtma_wide" (those two with dQ's
/// tensor reductions in boxes of 32 fp32 a row, v49: "wgmma_pipelined_wide"
/// is the library's at head_dim 128 since); at head_dim 256 "wgmma256" (the library's Hopper kernel
/// there, v44), "wgmma256_overlap" (its dQ products issued behind
/// dV's and dK's) and "wgmma256_direct" (dQ's reductions straight from
/// the fragments, not staged in whole rows). ("wgmma256_split", each
/// warpgroup half the softmax, measured ±1% in RESULTS v44 and removed.)
template <class T, class View4, class View3>
std::function<void()> backward_variant(const Args& a, View4 q, View4 k, View4 v, View4 o,
                                       View3 lse, View4 d_o, View4 dq, View4 dk, View4 dv) {
  using kfa::Impl::Fp32Fp64BwdShape;
  namespace mma = kfa::Impl::cuda_mma;
#ifdef KOKKOS_ENABLE_CUDA
  if constexpr (std::is_same<T, float>::value) {
    if (a.bwd_variant == "exact_fp32_ffma" && a.head_dim == 64)
      return exact_fp32_backward_at<64, false>(a, q, k, v, o, lse, d_o, dq, dk, dv);
    if (a.bwd_variant == "exact_fp32_ffma" && a.head_dim == 128)
      return exact_fp32_backward_at<128, false>(a, q, k, v, o, lse, d_o, dq, dk, dv);
    throw std::invalid_argument(
        "--bwd-variant for fp32 must be default or exact_fp32_ffma (head_dim 64 or 128)");
  }
#endif
  if constexpr (std::is_same<T, double>::value) {
#if KFA_CUDA_FP64_M16
    using A16 = mma::Fp64x16Atom;
    if (a.bwd_variant == "w8" && a.head_dim == 64)
      return fp32_fp64_backward_at<64, Fp32Fp64BwdShape<8, 16, 1>, A16>(a, q, k, v, o, lse, d_o, dq, dk,
                                                               dv);
    if (a.bwd_variant == "split" && a.head_dim == 64)
      return fp32_fp64_backward_at<64, Fp32Fp64BwdShape<8, 16, 2>, A16>(a, q, k, v, o, lse, d_o, dq, dk,
                                                               dv);
    if (a.bwd_variant == "s2" && a.head_dim == 64)
      return fp32_fp64_backward_at<64, Fp32Fp64BwdShape<4, 16, 1, 2>, A16>(a, q, k, v, o, lse, d_o, dq,
                                                                  dk, dv);
    using kfa::Impl::Fp32Fp64BwdDefaultShape;
    if (a.bwd_variant == "one_softmax" && a.head_dim == 128)
      return fp32_fp64_backward_at<128,
                              OneWarpSoftmaxShape<typename Fp32Fp64BwdDefaultShape<A16, 128>::type>,
                              A16>(a, q, k, v, o, lse, d_o, dq, dk, dv);
#endif
    throw std::invalid_argument(
        "--bwd-variant for fp64 must be default, w8, split or s2 (head_dim 64) or one_softmax "
        "(head_dim 128), on a build for sm_90+");
  }
#if defined(KOKKOS_ENABLE_CUDA) && defined(__CUDACC__)
  auto wgmma = [&](auto pick) {
    return wgmma_backward<decltype(pick), T>(a, q, k, v, o, lse, d_o, dq, dk, dv);
  };
  if (a.bwd_variant == "wgmma") return wgmma(WgmmaBwdPick<false>());
  if (a.bwd_variant == "wgmma_dqtma") return wgmma(WgmmaBwdPick<true>());
  if (a.bwd_variant == "wgmma_early_dv") return wgmma(WgmmaBwdPick<true, true>());
  if (a.bwd_variant == "wgmma_pipelined") return wgmma(WgmmaBwdPick<true, true, true>());
  if (a.bwd_variant == "wgmma_pipelined_wide")
    return wgmma(WgmmaBwdPick<true, true, true, true>());
  if (a.bwd_variant == "wgmma_dqtma_wide") return wgmma(WgmmaBwdPick<true, false, false, true>());
  if (a.bwd_variant == "wgmma256") return wgmma(Wgmma256BwdPick<false>());
  if (a.bwd_variant == "wgmma256_overlap") return wgmma(Wgmma256BwdPick<true>());
  if (a.bwd_variant == "wgmma256_direct") return wgmma(Wgmma256BwdPick<false, false>());
#endif
  (void)q, (void)k, (void)v, (void)o, (void)lse, (void)d_o, (void)dq, (void)dk, (void)dv;
  throw std::invalid_argument(
      "--bwd-variant needs fp32 or fp64, or wgmma, wgmma_dqtma, wgmma_early_dv, "
      "wgmma_pipelined, wgmma_pipelined_wide, wgmma_dqtma_wide, wgmma256, wgmma256_overlap or "
      "wgmma256_direct (bf16, fp16 on CUDA)");
}

/// 16-bit types: "policy": the shape that fits Kokkos' TeamPolicy scratch
/// (4 warps of 16 query rows, 64 keys, one stage; the default before opt-in
/// shared memory); "policy_m2": the same with 2 m-tiles per warp and 32-key
/// blocks; "large_8w": the large shape with 8 warps of 16 rows; "large_n32":
/// the large shape with 32-key blocks (half the S registers). Hopper
/// (wgmma) shapes: "wgmma_nofold", "wgmma_2wg", "wgmma_n128", "wgmma_n64",
/// "wgmma_3wg", and with bulk tensor copies from a producer warp (RESULTS
/// v37) "wgmma_tma", "wgmma_tma_s3" (3 K/V stages), "wgmma_tma_1wg" (teams
/// of one warpgroup), "wgmma_tma_n128" (d 64: 128-key blocks); with the
/// producer a warpgroup whose registers the computing warpgroups take
/// (RESULTS v38-v40), one persistent team per SM: "wgmma_ws" (two
/// warpgroups, 128-key blocks, the library's at d 128; at d 256 64-key
/// blocks), "wgmma_ws_np" (wgmma_ws with a team per tile, v38; the
/// library's at d 256), "wgmma_ws_3wg" (three warpgroups; 128 keys at d 64,
/// the library's there; 64 at d 128), "wgmma_ws_3wg_np" (the same, a team
/// per tile); "wgmma_cpasync" (the library's shape
/// before v38, and for short causal sequences since v40).
/// fp32: "split_tf32" and "tf32" (Fp32Matmul options of the library's
/// dispatch), "exact_fp32_bn16" (the exact kernel with 16-key blocks, three teams
/// per SM), "exact_fp32_2teams" (64-key blocks at head_dim 64, 32 at 128, two
/// teams per SM: the shape before RESULTS run 48), "exact_fp32_expf" (the exact
/// kernel with expf, before RESULTS v26),
/// "exact_fp32_ffma" (the exact kernel with S by fp32 FMAs, before RESULTS v30),
/// "split_tf32_accum" (3xTF32 with every product summed inside the
/// tensor core, the default before RESULTS v23), "portable" (the portable
/// team kernel, as without opt-in shared memory), "fp32_fp64_128": 3xTF32 with
/// 128 query rows (4 warps x 2 atoms), 32 keys, one team per SM.
/// fp64: "m8n8k4": the m8n8k4 atom in its shapes (the default before
/// m16n8k8); "bn8": m16n8k8 with 8-key blocks, two teams per SM (the d 128
/// default before RESULTS v23); "w8_n16", "w8_n32": one team of 8 warps
/// (128 rows) with 16- or 32-key blocks (the d 128 default's shape).
template <class T, class View4, class View3>
std::function<void()> forward_variant(const Args& a, View4 q, View4 k, View4 v, View4 o,
                                      View3 lse) {
  using kfa::Impl::FwdMmaShape;
  using kfa::Impl::Fp32Fp64FwdShape;
  namespace mma = kfa::Impl::cuda_mma;
  if constexpr (std::is_same<T, float>::value) {
    if (a.fwd_variant == "split_tf32" || a.fwd_variant == "tf32") {
      kfa::AttentionOptions opt;
      opt.causal = a.causal;
      opt.fp32_matmul = fp32_matmul(a.fwd_variant);
      return [=] {
        kfa::flash_attention_forward(Kokkos::DefaultExecutionSpace(), q, k, v, o, lse, opt);
      };
    }
#ifdef KOKKOS_ENABLE_CUDA
    using kfa::Impl::exact_fp32_block_n;
    if (a.fwd_variant == "exact_fp32_bn16")
      return exact_fp32_forward<16, 16, 3, true>(a, q, k, v, o, lse);
    if (a.fwd_variant == "exact_fp32_2teams")
      return exact_fp32_forward<64, 32, 2, true>(a, q, k, v, o, lse);
    if (a.fwd_variant == "exact_fp32_expf")
      return exact_fp32_forward<exact_fp32_block_n<64>(), exact_fp32_block_n<128>(), kfa::Impl::exact_fp32_teams_per_sm(),
                          false>(a, q, k, v, o, lse);
    if (a.fwd_variant == "exact_fp32_ffma")
      return exact_fp32_forward<exact_fp32_block_n<64, false>(), exact_fp32_block_n<128, false>(),
                          kfa::Impl::exact_fp32_teams_per_sm<false>(), true, false>(a, q, k, v, o, lse);
#endif
    if (a.fwd_variant == "portable") {
      kfa::AttentionOptions opt;
      opt.causal = a.causal;
      opt.kernel_policy.opt_in_shared_memory = false;
      return [=] {
        kfa::flash_attention_forward(Kokkos::DefaultExecutionSpace(), q, k, v, o, lse, opt);
      };
    }
#ifdef KOKKOS_ENABLE_CUDA
    if (a.fwd_variant == "split_tf32_accum")
      return fp32_fp64_forward_default<mma::Tf32Atom<3, false>>(a, q, k, v, o, lse);
    if (a.fwd_variant == "fp32_fp64_128")
      return fp32_fp64_forward_shape<Fp32Fp64FwdShape<4, 2, 32, 1>, mma::Tf32x3Atom>(a, q, k, v, o, lse);
#endif
    throw std::invalid_argument(
        "--fwd-variant for fp32 must be default, split_tf32, split_tf32_accum, tf32, "
        "exact_fp32_bn16, exact_fp32_2teams, exact_fp32_expf, exact_fp32_ffma, portable or "
        "fp32_fp64_128");
  } else if constexpr (std::is_same<T, double>::value) {
#ifdef KOKKOS_ENABLE_CUDA
    if (a.fwd_variant == "m8n8k4") return fp32_fp64_forward_default<mma::Fp64Atom>(a, q, k, v, o, lse);
#if KFA_CUDA_FP64_M16
    if (a.fwd_variant == "bn8")
      return fp32_fp64_forward_shape<Fp32Fp64FwdShape<4, 1, 8, 2>, mma::Fp64x16Atom>(a, q, k, v, o, lse);
    if (a.fwd_variant == "w8_n16")
      return fp32_fp64_forward_shape<Fp32Fp64FwdShape<8, 1, 16, 1>, mma::Fp64x16Atom>(a, q, k, v, o, lse);
    if (a.fwd_variant == "w8_n32")
      return fp32_fp64_forward_shape<Fp32Fp64FwdShape<8, 1, 32, 1>, mma::Fp64x16Atom>(a, q, k, v, o, lse);
    using kfa::Impl::Fp32Fp64FwdDefaultShape;
    using A16 = mma::Fp64x16Atom;
    if (a.fwd_variant == "rescale_o" && a.head_dim == 64)
      return fp32_fp64_forward_at<64, RescaleOAlwaysShape<typename Fp32Fp64FwdDefaultShape<A16, 64>::type>,
                             A16>(a, q, k, v, o, lse);
    if (a.fwd_variant == "rescale_o" && a.head_dim == 128)
      return fp32_fp64_forward_at<128,
                             RescaleOAlwaysShape<typename Fp32Fp64FwdDefaultShape<A16, 128>::type>,
                             A16>(a, q, k, v, o, lse);
#endif
#endif
    throw std::invalid_argument(
        "--fwd-variant for fp64 must be default, m8n8k4, bn8, w8_n16, w8_n32 or rescale_o "
        "(head_dim 64 or 128)");
  } else {
    if (a.fwd_variant == "policy")
      return mma_forward_shape<FwdMmaShape<4, 1, 64, 1, 2>, T>(a, q, k, v, o, lse);
    if (a.fwd_variant == "policy_m2")
      return mma_forward_shape<FwdMmaShape<4, 2, 32, 1, 1>, T>(a, q, k, v, o, lse);
    if (a.fwd_variant == "large_8w")
      return mma_forward_shape<FwdMmaShape<8, 1, 64, 2, 1>, T>(a, q, k, v, o, lse);
    if (a.fwd_variant == "wgmma_nofold")
      return wgmma_forward<false, T>(a, q, k, v, o, lse);
    if (a.fwd_variant == "wgmma_2wg")  // the library's shape before RESULTS run 51
      return wgmma_forward<true, T, Run50WgmmaShape>(a, q, k, v, o, lse);
    if (a.fwd_variant == "wgmma_n128")  // 2 warpgroups, 128-key blocks, one team per SM
      return wgmma_forward<true, T, FixedWgmmaShape<128, 1, 2>>(a, q, k, v, o, lse);
    if (a.fwd_variant == "wgmma_n64")  // 2 warpgroups, 64-key blocks, one team per SM
      return wgmma_forward<true, T, FixedWgmmaShape<64, 1, 2>>(a, q, k, v, o, lse);
    if (a.fwd_variant == "wgmma_3wg")  // 3 warpgroups, 64-key blocks, one team per SM
      return wgmma_forward<true, T, FixedWgmmaShape<64, 1, 3>>(a, q, k, v, o, lse);
    if (a.fwd_variant == "wgmma_tma")  // producer warp, 3 (d 64) or 2 warpgroups, 64 keys
      return wgmma_forward<true, T, TmaWgmmaShape<3, 64>>(a, q, k, v, o, lse);
    if (a.fwd_variant == "wgmma_tma_n128")  // at d 64: 2 warpgroups, 128 keys
      return wgmma_forward<true, T, TmaWgmmaShape<2, 128>>(a, q, k, v, o, lse);
    if (a.fwd_variant == "wgmma_tma_s3")  // wgmma_tma with 3 K/V stages
      return wgmma_forward<true, T, TmaWgmmaShape<3, 64, 3>>(a, q, k, v, o, lse);
    if (a.fwd_variant == "wgmma_tma_1wg")  // teams of 1 warpgroup: 3 (d 64) or 2 per SM
      return wgmma_forward<true, T, TmaWgmmaShape<1, 64, 2, 1, 3, 2>>(a, q, k, v, o, lse);
    if (a.fwd_variant == "wgmma_ws")  // producer warpgroup, 2 warpgroups, 128 keys
      return wgmma_forward<true, T, WsWgmmaShape<2, 128>, true>(a, q, k, v, o, lse);
    if (a.fwd_variant == "wgmma_ws_np")  // wgmma_ws, a team per tile
      return wgmma_forward<true, T, WsWgmmaShape<2, 128, 2, false>, true>(a, q, k, v, o, lse);
    if (a.fwd_variant == "wgmma_ws_3wg")  // 3 warpgroups, 128 keys at d 64, 64 at 128
      return wgmma_forward<true, T, Ws3WgmmaShape<>>(a, q, k, v, o, lse);
    if (a.fwd_variant == "wgmma_ws_3wg_np")  // wgmma_ws_3wg, a team per tile
      return wgmma_forward<true, T, Ws3WgmmaShape<false>>(a, q, k, v, o, lse);
    if (a.fwd_variant == "wgmma_cpasync")  // the library's shape before v38
      return wgmma_forward<true, T, CpAsyncWgmmaShape>(a, q, k, v, o, lse);
    if (a.fwd_variant == "mma_large")
      return mma_forward_shape<FwdMmaShape<4, 2, 64, 2, 2>, T>(a, q, k, v, o, lse);
    if (a.fwd_variant == "large_n32")
      return mma_forward_shape<FwdMmaShape<4, 2, 32, 2, 2>, T>(a, q, k, v, o, lse);
    throw std::invalid_argument(
        "--fwd-variant must be default, policy, policy_m2, large_8w, mma_large, wgmma_nofold, "
        "wgmma_2wg, wgmma_n128, wgmma_n64, wgmma_3wg, wgmma_tma, wgmma_tma_n128, wgmma_tma_s3, "
        "wgmma_tma_1wg, wgmma_ws, wgmma_ws_np, wgmma_ws_3wg, wgmma_ws_3wg_np, "
        "wgmma_cpasync or large_n32");
  }
}

/// A learned relative-position bias (T5 / Swin style): rel(h, clamp(j - i) + R).
struct RelativeBias {
  static constexpr int kRadius = 128;
  Kokkos::View<const float**, Kokkos::LayoutRight, Kokkos::DefaultExecutionSpace::memory_space> rel;

  template <class Acc>
  KOKKOS_INLINE_FUNCTION Acc operator()(int, int h, int i, int j, Acc s) const {
    const int r = j - i < -kRadius ? -kRadius : (j - i > kRadius ? kRadius : j - i);
    return s + static_cast<Acc>(rel(h, r + kRadius));
  }
};

/// Documents packed in one sequence: a key is visible to a query of the same
/// document only; ids never decrease, so a tile whose id ranges do not meet
/// is skipped, and one inside a single document runs without the modifier
/// (FlexAttention's full blocks).
struct DocumentMask {
  Kokkos::View<const int**, Kokkos::LayoutRight, Kokkos::DefaultExecutionSpace::memory_space> doc;

  template <class Acc>
  KOKKOS_INLINE_FUNCTION Acc operator()(int b, int, int i, int j, Acc s) const {
    return doc(b, i) == doc(b, j) ? s : kfa::masked_score<Acc>();
  }
  KOKKOS_INLINE_FUNCTION bool visible(int b, int, int row_begin, int row_end, int key_begin,
                                      int key_end) const {
    return doc(b, row_begin) <= doc(b, key_end - 1) && doc(b, key_begin) <= doc(b, row_end - 1);
  }
  KOKKOS_INLINE_FUNCTION bool unchanged(int b, int, int row_begin, int row_end, int key_begin,
                                        int key_end) const {
    return doc(b, row_begin) == doc(b, row_end - 1) && doc(b, key_begin) == doc(b, key_end - 1) &&
           doc(b, row_begin) == doc(b, key_begin);
  }
};

/// Calls f with the score modifier --mod names (NoScoreMod for none).
template <class T, class F>
void with_mod(const Args& a, Kokkos::View<float*, Kokkos::DefaultExecutionSpace::memory_space>& slopes,
              F&& f) {
  using mem = Kokkos::DefaultExecutionSpace::memory_space;
  if (a.mod == "none") return f(kfa::Impl::NoScoreMod());
  if constexpr (!std::is_same<T, kfa::bfloat16>::value) {
    throw std::invalid_argument("--mod needs --dtype bf16");
  } else {
    if (a.mod == "alibi") {
      // kfa::alibi holds an unmanaged view of the slopes: `slopes` keeps
      // them alive for the caller's timed calls.
      slopes = Kokkos::View<float*, mem>("slopes", a.heads);
      auto h = Kokkos::create_mirror_view(slopes);
      for (int i = 0; i < a.heads; ++i) h(i) = std::pow(2.0f, -8.0f * (i + 1) / a.heads);
      Kokkos::deep_copy(slopes, h);
      return f(kfa::alibi(slopes));
    }
    if (a.mod == "relbias") {
      Kokkos::View<float**, Kokkos::LayoutRight, mem> rel("rel", a.heads,
                                                          2 * RelativeBias::kRadius + 1);
      read_into(rel, a.dir + "/rel.bin");
      return f(RelativeBias{rel});
    }
    Kokkos::View<int**, Kokkos::LayoutRight, mem> doc("doc", a.batch, a.seqlen);
    read_into(doc, a.dir + "/doc.bin");
    return f(DocumentMask{doc});
  }
}

template <class T>
void run(const Args& a) {
  using Space = Kokkos::DefaultExecutionSpace;
  using Acc = kfa::accumulator_t<T>;
  using View4 = Kokkos::View<T****, Kokkos::LayoutRight, Space::memory_space>;
  using View3 = Kokkos::View<Acc***, Kokkos::LayoutRight, Space::memory_space>;
  const int B = a.batch, N = a.seqlen, H = a.heads, D = a.head_dim;
  const int Hkv = a.heads_kv > 0 ? a.heads_kv : H;
  View4 q("q", B, N, H, D), k("k", B, N, Hkv, D), v("v", B, N, Hkv, D), d_o("d_o", B, N, H, D),
      o("o", B, N, H, D), dq("dq", B, N, H, D), dk("dk", B, N, Hkv, D), dv("dv", B, N, Hkv, D);
  View3 lse("lse", B, H, N);
  if (a.random) {
    fill_uniform<Space>({q, k, v, d_o});
  } else {
    read_into(q, a.dir + "/q.bin");
    read_into(k, a.dir + "/k.bin");
    read_into(v, a.dir + "/v.bin");
    read_into(d_o, a.dir + "/do.bin");
  }
  kfa::AttentionOptions opt;
  opt.kernel_policy.wgmma = a.wgmma;
  opt.kernel_policy.league_group_teams = a.league_group;
  opt.causal = a.causal;
  opt.fp32_matmul = fp32_matmul(a.fp32_matmul);
  opt.window_left = a.window_left;
  opt.window_right = a.window_right;
  opt.softcap = a.softcap;
  opt.dropout_p = a.dropout;
  opt.dropout_seed = 1;
  const Space space;
  std::function<void()> fwd, bwd;
  Kokkos::View<float*, Space::memory_space> slopes;
  if (a.packed > 0) {
    if (B != 1 || a.random || a.mod != "none")
      throw std::invalid_argument("--packed needs --batch 1, inputs from --dir and no --mod");
    // The packed tensors [total][heads][head_dim] over the same memory, lse
    // [heads][total].
    using Packed = Kokkos::View<T***, Kokkos::LayoutRight, Space::memory_space>;
    using PackedLse = Kokkos::View<Acc**, Kokkos::LayoutRight, Space::memory_space>;
    Kokkos::View<int*, Space::memory_space> cu("cu_seqlens", a.packed + 1);
    read_into(cu, a.dir + "/cu.bin");
    const auto cu_h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), cu);
    int longest = 0;
    for (int s = 0; s < a.packed; ++s) longest = std::max(longest, cu_h(s + 1) - cu_h(s));
    if (cu_h(0) != 0 || cu_h(a.packed) != N)
      throw std::invalid_argument("--packed: cu.bin must run from 0 to --seqlen");
    const Packed q3(q.data(), N, H, D), k3(k.data(), N, Hkv, D), v3(v.data(), N, Hkv, D),
        o3(o.data(), N, H, D), do3(d_o.data(), N, H, D), dq3(dq.data(), N, H, D),
        dk3(dk.data(), N, Hkv, D), dv3(dv.data(), N, Hkv, D);
    const PackedLse lse2(lse.data(), H, N);
    fwd = [=] {
      kfa::flash_attention_varlen_forward(space, q3, k3, v3, cu, cu, longest, longest, o3, lse2,
                                          opt);
    };
    bwd = [=] {
      kfa::flash_attention_varlen_backward(space, q3, k3, v3, cu, cu, longest, longest, o3, lse2,
                                           do3, dq3, dk3, dv3, opt);
    };
  } else {
    with_mod<T>(a, slopes, [&](auto mod) {
      fwd = [=] { kfa::flash_attention_forward(space, q, k, v, o, lse, opt, mod); };
      bwd = [=] {
        kfa::flash_attention_backward(space, q, k, v, o, lse, d_o, dq, dk, dv, opt, mod);
      };
    });
  }
  if (a.fwd_variant != "default") fwd = forward_variant<T>(a, q, k, v, o, lse);
  if (a.bwd_variant != "default") bwd = backward_variant<T>(a, q, k, v, o, lse, d_o, dq, dk, dv);
  std::vector<std::function<void()>> timed = {fwd};
  if (a.backward) {
    timed.push_back(bwd);
    timed.push_back([&] {
      fwd();
      bwd();
    });
    timed.push_back([&] {
      fwd();
      Kokkos::fence();
      bwd();
    });
  }
  const auto samples = sample_ms(a.warmup, a.iters, a.interleaved, timed);
  const double t_fwd = median(samples[0]);
  const double t_bwd = a.backward ? median(samples[1]) : -1;
  const double t_fwd_bwd = a.backward ? median(samples[2]) : -1;
  const double t_pair_fenced = a.backward ? median(samples[3]) : -1;
  if (!a.random) write_from(o, a.dir + "/o_kfa.bin");
  if (!a.random) write_from(lse, a.dir + "/lse_kfa.bin");
  if (a.backward && !a.random) {
    write_from(dq, a.dir + "/dq_kfa.bin");
    write_from(dk, a.dir + "/dk_kfa.bin");
    write_from(dv, a.dir + "/dv_kfa.bin");
  }
  // Whether the library's 16-bit forward runs the Hopper (wgmma) kernel.
  int wgmma = 0;
#ifdef KOKKOS_ENABLE_CUDA
  wgmma = a.wgmma && kfa::Impl::wgmma_available(space) ? 1 : 0;
#endif
  std::string trace;
  if (a.trace) {
    const char* names[] = {"fwd", "bwd", "fwd_bwd", "pair_fenced"};
    for (std::size_t i = 0; i < samples.size(); ++i)
      trace += std::string(", \"") + names[i] + "_all\": " + json_list(samples[i]);
  }
  std::printf("{\"fwd_ms\": %.6f, \"bwd_ms\": %.6f, \"fwd_bwd_ms\": %.6f, "
              "\"pair_fenced_ms\": %.6f, \"wgmma\": %d%s}\n",
              t_fwd, t_bwd, t_fwd_bwd, t_pair_fenced, wgmma, trace.c_str());
}

}  // namespace

int main(int argc, char* argv[]) {
  Kokkos::ScopeGuard guard(argc, argv);
  try {
    const Args a = parse(argc, argv);
    if (a.dtype == "bf16") run<kfa::bfloat16>(a);
    else if (a.dtype == "fp16") run<kfa::half>(a);
    else if (a.dtype == "fp32") run<float>(a);
    else if (a.dtype == "fp64") run<double>(a);
    else throw std::invalid_argument("--dtype must be bf16, fp16, fp32 or fp64");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_device: %s\n", e.what());
    return 1;
  }
  return 0;
}
