// A neural surrogate trained online inside a simulation. The simulation:
// 1D viscous Burgers, u_t + (u²/2)_x = ν·u_xx on a periodic grid, an
// ensemble of fields stepped by an explicit finite-volume scheme (Rusanov
// flux, forward Euler); each field restarts from a new random state now
// and then, so the data keep changing. The model: the grid cut into patch
// tokens, a linear patch embedding, kfa::nn::TransformerBlocks (rotary
// positions over the patches), a linear head whose output is added to the
// input, so the model predicts the next state as the current one plus a
// learnt increment (the head starts at zero: the first prediction is "no
// change"). Every simulation step trains it once with AdamW on the newest
// (u(t), u(t + Δt)) pair of every field and prints the loss, the mean
// squared error of the predicted next state.
//
// MPI: each rank owns a contiguous run of patches of every field and steps
// its grid points with halo exchange; the blocks run in the layers'
// sequence-parallel mode (attention as ring attention over the ranks), the
// embedding, norms, MLPs and head stay local, and the parameter gradients
// are summed over the ranks with kfa::nn::allreduce_gradients. The ranks
// compute the same model as one rank does on the whole grid.
//
//   mpirun -np P surrogate [--repeat STEPS] [--grid N] [--patch P] [--batch FIELDS]
//                          [--heads H] [--head-dim D] [--blocks L]
//
// In fp64 (one value type keeps the example quick to build).
//
// Exits non-zero unless the loss falls tenfold: the mean of the last ten
// steps' losses against the first step's.

#include <kfa/nn.hpp>

#include "example_common.hpp"

#include <Kokkos_Core.hpp>

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace surrogate {

using Space = Kokkos::DefaultExecutionSpace;

struct Args : kfa_example::CommonArgs {
  int grid = 256, patch = 8, blocks = 2;
};

/// The simulation: `fields` Burgers fields on this rank's `local` points of
/// a periodic grid of `grid` points, with one ghost point at each end.
class Burgers {
 public:
  Burgers(int fields, int grid, int local, int offset, MPI_Comm comm)
      : m_fields(fields), m_grid(grid), m_local(local), m_offset(offset), m_comm(comm),
        m_u(std::size_t(fields) * (local + 2)), m_next(m_u.size()) {
    int rank = 0, ranks = 1;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &ranks);
    m_left = (rank + ranks - 1) % ranks;
    m_right = (rank + 1) % ranks;
    const double dx = 1.0 / grid;
    // Stable for |u| <= 2 (advection CFL 0.4) and for the diffusion.
    m_dt = 0.4 * std::min(dx / 2.0, dx * dx / (2 * kViscosity));
  }

  static constexpr double kViscosity = 2e-3;
  /// Explicit steps per simulation step (the model's time step).
  static constexpr int kSubsteps = 8;

  /// Field `f` := 1 + Σ_k a_k sin(2πk(x + φ_k)), k = 1..4, from `seed`
  /// (the same global field on every rank).
  void restart(int f, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> uniform(0.0, 1.0);
    double a[4], phase[4];
    for (int k = 0; k < 4; ++k) {
      a[k] = 0.35 * uniform(rng) / (k + 1);
      phase[k] = uniform(rng);
    }
    for (int i = 0; i < m_local; ++i) {
      const double x = double(m_offset + i) / m_grid;
      double u = 1;
      for (int k = 0; k < 4; ++k) u += a[k] * std::sin(2 * M_PI * (k + 1) * (x + phase[k]));
      at(m_u, f, i + 1) = u;
    }
  }

  /// One simulation step: kSubsteps explicit steps, each after a halo exchange.
  void step() {
    const double dx = 1.0 / m_grid, c = m_dt / dx, d = kViscosity * m_dt / (dx * dx);
    for (int s = 0; s < kSubsteps; ++s) {
      exchange_halos();
      for (int f = 0; f < m_fields; ++f) {
        for (int i = 1; i <= m_local; ++i) {
          const double um = at(m_u, f, i - 1), u0 = at(m_u, f, i), up = at(m_u, f, i + 1);
          at(m_next, f, i) = u0 - c * (flux(u0, up) - flux(um, u0)) + d * (up - 2 * u0 + um);
        }
      }
      std::swap(m_u, m_next);
    }
  }

  /// This rank's points of field f (without ghosts).
  double value(int f, int i) const { return at(m_u, f, i + 1); }

 private:
  /// Rusanov (local Lax-Friedrichs) flux of u²/2 between two cells.
  static double flux(double ul, double ur) {
    return 0.25 * (ul * ul + ur * ur) - 0.5 * std::max(std::abs(ul), std::abs(ur)) * (ur - ul);
  }
  double& at(std::vector<double>& u, int f, int i) { return u[std::size_t(f) * (m_local + 2) + i]; }
  double at(const std::vector<double>& u, int f, int i) const {
    return u[std::size_t(f) * (m_local + 2) + i];
  }

  /// Ghost points from the neighbouring ranks (from this rank itself on one).
  void exchange_halos() {
    std::vector<double> first(m_fields), last(m_fields), from_left(m_fields), from_right(m_fields);
    for (int f = 0; f < m_fields; ++f) {
      first[f] = at(m_u, f, 1);
      last[f] = at(m_u, f, m_local);
    }
    MPI_Sendrecv(last.data(), m_fields, MPI_DOUBLE, m_right, 0, from_left.data(), m_fields,
                 MPI_DOUBLE, m_left, 0, m_comm, MPI_STATUS_IGNORE);
    MPI_Sendrecv(first.data(), m_fields, MPI_DOUBLE, m_left, 1, from_right.data(), m_fields,
                 MPI_DOUBLE, m_right, 1, m_comm, MPI_STATUS_IGNORE);
    for (int f = 0; f < m_fields; ++f) {
      at(m_u, f, 0) = from_left[f];
      at(m_u, f, m_local + 1) = from_right[f];
    }
  }

  int m_fields, m_grid, m_local, m_offset;
  MPI_Comm m_comm;
  int m_left = 0, m_right = 0;
  double m_dt = 0;
  std::vector<double> m_u, m_next;
};

