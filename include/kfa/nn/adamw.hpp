#ifndef KFA_NN_ADAMW_HPP
#define KFA_NN_ADAMW_HPP

#include <kfa/nn/options.hpp>
#include <kfa/nn/parameter.hpp>

#include <kfa/detail/nn/adamw_kernel.hpp>
#include <kfa/detail/nn/checks.hpp>
#include <kfa/detail/nn/layer_support.hpp>

#include <cmath>
#include <string>
#include <type_traits>
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
/// the first step). The arithmetic is in kfa::accumulator_t of param's type
/// (float for kfa::half and kfa::bfloat16), the result rounded into param.
///
/// param [n]: a LayoutRight View of double, float, kfa::half or
/// kfa::bfloat16; grad [n] and the moments exp_avg, exp_avg_sq [n] of
/// param's type or kfa::accumulator_t of it (fp32 gradients and moments of a
/// 16-bit parameter), the two moments of one type; all accessible from
/// ExecSpace and pairwise disjoint. Enqueued on `space`. Throws
/// std::invalid_argument (nothing written) on bad shapes or options.
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
    using GradT = typename G::non_const_value_type;
    using MomentT = typename M::non_const_value_type;
    static_assert((std::is_same<GradT, T>::value ||
                   std::is_same<GradT, accumulator_t<T>>::value) &&
                      (std::is_same<MomentT, T>::value ||
                       std::is_same<MomentT, accumulator_t<T>>::value) &&
                      Impl::same_value_type<MomentT, V>() && Impl::all_non_const<P, M, V>(),
                  "kfa::nn::adamw_step: grad, exp_avg and exp_avg_sq must have param's value "
                  "type or kfa::accumulator_t of it (the moments one type); param, exp_avg "
                  "and exp_avg_sq non-const");
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
    Impl::adamw_step_impl<ExecSpace, T, GradT, MomentT>(
        space, Impl::out_vector(param), Impl::in_vector(grad), Impl::out_vector(exp_avg),
        Impl::out_vector(exp_avg_sq), step, options);
  }
}

/// AdamW over a list of parameters (a layer's parameters()): holds the two
/// moment estimates of each (in kfa::accumulator_t<T>: fp32 for the 16-bit
/// types) and the step count. It steps from each parameter's grad_fp32 when
/// the layer accumulates gradients in fp32, else from its grad.
///
/// With options.fp32_master_weights and a 16-bit T it also keeps an fp32
/// master copy of every parameter, taken from the values at construction
/// (construct it after loading weights): each step updates the master and
/// rounds it into the parameter, so that updates smaller than the 16-bit
/// spacing of a weight accumulate instead of rounding away.
template <class ExecSpace, class T>
class AdamW {
 public:
  using memory_space = typename ExecSpace::memory_space;
  using parameter_type = Parameter<T, memory_space>;
  using acc_t = accumulator_t<T>;
  using acc_view = Kokkos::View<acc_t*, Kokkos::LayoutRight, memory_space>;

  /// Throws std::invalid_argument on bad options or a parameter without a
  /// gradient.
  AdamW(std::vector<parameter_type> parameters, const AdamWOptions& options = {})
      : m_parameters(std::move(parameters)), m_options(options) {
    const char* function = "kfa::nn::AdamW";
    Impl::check_adamw_options(function, options);
    const bool master = options.fp32_master_weights && Impl::nn_is_16bit<T>();
    for (const auto& p : m_parameters) {
      const std::size_t n = p.value.extent(0);
      if (p.grad.extent(0) != n && p.grad_fp32.extent(0) != n) {
        Impl::throw_invalid(function, "parameter '" + p.name + "' has " + std::to_string(n) +
                                          " values but no gradient of that size (grad or "
                                          "grad_fp32)");
      }
      m_exp_avg.emplace_back("kfa::nn::AdamW::exp_avg", n);
      m_exp_avg_sq.emplace_back("kfa::nn::AdamW::exp_avg_sq", n);
      m_master.emplace_back();
      if (master && n > 0) {
        m_master.back() = acc_view(
            Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("kfa::nn::AdamW::master")),
            n);
        Kokkos::parallel_for("kfa::nn::adamw::copy_to_master",
                             Kokkos::RangePolicy<ExecSpace>(ExecSpace(), 0, int(n)),
                             Impl::CopyToMaster<ExecSpace, T>{p.value, m_master.back()});
      }
    }
    ExecSpace().fence();
  }

  /// One step on every parameter from its current gradient. Enqueued on `space`.
  void step(const ExecSpace& space) {
    ++m_step;
    for (std::size_t n = 0; n < m_parameters.size(); ++n) {
      const parameter_type& p = m_parameters[n];
      if (p.grad_fp32.extent(0) > 0 || p.value.extent(0) == 0) {
        Impl::adamw_step_impl<ExecSpace, T, acc_t, acc_t>(space, p.value, p.grad_fp32,
                                                          m_exp_avg[n], m_exp_avg_sq[n], m_step,
                                                          m_options, m_master[n]);
      } else {
        Impl::adamw_step_impl<ExecSpace, T, T, acc_t>(space, p.value, p.grad, m_exp_avg[n],
                                                      m_exp_avg_sq[n], m_step, m_options,
                                                      m_master[n]);
      }
    }
  }

  /// Sets every gradient to zero (gradients accumulate across backward calls).
  void zero_grad(const ExecSpace& space) {
    Impl::nn_zero_grad(space, m_parameters);
  }

  long steps() const { return m_step; }
  AdamWOptions& options() { return m_options; }
  /// The fp32 master copies (empty Views without fp32_master_weights or for
  /// double and float), in the order of the parameters.
  const std::vector<acc_view>& master_weights() const { return m_master; }

 private:
  std::vector<parameter_type> m_parameters;
  AdamWOptions m_options;
  std::vector<acc_view> m_exp_avg, m_exp_avg_sq, m_master;
  long m_step = 0;
};

}  // namespace nn
}  // namespace kfa

#endif
