// The host kernels (KernelFamily::host_tiled) on awkward shapes, with the
// OpenMP backend's threads: the typed tests elsewhere run them on Serial and
// give OpenMP's calls two-thread teams (the portable kernels). Every case is
// forward and backward against the fp64 oracle with the error rule.

#include "kfa_test_helpers.hpp"

namespace kfa_test {
namespace {

template <class C>
class HostKernels : public ::testing::Test {};
TYPED_TEST_SUITE(HostKernels, AllConfigs);

template <class C>
bool skip_config() {
  return is_duplicate_config<C>() || !is_host_space<typename C::space>();
}

kfa::AttentionOptions causal_options(bool causal) {
  kfa::AttentionOptions opt;
  opt.causal = causal;
  return opt;
}

// Head dims off the register blocks (1, 13, 59, 96, 160, 256), sequences of
// one row or key, lengths off the tiles, causal rows that see no key
// (seqlen_q > seqlen_k), and causal diagonals that start inside a query
// block at several offsets (300 x 330: the forward leaves out the rows
// before them in whole register blocks).
TYPED_TEST(HostKernels, OddShapes) {
  if (skip_config<TypeParam>()) GTEST_SKIP() << "host backends only";
  const PinTeamSize host_kernels(0);
  const Shape shapes[] = {{1, 7, 9, 2, 1},     {2, 97, 97, 2, 13},  {1, 113, 203, 2, 59},
                          {1, 70, 65, 1, 96},  {1, 50, 70, 2, 160}, {1, 33, 40, 1, 256},
                          {2, 1, 1, 2, 64},    {1, 1, 97, 2, 32},   {1, 203, 113, 2, 64},
                          {1, 300, 330, 1, 48}};
  for (const Shape& s : shapes)
    for (const bool causal : {false, true}) check_variant<TypeParam>(s, causal_options(causal), "host");
}

// Grouped-query heads, windows, softcap with dropout, and packed sequences
// on the host kernels.
TYPED_TEST(HostKernels, Variants) {
  if (skip_config<TypeParam>()) GTEST_SKIP() << "host backends only";
  const PinTeamSize host_kernels(0);
  check_variant<TypeParam>({2, 97, 113, 6, 59, 2}, causal_options(true), "host-gqa");
  kfa::AttentionOptions window;
  window.window_left = 23;
  window.window_right = 9;
  check_variant<TypeParam>({1, 113, 203, 3, 59}, window, "host-window");
  kfa::AttentionOptions modifiers = causal_options(true);
  modifiers.softcap = 5;
  modifiers.dropout_p = 0.2;
  modifiers.dropout_seed = 11;
  check_variant<TypeParam>({2, 97, 113, 4, 48, 2}, modifiers, "host-modifiers");
  check_varlen<TypeParam>({{97, 1, 130}, {113, 60, 5}, 4, 2, 40}, causal_options(true),
                          "host-varlen");
}

}  // namespace
}  // namespace kfa_test
