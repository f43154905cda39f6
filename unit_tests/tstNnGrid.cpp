// Grids (kfa/nn/grid.hpp): axial rotary embeddings against a direct fp64 host
// formula, their backward by the adjoint identity and finite differences;
// grid neighbourhood attention, forward and backward, through the flash and
// the materialised entry points against the fp64 oracle of masked attention
// on awkward grids; its block predicate against every pair of runs of small
// grids; argument errors.

#include "nn_test_helpers.hpp"

#include <algorithm>
#include <array>

namespace {

using namespace kfa_test;

template <class C>
class NnGrid : public ::testing::Test {};
TYPED_TEST_SUITE(NnGrid, NnConfigs);

double dot(const Tensor& a, const Tensor& b) {
  LD s = 0;
  for (std::size_t n = 0; n < a.data.size(); ++n) s += LD(a.data[n]) * b.data[n];
  return double(s);
}

kfa::nn::AxialRotaryOptions axial(int axes, std::array<int, 3> extent, kfa::nn::RotaryStyle style,
                                  int rotary_dim, std::array<int, 3> offset,
                                  std::array<double, 3> scale) {
  kfa::nn::AxialRotaryOptions o;
  o.axes = axes;
  o.style = style;
  o.rotary_dim = rotary_dim;
  for (int a = 0; a < 3; ++a) {
    o.extent[a] = extent[a];
    o.offset[a] = offset[a];
    o.scale[a] = scale[a];
  }
  return o;
}

std::string describe(const kfa::nn::AxialRotaryOptions& o) {
  std::string s = "axes " + std::to_string(o.axes) + " extent";
  for (int a = 0; a < o.axes; ++a) s += " " + std::to_string(o.extent[a]);
  s += " offset";
  for (int a = 0; a < o.axes; ++a) s += " " + std::to_string(o.offset[a]);
  return s + " style " + std::to_string(int(o.style)) + " rotary_dim " +
         std::to_string(o.rotary_dim);
}

/// The kernels' rotation of t (sign -1: the backward), into a poisoned View
/// or in place.
template <class T, class Space>
Tensor device_axial(const Tensor& t, const kfa::nn::AxialRotaryOptions& opt, int sign,
                    bool in_place) {
  auto in = make_view<DeviceView4<T, Space>>(t, "in");
  auto out = in_place ? in : DeviceView4<T, Space>("out", t.ext[0], t.ext[1], t.ext[2], t.ext[3]);
  if (!in_place) poison(out);
  if (sign > 0) {
    kfa::nn::axial_rotary_forward(Space(), in, out, opt);
  } else {
    kfa::nn::axial_rotary_backward(Space(), in, out, opt);
  }
  Space().fence();
  return to_host(out);
}

TYPED_TEST(NnGrid, AxialRotaryForwardBackwardAndAdjoint) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  using kfa::nn::RotaryStyle;
  const int B = 2, H = 3, D = 24;
  const std::vector<kfa::nn::AxialRotaryOptions> cases = {
      axial(2, {5, 7, 1}, RotaryStyle::half_split, 0, {0, 0, 0}, {1, 1, 1}),
      axial(2, {5, 7, 1}, RotaryStyle::interleaved, 16, {3, -40, 0}, {1, 0.5, 1}),
      axial(3, {3, 4, 5}, RotaryStyle::half_split, 12, {100, 0, 7}, {1, 1, 2}),
      axial(3, {3, 4, 5}, RotaryStyle::interleaved, 0, {0, 1000, 0}, {1, 1, 1}),
      axial(2, {1, 6, 1}, RotaryStyle::half_split, 20, {0, 5, 0}, {1, 1, 1})};
  for (const auto& opt : cases) {
    int S = 1;
    double max_angle = 0;
    for (int a = 0; a < opt.axes; ++a) {
      S *= opt.extent[a];
      max_angle =
          std::max(max_angle, std::abs(opt.scale[a]) * (std::abs(opt.offset[a]) + opt.extent[a]));
    }
    const std::string tag = "nn_axial_rotary " + describe(opt);
    std::mt19937_64 rng(test_seed(tag));
    const Tensor x = rounded<T>(random_tensor({B, S, H, D}, rng));
    const Tensor dy = rounded<T>(random_tensor({B, S, H, D}, rng));
    const Tensor y = device_axial<T, Space>(x, opt, 1, false);
    const Tensor dx = device_axial<T, Space>(dy, opt, -1, false);
    const std::string what = tag + " " + type_name<T>() + " " + Space::name() + " seed " +
                             std::to_string(test_seed(tag));
    // The angles are rounded to fp64 relative to their size.
    const double factor = 8 + 2 * max_angle * std::numeric_limits<double>::epsilon() / epsilon<T>();
    const Tensor y_ref = ref_axial_rotary(x, opt, 1), dx_ref = ref_axial_rotary(dy, opt, -1);
    expect_close_rel<T>(what + " y", y, y_ref, factor);
    expect_close_rel<T>(what + " y in place", device_axial<T, Space>(x, opt, 1, true), y_ref,
                        factor);
    expect_close_rel<T>(what + " dx", dx, dx_ref, factor);
    expect_close_rel<T>(what + " dx in place", device_axial<T, Space>(dy, opt, -1, true), dx_ref,
                        factor);
    // The backward is the transpose of the forward: <R x, dy> = <x, Rᵀ dy>,
    // on the kernels' own results (|error| <= |R x - y|·|dy| + |x|·|Rᵀ dy - dx|).
    const double norms = std::sqrt(dot(x, x) * dot(dy, dy));
    EXPECT_NEAR(dot(y, dy), dot(x, dx), 4 * factor * epsilon<T>() * norms) << what;
  }
}

