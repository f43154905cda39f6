// kfa::nn over MPI, run by ctest under mpiexec at 1, 2 and 3 ranks
// (nn_mpi_np1..nn_mpi_np3): allreduce_gradients (mean and sum, in MPI's
// order and in rank order, host-staged) against the ranks' gradients
// regenerated on every rank; the sequence-parallel MultiHeadAttention and
// TransformerBlock against the single-rank layer on the whole sequence:
// each rank's slice of the output and of the input gradient, and the
// parameter gradients summed over the ranks, within fp64 bounds, causal and
// not, with rotary embeddings and (in the block) dropout; argument errors
// that every rank reports; bf16 and fp32 gradients of a bf16 block summed in
// fp32.

#include "nn_test_helpers.hpp"

#include <kfa/nn/distributed.hpp>
#include <kfa/ring_attention.hpp>

#include <mpi.h>

#include "mpi_test_helpers.hpp"

namespace kfa_test {
namespace {

/// A small block whose parameters() are the list the allreduce tests reduce.
kfa::nn::TransformerBlockOptions small_block() {
  kfa::nn::TransformerBlockOptions o;
  o.attention.d_model = 24;
  o.attention.heads = 2;
  o.d_ff = 40;
  return o;
}

/// The gradient values rank `rank` holds for parameter `name` (rounded to T).
template <class T>
std::vector<double> rank_values(const std::string& name, std::size_t n, int rank) {
  std::mt19937_64 rng(test_seed(name) + std::uint64_t(rank));
  std::normal_distribution<double> dist(0.0, 1.0);
  std::vector<double> values(n);
  for (double& x : values) x = static_cast<double>(static_cast<T>(dist(rng)));
  return values;
}

template <class C>
class NnAllreduce : public ::testing::Test {};
TYPED_TEST_SUITE(NnAllreduce, NnConfigs);

TYPED_TEST(NnAllreduce, MatchesTheRanksSumAndMean) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  const int rank = world_rank(), ranks = world_size();
  kfa::nn::TransformerBlock<Space, T> block(small_block());
  const auto parameters = block.parameters();
  for (const bool mean : {true, false}) {
    for (const bool deterministic : {false, true}) {
      for (const bool staged : {false, true}) {
        const std::string what = type_name<T>() + " " + Space::name() +
                                 (mean ? " mean" : " sum") +
                                 (deterministic ? " deterministic" : "") +
                                 (staged ? " host-staged" : "") + " ranks " +
                                 std::to_string(ranks);
        for (const auto& p : parameters) {
          auto host = Kokkos::create_mirror_view(p.grad);
          const auto values = rank_values<T>(p.name, p.grad.size(), rank);
          for (std::size_t n = 0; n < values.size(); ++n) host(n) = static_cast<T>(values[n]);
          Kokkos::deep_copy(p.grad, host);
        }
        kfa::nn::GradientAllreduceOptions options;
        options.reduction = mean ? kfa::nn::GradientReduction::mean
                                 : kfa::nn::GradientReduction::sum;
        options.deterministic = deterministic;
        options.host_staged = staged;
        kfa::nn::allreduce_gradients(Space(), parameters, MPI_COMM_WORLD, options);
        Space().fence();
        for (const auto& p : parameters) {
          const Tensor got = to_host(p.grad);
          std::vector<std::vector<double>> all;
          for (int r = 0; r < ranks; ++r) all.push_back(rank_values<T>(p.name, p.grad.size(), r));
          double err = 0, scale = 0;
          for (std::size_t n = 0; n < got.data.size(); ++n) {
            // The rank-order sum in T, as the deterministic path adds.
            T sum = static_cast<T>(all[0][n]);
            for (int r = 1; r < ranks; ++r) sum += static_cast<T>(all[r][n]);
            if (mean) sum /= static_cast<T>(ranks);
            if (deterministic) {
              ASSERT_EQ(got.data[n], static_cast<double>(sum))
                  << what << " " << p.name << "[" << n << "] (must be bitwise the rank-order sum)";
            }
            err = std::max(err, std::abs(got.data[n] - static_cast<double>(sum)));
            scale = std::max(scale, std::abs(static_cast<double>(sum)));
          }
          // Another order of P - 1 additions (and one rounding of the mean).
          EXPECT_LE(err, (ranks + 1) * epsilon<T>() * std::max(1.0, scale) * ranks)
              << what << " " << p.name;
        }
      }
    }
  }
}

TYPED_TEST(NnAllreduce, DifferentListsThrowOnEveryRankAndWriteNothing) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  if (world_size() < 2) GTEST_SKIP() << "needs two ranks";
  kfa::nn::TransformerBlock<Space, T> block(small_block());
  auto parameters = block.parameters();
  for (const auto& p : parameters) Kokkos::deep_copy(p.grad, T(3));
  if (world_rank() == 0) parameters.pop_back();
  expect_invalid_argument(
      [&] { kfa::nn::allreduce_gradients(Space(), parameters, MPI_COMM_WORLD); },
      "every rank must pass the same parameters");
  for (const auto& p : parameters) {
    const Tensor got = to_host(p.grad);
    for (double x : got.data) ASSERT_EQ(x, 3.0) << p.name;
  }
}

