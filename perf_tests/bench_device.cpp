// Device side of the GPU harness (perf_tests/bench_device.py drives it):
// reads q, k, v, d_o written by PyTorch as raw little-endian arrays, runs kfa
// on the default execution space, times forward, backward and
// forward+backward (median of --iters fenced runs after --warmup), writes
// o, lse, dq, dk, dv back for the comparison, and prints one JSON line.
//
//   bench_device --dtype bf16|fp16|fp32|fp64 --batch B --seqlen N --heads H
//                --head-dim D [--causal] [--iters 20] [--warmup 3] [--no-bwd]
//                --dir /dev/shm/kfa_bench

#include <kfa/kfa.hpp>

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
#include <vector>

namespace {

struct Args {
  std::string dtype = "bf16", dir = "/dev/shm/kfa_bench";
  int batch = 1, seqlen = 1024, heads = 16, head_dim = 128, iters = 20, warmup = 3;
  bool causal = false, backward = true;
  /// Forward kernel variant for experiments on the tensor-core path:
  /// "default" (the library's dispatch), or a tile shape of
  /// mma_forward_variant(). (Earlier variants, lb3 and w8, are in RESULTS.md.)
  std::string fwd_variant = "default";
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
    else if (s == "--head-dim") a.head_dim = std::stoi(next());
    else if (s == "--iters") a.iters = std::stoi(next());
    else if (s == "--warmup") a.warmup = std::stoi(next());
    else if (s == "--causal") a.causal = true;
    else if (s == "--no-bwd") a.backward = false;
    else if (s == "--fwd-variant") a.fwd_variant = next();
    else throw std::invalid_argument("unknown argument " + s);
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

template <class F>
double median_ms(int warmup, int iters, F&& f) {
  for (int w = 0; w < warmup; ++w) f();
  Kokkos::fence();
  std::vector<double> t;
  for (int r = 0; r < iters; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    Kokkos::fence();
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                    .count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
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

/// "policy": the shape that fits Kokkos' TeamPolicy scratch (4 warps of 16
/// query rows, 64 keys, one stage; the default before opt-in shared memory);
/// "policy_m2": the same with 2 m-tiles per warp and 32-key blocks;
/// "large_8w": the large shape with 8 warps of 16 rows.
template <class T, class View4, class View3>
std::function<void()> mma_forward_variant(const Args& a, View4 q, View4 k, View4 v, View4 o,
                                          View3 lse) {
  using kfa::Impl::FwdMmaShape;
  if (a.fwd_variant == "policy")
    return mma_forward_shape<FwdMmaShape<4, 1, 64, 1, 2>, T>(a, q, k, v, o, lse);
  if (a.fwd_variant == "policy_m2")
    return mma_forward_shape<FwdMmaShape<4, 2, 32, 1, 1>, T>(a, q, k, v, o, lse);
  if (a.fwd_variant == "large_8w")
    return mma_forward_shape<FwdMmaShape<8, 1, 64, 2, 1>, T>(a, q, k, v, o, lse);
  throw std::invalid_argument("--fwd-variant must be default, policy, policy_m2 or large_8w");
}

template <class T>
void run(const Args& a) {
  using Space = Kokkos::DefaultExecutionSpace;
  using Acc = kfa::accumulator_t<T>;
  using View4 = Kokkos::View<T****, Kokkos::LayoutRight, Space::memory_space>;
  using View3 = Kokkos::View<Acc***, Kokkos::LayoutRight, Space::memory_space>;
  const int B = a.batch, N = a.seqlen, H = a.heads, D = a.head_dim;
  View4 q("q", B, N, H, D), k("k", B, N, H, D), v("v", B, N, H, D), d_o("d_o", B, N, H, D),
      o("o", B, N, H, D), dq("dq", B, N, H, D), dk("dk", B, N, H, D), dv("dv", B, N, H, D);
  View3 lse("lse", B, H, N);
  read_into(q, a.dir + "/q.bin");
  read_into(k, a.dir + "/k.bin");
  read_into(v, a.dir + "/v.bin");
  read_into(d_o, a.dir + "/do.bin");
  kfa::AttentionOptions opt;
  opt.causal = a.causal;
  const Space space;
  std::function<void()> fwd = [&] { kfa::flash_attention_forward(space, q, k, v, o, lse, opt); };
  if (a.fwd_variant != "default") fwd = mma_forward_variant<T>(a, q, k, v, o, lse);
  auto bwd = [&] { kfa::flash_attention_backward(space, q, k, v, o, lse, d_o, dq, dk, dv, opt); };
  const double t_fwd = median_ms(a.warmup, a.iters, fwd);
  double t_bwd = -1, t_fwd_bwd = -1;
  if (a.backward) {
    t_bwd = median_ms(a.warmup, a.iters, bwd);
    t_fwd_bwd = median_ms(a.warmup, a.iters, [&] {
      fwd();
      bwd();
    });
  }
  write_from(o, a.dir + "/o_kfa.bin");
  write_from(lse, a.dir + "/lse_kfa.bin");
  if (a.backward) {
    write_from(dq, a.dir + "/dq_kfa.bin");
    write_from(dk, a.dir + "/dk_kfa.bin");
    write_from(dv, a.dir + "/dv_kfa.bin");
  }
  std::printf("{\"fwd_ms\": %.6f, \"bwd_ms\": %.6f, \"fwd_bwd_ms\": %.6f}\n", t_fwd, t_bwd,
              t_fwd_bwd);
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