// With one axis it is the 1D rotary embedding at position_offset = offset[0].
TYPED_TEST(NnGrid, AxialRotaryOneAxisIsRotary) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  const int B = 2, S = 37, H = 2, D = 16;
  for (auto style : {kfa::nn::RotaryStyle::half_split, kfa::nn::RotaryStyle::interleaved}) {
    const auto opt = axial(1, {S, 1, 1}, style, 12, {250, 0, 0}, {1, 1, 1});
    kfa::nn::RotaryOptions one;
    one.style = style;
    one.rotary_dim = 12;
    one.position_offset = 250;
    std::mt19937_64 rng(test_seed("nn_axial_rotary_1d"));
    auto xv = make_view<DeviceView4<T, Space>>(rounded<T>(random_tensor({B, S, H, D}, rng)), "x");
    DeviceView4<T, Space> y_axial("y_axial", B, S, H, D), y_rotary("y_rotary", B, S, H, D);
    poison(y_axial);
    kfa::nn::axial_rotary_forward(Space(), xv, y_axial, opt);
    kfa::nn::rotary_forward(Space(), xv, y_rotary, one);
    Space().fence();
    EXPECT_EQ(max_abs_diff(to_host(y_axial), to_host(y_rotary)), 0.0)
        << "style " << int(style) << " " << type_name<T>() << " " << Space::name();
  }
}

// The backward is the derivative of the forward: central differences of
// L(x) = <forward(x), w> along random directions u against <backward(w), u>.
TYPED_TEST(NnGrid, AxialRotaryFiniteDifferences) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  if (!std::is_same<T, double>::value) GTEST_SKIP() << "finite differences in fp64";
  const int B = 1, S = 60, H = 2, D = 12;
  const auto opt =
      axial(3, {3, 4, 5}, kfa::nn::RotaryStyle::half_split, 0, {2, -3, 11}, {1, 0.75, 1});
  const std::string tag = "nn_axial_rotary_fd";
  std::mt19937_64 rng(test_seed(tag));
  const Tensor x = random_tensor({B, S, H, D}, rng), w = random_tensor({B, S, H, D}, rng);
  const Tensor g = device_axial<T, Space>(w, opt, -1, false);
  const auto loss = [&](const Tensor& at) {
    return dot(device_axial<T, Space>(at, opt, 1, false), w);
  };
  const double h = 1e-3;
  for (int trial = 0; trial < 4; ++trial) {
    const Tensor u = random_tensor({B, S, H, D}, rng);
    Tensor plus = x, minus = x;
    for (std::size_t n = 0; n < x.data.size(); ++n) {
      plus.data[n] += h * u.data[n];
      minus.data[n] -= h * u.data[n];
    }
    const double fd = (loss(plus) - loss(minus)) / (2 * h);
    EXPECT_NEAR(fd, dot(g, u), 1e-9 * std::sqrt(dot(w, w) * dot(u, u)))
        << tag << " trial " << trial << " seed " << test_seed(tag);
  }
}

