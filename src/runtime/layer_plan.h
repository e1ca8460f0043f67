// runtime/layer_plan.h — the steps of one decoder layer, chosen from spec fields alone
// (parallel_residual, shared_layer_norm, position type, biases); no architecture name appears.
// Every layer runs the same plan with its own weights; ModelRunner executes it on a Backend.
//
// Sequential residual (Llama, Mistral, Qwen2, GPT-2, Phi-3):
//   attn_in = norm(hidden); qkv = attn_in Wqkv^T; rope; write kv; attn_out = attention(qkv)
//   hidden += attn_out Wo^T; mlp_in = norm(hidden)
//   mlp_act = act(mlp_in Wgu^T) (through mlp_up); hidden += mlp_act Wd^T
// QK-norm (Qwen 3, Gemma 3): the projection, the per-head norm of q and k, then RoPE and the KV
// write, as separate steps (attn_in = norm(hidden) first).
// Post norms (Gemma 2/3): each output projection goes to `proj` without accumulating, and
// hidden += post_norm(proj) (norm_add) is the residual add.
// Parallel residual (GPT-NeoX, Falcon): hidden += attention(norm1(hidden)) + mlp(norm2(hidden)),
// with norm2 = norm1 when shared_layer_norm.
// Encoder-decoder decoders (T5): after the self-attention's residual add, a cross-attention block
//   cross_in = norm(hidden); cross_q = cross_in Wq^T; attn_out = cross_attention(cross_q) over
//   the sequence's encoder K/V (written once per sequence by ModelRunner::write_encoder_kv);
//   hidden += attn_out Wo^T; then the MLP as above. Post-norm (BART): hidden = norm(hidden +
//   cross_attention(hidden Wq^T) Wo^T) between the attention's and the MLP's post-norms.
// Post-norm (norm.placement post: BERT, RoBERTa): hidden = norm(hidden + attention(hidden)), then
// hidden = norm(hidden + mlp(hidden)); each norm runs in place on hidden.
// The residual adds are the output projections' epilogues (Linear with accumulate): no separate
// add over the residual stream.
#pragma once

#include "model/spec.h"

#include <cstdint>
#include <string>
#include <vector>

namespace splitflow {

// Activation buffers a step reads or writes; shapes for T tokens.
enum class Slot : uint8_t {
  None,
  Hidden,    // [T, hidden] the residual stream
  AttnIn,    // [T, hidden] normed input of attention
  MlpIn,     // [T, hidden] normed input of the MLP
  Qkv,       // [T, q_dim + 2 kv_dim]
  AttnOut,   // [T, q_dim]
  MlpUp,     // [T, 2 * inter] gated (gate columns, then up), [T, inter] otherwise
  MlpAct,    // [T, inter]
  Proj,      // [T, hidden] an output projection before its post-norm (post_norms)
  CrossQ,    // [T, q_dim] encoder_decoder: the cross-attention's queries
};

// PositionBias: the model's relative position bias table (shared by the layers), on an Attention step.
enum class LayerWeight : uint8_t { None, AttnNorm, FfnNorm, Qkv, Output, GateUp, Down, QkNorm, PostAttnNorm, PostFfnNorm,
                                   CrossAttnNorm, CrossQ, CrossOutput, PositionBias };

enum class StepKind : uint8_t {
  Norm,        // output = norm(input) with weight
  Linear,      // output = input W^T (+ bias); with accumulate, output += input W^T (+ bias)
  // Linear into output, then rotate its q and k heads in place and store its k and v heads in the cache
  LinearRopeWriteKv,
  WriteKv,     // store input's k and v heads in this layer's paged cache (no RoPE)
  Attention,   // output = paged attention of input's q heads (weight PositionBias: plus T5's relative bias)
  // output = attention of input's queries [T, q_dim] over the sequence's encoder K/V (encoder_decoder)
  CrossAttention,
  LinearActivation,  // product = input W^T (+ bias); output = act(product) (gated: act(gate) * up)
  QkNorm,      // per-head norm of input's q and k heads in place (weight QkNorm: q_norm and k_norm)
  RopeWriteKv,  // rotate input's q and k heads in place, store its k and v heads in the cache
  NormAdd,     // output += norm(input) with weight (a post-norm residual add)
  // Tensor parallelism (parallel/tensor_parallel.h): input summed over the ranks, into output
  // (output += sum) when output differs from input, else in place.
  Allreduce,
};

struct PlanStep {
  StepKind kind;
  Slot input = Slot::None;
  Slot output = Slot::None;
  LayerWeight weight = LayerWeight::None;
  bool bias = false;  // the weight has a bias (LayerNorm bias, projection bias)
  bool accumulate = false;  // Linear: add the product to the output (the residual add)
  Slot product = Slot::None;  // LinearActivation: the product before the activation (a fusing backend skips it)
  // LinearRopeWriteKv, LinearActivation: the input is normalized with this weight first, into
  // `normed` (a backend that fuses the norm into the product leaves it unwritten).
  LayerWeight norm = LayerWeight::None;
  bool norm_bias = false;  // the norm has a bias (LayerNorm)
  Slot normed = Slot::None;
};

struct LayerPlan {
  std::vector<PlanStep> steps;
  // One step per line, e.g. "linear qkv+bias: attn_in -> qkv"; "->+" marks an accumulating output.
  std::string describe() const;
};

// Throws splitflow::Error naming the spec field when the combination cannot run (e.g.
// shared_layer_norm without parallel_residual).
LayerPlan build_layer_plan(const ModelSpec& spec);

std::string_view slot_name(Slot slot);
std::string_view layer_weight_name(LayerWeight weight);

}  // namespace splitflow
