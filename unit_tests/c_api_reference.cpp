// The C++ side of tstCApi.c: the same computations through the C++ API on
// managed Views (options mapped here independently of src/c_api), and
// device buffers for the tests of KFA_SPACE_DEFAULT.

#include <kfa/c_api.h>
#include <kfa/flash_attention.hpp>
#include <kfa/nn.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;
using HostBytes = Kokkos::View<char*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

// Host buffer -> View of Mem with the given extents, and back.
template <class ViewType>
ViewType to_device(const char* label, const void* host, std::size_t n0, std::size_t n1,
                   std::size_t n2, std::size_t n3 = KOKKOS_INVALID_INDEX) {
  ViewType view(std::string(label), n0, n1, n2, n3);
  auto mirror = Kokkos::create_mirror_view(view);
  std::memcpy(mirror.data(), host, view.span() * sizeof(typename ViewType::value_type));
  Kokkos::deep_copy(view, mirror);
  return view;
}
template <class ViewType>
void to_host(void* host, const ViewType& view) {
  auto mirror = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), view);
  std::memcpy(host, mirror.data(), view.span() * sizeof(typename ViewType::value_type));
}

kfa::AttentionOptions map_options(const kfa_attention_options& c) {
  kfa::AttentionOptions o;
  o.softmax_scale = c.softmax_scale;
  o.causal = c.causal;
  o.deterministic = c.deterministic;
  o.window_left = c.window_left;
  o.window_right = c.window_right;
  o.softcap = c.softcap;
  o.dropout_p = c.dropout_p;
  o.dropout_seed = c.dropout_seed;
  return o;
}

template <class T>
void attention(const void* q, const void* k, const void* v, const void* d_o, void* o, void* lse,
               void* dq, void* dk, void* dv, int b, int sq, int sk, int h, int hkv, int d,
               const kfa_attention_options& c) {
  using V4 = Kokkos::View<T****, Kokkos::LayoutRight, Mem>;
  using L3 = Kokkos::View<kfa::accumulator_t<T>***, Kokkos::LayoutRight, Mem>;
  const auto qv = to_device<V4>("q", q, b, sq, h, d), kv = to_device<V4>("k", k, b, sk, hkv, d),
             vv = to_device<V4>("v", v, b, sk, hkv, d),
             dov = to_device<V4>("d_o", d_o, b, sq, h, d);
  V4 ov("o", b, sq, h, d), dqv("dq", b, sq, h, d), dkv("dk", b, sk, hkv, d),
      dvv("dv", b, sk, hkv, d);
  L3 lsev("lse", b, h, sq);
  const Space space;
  kfa::flash_attention_forward(space, qv, kv, vv, ov, lsev, map_options(c));
  kfa::flash_attention_backward(space, qv, kv, vv, ov, lsev, dov, dqv, dkv, dvv, map_options(c));
  to_host(o, ov);
  to_host(lse, lsev);
  to_host(dq, dqv);
  to_host(dk, dkv);
  to_host(dv, dvv);
}

kfa::nn::TransformerBlockOptions map_block(const kfa_block_options& c) {
  kfa::nn::TransformerBlockOptions o;
  o.attention.d_model = c.d_model;
  o.attention.heads = c.heads;
  o.attention.kv_heads = c.kv_heads;
  o.attention.head_dim = c.head_dim;
  o.attention.fused_qkv = c.fused_qkv;
  o.attention.rotary = c.rotary;
  o.attention.rotary_options.style = c.rotary_style == KFA_ROTARY_INTERLEAVED
                                         ? kfa::nn::RotaryStyle::interleaved
                                         : kfa::nn::RotaryStyle::half_split;
  o.attention.rotary_options.base = c.rotary_base;
  o.attention.rotary_options.rotary_dim = c.rotary_dim;
  o.attention.rotary_options.position_offset = c.rotary_position_offset;
  o.attention.attention = map_options(c.attention);
  o.attention.init_seed = c.init_seed;
  o.d_ff = c.d_ff;
  o.norm = c.norm == KFA_RMS_NORM ? kfa::nn::Norm::rms_norm : kfa::nn::Norm::layer_norm;
  o.activation = c.activation == KFA_SWIGLU      ? kfa::nn::Activation::swiglu
                 : c.activation == KFA_GELU_TANH ? kfa::nn::Activation::gelu_tanh
                                                 : kfa::nn::Activation::gelu;
  o.norm_options.eps = c.norm_eps;
  o.bias = c.bias;
  o.dropout_p = c.dropout_p;
  o.init_seed = c.init_seed;
  return o;
}

