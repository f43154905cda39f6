// Forward pass: flash and the materialised standard attention against the
// fp64 oracle, with bounds that grow with head_dim·eps and seqlen_k·eps
// (no GEMM's accuracy enters them) and, for float and double, within twice
// the error of the plain forward in the same precision.

#include "kfa_test_helpers.hpp"

#ifdef KOKKOS_ENABLE_CUDA
#include <kfa/detail/backend/cuda/forward/mma_sync.hpp>
#include <kfa/detail/backend/cuda/forward/fp32_fp64.hpp>
#endif

namespace kfa_test {
namespace {

template <class C>
class FlashForward : public ::testing::Test {};
TYPED_TEST_SUITE(FlashForward, AllConfigs);

template <class C>
void check_forward(const Shape& s, bool causal) {
  using Space = typename C::space;
  using T = typename C::value_type;
  using Acc = kfa::accumulator_t<T>;
  kfa::AttentionOptions opt;
  opt.causal = causal;
  opt.team_size = test_team_size<Space>();
  const Case c = make_case<T>(s, opt, "fwd");
  auto q = to_device<T, Space>(c.q, "q");
  auto k = to_device<T, Space>(c.k, "k");
  auto v = to_device<T, Space>(c.v, "v");
  DeviceView4<T, Space> o("o", s.batch, s.seqlen_q, s.heads, s.head_dim);
  DeviceView3<Acc, Space> lse("lse", s.batch, s.heads, s.seqlen_q);

  poison(o);
  poison(lse);
  kfa::flash_attention_forward(Space(), q, k, v, o, lse, opt);
  Space().fence();
  const Tensor o_flash = to_host(o), lse_flash = to_host(lse);

  poison(o);
  poison(lse);
  kfa::standard_attention_forward(Space(), q, k, v, o, lse, opt);
  Space().fence();
  const Tensor o_std = to_host(o), lse_std = to_host(lse);

  const std::string what = type_name<T>() + " " + Space::name() + " " + to_string(s) +
                           (causal ? " causal" : "") + " seed " +
                           std::to_string(test_seed("fwd" + to_string(s) + (causal ? "c" : "n")));
  const ForwardMagnitudes f = forward_magnitudes<T>(c);
  expect_forward_close<T>(what + " flash", o_flash, lse_flash, c.o_ref, c.lse_ref, f);
  expect_forward_close<T>(what + " standard", o_std, lse_std, c.o_ref, c.lse_ref, f, false);
}

const Shape forward_shapes[] = {
    {1, 1, 1, 1, 1},      {1, 97, 97, 1, 1},    {1, 97, 97, 2, 59},
    {2, 113, 203, 3, 80}, {3, 64, 64, 5, 32},   {1, 130, 130, 1, 256},
    {1, 200, 77, 2, 128}, {1, 1023, 1024, 1, 64},
    // head_dim 64 and 128 take the tensor-core path for 16-bit types on CUDA
    {2, 190, 333, 2, 64}, {1, 300, 129, 2, 128}, {1, 64, 64, 1, 128}};

TYPED_TEST(FlashForward, AwkwardShapes) {
  if (is_duplicate_config<TypeParam>()) GTEST_SKIP() << "half is float here";
  for (const Shape& s : forward_shapes) check_forward<TypeParam>(s, false);
}

TYPED_TEST(FlashForward, AwkwardShapesCausal) {
  if (is_duplicate_config<TypeParam>()) GTEST_SKIP() << "half is float here";
  for (const Shape& s : forward_shapes) check_forward<TypeParam>(s, true);
}

// Causal with seqlen_q > seqlen_k: the first rows see no key at all and must
// give O = 0 and lse = -inf, not NaN.
TYPED_TEST(FlashForward, CausalRowsWithoutKeys) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  using Acc = kfa::accumulator_t<T>;
  if (is_duplicate_config<TypeParam>()) GTEST_SKIP() << "half is float here";
  const Shape s{2, 150, 40, 2, 16};
  check_forward<TypeParam>(s, true);
  kfa::AttentionOptions opt;
  opt.causal = true;
  const Case c = make_case<T>(s, opt, "empty-rows");
  auto q = to_device<T, Space>(c.q, "q");
  auto k = to_device<T, Space>(c.k, "k");
  auto v = to_device<T, Space>(c.v, "v");
  DeviceView4<T, Space> o("o", s.batch, s.seqlen_q, s.heads, s.head_dim);
  DeviceView3<Acc, Space> lse("lse", s.batch, s.heads, s.seqlen_q);
  poison(o);
  kfa::flash_attention_forward(Space(), q, k, v, o, lse, opt);
  const Tensor oh = to_host(o), lh = to_host(lse);
  for (int b = 0; b < s.batch; ++b)
    for (int h = 0; h < s.heads; ++h)
      for (int i = 0; i < s.seqlen_q - s.seqlen_k; ++i) {
        EXPECT_TRUE(std::isinf(lh.at(b, h, i)) && lh.at(b, h, i) < 0) << "row " << i;
        for (int d = 0; d < s.head_dim; ++d) EXPECT_EQ(oh.at(b, i, h, d), 0.0) << "row " << i;
      }
}

// seqlen_k = 0: every row is empty.
TYPED_TEST(FlashForward, NoKeys) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  using Acc = kfa::accumulator_t<T>;
  DeviceView4<T, Space> q("q", 1, 5, 2, 8), k("k", 1, 0, 2, 8), v("v", 1, 0, 2, 8),
      o("o", 1, 5, 2, 8);
  DeviceView3<Acc, Space> lse("lse", 1, 2, 5);
  poison(o);
  kfa::flash_attention_forward(Space(), q, k, v, o, lse);
  const Tensor oh = to_host(o), lh = to_host(lse);
  for (double x : oh.data) EXPECT_EQ(x, 0.0);
  for (double x : lh.data) EXPECT_TRUE(std::isinf(x) && x < 0);
}

