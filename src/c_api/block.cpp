// kfa_block_*: a kfa::nn::TransformerBlock behind an opaque handle, with the
// context of its last forward and an AdamW over its parameters; with MPI its
// sequence-parallel mode (the block owns its RingCommunicator) and the
// gradient allreduce.

#include "c_api_impl.hpp"

#include <kfa/kfa_config.hpp>
#include <kfa/nn/adamw.hpp>
#include <kfa/nn/transformer_block.hpp>

#if KFA_ENABLE_MPI
#include <kfa/nn/distributed.hpp>
#include <kfa/ring_communicator.hpp>

#include <mpi.h>
#endif

#include <memory>
#include <vector>

// The C handle: dtype and space fixed at creation; the typed block behind
// the virtual calls.
struct kfa_block {
  kfa_block(kfa_dtype d, kfa_space s, std::int64_t dm) : dtype(d), space(s), d_model(dm) {}
  virtual ~kfa_block() = default;
  virtual void forward(void* stream, const void* x, void* y, std::int64_t batch,
                       std::int64_t seqlen, std::uint64_t dropout_seed, bool training) = 0;
  virtual void backward(void* stream, const void* dy, void* dx, std::int64_t batch,
                        std::int64_t seqlen) = 0;
  virtual void zero_grad(void* stream) = 0;
  virtual void adamw_step(void* stream, const kfa::nn::AdamWOptions& options) = 0;
  virtual void fence() = 0;
  virtual int parameter_count() const = 0;
  virtual const char* parameter_name(int index) const = 0;
  /// -1 when no parameter has that name.
  virtual int find(const char* name) const = 0;
  virtual void parameter(int index, void** value, void** grad, std::int64_t* size) const = 0;
#if KFA_ENABLE_MPI
  virtual void allreduce_gradients(void* stream, MPI_Comm comm,
                                   const kfa::nn::GradientAllreduceOptions& options) = 0;
#endif

  const kfa_dtype dtype;
  const kfa_space space;
  const std::int64_t d_model;
};

namespace {

using namespace kfa::CApi;

template <class ExecSpace, class T>
class Block final : public kfa_block {
 public:
  using mem = typename ExecSpace::memory_space;
  using block_type = kfa::nn::TransformerBlock<ExecSpace, T>;

  Block(const kfa::nn::TransformerBlockOptions& options, kfa_dtype d, kfa_space s)
      : kfa_block(d, s, options.attention.d_model),
        m_block(options),
        m_parameters(m_block.parameters()) {}

#if KFA_ENABLE_MPI
  /// The sequence-parallel mode over a duplicate of `comm`, which the block
  /// owns (declared before the layer, so it outlives it).
  Block(kfa::nn::TransformerBlockOptions options, kfa_dtype d, kfa_space s, MPI_Comm comm)
      : kfa_block(d, s, options.attention.d_model),
        m_ring(std::make_unique<kfa::RingCommunicator>(comm)),
        m_block(with_ring(options, *m_ring)),
        m_parameters(m_block.parameters()) {}

  void allreduce_gradients(void* stream, MPI_Comm comm,
                           const kfa::nn::GradientAllreduceOptions& options) override {
    kfa::nn::allreduce_gradients(space_instance<ExecSpace>(stream), m_parameters, comm, options);
  }
#endif

  void forward(void* stream, const void* x, void* y, std::int64_t batch, std::int64_t seqlen,
               std::uint64_t dropout_seed, bool training) override {
    m_context.dropout_seed = dropout_seed;
    m_context.training = training;
    m_block.forward(space_instance<ExecSpace>(stream),
                    Unmanaged<const T***, mem>(static_cast<const T*>(x), batch, seqlen, d_model),
                    Unmanaged<T***, mem>(static_cast<T*>(y), batch, seqlen, d_model), m_context);
  }

  void backward(void* stream, const void* dy, void* dx, std::int64_t batch,
                std::int64_t seqlen) override {
    m_block.backward(space_instance<ExecSpace>(stream),
                     Unmanaged<const T***, mem>(static_cast<const T*>(dy), batch, seqlen, d_model),
                     Unmanaged<T***, mem>(static_cast<T*>(dx), batch, seqlen, d_model),
                     m_context);
  }

  void zero_grad(void* stream) override { m_block.zero_grad(space_instance<ExecSpace>(stream)); }

