// kfa::Experimental::team_attention_forward / _backward called from a
// TeamPolicy kernel written here, one problem per team with its own nq, nk
// and head_dim (nk 0, 1, 7, 33, 128; nq != nk; head_dim 8, 17, 64), inputs
// as strided subviews of global buffers or staged in team scratch: against
// the fp64 oracle with the error rules of the other tests, over several
// team shapes; causal and windowed masks (rows that see no key: O = 0,
// lse = -inf, dQ = 0); bitwise agreement between team sizes; and the same
// problems through kfa's packed varlen entry points.

#include "kfa_test_helpers.hpp"

#include <kfa/team_attention.hpp>

#include <utility>

namespace kfa_test {
namespace {

using kfa::Experimental::TeamAttentionOptions;

template <class C>
class TeamAttention : public ::testing::Test {};
TYPED_TEST_SUITE(TeamAttention, AllConfigs);

struct Problem {
  int nq, nk, head_dim;
};

std::string to_string(const Problem& p) {
  return "nq=" + std::to_string(p.nq) + " nk=" + std::to_string(p.nk) +
         " head_dim=" + std::to_string(p.head_dim);
}

std::string to_string(const TeamAttentionOptions& o) {
  std::string r;
  if (o.causal) r += " causal";
  if (o.window_left >= 0 || o.window_right >= 0)
    r += " window=(" + std::to_string(o.window_left) + "," + std::to_string(o.window_right) + ")";
  if (o.softmax_scale != 0) r += " scale=" + std::to_string(o.softmax_scale);
  return r;
}

/// The same options for the oracle and the library's entry points.
kfa::AttentionOptions library_options(const TeamAttentionOptions& t) {
  kfa::AttentionOptions o;
  o.softmax_scale = t.softmax_scale;
  o.causal = t.causal;
  o.window_left = t.window_left;
  o.window_right = t.window_right;
  return o;
}

/// Threads per team and vector lanes per thread.
struct TeamShape {
  int team_size, vector_length;
};

/// The shapes each backend runs: one thread per team and several (OpenMP,
/// where the barriers synchronise real threads; on CUDA warps of lanes too).
template <class Space>
std::vector<TeamShape> team_shapes() {
#ifdef KOKKOS_ENABLE_CUDA
  if (std::is_same<Space, Kokkos::Cuda>::value) return {{1, 32}, {32, 4}, {128, 1}, {7, 8}};
#endif
#ifdef KOKKOS_ENABLE_OPENMP
  if (std::is_same<Space, Kokkos::OpenMP>::value && Kokkos::OpenMP().concurrency() > 1)
    return {{1, 1}, {2, 1}};
#endif
  return {{1, 1}};
}

/// Every tensor of one problem, [1][rows][1][head_dim] (lse [1][1][nq]).
struct ProblemData {
  Problem shape;
  Tensor q, k, v, d_o, o_ref, lse_ref;
};

template <class T>
std::vector<ProblemData> make_problems(const std::vector<Problem>& problems,
                                       const TeamAttentionOptions& opt, const std::string& tag) {
  std::vector<ProblemData> out;
  for (const Problem& p : problems) {
    ProblemData x{p,
                  Tensor({1, p.nq, 1, p.head_dim}),
                  Tensor({1, p.nk, 1, p.head_dim}),
                  Tensor({1, p.nk, 1, p.head_dim}),
                  Tensor({1, p.nq, 1, p.head_dim}),
                  Tensor(),
                  Tensor()};
    std::mt19937_64 rng(test_seed(tag + to_string(p)));
    for (Tensor* t : {&x.q, &x.k, &x.v, &x.d_o}) {
      fill_random(*t, rng);
      round_to<T>(*t);
    }
    reference_forward(x.q, x.k, x.v, library_options(opt), x.o_ref, x.lse_ref);
    out.push_back(std::move(x));
  }
  return out;
}

/// Outputs of one run, per problem, in the oracle's layouts.
struct TeamOutputs {
  std::vector<Tensor> o, lse, dq, dk, dv;
};

/// Where a problem's rows sit in the packed buffers.
struct Offsets {
  std::vector<int> q, k;
  int total_q = 0, total_k = 0, max_nq = 0, max_nk = 0, max_d = 0;
};

Offsets problem_offsets(const std::vector<ProblemData>& data) {
  Offsets f;
  for (const ProblemData& x : data) {
    f.q.push_back(f.total_q);
    f.k.push_back(f.total_k);
    f.total_q += x.shape.nq;
    f.total_k += x.shape.nk;
    f.max_nq = std::max(f.max_nq, x.shape.nq);
    f.max_nk = std::max(f.max_nk, x.shape.nk);
    f.max_d = std::max(f.max_d, x.shape.head_dim);
  }
  return f;
}

/// The caller's kernel: team p solves problem p. Its q, k, v, o, ... are
/// column ranges of [rows][max_d] buffers (LayoutStride subviews); with
/// `staged`, k and v are first copied into team scratch (LayoutRight).
template <class Space, class T, bool Backward>
struct TeamKernel {
  using acc_t = kfa::accumulator_t<T>;
  using mem = typename Space::memory_space;
  using View2 = Kokkos::View<T**, Kokkos::LayoutRight, mem>;
  using Lse1 = Kokkos::View<acc_t*, mem>;
  using member_t = typename Kokkos::TeamPolicy<Space>::member_type;
  using scratch_space = typename Space::scratch_memory_space;
  using ScratchAcc = Kokkos::View<acc_t*, scratch_space, Kokkos::MemoryUnmanaged>;
  using ScratchTile = Kokkos::View<T**, Kokkos::LayoutRight, scratch_space, Kokkos::MemoryUnmanaged>;