template <class T>
void block(const kfa_block_options& c, const kfa_adamw_options& a, int steps, const void* x,
           const void* dy, void* y, void* dx, void* grads, void* values, int b, int s) {
  using V3 = Kokkos::View<T***, Kokkos::LayoutRight, Mem>;
  kfa::nn::TransformerBlock<Space, T> layer(map_block(c));
  kfa::nn::AdamWOptions adamw_options;
  adamw_options.lr = a.lr;
  adamw_options.beta1 = a.beta1;
  adamw_options.beta2 = a.beta2;
  adamw_options.eps = a.eps;
  adamw_options.weight_decay = a.weight_decay;
  kfa::nn::AdamW<Space, T> adamw(layer.parameters(), adamw_options);
  typename kfa::nn::TransformerBlock<Space, T>::context_type context;
  const auto xv = to_device<V3>("x", x, b, s, c.d_model),
             dyv = to_device<V3>("dy", dy, b, s, c.d_model);
  V3 yv("y", b, s, c.d_model), dxv("dx", b, s, c.d_model);
  const Space space;
  for (int step = 0; step < steps; ++step) {
    context.dropout_seed = 100 + step;
    layer.zero_grad(space);
    layer.forward(space, xv, yv, context);
    layer.backward(space, dyv, dxv, context);
    adamw.step(space);
  }
  to_host(y, yv);
  to_host(dx, dxv);
  // Every parameter in parameters() order: gradients of the last step, then
  // the values after it.
  char* g = static_cast<char*>(grads);
  char* w = static_cast<char*>(values);
  for (const auto& p : layer.parameters()) {
    to_host(g, p.grad);
    to_host(w, p.value);
    g += p.grad.span() * sizeof(T);
    w += p.value.span() * sizeof(T);
  }
}

}  // namespace

extern "C" {

int kfa_test_f16_available(void) { return sizeof(kfa::half) == 2; }

void kfa_test_attention_reference(int dtype, const void* q, const void* k, const void* v,
                                  const void* d_o, void* o, void* lse, void* dq, void* dk,
                                  void* dv, int b, int sq, int sk, int h, int hkv, int d,
                                  const kfa_attention_options* options) {
  switch (dtype) {
    case KFA_F64: attention<double>(q, k, v, d_o, o, lse, dq, dk, dv, b, sq, sk, h, hkv, d, *options); break;
    case KFA_F32: attention<float>(q, k, v, d_o, o, lse, dq, dk, dv, b, sq, sk, h, hkv, d, *options); break;
    case KFA_BF16: attention<kfa::bfloat16>(q, k, v, d_o, o, lse, dq, dk, dv, b, sq, sk, h, hkv, d, *options); break;
    case KFA_F16: attention<kfa::half>(q, k, v, d_o, o, lse, dq, dk, dv, b, sq, sk, h, hkv, d, *options); break;
    default: std::abort();
  }
}

void kfa_test_block_reference(int dtype, const kfa_block_options* options,
                              const kfa_adamw_options* adamw, int steps, const void* x,
                              const void* dy, void* y, void* dx, void* grads, void* values,
                              int batch, int seqlen) {
  if (dtype == KFA_F64) {
    block<double>(*options, *adamw, steps, x, dy, y, dx, grads, values, batch, seqlen);
  } else {
    block<float>(*options, *adamw, steps, x, dy, y, dx, grads, values, batch, seqlen);
  }
}

void* kfa_test_device_malloc(size_t bytes) {
  return Kokkos::kokkos_malloc<Mem>("kfa_test::device", bytes == 0 ? 1 : bytes);
}
void kfa_test_device_free(void* pointer) { Kokkos::kokkos_free<Mem>(pointer); }
void kfa_test_copy(void* dst, int dst_device, const void* src, int src_device, size_t bytes) {
  using DeviceBytes = Kokkos::View<char*, Mem, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  char* d = static_cast<char*>(dst);
  char* s = const_cast<char*>(static_cast<const char*>(src));
  if (dst_device && src_device) Kokkos::deep_copy(DeviceBytes(d, bytes), DeviceBytes(s, bytes));
  else if (dst_device) Kokkos::deep_copy(DeviceBytes(d, bytes), HostBytes(s, bytes));
  else if (src_device) Kokkos::deep_copy(HostBytes(d, bytes), DeviceBytes(s, bytes));
  else std::memcpy(d, s, bytes);
}

}  // extern "C"
