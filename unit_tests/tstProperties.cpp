// Property tests: shapes (batch, sequence lengths, grouped-query heads,
// head_dim 1..256), options (causal, windows, softcap, explicit scales,
// dropout, deterministic) and packed varlen batches drawn at random; each
// case runs fused and materialised, forward and backward, against the fp64
// oracle (check_variant / check_varlen). The seed is printed;
// KFA_PROPERTY_SEED replays a run, KFA_PROPERTY_CASES runs more cases per
// backend and value type.

#include "kfa_test_helpers.hpp"

#include <cstdlib>
#include <iostream>

namespace kfa_test {
namespace {

template <class C>
class Properties : public ::testing::Test {};
TYPED_TEST_SUITE(Properties, AllConfigs);

std::uint64_t env_or(const char* name, std::uint64_t fallback) {
  const char* text = std::getenv(name);
  return text != nullptr && *text != '\0' ? std::strtoull(text, nullptr, 0) : fallback;
}

/// Draws the cases of one run; `next` gives a uniform integer in [lo, hi].
struct Draw {
  std::mt19937_64 rng;
  int next(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }
  bool chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; }

  int head_dim() {
    // Half the cases on the head dims the fast paths serve, half anywhere.
    static const int common[] = {16, 32, 64, 128, 256};
    return chance(0.5) ? common[next(0, 4)] : next(1, 256);
  }

  kfa::AttentionOptions options() {
    kfa::AttentionOptions opt;
    opt.causal = chance(0.3);
    if (chance(0.25)) {
      opt.window_left = next(-1, 24);
      if (!opt.causal) opt.window_right = next(-1, 24);
    }
    if (chance(0.2)) opt.softcap = 2.0 + next(0, 48);
    if (chance(0.2)) opt.softmax_scale = (chance(0.5) ? 1 : -1) * next(1, 100) / 64.0;
    if (chance(0.2)) {
      opt.dropout_p = next(1, 5) / 10.0;
      opt.dropout_seed = rng();
    }
    opt.deterministic = chance(0.3);
    return opt;
  }
};

TYPED_TEST(Properties, RandomShapesAndOptions) {
  if (is_duplicate_config<TypeParam>()) GTEST_SKIP() << "half is float here";
  const std::uint64_t seed = env_or("KFA_PROPERTY_SEED", 20261204);
  const int cases = static_cast<int>(env_or("KFA_PROPERTY_CASES", 32));
  using T = typename TypeParam::value_type;
  std::cout << "[ properties ] " << type_name<T>() << " " << TypeParam::space::name()
            << ": KFA_PROPERTY_SEED=" << seed << " KFA_PROPERTY_CASES=" << cases << "\n";
  // One stream per value type and backend, so that a failure replays alone.
  Draw draw{std::mt19937_64(seed ^ test_seed(type_name<T>() + TypeParam::space::name()))};
  for (int n = 0; n < cases; ++n) {
    const int heads_kv = draw.next(1, 3), heads = heads_kv * draw.next(1, 3);
    const int head_dim = draw.head_dim();
    const kfa::AttentionOptions opt = draw.options();
    const std::string tag = "prop" + std::to_string(seed) + "#" + std::to_string(n);
    SCOPED_TRACE("KFA_PROPERTY_SEED=" + std::to_string(seed) + " case " + std::to_string(n));
    if (draw.chance(0.25)) {
      VarlenShape vs{{}, {}, heads, heads_kv, head_dim};
      for (int b = draw.next(1, 4); b > 0; --b) {
        vs.len_q.push_back(draw.next(1, 48));
        vs.len_k.push_back(draw.next(1, 48));
      }
      check_varlen<TypeParam>(vs, opt, tag);
    } else {
      Shape s{draw.next(1, 3), draw.next(1, 64), draw.next(1, 64), heads, head_dim, heads_kv};
      check_variant<TypeParam>(s, opt, tag);
    }
    if (::testing::Test::HasFailure()) break;
  }
}

}  // namespace
}  // namespace kfa_test
