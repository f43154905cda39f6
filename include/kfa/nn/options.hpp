#ifndef KFA_NN_OPTIONS_HPP
#define KFA_NN_OPTIONS_HPP

#include <kfa/options.hpp>
#include <kfa/ring_options.hpp>

#include <cstdint>

namespace kfa {

class RingCommunicator;

namespace nn {

/// LayerNorm and RMSNorm.
struct NormOptions {
  /// Added to the variance (LayerNorm) or the mean square (RMSNorm) before
  /// the square root; PyTorch's default.
  double eps = 1e-5;
};

/// Which pairs of a head's features a rotary embedding rotates together.
enum class RotaryStyle {
  /// Feature j with feature j + rotary_dim/2 (GPT-NeoX, Hugging Face Llama).
  half_split,
  /// Feature 2j with feature 2j + 1 (the RoFormer paper, GPT-J, Meta's Llama).
  interleaved
};

/// Rotary position embeddings: pair j of token position p is rotated by the
/// angle p · base^(-2j / rotary_dim).
struct RotaryOptions {
  RotaryStyle style = RotaryStyle::half_split;
  double base = 10000;
  /// How many leading features of each head rotate (even, <= head_dim); 0
  /// means all of them. The rest pass through unchanged (partial rotary).
  int rotary_dim = 0;
  /// Position of the first token of every sequence (decoding after a cache).
  int position_offset = 0;
};

/// Axial rotary position embeddings of tokens that are the points of a 1D,
/// 2D or 3D grid flattened row-major (the last axis fastest): the rotary
/// features of each head are cut into `axes` equal chunks, and chunk a is a
/// 1D rotary embedding (RotaryOptions' formula with rotary_dim = the chunk's
/// width) of the token's coordinate along axis a.
struct AxialRotaryOptions {
  /// Grid axes: 1, 2 or 3.
  int axes = 2;
  /// Points along each axis (the first `axes` entries); their product is seqlen.
  int extent[3] = {1, 1, 1};
  double base = 10000;
  /// Pairs inside each axis's chunk: (j, j + chunk/2) for half_split,
  /// (2j, 2j + 1) for interleaved (EVA-02, Heo et al.'s RoPE-Axial).
  RotaryStyle style = RotaryStyle::half_split;
  /// Rotated features per head, split evenly between the axes (each share
  /// even); 0 means head_dim. The rest pass through unchanged.
  int rotary_dim = 0;
  /// Coordinate of the View's first point along each axis: a rank's
  /// sub-grid of a larger grid (negative values allowed).
  int offset[3] = {0, 0, 0};
  /// Coordinate scale per axis, angle = scale·(offset + c)·θ: position
  /// interpolation for a grid finer or coarser than the one trained on.
  double scale[3] = {1, 1, 1};
};

/// GELU: x·Φ(x) (erf form, PyTorch's default) or its tanh approximation
/// (GPT-2, PyTorch's approximate="tanh").
enum class GeluApproximation { none, tanh };

struct GeluOptions {
  GeluApproximation approximate = GeluApproximation::none;
};

/// Dropout with a counter-based mask: whether element (row, column) is kept
/// is a pure function of (seed, row, column), so the backward regenerates
/// the forward's mask and every backend draws the same one.
struct DropoutOptions {
  /// Probability of dropping an element, in [0, 1); kept elements are
  /// scaled by 1/(1 - p). 0 turns dropout off.
  double p = 0;
  std::uint64_t seed = 0;
};

/// The normalisation of a transformer block.
enum class Norm { layer_norm, rms_norm };

/// The MLP of a transformer block: Linear → activation → Linear.
enum class Activation {
  /// GELU, erf form.
  gelu,
  /// GELU, tanh approximation.
  gelu_tanh,
  /// SwiGLU: the first projection has 2·d_ff outputs [gate | up], the
  /// activation is silu(gate)·up (Llama's w1 and w3 stacked).
  swiglu
};

/// Sequence parallelism (kfa built with KFA_ENABLE_MPI): every rank of
/// `comm` holds its own contiguous run of tokens of every sequence, the runs
/// in rank order (a near-even split is kfa::ring_local_seqlen's with
/// RingSharding::contiguous; any lengths work). Attention runs as ring
/// attention over `comm`; everything else is per token and stays local.
struct SequenceParallelOptions {
  /// The ranks that share each sequence; null turns the mode off. The caller
  /// keeps it alive while the layer is used.
  const RingCommunicator* comm = nullptr;
  /// How the ring moves K/V blocks (RingOptions::transport).
  RingTransport transport = RingTransport::mpi;
};

/// kfa::nn::MultiHeadAttention (self- or cross-attention).
struct MultiHeadAttentionOptions {
  int d_model = 0;
  /// Features of the memory that cross-attention projects keys and values
  /// from; 0 means d_model. Self-attention needs d_model.
  int d_model_kv = 0;
  /// Query heads.
  int heads = 0;
  /// Key/value heads (grouped-query attention); 0 means `heads`.
  int kv_heads = 0;
  /// Features per head; 0 means d_model / heads.
  int head_dim = 0;
  /// One [(heads + 2·kv_heads)·head_dim][d_model] projection for q, k and v
  /// (PyTorch's in_proj_weight) instead of three; cross-attention multiplies
  /// x by its q rows and the memory by its k|v rows. Needs d_model_kv = d_model.
  bool fused_qkv = true;
  /// Biases on the q/k/v projections and on the output projection.
  bool bias = true;
  /// Rotary embeddings on q and k.
  bool rotary = false;
  RotaryOptions rotary_options;
  /// Axial rotary embeddings on q and k instead (kfa::nn::axial_rotary_forward):
  /// the tokens of every sequence are the points of the grid
  /// axial_rotary_options.extent flattened row-major, so seqlen (and a
  /// cross-attention memory's seqlen_kv, and every sequence of a packed batch)
  /// must be its number of points; the whole sequence in the sequence-parallel
  /// mode. Not with rotary or alibi.
  bool axial_rotary = false;
  AxialRotaryOptions axial_rotary_options;
  /// RMSNorm on every head of q and of k, before the rotary embedding
  /// ("qk-norm", Qwen3's q_norm and k_norm): one learnable weight [head_dim]
  /// for q and one for k, each shared by all heads.
  bool qk_norm = false;
  /// eps of the qk-norm (Qwen3 checkpoints use 1e-6).
  NormOptions qk_norm_options;
  /// ALiBi on the scores (kfa::alibi with kfa::nn::alibi_slopes(heads)):
  /// score - slope(head)·|i + seqlen_k - seqlen_q - j|. It replaces position
  /// embeddings: not with rotary.
  bool alibi = false;
  /// Passed to kfa::flash_attention_forward/backward: causal, window,
  /// softcap, softmax_scale, dropout_p (the seed comes from the context).
  AttentionOptions attention;
  /// Seed of the host generator that initialises the weights.
  std::uint64_t init_seed = 0;
  /// Recomputation (activation checkpointing): the forward keeps only
  /// references to its inputs and frees the rest; the backward first
  /// recomputes projections, norms, rotations and the attention output.
  /// Bitwise the same results, less memory between forward and backward,
  /// one more forward's work.
  bool recompute = false;
  /// Sequence-parallel mode (off by default). Rotary positions and causal
  /// masks are then global; attention.window_left/right and dropout_p must
  /// stay off, as in ring attention.
  SequenceParallelOptions sequence_parallel;
  /// kfa::half and kfa::bfloat16 layers: accumulate the parameter gradients
  /// in fp32 Views (grads_fp32(), Parameter::grad_fp32) instead of T, for
  /// training with fp32 master weights (AdamWOptions::fp32_master_weights).
  /// No effect for double and float.
  bool fp32_gradients = false;
};

/// kfa::nn::TransformerBlock: x + attn(norm1(x)), then + mlp(norm2(·)).
struct TransformerBlockOptions {
  /// d_model, heads, kv_heads, head_dim, projections, rotary and attention
  /// options of the block's attention; its bias is the block's bias.
  MultiHeadAttentionOptions attention;
  /// Hidden features of the MLP.
  int d_ff = 0;
  Norm norm = Norm::layer_norm;
  NormOptions norm_options;
  Activation activation = Activation::gelu;
  /// Biases on every linear layer and, for LayerNorm, the norms' shifts.
  bool bias = true;
  /// Dropout where torch.nn.TransformerEncoderLayer has it: on the attention
  /// output before its residual, after the MLP's activation, and on the MLP
  /// output before its residual (attention-weight dropout is
  /// attention.attention.dropout_p).
  double dropout_p = 0;
  /// Seed of the host generator that initialises the weights.
  std::uint64_t init_seed = 0;
  /// Recomputation for the whole block (see MultiHeadAttentionOptions::
  /// recompute): the forward keeps only x, the backward reruns the block's
  /// forward first. attention.recompute means the same in a block.
  bool recompute = false;
  /// fp32 parameter gradients for every parameter of the block, its
  /// attention's included (see MultiHeadAttentionOptions::fp32_gradients,
  /// which the block sets from this).
  bool fp32_gradients = false;
};

/// kfa::nn::TransformerDecoderBlock: x + self_attn(norm1(x)), then +
/// cross_attn(norm2(·), memory), then + mlp(norm3(·)).
struct TransformerDecoderBlockOptions {
  /// The self-attention on the target (d_model, heads, kv_heads, head_dim,
  /// projections, rotary and attention options); its bias is the block's.
  MultiHeadAttentionOptions self_attention;
  /// The cross-attention on the memory: d_model and heads 0 take the
  /// self-attention's (d_model must be the same); d_model_kv is the
  /// memory's features (0: d_model; another width needs fused_qkv = false).
  /// Its bias is the block's.
  MultiHeadAttentionOptions cross_attention;
  /// Causal self-attention (target token i sees tokens <= i), the usual
  /// decoder; turns self_attention.attention.causal on. false, with that
  /// left off, is PyTorch's default (no target mask).
  bool causal = true;
  /// Hidden features of the MLP.
  int d_ff = 0;
  Norm norm = Norm::layer_norm;
  NormOptions norm_options;
  Activation activation = Activation::gelu;
  /// Biases on every linear layer and, for LayerNorm, the norms' shifts.
  bool bias = true;
  /// Dropout where torch.nn.TransformerDecoderLayer has it: on each
  /// attention's output before its residual, after the MLP's activation,
  /// and on the MLP output before its residual (attention-weight dropout is
  /// each attention's attention.dropout_p).
  double dropout_p = 0;
  /// Seed of the host generator that initialises the MLP's weights (the
  /// attentions have their own init_seed).
  std::uint64_t init_seed = 0;
  /// Recomputation for the whole block (see TransformerBlockOptions::
  /// recompute); either attention's recompute means the same.
  bool recompute = false;
  /// fp32 parameter gradients for every parameter of the block, its
  /// attentions' included.
  bool fp32_gradients = false;
};

/// kfa::nn::AdamW (PyTorch's torch.optim.AdamW).
struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  /// Decoupled weight decay: the parameter is first multiplied by
  /// 1 - lr·weight_decay.
  double weight_decay = 1e-2;
  /// kfa::nn::AdamW of kfa::half or kfa::bfloat16 parameters: keep an fp32
  /// master copy of each parameter, update it and round it into the
  /// parameter after every step (no effect for double and float).
  bool fp32_master_weights = false;
};

}  // namespace nn
}  // namespace kfa

#endif
