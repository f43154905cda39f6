// kfa_attention_forward / kfa_attention_backward: the caller's pointers as
// unmanaged Views, then the C++ entry points (same kernels, same results).

#include "c_api_impl.hpp"

#include <kfa/flash_attention.hpp>

namespace {

using namespace kfa::CApi;

struct Shape {
  std::int64_t batch, seqlen_q, seqlen_k, heads, kv_heads, head_dim;
  std::int64_t q() const { return batch * seqlen_q * heads * head_dim; }
  std::int64_t kv() const { return batch * seqlen_k * kv_heads * head_dim; }
  std::int64_t lse() const { return batch * heads * seqlen_q; }
};

// Sizes first: the pointer checks need the element counts.
void check_shape(const Shape& s) {
  check_size("batch", s.batch, 0);
  check_size("seqlen_q", s.seqlen_q, 0);
  check_size("seqlen_k", s.seqlen_k, 0);
  check_size("heads", s.heads, 1);
  check_size("kv_heads", s.kv_heads, 1);
  check_size("head_dim", s.head_dim, 1);
  // The C++ checks say these too, in the C++ API's words (heads_kv, q's extents).
  if (s.heads % s.kv_heads != 0) {
    invalid("heads (" + std::to_string(s.heads) + ") must be a multiple of kv_heads (" +
            std::to_string(s.kv_heads) + ")");
  }
  if (s.head_dim > kfa::Impl::max_head_dim) {
    invalid("head_dim must be in 1.." + std::to_string(kfa::Impl::max_head_dim) + ", got " +
            std::to_string(s.head_dim));
  }
}

constexpr const char* kQShape = "[batch][seqlen_q][heads][head_dim]";
constexpr const char* kKvShape = "[batch][seqlen_k][kv_heads][head_dim]";
constexpr const char* kLseShape = "[batch][heads][seqlen_q]";

template <class ExecSpace, class T>
struct AttentionViews {
  using mem = typename ExecSpace::memory_space;
  using acc = kfa::accumulator_t<T>;
  using in4 = Unmanaged<const T****, mem>;
  using out4 = Unmanaged<T****, mem>;
  using in_lse = Unmanaged<const acc***, mem>;
  using out_lse = Unmanaged<acc***, mem>;

  static in4 q_in(const void* p, const Shape& s) {
    return in4(static_cast<const T*>(p), s.batch, s.seqlen_q, s.heads, s.head_dim);
  }
  static out4 q_out(void* p, const Shape& s) {
    return out4(static_cast<T*>(p), s.batch, s.seqlen_q, s.heads, s.head_dim);
  }
  static in4 kv_in(const void* p, const Shape& s) {
    return in4(static_cast<const T*>(p), s.batch, s.seqlen_k, s.kv_heads, s.head_dim);
  }
  static out4 kv_out(void* p, const Shape& s) {
    return out4(static_cast<T*>(p), s.batch, s.seqlen_k, s.kv_heads, s.head_dim);
  }
};

/// The shape and the operands the forward and the backward share.
void check_forward_operands(const Shape& s, const void* q, const void* k, const void* v,
                            const void* o, const void* lse) {
  check_shape(s);
  check_pointer("q", q, kQShape, s.q());
  check_pointer("k", k, kKvShape, s.kv());
  check_pointer("v", v, kKvShape, s.kv());
  check_pointer("o", o, kQShape, s.q());
  check_pointer("lse", lse, kLseShape, s.lse());
}

}  // namespace

extern "C" {

kfa_status kfa_attention_forward(kfa_space space, void* stream, kfa_dtype dtype, const void* q,
                                 const void* k, const void* v, void* o, void* lse,
                                 int64_t batch, int64_t seqlen_q, int64_t seqlen_k,
                                 int64_t heads, int64_t kv_heads, int64_t head_dim,
                                 const kfa_attention_options* options) {
  return guarded("kfa_attention_forward", [&] {
    const Shape s{batch, seqlen_q, seqlen_k, heads, kv_heads, head_dim};
    check_forward_operands(s, q, k, v, o, lse);
    const kfa::AttentionOptions o_options = attention_options(options);
    with_space(space, [&](auto space_tag) {
      using ExecSpace = decltype(space_tag);
      with_dtype(dtype, false, [&](auto value_tag) {
        using V = AttentionViews<ExecSpace, decltype(value_tag)>;
        const typename V::out_lse lse_view(static_cast<typename V::acc*>(lse), s.batch,
                                           s.heads, s.seqlen_q);
        kfa::flash_attention_forward(space_instance<ExecSpace>(stream), V::q_in(q, s),
                                     V::kv_in(k, s), V::kv_in(v, s), V::q_out(o, s), lse_view,
                                     o_options);
      });
    });
  });
}

kfa_status kfa_attention_backward(kfa_space space, void* stream, kfa_dtype dtype,
                                  const void* q, const void* k, const void* v, const void* o,
                                  const void* lse, const void* d_o, void* dq, void* dk,
                                  void* dv, int64_t batch, int64_t seqlen_q, int64_t seqlen_k,
                                  int64_t heads, int64_t kv_heads, int64_t head_dim,
                                  const kfa_attention_options* options) {
  return guarded("kfa_attention_backward", [&] {
    const Shape s{batch, seqlen_q, seqlen_k, heads, kv_heads, head_dim};
    check_forward_operands(s, q, k, v, o, lse);
    check_pointer("d_o", d_o, kQShape, s.q());
    check_pointer("dq", dq, kQShape, s.q());
    check_pointer("dk", dk, kKvShape, s.kv());
    check_pointer("dv", dv, kKvShape, s.kv());
    const kfa::AttentionOptions o_options = attention_options(options);
    with_space(space, [&](auto space_tag) {
      using ExecSpace = decltype(space_tag);
      with_dtype(dtype, false, [&](auto value_tag) {
        using V = AttentionViews<ExecSpace, decltype(value_tag)>;
        const typename V::in_lse lse_view(static_cast<const typename V::acc*>(lse), s.batch,
                                          s.heads, s.seqlen_q);
        kfa::flash_attention_backward(space_instance<ExecSpace>(stream), V::q_in(q, s),
                                      V::kv_in(k, s), V::kv_in(v, s), V::q_in(o, s), lse_view,
                                      V::q_in(d_o, s), V::q_out(dq, s), V::kv_out(dk, s),
                                      V::kv_out(dv, s), o_options);
      });
    });
  });
}

}  // extern "C"