// An explicit softmax_scale is honoured, negative ones too (the tensor-core
// forward takes the row extreme on raw scores: the min for a negative scale).
// head_dim 64 takes the tensor-core and register-tiled paths on CUDA.
TYPED_TEST(FlashForward, ExplicitScale) {
  using T = typename TypeParam::value_type;
  if (is_duplicate_config<TypeParam>()) GTEST_SKIP() << "half is float here";
  using Space = typename TypeParam::space;
  using Acc = kfa::accumulator_t<T>;
  for (const Shape& s : {Shape{1, 70, 90, 2, 40}, Shape{1, 70, 90, 2, 64}}) {
    for (double scale : {0.37, -0.37}) {
      kfa::AttentionOptions opt;
      opt.softmax_scale = scale;
      opt.causal = scale < 0;
      opt.team_size = test_team_size<Space>();
      const Case c = make_case<T>(s, opt, "scale");
      auto q = to_device<T, Space>(c.q, "q");
      auto k = to_device<T, Space>(c.k, "k");
      auto v = to_device<T, Space>(c.v, "v");
      DeviceView4<T, Space> o("o", s.batch, s.seqlen_q, s.heads, s.head_dim);
      DeviceView3<Acc, Space> lse("lse", s.batch, s.heads, s.seqlen_q);
      poison(o);
      poison(lse);
      kfa::flash_attention_forward(Space(), q, k, v, o, lse, opt);
      expect_forward_close<T>(to_string(s) + " scale " + std::to_string(scale), to_host(o),
                              to_host(lse), c.o_ref, c.lse_ref, forward_magnitudes<T>(c));
    }
  }
}

#ifdef KOKKOS_ENABLE_CUDA
// The tensor-core forward has two tile shapes: the large one (opt-in shared
// memory, Q in scratch, K/V double buffered) that the library launches where
// the GPU grants it, and the one that fits Kokkos' TeamPolicy scratch, its
// fallback. The entry point only ever runs one of them on a given GPU, so
// both are launched here directly and checked against the oracle.
template <class T>
using DeviceIn4 = Kokkos::View<const T****, Kokkos::LayoutRight, Kokkos::CudaSpace>;

/// key_ramp > 0: key j of the case scaled by 1 + key_ramp · j / seqlen_k
/// (rounded to T, the reference recomputed), so that the scores, and a
/// row's running max, grow along the keys: the online softmax then moves its
/// max, and rescales O, many times.
template <class T>
void ramp_keys(Case& c, const Shape& s, const kfa::AttentionOptions& opt, double key_ramp) {
  if (key_ramp <= 0) return;
  const std::size_t row = std::size_t(kv_heads(s)) * s.head_dim;
  for (std::size_t n = 0; n < c.k.data.size(); ++n) {
    const int key = static_cast<int>((n / row) % s.seqlen_k);
    c.k.data[n] *= 1 + key_ramp * key / s.seqlen_k;
  }
  round_to<T>(c.k);
  reference_forward(c.q, c.k, c.v, opt, c.o_ref, c.lse_ref);
}

/// Launches Kernel (a 16-bit forward: mma.sync or wgmma) directly and checks
/// O and lse against the oracle (keys ramped by ramp_keys).
template <class Kernel, class T>
void check_fwd_kernel(const Shape& s, bool causal, double key_ramp = 0) {
  using Space = Kokkos::Cuda;
  using View4 = DeviceView4<T, Space>;
  using In4 = DeviceIn4<T>;
  using View3 = DeviceView3<float, Space>;
  constexpr int HeadDim = Kernel::kHeadDim;
  kfa::AttentionOptions opt;
  opt.causal = causal;
  Case c = make_case<T>(s, opt, "mma_shape");
  ramp_keys<T>(c, s, opt, key_ramp);
  const View4 q = to_device<T, Space>(c.q, "q"), k = to_device<T, Space>(c.k, "k"),
              v = to_device<T, Space>(c.v, "v");
  View4 o("o", s.batch, s.seqlen_q, s.heads, s.head_dim);
  View3 lse("lse", s.batch, s.heads, s.seqlen_q);
  poison(o);
  poison(lse);
  Kernel kernel(In4(q), In4(k), In4(v), o, lse, 1.0f / std::sqrt(float(HeadDim)), causal);
  ASSERT_TRUE(kernel.fits(Space()));
  kernel.launch(Space());
  Space().fence();
  const std::string what = type_name<T>() + " " + to_string(s) + (causal ? " causal" : "") +
                           " shape: " + std::to_string(kernel.kBlockM) + " rows, " +
                           std::to_string(kernel.kBlockN) + " keys, " +
                           std::to_string(kernel.kStages) + " stage(s)";
  expect_forward_close<T>(what, to_host(o), to_host(lse), c.o_ref, c.lse_ref,
                          forward_magnitudes<T>(c));
}

