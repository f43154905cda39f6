// Backward pass: dq, dk, dv against the fp64 oracle with the same-precision
// materialised backward as yardstick; central finite differences on the fp64
// path; deterministic mode bitwise reproducible.

#include "kfa_test_helpers.hpp"

namespace kfa_test {
namespace {

template <class C>
class FlashBackward : public ::testing::Test {};
TYPED_TEST_SUITE(FlashBackward, AllConfigs);

template <class C>
void check_backward(const Shape& s, bool causal, bool deterministic,
                    kfa::Experimental::KernelPolicy policy = {}) {
  using Space = typename C::space;
  using T = typename C::value_type;
  kfa::AttentionOptions opt;
  opt.kernel_policy = policy;
  opt.causal = causal;
  opt.deterministic = deterministic;
  opt.team_size = test_team_size<Space>();
  const Case c = make_case<T>(s, opt, "bwd");
  const auto flash = run_flash<T, Space>(c, opt);

  Tensor dq_ref, dk_ref, dv_ref, dq_plain, dk_plain, dv_plain;
  reference_backward<double, true>(c.q, c.k, c.v, c.o_ref, c.lse_ref, c.d_o, opt, dq_ref,
                                   dk_ref, dv_ref);
  Tensor o_t = c.o_ref;
  round_to<T>(o_t);
  reference_backward<T>(c.q, c.k, c.v, o_t, c.lse_ref, c.d_o, opt, dq_plain, dk_plain,
                        dv_plain);
  const std::string what = type_name<T>() + " " + Space::name() + " " + to_string(s) +
                           (causal ? " causal" : "") +
                           (deterministic ? " deterministic" : "");
  auto check = [&](const char* name, const Tensor& got, const Tensor& plain,
                   const Tensor& ref) {
    const double err = max_abs_diff(got, ref), err_plain = max_abs_diff(plain, ref);
    EXPECT_LE(err, allowed_error<T>(err_plain, ref))
        << what << ": " << name << " error " << err << ", plain backward's " << err_plain;
  };
  check("dq", flash.dq, dq_plain, dq_ref);
  check("dk", flash.dk, dk_plain, dk_ref);
  check("dv", flash.dv, dv_plain, dv_ref);
}

const Shape backward_shapes[] = {
    {1, 1, 1, 1, 1},      {1, 97, 97, 2, 59}, {2, 113, 203, 3, 80}, {3, 64, 64, 5, 32},
    {1, 130, 100, 1, 256}, {1, 200, 77, 2, 128}, {1, 1023, 1024, 1, 64},
    // head_dim 64 and 128 take the tensor-core path for 16-bit types on CUDA
    {2, 190, 333, 2, 64}, {1, 300, 129, 2, 128}};

TYPED_TEST(FlashBackward, AwkwardShapes) {
  if (is_duplicate_config<TypeParam>()) GTEST_SKIP() << "half is float here";
  for (const Shape& s : backward_shapes) check_backward<TypeParam>(s, false, false);
}

TYPED_TEST(FlashBackward, AwkwardShapesCausal) {
  if (is_duplicate_config<TypeParam>()) GTEST_SKIP() << "half is float here";
  for (const Shape& s : backward_shapes) check_backward<TypeParam>(s, true, false);
  check_backward<TypeParam>({2, 150, 40, 2, 16}, true, false);  // rows with no key
  check_backward<TypeParam>({1, 40, 150, 2, 16}, true, false);
}

// The backward's temporary memory (on CUDA kept per stream between calls,
// growing only): a call after a larger one reuses its dq accumulator, which
// must be zeroed again; release_workspaces() frees it and the next call
// allocates anew. Every call matches the reference.
TYPED_TEST(FlashBackward, WorkspaceReusedAndReleased) {
  if (is_duplicate_config<TypeParam>()) GTEST_SKIP() << "half is float here";
  check_backward<TypeParam>({2, 190, 333, 2, 64}, false, false);
  check_backward<TypeParam>({1, 64, 128, 2, 64}, false, false);  // smaller: reused
  kfa::release_workspaces();
  check_backward<TypeParam>({1, 64, 128, 2, 64}, true, false);     // allocated again
  check_backward<TypeParam>({1, 300, 129, 2, 128}, false, false);  // grown
}

// The workspace cache (on host memory here; CUDA keys it by stream): a
// request reuses its (key, slot)'s buffer, grows it when too small, and gets
// a private buffer while another holder keeps the cached one (a call in
// flight on another host thread); clear() empties it.
TEST(Workspace, CacheReusesGrowsAndKeepsHeldBuffersPrivate) {
  using kfa::Impl::WorkspaceSlot;
  kfa::Impl::WorkspaceCache<Kokkos::HostSpace, int> cache;
  const unsigned char* first = nullptr;
  {
    const auto a = cache.get(1, WorkspaceSlot::dq_accum, 4096, "test::a");
    first = a.data();
    EXPECT_EQ(a.extent(0), 4096u);
  }
  {
    const auto b = cache.get(1, WorkspaceSlot::dq_accum, 1024, "test::b");
    EXPECT_EQ(b.data(), first);  // reused, not shrunk
    EXPECT_EQ(b.extent(0), 4096u);
    const auto c = cache.get(1, WorkspaceSlot::dq_accum, 1024, "test::c");
    EXPECT_NE(c.data(), b.data());  // b is held: private
    EXPECT_EQ(c.extent(0), 1024u);
    const auto d = cache.get(2, WorkspaceSlot::dq_accum, 1024, "test::d");
    const auto e = cache.get(1, WorkspaceSlot::delta, 1024, "test::e");
    EXPECT_NE(d.data(), b.data());
    EXPECT_NE(e.data(), b.data());
    EXPECT_NE(e.data(), d.data());
  }
  {
    const auto f = cache.get(1, WorkspaceSlot::dq_accum, 8192, "test::f");
    EXPECT_EQ(f.extent(0), 8192u);  // grown
    const auto g = cache.get(2, WorkspaceSlot::dq_accum, 512, "test::g");
    EXPECT_EQ(g.extent(0), 1024u);
  }
  EXPECT_EQ(cache.size(), 3u);  // (1, dq_accum), (2, dq_accum), (1, delta)
  cache.clear();
  EXPECT_EQ(cache.size(), 0u);
}

#ifdef KOKKOS_ENABLE_CUDA
// The CUDA workspace: cached per stream (a later request on the stream
// reuses the buffer), another stream gets its own, release_workspaces()
// empties the cache.
TEST(FlashBackwardCuda, WorkspaceCachedPerStream) {
  using kfa::Impl::WorkspaceSlot;
  kfa::release_workspaces();
  const Kokkos::Cuda space;
  const unsigned char* first = nullptr;
  {
    const auto a = kfa::Impl::workspace(space, WorkspaceSlot::dq_accum, 4096, "test::a");
    first = a.data();
  }
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  {
    const auto b = kfa::Impl::workspace(space, WorkspaceSlot::dq_accum, 1024, "test::b");
    EXPECT_EQ(b.data(), first);
    EXPECT_EQ(b.extent(0), 4096u);
    const Kokkos::Cuda other(stream);
    const auto e = kfa::Impl::workspace(other, WorkspaceSlot::dq_accum, 1024, "test::e");
    EXPECT_NE(e.data(), b.data());
    EXPECT_EQ(e.extent(0), 1024u);
  }
  kfa::release_workspaces();  // frees the other stream's buffer before its stream
  ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);
  const auto f = kfa::Impl::workspace(space, WorkspaceSlot::dq_accum, 1024, "test::f");
  EXPECT_EQ(f.extent(0), 1024u);  // a new buffer after the release
}

/// The 16-bit backward, causal and not, on `shapes` in bf16 and fp16 with
/// `policy` pinning a path.
void check_16bit_backward(const std::vector<Shape>& shapes,
                          const kfa::Experimental::KernelPolicy& policy) {
  for (bool causal : {false, true})
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      if (i % 2 == 0)
        check_backward<Config<Kokkos::Cuda, kfa::bfloat16>>(shapes[i], causal, false, policy);
      else
        check_backward<Config<Kokkos::Cuda, kfa::half, true>>(shapes[i], causal, false, policy);
    }
}