  Kokkos::View<int* [5], mem> m_problems;  // q0, nq, k0, nk, head_dim
  View2 m_q, m_k, m_v, m_o, m_do, m_dq, m_dk, m_dv;
  Lse1 m_lse;
  TeamAttentionOptions m_options;
  bool m_staged;
  int m_level;

  static std::size_t scratch_bytes(const Offsets& f, bool staged) {
    return kfa::Experimental::team_attention_scratch_bytes<T>(f.max_nq, f.max_nk) +
           (staged ? 2 * ScratchTile::shmem_size(f.max_nk, f.max_d) : 0);
  }

  KOKKOS_INLINE_FUNCTION void operator()(const member_t& team) const {
    const int p = team.league_rank();
    const int q0 = m_problems(p, 0), nq = m_problems(p, 1), k0 = m_problems(p, 2),
              nk = m_problems(p, 3), d = m_problems(p, 4);
    const Kokkos::pair<int, int> rows_q(q0, q0 + nq), rows_k(k0, k0 + nk), cols(0, d);
    const auto q = Kokkos::subview(m_q, rows_q, cols);
    const auto k = Kokkos::subview(m_k, rows_k, cols);
    const auto v = Kokkos::subview(m_v, rows_k, cols);
    const auto o = Kokkos::subview(m_o, rows_q, cols);
    const auto lse = Kokkos::subview(m_lse, rows_q);
    const ScratchAcc work(team.team_scratch(m_level),
                          kfa::Experimental::team_attention_scratch_size(nq, nk));
    if (m_staged) {
      const ScratchTile sK(team.team_scratch(m_level), nk, d),
          sV(team.team_scratch(m_level), nk, d);
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, nk), [&](const int j) {
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, d), [&](const int c) {
          sK(j, c) = k(j, c);
          sV(j, c) = v(j, c);
        });
      });
      // The staged k and v are visible to every thread.
      team.team_barrier();
      run(team, q, sK, sV, o, lse, work, rows_q, rows_k, cols);
    } else {
      run(team, q, k, v, o, lse, work, rows_q, rows_k, cols);
    }
  }

  template <class Q, class K, class V, class O, class L>
  KOKKOS_INLINE_FUNCTION void run(const member_t& team, const Q& q, const K& k, const V& v,
                                  const O& o, const L& lse, const ScratchAcc& work,
                                  Kokkos::pair<int, int> rows_q, Kokkos::pair<int, int> rows_k,
                                  Kokkos::pair<int, int> cols) const {
    if constexpr (Backward) {
      kfa::Experimental::team_attention_backward(
          team, q, k, v, o, lse, Kokkos::subview(m_do, rows_q, cols),
          Kokkos::subview(m_dq, rows_q, cols), Kokkos::subview(m_dk, rows_k, cols),
          Kokkos::subview(m_dv, rows_k, cols), work, m_options);
    } else {
      kfa::Experimental::team_attention_forward(team, q, k, v, o, lse, work, m_options);
    }
  }
};