/// Patch embedding, transformer blocks, head: [fields][patches][patch] ->
/// the same shape, with parameters, gradients and the saved activations.
template <class T>
class Model {
 public:
  using View1 = Kokkos::View<T*, Kokkos::LayoutRight, Space::memory_space>;
  using View2 = Kokkos::View<T**, Kokkos::LayoutRight, Space::memory_space>;
  using View3 = Kokkos::View<T***, Kokkos::LayoutRight, Space::memory_space>;
  using Block = kfa::nn::TransformerBlock<Space, T>;
  using Parameter = kfa::nn::Parameter<T, Space::memory_space>;

  Model(const Args& args, const kfa::RingCommunicator& ring)
      : m_patch(args.patch), m_d(args.heads * args.head_dim) {
    kfa::nn::TransformerBlockOptions options;
    options.attention.d_model = m_d;
    options.attention.heads = args.heads;
    options.attention.rotary = true;  // positions of the patches, global over the ranks
    options.attention.sequence_parallel.comm = &ring;
    options.d_ff = 2 * m_d;
    for (int l = 0; l < args.blocks; ++l) {
      options.init_seed = options.attention.init_seed = 100 + l;
      m_blocks.push_back(std::make_unique<Block>(options));
      m_contexts.emplace_back();
    }
    // Embedding U(-1/sqrt(patch), 1/sqrt(patch)); the head starts at zero.
    m_w_embed = View2("w_embed", m_d, m_patch);
    m_b_embed = View1("b_embed", m_d);
    m_w_head = View2("w_head", m_patch, m_d);
    m_b_head = View1("b_head", m_patch);
    m_dw_embed = View2("dw_embed", m_d, m_patch);
    m_db_embed = View1("db_embed", m_d);
    m_dw_head = View2("dw_head", m_patch, m_d);
    m_db_head = View1("db_head", m_patch);
    auto host = Kokkos::create_mirror_view(m_w_embed);
    std::mt19937_64 rng(7);
    std::uniform_real_distribution<double> uniform(-1 / std::sqrt(double(m_patch)),
                                                   1 / std::sqrt(double(m_patch)));
    for (std::size_t n = 0; n < host.size(); ++n) host.data()[n] = static_cast<T>(uniform(rng));
    Kokkos::deep_copy(m_w_embed, host);
  }

  /// Every parameter with its gradient, in the same order on every rank.
  std::vector<Parameter> parameters() const {
    auto flat = [](const auto& view) {
      return typename Parameter::view_type(view.data(), view.size());
    };
    std::vector<Parameter> list = {{"embed.weight", flat(m_w_embed), flat(m_dw_embed)},
                                   {"embed.bias", flat(m_b_embed), flat(m_db_embed)}};
    for (std::size_t l = 0; l < m_blocks.size(); ++l) {
      for (const auto& p : m_blocks[l]->parameters("blocks." + std::to_string(l) + "."))
        list.push_back(p);
    }
    list.push_back({"head.weight", flat(m_w_head), flat(m_dw_head)});
    list.push_back({"head.bias", flat(m_b_head), flat(m_db_head)});
    return list;
  }