template <class MmaShape, int HeadDim, class T>
void check_mma_shape(const Shape& s, bool causal) {
  using Format = typename kfa::Impl::MmaFormat<Kokkos::Cuda, T>::type;
  check_fwd_kernel<kfa::Impl::FlashForwardMmaKernel<Kokkos::Cuda, HeadDim, Format, DeviceIn4<T>,
                                                    DeviceIn4<T>, DeviceIn4<T>,
                                                    DeviceView4<T, Kokkos::Cuda>,
                                                    DeviceView3<float, Kokkos::Cuda>, MmaShape>,
                   T>(s, causal);
}

/// BlockN = 0: the library's shape for HeadDim; else BlockN keys per block,
/// one team per SM, WarpGroups warpgroups a team, and with Tma the copies
/// by a producer warp (bulk tensor copies) into Stages buffers, with
/// Realloc from a producer warpgroup that gives its registers to the
/// others, with Persistent one team per SM that takes tile after tile.
template <int HeadDim, class T, bool FoldScale = true, int BlockN = 0, int WarpGroups = 0,
          bool Tma = false, int Stages = 2, bool Realloc = false, bool Persistent = false>
void check_wgmma(const Shape& s, bool causal, double key_ramp = 0) {
  using Format = typename kfa::Impl::MmaFormat<Kokkos::Cuda, T>::type;
  using L = kfa::Impl::WgmmaFwdShape<HeadDim>;
  constexpr bool lib = BlockN == 0;
  static_assert(lib || WarpGroups > 0, "check_wgmma: a shape of BlockN keys names its warpgroups");
  check_fwd_kernel<kfa::Impl::FlashForwardWgmmaKernel<
                       Kokkos::Cuda, HeadDim, Format, DeviceIn4<T>, DeviceIn4<T>, DeviceIn4<T>,
                       DeviceView4<T, Kokkos::Cuda>, DeviceView3<float, Kokkos::Cuda>, FoldScale,
                       lib ? L::kBlockN : BlockN, lib ? L::kMinBlocksPerSM : 1,
                       lib ? L::kWarpGroups : WarpGroups, lib ? L::kTma : Tma,
                       lib ? L::kStages : Stages, lib ? L::kRealloc : Realloc,
                       lib ? L::kPersistent : Persistent>,
                   T>(s, causal, key_ramp);
}

