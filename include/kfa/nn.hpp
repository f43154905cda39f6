#ifndef KFA_NN_HPP
#define KFA_NN_HPP

// kfa::nn: transformer layers on Kokkos Views. Stateless forward/backward
// steps (linear, norms, rotary embeddings, activations, dropout, AdamW) and
// the layer objects built on them (MultiHeadAttention, TransformerBlock,
// TransformerDecoderBlock), and their weights in the safetensors format;
// with MPI, gradient averaging over ranks and the layers' sequence-parallel
// mode.

#include <kfa/kfa_config.hpp>
#include <kfa/nn/activation.hpp>
#include <kfa/nn/adamw.hpp>
#include <kfa/nn/dropout.hpp>
#include <kfa/nn/grid.hpp>
#include <kfa/nn/linear.hpp>
#include <kfa/nn/multi_head_attention.hpp>
#include <kfa/nn/norm.hpp>
#include <kfa/nn/options.hpp>
#include <kfa/nn/parameter.hpp>
#include <kfa/nn/rotary.hpp>
#include <kfa/nn/transformer_block.hpp>
#include <kfa/nn/transformer_decoder_block.hpp>
#if KFA_ENABLE_SAFETENSORS
#include <kfa/nn/safetensors.hpp>
#endif

#if KFA_ENABLE_MPI
#include <kfa/nn/distributed.hpp>
#include <kfa/ring_communicator.hpp>
#endif

#endif
