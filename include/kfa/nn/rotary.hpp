#ifndef KFA_NN_ROTARY_HPP
#define KFA_NN_ROTARY_HPP

#include <kfa/nn/options.hpp>

#include <kfa/detail/nn/checks.hpp>
#include <kfa/detail/nn/rotary_kernels.hpp>

namespace kfa {
namespace Impl {

template <class ExecSpace, class X, class Y>
void nn_rotary(const char* function, const ExecSpace& space, const X& x, const Y& y,
               const nn::RotaryOptions& options, int sign) {
  ProfilingRegion region(function);
  const char* shape = "[batch][seqlen][heads][head_dim]";
  check_nn_view<ExecSpace, X>(function, sign > 0 ? "x" : "dy", shape, 4);
  check_nn_view<ExecSpace, Y>(function, sign > 0 ? "y" : "dx", shape, 4);
  if constexpr (view_ok<ExecSpace, X>(4) && view_ok<ExecSpace, Y>(4)) {
    using T = typename X::non_const_value_type;
    static_assert(same_value_type<T, Y>() && all_non_const<Y>(),
                  "kfa::nn::rotary: the output must be a non-const View of the input's type");
    check_extents(function, sign > 0 ? "y" : "dx", shape, y,
                  {x.extent(0), x.extent(1), x.extent(2), x.extent(3)});
    const int head_dim = static_cast<int>(x.extent(3));
    const int rotary_dim = options.rotary_dim == 0 ? head_dim : options.rotary_dim;
    if (rotary_dim < 0 || rotary_dim % 2 != 0 || rotary_dim > head_dim) {
      throw_invalid(function, "options.rotary_dim must be even and in 0..head_dim = " +
                                  std::to_string(head_dim) + " (0: head_dim), got " +
                                  std::to_string(options.rotary_dim));
    }
    if (!(options.base > 0) || !std::isfinite(options.base) || options.position_offset < 0) {
      throw_invalid(function, "options.base must be finite and > 0 and options.position_offset "
                              ">= 0");
    }
    // Each thread reads both features of its pair before writing them.
    check_alias_or_disjoint(function, sign > 0 ? "y" : "dx", y, sign > 0 ? "x" : "dy", x);
    rotary_apply_impl<ExecSpace, T>(space, in_tokens(x), 0, out_tokens(y), 0,
                                    static_cast<int>(x.extent(1)), static_cast<int>(x.extent(2)),
                                    head_dim, rotary_dim, options, sign);
  }
}

}  // namespace Impl

namespace nn {

/// Rotary position embeddings: pair j of the first rotary_dim features of
/// each head of token i is rotated by (position_offset + i)·base^(-2j /
/// rotary_dim); pairs are (j, j + rotary_dim/2) for RotaryStyle::half_split
/// and (2j, 2j + 1) for RotaryStyle::interleaved; the rest is copied.
///
/// x, y [batch][seqlen][heads][head_dim] (y may be x itself): LayoutRight
/// Views of double, float, kfa::half or kfa::bfloat16 (rotated in float)
/// accessible from ExecSpace. Enqueued on `space`.
/// Throws std::invalid_argument (nothing written) on bad shapes or options.
template <class ExecSpace, class X, class Y>
void rotary_forward(const ExecSpace& space, const X& x, const Y& y,
                    const RotaryOptions& options = {}) {
  Impl::nn_rotary("kfa::nn::rotary_forward", space, x, y, options, 1);
}

/// Backward of rotary_forward: dx = the inverse rotation of dy (dx may be dy).
template <class ExecSpace, class DY, class DX>
void rotary_backward(const ExecSpace& space, const DY& dy, const DX& dx,
                     const RotaryOptions& options = {}) {
  Impl::nn_rotary("kfa::nn::rotary_backward", space, dy, dx, options, -1);
}

}  // namespace nn
}  // namespace kfa

#endif