// The Hopper forward (wgmma), where this build has sm_90a code and the GPU
// is an sm_90, with the scale folded into the exponent (the default) and
// not: awkward lengths (partial query and key blocks, more keys
// than queries and fewer), both formats, every head dim, causal and not;
// the cp.async shapes: teams of one warpgroup with 64- and 128-key blocks
// (the library's shape before RESULTS v38, bench_device's wgmma_cpasync),
// of two and three warpgroups (wgmma_n64, wgmma_n128, wgmma_3wg) at
// head_dim 64 and 128; and scores that grow along the keys (key_ramp: the
// running max of a row moves, and O is rescaled, many times).
// The entry point runs it too (the typed tests) on such a GPU.
TEST(FlashForwardCuda, HopperWgmma) {
  if (!kfa::Impl::wgmma_available(Kokkos::Cuda())) {
    GTEST_SKIP() << "no sm_90 GPU, or this build has no sm_90a device code (KFA_CUDA_SM90A)";
  }
  for (bool causal : {false, true}) {
    for (const Shape& s : {Shape{2, 190, 333, 2, 64}, Shape{1, 1000, 257, 1, 64},
                           Shape{1, 128, 128, 3, 64}}) {
      check_wgmma<64, kfa::bfloat16>(s, causal);
      check_wgmma<64, kfa::half>(s, causal);
      check_wgmma<64, kfa::bfloat16, false>(s, causal);
      check_wgmma<64, kfa::half, true, 128, 1>(s, causal);
      check_wgmma<64, kfa::bfloat16, true, 64, 1>(s, causal);
    }
    for (const Shape& s : {Shape{1, 300, 129, 2, 128}, Shape{1, 257, 1000, 1, 128},
                           Shape{2, 512, 384, 2, 128}}) {
      check_wgmma<128, kfa::bfloat16>(s, causal);
      check_wgmma<128, kfa::half>(s, causal);
      check_wgmma<128, kfa::half, false>(s, causal);
      check_wgmma<128, kfa::bfloat16, true, 64, 1>(s, causal);
    }
    for (const Shape& s : {Shape{1, 200, 77, 2, 256}, Shape{1, 129, 300, 1, 256}}) {
      check_wgmma<256, kfa::bfloat16>(s, causal);
      check_wgmma<256, kfa::half>(s, causal);
      check_wgmma<256, kfa::bfloat16, true, 64, 2>(s, causal);
    }
    for (const Shape& s : {Shape{1, 300, 129, 2, 128}, Shape{2, 190, 333, 1, 128},
                           Shape{1, 100, 40, 2, 128}}) {
      check_wgmma<128, kfa::bfloat16, true, 128, 2>(s, causal);
      check_wgmma<128, kfa::half, true, 64, 2>(s, causal);
      check_wgmma<128, kfa::half, true, 64, 3>(s, causal);
    }
    for (const Shape& s : {Shape{2, 190, 333, 2, 64}, Shape{1, 257, 1000, 1, 64}}) {
      check_wgmma<64, kfa::half, true, 64, 2>(s, causal);
      check_wgmma<64, kfa::bfloat16, true, 64, 3>(s, causal);
    }
    check_wgmma<128, kfa::bfloat16, true, 128, 2>(Shape{1, 300, 1000, 2, 128}, causal, 4.0);
    check_wgmma<128, kfa::half, true, 64, 3>(Shape{1, 300, 1000, 2, 128}, causal, 4.0);
    check_wgmma<64, kfa::bfloat16>(Shape{1, 300, 1000, 2, 64}, causal, 4.0);
    check_wgmma<128, kfa::half>(Shape{1, 300, 1000, 2, 128}, causal, 4.0);
    check_wgmma<128, kfa::bfloat16, false>(Shape{1, 300, 1000, 2, 128}, causal, 4.0);
    check_wgmma<128, kfa::half, true, 64, 1>(Shape{1, 300, 1000, 2, 128}, causal, 4.0);
    check_wgmma<256, kfa::bfloat16>(Shape{1, 129, 700, 1, 256}, causal, 4.0);
  }
}

// The Hopper forward whose K, V and Q arrive by bulk tensor copies from a
// producer warp (bench_device's wgmma_tma, wgmma_tma_n128): partial query
// and key blocks (rows past the end arrive as zeros), fewer and more keys
// than one block, several batches and heads (the tensor maps'
// coordinates), more blocks than stages (the barriers' phases), causal and
// not, grouped-query heads (k and v maps of fewer heads), and a key ramp.
TEST(FlashForwardCuda, HopperWgmmaTma) {
  if (!kfa::Impl::wgmma_available(Kokkos::Cuda())) {
    GTEST_SKIP() << "no sm_90 GPU, or this build has no sm_90a device code (KFA_CUDA_SM90A)";
  }
  for (bool causal : {false, true}) {
    for (const Shape& s : {Shape{1, 300, 129, 2, 128}, Shape{2, 190, 333, 3, 128},
                           Shape{1, 100, 40, 2, 128}, Shape{1, 257, 1000, 1, 128},
                           Shape{2, 190, 333, 4, 128, 2}}) {
      check_wgmma<128, kfa::bfloat16, true, 64, 2, true>(s, causal);
      check_wgmma<128, kfa::half, true, 64, 2, true>(s, causal);
    }
    for (const Shape& s : {Shape{2, 190, 333, 2, 64}, Shape{1, 257, 1000, 1, 64},
                           Shape{1, 50, 30, 3, 64}, Shape{1, 257, 300, 6, 64, 2}}) {
      check_wgmma<64, kfa::bfloat16, true, 64, 3, true>(s, causal);
      check_wgmma<64, kfa::half, true, 128, 2, true>(s, causal);
    }
    check_wgmma<128, kfa::bfloat16, true, 64, 2, true>(Shape{1, 300, 1000, 2, 128}, causal, 4.0);
    check_wgmma<64, kfa::half, true, 64, 3, true>(Shape{1, 300, 1000, 2, 64}, causal, 4.0);
  }
}