TYPED_TEST(NnGrid, AxialRotaryBadArgumentsThrowAndWriteNothing) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  using kfa::nn::RotaryStyle;
  DeviceView4<T, Space> x("x", 1, 36, 2, 8), y("y", 1, 36, 2, 8);
  Kokkos::deep_copy(y, T(7));
  const auto refused = [&](int axes, std::array<int, 3> extent, RotaryStyle style, int rotary_dim,
                           double scale1, const std::string& message) {
    const auto opt = axial(axes, extent, style, rotary_dim, {}, {1, scale1, 1});
    expect_invalid_argument([&] { kfa::nn::axial_rotary_forward(Space(), x, y, opt); }, message);
  };
  refused(2, {5, 7, 1}, RotaryStyle::half_split, 0, 1,
          "kfa::nn::axial_rotary_forward: x [batch][seqlen][heads][head_dim] = [1][36][2][8] has "
          "seqlen 36, but options.extent = [5][7] holds 35 grid points");
  expect_invalid_argument(
      [&] {
        kfa::nn::axial_rotary_backward(
            Space(), x, y, axial(3, {3, 4, 2}, RotaryStyle::half_split, 0, {}, {1, 1, 1}));
      },
      "kfa::nn::axial_rotary_backward: dy [batch][seqlen][heads][head_dim] = [1][36][2][8] has "
      "seqlen 36, but options.extent = [3][4][2] holds 24 grid points");
  // head_dim 8 over 3 axes, and 6 features over 2 axes (3 each): no even shares.
  refused(3, {3, 4, 3}, RotaryStyle::half_split, 0, 1,
          "options.rotary_dim (0: head_dim) must be in 0..head_dim = 8 and split into options.axes "
          "= 3 even shares (a multiple of 6: every axis rotates pairs of features), got 0 "
          "(head_dim 8)");
  refused(2, {6, 6, 1}, RotaryStyle::interleaved, 6, 1,
          "split into options.axes = 2 even shares (a multiple of 4: every axis rotates pairs of "
          "features), got 6");
  refused(2, {6, 6, 1}, RotaryStyle::interleaved, 12, 1,
          "options.rotary_dim (0: head_dim) must be in 0..head_dim = 8");
  refused(4, {6, 6, 1}, RotaryStyle::half_split, 0, 1, "options.axes must be 1, 2 or 3, got 4");
  refused(2, {-6, -6, 1}, RotaryStyle::half_split, 0, 1,
          "options.extent[0] must be >= 0, got options.extent = [-6][-6]");
  refused(2, {6, 6, 1}, RotaryStyle::half_split, 0, NAN,
          "options.base must be finite and > 0 and options.scale finite");
  expect_invalid_argument(
      [&] {
        DeviceView4<T, Space> z("z", 1, 37, 2, 8);
        kfa::nn::axial_rotary_forward(
            Space(), DeviceView4<T, Space>(z.data(), 1, 36, 2, 8),
            DeviceView4<T, Space>(z.data() + 1, 1, 36, 2, 8),
            axial(2, {6, 6, 1}, RotaryStyle::half_split, 0, {}, {1, 1, 1}));
      },
      "y must be x itself or not overlap it");
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), y);
  for (std::size_t n = 0; n < host.size(); ++n) ASSERT_EQ(host.data()[n], T(7)) << "y written";
}

// ---------------------------------------------------------------------------
// Grid neighbourhood attention.

/// The neighbourhood mask written from its definition: NATTEN's window start
/// in its piecewise form (0 near the start, n - K near the end, c - r
/// between; the whole axis when K = 2r + 1 > n).
struct RefGrid {
  int axes;
  int extent[3], radius[3];
  bool shifted;

  int points() const {
    int n = 1;
    for (int a = 0; a < axes; ++a) n *= extent[a];
    return n;
  }

  bool sees(int i, int j) const {
    const auto ci = ref_coordinates(i, axes, extent), cj = ref_coordinates(j, axes, extent);
    for (int a = 0; a < axes; ++a) {
      const int n = extent[a], r = radius[a], k = 2 * r + 1;
      if (!shifted) {
        if (std::abs(ci[a] - cj[a]) > r) return false;
        continue;
      }
      if (k >= n) continue;  // the whole axis
      const int start = ci[a] < r ? 0 : (ci[a] + r >= n ? n - k : ci[a] - r);
      if (cj[a] < start || cj[a] >= start + k) return false;
    }
    return true;
  }