  /// out = head(blocks(embed(x))); x, out [fields][patches][patch].
  void forward(const Space& space, const View3& x, const View3& out) {
    const int fields = int(x.extent(0)), patches = int(x.extent(1));
    m_x = x;
    m_h.resize(m_blocks.size() + 1);
    for (auto& h : m_h) {
      if (h.extent(0) != x.extent(0) || h.extent(1) != x.extent(1))
        h = View3("h", fields, patches, m_d);
    }
    kfa::nn::linear_forward(space, tokens(x), m_w_embed, m_b_embed, tokens(m_h[0]));
    for (std::size_t l = 0; l < m_blocks.size(); ++l)
      m_blocks[l]->forward(space, m_h[l], m_h[l + 1], m_contexts[l]);
    kfa::nn::linear_forward(space, tokens(m_h.back()), m_w_head, m_b_head, tokens(out));
  }

  /// Parameter gradients of the last forward for dL/d out (accumulated).
  void backward(const Space& space, const View3& d_out) {
    if (m_dh.extent(0) != m_x.extent(0) || m_dh.extent(1) != m_x.extent(1)) {
      m_dh = View3("dh", m_x.extent(0), m_x.extent(1), m_d);
      m_dh_next = View3("dh_next", m_x.extent(0), m_x.extent(1), m_d);
    }
    kfa::nn::linear_backward(space, tokens(m_h.back()), m_w_head, tokens(d_out), tokens(m_dh),
                             m_dw_head, m_db_head);
    for (std::size_t l = m_blocks.size(); l-- > 0;) {
      m_blocks[l]->backward(space, m_dh, m_dh_next, m_contexts[l]);
      std::swap(m_dh, m_dh_next);
    }
    // The input needs no gradient: an empty dx skips it.
    kfa::nn::linear_backward(space, tokens(m_x), m_w_embed, tokens(m_dh), View2(), m_dw_embed,
                             m_db_embed);
  }

 private:
  /// [fields][patches][features] as [fields·patches][features].
  static View2 tokens(const View3& v) {
    return View2(v.data(), v.extent(0) * v.extent(1), v.extent(2));
  }

  int m_patch, m_d;
  std::vector<std::unique_ptr<Block>> m_blocks;
  std::vector<typename Block::context_type> m_contexts;
  View2 m_w_embed, m_w_head, m_dw_embed, m_dw_head;
  View1 m_b_embed, m_b_head, m_db_embed, m_db_head;
  View3 m_x, m_dh, m_dh_next;
  std::vector<View3> m_h;
};