// Where the GPU grants opt-in shared memory the tensor-core kernels run in
// their large shapes (launched by the backend layer); elsewhere in the shapes
// that fit Kokkos' TeamPolicy scratch. The typed tests above run the former
// on this GPU; this one runs the latter, forward and backward (head_dim 256:
// the portable kernels).
TEST(FlashBackwardCuda, TeamPolicyShapesWithoutOptInSharedMemory) {
  kfa::Experimental::KernelPolicy policy;
  policy.opt_in_shared_memory = false;
  check_16bit_backward({{2, 190, 333, 2, 64}, {1, 129, 300, 2, 128}, {1, 300, 129, 2, 128},
                        {1, 130, 100, 1, 256}},
                       policy);
}

// On Hopper with sm_90a code the typed tests run the wgmma kernels; this
// one runs the mma.sync kernels (large shapes) there too, forward and
// backward, on the shapes the typed tests give the tensor cores. Elsewhere
// it repeats what the typed tests check.
TEST(FlashBackwardCuda, MmaSyncKernelsWithoutWgmma) {
  kfa::Experimental::KernelPolicy policy;
  policy.wgmma = false;
  check_16bit_backward({{2, 190, 333, 2, 64}, {1, 129, 300, 2, 128}, {1, 300, 129, 2, 128},
                        {1, 1023, 1024, 1, 64}, {2, 300, 257, 2, 256}, {1, 129, 300, 3, 256}},
                       policy);
}

