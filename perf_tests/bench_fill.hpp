#ifndef KFA_BENCH_FILL_HPP
#define KFA_BENCH_FILL_HPP

// The random inputs of the device benchmarks (bench_device --random,
// bench_bwd_trace): every value drawn uniformly from [-1, 1] in float and
// rounded to the view's type (Kokkos' generators do not cover every T),
// the same values on every run (seed 1234).

#include <Kokkos_Core.hpp>
#include <Kokkos_Random.hpp>

#include <cstddef>
#include <initializer_list>

template <class Space, class View>
void fill_uniform(std::initializer_list<View> views) {
  using T = typename View::value_type;
  std::size_t size = 0;
  for (const View& x : views) size = x.size() > size ? x.size() : size;
  Kokkos::Random_XorShift64_Pool<Space> pool(1234);
  Kokkos::View<float*, typename Space::memory_space> draw("bench::draw", size);
  for (const View& x : views) {
    Kokkos::fill_random(draw, pool, -1.0f, 1.0f);
    T* dst = x.data();
    Kokkos::parallel_for(
        "bench::round", Kokkos::RangePolicy<Space>(0, x.size()),
        KOKKOS_LAMBDA(const std::size_t i) { dst[i] = T(draw(i)); });
  }
}

#endif