  void adamw_step(void* stream, const kfa::nn::AdamWOptions& options) override {
    // The optimiser's moments are allocated at the first step; later steps
    // may change the options (a learning-rate schedule).
    if (!m_adamw) {
      m_adamw = std::make_unique<kfa::nn::AdamW<ExecSpace, T>>(m_parameters, options);
    } else {
      kfa::Impl::check_adamw_options("kfa::nn::AdamW", options);
      m_adamw->options() = options;
    }
    m_adamw->step(space_instance<ExecSpace>(stream));
  }

  void fence() override { ExecSpace().fence(); }

  int parameter_count() const override { return static_cast<int>(m_parameters.size()); }
  const char* parameter_name(int index) const override {
    return m_parameters[index].name.c_str();
  }
  int find(const char* name) const override {
    for (std::size_t n = 0; n < m_parameters.size(); ++n) {
      if (m_parameters[n].name == name) return static_cast<int>(n);
    }
    return -1;
  }
  void parameter(int index, void** value, void** grad, std::int64_t* size) const override {
    const auto& p = m_parameters[index];
    if (value != nullptr) *value = p.value.data();
    if (grad != nullptr) *grad = p.grad.data();
    if (size != nullptr) *size = static_cast<std::int64_t>(p.value.extent(0));
  }

 private:
#if KFA_ENABLE_MPI
  static kfa::nn::TransformerBlockOptions with_ring(kfa::nn::TransformerBlockOptions options,
                                                    const kfa::RingCommunicator& ring) {
    options.attention.sequence_parallel.comm = &ring;
    return options;
  }
  std::unique_ptr<kfa::RingCommunicator> m_ring;
#endif
  block_type m_block;
  typename block_type::context_type m_context;
  std::vector<kfa::nn::Parameter<T, mem>> m_parameters;
  std::unique_ptr<kfa::nn::AdamW<ExecSpace, T>> m_adamw;
};

kfa::nn::TransformerBlockOptions block_options(const kfa_block_options& c) {
  kfa::nn::TransformerBlockOptions o;
  auto& a = o.attention;
  a.d_model = c.d_model;
  a.heads = c.heads;
  a.kv_heads = c.kv_heads;
  a.head_dim = c.head_dim;
  a.fused_qkv = c.fused_qkv != 0;
  a.rotary = c.rotary != 0;
  switch (c.rotary_style) {
    case KFA_ROTARY_HALF_SPLIT: a.rotary_options.style = kfa::nn::RotaryStyle::half_split; break;
    case KFA_ROTARY_INTERLEAVED: a.rotary_options.style = kfa::nn::RotaryStyle::interleaved; break;
    default:
      invalid("options->rotary_style must be KFA_ROTARY_HALF_SPLIT or KFA_ROTARY_INTERLEAVED, got " +
              std::to_string(c.rotary_style));
  }
  a.rotary_options.base = c.rotary_base;
  a.rotary_options.rotary_dim = c.rotary_dim;
  a.rotary_options.position_offset = c.rotary_position_offset;
  a.attention = attention_options(&c.attention);
  a.init_seed = c.init_seed;
  o.d_ff = c.d_ff;
  switch (c.norm) {
    case KFA_LAYER_NORM: o.norm = kfa::nn::Norm::layer_norm; break;
    case KFA_RMS_NORM: o.norm = kfa::nn::Norm::rms_norm; break;
    default:
      invalid("options->norm must be KFA_LAYER_NORM or KFA_RMS_NORM, got " +
              std::to_string(c.norm));
  }
  switch (c.activation) {
    case KFA_GELU: o.activation = kfa::nn::Activation::gelu; break;
    case KFA_GELU_TANH: o.activation = kfa::nn::Activation::gelu_tanh; break;
    case KFA_SWIGLU: o.activation = kfa::nn::Activation::swiglu; break;
    default:
      invalid("options->activation must be KFA_GELU, KFA_GELU_TANH or KFA_SWIGLU, got " +
              std::to_string(c.activation));
  }
  o.norm_options.eps = c.norm_eps;
  o.bias = c.bias != 0;
  o.dropout_p = c.dropout_p;
  o.init_seed = c.init_seed;
  return o;
}

kfa::nn::AdamWOptions adamw_options(const kfa_adamw_options* c) {
  kfa::nn::AdamWOptions o;
  if (c == nullptr) return o;
  o.lr = c->lr;
  o.beta1 = c->beta1;
  o.beta2 = c->beta2;
  o.eps = c->eps;
  o.weight_decay = c->weight_decay;
  return o;
}

void check_block(const kfa_block* block) {
  if (block == nullptr) invalid("block must not be NULL");
}

/// A new block of `dtype` in `space`; make(ExecSpace{}, T{}) constructs it.
template <class Make>
kfa_block* create_block(kfa_dtype dtype, kfa_space space, Make&& make) {
  kfa_block* created = nullptr;
  with_space(space, [&](auto space_tag) {
    with_dtype(dtype, true, [&](auto value_tag) {
      using T = decltype(value_tag);
      // with_dtype(.., true, ..) passes only double and float; the others
      // are never instantiated as layers.
      if constexpr (std::is_same<T, double>::value || std::is_same<T, float>::value) {
        created = make(space_tag, value_tag);
      }
    });
  });
  return created;
}

#if KFA_ENABLE_MPI
/// The communicator of a Fortran handle; MPI must be initialised.
MPI_Comm communicator(std::int32_t handle) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) {
    throw Error(KFA_ERROR_INVALID_STATE,
                "MPI is not initialised (call MPI_Init before passing a communicator)");
  }
  const MPI_Comm comm = MPI_Comm_f2c(static_cast<MPI_Fint>(handle));
  if (comm == MPI_COMM_NULL) {
    invalid("comm (" + std::to_string(handle) +
            ") is MPI_COMM_NULL; pass a communicator's Fortran handle (MPI_Comm_c2f)");
  }
  return comm;
}
#endif

