/* kfa's C interface (link kfa::kfa_c): attention forward/backward and the
 * TransformerBlock layer on raw pointers, for C, Fortran (fortran/kfa.f90)
 * and other languages that cannot instantiate C++ templates. docs/c_fortran.md
 * is the guide.
 *
 * Tensors are dense row-major arrays (C order; the first index varies
 * slowest) in the memory of the execution space named by `kfa_space`:
 * KFA_SPACE_DEFAULT is Kokkos' default execution space (device memory on a
 * CUDA build), KFA_SPACE_HOST its host space (host memory). `stream` is a
 * cudaStream_t for KFA_SPACE_DEFAULT on a CUDA build (NULL: Kokkos' default
 * instance); other spaces ignore it. Work is enqueued on it, not waited
 * for: kfa_fence waits.
 *
 * Every function returns a kfa_status; on failure kfa_last_error() gives a
 * message naming the function and the argument, and nothing was written to
 * the outputs. No C++ exception crosses this interface. */
#ifndef KFA_C_API_H
#define KFA_C_API_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum kfa_status {
  KFA_SUCCESS = 0,
  /* A null pointer, a negative or inconsistent size, a bad option. */
  KFA_ERROR_INVALID_ARGUMENT = 1,
  /* A dtype or space this build or this call does not provide. */
  KFA_ERROR_UNSUPPORTED = 2,
  /* Kokkos is not initialised (kfa_initialize, or the caller's own). */
  KFA_ERROR_NOT_INITIALIZED = 3,
  /* kfa_finalize while blocks are alive, or kfa_initialize after it. */
  KFA_ERROR_INVALID_STATE = 4,
  /* Anything else the library reported (out of memory, a Kokkos error). */
  KFA_ERROR_INTERNAL = 5
} kfa_status;

/* Element types. lse is double for KFA_F64 and float for the others. */
typedef enum kfa_dtype { KFA_F64 = 0, KFA_F32 = 1, KFA_BF16 = 2, KFA_F16 = 3 } kfa_dtype;

/* Where the pointers live and the work runs (see the top of this file). */
typedef enum kfa_space { KFA_SPACE_DEFAULT = 0, KFA_SPACE_HOST = 1 } kfa_space;

/* The message of the last failed call on this thread ("" after a success).
 * Valid until the next kfa call on this thread. */
const char* kfa_last_error(void);

/* Initialises Kokkos unless the caller has already done so (Kokkos' default
 * arguments: OMP_NUM_THREADS, the default device). kfa_finalize finalises it
 * only when kfa_initialize did, and refuses while blocks are alive. Callers
 * that initialise Kokkos themselves need neither. */
kfa_status kfa_initialize(void);
kfa_status kfa_finalize(void);
/* Waits for the work enqueued on `stream` of `space`. */
kfa_status kfa_fence(kfa_space space, void* stream);

/* ------------------------------------------------------------------------
 * Attention: kfa::flash_attention_forward / backward.
 *   q, o, d_o, dq [batch][seqlen_q][heads][head_dim]
 *   k, v, dk, dv  [batch][seqlen_k][kv_heads][head_dim]
 *   lse           [batch][heads][seqlen_q]   (double for KFA_F64, else float)
 * heads a multiple of kv_heads, head_dim 1..256. */

/* kfa::AttentionOptions' plain fields; kfa_attention_options_default fills
 * the C++ defaults. */
typedef struct kfa_attention_options {
  /* 0 means 1/sqrt(head_dim). */
  double softmax_scale;
  /* Booleans (0 or 1). causal is bottom-right aligned. */
  int32_t causal;
  int32_t deterministic;
  /* Sliding window; -1 leaves a side unbounded. */
  int32_t window_left;
  int32_t window_right;
  /* 0 turns it off. */
  double softcap;
  /* Dropout on the attention weights, p in [0, 1). */
  double dropout_p;
  uint64_t dropout_seed;
} kfa_attention_options;

void kfa_attention_options_default(kfa_attention_options* options);

