// Ring attention, run by ctest under mpiexec at 1, 2, 3 and 4 ranks
// (ring_np1..ring_np4): forward and backward on sharded inputs, gathered and
// compared with single-rank flash attention on the global inputs and with
// the fp64 oracle (forward: bounds growing with k·eps; gradients: twice the
// same-precision plain backward's error);
// contiguous sharding (near-even and very uneven lengths, an empty slice
// included) and zigzag, causal and not; the host-staged transport; ranks
// that disagree about their arguments; the shard/gather helpers.

#include "kfa_test_helpers.hpp"

#include <kfa/ring_attention.hpp>

#include <kfa/detail/ring/transport/host_staging.hpp>

#include <mpi.h>

#include "mpi_test_helpers.hpp"

namespace kfa_test {
namespace {

const char* sharding_name(kfa::RingSharding s) {
  return s == kfa::RingSharding::zigzag ? "zigzag" : "contiguous";
}

/// Local sequence lengths of the ring cases: the helper's split, or an
/// explicit (contiguous) one.
struct Split {
  kfa::RingSharding sharding;
  std::vector<std::size_t> seqlens;  // empty: kfa::ring_local_seqlen
};

/// A [batch][seqlen][heads][head_dim] View shaped like `global` but for
/// `seqlen` positions.
template <class View4>
View4 local_like(const View4& global, std::size_t seqlen, const char* label) {
  return View4(std::string(label), global.extent(0), seqlen, global.extent(2), global.extent(3));
}

template <class View4>
View4 shard(const kfa::RingCommunicator& comm, const View4& global, std::size_t seqlen,
            kfa::RingSharding sharding, const char* label) {
  using Space = typename View4::execution_space;
  const View4 local = local_like(global, seqlen, label);
  kfa::ring_shard(Space(), comm, global, local, sharding);
  return local;
}

/// Gathers a local result into a poisoned global View and copies it to the host.
template <class LocalView>
Tensor gather(const kfa::RingCommunicator& comm, const LocalView& local, std::size_t global_seqlen,
              kfa::RingSharding sharding) {
  using Space = typename LocalView::execution_space;
  LocalView global;
  if constexpr (kfa::Impl::view_rank<LocalView>() == 3) {
    global = LocalView("global", local.extent(0), local.extent(1), global_seqlen);
  } else {
    global = LocalView("global", local.extent(0), global_seqlen, local.extent(2), local.extent(3));
  }
  poison(global);
  kfa::ring_gather(Space(), comm, local, global, sharding);
  return to_host(global);
}

/// What the ring adds to the single-rank bounds: the rounding of the
/// per-block partial results to the value type (exact for double and
/// float, whose accumulator is the value type). A partial output is a
/// convex combination of rows of v and the merge weights sum to one, so
/// those roundings add at most eps/2 · max|v|; a partial gradient is
/// bounded by the gradient's magnitude scale, once per block pair.
template <class T>
double partial_rounding(double partial_scale, int partials) {
  const bool rounded = !std::is_same<T, double>::value && !std::is_same<T, float>::value;
  return rounded ? partials * epsilon<T>() * std::max(1.0, partial_scale) : 0.0;
}

template <class C>
void check_ring(const Split& split, bool causal, int batch, int head_dim, std::size_t global_seqlen,
                kfa::RingTransport transport = kfa::RingTransport::mpi, int heads_kv = 0) {
  using Space = typename C::space;
  using T = typename C::value_type;
  using Acc = kfa::accumulator_t<T>;
  const int ranks = world_size(), rank = world_rank();
  const kfa::RingCommunicator comm(MPI_COMM_WORLD);
  std::vector<std::size_t> seqlens = split.seqlens;
  if (seqlens.empty()) {
    for (int r = 0; r < ranks; ++r)
      seqlens.push_back(kfa::ring_local_seqlen(global_seqlen, r, ranks, split.sharding));
  } else {
    global_seqlen = 0;
    for (std::size_t x : seqlens) global_seqlen += x;
  }
  const int n = static_cast<int>(global_seqlen);
  Shape s{batch, n, n, 2, head_dim};
  s.heads_kv = heads_kv;
  kfa::RingOptions opt;
  opt.causal = causal;
  opt.sharding = split.sharding;
  opt.transport = transport;
  opt.team_size = test_team_size<Space>();
  const std::string tag = "ring";
  const Case c = make_case<T>(s, opt, tag);
  std::ostringstream split_text;
  for (std::size_t x : seqlens) split_text << " " << x;
  const std::string what = type_name<T>() + " " + Space::name() + " " + to_string(s) + " " +
                           sharding_name(split.sharding) + " split" + split_text.str() +
                           (causal ? " causal" : "") + " ranks " + std::to_string(ranks) +
                           " seed " +
                           std::to_string(test_seed(tag + to_string(s) + (causal ? "c" : "n")));

  const auto q = to_device<T, Space>(c.q, "q"), k = to_device<T, Space>(c.k, "k"),
             v = to_device<T, Space>(c.v, "v"), d_o = to_device<T, Space>(c.d_o, "d_o");
  const std::size_t seqlen = seqlens[rank];
  const auto q_l = shard(comm, q, seqlen, split.sharding, "q_l");
  const auto k_l = shard(comm, k, seqlen, split.sharding, "k_l");
  const auto v_l = shard(comm, v, seqlen, split.sharding, "v_l");
  const auto do_l = shard(comm, d_o, seqlen, split.sharding, "do_l");
  const auto o_l = local_like(q, seqlen, "o_l"), dq_l = local_like(q, seqlen, "dq_l"),
             dk_l = local_like(k, seqlen, "dk_l"), dv_l = local_like(k, seqlen, "dv_l");
  DeviceView3<Acc, Space> lse_l("lse_l", batch, 2, seqlen);
  poison(o_l);
  poison(lse_l);
  poison(dq_l);
  poison(dk_l);
  poison(dv_l);
  kfa::Experimental::RingProfile profile;
  opt.profile = &profile;
  kfa::ring_attention_forward(Space(), comm, q_l, k_l, v_l, o_l, lse_l, opt);
  EXPECT_EQ(profile.compute_seconds.size(), static_cast<std::size_t>(ranks)) << what;
  kfa::ring_attention_backward(Space(), comm, q_l, k_l, v_l, o_l, lse_l, do_l, dq_l, dk_l, dv_l,
                               opt);
  EXPECT_EQ(profile.exposed_comm_seconds.size(), static_cast<std::size_t>(ranks)) << what;
  const Tensor o_ring = gather(comm, o_l, global_seqlen, split.sharding);
  const Tensor lse_ring = gather(comm, lse_l, global_seqlen, split.sharding);
  const Tensor dq_ring = gather(comm, dq_l, global_seqlen, split.sharding);
  const Tensor dk_ring = gather(comm, dk_l, global_seqlen, split.sharding);
  const Tensor dv_ring = gather(comm, dv_l, global_seqlen, split.sharding);
  // Every rank holds the gathered results; one checks them.
  if (rank != 0) return;

  // Single-rank flash attention and the yardsticks on the global inputs.
  DeviceView4<T, Space> o("o", batch, n, 2, head_dim), dq("dq", batch, n, 2, head_dim),
      dk("dk", batch, n, kv_heads(s), head_dim), dv("dv", batch, n, kv_heads(s), head_dim);
  DeviceView3<Acc, Space> lse("lse", batch, 2, n);
  const kfa::AttentionOptions single = opt;
  kfa::flash_attention_forward(Space(), q, k, v, o, lse, single);
  kfa::flash_attention_backward(Space(), q, k, v, o, lse, d_o, dq, dk, dv, single);
  Space().fence();
  const Tensor o_flash = to_host(o), lse_flash = to_host(lse), dq_flash = to_host(dq),
               dk_flash = to_host(dk), dv_flash = to_host(dv);
  const ForwardMagnitudes f = forward_magnitudes<T>(c);
  Tensor dq_ref, dk_ref, dv_ref, dq_plain, dk_plain, dv_plain;
  reference_backward<double, true>(c.q, c.k, c.v, c.o_ref, c.lse_ref, c.d_o, opt, dq_ref, dk_ref,
                                   dv_ref);
  Tensor o_t = c.o_ref;
  round_to<T>(o_t);
  reference_backward<T>(c.q, c.k, c.v, o_t, c.lse_ref, c.d_o, opt, dq_plain, dk_plain, dv_plain);

  const int partials = 2 * ranks;  // block pairs one query chunk meets, at most
  auto check = [&](const char* name, const Tensor& ring, const Tensor& flash, const Tensor& ref,
                   double bound) {
    const double err = max_abs_diff(ring, ref), err_flash = max_abs_diff(flash, ref);
    EXPECT_LE(err, bound) << what << ": " << name << " error " << err << " (bound " << bound
                          << "), single-rank flash's " << err_flash;
    // Against single-rank flash directly: both are within their bounds of
    // the oracle.
    const double diff = max_abs_diff(ring, flash);
    EXPECT_LE(diff, bound + err_flash)
        << what << ": " << name << " differs from single-rank flash by " << diff;
  };
  // The merges of the partial (O, lse) are exact in the accumulator up to
  // a few eps each, one per partial.
  const double merges = partials * epsilon<Acc>() * std::max(1.0, max_abs(c.lse_ref));
  check("O", o_ring, o_flash, c.o_ref,
        forward_o_bound<T>(f, max_abs(c.o_ref)) + partial_rounding<T>(max_abs(c.v), partials));
  check("lse", lse_ring, lse_flash, c.lse_ref,
        forward_lse_bound<T>(f, max_abs(c.lse_ref)) + 4 * merges);
  auto gradient_bound = [&](const Tensor& plain, const Tensor& ref) {
    return allowed_error<T>(max_abs_diff(plain, ref), ref) +
           partial_rounding<T>(max_abs(ref), partials);
  };
  check("dQ", dq_ring, dq_flash, dq_ref, gradient_bound(dq_plain, dq_ref));
  check("dK", dk_ring, dk_flash, dk_ref, gradient_bound(dk_plain, dk_ref));
  check("dV", dv_ring, dv_flash, dv_ref, gradient_bound(dv_plain, dv_ref));
}

/// A very uneven contiguous split: lengths 5 + 17·r, and (from 3 ranks on)
/// an empty slice on rank 1.
Split uneven_split() {
  Split split{kfa::RingSharding::contiguous, {}};
  for (int r = 0; r < world_size(); ++r)
    split.seqlens.push_back(r == 1 && world_size() >= 3 ? 0 : 5 + 17 * r);
  return split;
}

/// A global length that zigzag sharding can split at every rank count the
/// tests run with (divisible by 2·1, ..., 2·4).
constexpr std::size_t kZigzagSeqlen = 96;

template <class C>
class RingAttention : public ::testing::Test {};
TYPED_TEST_SUITE(RingAttention, AllConfigs);

TYPED_TEST(RingAttention, ContiguousMatchesSingleRank) {
  if (is_duplicate_config<TypeParam>()) GTEST_SKIP() << "half is float here";
  for (bool causal : {false, true}) {
    // 150 positions: slices of several 64-key tiles, a remainder at 4 ranks.
    check_ring<TypeParam>({kfa::RingSharding::contiguous, {}}, causal, 1, 40, 150);
    check_ring<TypeParam>(uneven_split(), causal, 2, 16, 0);
  }
}

TYPED_TEST(RingAttention, ZigzagMatchesSingleRank) {
  if (is_duplicate_config<TypeParam>()) GTEST_SKIP() << "half is float here";
  for (bool causal : {false, true}) {
    check_ring<TypeParam>({kfa::RingSharding::zigzag, {}}, causal, 2, 24, kZigzagSeqlen);
    // Batch 1: q, o and d_o are read in the caller's memory, not copied.
    check_ring<TypeParam>({kfa::RingSharding::zigzag, {}}, causal, 1, 32, kZigzagSeqlen);
  }
}

TYPED_TEST(RingAttention, GroupedQueryHeads) {
  if (is_duplicate_config<TypeParam>()) GTEST_SKIP() << "half is float here";
  // Two query heads share one key/value head: the K/V blocks and the dK/dV
  // accumulators that travel have heads_kv heads.
  for (bool causal : {false, true}) {
    check_ring<TypeParam>({kfa::RingSharding::zigzag, {}}, causal, 2, 16, kZigzagSeqlen,
                          kfa::RingTransport::mpi, 1);
    check_ring<TypeParam>(uneven_split(), causal, 1, 24, 0, kfa::RingTransport::mpi, 1);
  }
}

TYPED_TEST(RingAttention, HostStagedTransport) {
  if (is_duplicate_config<TypeParam>()) GTEST_SKIP() << "half is float here";
  check_ring<TypeParam>({kfa::RingSharding::zigzag, {}}, true, 1, 33, kZigzagSeqlen / 2,
                        kfa::RingTransport::mpi_host_staged);
  check_ring<TypeParam>(uneven_split(), false, 1, 33, 0, kfa::RingTransport::mpi_host_staged);
}

template <class Space>
class RingAttentionChecks : public ::testing::Test {};
using Spaces = AllSpaces;
TYPED_TEST_SUITE(RingAttentionChecks, Spaces);

/// Expects f() to throw std::invalid_argument whose message contains every
/// string in `needles` (on this rank; every rank runs it).
template <class F>
void expect_invalid(F&& f, std::initializer_list<std::string> needles, const std::string& what) {
  try {
    f();
    ADD_FAILURE() << what << ": no exception thrown on rank " << world_rank();
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    for (const std::string& n : needles)
      EXPECT_NE(msg.find(n), std::string::npos)
          << what << ": message '" << msg << "' lacks '" << n << "'";
  }
}

/// Local tensors with per-rank shapes, filled with a sentinel so that a
/// write can be seen.
template <class Space>
struct RingArgs {
  DeviceView4<float, Space> q, k, v, o, d_o, dq, dk, dv;
  DeviceView3<float, Space> lse;
  RingArgs(int batch, int seqlen, int heads, int head_dim, int lse_seqlen = -1)
      : q("q", batch, seqlen, heads, head_dim),
        k("k", batch, seqlen, heads, head_dim),
        v("v", batch, seqlen, heads, head_dim),
        o("o", batch, seqlen, heads, head_dim),
        d_o("d_o", batch, seqlen, heads, head_dim),
        dq("dq", batch, seqlen, heads, head_dim),
        dk("dk", batch, seqlen, heads, head_dim),
        dv("dv", batch, seqlen, heads, head_dim),
        lse("lse", batch, heads, lse_seqlen < 0 ? seqlen : lse_seqlen) {
    for (const auto& view : {o, dq, dk, dv}) Kokkos::deep_copy(view, 7.0f);
    Kokkos::deep_copy(lse, 7.0f);
  }
  void forward(const kfa::RingOptions& options) const {
    kfa::ring_attention_forward(Space(), MPI_COMM_WORLD, q, k, v, o, lse, options);
  }
  void backward(const kfa::RingOptions& options) const {
    kfa::ring_attention_backward(Space(), MPI_COMM_WORLD, q, k, v, o, lse, d_o, dq, dk, dv,
                                 options);
  }
  void expect_untouched(const std::string& what) const {
    for (const auto& view : {o, dq, dk, dv})
      for (double x : to_host(view).data) ASSERT_EQ(x, 7.0) << what << ": an output was written";
    for (double x : to_host(lse).data) ASSERT_EQ(x, 7.0) << what << ": lse was written";
  }
};

TYPED_TEST(RingAttentionChecks, ShapeMismatchBetweenRanksThrowsEverywhere) {
  using Space = TypeParam;
  const int ranks = world_size(), rank = world_rank();
  if (ranks < 2) GTEST_SKIP() << "needs two ranks";
  kfa::RingOptions opt;
  {
    const RingArgs<Space> args(2, 12, 2, rank == 1 ? 24 : 16);
    expect_invalid([&] { args.forward(opt); },
                   {"kfa::ring_attention_forward", "head_dim", "rank 1"}, "head_dim differs");
    expect_invalid([&] { args.backward(opt); }, {"kfa::ring_attention_backward", "rank 1"},
                   "head_dim differs (backward)");
    args.expect_untouched("head_dim differs");
  }
  {
    const RingArgs<Space> args(rank == ranks - 1 ? 3 : 2, 12, 2, 16);
    expect_invalid([&] { args.forward(opt); }, {"batch", "[3][12][2][16]"}, "batch differs");
    args.expect_untouched("batch differs");
  }
  {
    const RingArgs<Space> args(2, 12, 2, 16);
    kfa::RingOptions other = opt;
    other.causal = rank == 1;
    expect_invalid([&] { args.forward(other); }, {"options.causal"}, "causal differs");
    args.expect_untouched("causal differs");
  }
  {
    const RingArgs<Space> args(2, 12, 2, 16);
    kfa::RingOptions other = opt;
    other.fp32_matmul = rank == 1 ? kfa::Fp32Matmul::split_tf32 : kfa::Fp32Matmul::ieee;
    expect_invalid([&] { args.forward(other); }, {"options.fp32_matmul"}, "fp32_matmul differs");
    args.expect_untouched("fp32_matmul differs");
  }
  {
    const RingArgs<Space> args(2, 12, 2, 16);
    kfa::RingOptions other = opt;
    other.softcap = rank == 1 ? 30.0 : 0.0;
    expect_invalid([&] { args.backward(other); }, {"options.softcap"}, "softcap differs");
    args.expect_untouched("softcap differs");
  }
  {
    // k and v with one head on rank 1, two elsewhere (each valid locally).
    RingArgs<Space> args(1, 12, 2, 16);
    if (rank == 1) {
      args.k = DeviceView4<float, Space>("k", 1, 12, 1, 16);
      args.v = DeviceView4<float, Space>("v", 1, 12, 1, 16);
    }
    expect_invalid([&] { args.forward(opt); }, {"heads_kv", "rank 1"}, "heads_kv differs");
    args.expect_untouched("heads_kv differs");
  }
  {
    // Zigzag needs equal local lengths.
    const RingArgs<Space> args(1, rank == 0 ? 10 : 12, 2, 16);
    kfa::RingOptions zigzag = opt;
    zigzag.sharding = kfa::RingSharding::zigzag;
    expect_invalid([&] { args.forward(zigzag); }, {"zigzag", "local seqlen"}, "zigzag uneven");
    args.expect_untouched("zigzag uneven");
  }
}

TYPED_TEST(RingAttentionChecks, BadArgumentsOnOneRankThrowEverywhere) {
  using Space = TypeParam;
  const int rank = world_rank();
  kfa::RingOptions opt;
  {
    // Only rank 0 passes an lse of the wrong length.
    const RingArgs<Space> args(1, 12, 2, 16, rank == 0 ? 11 : 12);
    expect_invalid([&] { args.forward(opt); }, {"lse", "[1][2][11]", "on rank 0"},
                   "bad lse on rank 0");
    args.expect_untouched("bad lse on rank 0");
  }
  {
    const RingArgs<Space> args(1, 11, 2, 16);
    kfa::RingOptions zigzag = opt;
    zigzag.sharding = kfa::RingSharding::zigzag;
    expect_invalid([&] { args.backward(zigzag); }, {"zigzag", "even"}, "zigzag odd");
    args.expect_untouched("zigzag odd");
  }
  {
    // k shorter than q: not slices of one sequence.
    RingArgs<Space> args(1, 12, 2, 16);
    args.k = DeviceView4<float, Space>("k", 1, 10, 2, 16);
    args.v = DeviceView4<float, Space>("v", 1, 10, 2, 16);
    expect_invalid([&] { args.forward(opt); }, {"seqlen"}, "k shorter than q");
    args.expect_untouched("k shorter than q");
  }
  {
    // Positional options the ring's chunk-local calls cannot apply, on one
    // rank (the last) or on all: refused everywhere, nothing written.
    const RingArgs<Space> args(1, 12, 2, 16);
    const bool here = rank == world_size() - 1;
    kfa::RingOptions window = opt;
    window.window_left = here ? 4 : -1;
    expect_invalid([&] { args.forward(window); }, {"window_left", "ring attention"},
                   "window on the last rank");
    kfa::RingOptions dropout = opt;
    dropout.dropout_p = 0.1;
    expect_invalid([&] { args.backward(dropout); }, {"dropout_p", "0.1"}, "dropout");
    args.expect_untouched("window / dropout");
  }
  EXPECT_THROW(kfa::ring_local_seqlen(10, 0, 2, kfa::RingSharding::zigzag), std::invalid_argument);
}

/// Shard then gather gives the global tensor back; every local element
/// comes from its global position.
TYPED_TEST(RingAttentionChecks, ShardGatherRoundTrip) {
  using Space = TypeParam;
  const int ranks = world_size(), rank = world_rank();
  for (kfa::RingSharding sharding : {kfa::RingSharding::contiguous, kfa::RingSharding::zigzag}) {
    const std::size_t n = sharding == kfa::RingSharding::zigzag ? 6 * ranks : 5 * ranks + 3;
    const std::size_t seqlen = kfa::ring_local_seqlen(n, rank, ranks, sharding);
    // Value = global position + 1000·(other indices): the position of every
    // local element can be read back.
    DeviceView4<double, Space> global("global", 2, n, 3, 5);
    DeviceView3<double, Space> global3("global3", 2, 3, n);
    auto h4 = Kokkos::create_mirror_view(global);
    auto h3 = Kokkos::create_mirror_view(global3);
    for (std::size_t b = 0; b < 2; ++b)
      for (std::size_t i = 0; i < n; ++i)
        for (std::size_t h = 0; h < 3; ++h) {
          for (std::size_t d = 0; d < 5; ++d)
            h4(b, i, h, d) = double(i) + 1000.0 * (b * 15 + h * 5 + d);
          h3(b, h, i) = double(i) + 1000.0 * (b * 3 + h);
        }
    Kokkos::deep_copy(global, h4);
    Kokkos::deep_copy(global3, h3);
    DeviceView4<double, Space> local("local", 2, seqlen, 3, 5);
    DeviceView3<double, Space> local3("local3", 2, 3, seqlen);
    kfa::ring_shard(Space(), MPI_COMM_WORLD, global, local, sharding);
    kfa::ring_shard(Space(), MPI_COMM_WORLD, global3, local3, sharding);
    Space().fence();
    const Tensor l4 = to_host(local), l3 = to_host(local3);
    std::size_t offset = 0;  // contiguous: the lengths of the ranks before
    for (int r = 0; r < rank; ++r) offset += kfa::ring_local_seqlen(n, r, ranks, sharding);
    const std::size_t chunk = n / (2 * ranks);
    for (std::size_t i = 0; i < seqlen; ++i) {
      const std::size_t expected = sharding == kfa::RingSharding::contiguous ? offset + i
                                   : i < chunk                               ? rank * chunk + i
                                               : (2 * ranks - 1 - rank) * chunk + i - chunk;
      EXPECT_EQ(l4.at(1, int(i), 2, 4), double(expected) + 1000.0 * (15 + 10 + 4))
          << sharding_name(sharding) << " position " << i;
      EXPECT_EQ(l3.at(1, 2, int(i)), double(expected) + 1000.0 * (3 + 2));
    }
    DeviceView4<double, Space> back("back", 2, n, 3, 5);
    DeviceView3<double, Space> back3("back3", 2, 3, n);
    kfa::ring_gather(Space(), MPI_COMM_WORLD, local, back, sharding);
    kfa::ring_gather(Space(), MPI_COMM_WORLD, local3, back3, sharding);
    EXPECT_EQ(to_host(back).data, to_host(global).data) << sharding_name(sharding);
    EXPECT_EQ(to_host(back3).data, to_host(global3).data) << sharding_name(sharding);
    // Slices that do not add up to the global length.
    DeviceView4<double, Space> short_local("short", 2, rank == 0 ? seqlen - 1 : seqlen, 3, 5);
    expect_invalid([&] { kfa::ring_gather(Space(), MPI_COMM_WORLD, short_local, back, sharding); },
                   {"kfa::ring_gather"}, "short slices");
  }
}

/// Deterministic mode: the ring backward is bitwise reproducible.
TYPED_TEST(RingAttentionChecks, DeterministicBackwardIsReproducible) {
  using Space = TypeParam;
  const int ranks = world_size(), rank = world_rank();
  kfa::RingOptions opt;
  opt.causal = true;
  opt.deterministic = true;
  opt.sharding = kfa::RingSharding::zigzag;
  opt.team_size = test_team_size<Space>();
  const int n = static_cast<int>(kZigzagSeqlen);
  const Case c = make_case<float>({1, n, n, 2, 32}, opt, "ring-det");
  const kfa::RingCommunicator comm(MPI_COMM_WORLD);
  const std::size_t seqlen = kfa::ring_local_seqlen(n, rank, ranks, opt.sharding);
  const auto q = shard(comm, to_device<float, Space>(c.q, "q"), seqlen, opt.sharding, "q_l");
  const auto k = shard(comm, to_device<float, Space>(c.k, "k"), seqlen, opt.sharding, "k_l");
  const auto v = shard(comm, to_device<float, Space>(c.v, "v"), seqlen, opt.sharding, "v_l");
  const auto d_o = shard(comm, to_device<float, Space>(c.d_o, "d_o"), seqlen, opt.sharding, "do_l");
  const auto o = local_like(q, seqlen, "o");
  DeviceView3<float, Space> lse("lse", 1, 2, seqlen);
  kfa::ring_attention_forward(Space(), comm, q, k, v, o, lse, opt);
  std::vector<Tensor> runs;
  for (int run = 0; run < 2; ++run) {
    const auto dq = local_like(q, seqlen, "dq"), dk = local_like(q, seqlen, "dk"),
               dv = local_like(q, seqlen, "dv");
    kfa::ring_attention_backward(Space(), comm, q, k, v, o, lse, d_o, dq, dk, dv, opt);
    Space().fence();
    runs.push_back(to_host(dq));
    runs.push_back(to_host(dk));
    runs.push_back(to_host(dv));
  }
  for (int t = 0; t < 3; ++t) EXPECT_EQ(runs[t].data, runs[t + 3].data) << "tensor " << t;
}

/// The workspace of a ring call (cached per stream on CUDA, so a call finds
/// the buffers of the previous one, contents and all): a call after a
/// larger one, on the buffers that call left, gives bitwise the results of
/// the same call on fresh ones.
TYPED_TEST(RingAttentionChecks, RepeatedCallsOnAReusedWorkspaceMatch) {
  using Space = TypeParam;
  const int ranks = world_size(), rank = world_rank();
  const kfa::RingCommunicator comm(MPI_COMM_WORLD);
  kfa::RingOptions opt;
  opt.causal = true;
  opt.deterministic = true;
  opt.sharding = kfa::RingSharding::zigzag;
  opt.team_size = test_team_size<Space>();
  // Every output of one problem, in the order o, lse, dq, dk, dv.
  auto run = [&](int n, int head_dim, const char* tag) {
    const Case c = make_case<float>({1, n, n, 2, head_dim}, opt, tag);
    const std::size_t seqlen = kfa::ring_local_seqlen(n, rank, ranks, opt.sharding);
    const auto q = shard(comm, to_device<float, Space>(c.q, "q"), seqlen, opt.sharding, "q_l");
    const auto k = shard(comm, to_device<float, Space>(c.k, "k"), seqlen, opt.sharding, "k_l");
    const auto v = shard(comm, to_device<float, Space>(c.v, "v"), seqlen, opt.sharding, "v_l");
    const auto d_o =
        shard(comm, to_device<float, Space>(c.d_o, "d_o"), seqlen, opt.sharding, "do_l");
    const auto o = local_like(q, seqlen, "o"), dq = local_like(q, seqlen, "dq"),
               dk = local_like(q, seqlen, "dk"), dv = local_like(q, seqlen, "dv");
    DeviceView3<float, Space> lse("lse", 1, 2, seqlen);
    poison(o);
    poison(lse);
    poison(dq);
    poison(dk);
    poison(dv);
    kfa::ring_attention_forward(Space(), comm, q, k, v, o, lse, opt);
    kfa::ring_attention_backward(Space(), comm, q, k, v, o, lse, d_o, dq, dk, dv, opt);
    Space().fence();
    return std::vector<Tensor>{to_host(o), to_host(lse), to_host(dq), to_host(dk), to_host(dv)};
  };
  const int n = static_cast<int>(kZigzagSeqlen);
  const std::vector<Tensor> first = run(n, 32, "ring-reuse");
  const std::vector<Tensor> larger = run(2 * n, 64, "ring-reuse-larger");
  const std::vector<Tensor> again = run(n, 32, "ring-reuse");
  const char* names[5] = {"O", "lse", "dQ", "dK", "dV"};
  for (int t = 0; t < 5; ++t) {
    for (double x : first[t].data) ASSERT_TRUE(std::isfinite(x)) << names[t] << " not written";
    EXPECT_EQ(first[t].data, again[t].data) << names[t] << " differs after a larger call";
    for (double x : larger[t].data) ASSERT_TRUE(std::isfinite(x)) << names[t] << " (larger)";
  }
}

/// Positions [0, len0) and [len0, seqlen) of a rank-local tensor, the
/// extents of the chunk copies' cases.
struct ChunkDims {
  int batch, seqlen, heads, head_dim, len0;
};

/// The chunk-major copies into Flat's value type and back, for a rank-4
/// tensor and an lse: every element lands where the chunk-major layout puts
/// it (chunk 0 [batch][len0][heads][head_dim] then chunk 1; lse [batch]
/// [heads][len]) and comes back unchanged.
template <class Space, class FlatT>
void check_chunk_copies(const ChunkDims& s) {
  using Flat = Kokkos::View<FlatT*, Kokkos::LayoutRight, typename Space::memory_space>;
  const std::string what = "chunk copy [" + std::to_string(s.batch) + "][" +
                           std::to_string(s.seqlen) + "][" + std::to_string(s.heads) + "][" +
                           std::to_string(s.head_dim) + "] len0 " + std::to_string(s.len0);
  const auto chunk_of = [&](int i, int& len, int& j) {
    const int chunk = i < s.len0 ? 0 : 1;
    len = chunk == 0 ? s.len0 : s.seqlen - s.len0;
    j = i - chunk * s.len0;
    return chunk;
  };
  Tensor user({s.batch, s.seqlen, s.heads, s.head_dim}), lse({s.batch, s.heads, s.seqlen});
  for (std::size_t n = 0; n < user.data.size(); ++n) user.data[n] = static_cast<double>(n);
  for (std::size_t n = 0; n < lse.data.size(); ++n) lse.data[n] = -static_cast<double>(n);
  const auto user_d = to_device<float, Space>(user, "user");
  const auto lse_d = to_device3<float, Space>(lse, "lse");
  const Flat flat("flat", user.data.size()), flat_lse("flat_lse", lse.data.size());
  poison(flat);
  poison(flat_lse);
  using kfa::Impl::ChunkCopy;
  ChunkCopy<Space, decltype(user_d), Flat, true>(user_d, flat, s.len0).launch(Space());
  ChunkCopy<Space, decltype(lse_d), Flat, true>(lse_d, flat_lse, s.len0).launch(Space());
  const Tensor got = to_host(flat), got_lse = to_host(flat_lse);
  for (int b = 0; b < s.batch; ++b)
    for (int i = 0; i < s.seqlen; ++i) {
      int len, j;
      const int chunk = chunk_of(i, len, j);
      for (int h = 0; h < s.heads; ++h) {
        for (int d = 0; d < s.head_dim; ++d) {
          const std::size_t f = std::size_t(chunk) * s.batch * s.len0 * s.heads * s.head_dim +
                                ((std::size_t(b) * len + j) * s.heads + h) * s.head_dim + d;
          ASSERT_EQ(got.data[f], user.at(b, i, h, d)) << what << " at " << b << "," << i;
        }
        const std::size_t f = std::size_t(chunk) * s.batch * s.heads * s.len0 +
                              (std::size_t(b) * s.heads + h) * len + j;
        ASSERT_EQ(got_lse.data[f], lse.at(b, h, i)) << what << " lse at " << b << "," << i;
      }
    }
  const auto back = local_like(user_d, s.seqlen, "back");
  DeviceView3<float, Space> lse_back("lse_back", s.batch, s.heads, s.seqlen);
  poison(back);
  poison(lse_back);
  ChunkCopy<Space, decltype(back), Flat, false>(back, flat, s.len0).launch(Space());
  ChunkCopy<Space, decltype(lse_back), Flat, false>(lse_back, flat_lse, s.len0).launch(Space());
  EXPECT_EQ(to_host(back).data, user.data) << what;
  EXPECT_EQ(to_host(lse_back).data, lse.data) << what;

  // The same tensor as a padded View (positions [0, seqlen) of a longer
  // one, not contiguous from batch 2 on): one element a thread through the
  // View, into the same flat array and back.
  DeviceView4<float, Space> longer("longer", s.batch, s.seqlen + 3, s.heads, s.head_dim);
  const auto padded =
      Kokkos::subview(longer, Kokkos::ALL, std::make_pair(0, s.seqlen), Kokkos::ALL, Kokkos::ALL);
  if (s.batch > 1) ASSERT_FALSE(padded.span_is_contiguous()) << what;
  Kokkos::deep_copy(padded, user_d);
  const Flat flat_padded("flat_padded", user.data.size());
  poison(flat_padded);
  ChunkCopy<Space, decltype(padded), Flat, true>(padded, flat_padded, s.len0).launch(Space());
  EXPECT_EQ(to_host(flat_padded).data, got.data) << what << " (padded)";
  poison(longer);
  ChunkCopy<Space, decltype(padded), Flat, false>(padded, flat, s.len0).launch(Space());
  Kokkos::deep_copy(back, padded);
  EXPECT_EQ(to_host(back).data, user.data) << what << " (padded)";
}

// Runs of a multiple of the pack width (packed copies), odd runs (one
// element a thread), one chunk, a batch of 1, padded Views; float to float
// (4 a pack) and to double (2 a pack).
TYPED_TEST(RingAttentionChecks, ChunkCopiesPlaceEveryElement) {
  for (const ChunkDims& s :
       {ChunkDims{2, 10, 3, 4, 4}, ChunkDims{2, 9, 3, 5, 3}, ChunkDims{1, 7, 1, 3, 2},
        ChunkDims{3, 8, 2, 8, 8}, ChunkDims{2, 12, 2, 6, 5}}) {
    check_chunk_copies<TypeParam, float>(s);
    check_chunk_copies<TypeParam, double>(s);
  }
}

#ifdef KOKKOS_ENABLE_CUDA
// The pinned staging buffers of host-staged exchanges: cached per stream
// and message tag (a later request reuses the buffer once the earlier one
// is released), a held buffer makes the request get a private one, another
// tag or stream gets its own, release_workspaces() empties the cache.
TEST(RingStagingCuda, PinnedBuffersCachedPerStreamAndTag) {
  using kfa::Impl::staging_buffer;
  using kfa::Impl::WorkspaceSlot;
  kfa::release_workspaces();
  const Kokkos::Cuda space;
  const unsigned char* first = nullptr;
  {
    const auto a = staging_buffer(space, 7, WorkspaceSlot::staging_recv, 4096, "test::a");
    first = a.data();
    const auto held = staging_buffer(space, 7, WorkspaceSlot::staging_recv, 1024, "test::held");
    EXPECT_NE(held.data(), first);
  }
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  {
    const auto b = staging_buffer(space, 7, WorkspaceSlot::staging_recv, 1024, "test::b");
    EXPECT_EQ(b.data(), first);
    EXPECT_EQ(b.extent(0), 4096u);
    const auto send = staging_buffer(space, 7, WorkspaceSlot::staging_send, 1024, "test::send");
    const auto tag = staging_buffer(space, 8, WorkspaceSlot::staging_recv, 1024, "test::tag");
    const auto other =
        staging_buffer(Kokkos::Cuda(stream), 7, WorkspaceSlot::staging_recv, 1024, "test::other");
    for (const unsigned char* p : {send.data(), tag.data(), other.data()}) EXPECT_NE(p, first);
    EXPECT_NE(send.data(), tag.data());
    EXPECT_NE(tag.data(), other.data());
  }
  kfa::release_workspaces();
  ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);
  const auto c = staging_buffer(space, 7, WorkspaceSlot::staging_recv, 1024, "test::c");
  EXPECT_EQ(c.extent(0), 1024u);  // a new buffer after the release
}
#endif

}  // namespace
}  // namespace kfa_test