// The Hopper backward on more shapes than the typed tests: query and key
// blocks partial and whole, more keys than queries and fewer, several
// heads and batches, leagues of more teams than an H200 has SMs.
TEST(FlashBackwardCuda, HopperWgmma) {
  if (!kfa::Impl::wgmma_available(Kokkos::Cuda())) {
    GTEST_SKIP() << "no sm_90 GPU, or this build has no sm_90a device code (KFA_CUDA_SM90A)";
  }
  using C16 = Config<Kokkos::Cuda, kfa::bfloat16>;
  using C16h = Config<Kokkos::Cuda, kfa::half, true>;
  for (bool causal : {false, true}) {
    check_backward<C16>({2, 256, 384, 2, 128}, causal, false);
    check_backward<C16h>({1, 129, 300, 2, 128}, causal, false);
    check_backward<C16>({1, 64, 128, 3, 64}, causal, false);
    check_backward<C16h>({2, 333, 190, 2, 64}, causal, false);
    check_backward<C16>({1, 520, 515, 2, 64}, causal, false);  // 5 x 5 blocks of 128
    // More teams than an H200 has SMs (a head's teams in several waves, its
    // dQ rows summed by teams that do not run at once), and rows that see
    // no key.
    check_backward<C16>({1, 300, 1000, 48, 64}, causal, false);
    check_backward<C16h>({2, 190, 520, 36, 128}, causal, false);
    check_backward<C16>({1, 600, 130, 40, 128}, causal, false);
  }
}

// Head dim 256 (on Hopper with sm_90a code the wgmma kernel of
// kfa/detail/backend/cuda/backward/wgmma_product_split.hpp, elsewhere the mma.sync backward with the head
// dimension split over pairs of warps; MmaSyncKernelsWithoutWgmma runs the
// latter on Hopper too), on query and key blocks partial and whole, more
// keys than queries and fewer, causal rows with no key, several heads and
// batches.
TEST(FlashBackwardCuda, HeadDim256) {
  using C16 = Config<Kokkos::Cuda, kfa::bfloat16>;
  using C16h = Config<Kokkos::Cuda, kfa::half, true>;
  for (bool causal : {false, true}) {
    check_backward<C16>({2, 300, 257, 2, 256}, causal, false);
    check_backward<C16h>({1, 129, 300, 3, 256}, causal, false);
    check_backward<C16>({1, 64, 128, 2, 256}, causal, false);
    check_backward<C16h>({1, 1000, 1030, 1, 256}, causal, false);
  }
  check_backward<C16>({2, 150, 40, 2, 256}, true, false);  // rows with no key
}

