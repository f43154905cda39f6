// Ring attention on P ranks (mpirun -np P bench_ring ...), forward and
// backward, on the default execution space:
//  - per rank: time, TFLOP/s (the rank's share of the useful work), time per
//    ring step, and the communication time hidden behind the compute vs
//    exposed (the wait after a step's compute). The communication alone is
//    measured by running the same exchanges with no compute; hidden = alone
//    - exposed (at least 0);
//  - strong scaling: the same global sequence on one rank (rank 0 runs
//    single-rank flash attention while the others wait), efficiency
//    T1 / (P·TP);
//  - weak scaling: the same work per rank, i.e. a global sequence √P times
//    longer (attention work grows with N²), efficiency T1 / TP.
// FLOP counts as in bench_attention: 4·B·H·N²·D forward, 2.5x that
// backward, halved when causal.
//
//   mpirun -np P bench_ring [--batch B] [--seqlen N] [--heads H] [--head-dim D]
//       [--causal] [--contiguous|--zigzag] [--transport mpi|staged|direct|nccl]
//       [--dtype float|double|bf16|fp16] [--double] [--repeat R] [--no-weak]

#include <kfa/kfa.hpp>
#include <kfa/ring_attention.hpp>

#include <kfa/detail/ring/transport/transport.hpp>

#include <Kokkos_Core.hpp>

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

using Space = Kokkos::DefaultExecutionSpace;
using clock_type = std::chrono::steady_clock;

struct Args {
  int batch = 1, seqlen = 4096, heads = 4, head_dim = 64, repeat = 3;
  bool causal = false, weak = true;
  std::string dtype = "float";
  kfa::RingSharding sharding = kfa::RingSharding::zigzag;
  kfa::RingTransport transport = kfa::RingTransport::mpi;
};

Args parse(int argc, char* argv[]) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    auto next = [&]() { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (s == "--batch") a.batch = std::atoi(next().c_str());
    else if (s == "--seqlen") a.seqlen = std::atoi(next().c_str());
    else if (s == "--heads") a.heads = std::atoi(next().c_str());
    else if (s == "--head-dim") a.head_dim = std::atoi(next().c_str());
    else if (s == "--repeat") a.repeat = std::max(1, std::atoi(next().c_str()));
    else if (s == "--causal") a.causal = true;
    else if (s == "--double") a.dtype = "double";
    else if (s == "--dtype") a.dtype = next();
    else if (s == "--no-weak") a.weak = false;
    else if (s == "--contiguous") a.sharding = kfa::RingSharding::contiguous;
    else if (s == "--zigzag") a.sharding = kfa::RingSharding::zigzag;
    else if (s == "--transport") {
      const std::string t = next();
      a.transport = t == "staged"   ? kfa::RingTransport::mpi_host_staged
                    : t == "direct" ? kfa::RingTransport::mpi_device_direct
                    : t == "nccl"   ? kfa::RingTransport::nccl
                                    : kfa::RingTransport::mpi;
    }
  }
  return a;
}

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

double sum(const std::vector<double>& x) {
  double s = 0;
  for (double v : x) s += v;
  return s;
}

/// What one rank measured for one pass (forward or backward).
struct PassStats {
  double seconds = 0;        // median wall time of a call
  double compute = 0;        // sum over steps, of that call
  double exposed = 0;        // communication not hidden, of that call
  double comm_alone = 0;     // the same exchanges without compute
  double steps = 0;
};

/// Uniform values in [-1, 1) from a counter hash (any value type, Kokkos 3
/// and 4 alike); `seed` separates tensors and ranks.
template <class View>
void fill_uniform(const View& view, std::uint64_t seed) {
  using T = typename View::value_type;
  const auto flat = Kokkos::View<T*, typename View::memory_space,
                                 Kokkos::MemoryTraits<Kokkos::Unmanaged>>(view.data(),
                                                                          view.span());
  Kokkos::parallel_for(
      "kfa::bench_ring::fill", Kokkos::RangePolicy<Space>(0, flat.extent(0)),
      KOKKOS_LAMBDA(const std::size_t n) {
        std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + n;
        x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
        x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
        x ^= x >> 31;
        flat(n) = static_cast<T>(static_cast<float>(x >> 40) * (2.0f / 16777216.0f) - 1.0f);
      });
}