// The Hopper forward fed by a producer warpgroup that gives its registers
// to the computing warpgroups (the library's shapes; bench_device's
// wgmma_ws, wgmma_ws_np, wgmma_ws_3wg): a team per tile and persistent
// teams, 2 and 3 stages, in the shapes of HopperWgmmaTma plus query rows
// that see no key under the causal mask (more queries than keys: then a
// tile has no key block), a single key block, and leagues of more tiles
// than an H200 has SMs (132: 240 and 192 tiles), so that a persistent team
// runs several tiles (the barriers' phases carried from tile to tile, the
// next tile's Q loaded while the last one's rows are written, tiles taken
// from the counter).
TEST(FlashForwardCuda, HopperWgmmaProducerWarpgroup) {
  if (!kfa::Impl::wgmma_available(Kokkos::Cuda())) {
    GTEST_SKIP() << "no sm_90 GPU, or this build has no sm_90a device code (KFA_CUDA_SM90A)";
  }
  for (bool causal : {false, true}) {
    for (const Shape& s : {Shape{1, 300, 129, 2, 128}, Shape{2, 190, 333, 3, 128},
                           Shape{1, 100, 40, 2, 128}, Shape{1, 1000, 257, 1, 128},
                           Shape{1, 128, 128, 2, 128}, Shape{2, 190, 333, 4, 128, 2},
                           Shape{2, 300, 200, 40, 128}, Shape{2, 300, 200, 40, 128, 8}}) {
      check_wgmma<128, kfa::bfloat16, true, 128, 2, true, 2, true>(s, causal);
      check_wgmma<128, kfa::bfloat16, true, 128, 2, true, 2, true, true>(s, causal);
      check_wgmma<128, kfa::bfloat16, true, 128, 2, true, 3, true, true>(s, causal);
      check_wgmma<128, kfa::half, true, 64, 3, true, 2, true, true>(s, causal);
      check_wgmma<128, kfa::half>(s, causal);
    }
    for (const Shape& s : {Shape{2, 190, 333, 2, 64}, Shape{1, 1000, 257, 1, 64},
                           Shape{1, 257, 300, 6, 64, 2}, Shape{2, 300, 200, 48, 64},
                           Shape{2, 400, 150, 48, 64, 12}}) {
      check_wgmma<64, kfa::bfloat16, true, 128, 2, true, 2, true, true>(s, causal);
      check_wgmma<64, kfa::half>(s, causal);
    }
    check_wgmma<256, kfa::bfloat16>(Shape{2, 130, 200, 3, 256}, causal);
    check_wgmma<128, kfa::bfloat16, true, 128, 2, true, 3, true, true>(Shape{1, 300, 1000, 2, 128},
                                                                       causal, 4.0);
    check_wgmma<128, kfa::half, true, 128, 2, true, 2, true>(Shape{1, 300, 1000, 2, 128}, causal,
                                                             4.0);
  }
}

TEST(FlashForwardCuda, TensorCoreTileShapes) {
  using namespace kfa::Impl;
  for (bool causal : {false, true}) {
    for (const Shape& s : {Shape{2, 190, 333, 2, 64}, Shape{1, 1000, 257, 1, 64}}) {
      check_mma_shape<FwdMmaLargeShape<64>, 64, kfa::bfloat16>(s, causal);
      check_mma_shape<FwdMmaPolicyShape<64>, 64, kfa::half>(s, causal);
    }
    for (const Shape& s : {Shape{1, 300, 129, 2, 128}, Shape{1, 257, 1000, 1, 128}}) {
      check_mma_shape<FwdMmaLargeShape<128>, 128, kfa::half>(s, causal);
      check_mma_shape<FwdMmaPolicyShape<128>, 128, kfa::bfloat16>(s, causal);
    }
    for (const Shape& s : {Shape{1, 200, 77, 2, 256}, Shape{1, 129, 300, 1, 256}}) {
      check_mma_shape<FwdMmaLargeShape<256>, 256, kfa::bfloat16>(s, causal);
      check_mma_shape<FwdMmaPolicyShape<256>, 256, kfa::half>(s, causal);
    }
  }
}

/// A case's inputs on the device with the materialised attention's O and
/// lse there, and their errors against the fp64 reference (the yardstick of
/// the fused kernels that then overwrite o and lse).
template <class T, class Space>
struct StandardOnDevice {
  DeviceView4<T, Space> q, k, v, o;
  DeviceView3<T, Space> lse;
  double err_o, err_lse;
};

template <class T, class Space>
StandardOnDevice<T, Space> standard_on_device(const Case& c, const kfa::AttentionOptions& opt) {
  const Shape& s = c.shape;
  StandardOnDevice<T, Space> d{to_device<T, Space>(c.q, "q"),
                               to_device<T, Space>(c.k, "k"),
                               to_device<T, Space>(c.v, "v"),
                               DeviceView4<T, Space>("o", s.batch, s.seqlen_q, s.heads, s.head_dim),
                               DeviceView3<T, Space>("lse", s.batch, s.heads, s.seqlen_q),
                               0,
                               0};
  kfa::standard_attention_forward(Space(), d.q, d.k, d.v, d.o, d.lse, opt);
  d.err_o = max_abs_diff(to_host(d.o), c.o_ref);
  d.err_lse = max_abs_diff(to_host(d.lse), c.lse_ref);
  return d;
}

// The fp32/fp64 tensor-core forward: the library's shapes run through the
// entry points in the typed tests; other shapes (those bench_device compares)
// are launched here directly, checked against the oracle like the 16-bit
// ones (fp64). tol_scale > 0 replaces that rule by a bound relative to
// max |O|: the tf32 atoms keep 22 (3xTF32) or 11 (tf32) of fp32's 24
// significand bits per operand, so their errors are about 10x and 1000x
// those of fp32 arithmetic.
template <class T>
using CudaIn4 = Kokkos::View<const T****, Kokkos::LayoutRight, Kokkos::CudaSpace>;