  kfa::nn::GridNeighbourhood modifier() const {
    kfa::nn::GridNeighbourhoodOptions o;
    o.axes = axes;
    for (int a = 0; a < 3; ++a) {
      o.extent[a] = extent[a];
      o.radius[a] = radius[a];
    }
    o.window = shifted ? kfa::nn::GridWindow::border_shifted : kfa::nn::GridWindow::centred;
    return kfa::nn::GridNeighbourhood(o);
  }

  std::string name() const {
    std::string s = shifted ? "shifted" : "centred";
    for (int a = 0; a < axes; ++a) s += (a ? "x" : " ") + std::to_string(extent[a]);
    s += " radius";
    for (int a = 0; a < axes; ++a) s += " " + std::to_string(radius[a]);
    return s;
  }

  RefExtras extras() const {
    RefExtras x;
    const RefGrid grid = *this;
    x.mod = [grid](int, int, int i, int j, double s, int, int) {
      return grid.sees(i, j) ? s : -double(INFINITY);
    };
    return x;
  }
};

template <class C>
void check_grid_attention(const RefGrid& grid, const Shape& shape_in, kfa::AttentionOptions opt,
                          const std::string& tag) {
  Shape s = shape_in;
  s.seqlen_q = s.seqlen_k = grid.points();
  check_variant<C>(s, opt, tag + " " + grid.name(), grid.modifier(), grid.extras());
}

TYPED_TEST(NnGrid, NeighbourhoodAttention2D) {
  for (const bool shifted : {false, true}) {
    const RefGrid grid{2, {5, 7, 1}, {1, 2, 0}, shifted};
    check_grid_attention<TypeParam>(grid, Shape{2, 0, 0, 4, 16, 2}, {}, "grid2d");
    // The window hint gives the same result.
    kfa::AttentionOptions opt;
    opt.window_left = opt.window_right = grid.modifier().flat_window();
    check_grid_attention<TypeParam>(grid, Shape{2, 0, 0, 4, 16, 2}, opt, "grid2d-window");
  }
  // Radius 0: every query sees itself only; radius past the grid: all keys.
  check_grid_attention<TypeParam>({2, {5, 7, 1}, {0, 0, 0}, false}, Shape{2, 0, 0, 2, 16}, {},
                                  "grid2d-r0");
  check_grid_attention<TypeParam>({2, {5, 7, 1}, {9, 9, 0}, true}, Shape{1, 0, 0, 2, 16}, {},
                                  "grid2d-all");
  check_grid_attention<TypeParam>({2, {5, 7, 1}, {0, 8, 0}, false}, Shape{1, 0, 0, 3, 20, 1}, {},
                                  "grid2d-rows");
}

TYPED_TEST(NnGrid, NeighbourhoodAttention3D) {
  check_grid_attention<TypeParam>({3, {3, 4, 5}, {1, 0, 2}, false}, Shape{2, 0, 0, 4, 12, 2}, {},
                                  "grid3d");
  check_grid_attention<TypeParam>({3, {3, 4, 5}, {1, 1, 1}, true}, Shape{2, 0, 0, 2, 12}, {},
                                  "grid3d");
  kfa::AttentionOptions causal;
  causal.causal = true;
  check_grid_attention<TypeParam>({3, {3, 4, 5}, {0, 2, 1}, true}, Shape{1, 0, 0, 2, 8}, causal,
                                  "grid3d-causal");
  check_grid_attention<TypeParam>({1, {37, 1, 1}, {3, 0, 0}, true}, Shape{1, 0, 0, 2, 8}, {},
                                  "grid1d");
}

// Grids of hundreds of points, where the kernels skip most tiles, on the
// default kernels and (OpenMP) on both the host and the portable kernels.
TYPED_TEST(NnGrid, NeighbourhoodAttentionSkipsTiles) {
  using Space = typename TypeParam::space;
  const RefGrid grids[] = {{2, {24, 20, 1}, {2, 3, 0}, false}, {3, {6, 8, 10}, {1, 1, 2}, true}};
  for (const RefGrid& grid : grids) {
    const int n = grid.points();
    // Rows at the start never see keys at the end: the predicate can skip.
    EXPECT_FALSE(grid.modifier().visible(0, 0, 0, 64, n - 64, n)) << grid.name();
    check_grid_attention<TypeParam>(grid, Shape{1, 0, 0, 2, 16}, {}, "grid-skip");
#ifdef KOKKOS_ENABLE_OPENMP
    if (std::is_same<Space, Kokkos::OpenMP>::value) {  // else the portable kernels' teams
      const PinTeamSize host_kernels(0);
      check_grid_attention<TypeParam>(grid, Shape{1, 0, 0, 2, 16}, {}, "grid-skip-host");
    }
#endif
  }
}