template <class T>
class RingProblem {
 public:
  using Acc = kfa::accumulator_t<T>;
  using View4 = Kokkos::View<T****, Kokkos::LayoutRight, Space::memory_space>;
  using View3 = Kokkos::View<Acc***, Kokkos::LayoutRight, Space::memory_space>;

  RingProblem(const kfa::RingCommunicator& comm, const Args& a, int global_seqlen)
      : m_comm(comm), m_args(a), m_seqlen(global_seqlen) {
    const int L = static_cast<int>(
        kfa::ring_local_seqlen(global_seqlen, comm.rank(), comm.size(), a.sharding));
    const int B = a.batch, H = a.heads, D = a.head_dim;
    m_q = View4("q", B, L, H, D);
    m_k = View4("k", B, L, H, D);
    m_v = View4("v", B, L, H, D);
    m_o = View4("o", B, L, H, D);
    m_do = View4("d_o", B, L, H, D);
    m_dq = View4("dq", B, L, H, D);
    m_dk = View4("dk", B, L, H, D);
    m_dv = View4("dv", B, L, H, D);
    m_lse = View3("lse", B, H, L);
    const std::uint64_t seed = 4 * (12345 + std::uint64_t(comm.rank()));
    fill_uniform(m_q, seed);
    fill_uniform(m_k, seed + 1);
    fill_uniform(m_v, seed + 2);
    fill_uniform(m_do, seed + 3);
    m_options.causal = a.causal;
    m_options.sharding = a.sharding;
    m_options.transport = a.transport;
  }

  PassStats forward() {
    kfa::Experimental::RingProfile profile;
    m_options.profile = &profile;
    const double t = median([&] {
      kfa::ring_attention_forward(Space(), m_comm, m_q, m_k, m_v, m_o, m_lse, m_options);
    });
    m_transport = profile.transport;
    return stats(t, profile, comm_alone(sizeof(T), m_comm.size() - 1, 0, 0));
  }

  PassStats backward() {
    kfa::Experimental::RingProfile profile;
    m_options.profile = &profile;
    const double t = median([&] {
      kfa::ring_attention_backward(Space(), m_comm, m_q, m_k, m_v, m_o, m_lse, m_do, m_dq, m_dk,
                                   m_dv, m_options);
    });
    return stats(t, profile,
                 comm_alone(sizeof(T), m_comm.size() - 1, sizeof(Acc),
                            m_comm.size() > 1 ? m_comm.size() : 0));
  }

  const std::string& transport() const { return m_transport; }

 private:
  template <class F>
  double median(F&& f) {
    f();  // warm-up (and, before the backward pass, nothing else is needed:
          // o and lse come from the forward pass run first)
    std::vector<double> times;
    for (int r = 0; r < m_args.repeat; ++r) {
      MPI_Barrier(m_comm.comm());
      const auto t0 = clock_type::now();
      f();
      Space().fence();
      times.push_back(seconds_since(t0));
    }
    std::sort(times.begin(), times.end());
    return times[times.size() / 2];
  }

  /// Bytes of the [K][V] block of `rank` with elements of `element` bytes.
  std::size_t block_bytes(int rank, std::size_t element) const {
    const int ranks = m_comm.size();
    const std::size_t seqlen =
        kfa::ring_local_seqlen(m_seqlen, (rank % ranks + ranks) % ranks, ranks, m_args.sharding);
    return element * 2 * m_args.batch * seqlen * m_args.heads * m_args.head_dim;
  }

  /// The exchanges of one call with no compute: `kv_steps` K/V blocks of
  /// `kv_element`-byte values, then `grad_steps` dK/dV blocks of
  /// `grad_element`-byte values; at step s this rank sends the block of rank
  /// (rank - s) and receives that of rank (rank - s - 1), as the ring does.
  double comm_alone(std::size_t kv_element, int kv_steps, std::size_t grad_element,
                    int grad_steps) {
    using Bytes = Kokkos::View<char*, Space::memory_space>;
    const int rank = m_comm.rank();
    std::size_t size = 0;
    for (int r = 0; r < m_comm.size(); ++r)
      size = std::max(size, block_bytes(r, std::max(kv_element, grad_element)));
    Bytes send("bench_ring::send", size), recv("bench_ring::recv", size);
    auto exchange = kfa::Impl::make_ring_exchange<Space>(m_comm, m_options.transport, 4242);
    auto run = [&](std::size_t element, int steps) {
      for (int s = 0; s < steps; ++s) {
        exchange->start(Space(), {send.data(), block_bytes(rank - s, element), recv.data(),
                                  block_bytes(rank - s - 1, element)});
        exchange->wait(Space());
      }
      Space().fence();
    };
    run(kv_element, kv_steps);  // warm-up
    MPI_Barrier(m_comm.comm());
    const auto t0 = clock_type::now();
    run(kv_element, kv_steps);
    run(grad_element, grad_steps);
    return seconds_since(t0);
  }

