// model/weights.h — a model's weights in one canonical layout, whatever the checkpoint format:
// matrices [out, in] row-major (torch Linear), fused QKV and gate/up, host memory. Backends
// take these and place them on their device. Binding checks every tensor's presence, dtype and
// shape against the spec, and reports the tensor and the expected shape when they disagree.
#pragma once

#include "core/tensor.h"
#include "model/spec.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

namespace splitflow {

class WeightSource;

// q_dim = num_heads*head_dim, kv_dim = num_kv_heads*head_dim. Empty tensors are absent modules.
struct LayerWeights {
  Tensor attn_norm, attn_norm_bias;   // (hidden)
  Tensor wqkv, bqkv;                  // (q_dim + 2*kv_dim, hidden): q rows, then k rows, then v rows
  Tensor wo, bo;                      // (hidden, q_dim)
  Tensor ffn_norm, ffn_norm_bias;     // (hidden); absent with shared_layer_norm
  Tensor w_gate_up, b_gate_up;        // gated: (2*inter, hidden), gate rows then up rows; else (inter, hidden)
  Tensor w_down, b_down;              // (hidden, inter)
  Tensor q_norm, k_norm;              // (head_dim), attention.qk_norm: one weight for every q / k head
  Tensor post_attn_norm, post_ffn_norm;  // (hidden), post_norms
  // encoder_decoder decoders: cross-attention over the encoder's states.
  Tensor cross_attn_norm, cross_attn_norm_bias;  // (hidden)
  Tensor w_cross_q, b_cross_q;        // (q_dim, hidden)
  Tensor w_cross_kv, b_cross_kv;      // (2*kv_dim, hidden): k rows, then v rows (applied to encoder states)
  Tensor w_cross_o, b_cross_o;        // (hidden, q_dim)
};

struct ModelWeights {
  Tensor embed;                       // (vocab, hidden)
  // (max_position, hidden), learned absolute positions only: row p is what position p adds, so a
  // checkpoint's table is read from row position_offset on (RoBERTa), and with token_types > 0
  // token type 0's embedding is added to every row (F32 then; every token has type 0).
  Tensor pos_embed;
  Tensor embed_norm, embed_norm_bias; // (hidden), embedding_norm
  Tensor final_norm, final_norm_bias; // (hidden); absent in encoders without a final norm
  Tensor lm_head;                     // (vocab, hidden); shares embed's storage when tied; absent in encoders
  Tensor relative_bias;               // (num_buckets, num_heads) F32, position relative
  Tensor logits_bias;                 // (vocab) F32, added to the logits (tensors.logits_bias); usually absent
  std::vector<LayerWeights> layers;
  // encoder_decoder: the encoder stack's weights (its spec: ModelSpec::encoder_spec()).
  std::shared_ptr<ModelWeights> encoder;
};

// Quantizes a float matrix for --quantization (`type` a quantized dtype). Empty: quant::quantize on
// the host. A backend may give its own that writes the same bytes (quantize_matrix_on_cuda in
// backend/backend.h: the arithmetic in device memory).
using MatrixQuantizer = std::function<Tensor(const Tensor& matrix, DType type)>;

// Matrices (embed, lm_head, projections) are converted to `matrix_dtype` (F32, F16 or BF16);
// norms and biases are always F32. Quantized checkpoint matrices (core/dtype.h) stay packed as
// stored (views of the file, scales checked by quant::validate): fused QKV / gate-up concatenate
// the parts' packed rows, a DType::Mixed matrix with row runs when the parts' types differ (plain
// parts then in matrix_dtype); a quantized tensor stored transposed is an error. `quantization`
// (--quantization) quantizes the float projection matrices, and an untied lm_head, to that type
// while binding (`quantizer`, else quant::quantize); the embedding stays as it is. Q/K rows stay as stored: the spec's rope.style says how the
// checkpoint pairs them (Half for HF, Interleaved for Meta/llama2.c/GGUF layouts).
// A tensor that needs no conversion, transposition or fusion stays a view into the source's
// mapped file (read-only memory; the view keeps the mapping alive). Errors name the tensor, the
// spec field that produced its name and the expected shape; checkpoint tensors no field uses are
// reported with spdlog::warn.
ModelWeights bind_weights(const ModelSpec& spec, const WeightSource& source, DType matrix_dtype,
                          std::optional<DType> quantization = std::nullopt, const MatrixQuantizer& quantizer = {});

// Seeded random weights of the spec's shapes (close to normal, std 0.02, biases too; norms 1,
// norm biases 0), so any shape can be run and timed without a checkpoint. Matrices and biases are
// generated tensors (core/tensor.h): a backend's upload() fills them where they live (the CUDA
// backend on the GPU, in milliseconds), materialize() gives them on the host. Deterministic for a
// given seed, whatever the thread count or device.
// `quantization` quantizes the projections (and an untied lm_head) as bind_weights does.
ModelWeights make_dummy_weights(const ModelSpec& spec, DType matrix_dtype, uint64_t seed,
                                std::optional<DType> quantization = std::nullopt,
                                const MatrixQuantizer& quantizer = {});

// "q4_0, q4_1, ...": every quantized type's name, for messages and --help.
std::string quantized_type_names();

}  // namespace splitflow