/// A forward kernel of value type T launched directly (views CudaIn4<T> in,
/// DeviceView4/3<T, Kokkos::Cuda> out), checked as above; `shape` names
/// its tile shape in the failure messages.
template <class T, class Kernel>
void check_forward_kernel(const Shape& s, bool causal, const std::string& shape,
                          double tol_scale = 0, double key_ramp = 0) {
  using Space = Kokkos::Cuda;
  using View4 = DeviceView4<T, Space>;
  using In4 = CudaIn4<T>;
  using View3 = DeviceView3<T, Space>;
  kfa::AttentionOptions opt;
  opt.causal = causal;
  Case c = make_case<T>(s, opt, "wide_shape");
  ramp_keys<T>(c, s, opt, key_ramp);
  const auto d = standard_on_device<T, Space>(c, opt);
  const View4 o = d.o;
  const View3 lse = d.lse;
  poison(o);
  poison(lse);
  Kernel kernel(In4(d.q), In4(d.k), In4(d.v), o, lse, T(1) / std::sqrt(T(Kernel::kHeadDim)),
                causal);
  ASSERT_TRUE(kernel.fits(Space()));
  kernel.launch(Space());
  Space().fence();
  const std::string what =
      type_name<T>() + " " + to_string(s) + (causal ? " causal" : "") + " shape: " + shape;
  const double err_o = max_abs_diff(to_host(o), c.o_ref);
  const double err_lse = max_abs_diff(to_host(lse), c.lse_ref);
  if (tol_scale > 0) {
    EXPECT_LE(err_o, tol_scale * std::max(1.0, max_abs(c.o_ref))) << what;
    EXPECT_LE(err_lse, tol_scale * std::max(1.0, max_abs(c.lse_ref))) << what;
  } else {
    expect_forward_close<T>(what, to_host(o), to_host(lse), c.o_ref, c.lse_ref,
                            forward_magnitudes<T>(c));
  }
}

template <class Fp32Fp64Shape, int HeadDim, class Atom>
void check_fp32_fp64_shape(const Shape& s, bool causal, double tol_scale = 0, double key_ramp = 0) {
  using T = typename Atom::value_type;
  using Kernel =
      kfa::Impl::FlashForwardFp32Fp64Kernel<Kokkos::Cuda, HeadDim, Atom, CudaIn4<T>, CudaIn4<T>,
                                           CudaIn4<T>, DeviceView4<T, Kokkos::Cuda>,
                                           DeviceView3<T, Kokkos::Cuda>, Fp32Fp64Shape>;
  check_forward_kernel<T, Kernel>(s, causal,
                                  std::to_string(Kernel::kBlockM) + " rows, " +
                                      std::to_string(Kernel::kBlockN) + " keys, " +
                                      std::to_string(Kernel::kWarps) + " warps",
                                  tol_scale, key_ramp);
}

TEST(FlashForwardCuda, Fp32Fp64TensorCoreTileShapes) {
  using namespace kfa::Impl;
  namespace mma = kfa::Impl::cuda_mma;
  for (bool causal : {false, true}) {
    for (const Shape& s : {Shape{2, 190, 333, 2, 64}, Shape{1, 1000, 257, 1, 64}}) {
      check_fp32_fp64_shape<Fp32Fp64FwdDefaultShape<mma::Fp64Atom, 64>::type, 64, mma::Fp64Atom>(s, causal);
      check_fp32_fp64_shape<Fp32Fp64FwdDefaultShape<mma::Tf32x3Atom, 64>::type, 64, mma::Tf32x3Atom>(
          s, causal, 1.5e-5);
      check_fp32_fp64_shape<Fp32Fp64FwdShape<8, 1, 16, 1>, 64, mma::Fp64Atom>(s, causal);
      check_fp32_fp64_shape<Fp32Fp64FwdShape<4, 2, 32, 1>, 64, mma::Tf32x3Atom>(s, causal, 1.5e-5);
#if KFA_CUDA_FP64_M16
      check_fp32_fp64_shape<Fp32Fp64FwdDefaultShape<mma::Fp64x16Atom, 64>::type, 64, mma::Fp64x16Atom>(
          s, causal);
      check_fp32_fp64_shape<Fp32Fp64FwdShape<4, 1, 8, 2>, 64, mma::Fp64x16Atom>(s, causal);
#endif
      check_fp32_fp64_shape<Fp32Fp64FwdDefaultShape<mma::Tf32Atom<1>, 64>::type, 64, mma::Tf32Atom<1>>(
          s, causal, 1e-2);
    }
    for (const Shape& s : {Shape{1, 300, 129, 2, 128}, Shape{1, 257, 1000, 1, 128}}) {
      check_fp32_fp64_shape<Fp32Fp64FwdDefaultShape<mma::Fp64Atom, 128>::type, 128, mma::Fp64Atom>(s,
                                                                                        causal);
      check_fp32_fp64_shape<Fp32Fp64FwdDefaultShape<mma::Tf32x3Atom, 128>::type, 128, mma::Tf32x3Atom>(
          s, causal, 1.5e-5);
      check_fp32_fp64_shape<Fp32Fp64FwdShape<8, 1, 16, 1>, 128, mma::Fp64Atom>(s, causal);
      check_fp32_fp64_shape<Fp32Fp64FwdShape<4, 2, 32, 1>, 128, mma::Tf32x3Atom>(s, causal, 1.5e-5);
#if KFA_CUDA_FP64_M16
      check_fp32_fp64_shape<Fp32Fp64FwdDefaultShape<mma::Fp64x16Atom, 128>::type, 128, mma::Fp64x16Atom>(
          s, causal);
      check_fp32_fp64_shape<Fp32Fp64FwdShape<4, 1, 8, 2>, 128, mma::Fp64x16Atom>(s, causal);
#endif
    }
    // Scores that grow along the keys, so that fp64's lazy rescale (only
    // when a row's max rises by more than 16) fires many times per row.
    const Shape ramp{1, 300, 1000, 2, 128};
    check_fp32_fp64_shape<Fp32Fp64FwdDefaultShape<mma::Fp64Atom, 128>::type, 128, mma::Fp64Atom>(
        ramp, causal, 0, 40.0);
#if KFA_CUDA_FP64_M16
    check_fp32_fp64_shape<Fp32Fp64FwdDefaultShape<mma::Fp64x16Atom, 128>::type, 128, mma::Fp64x16Atom>(
        ramp, causal, 0, 40.0);
    check_fp32_fp64_shape<Fp32Fp64FwdDefaultShape<mma::Fp64x16Atom, 64>::type, 64, mma::Fp64x16Atom>(
        Shape{1, 300, 1000, 2, 64}, causal, 0, 40.0);
#endif
  }
}