using Bf16Configs = ::testing::Types<
#ifdef KOKKOS_ENABLE_CUDA
    Config<Kokkos::Cuda, kfa::bfloat16>,
#endif
#ifdef KOKKOS_ENABLE_OPENMP
    Config<Kokkos::OpenMP, kfa::bfloat16>,
#endif
#ifdef KOKKOS_ENABLE_SERIAL
    Config<Kokkos::Serial, kfa::bfloat16>
#endif
    >;

template <class C>
class NnAllreduceBf16 : public ::testing::Test {};
TYPED_TEST_SUITE(NnAllreduceBf16, Bf16Configs);

/// bf16 gradients and the fp32 gradients of a bf16 block (fp32_gradients)
/// are summed in fp32: in rank order bitwise the fp32 rank-order sum (mean:
/// divided once), rounded once to bf16 for bf16 gradients.
TYPED_TEST(NnAllreduceBf16, SumsInFp32AndRoundsOnce) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  const int rank = world_rank(), ranks = world_size();
  for (const bool fp32_gradients : {false, true}) {
    auto options = small_block();
    options.fp32_gradients = fp32_gradients;
    kfa::nn::TransformerBlock<Space, T> block(options);
    const auto parameters = block.parameters();
    for (const bool mean : {true, false}) {
      const std::string what = std::string("bfloat16 ") + Space::name() +
                               (fp32_gradients ? " fp32 gradients" : "") +
                               (mean ? " mean" : " sum") + " ranks " + std::to_string(ranks);
      for (const auto& p : parameters) {
        const std::size_t n = std::max(p.grad.size(), p.grad_fp32.size());
        Tensor mine(std::vector<int>{int(n)});
        mine.data = rank_values<T>(p.name, n, rank);
        if (fp32_gradients)
          Kokkos::deep_copy(p.grad_fp32, make_view<DeviceView1<float, Space>>(mine, "g"));
        else
          Kokkos::deep_copy(p.grad, make_view<DeviceView1<T, Space>>(mine, "g"));
      }
      kfa::nn::GradientAllreduceOptions options_reduce;
      options_reduce.reduction = mean ? kfa::nn::GradientReduction::mean
                                      : kfa::nn::GradientReduction::sum;
      options_reduce.deterministic = true;
      kfa::nn::allreduce_gradients(Space(), parameters, MPI_COMM_WORLD, options_reduce);
      Space().fence();
      for (const auto& p : parameters) {
        const Tensor got = fp32_gradients ? to_host(p.grad_fp32) : to_host(p.grad);
        std::vector<std::vector<double>> all;
        for (int r = 0; r < ranks; ++r)
          all.push_back(rank_values<T>(p.name, got.data.size(), r));
        for (std::size_t n = 0; n < got.data.size(); ++n) {
          float sum = float(all[0][n]);
          for (int r = 1; r < ranks; ++r) sum += float(all[r][n]);
          if (mean) sum /= float(ranks);
          const double expected = fp32_gradients ? double(sum) : to_double(from_double<T>(sum));
          ASSERT_EQ(got.data[n], expected) << what << " " << p.name << "[" << n << "]";
        }
      }
    }
  }
}

