// Trains one kfa::nn::TransformerBlock (RMSNorm, SwiGLU, rotary embeddings,
// causal attention: a Llama-style block) with AdamW to map a fixed batch of
// inputs to a fixed random target, printing the mean squared error per
// step; it fails unless the loss falls to a quarter.
//
// Flags: --batch, --seqlen, --heads, --head-dim (d_model = heads·head_dim),
// --repeat (training steps), --double; --causal is always on.

#include <kfa/nn.hpp>

#include "example_common.hpp"

#include <cstdio>
#include <random>
#include <vector>

namespace block_example {

using Space = Kokkos::DefaultExecutionSpace;

template <class T>
int train(const kfa_example::CommonArgs& args) {
  using View3 = Kokkos::View<T***, Kokkos::LayoutRight, Space::memory_space>;
  const int batch = args.batch, seqlen = args.seqlen, d_model = args.heads * args.head_dim;

  kfa::nn::TransformerBlockOptions options;
  options.attention.d_model = d_model;
  options.attention.heads = args.heads;
  options.attention.rotary = true;
  options.attention.attention.causal = true;
  options.d_ff = 2 * d_model;
  options.norm = kfa::nn::Norm::rms_norm;
  options.activation = kfa::nn::Activation::swiglu;
  options.bias = false;
  kfa::nn::TransformerBlock<Space, T> block(options);
  kfa::nn::AdamWOptions adamw_options;
  adamw_options.lr = 1e-2;
  adamw_options.weight_decay = 0;
  kfa::nn::AdamW<Space, T> adamw(block.parameters(), adamw_options);

  // Inputs and targets on the host, then on the device.
  View3 x("x", batch, seqlen, d_model), y("y", batch, seqlen, d_model),
      dy("dy", batch, seqlen, d_model), dx("dx", batch, seqlen, d_model);
  auto x_host = Kokkos::create_mirror_view(x);
  auto y_host = Kokkos::create_mirror_view(y);
  auto dy_host = Kokkos::create_mirror_view(dy);
  std::vector<double> target(x.size());
  std::mt19937_64 rng(42);
  std::normal_distribution<double> normal(0.0, 1.0);
  for (std::size_t n = 0; n < x.size(); ++n) x_host.data()[n] = static_cast<T>(normal(rng));
  for (double& t : target) t = 0.5 * normal(rng);
  Kokkos::deep_copy(x, x_host);

  typename kfa::nn::TransformerBlock<Space, T>::context_type context;
  const Space space;
  double first = 0, loss = 0;
  for (int step = 0; step < args.repeat; ++step) {
    context.dropout_seed = step;
    block.forward(space, x, y, context);
    Kokkos::deep_copy(y_host, y);
    // Mean squared error and its gradient dL/dy = 2·(y - target)/n.
    loss = 0;
    const double n = static_cast<double>(y.size());
    for (std::size_t i = 0; i < y.size(); ++i) {
      const double e = static_cast<double>(y_host.data()[i]) - target[i];
      loss += e * e / n;
      dy_host.data()[i] = static_cast<T>(2 * e / n);
    }
    Kokkos::deep_copy(dy, dy_host);
    adamw.zero_grad(space);
    block.backward(space, dy, dx, context);
    adamw.step(space);
    if (step == 0) first = loss;
    std::printf("step %3d  loss %.6f\n", step, loss);
  }
  const bool ok = loss < 0.25 * first;
  std::printf("%s: loss %.6f -> %.6f over %d steps\n", ok ? "ok" : "FAILED", first, loss,
              args.repeat);
  return ok ? 0 : 1;
}

}  // namespace block_example

int main(int argc, char* argv[]) {
  int status = 0;
  {
    Kokkos::ScopeGuard guard(argc, argv);
    kfa_example::CommonArgs defaults;
    defaults.batch = 2;
    defaults.seqlen = 64;
    defaults.heads = 4;
    defaults.head_dim = 16;
    defaults.repeat = 60;
    const auto args = kfa_example::parse_args(argc, argv, defaults,
                                              [](auto&, const std::string&, auto&&) { return false; });
    status = args.use_double ? block_example::train<double>(args)
                             : block_example::train<float>(args);
  }
  return status;
}