template <class T, class Space>
Kokkos::View<T**, Kokkos::LayoutRight, typename Space::memory_space> pack_rows(
    const std::vector<ProblemData>& data, const std::vector<int>& offsets, int total, int max_d,
    Tensor ProblemData::*member, const std::string& label) {
  Kokkos::View<T**, Kokkos::LayoutRight, typename Space::memory_space> view(label, total, max_d);
  auto host = Kokkos::create_mirror_view(view);
  Kokkos::deep_copy(host, from_double<T>(std::numeric_limits<double>::quiet_NaN()));
  for (std::size_t p = 0; p < data.size(); ++p) {
    const Tensor& t = data[p].*member;
    for (int r = 0; r < t.ext[1]; ++r)
      for (int c = 0; c < t.ext[3]; ++c) host(offsets[p] + r, c) = from_double<T>(t.at(0, r, 0, c));
  }
  Kokkos::deep_copy(view, host);
  return view;
}

template <class ViewType>
Tensor unpack_rows(const ViewType& view, int begin, int rows, int d) {
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), view);
  Tensor t({1, rows, 1, d});
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < d; ++c) t.at(0, r, 0, c) = to_double(host(begin + r, c));
  return t;
}

/// Runs every problem through the caller's kernel (forward, then backward on
/// the forward's outputs) with one team shape.
template <class Space, class T>
TeamOutputs run_team(const std::vector<ProblemData>& data, const TeamAttentionOptions& opt,
                     TeamShape shape, bool staged) {
  using Fwd = TeamKernel<Space, T, false>;
  using Bwd = TeamKernel<Space, T, true>;
  const Offsets f = problem_offsets(data);
  const int n = static_cast<int>(data.size());
  Kokkos::View<int* [5], typename Space::memory_space> problems("problems", n);
  auto host = Kokkos::create_mirror_view(problems);
  for (int p = 0; p < n; ++p) {
    host(p, 0) = f.q[p];
    host(p, 1) = data[p].shape.nq;
    host(p, 2) = f.k[p];
    host(p, 3) = data[p].shape.nk;
    host(p, 4) = data[p].shape.head_dim;
  }
  Kokkos::deep_copy(problems, host);
  const int rows_q = std::max(f.total_q, 1), rows_k = std::max(f.total_k, 1);
  Fwd fwd{problems,
          pack_rows<T, Space>(data, f.q, rows_q, f.max_d, &ProblemData::q, "q"),
          pack_rows<T, Space>(data, f.k, rows_k, f.max_d, &ProblemData::k, "k"),
          pack_rows<T, Space>(data, f.k, rows_k, f.max_d, &ProblemData::v, "v"),
          typename Fwd::View2("o", rows_q, f.max_d),
          pack_rows<T, Space>(data, f.q, rows_q, f.max_d, &ProblemData::d_o, "d_o"),
          typename Fwd::View2("dq", rows_q, f.max_d),
          typename Fwd::View2("dk", rows_k, f.max_d),
          typename Fwd::View2("dv", rows_k, f.max_d),
          typename Fwd::Lse1("lse", rows_q),
          opt,
          staged,
          0};
  for (auto* view : {&fwd.m_o, &fwd.m_dq, &fwd.m_dk, &fwd.m_dv}) poison(*view);
  poison(fwd.m_lse);

  const std::size_t bytes = Fwd::scratch_bytes(f, staged);
  Kokkos::TeamPolicy<Space> policy(n, shape.team_size, shape.vector_length);
  // Level 0 while it fits (on CUDA: shared memory), else level 1.
  fwd.m_level = bytes <= static_cast<std::size_t>(policy.scratch_size_max(0)) ? 0 : 1;
  policy.set_scratch_size(fwd.m_level, Kokkos::PerTeam(bytes));
  Kokkos::parallel_for("kfa_test::team_attention_forward", policy, fwd);
  const Bwd bwd{fwd.m_problems, fwd.m_q, fwd.m_k,  fwd.m_v,   fwd.m_o,       fwd.m_do,
                fwd.m_dq,       fwd.m_dk, fwd.m_dv, fwd.m_lse, fwd.m_options, fwd.m_staged,
                fwd.m_level};
  Kokkos::parallel_for("kfa_test::team_attention_backward", policy, bwd);
  Space().fence();

  TeamOutputs out;
  auto lse_host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), fwd.m_lse);
  for (int p = 0; p < n; ++p) {
    const Problem& s = data[p].shape;
    out.o.push_back(unpack_rows(fwd.m_o, f.q[p], s.nq, s.head_dim));
    out.dq.push_back(unpack_rows(fwd.m_dq, f.q[p], s.nq, s.head_dim));
    out.dk.push_back(unpack_rows(fwd.m_dk, f.k[p], s.nk, s.head_dim));
    out.dv.push_back(unpack_rows(fwd.m_dv, f.k[p], s.nk, s.head_dim));
    Tensor lse({1, 1, s.nq});
    for (int i = 0; i < s.nq; ++i) lse.at(0, 0, i) = static_cast<double>(lse_host(f.q[p] + i));
    out.lse.push_back(lse);
  }
  return out;
}