// fp32 on tensor cores (Fp32Matmul::split_tf32 and tf32) trades precision
// for speed, so it is held to a bound of its own: relative to the size of
// the gradients, 3e-5 for 3xTF32 (22 of 24 significand bits per operand),
// 3e-2 for tf32. Head dims 64 and 128 take the tensor-core backward.
TEST(FlashBackwardCuda, Fp32OnTensorCores) {
  using Space = Kokkos::Cuda;
  for (kfa::Fp32Matmul mode : {kfa::Fp32Matmul::split_tf32, kfa::Fp32Matmul::tf32}) {
    const double bound = mode == kfa::Fp32Matmul::split_tf32 ? 3e-5 : 3e-2;
    for (bool causal : {false, true}) {
      for (const Shape& s : {Shape{2, 190, 333, 2, 64}, Shape{1, 300, 129, 2, 128},
                             Shape{1, 129, 300, 1, 128}}) {
        kfa::AttentionOptions opt;
        opt.causal = causal;
        opt.fp32_matmul = mode;
        const Case c = make_case<float>(s, opt, "bwd_tc");
        const auto flash = run_flash<float, Space>(c, opt);
        Tensor dq_ref, dk_ref, dv_ref;
        reference_backward<double, true>(c.q, c.k, c.v, c.o_ref, c.lse_ref, c.d_o, opt, dq_ref,
                                         dk_ref, dv_ref);
        const double size = std::max({1.0, gradient_magnitude(c.q, c.k, c.v, c.d_o, opt),
                                      max_abs(dq_ref), max_abs(dk_ref), max_abs(dv_ref)});
        const std::string what = std::string(mode == kfa::Fp32Matmul::tf32 ? "tf32 " : "3xtf32 ") +
                                 to_string(s) + (causal ? " causal" : "");
        EXPECT_LE(max_abs_diff(flash.dq, dq_ref), bound * size) << what << " dq";
        EXPECT_LE(max_abs_diff(flash.dk, dk_ref), bound * size) << what << " dk";
        EXPECT_LE(max_abs_diff(flash.dv, dv_ref), bound * size) << what << " dv";
      }
    }
  }
}
// The fp32/fp64 tensor-core backward in shapes other than the dispatch's
// (warps, query rows per step, warps per atom of keys): each shape's dq, dk,
// dv against the fp64 oracle, with the plain fp64 backward as yardstick.
// DimSplit 2 (two warps per 16 keys, dK and dV split over the head
// dimension, Pᵀ and dPᵀ swapped through scratch) is fp64 m16n8k8's shape at
// head_dim 128 (the library's, also run by the typed tests); the others are
// bench_device's variants and m8n8k4's shapes (GPUs before sm_90).
template <class T, class Kernel, class Acc = T>
void check_backward_kernel(const Shape& s, bool causal, const std::string& shape) {
  using Space = Kokkos::Cuda;
  using View4 = DeviceView4<T, Space>;
  using View3 = DeviceView3<Acc, Space>;
  kfa::AttentionOptions opt;
  opt.causal = causal;
  const Case c = make_case<T>(s, opt, "wide_bwd");
  const View4 q = to_device<T, Space>(c.q, "q"), k = to_device<T, Space>(c.k, "k"),
              v = to_device<T, Space>(c.v, "v"), d_o = to_device<T, Space>(c.d_o, "d_o");
  View4 o("o", s.batch, s.seqlen_q, s.heads, s.head_dim);
  View3 lse("lse", s.batch, s.heads, s.seqlen_q), delta("delta", s.batch, s.heads, s.seqlen_q);
  kfa::flash_attention_forward(Space(), q, k, v, o, lse, opt);
  kfa::Impl::BackwardPreprocess<Space, View4, View4, View3>{o, d_o, delta, s.seqlen_q, s.heads,
                                                            s.head_dim}
      .launch(Space());
  // zero: dQ is added (by atomics or bulk reductions; the 16-bit kernels
  // add to an fp32 accumulator, read here)
  DeviceView4<Acc, Space> dq("dq", s.batch, s.seqlen_q, s.heads, s.head_dim);
  View4 dk("dk", s.batch, s.seqlen_k, s.heads, s.head_dim);
  View4 dv("dv", s.batch, s.seqlen_k, s.heads, s.head_dim);
  poison(dk);
  poison(dv);
  Kernel kernel(q, k, v, d_o, lse, delta, dq, dk, dv, Acc(1) / std::sqrt(Acc(Kernel::kHeadDim)),
                causal);
  ASSERT_TRUE(kernel.fits(Space()));
  kernel.launch(Space());
  Space().fence();

  Tensor dq_ref, dk_ref, dv_ref, dq_plain, dk_plain, dv_plain;
  reference_backward<double, true>(c.q, c.k, c.v, c.o_ref, c.lse_ref, c.d_o, opt, dq_ref,
                                   dk_ref, dv_ref);
  // The yardstick's O in T, as the kernel reads it (as check_backward does;
  // fp32 and fp64 kept O unrounded here).
  Tensor o_t = c.o_ref;
  if constexpr (sizeof(T) == 2) round_to<T>(o_t);
  reference_backward<T>(c.q, c.k, c.v, o_t, c.lse_ref, c.d_o, opt, dq_plain, dk_plain, dv_plain);
  const std::string what =
      type_name<T>() + " " + to_string(s) + (causal ? " causal" : "") + " shape: " + shape;
  auto check = [&](const char* name, const Tensor& got, const Tensor& plain, const Tensor& ref) {
    const double err = max_abs_diff(got, ref), err_plain = max_abs_diff(plain, ref);
    EXPECT_LE(err, allowed_error<T>(err_plain, ref))
        << what << ": " << name << " error " << err << ", plain backward's " << err_plain;
  };
  check("dq", to_host(dq), dq_plain, dq_ref);
  check("dk", to_host(dk), dk_plain, dk_ref);
  check("dv", to_host(dv), dv_plain, dv_ref);
}