// The exact fp32 forward with S on the fp64 tensor cores (the default on
// sm_90+) and on fp32 FMAs (the default before, bench_device's
// exact_fp32_ffma), both held to fp32 arithmetic's error; and scores that
// grow along the keys (many rescales of O per row).
template <int HeadDim, bool DmmaScores>
void check_exact_fp32_forward(const Shape& s, bool causal, double key_ramp = 0) {
  using Kernel =
      kfa::Impl::FlashForwardExactFp32Kernel<Kokkos::Cuda, HeadDim, CudaIn4<float>, CudaIn4<float>,
                                        CudaIn4<float>, DeviceView4<float, Kokkos::Cuda>,
                                        DeviceView3<float, Kokkos::Cuda>,
                                        kfa::Impl::exact_fp32_block_n<HeadDim, DmmaScores>(),
                                        kfa::Impl::exact_fp32_teams_per_sm<DmmaScores>(), true,
                                        DmmaScores>;
  check_forward_kernel<float, Kernel>(
      s, causal, std::string(DmmaScores ? "S on fp64 tensor cores" : "S on fp32 FMAs"), 0,
      key_ramp);
}

TEST(FlashForwardCuda, ExactFp32ScoreProducts) {
  for (bool causal : {false, true}) {
    for (const Shape& s : {Shape{2, 190, 333, 2, 64}, Shape{1, 1000, 257, 1, 64}}) {
      check_exact_fp32_forward<64, false>(s, causal);
#if KFA_CUDA_FP64_M16
      check_exact_fp32_forward<64, true>(s, causal);
#endif
    }
    for (const Shape& s : {Shape{1, 300, 129, 2, 128}, Shape{1, 257, 1000, 1, 128}}) {
      check_exact_fp32_forward<128, false>(s, causal);
#if KFA_CUDA_FP64_M16
      check_exact_fp32_forward<128, true>(s, causal);
#endif
    }
    check_exact_fp32_forward<128, false>(Shape{1, 300, 1000, 2, 128}, causal, 40.0);
#if KFA_CUDA_FP64_M16
    check_exact_fp32_forward<128, true>(Shape{1, 300, 1000, 2, 128}, causal, 40.0);
#endif
  }
}