Tensor reshaped_tensor(Tensor t, std::vector<int> ext) {
  t.ext = std::move(ext);
  return t;
}

/// Rows [offset, offset + len) of every sequence of a [B·S][d] tensor.
Tensor token_slice(const Tensor& t, int B, int S, int offset, int len) {
  const int d = t.ext.back();
  Tensor r({B * len, d});
  for (int b = 0; b < B; ++b)
    for (int i = 0; i < len; ++i)
      for (int j = 0; j < d; ++j) at2(r, b * len + i, j) = at2(t, b * S + offset + i, j);
  return r;
}

/// The sequence-parallel layer (options with the ring's communicator) on
/// this rank's slice against the single-rank layer on the whole sequence,
/// with the same parameters: outputs, input gradients and the parameter
/// gradients summed over the ranks.
template <class Space, class Layer, class Options>
void check_sequence_parallel(Options options, kfa::nn::SequenceParallelOptions& sp, int d,
                             const std::string& tag, int S = 37) {
  using T = double;
  const int rank = world_rank(), ranks = world_size();
  const int B = 2;
  const int len = static_cast<int>(
      kfa::ring_local_seqlen(S, rank, ranks, kfa::RingSharding::contiguous));
  int offset = 0;
  for (int r = 0; r < rank; ++r)
    offset += static_cast<int>(kfa::ring_local_seqlen(S, r, ranks, kfa::RingSharding::contiguous));
  const std::string what = tag + " " + Space::name() + " ranks " + std::to_string(ranks) +
                           " rank " + std::to_string(rank) + " seed " +
                           std::to_string(test_seed(tag));

  Layer single(options);
  auto with_ring = options;
  if constexpr (std::is_same<Options, kfa::nn::MultiHeadAttentionOptions>::value)
    with_ring.sequence_parallel = sp;
  else
    with_ring.attention.sequence_parallel = sp;
  Layer parallel(with_ring);
  std::mt19937_64 rng(test_seed(tag));
  const auto single_parameters = single.parameters(), parallel_parameters = parallel.parameters();
  ASSERT_EQ(single_parameters.size(), parallel_parameters.size());
  for (std::size_t n = 0; n < single_parameters.size(); ++n) {
    randomize(single_parameters[n].value, rng, 0.15);
    Kokkos::deep_copy(parallel_parameters[n].value, single_parameters[n].value);
  }
  const Tensor x = random_tensor({B * S, d}, rng), dy = random_tensor({B * S, d}, rng);

  // The whole sequence on one rank.
  const auto xv = make_view<DeviceView3<T, Space>>(reshaped_tensor(x, {B, S, d}), "x");
  const auto dyv = make_view<DeviceView3<T, Space>>(reshaped_tensor(dy, {B, S, d}), "dy");
  DeviceView3<T, Space> yv("y", B, S, d), dxv("dx", B, S, d);
  typename Layer::context_type single_context, parallel_context;
  single_context.dropout_seed = parallel_context.dropout_seed = 11;
  single.forward(Space(), xv, yv, single_context);
  single.backward(Space(), dyv, dxv, single_context);

  // This rank's slice on the ring.
  const auto xl = make_view<DeviceView3<T, Space>>(
      reshaped_tensor(token_slice(x, B, S, offset, len), {B, len, d}), "x_l");
  const auto dyl = make_view<DeviceView3<T, Space>>(
      reshaped_tensor(token_slice(dy, B, S, offset, len), {B, len, d}), "dy_l");
  DeviceView3<T, Space> yl("y_l", B, len, d), dxl("dx_l", B, len, d);
  poison(yl);
  poison(dxl);
  parallel.forward(Space(), xl, yl, parallel_context);
  parallel.backward(Space(), dyl, dxl, parallel_context);
  kfa::nn::GradientAllreduceOptions sum;
  sum.reduction = kfa::nn::GradientReduction::sum;
  kfa::nn::allreduce_gradients(Space(), parallel_parameters, *sp.comm, sum);
  Space().fence();

  // Bounds: fp64 results that differ only in the order of the attention's
  // sums (ring blocks merged) and of the gradients' sums over tokens.
  const double factor = 64;
  const Tensor y = reshaped_tensor(to_host(yv), {B * S, d});
  const Tensor dx = reshaped_tensor(to_host(dxv), {B * S, d});
  expect_close_rel<T>(what + " y", reshaped_tensor(to_host(yl), {B * len, d}),
                      token_slice(y, B, S, offset, len), factor);
  expect_close_rel<T>(what + " dx", reshaped_tensor(to_host(dxl), {B * len, d}),
                      token_slice(dx, B, S, offset, len), factor);
  for (std::size_t n = 0; n < single_parameters.size(); ++n) {
    expect_close_rel<T>(what + " d " + single_parameters[n].name,
                        to_host(parallel_parameters[n].grad), to_host(single_parameters[n].grad),
                        factor * S);
  }
}