/* options NULL: the defaults. */
kfa_status kfa_attention_forward(kfa_space space, void* stream, kfa_dtype dtype, const void* q,
                                 const void* k, const void* v, void* o, void* lse,
                                 int64_t batch, int64_t seqlen_q, int64_t seqlen_k,
                                 int64_t heads, int64_t kv_heads, int64_t head_dim,
                                 const kfa_attention_options* options);

/* o and lse from the forward with the same inputs and options. */
kfa_status kfa_attention_backward(kfa_space space, void* stream, kfa_dtype dtype,
                                  const void* q, const void* k, const void* v, const void* o,
                                  const void* lse, const void* d_o, void* dq, void* dk,
                                  void* dv, int64_t batch, int64_t seqlen_q, int64_t seqlen_k,
                                  int64_t heads, int64_t kv_heads, int64_t head_dim,
                                  const kfa_attention_options* options);

/* ------------------------------------------------------------------------
 * kfa::nn::TransformerBlock (docs/layers.md): a pre-norm block with its
 * parameters, gradients, the context of its last forward, and an AdamW
 * optimiser. dtype KFA_F32 or KFA_F64. One handle is used by one thread at
 * a time. */

typedef enum kfa_norm { KFA_LAYER_NORM = 0, KFA_RMS_NORM = 1 } kfa_norm;
typedef enum kfa_activation {
  KFA_GELU = 0,
  KFA_GELU_TANH = 1,
  /* linear1 has 2·d_ff rows: gate, then up. */
  KFA_SWIGLU = 2
} kfa_activation;
typedef enum kfa_rotary_style { KFA_ROTARY_HALF_SPLIT = 0, KFA_ROTARY_INTERLEAVED = 1 } kfa_rotary_style;

/* kfa::nn::TransformerBlockOptions; kfa_block_options_default fills the C++
 * defaults (d_model, heads and d_ff must then be set). */
typedef struct kfa_block_options {
  int32_t d_model;
  int32_t heads;
  /* 0: heads. */
  int32_t kv_heads;
  /* 0: d_model / heads. */
  int32_t head_dim;
  int32_t d_ff;
  /* kfa_norm, kfa_activation. */
  int32_t norm;
  int32_t activation;
  /* Booleans: biases on every linear layer and LayerNorm's shifts; one
   * fused q|k|v projection; rotary embeddings on q and k. */
  int32_t bias;
  int32_t fused_qkv;
  int32_t rotary;
  /* kfa_rotary_style; rotary_dim 0: head_dim. */
  int32_t rotary_style;
  int32_t rotary_dim;
  int32_t rotary_position_offset;
  /* Keeps the doubles 8-byte aligned in every language's view; unused. */
  int32_t reserved;
  double rotary_base;
  double norm_eps;
  /* Dropout where torch.nn.TransformerEncoderLayer has it. */
  double dropout_p;
  /* Seed of the weights' initialisation. */
  uint64_t init_seed;
  /* The attention's options; its dropout_seed is ignored (each forward
   * takes its own). */
  kfa_attention_options attention;
} kfa_block_options;

/* kfa::nn::AdamWOptions. */
typedef struct kfa_adamw_options {
  double lr;
  double beta1;
  double beta2;
  double eps;
  double weight_decay;
} kfa_adamw_options;

typedef struct kfa_block kfa_block;

void kfa_block_options_default(kfa_block_options* options);
void kfa_adamw_options_default(kfa_adamw_options* options);

/* Allocates the block (parameters initialised as in C++) in `space`'s
 * memory; *block is set on success only. */
kfa_status kfa_block_create(const kfa_block_options* options, kfa_dtype dtype, kfa_space space,
                            kfa_block** block);
/* NULL is allowed. Waits for the block's pending work before freeing. */
kfa_status kfa_block_destroy(kfa_block* block);

/* y = block(x), x and y [batch][seqlen][d_model] of the block's dtype.
 * The block keeps a reference to x for the backward: do not change x
 * before it. training 0 turns dropout off; dropout_seed seeds this step's
 * dropout masks. */