// The Hopper backward kernel in shapes other than the library's
// (kfa::Impl::WgmmaBwdShape: kDqTma, with kEarlyDv, kPipelined and kDqWide
// at head_dim 128; bench_device's wgmma, wgmma_dqtma, wgmma_early_dv,
// wgmma_pipelined, wgmma_pipelined_wide, wgmma_dqtma_wide): the dQ tile
// added by bulk tensor reductions (DqTma) or one bulk reduction per row,
// dV's products issued before dSᵀ is computed (EarlyDv), one team barrier
// a block (Pipelined), the tensor reductions in boxes of 32 fp32 a row
// (DqWide). dQ is read from the fp32 accumulator, dK and dV from the
// 16-bit outputs.
template <bool DqTma, bool EarlyDv, bool Pipelined, bool DqWide>
struct WgmmaBwdTestShape {
  static constexpr bool kDqTma = DqTma, kEarlyDv = EarlyDv, kPipelined = Pipelined,
                        kDqWide = DqWide;
};
template <class T, int HeadDim, bool DqTma, bool EarlyDv = false, bool Pipelined = false,
          bool DqWide = false>
void check_wgmma_backward(const Shape& s, bool causal) {
  using Space = Kokkos::Cuda;
  using View4 = DeviceView4<T, Space>;
  using View3 = DeviceView3<float, Space>;
  using Acc = DeviceView4<float, Space>;
  using Format = typename kfa::Impl::MmaFormat<Space, T>::type;
  using Kernel =
      kfa::Impl::FlashBackwardWgmmaKernel<Space, HeadDim, Format, View4, View4, View4, View4,
                                          View3, View3, Acc, View4, View4,
                                          WgmmaBwdTestShape<DqTma, EarlyDv, Pipelined, DqWide>>;
  ASSERT_EQ(s.head_dim, HeadDim);
  check_backward_kernel<T, Kernel, float>(
      s, causal,
      std::string(DqTma ? "dq by tensor reductions" : "dq by row reductions") +
          (EarlyDv ? ", dv before ds" : "") + (Pipelined ? ", pipelined" : "") +
          (DqWide ? ", wide dq boxes" : ""));
}