template <class C>
class NnSequenceParallel : public ::testing::Test {};
using NnMpiDoubleConfigs = ::testing::Types<
#ifdef KOKKOS_ENABLE_CUDA
    Config<Kokkos::Cuda, double>,
#endif
#ifdef KOKKOS_ENABLE_OPENMP
    Config<Kokkos::OpenMP, double>,
#endif
#ifdef KOKKOS_ENABLE_SERIAL
    Config<Kokkos::Serial, double>
#endif
    >;
TYPED_TEST_SUITE(NnSequenceParallel, NnMpiDoubleConfigs);

TYPED_TEST(NnSequenceParallel, MultiHeadAttentionMatchesSingleRank) {
  using Space = typename TypeParam::space;
  const kfa::RingCommunicator comm(MPI_COMM_WORLD);
  kfa::nn::SequenceParallelOptions sp;
  sp.comm = &comm;
  std::vector<kfa::nn::MultiHeadAttentionOptions> cases(3);
  for (auto& o : cases) o.d_model = 48;
  cases[0].heads = 4;  // fused, biases, grouped-query, half-split rotary, causal
  cases[0].kv_heads = 2;
  cases[0].head_dim = 12;
  cases[0].rotary = true;
  cases[0].attention.causal = true;
  cases[1].heads = 3;  // separate, no bias, interleaved partial rotary, softcap, not causal
  cases[1].fused_qkv = false;
  cases[1].bias = false;
  cases[1].rotary = true;
  cases[1].rotary_options.style = kfa::nn::RotaryStyle::interleaved;
  cases[1].rotary_options.rotary_dim = 10;
  cases[1].rotary_options.position_offset = 5;
  cases[1].attention.softcap = 5;
  cases[2].heads = 3;  // plain, not causal, host-staged ring
  sp.transport = kfa::RingTransport::mpi;
  for (std::size_t n = 0; n < cases.size(); ++n) {
    if (n == 2) sp.transport = kfa::RingTransport::mpi_host_staged;
    check_sequence_parallel<Space, kfa::nn::MultiHeadAttention<Space, double>>(
        cases[n], sp, 48, "sequence parallel attention case " + std::to_string(n));
  }
  // Axial rotary embeddings on a 5 x 7 grid (35 tokens): the ranks' runs
  // start inside grid rows (18 | 17, 12 | 12 | 11), so each rank must find
  // its tokens' coordinates from its offset in the whole grid.
  kfa::nn::MultiHeadAttentionOptions axial;
  axial.d_model = 48;
  axial.heads = 4;
  axial.kv_heads = 2;
  axial.head_dim = 12;
  axial.attention.causal = true;
  axial.axial_rotary = true;
  axial.axial_rotary_options.axes = 2;
  axial.axial_rotary_options.extent[0] = 5;
  axial.axial_rotary_options.extent[1] = 7;
  axial.axial_rotary_options.offset[0] = 3;
  axial.axial_rotary_options.style = kfa::nn::RotaryStyle::interleaved;
  sp.transport = kfa::RingTransport::mpi;
  check_sequence_parallel<Space, kfa::nn::MultiHeadAttention<Space, double>>(
      axial, sp, 48, "sequence parallel axial attention", 35);
}