  static PassStats stats(double t, const kfa::Experimental::RingProfile& p, double alone) {
    PassStats s;
    s.seconds = t;
    s.compute = sum(p.compute_seconds);
    s.exposed = sum(p.exposed_comm_seconds);
    s.comm_alone = alone;
    s.steps = static_cast<double>(p.compute_seconds.size());
    return s;
  }

  const kfa::RingCommunicator& m_comm;
  Args m_args;
  int m_seqlen;
  View4 m_q, m_k, m_v, m_o, m_do, m_dq, m_dk, m_dv;
  View3 m_lse;
  kfa::RingOptions m_options;
  std::string m_transport;
};

/// Single-rank flash attention on the global sequence, on rank 0 alone
/// (the others wait): the T1 of the scaling efficiencies.
template <class T>
void single_rank(const Args& a, int seqlen, double& fwd, double& bwd) {
  using Acc = kfa::accumulator_t<T>;
  using View4 = Kokkos::View<T****, Kokkos::LayoutRight, Space::memory_space>;
  using View3 = Kokkos::View<Acc***, Kokkos::LayoutRight, Space::memory_space>;
  const int B = a.batch, H = a.heads, D = a.head_dim;
  View4 q("q", B, seqlen, H, D), k("k", B, seqlen, H, D), v("v", B, seqlen, H, D),
      o("o", B, seqlen, H, D), d_o("d_o", B, seqlen, H, D), dq("dq", B, seqlen, H, D),
      dk("dk", B, seqlen, H, D), dv("dv", B, seqlen, H, D);
  View3 lse("lse", B, H, seqlen);
  fill_uniform(q, 4 * 12345);
  fill_uniform(k, 4 * 12345 + 1);
  fill_uniform(v, 4 * 12345 + 2);
  fill_uniform(d_o, 4 * 12345 + 3);
  kfa::AttentionOptions options;
  options.causal = a.causal;
  auto median = [&](auto&& f) {
    f();
    Space().fence();
    std::vector<double> times;
    for (int r = 0; r < a.repeat; ++r) {
      const auto t0 = clock_type::now();
      f();
      Space().fence();
      times.push_back(seconds_since(t0));
    }
    std::sort(times.begin(), times.end());
    return times[times.size() / 2];
  };
  fwd = median([&] { kfa::flash_attention_forward(Space(), q, k, v, o, lse, options); });
  bwd = median([&] {
    kfa::flash_attention_backward(Space(), q, k, v, o, lse, d_o, dq, dk, dv, options);
  });
}

double flops(const Args& a, int seqlen, bool backward) {
  const double f = 4.0 * a.batch * a.heads * double(seqlen) * seqlen * a.head_dim;
  return f * (backward ? 2.5 : 1.0) * (a.causal ? 0.5 : 1.0);
}

/// Runs ring attention at `seqlen` and prints the per-rank table; returns
/// the slowest rank's forward and backward times.
template <class T>
void ring_run(const kfa::RingCommunicator& comm, const Args& a, int seqlen, const char* title,
              double& fwd, double& bwd) {
  RingProblem<T> problem(comm, a, seqlen);
  const PassStats f = problem.forward(), b = problem.backward();
  const int ranks = comm.size();
  const double mine[10] = {f.seconds, f.compute, f.exposed, f.comm_alone, f.steps,
                           b.seconds, b.compute, b.exposed, b.comm_alone, b.steps};
  std::vector<double> all(10 * ranks);
  MPI_Gather(mine, 10, MPI_DOUBLE, all.data(), 10, MPI_DOUBLE, 0, comm.comm());
  fwd = bwd = 0;
  if (comm.rank() != 0) return;
  std::printf("\n%s: global seqlen %d, %d per rank, transport %s\n", title, seqlen,
              static_cast<int>(kfa::ring_local_seqlen(seqlen, 0, ranks, a.sharding)),
              problem.transport().c_str());
  std::printf("  %-4s %4s %10s %12s %11s %11s %12s %12s\n", "pass", "rank", "ms", "TFLOP/s/rank",
              "ms/step", "comm alone", "comm hidden", "comm exposed");
  for (int pass = 0; pass < 2; ++pass) {
    for (int r = 0; r < ranks; ++r) {
      const double* s = &all[10 * r + 5 * pass];
      const double t = s[0], exposed = s[2], alone = s[3], steps = s[4];
      std::printf("  %-4s %4d %10.2f %12.4f %11.2f %8.2f ms %9.2f ms %9.2f ms\n",
                  pass == 0 ? "fwd" : "bwd", r, 1e3 * t,
                  flops(a, seqlen, pass == 1) / ranks / t * 1e-12, 1e3 * t / steps, 1e3 * alone,
                  1e3 * std::max(0.0, alone - exposed), 1e3 * exposed);
      (pass == 0 ? fwd : bwd) = std::max(pass == 0 ? fwd : bwd, t);
    }
  }
}