/// The oracle's gradients of one problem and the plain same-precision
/// backward's (the baseline of the error rule).
struct Gradients {
  Tensor dq_ref, dk_ref, dv_ref, dq_plain, dk_plain, dv_plain;
  double magnitude;
};

template <class T>
Gradients reference_gradients(const ProblemData& x, const kfa::AttentionOptions& opt) {
  Gradients g;
  reference_backward<double, true>(x.q, x.k, x.v, x.o_ref, x.lse_ref, x.d_o, opt, g.dq_ref,
                                   g.dk_ref, g.dv_ref);
  Tensor o_t = x.o_ref;
  round_to<T>(o_t);
  reference_backward<T>(x.q, x.k, x.v, o_t, x.lse_ref, x.d_o, opt, g.dq_plain, g.dk_plain,
                        g.dv_plain);
  g.magnitude = gradient_magnitude(x.q, x.k, x.v, x.d_o, opt);
  return g;
}

/// Every problem through the caller's kernel with every team shape of the
/// backend (k and v in global memory and staged in scratch), against the
/// oracle.
template <class C>
void check_team(const std::vector<Problem>& problems, const TeamAttentionOptions& opt,
                const std::string& tag) {
  using Space = typename C::space;
  using T = typename C::value_type;
  const std::vector<ProblemData> data = make_problems<T>(problems, opt, tag);
  const kfa::AttentionOptions lib = library_options(opt);
  std::vector<Gradients> grads;
  std::vector<ForwardMagnitudes> mags;
  for (const ProblemData& x : data) {
    grads.push_back(reference_gradients<T>(x, lib));
    ForwardMagnitudes f = forward_magnitudes(x.q, x.k, x.v, lib, x.shape.nk);
    add_plain_forward<T>(f, x.q, x.k, x.v, lib, x.o_ref, x.lse_ref);
    mags.push_back(f);
  }
  for (const TeamShape shape : team_shapes<Space>())
    for (const bool staged : {false, true}) {
      const TeamOutputs got = run_team<Space, T>(data, opt, shape, staged);
      for (std::size_t p = 0; p < data.size(); ++p) {
        const ProblemData& x = data[p];
        const std::string what =
            tag + " " + type_name<T>() + " " + Space::name() + " team " +
            std::to_string(shape.team_size) + "x" + std::to_string(shape.vector_length) +
            (staged ? " k, v in scratch " : " ") + to_string(x.shape) + to_string(opt) +
            " seed " + std::to_string(test_seed(tag + to_string(x.shape)));
        expect_forward_close<T>(what, got.o[p], got.lse[p], x.o_ref, x.lse_ref, mags[p]);
        const Gradients& g = grads[p];
        expect_close<T>(what, "dq", got.dq[p], g.dq_plain, g.dq_ref, g.magnitude);
        expect_close<T>(what, "dk", got.dk[p], g.dk_plain, g.dk_ref, g.magnitude);
        expect_close<T>(what, "dv", got.dv[p], g.dv_plain, g.dv_ref);
      }
    }
}

