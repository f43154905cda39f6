// Pieces the kfa examples share: command-line flags and the error measure.
#ifndef KFA_EXAMPLE_COMMON_HPP
#define KFA_EXAMPLE_COMMON_HPP

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace kfa_example {

/// The flags every example takes: --batch, --seqlen, --heads, --head-dim,
/// --repeat, --causal, --double.
struct CommonArgs {
  int batch = 1, seqlen = 2048, heads = 4, head_dim = 64, repeat = 3;
  bool causal = false, use_double = false;
};

/// Parses argv into `args`: the common flags, then `extra(args, flag,
/// next_int)` for the example's own (it returns false for a flag it does not
/// know, which ends the program with a message).
template <class Args, class Extra>
Args parse_args(int argc, char* argv[], Args args, Extra&& extra) {
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    auto next = [&]() {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s: %s needs a value\n", argv[0], s.c_str());
        std::exit(2);
      }
      return std::atoi(argv[++i]);
    };
    if (s == "--batch") args.batch = next();
    else if (s == "--seqlen") args.seqlen = next();
    else if (s == "--heads") args.heads = next();
    else if (s == "--head-dim") args.head_dim = next();
    else if (s == "--repeat") args.repeat = std::max(1, next());
    else if (s == "--causal") args.causal = true;
    else if (s == "--double") args.use_double = true;
    else if (!extra(args, s, next)) {
      std::fprintf(stderr, "%s: unknown argument %s (see the comment at the top of the example)\n",
                   argv[0], s.c_str());
      std::exit(2);
    }
  }
  return args;
}

/// Largest |a - b| over two Views of the same size (on any memory space);
/// equal infinities count as no error, a NaN as an infinite one.
template <class ViewA, class ViewB>
double max_abs_diff(const ViewA& a, const ViewB& b) {
  auto ha = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), a);
  auto hb = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), b);
  double err = 0;
  for (std::size_t n = 0; n < ha.size(); ++n) {
    const double x = static_cast<double>(ha.data()[n]), y = static_cast<double>(hb.data()[n]);
    if (std::isinf(x) && x == y) continue;
    err = std::isnan(x - y) ? INFINITY : std::max(err, std::abs(x - y));
  }
  return err;
}

}  // namespace kfa_example

#endif