template <class T>
void run(const Args& a) {
  const kfa::RingCommunicator comm(MPI_COMM_WORLD);
  const int ranks = comm.size(), rank = comm.rank();
  // Global lengths the sharding can split: a multiple of 2P for zigzag.
  const int granule = a.sharding == kfa::RingSharding::zigzag ? 2 * ranks : 1;
  const int strong_seqlen = (a.seqlen + granule - 1) / granule * granule;
  const int weak_seqlen =
      static_cast<int>(std::lround(a.seqlen * std::sqrt(double(ranks)) / granule)) * granule;
  if (rank == 0) {
    std::printf("%s, execution space %s, %d rank(s), %s, batch %d, heads %d, head_dim %d, %s, %s "
                "sharding\n",
                kfa::configuration().c_str(), Space::name(), ranks,
                a.dtype.c_str(), a.batch, a.heads, a.head_dim,
                a.causal ? "causal" : "full",
                a.sharding == kfa::RingSharding::zigzag ? "zigzag" : "contiguous");
  }
  double t1_fwd = 0, t1_bwd = 0, w1_fwd = 0, w1_bwd = 0;
  if (rank == 0) single_rank<T>(a, a.seqlen, t1_fwd, t1_bwd);
  MPI_Barrier(comm.comm());
  double tp_fwd, tp_bwd;
  ring_run<T>(comm, a, strong_seqlen, "strong scaling (same total work)", tp_fwd, tp_bwd);
  if (rank == 0) {
    std::printf("  one rank, single-rank flash attention at seqlen %d: fwd %.2f ms (%.4f TFLOP/s), "
                "bwd %.2f ms (%.4f TFLOP/s)\n",
                a.seqlen, 1e3 * t1_fwd, flops(a, a.seqlen, false) / t1_fwd * 1e-12, 1e3 * t1_bwd,
                flops(a, a.seqlen, true) / t1_bwd * 1e-12);
    std::printf("  strong scaling efficiency T1/(P*TP): fwd %.1f%%, bwd %.1f%%\n",
                100 * t1_fwd / (ranks * tp_fwd), 100 * t1_bwd / (ranks * tp_bwd));
  }
  if (!a.weak) return;
  double wp_fwd, wp_bwd;
  ring_run<T>(comm, a, weak_seqlen, "weak scaling (same work per rank: seqlen x sqrt(P))", wp_fwd,
              wp_bwd);
  w1_fwd = t1_fwd;
  w1_bwd = t1_bwd;
  if (rank == 0) {
    std::printf("  weak scaling efficiency T1/TP (work per rank %.3g GFLOP fwd): fwd %.1f%%, "
                "bwd %.1f%%\n",
                flops(a, weak_seqlen, false) / ranks * 1e-9, 100 * w1_fwd / wp_fwd,
                100 * w1_bwd / wp_bwd);
  }
}

}  // namespace

int main(int argc, char* argv[]) {
  MPI_Init(&argc, &argv);
  {
    Kokkos::ScopeGuard guard(argc, argv);
    const Args args = parse(argc, argv);
    if (args.dtype == "double") run<double>(args);
    else if (args.dtype == "float") run<float>(args);
    else if (args.dtype == "bf16") run<kfa::bfloat16>(args);
    else if (args.dtype == "fp16") run<kfa::half>(args);
    else {
      std::fprintf(stderr, "bench_ring: --dtype must be float, double, bf16 or fp16\n");
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
  }
  MPI_Finalize();
  return 0;
}