// Query blocks partial and whole (the tensor reductions drop rows past the
// end), more keys than queries and fewer, several heads and batches,
// causal rows with no key.
TEST(FlashBackwardCuda, HopperWgmmaOptions) {
  if (!kfa::Impl::wgmma_available(Kokkos::Cuda())) {
    GTEST_SKIP() << "no sm_90 GPU, or this build has no sm_90a device code (KFA_CUDA_SM90A)";
  }
  for (bool causal : {false, true}) {
    for (const Shape& s : {Shape{2, 256, 384, 2, 128}, Shape{1, 129, 300, 3, 128}}) {
      check_wgmma_backward<kfa::bfloat16, 128, false>(s, causal);
      check_wgmma_backward<kfa::bfloat16, 128, true>(s, causal);
      check_wgmma_backward<kfa::bfloat16, 128, true, true>(s, causal);
      check_wgmma_backward<kfa::half, 128, true, true, true>(s, causal);
      check_wgmma_backward<kfa::bfloat16, 128, true, true, true>(s, causal);
      check_wgmma_backward<kfa::bfloat16, 128, true, true, true, true>(s, causal);
      check_wgmma_backward<kfa::half, 128, true, false, false, true>(s, causal);
    }
    for (const Shape& s : {Shape{1, 520, 515, 2, 64}, Shape{2, 333, 190, 2, 64}}) {
      check_wgmma_backward<kfa::bfloat16, 64, false>(s, causal);
      check_wgmma_backward<kfa::bfloat16, 64, true>(s, causal);
      check_wgmma_backward<kfa::half, 64, true, true>(s, causal);
      check_wgmma_backward<kfa::bfloat16, 64, true, false, false, true>(s, causal);
    }
  }
  check_wgmma_backward<kfa::bfloat16, 128, true>({2, 150, 40, 2, 128}, true);
  check_wgmma_backward<kfa::bfloat16, 128, true, true>({2, 150, 40, 2, 128}, true);
  check_wgmma_backward<kfa::bfloat16, 128, true, true, true>({2, 150, 40, 2, 128}, true);
  // One, two and three query blocks (the pipelined prologue and stages).
  for (int n : {64, 100, 192}) {
    check_wgmma_backward<kfa::half, 128, true, true, true>({1, n, 128, 2, 128}, false);
    check_wgmma_backward<kfa::bfloat16, 128, true, true, true, true>({1, n, 128, 2, 128}, false);
  }
}

// The Hopper backward at head_dim 256 with dQ's products issued behind dV's
// and dK's (DqOverlap, bench_device's wgmma256_overlap) and after them, and
// dQ's reductions staged in whole rows or straight from the fragments
// (DqStaged, wgmma256_direct).
template <class T, bool DqOverlap, bool DqStaged = true>
void check_wgmma256_backward(const Shape& s, bool causal) {
  using Space = Kokkos::Cuda;
  using View4 = DeviceView4<T, Space>;
  using View3 = DeviceView3<float, Space>;
  using Acc = DeviceView4<float, Space>;
  using Format = typename kfa::Impl::MmaFormat<Space, T>::type;
  using Kernel =
      kfa::Impl::FlashBackwardWgmmaProductSplitKernel<Space, Format, View4, View4, View4, View4, View3,
                                             View3, Acc, View4, View4, DqOverlap, DqStaged>;
  ASSERT_EQ(s.head_dim, 256);
  check_backward_kernel<T, Kernel, float>(
      s, causal,
      std::string(DqOverlap ? "d 256, dq behind dk and dv" : "d 256, dq after dk and dv") +
          (DqStaged ? "" : ", dq reductions from the fragments"));
}

TEST(FlashBackwardCuda, HopperWgmma256Options) {
  if (!kfa::Impl::wgmma_available(Kokkos::Cuda())) {
    GTEST_SKIP() << "no sm_90 GPU, or this build has no sm_90a device code (KFA_CUDA_SM90A)";
  }
  for (bool causal : {false, true}) {
    for (const Shape& s : {Shape{2, 300, 257, 2, 256}, Shape{1, 129, 300, 3, 256}}) {
      check_wgmma256_backward<kfa::bfloat16, false>(s, causal);
      check_wgmma256_backward<kfa::half, false>(s, causal);
      check_wgmma256_backward<kfa::bfloat16, true>(s, causal);
      check_wgmma256_backward<kfa::half, true>(s, causal);
      check_wgmma256_backward<kfa::bfloat16, false, false>(s, causal);
      check_wgmma256_backward<kfa::half, true, false>(s, causal);
    }
  }
  check_wgmma256_backward<kfa::half, false, false>({2, 150, 40, 2, 256}, true);
  check_wgmma256_backward<kfa::bfloat16, true>({2, 150, 40, 2, 256}, true);  // rows with no key
  check_wgmma256_backward<kfa::half, false>({1, 64, 64, 1, 256}, false);     // one block each
}