/// Awkward sizes side by side in one launch: one key, odd lengths, more
/// queries than keys and the reverse, the largest neighbourhoods, and empty
/// problems (no keys: every row sees none; no queries: dk = dv = 0).
const std::vector<Problem> kMixedProblems{{1, 1, 8},    {7, 7, 17},  {3, 33, 64}, {33, 7, 8},
                                          {16, 128, 17}, {128, 128, 64}, {4, 0, 8}, {0, 5, 17}};

TYPED_TEST(TeamAttention, MixedProblemsMatchOracle) {
  if (is_duplicate_config<TypeParam>()) GTEST_SKIP() << "half is float here";
  check_team<TypeParam>(kMixedProblems, {}, "team");
  TeamAttentionOptions scaled;
  scaled.softmax_scale = 0.7;
  check_team<TypeParam>({{9, 33, 17}, {33, 9, 8}}, scaled, "team-scale");
}

// Bottom-right causal masks: with nq > nk the first nq - nk rows see no key.
TYPED_TEST(TeamAttention, CausalAndWindowMatchOracle) {
  if (is_duplicate_config<TypeParam>()) GTEST_SKIP() << "half is float here";
  TeamAttentionOptions causal;
  causal.causal = true;
  check_team<TypeParam>({{7, 3, 8}, {33, 33, 17}, {5, 128, 64}, {128, 33, 8}}, causal,
                        "team-causal");
  TeamAttentionOptions window;
  window.window_left = 3;
  window.window_right = 1;
  check_team<TypeParam>({{9, 33, 17}, {33, 7, 8}}, window, "team-window");
}

// Rows that see no key, stated without the oracle: O = 0, lse = -inf,
// dQ = 0 exactly, and they add nothing to dK and dV.
TYPED_TEST(TeamAttention, RowsThatSeeNoKey) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  if (is_duplicate_config<TypeParam>()) GTEST_SKIP() << "half is float here";
  TeamAttentionOptions causal;
  causal.causal = true;
  const Problem shape{7, 3, 17};  // offset -4: rows 0..3 see no key
  const std::vector<ProblemData> data = make_problems<T>({shape}, causal, "team-empty-rows");
  for (const TeamShape ts : team_shapes<Space>()) {
    const TeamOutputs got = run_team<Space, T>(data, causal, ts, false);
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(got.lse[0].at(0, 0, i), -INFINITY) << "row " << i;
      for (int d = 0; d < shape.head_dim; ++d) {
        EXPECT_EQ(got.o[0].at(0, i, 0, d), 0.0) << "O row " << i;
        EXPECT_EQ(got.dq[0].at(0, i, 0, d), 0.0) << "dQ row " << i;
      }
    }
    // Row 4 sees key 0 only: its O is v_0 and its lse the one score.
    for (int d = 0; d < shape.head_dim; ++d)
      EXPECT_NEAR(got.o[0].at(0, 4, 0, d), data[0].v.at(0, 0, 0, d),
                  4 * epsilon<T>() * std::max(1.0, std::abs(data[0].v.at(0, 0, 0, d))));
    EXPECT_TRUE(std::isfinite(got.lse[0].at(0, 0, 4)));
  }
}