// 3xTF32 on long rows (4096 keys): the forward sums each K/V block's P·V
// (and each 4 k-steps of S) in fresh accumulators and adds them in fp32, so
// its O error is no worse than exact fp32's (measured 0.35-0.42x that of
// the materialised fp32 attention) instead of growing with the keys as it
// did with O accumulated inside the tensor core (15-16x exact fp32's,
// RESULTS v23). Both errors are printed; the bound is on the default atom.
TEST(FlashForwardCuda, SplitTf32LongRows) {
  using Space = Kokkos::Cuda;
  using View4 = DeviceView4<float, Space>;
  using In4 = Kokkos::View<const float****, Kokkos::LayoutRight, Space::memory_space>;
  using View3 = DeviceView3<float, Space>;
  namespace mma = kfa::Impl::cuda_mma;
  using kfa::Impl::FlashForwardFp32Fp64Kernel;
  using kfa::Impl::Fp32Fp64FwdDefaultShape;
  auto run = [](const Shape& s, auto head_dim_tag) {
    constexpr int D = decltype(head_dim_tag)::value;
    kfa::AttentionOptions opt;
    const Case c = make_case<float>(s, opt, "long_rows");
    const auto d = standard_on_device<float, Space>(c, opt);
    const double err_std = d.err_o;
    auto error_of = [&](auto atom) {
      using Atom = decltype(atom);
      poison(d.o);
      FlashForwardFp32Fp64Kernel<Space, D, Atom, In4, In4, In4, View4, View3,
                                typename Fp32Fp64FwdDefaultShape<Atom, D>::type>(
          In4(d.q), In4(d.k), In4(d.v), d.o, d.lse, 1.0f / std::sqrt(float(D)), false)
          .launch(Space());
      Space().fence();
      return max_abs_diff(to_host(d.o), c.o_ref);
    };
    const double err = error_of(mma::Tf32x3Atom{});
    const double err_accum = error_of(mma::Tf32Atom<3, false>{});
    std::cout << "3xTF32 " << to_string(s) << ": O error " << err << " (summed in the tensor core: "
              << err_accum << "), exact fp32 standard's " << err_std << "\n";
    EXPECT_LE(err, err_std) << to_string(s) << ": O error " << err << ", fp32 standard's "
                                << err_std << ", summed in the tensor core " << err_accum;
  };
  run(Shape{1, 128, 4096, 2, 64}, std::integral_constant<int, 64>());
  run(Shape{1, 128, 4096, 2, 128}, std::integral_constant<int, 128>());
}

// Fp32Matmul through the entry point: ieee (the default) keeps fp32 exact,
// split_tf32 and tf32 take the tensor cores with their own bounds, and each
// is visibly what it claims (tf32 less precise than fp32).
TEST(FlashForwardCuda, Fp32MatmulOptions) {
  using Space = Kokkos::Cuda;
  for (const Shape& s : {Shape{1, 300, 129, 2, 128}, Shape{2, 190, 333, 2, 64}}) {
    for (kfa::Fp32Matmul mode :
         {kfa::Fp32Matmul::ieee, kfa::Fp32Matmul::split_tf32, kfa::Fp32Matmul::tf32}) {
      kfa::AttentionOptions opt;
      opt.fp32_matmul = mode;
      const Case c = make_case<float>(s, opt, "fp32_matmul");
      const auto d = standard_on_device<float, Space>(c, opt);
      const double err_std = d.err_o;
      poison(d.o);
      poison(d.lse);
      kfa::flash_attention_forward(Space(), d.q, d.k, d.v, d.o, d.lse, opt);
      const double err = max_abs_diff(to_host(d.o), c.o_ref);
      const double size = std::max(1.0, max_abs(c.o_ref));
      const std::string what = to_string(s) + " mode " + std::to_string(int(mode));
      if (mode == kfa::Fp32Matmul::ieee) {
        expect_forward_close<float>(what, to_host(d.o), to_host(d.lse), c.o_ref, c.lse_ref,
                                    forward_magnitudes<float>(c));
      } else if (mode == kfa::Fp32Matmul::split_tf32) {
        EXPECT_LE(err, 1.5e-5 * size) << what << ": O error " << err;
      } else {
        EXPECT_LE(err, 1e-2 * size) << what << ": O error " << err;
        EXPECT_GT(err, 10 * err_std) << what << ": O error " << err << ", fp32 standard's "
                                     << err_std;
      }
    }
  }
}
#endif

#ifdef KOKKOS_ENABLE_OPENMP
// Rows are owned by one thread whatever the team size, so the result must not
// depend on it: team barriers are exercised and checked to be sufficient.
TEST(FlashForwardOpenMP, TeamSizeDoesNotChangeResults) {
  using Space = Kokkos::OpenMP;
  const int max_team = std::min(4, static_cast<int>(Space().concurrency()));
  ASSERT_GE(max_team, 2) << "run with OMP_NUM_THREADS >= 2 to exercise team barriers";
  const Shape s{2, 301, 277, 3, 72};
  kfa::AttentionOptions opt;
  opt.causal = true;
  const Case c = make_case<float>(s, opt, "team");
  auto q = to_device<float, Space>(c.q, "q");
  auto k = to_device<float, Space>(c.k, "k");
  auto v = to_device<float, Space>(c.v, "v");
  DeviceView4<float, Space> o("o", s.batch, s.seqlen_q, s.heads, s.head_dim);
  DeviceView3<float, Space> lse("lse", s.batch, s.heads, s.seqlen_q);
  opt.team_size = 1;
  kfa::flash_attention_forward(Space(), q, k, v, o, lse, opt);
  const Tensor o1 = to_host(o), l1 = to_host(lse);
  for (int team = 2; team <= max_team; ++team) {
    opt.team_size = team;
    poison(o);
    poison(lse);
    kfa::flash_attention_forward(Space(), q, k, v, o, lse, opt);
    EXPECT_EQ(max_abs_diff(to_host(o), o1), 0.0) << "team size " << team;
    EXPECT_EQ(max_abs_diff(to_host(lse), l1), 0.0) << "team size " << team;
  }
}
#endif

}  // namespace
}  // namespace kfa_test