template <class Fp32Fp64Shape, int HeadDim, class Atom>
void check_fp32_fp64_backward_shape(const Shape& s, bool causal) {
  using T = typename Atom::value_type;
  using View4 = DeviceView4<T, Kokkos::Cuda>;
  using View3 = DeviceView3<T, Kokkos::Cuda>;
  using Kernel =
      kfa::Impl::FlashBackwardFp32Fp64Kernel<Kokkos::Cuda, HeadDim, Atom, View4, View4, View4,
                                            View4, View3, View3, View4, View4, View4, Fp32Fp64Shape>;
  check_backward_kernel<T, Kernel>(
      s, causal,
      std::to_string(Kernel::kWarps) + " warps, " + std::to_string(Kernel::kBlockN) + " keys, " +
          std::to_string(Kernel::kBlockM) + " rows, split " + std::to_string(Kernel::kSplit) +
          ", " + std::to_string(Kernel::kStages) + " stages");
}

// The exact fp32 backward with Sᵀ and dPᵀ on the fp64 tensor cores (the
// default on sm_90+) and on fp32 FMAs (the default before, bench_device's
// exact_fp32_ffma), both held to fp32 arithmetic's error.
template <int HeadDim, bool DmmaScores>
void check_exact_fp32_backward(const Shape& s, bool causal) {
  using View4 = DeviceView4<float, Kokkos::Cuda>;
  using View3 = DeviceView3<float, Kokkos::Cuda>;
  using Kernel = kfa::Impl::FlashBackwardExactFp32Kernel<Kokkos::Cuda, HeadDim, View4, View4, View4,
                                                    View4, View3, View3, View4, View4, View4,
                                                    DmmaScores>;
  check_backward_kernel<float, Kernel>(
      s, causal, DmmaScores ? "Sᵀ, dPᵀ on fp64 tensor cores" : "Sᵀ, dPᵀ on fp32 FMAs");
}

TEST(FlashBackwardCuda, ExactFp32ScoreProducts) {
  for (bool causal : {false, true}) {
    for (const Shape& s : {Shape{2, 190, 333, 2, 64}, Shape{1, 1000, 257, 1, 64}}) {
      check_exact_fp32_backward<64, false>(s, causal);
#if KFA_CUDA_FP64_M16
      check_exact_fp32_backward<64, true>(s, causal);
#endif
    }
    for (const Shape& s : {Shape{1, 300, 129, 2, 128}, Shape{1, 257, 1000, 1, 128}}) {
      check_exact_fp32_backward<128, false>(s, causal);
#if KFA_CUDA_FP64_M16
      check_exact_fp32_backward<128, true>(s, causal);
#endif
    }
  }
}

/// A DimSplit-2 shape whose first warp takes every exponential of the pair
/// (the library before RESULTS v35; bench_device's one_softmax).
template <class Shape>
struct OneWarpSoftmax : Shape {
  static constexpr bool kSharedSoftmax = false;
};

TEST(FlashBackwardCuda, Fp32Fp64TensorCoreTileShapes) {
  using namespace kfa::Impl;
  namespace mma = kfa::Impl::cuda_mma;
  for (bool causal : {false, true}) {
    for (const Shape& s : {Shape{2, 190, 333, 2, 64}, Shape{1, 1000, 257, 1, 64}}) {
      check_fp32_fp64_backward_shape<Fp32Fp64BwdDefaultShape<mma::Fp64Atom, 64>::type, 64, mma::Fp64Atom>(
          s, causal);
      check_fp32_fp64_backward_shape<Fp32Fp64BwdShape<8, 32, 2>, 64, mma::Fp64Atom>(s, causal);
#if KFA_CUDA_FP64_M16
      check_fp32_fp64_backward_shape<Fp32Fp64BwdDefaultShape<mma::Fp64x16Atom, 64>::type, 64,
                                mma::Fp64x16Atom>(s, causal);
      check_fp32_fp64_backward_shape<Fp32Fp64BwdShape<8, 16, 1>, 64, mma::Fp64x16Atom>(s, causal);
      check_fp32_fp64_backward_shape<Fp32Fp64BwdShape<8, 16, 2>, 64, mma::Fp64x16Atom>(s, causal);
      check_fp32_fp64_backward_shape<Fp32Fp64BwdShape<4, 16, 1, 2>, 64, mma::Fp64x16Atom>(s, causal);
#endif
    }
    for (const Shape& s : {Shape{1, 300, 129, 2, 128}, Shape{1, 257, 1000, 1, 128}}) {
      check_fp32_fp64_backward_shape<Fp32Fp64BwdDefaultShape<mma::Fp64Atom, 128>::type, 128,
                                mma::Fp64Atom>(s, causal);
#if KFA_CUDA_FP64_M16
      check_fp32_fp64_backward_shape<Fp32Fp64BwdDefaultShape<mma::Fp64x16Atom, 128>::type, 128,
                                mma::Fp64x16Atom>(s, causal);
      check_fp32_fp64_backward_shape<OneWarpSoftmax<Fp32Fp64BwdDefaultShape<mma::Fp64x16Atom, 128>::type>,
                                128, mma::Fp64x16Atom>(s, causal);
#endif
    }
  }
}
#endif

