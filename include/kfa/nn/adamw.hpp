#ifndef KFA_NN_ADAMW_HPP
#define KFA_NN_ADAMW_HPP

#include <kfa/nn/options.hpp>
#include <kfa/nn/parameter.hpp>

#include <kfa/detail/nn/adamw_kernel.hpp>
#include <kfa/detail/nn/checks.hpp>
#include <kfa/detail/nn/layer_support.hpp>

#include <cmath>
#include <vector>

namespace kfa {
namespace Impl {

inline void check_adamw_options(const char* function, const nn::AdamWOptions& o) {
  const bool ok = std::isfinite(o.lr) && o.lr >= 0 && o.beta1 >= 0 && o.beta1 < 1 &&
                  o.beta2 >= 0 && o.beta2 < 1 && std::isfinite(o.eps) && o.eps >= 0 &&
                  std::isfinite(o.weight_decay) && o.weight_decay >= 0;
  if (!ok) {
    throw_invalid(function, "options need lr >= 0, beta1 and beta2 in [0, 1), eps >= 0 and "
                            "weight_decay >= 0, all finite");
  }
}

}  // namespace Impl

namespace nn {

/// One AdamW step (torch.optim.AdamW, amsgrad off) on a parameter with its
/// gradient and moment estimates: param ← param·(1 - lr·weight_decay), then
/// the Adam update with bias correction for step number `step` (1 for the
/// first step). exp_avg and exp_avg_sq are updated in place (zero before
/// the first step).
///
/// param, grad, exp_avg, exp_avg_sq [n]: LayoutRight Views of double or
/// float accessible from ExecSpace, pairwise disjoint. Enqueued on `space`.
/// Throws std::invalid_argument (nothing written) on bad shapes or options.
template <class ExecSpace, class P, class G, class M, class V>
void adamw_step(const ExecSpace& space, const P& param, const G& grad, const M& exp_avg,
                const V& exp_avg_sq, long step, const AdamWOptions& options = {}) {
  const char* function = "kfa::nn::adamw_step";
  Impl::ProfilingRegion region(function);
  Impl::check_nn_view<ExecSpace, P>(function, "param", "[n]", 1);
  Impl::check_nn_view<ExecSpace, G>(function, "grad", "[n]", 1);
  Impl::check_nn_view<ExecSpace, M>(function, "exp_avg", "[n]", 1);
  Impl::check_nn_view<ExecSpace, V>(function, "exp_avg_sq", "[n]", 1);
  if constexpr (Impl::view_ok<ExecSpace, P>(1) && Impl::view_ok<ExecSpace, G>(1) &&
                Impl::view_ok<ExecSpace, M>(1) && Impl::view_ok<ExecSpace, V>(1)) {
    using T = typename P::non_const_value_type;
    static_assert(Impl::same_value_type<T, G, M, V>() && Impl::all_non_const<P, M, V>(),
                  "kfa::nn::adamw_step: every View must have param's value type; param, "
                  "exp_avg and exp_avg_sq non-const");
    const std::size_t n = param.extent(0);
    Impl::check_extents(function, "grad", "[n]", grad, {n});
    Impl::check_extents(function, "exp_avg", "[n]", exp_avg, {n});
    Impl::check_extents(function, "exp_avg_sq", "[n]", exp_avg_sq, {n});
    if (step < 1) Impl::throw_invalid(function, "step must be >= 1, got " + std::to_string(step));
    Impl::check_adamw_options(function, options);
    Impl::check_disjoint(function, "param", param, "grad", grad);
    Impl::check_disjoint(function, "param", param, "exp_avg", exp_avg);
    Impl::check_disjoint(function, "param", param, "exp_avg_sq", exp_avg_sq);
    Impl::check_disjoint(function, "exp_avg", exp_avg, "grad", grad);
    Impl::check_disjoint(function, "exp_avg_sq", exp_avg_sq, "grad", grad);
    Impl::check_disjoint(function, "exp_avg", exp_avg, "exp_avg_sq", exp_avg_sq);
    Impl::adamw_step_impl<ExecSpace, T>(space, Impl::out_vector(param), Impl::in_vector(grad),
                                        Impl::out_vector(exp_avg), Impl::out_vector(exp_avg_sq),
                                        step, options);
  }
}

/// AdamW over a list of parameters (a layer's parameters()): holds the two
/// moment estimates of each and the step count.
template <class ExecSpace, class T>
class AdamW {
 public:
  using memory_space = typename ExecSpace::memory_space;
  using parameter_type = Parameter<T, memory_space>;

  AdamW(std::vector<parameter_type> parameters, const AdamWOptions& options = {})
      : m_parameters(std::move(parameters)), m_options(options) {
    Impl::check_adamw_options("kfa::nn::AdamW", options);
    for (const auto& p : m_parameters) {
      m_exp_avg.emplace_back("kfa::nn::AdamW::exp_avg", p.value.extent(0));
      m_exp_avg_sq.emplace_back("kfa::nn::AdamW::exp_avg_sq", p.value.extent(0));
    }
  }

  /// One step on every parameter from its current gradient. Enqueued on `space`.
  void step(const ExecSpace& space) {
    ++m_step;
    for (std::size_t n = 0; n < m_parameters.size(); ++n) {
      adamw_step(space, m_parameters[n].value, m_parameters[n].grad, m_exp_avg[n],
                 m_exp_avg_sq[n], m_step, m_options);
    }
  }

  /// Sets every gradient to zero (gradients accumulate across backward calls).
  void zero_grad(const ExecSpace& space) {
    Impl::nn_zero_grad(space, m_parameters);
  }

  long steps() const { return m_step; }
  AdamWOptions& options() { return m_options; }

 private:
  std::vector<parameter_type> m_parameters;
  AdamWOptions m_options;
  std::vector<Kokkos::View<T*, Kokkos::LayoutRight, memory_space>> m_exp_avg, m_exp_avg_sq;
  long m_step = 0;
};

}  // namespace nn
}  // namespace kfa

#endif