// Each output element is one lane's sum in a fixed order: team sizes give
// the same bits (with one vector lane per thread on the host backends).
TYPED_TEST(TeamAttention, TeamSizesGiveSameBits) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  if (is_duplicate_config<TypeParam>()) GTEST_SKIP() << "half is float here";
  const std::vector<TeamShape> shapes = team_shapes<Space>();
  if (shapes.size() < 2) GTEST_SKIP() << Space::name() << " runs one team shape";
  TeamAttentionOptions causal;
  causal.causal = true;
  const std::vector<ProblemData> data = make_problems<T>(kMixedProblems, causal, "team-bits");
  const int lanes = shapes[0].vector_length;
  const TeamOutputs first = run_team<Space, T>(data, causal, shapes[0], false);
  for (std::size_t s = 1; s < shapes.size(); ++s) {
    if (shapes[s].vector_length != lanes) continue;
    const TeamOutputs other = run_team<Space, T>(data, causal, shapes[s], true);
    for (std::size_t p = 0; p < data.size(); ++p) {
      const std::string what = to_string(data[p].shape) + " team size " +
                               std::to_string(shapes[s].team_size);
      EXPECT_EQ(other.o[p].data, first.o[p].data) << what << ": O";
      EXPECT_EQ(other.dq[p].data, first.dq[p].data) << what << ": dQ";
      EXPECT_EQ(other.dk[p].data, first.dk[p].data) << what << ": dK";
      EXPECT_EQ(other.dv[p].data, first.dv[p].data) << what << ": dV";
      for (int i = 0; i < data[p].shape.nq; ++i) {
        const double a = other.lse[p].at(0, 0, i), b = first.lse[p].at(0, 0, i);
        EXPECT_TRUE(a == b) << what << ": lse row " << i << " " << a << " vs " << b;
      }
    }
  }
}