TYPED_TEST(NnSequenceParallel, TransformerBlockMatchesSingleRank) {
  using Space = typename TypeParam::space;
  const kfa::RingCommunicator comm(MPI_COMM_WORLD);
  kfa::nn::SequenceParallelOptions sp;
  sp.comm = &comm;
  std::vector<kfa::nn::TransformerBlockOptions> cases(2);
  for (auto& o : cases) {
    o.attention.d_model = 48;
    o.attention.heads = 3;
    o.d_ff = 64;
  }
  // Llama-style: RMSNorm, SwiGLU, rotary, causal; dropout on the residual
  // branches, whose masks must follow the tokens to their ranks.
  cases[0].norm = kfa::nn::Norm::rms_norm;
  cases[0].activation = kfa::nn::Activation::swiglu;
  cases[0].bias = false;
  cases[0].attention.rotary = true;
  cases[0].attention.attention.causal = true;
  cases[0].dropout_p = 0.2;
  // torch.nn.TransformerEncoderLayer-style: LayerNorm, GELU, not causal.
  for (std::size_t n = 0; n < cases.size(); ++n) {
    check_sequence_parallel<Space, kfa::nn::TransformerBlock<Space, double>>(
        cases[n], sp, 48, "sequence parallel block case " + std::to_string(n));
  }
}

TYPED_TEST(NnSequenceParallel, BadArgumentsThrowOnEveryRank) {
  using Space = typename TypeParam::space;
  using View3 = DeviceView3<double, Space>;
  const kfa::RingCommunicator comm(MPI_COMM_WORLD);
  kfa::nn::MultiHeadAttentionOptions options;
  options.d_model = 16;
  options.heads = 2;
  options.sequence_parallel.comm = &comm;
  auto windowed = options;
  windowed.attention.window_left = 4;
  expect_invalid_argument([&] { kfa::nn::MultiHeadAttention<Space, double> layer(windowed); },
                          "options.sequence_parallel");
  auto dropout = options;
  dropout.attention.dropout_p = 0.1;
  expect_invalid_argument([&] { kfa::nn::MultiHeadAttention<Space, double> layer(dropout); },
                          "options.sequence_parallel");

  // A wrong x on rank 0 only: every rank throws, no rank writes y.
  kfa::nn::MultiHeadAttention<Space, double> layer(options);
  const int d = world_rank() == 0 ? 17 : 16;
  View3 x("x", 1, 5, d), y("y", 1, 5, d);
  poison(y);
  typename kfa::nn::MultiHeadAttention<Space, double>::context_type context;
  expect_invalid_argument([&] { layer.forward(Space(), x, y, context); }, "d_model = 16");
  const Tensor got = to_host(y);
  for (double v : got.data) ASSERT_TRUE(std::isnan(v));

  // Axial rotary on a 5 x 7 grid, but the ranks hold 10 tokens each: every
  // rank sees the whole sequence's length and refuses it.
  auto axial = options;
  axial.axial_rotary = true;
  axial.axial_rotary_options.extent[0] = 5;
  axial.axial_rotary_options.extent[1] = 7;
  kfa::nn::MultiHeadAttention<Space, double> axial_layer(axial);
  View3 xa("xa", 2, 10, 16), ya("ya", 2, 10, 16);
  poison(ya);
  expect_invalid_argument([&] { axial_layer.forward(Space(), xa, ya, context); },
                          "x of all ranks together must be [batch][35][16]: "
                          "options.axial_rotary_options.extent = [5][7] holds 35 grid points, "
                          "but seqlen is " + std::to_string(10 * world_size()));
  for (double v : to_host(ya).data) ASSERT_TRUE(std::isnan(v));
}

}  // namespace
}  // namespace kfa_test
