#ifndef KFA_DETAIL_NN_ADAMW_KERNEL_HPP
#define KFA_DETAIL_NN_ADAMW_KERNEL_HPP

// One AdamW step, torch.optim.AdamW's single-tensor formula (no amsgrad):
//   p ← p·(1 - lr·wd)
//   m ← β1·m + (1 - β1)·g,   v ← β2·v + (1 - β2)·g²
//   p ← p - (lr / (1 - β1^t)) · m / (sqrt(v) / sqrt(1 - β2^t) + eps)
// The step-dependent scalars are formed once on the host in fp64; the update
// itself runs in the accumulator type (float for the 16-bit types).

#include <kfa/nn/options.hpp>
#include <kfa/types.hpp>

#include <kfa/detail/common/compat.hpp>
#include <kfa/detail/nn/views.hpp>

#include <cmath>

namespace kfa {
namespace Impl {

/// The step on a parameter of value type T from a gradient of type G and
/// moments of type M (each T or its accumulator type), in the accumulator
/// type. With a master copy (fp32 master weights of a 16-bit T) the update
/// starts from and is kept in the master; the parameter gets it rounded.
template <class ExecSpace, class T, class G = T, class M = T>
struct AdamWStep {
  using memory_space = typename ExecSpace::memory_space;
  using acc_t = accumulator_t<T>;
  NnOut1<T, memory_space> m_param;
  NnIn1<G, memory_space> m_grad;
  NnOut1<M, memory_space> m_exp_avg, m_exp_avg_sq;
  NnOut1<acc_t, memory_space> m_master;
  acc_t m_decay, m_beta1, m_beta2, m_step_size, m_inv_sqrt_bias2, m_eps;

  KOKKOS_FUNCTION void operator()(const int n) const {
    const acc_t g = to_acc<acc_t>(m_grad(n));
    const acc_t m = m_beta1 * to_acc<acc_t>(m_exp_avg(n)) + (acc_t(1) - m_beta1) * g;
    const acc_t v = m_beta2 * to_acc<acc_t>(m_exp_avg_sq(n)) + (acc_t(1) - m_beta2) * g * g;
    const acc_t denom = math::sqrt(v) * m_inv_sqrt_bias2 + m_eps;
    m_exp_avg(n) = from_acc<M>(m);
    m_exp_avg_sq(n) = from_acc<M>(v);
    const bool master = m_master.extent(0) > 0;
    const acc_t p = master ? m_master(n) : to_acc<acc_t>(m_param(n));
    const acc_t updated = p * m_decay - m_step_size * m / denom;
    if (master) m_master(n) = updated;
    m_param(n) = from_acc<T>(updated);
  }
};

/// One step with step number `step` (1 for the first); `master` empty or the
/// fp32 master copy of `param`.
template <class ExecSpace, class T, class G, class M>
void adamw_step_impl(const ExecSpace& space,
                     const NnOut1<T, typename ExecSpace::memory_space>& param,
                     const NnIn1<G, typename ExecSpace::memory_space>& grad,
                     const NnOut1<M, typename ExecSpace::memory_space>& exp_avg,
                     const NnOut1<M, typename ExecSpace::memory_space>& exp_avg_sq, long step,
                     const nn::AdamWOptions& options,
                     const NnOut1<accumulator_t<T>, typename ExecSpace::memory_space>& master =
                         {}) {
  using acc_t = accumulator_t<T>;
  if (param.extent(0) == 0) return;
  const double bias1 = 1 - std::pow(options.beta1, double(step));
  const double bias2 = 1 - std::pow(options.beta2, double(step));
  Kokkos::parallel_for("kfa::nn::adamw::step",
                       Kokkos::RangePolicy<ExecSpace>(space, 0, int(param.extent(0))),
                       AdamWStep<ExecSpace, T, G, M>{param, grad, exp_avg, exp_avg_sq, master,
                                                     acc_t(1 - options.lr * options.weight_decay),
                                                     acc_t(options.beta1), acc_t(options.beta2),
                                                     acc_t(options.lr / bias1),
                                                     acc_t(1 / std::sqrt(bias2)),
                                                     acc_t(options.eps)});
}

/// master = param in fp32 (the AdamW master copies at construction).
template <class ExecSpace, class T>
struct CopyToMaster {
  using memory_space = typename ExecSpace::memory_space;
  using acc_t = accumulator_t<T>;
  NnIn1<T, memory_space> m_param;
  NnOut1<acc_t, memory_space> m_master;
  KOKKOS_FUNCTION void operator()(const int n) const { m_master(n) = to_acc<acc_t>(m_param(n)); }
};

}  // namespace Impl
}  // namespace kfa

#endif