// A packed batch of grids: positions count from each sequence's start.
TYPED_TEST(NnGrid, NeighbourhoodAttentionPackedBatch) {
  const RefGrid grid{3, {3, 4, 5}, {1, 2, 1}, true};
  const int n = grid.points();
  check_varlen<TypeParam>(VarlenShape{{n, n, n}, {n, n, n}, 4, 2, 12}, {}, "grid-varlen",
                          grid.modifier(), grid.extras());
}

// A sequence that is not the grid gets NaN scores, not a wrong mask.
TYPED_TEST(NnGrid, NeighbourhoodWrongLengthGivesNaN) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  using Acc = kfa::accumulator_t<T>;
  const auto mod = RefGrid{2, {5, 7, 1}, {1, 1, 0}, false}.modifier();
  DeviceView4<T, Space> q("q", 1, 36, 2, 8), o("o", 1, 36, 2, 8), dq("dq", 1, 36, 2, 8),
      dk("dk", 1, 36, 2, 8), dv("dv", 1, 36, 2, 8);
  DeviceView3<Acc, Space> lse("lse", 1, 2, 36);
  Kokkos::deep_copy(q, T(1));
  kfa::flash_attention_forward(Space(), q, q, q, o, lse, kfa::AttentionOptions{}, mod);
  kfa::flash_attention_backward(Space(), q, q, q, o, lse, q, dq, dk, dv, kfa::AttentionOptions{},
                                mod);
  for (const auto& t : {to_host(o), to_host(lse), to_host(dq), to_host(dk), to_host(dv)})
    for (double x : t.data) ASSERT_TRUE(std::isnan(x));
}

// Through the layers, whose check knows the lengths: a grid of another size
// is refused with nothing written; a neighbourhood past the grid changes
// nothing.
TYPED_TEST(NnGrid, NeighbourhoodThroughTheLayer) {
  using Space = typename TypeParam::space;
  using T = typename TypeParam::value_type;
  using Layer = kfa::nn::MultiHeadAttention<Space, T>;
  kfa::nn::MultiHeadAttentionOptions options;
  options.d_model = 16;
  options.heads = 2;
  const Layer layer(options);
  typename Layer::context_type context;
  std::mt19937_64 rng(test_seed("grid-layer"));
  auto x = make_view<DeviceView3<T, Space>>(rounded<T>(random_tensor({2, 36, 16}, rng)), "x");
  DeviceView3<T, Space> y("y", 2, 36, 16), y_plain("y_plain", 2, 36, 16);
  Kokkos::deep_copy(y, T(7));
  expect_invalid_argument(
      [&] {
        layer.forward(Space(), x, y, context, RefGrid{2, {5, 7, 1}, {1, 1, 0}, false}.modifier());
      },
      "kfa::nn::MultiHeadAttention::forward: the grid neighbourhood's options.extent = [5][7] "
      "holds 35 points, but seqlen_q = 36 and seqlen_k = 36 (both must be the grid's points)");
  for (double v : to_host(y).data) ASSERT_EQ(v, 7.0) << "y written";
  layer.forward(Space(), x, y, context, RefGrid{2, {6, 6, 1}, {5, 9, 0}, true}.modifier());
  layer.forward(Space(), x, y_plain, context);
  Space().fence();
  const Tensor plain = to_host(y_plain);
  EXPECT_LE(max_abs_diff(to_host(y), plain), 64 * epsilon<T>() * std::max(1.0, max_abs(plain)))
      << type_name<T>() << " " << Space::name();
}