TYPED_TEST(FlashBackward, DeterministicIsAccurateAndBitwiseReproducible) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  if (is_duplicate_config<TypeParam>()) GTEST_SKIP() << "half is float here";
  check_backward<TypeParam>({2, 113, 203, 3, 80}, false, true);
  check_backward<TypeParam>({1, 203, 113, 2, 64}, true, true);
  kfa::AttentionOptions opt;
  opt.causal = true;
  opt.deterministic = true;
  opt.team_size = test_team_size<Space>();
  const Case c = make_case<T>({2, 333, 300, 3, 48}, opt, "det");
  const auto first = run_flash<T, Space>(c, opt);
  const auto second = run_flash<T, Space>(c, opt);
  EXPECT_EQ(first.dq.data, second.dq.data);
  EXPECT_EQ(first.dk.data, second.dk.data);
  EXPECT_EQ(first.dv.data, second.dv.data);
}

/// Central finite differences of L = sum(dO ∘ O) on the fp64 path, for
/// elements of q, k and v picked at random.
template <class Space>
void check_finite_differences(bool causal) {
  using T = double;
  const Shape s{2, 37, 53, 2, 19};
  kfa::AttentionOptions opt;
  opt.causal = causal;
  opt.team_size = test_team_size<Space>();
  const Case c = make_case<T>(s, opt, "fd");
  const auto grads = run_flash<T, Space>(c, opt);

  auto q = to_device<T, Space>(c.q, "q");
  auto k = to_device<T, Space>(c.k, "k");
  auto v = to_device<T, Space>(c.v, "v");
  DeviceView4<T, Space> o("o", s.batch, s.seqlen_q, s.heads, s.head_dim);
  DeviceView3<T, Space> lse("lse", s.batch, s.heads, s.seqlen_q);
  auto loss = [&]() {
    kfa::flash_attention_forward(Space(), q, k, v, o, lse, opt);
    const Tensor oh = to_host(o);
    long double l = 0;
    for (std::size_t n = 0; n < oh.data.size(); ++n) l += oh.data[n] * c.d_o.data[n];
    return static_cast<double>(l);
  };
  std::mt19937_64 rng(test_seed("fd-pick"));
  const double h = 1e-5;
  auto probe = [&](DeviceView4<T, Space> view, const Tensor& grad, const char* name) {
    auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), view);
    for (int trial = 0; trial < 12; ++trial) {
      const std::size_t n = rng() % host.size();
      const double x = host.data()[n];
      host.data()[n] = x + h;
      Kokkos::deep_copy(view, host);
      const double up = loss();
      host.data()[n] = x - h;
      Kokkos::deep_copy(view, host);
      const double down = loss();
      host.data()[n] = x;
      Kokkos::deep_copy(view, host);
      const double fd = (up - down) / (2 * h);
      EXPECT_NEAR(grad.data[n], fd, 1e-7 * std::max(1.0, std::abs(fd)))
          << name << " element " << n << (causal ? " causal" : "");
    }
  };
  probe(q, grads.dq, "dq");
  probe(k, grads.dk, "dk");
  probe(v, grads.dv, "dv");
}

TYPED_TEST(FlashBackward, FiniteDifferencesFp64) {
  using Space = typename TypeParam::space;
  if (!std::is_same<typename TypeParam::value_type, double>::value)
    GTEST_SKIP() << "finite differences run on the fp64 path";
  check_finite_differences<Space>(false);
  check_finite_differences<Space>(true);
}

}  // namespace
}  // namespace kfa_test