template <class T>
int run(const Args& args) {
  using View3 = typename Model<T>::View3;
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  const int patches = args.grid / args.patch, fields = args.batch;
  if (args.grid % args.patch != 0 || patches < ranks) {
    if (rank == 0)
      std::fprintf(stderr, "surrogate: --grid must be a multiple of --patch with at least one "
                           "patch per rank\n");
    return 2;
  }
  // This rank's patches: a contiguous run, as kfa::ring_local_seqlen splits them.
  const auto split = kfa::RingSharding::contiguous;
  const int local = int(kfa::ring_local_seqlen(patches, rank, ranks, split));
  int first = 0;
  for (int r = 0; r < rank; ++r) first += int(kfa::ring_local_seqlen(patches, r, ranks, split));

  Burgers sim(fields, args.grid, local * args.patch, first * args.patch, MPI_COMM_WORLD);
  // Field f restarts every kLife steps, the fields staggered.
  const int kLife = 64;
  auto restart_due = [&](int step, int f) {
    return step == 0 || (step + f * kLife / fields) % kLife == 0;
  };

  const kfa::RingCommunicator ring(MPI_COMM_WORLD);
  Model<T> model(args, ring);
  const auto parameters = model.parameters();
  const double kLrMax = 3e-3, kLrMin = 1e-4;
  kfa::nn::AdamWOptions adamw_options;
  adamw_options.lr = kLrMax;
  adamw_options.weight_decay = 0;
  kfa::nn::AdamW<Space, T> adamw(parameters, adamw_options);
  kfa::nn::GradientAllreduceOptions sum;
  sum.reduction = kfa::nn::GradientReduction::sum;

  View3 x("x", fields, local, args.patch), out("out", fields, local, args.patch),
      d_out("d_out", fields, local, args.patch);
  auto x_host = Kokkos::create_mirror_view(x);
  auto out_host = Kokkos::create_mirror_view(out);
  auto d_out_host = Kokkos::create_mirror_view(d_out);
  const double points = double(fields) * args.grid;
  const Space space;
  if (rank == 0) {
    std::printf("surrogate: Burgers, %d fields of %d points, %d patches of %d on %d rank(s), "
                "%d block(s) of d_model %d\n",
                fields, args.grid, patches, args.patch, ranks, args.blocks,
                args.heads * args.head_dim);
  }

  std::vector<double> losses;
  const auto start = std::chrono::steady_clock::now();
  for (int step = 0; step < args.repeat; ++step) {
    for (int f = 0; f < fields; ++f) {
      if (restart_due(step, f)) sim.restart(f, 1000003ull * std::uint64_t(step) + f);
    }
    for (int f = 0; f < fields; ++f)
      for (int t = 0; t < local; ++t)
        for (int j = 0; j < args.patch; ++j)
          x_host(f, t, j) = static_cast<T>(sim.value(f, t * args.patch + j));
    Kokkos::deep_copy(x, x_host);
    model.forward(space, x, out);
    sim.step();

    // Loss: mean over every point of every field of (x + out - u(t + Δt))²,
    // with "no change" (x itself) as the baseline; sums over the ranks.
    Kokkos::deep_copy(out_host, out);
    double sums[2] = {0, 0};
    for (int f = 0; f < fields; ++f)
      for (int t = 0; t < local; ++t)
        for (int j = 0; j < args.patch; ++j) {
          const double target = sim.value(f, t * args.patch + j), now = x_host(f, t, j);
          const double e = now + double(out_host(f, t, j)) - target;
          sums[0] += e * e;
          sums[1] += (now - target) * (now - target);
          d_out_host(f, t, j) = static_cast<T>(2 * e / points);
        }
    MPI_Allreduce(MPI_IN_PLACE, sums, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    const double loss = sums[0] / points, persistence = sums[1] / points;
    losses.push_back(loss);
    if (rank == 0)
      std::printf("step %4d  loss %.4e  (no-change baseline %.4e)\n", step, loss, persistence);

    Kokkos::deep_copy(d_out, d_out_host);
    // Cosine learning-rate decay: the late steps refine instead of jumping
    // after each field restart.
    adamw.options().lr =
        kLrMin + 0.5 * (kLrMax - kLrMin) * (1 + std::cos(M_PI * step / args.repeat));
    adamw.zero_grad(space);
    model.backward(space, d_out);
    // Each rank holds its tokens' part of the gradient: the sum is the model's.
    kfa::nn::allreduce_gradients(space, parameters, ring, sum);
    adamw.step(space);
  }
  space.fence();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const int tail = std::min<int>(10, int(losses.size()));
  double last = 0;
  for (int n = int(losses.size()) - tail; n < int(losses.size()); ++n) last += losses[n] / tail;
  const bool ok = last <= 0.1 * losses.front();
  if (rank == 0) {
    std::printf("%s: loss %.4e -> %.4e (mean of the last %d steps), %.1fx lower, %d steps in "
                "%.1f s on %d rank(s)\n",
                ok ? "ok" : "FAILED (the loss must fall tenfold)", losses.front(), last, tail,
                losses.front() / last, args.repeat, seconds, ranks);
  }
  return ok ? 0 : 1;
}

}  // namespace surrogate

int main(int argc, char* argv[]) {
  MPI_Init(&argc, &argv);
  int status = 0;
  {
    Kokkos::ScopeGuard guard(argc, argv);
    surrogate::Args defaults;
    defaults.batch = 4;
    defaults.heads = 4;
    defaults.head_dim = 8;
    defaults.repeat = 400;
    const auto args = kfa_example::parse_args(
        argc, argv, defaults, [](surrogate::Args& a, const std::string& s, auto&& next) {
          if (s == "--grid") a.grid = next();
          else if (s == "--patch") a.patch = next();
          else if (s == "--blocks") a.blocks = next();
          else return false;
          return true;
        });
    status = surrogate::run<double>(args);
  }
  MPI_Allreduce(MPI_IN_PLACE, &status, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return status;
}