// The block predicate is exact: false iff no query of the rows sees a key of
// the keys, for every pair of runs of rows and keys of small grids; the mask
// is the oracle's, and flat_window() is the largest |i - j| it shows.
TEST(NnGridPredicate, ExactOnEveryPairOfRuns) {
  std::vector<RefGrid> grids;
  for (const bool shifted : {false, true}) {
    grids.push_back({1, {9, 1, 1}, {2, 0, 0}, shifted});
    grids.push_back({2, {5, 7, 1}, {1, 2, 0}, shifted});
    grids.push_back({2, {5, 7, 1}, {0, 0, 0}, shifted});
    grids.push_back({2, {5, 7, 1}, {9, 1, 0}, shifted});
    grids.push_back({2, {5, 7, 1}, {2, 3, 0}, shifted});
    grids.push_back({2, {1, 6, 1}, {0, 1, 0}, shifted});
    grids.push_back({2, {6, 1, 1}, {1, 0, 0}, shifted});
    grids.push_back({3, {3, 4, 5}, {1, 0, 2}, shifted});
    grids.push_back({3, {3, 4, 5}, {0, 0, 0}, shifted});
    grids.push_back({3, {3, 4, 5}, {2, 1, 1}, shifted});
    grids.push_back({3, {2, 3, 2}, {1, 1, 0}, shifted});
  }
  for (const RefGrid& grid : grids) {
    const auto mod = grid.modifier();
    const int n = grid.points();
    ASSERT_EQ(mod.points(), n);
    // prefix(i, j): visible pairs among rows < i and keys < j.
    std::vector<int> prefix(std::size_t(n + 1) * (n + 1), 0);
    const auto at = [&](int i, int j) -> int& { return prefix[std::size_t(i) * (n + 1) + j]; };
    int widest = 0, mask_errors = 0;
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) {
        const bool sees = grid.sees(i, j);
        if (sees != mod.sees(i, j)) ++mask_errors;
        if (sees) widest = std::max(widest, std::abs(i - j));
        at(i + 1, j + 1) = at(i, j + 1) + at(i + 1, j) - at(i, j) + (sees ? 1 : 0);
      }
    EXPECT_EQ(mask_errors, 0) << grid.name();
    EXPECT_EQ(mod.flat_window(), widest) << grid.name();
    long runs = 0, skipped = 0, wrong = 0;
    std::string first_wrong;
    for (int r0 = 0; r0 < n; ++r0)
      for (int r1 = r0 + 1; r1 <= n; ++r1)
        for (int k0 = 0; k0 < n; ++k0)
          for (int k1 = k0 + 1; k1 <= n; ++k1) {
            const int seen = at(r1, k1) - at(r0, k1) - at(r1, k0) + at(r0, k0);
            const bool visible = mod.visible(0, 0, r0, r1, k0, k1);
            ++runs;
            if (!visible) ++skipped;
            if (visible != (seen > 0) && wrong++ == 0) {
              first_wrong = "rows [" + std::to_string(r0) + ", " + std::to_string(r1) + ") keys [" +
                            std::to_string(k0) + ", " + std::to_string(k1) + "): predicate " +
                            std::to_string(visible) + ", visible pairs " + std::to_string(seen);
            }
          }
    EXPECT_EQ(wrong, 0) << grid.name() << ": " << first_wrong;
    // Some run is skipped iff some key is hidden from some query.
    EXPECT_EQ(skipped > 0, at(n, n) < n * n) << grid.name();
    EXPECT_GT(runs, 0);
  }
}

TEST(NnGridPredicate, BadOptionsThrow) {
  const auto make = [](int axes, std::array<int, 3> extent, std::array<int, 3> radius) {
    kfa::nn::GridNeighbourhoodOptions o;
    o.axes = axes;
    for (int a = 0; a < 3; ++a) {
      o.extent[a] = extent[a];
      o.radius[a] = radius[a];
    }
    return kfa::nn::GridNeighbourhood(o);
  };
  expect_invalid_argument(
      [&] {
        make(2, {5, 7, 1}, {1, -1, 0});
      },
      "kfa::nn::GridNeighbourhood: options.radius[1] must be >= 0, got -1");
  expect_invalid_argument(
      [&] {
        make(2, {5, 0, 1}, {1, 1, 0});
      },
      "options.extent[1] must be >= 1, got options.extent = [5][0]");
  expect_invalid_argument(
      [&] {
        make(0, {5, 7, 1}, {1, 1, 0});
      },
      "options.axes must be 1, 2 or 3, got 0");
  expect_invalid_argument(
      [&] {
        make(3, {2000, 2000, 2000}, {1, 1, 1});
      },
      "options.extent = [2000][2000][2000] holds more than 2^31 - 1 points");
}

}  // namespace
