// kfa ring attention example: one sequence sharded over the ranks of
// MPI_COMM_WORLD, attention forward and backward computed with the K/V
// blocks passed around the ring, checked against single-rank flash
// attention on the whole sequence, with the time of every rank.
//
//   mpirun -np P ring_attention [--batch B] [--seqlen N] [--heads H] [--head-dim D]
//                               [--causal] [--zigzag] [--double] [--repeat R]
//
// Exits non-zero when ring and single-rank attention disagree by more than a
// few units in the last place of the value type.

#include <kfa/kfa.hpp>
#include <kfa/ring_attention.hpp>

#include "example_common.hpp"

#include <Kokkos_Core.hpp>

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

namespace {

struct Args : kfa_example::CommonArgs {
  bool zigzag = false;
};

Args parse(int argc, char* argv[]) {
  return kfa_example::parse_args(argc, argv, Args{},
                                 [](Args& a, const std::string& s, auto&&) {
                                   return s == "--zigzag" && (a.zigzag = true);
                                 });
}

using kfa_example::max_abs_diff;

/// Median wall time of `repeat` runs of f after a warm-up run, each started
/// together on every rank of `comm` and fenced.
template <class Space, class F>
double median_seconds(MPI_Comm comm, int repeat, F&& f) {
  f();
  Space().fence();
  std::vector<double> times;
  for (int r = 0; r < repeat; ++r) {
    MPI_Barrier(comm);
    const auto t0 = std::chrono::steady_clock::now();
    f();
    Space().fence();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

double sum(const std::vector<double>& x) {
  double s = 0;
  for (double v : x) s += v;
  return s;
}

template <class T>
int run(const Args& a) {
  using Space = Kokkos::DefaultExecutionSpace;
  using Acc = kfa::accumulator_t<T>;
  using View4 = Kokkos::View<T****, Kokkos::LayoutRight, Space::memory_space>;
  using View3 = Kokkos::View<Acc***, Kokkos::LayoutRight, Space::memory_space>;
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  const int B = a.batch, N = a.seqlen, H = a.heads, D = a.head_dim;
  const kfa::RingSharding sharding =
      a.zigzag ? kfa::RingSharding::zigzag : kfa::RingSharding::contiguous;
  const int L = static_cast<int>(kfa::ring_local_seqlen(N, rank, ranks, sharding));

  // The whole problem, made identically on every rank (an application would
  // read or compute only its own slice).
  View4 q("q", B, N, H, D), k("k", B, N, H, D), v("v", B, N, H, D), d_o("d_o", B, N, H, D);
  std::mt19937_64 rng(20261129);
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  for (const View4& view : {q, k, v, d_o}) {
    auto host = Kokkos::create_mirror_view(view);
    for (std::size_t n = 0; n < host.size(); ++n) host.data()[n] = static_cast<T>(uniform(rng));
    Kokkos::deep_copy(view, host);
  }

  // This rank's slices, and ring attention on them.
  const kfa::RingCommunicator comm(MPI_COMM_WORLD);
  View4 q_l("q_l", B, L, H, D), k_l("k_l", B, L, H, D), v_l("v_l", B, L, H, D),
      do_l("do_l", B, L, H, D), o_l("o_l", B, L, H, D), dq_l("dq_l", B, L, H, D),
      dk_l("dk_l", B, L, H, D), dv_l("dv_l", B, L, H, D);
  View3 lse_l("lse_l", B, H, L);
  const Space space;
  kfa::ring_shard(space, comm, q, q_l, sharding);
  kfa::ring_shard(space, comm, k, k_l, sharding);
  kfa::ring_shard(space, comm, v, v_l, sharding);
  kfa::ring_shard(space, comm, d_o, do_l, sharding);
  kfa::RingOptions options;
  options.causal = a.causal;
  options.sharding = sharding;
  kfa::Experimental::RingProfile fwd_profile, bwd_profile;

  options.profile = &fwd_profile;
  const double fwd = median_seconds<Space>(MPI_COMM_WORLD, a.repeat, [&] {
    kfa::ring_attention_forward(space, comm, q_l, k_l, v_l, o_l, lse_l, options);
  });
  options.profile = &bwd_profile;
  const double bwd = median_seconds<Space>(MPI_COMM_WORLD, a.repeat, [&] {
    kfa::ring_attention_backward(space, comm, q_l, k_l, v_l, o_l, lse_l, do_l, dq_l, dk_l, dv_l,
                                 options);
  });

  // Gathered results against single-rank flash attention on the whole sequence.
  View4 o("o", B, N, H, D), dq("dq", B, N, H, D), dk("dk", B, N, H, D), dv("dv", B, N, H, D);
  View3 lse("lse", B, H, N);
  View4 o_ring("o_ring", B, N, H, D), dq_ring("dq_ring", B, N, H, D),
      dk_ring("dk_ring", B, N, H, D), dv_ring("dv_ring", B, N, H, D);
  View3 lse_ring("lse_ring", B, H, N);
  kfa::ring_gather(space, comm, o_l, o_ring, sharding);
  kfa::ring_gather(space, comm, lse_l, lse_ring, sharding);
  kfa::ring_gather(space, comm, dq_l, dq_ring, sharding);
  kfa::ring_gather(space, comm, dk_l, dk_ring, sharding);
  kfa::ring_gather(space, comm, dv_l, dv_ring, sharding);
  const double fwd_single = rank == 0 ? median_seconds<Space>(MPI_COMM_SELF, 1, [&] {
    kfa::flash_attention_forward(space, q, k, v, o, lse, options);
  }) : 0;
  const double bwd_single = rank == 0 ? median_seconds<Space>(MPI_COMM_SELF, 1, [&] {
    kfa::flash_attention_backward(space, q, k, v, o, lse, d_o, dq, dk, dv, options);
  }) : 0;

  // Per-rank times to rank 0: forward, backward, their exposed communication.
  const double mine[4] = {fwd, bwd, sum(fwd_profile.exposed_comm_seconds),
                          sum(bwd_profile.exposed_comm_seconds)};
  std::vector<double> all(4 * ranks);
  MPI_Gather(mine, 4, MPI_DOUBLE, all.data(), 4, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  int ok = 1;
  if (rank == 0) {
    std::printf("kfa %s ring attention on %d rank(s), %s: batch %d, seqlen %d (%s, %d per rank), "
                "heads %d, head_dim %d, %s, %s, transport %s\n",
                kfa::version().c_str(), ranks, Space::name(), B, N,
                a.zigzag ? "zigzag" : "contiguous", L, H, D, a.causal ? "causal" : "full",
                std::is_same<T, double>::value ? "double" : "float", fwd_profile.transport.c_str());
    std::printf("\n  %4s %12s %12s %22s %22s\n", "rank", "forward", "backward",
                "fwd comm not hidden", "bwd comm not hidden");
    for (int r = 0; r < ranks; ++r)
      std::printf("  %4d %9.2f ms %9.2f ms %19.2f ms %19.2f ms\n", r, 1e3 * all[4 * r],
                  1e3 * all[4 * r + 1], 1e3 * all[4 * r + 2], 1e3 * all[4 * r + 3]);
    std::printf("  single-rank flash attention (rank 0 alone): forward %.2f ms, backward %.2f ms\n",
                1e3 * fwd_single, 1e3 * bwd_single);
    const double err_o = max_abs_diff(o_ring, o), err_lse = max_abs_diff(lse_ring, lse);
    const double err_dq = max_abs_diff(dq_ring, dq), err_dk = max_abs_diff(dk_ring, dk),
                 err_dv = max_abs_diff(dv_ring, dv);
    std::printf("  max |ring - single-rank|: O %.3g, lse %.3g, dQ %.3g, dK %.3g, dV %.3g\n", err_o,
                err_lse, err_dq, err_dk, err_dv);
    const double eps = std::is_same<T, double>::value ? 1e-13 : 1e-4;
    ok = err_o < eps && err_lse < eps && err_dq < 10 * eps && err_dk < 10 * eps &&
         err_dv < 10 * eps;
    std::printf("  %s\n", ok ? "OK: ring attention matches single-rank flash attention"
                             : "FAILED: ring and single-rank attention disagree");
  }
  MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char* argv[]) {
  MPI_Init(&argc, &argv);
  int status = 0;
  {
    Kokkos::ScopeGuard guard(argc, argv);
    const Args args = parse(argc, argv);
    status = args.use_double ? run<double>(args) : run<float>(args);
  }
  MPI_Finalize();
  return status;
}