/// x-like arguments [batch][seqlen][d_model] of the block's dtype.
void check_tokens(const kfa_block* block, kfa_dtype dtype, const char* in_name, const void* in,
                  const char* out_name, const void* out, std::int64_t batch,
                  std::int64_t seqlen, std::int64_t d_model) {
  if (dtype != block->dtype) {
    invalid("dtype (" + std::to_string(static_cast<int>(dtype)) + ") must be the block's (" +
            std::to_string(static_cast<int>(block->dtype)) + ")");
  }
  check_size("batch", batch, 1);
  check_size("seqlen", seqlen, 1);
  if (d_model != block->d_model) {
    invalid("d_model must be the block's " + std::to_string(block->d_model) + ", got " +
            std::to_string(d_model));
  }
  const std::int64_t elements = batch * seqlen * d_model;
  check_pointer(in_name, in, "[batch][seqlen][d_model]", elements);
  check_pointer(out_name, out, "[batch][seqlen][d_model]", elements);
}

}  // namespace

extern "C" {

kfa_status kfa_block_create(const kfa_block_options* options, kfa_dtype dtype, kfa_space space,
                            kfa_block** block) {
  return guarded("kfa_block_create", [&] {
    if (options == nullptr) invalid("options must not be NULL");
    if (block == nullptr) invalid("block must not be NULL");
    const kfa::nn::TransformerBlockOptions o = block_options(*options);
    kfa_block* created = create_block(dtype, space, [&](auto space_tag, auto value_tag) {
      return new Block<decltype(space_tag), decltype(value_tag)>(o, dtype, space);
    });
    block_created();
    *block = created;
  });
}

kfa_status kfa_block_create_sequence_parallel(const kfa_block_options* options, kfa_dtype dtype,
                                              kfa_space space, int32_t comm, kfa_block** block) {
  return guarded("kfa_block_create_sequence_parallel", [&] {
#if KFA_ENABLE_MPI
    if (options == nullptr) invalid("options must not be NULL");
    if (block == nullptr) invalid("block must not be NULL");
    const kfa::nn::TransformerBlockOptions o = block_options(*options);
    const MPI_Comm mpi_comm = communicator(comm);
    kfa_block* created = create_block(dtype, space, [&](auto space_tag, auto value_tag) {
      return new Block<decltype(space_tag), decltype(value_tag)>(o, dtype, space, mpi_comm);
    });
    block_created();
    *block = created;
#else
    (void)options, (void)dtype, (void)space, (void)comm, (void)block;
    throw Error(KFA_ERROR_UNSUPPORTED, "kfa was built without MPI (KFA_ENABLE_MPI=OFF)");
#endif
  });
}

kfa_status kfa_block_allreduce_gradients(kfa_block* block, void* stream, int32_t comm,
                                         int32_t reduction, int32_t deterministic) {
  return guarded("kfa_block_allreduce_gradients", [&] {
#if KFA_ENABLE_MPI
    check_block(block);
    kfa::nn::GradientAllreduceOptions o;
    switch (reduction) {
      case KFA_GRADIENT_MEAN: o.reduction = kfa::nn::GradientReduction::mean; break;
      case KFA_GRADIENT_SUM: o.reduction = kfa::nn::GradientReduction::sum; break;
      default:
        invalid("reduction must be KFA_GRADIENT_MEAN or KFA_GRADIENT_SUM, got " +
                std::to_string(reduction));
    }
    o.deterministic = deterministic != 0;
    block->allreduce_gradients(stream, communicator(comm), o);
#else
    (void)block, (void)stream, (void)comm, (void)reduction, (void)deterministic;
    throw Error(KFA_ERROR_UNSUPPORTED, "kfa was built without MPI (KFA_ENABLE_MPI=OFF)");
#endif
  });
}

kfa_status kfa_block_destroy(kfa_block* block) {
  if (block == nullptr) {
    clear_error();
    return KFA_SUCCESS;
  }
  return guarded("kfa_block_destroy", [&] {
    block->fence();
    delete block;
    block_destroyed();
  });
}

kfa_status kfa_block_forward(kfa_block* block, void* stream, kfa_dtype dtype, const void* x,
                             void* y, int64_t batch, int64_t seqlen, int64_t d_model,
                             uint64_t dropout_seed, int32_t training) {
  return guarded("kfa_block_forward", [&] {
    check_block(block);
    check_tokens(block, dtype, "x", x, "y", y, batch, seqlen, d_model);
    block->forward(stream, x, y, batch, seqlen, dropout_seed, training != 0);
  });
}

kfa_status kfa_block_backward(kfa_block* block, void* stream, kfa_dtype dtype, const void* dy,
                              void* dx, int64_t batch, int64_t seqlen, int64_t d_model) {
  return guarded("kfa_block_backward", [&] {
    check_block(block);
    check_tokens(block, dtype, "dy", dy, "dx", dx, batch, seqlen, d_model);
    block->backward(stream, dy, dx, batch, seqlen);
  });
}

kfa_status kfa_block_zero_grad(kfa_block* block, void* stream) {
  return guarded("kfa_block_zero_grad", [&] {
    check_block(block);
    block->zero_grad(stream);
  });
}

kfa_status kfa_block_adamw_step(kfa_block* block, void* stream,
                                const kfa_adamw_options* options) {
  return guarded("kfa_block_adamw_step", [&] {
    check_block(block);
    block->adamw_step(stream, adamw_options(options));
  });
}

kfa_status kfa_block_parameter_count(const kfa_block* block, int32_t* count) {
  return guarded("kfa_block_parameter_count", [&] {
    check_block(block);
    if (count == nullptr) invalid("count must not be NULL");
    *count = block->parameter_count();
  });
}

kfa_status kfa_block_parameter_name(const kfa_block* block, int32_t index, const char** name) {
  return guarded("kfa_block_parameter_name", [&] {
    check_block(block);
    if (name == nullptr) invalid("name must not be NULL");
    if (index < 0 || index >= block->parameter_count()) {
      invalid("index must be in [0, " + std::to_string(block->parameter_count()) + "), got " +
              std::to_string(index));
    }
    *name = block->parameter_name(index);
  });
}

kfa_status kfa_block_parameter(const kfa_block* block, const char* name, void** value,
                               void** grad, int64_t* size) {
  return guarded("kfa_block_parameter", [&] {
    check_block(block);
    if (name == nullptr) invalid("name must not be NULL");
    const int index = block->find(name);
    if (index < 0) {
      std::string names;
      for (int n = 0; n < block->parameter_count(); ++n) {
        names += (n ? ", " : "") + std::string(block->parameter_name(n));
      }
      invalid("name \"" + std::string(name) + "\" is not a parameter of the block (" + names +
              ")");
    }
    block->parameter(index, value, grad, size);
  });
}

}  // extern "C"