kfa_status kfa_block_forward(kfa_block* block, void* stream, kfa_dtype dtype, const void* x,
                             void* y, int64_t batch, int64_t seqlen, int64_t d_model,
                             uint64_t dropout_seed, int32_t training);
/* Backward of the last forward: dx overwritten, parameter gradients
 * accumulated (kfa_block_zero_grad resets them). */
kfa_status kfa_block_backward(kfa_block* block, void* stream, kfa_dtype dtype, const void* dy,
                              void* dx, int64_t batch, int64_t seqlen, int64_t d_model);
kfa_status kfa_block_zero_grad(kfa_block* block, void* stream);
/* One AdamW step on every parameter (moments kept in the block; the step
 * count starts at 1). options NULL: the defaults. */
kfa_status kfa_block_adamw_step(kfa_block* block, void* stream,
                                const kfa_adamw_options* options);

/* Parameters, named as torch.nn.TransformerEncoderLayer's
 * ("self_attn.in_proj_weight", "linear1.weight", "norm2.bias", ...). */
kfa_status kfa_block_parameter_count(const kfa_block* block, int32_t* count);
/* The name of parameter `index` (0-based); valid while the block lives. */
kfa_status kfa_block_parameter_name(const kfa_block* block, int32_t index, const char** name);
/* The parameter's values and gradient (row-major, `size` elements of the
 * block's dtype, in the block's memory space); valid while the block lives.
 * value or grad may be NULL when not wanted. */
kfa_status kfa_block_parameter(const kfa_block* block, const char* name, void** value,
                               void** grad, int64_t* size);

/* ------------------------------------------------------------------------
 * MPI: the sequence-parallel mode and gradient reduction of docs/layers.md
 * ("Training over MPI ranks"). kfa built with KFA_ENABLE_MPI (else these
 * return KFA_ERROR_UNSUPPORTED); MPI initialised by the caller. A
 * communicator is passed as its Fortran handle, an MPI_Fint (int in Open MPI
 * and MPICH), so that this header needs no mpi.h: Fortran's integer
 * communicator (`use mpi`), comm%MPI_VAL (`use mpi_f08`), or from C
 * MPI_Comm_c2f(comm). kfa converts it with MPI_Comm_f2c. */

/* A block in the sequence-parallel mode: every rank of comm holds its own
 * contiguous run of tokens of every sequence, the runs in rank order
 * (kfa_block_forward/backward take this rank's [batch][seqlen_local]
 * [d_model]), and the attention runs as ring attention over comm; rotary
 * positions and causal masks are global. Collective over comm: every rank
 * creates it with the same options (the same init_seed gives the same
 * weights), and its forward, backward and kfa_block_destroy are collective
 * too. The block keeps its own duplicate of comm. Parameter gradients are
 * this rank's part of the sum over all tokens: reduce them with
 * kfa_block_allreduce_gradients(..., KFA_GRADIENT_SUM, ...) before a step.
 * options->attention must have no window and no dropout. */
kfa_status kfa_block_create_sequence_parallel(const kfa_block_options* options, kfa_dtype dtype,
                                              kfa_space space, int32_t comm, kfa_block** block);

typedef enum kfa_gradient_reduction {
  /* The mean over the ranks: data parallelism. */
  KFA_GRADIENT_MEAN = 0,
  /* The sum: the sequence-parallel mode. */
  KFA_GRADIENT_SUM = 1
} kfa_gradient_reduction;

/* Replaces every parameter gradient of the block by its mean or sum over
 * the ranks of comm (kfa::nn::allreduce_gradients, one MPI_Allreduce).
 * deterministic 1 adds the ranks' gradients in rank order, bitwise the same
 * on every rank. Collective over comm: every rank passes a block of the
 * same options. Fences `stream` (MPI reads the gradients). */
kfa_status kfa_block_allreduce_gradients(kfa_block* block, void* stream, int32_t comm,
                                         int32_t reduction, int32_t deterministic);

#ifdef __cplusplus
}
#endif

#endif