// The same problems as one packed batch through kfa's varlen entry points
// (one head dim per batch): both within their error bounds of the oracle,
// hence of each other.
template <class C>
void check_against_varlen(const std::vector<Problem>& problems, const TeamAttentionOptions& opt,
                          const std::string& tag) {
  using Space = typename C::space;
  using T = typename C::value_type;
  using Acc = kfa::accumulator_t<T>;
  const std::vector<ProblemData> data = make_problems<T>(problems, opt, tag);
  const kfa::AttentionOptions lib = library_options(opt);
  const Offsets f = problem_offsets(data);
  const int d = problems[0].head_dim;
  std::vector<int> len_q, len_k;
  Tensor q({f.total_q, 1, d}), k({f.total_k, 1, d}), v({f.total_k, 1, d}),
      d_o({f.total_q, 1, d});
  for (std::size_t p = 0; p < data.size(); ++p) {
    len_q.push_back(data[p].shape.nq);
    len_k.push_back(data[p].shape.nk);
    put_rows(q, data[p].q, f.q[p]);
    put_rows(k, data[p].k, f.k[p]);
    put_rows(v, data[p].v, f.k[p]);
    put_rows(d_o, data[p].d_o, f.q[p]);
  }
  auto q_d = to_device3<T, Space>(q, "q");
  auto k_d = to_device3<T, Space>(k, "k");
  auto v_d = to_device3<T, Space>(v, "v");
  auto do_d = to_device3<T, Space>(d_o, "d_o");
  auto cu_q = offsets_to_device<Space>(offsets_of(len_q), "cu_seqlens_q");
  auto cu_k = offsets_to_device<Space>(offsets_of(len_k), "cu_seqlens_k");
  DeviceView3<T, Space> o("o", f.total_q, 1, d), dq("dq", f.total_q, 1, d),
      dk("dk", f.total_k, 1, d), dv("dv", f.total_k, 1, d);
  DeviceView2<Acc, Space> lse("lse", 1, f.total_q);
  for (auto* view : {&o, &dq, &dk, &dv}) poison(*view);
  poison(lse);
  kfa::flash_attention_varlen_forward(Space(), q_d, k_d, v_d, cu_q, cu_k, f.max_nq, f.max_nk, o,
                                      lse, lib);
  kfa::flash_attention_varlen_backward(Space(), q_d, k_d, v_d, cu_q, cu_k, f.max_nq, f.max_nk, o,
                                       lse, do_d, dq, dk, dv, lib);
  Space().fence();
  const Tensor o_h = to_host(o), lse_h = to_host(lse), dq_h = to_host(dq), dk_h = to_host(dk),
               dv_h = to_host(dv);

  const std::vector<TeamShape> shapes = team_shapes<Space>();
  const TeamOutputs team = run_team<Space, T>(data, opt, shapes.back(), false);
  for (std::size_t p = 0; p < data.size(); ++p) {
    const ProblemData& x = data[p];
    const Problem& s = x.shape;
    const std::string what = tag + " " + type_name<T>() + " " + Space::name() + " " +
                             to_string(s) + to_string(opt);
    // The varlen outputs of problem p in the oracle's layouts.
    Tensor o_v({1, s.nq, 1, d}), dq_v({1, s.nq, 1, d}), dk_v({1, s.nk, 1, d}),
        dv_v({1, s.nk, 1, d}), lse_v({1, 1, s.nq});
    for (int i = 0; i < s.nq; ++i) {
      lse_v.at(0, 0, i) = lse_h.data[f.q[p] + i];
      for (int c = 0; c < d; ++c) {
        o_v.at(0, i, 0, c) = o_h.at(f.q[p] + i, 0, c);
        dq_v.at(0, i, 0, c) = dq_h.at(f.q[p] + i, 0, c);
      }
    }
    for (int j = 0; j < s.nk; ++j)
      for (int c = 0; c < d; ++c) {
        dk_v.at(0, j, 0, c) = dk_h.at(f.k[p] + j, 0, c);
        dv_v.at(0, j, 0, c) = dv_h.at(f.k[p] + j, 0, c);
      }
    ForwardMagnitudes m = forward_magnitudes(x.q, x.k, x.v, lib, s.nk);
    const double bound_o = 2 * forward_o_bound<T>(m, max_abs(x.o_ref));
    const double bound_lse = 2 * forward_lse_bound<T>(m, max_abs(x.lse_ref));
    EXPECT_LE(max_abs_diff(team.o[p], o_v), bound_o) << what << ": O, team vs varlen";
    EXPECT_LE(max_abs_diff(team.lse[p], lse_v), bound_lse) << what << ": lse, team vs varlen";
    const Gradients g = reference_gradients<T>(x, lib);
    struct {
      const char* name;
      const Tensor &team, &varlen, &plain, &ref;
      double magnitude;
    } grads[] = {{"dq", team.dq[p], dq_v, g.dq_plain, g.dq_ref, g.magnitude},
                 {"dk", team.dk[p], dk_v, g.dk_plain, g.dk_ref, g.magnitude},
                 {"dv", team.dv[p], dv_v, g.dv_plain, g.dv_ref, -1}};
    for (const auto& e : grads) {
      const double bound =
          2 * allowed_error<T>(max_abs_diff(e.plain, e.ref),
                               std::max(e.magnitude, max_abs(e.ref)));
      EXPECT_LE(max_abs_diff(e.team, e.varlen), bound)
          << what << ": " << e.name << ", team vs varlen";
    }
  }
}

TYPED_TEST(TeamAttention, MatchesPackedVarlen) {
  if (is_duplicate_config<TypeParam>()) GTEST_SKIP() << "half is float here";
  const std::vector<Problem> d17{{1, 1, 17}, {7, 7, 17}, {33, 9, 17}, {5, 128, 17}, {0, 4, 17}};
  check_against_varlen<TypeParam>(d17, {}, "team-varlen");
  TeamAttentionOptions causal;
  causal.causal = true;
  check_against_varlen<TypeParam>({{32, 32, 64}, {40, 33, 64}, {3, 8, 64}}, causal,
                                  "team-varlen-causal");
}

}  // namespace
}  // namespace kfa_test
