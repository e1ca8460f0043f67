// model/spec.h — a model as data: the atomic modules a network is built from (Inferflow §2).
// A spec comes from a JSON file (models/*.json templates resolved against a HF config.json or
// GGUF metadata, or a hand-written spec), and it alone decides the layer plan and the tensor
// names. No code outside the spec templates knows an architecture name.
#pragma once

#include "core/error.h"

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

namespace splitflow {

enum class NetworkType { DecoderOnly, EncoderOnly, EncoderDecoder };
enum class NormType { RMSNorm, LayerNorm };
enum class Activation { SiLU, GELU, GELUTanh, ReLU };
// Relative: no absolute positions; each attention score gets a learned bias per head and bucket of
// the key's distance from the query (T5, relative_attention).
enum class PositionType { Rope, Learned, Sinusoidal, ALiBi, None, Relative };
// Where position sinusoidal puts the sine and cosine of frequency i = 10000^(-2i/d):
// interleaved ("Attention is all you need": PE[p, 2i] = sin, PE[p, 2i+1] = cos) or halves
// (HF Marian: sin in columns [0, d/2), cos in [d/2, d)).
enum class SinusoidLayout { Interleaved, Halves };
// Which elements RoPE rotates together: Half pairs x[i] with x[i + rot/2] (GPT-NeoX, HF Llama),
// Interleaved pairs x[2i] with x[2i+1] (GPT-J, Meta/llama2.c/GGUF Llama layout).
enum class RopeStyle { Half, Interleaved };
// FreqFactors: llama.cpp's per-pair divisors of the base frequencies (a GGUF rope_freqs tensor).
enum class RopeScalingType { None, Linear, DynamicNTK, YaRN, Llama3, LongRope, FreqFactors };
// How a fused QKV weight stacks its rows: Concat = [q rows; k rows; v rows] (Phi-3, GPT-2, Falcon
// with GQA groups excluded); PerHead = for each head [q; k; v] of head_dim rows (GPT-NeoX, MHA only).
enum class QkvLayout { Separate, Concat, PerHead };
// What one layer's attention sees: Full = every earlier position, Sliding = the last sliding_window.
enum class LayerAttention { Full, Sliding };
// Where a layer's norms sit: Pre = x + f(norm(x)) (GPT-2 onwards); Post = norm(x + f(x)) (the
// original Transformer, BERT, RoBERTa).
enum class NormPlacement { Pre, Post };
// How an encoder's token states become one vector (sentence-transformers' Pooling modes): Cls =
// the first token's state, Mean = the average over the sequence, Last = the last token's state.
enum class Pooling { Cls, Mean, Last };

struct RopeScaling {
  RopeScalingType type = RopeScalingType::None;
  double factor = 1.0;
  int original_max_position = 0;     // llama3, yarn, dynamic, longrope
  double low_freq_factor = 1.0;      // llama3
  double high_freq_factor = 4.0;     // llama3
  double beta_fast = 32.0;           // yarn
  double beta_slow = 1.0;            // yarn
  double mscale = 1.0;               // yarn (DeepSeek variant: mscale / mscale_all_dim)
  double mscale_all_dim = 0.0;       // yarn
  std::optional<double> attention_factor;  // yarn / longrope: overrides the derived scale
  std::vector<double> long_factor;   // longrope, rotary_dim/2 entries
  std::vector<double> short_factor;  // longrope
  std::vector<double> freq_factors;  // freq_factors, rotary_dim/2 entries: pair i turns at inv_freq[i] / freq_factors[i]

  bool operator==(const RopeScaling&) const = default;
};

// The base and scaling of the sliding-window layers' RoPE where they differ from the full-attention
// layers' (Gemma 3: local layers turn at base 10000 without scaling, global ones at 1e6, scaled).
struct SlidingRope {
  double theta = 10000.0;
  RopeScaling scaling;  // none unless given

  bool operator==(const SlidingRope&) const = default;
};

struct RopeSpec {
  double theta = 10000.0;
  double partial_factor = 1.0;  // rotary_dim = head_dim * partial_factor (rounded down to even)
  RopeStyle style = RopeStyle::Half;
  RopeScaling scaling;
  std::optional<SlidingRope> sliding;  // unset: sliding-window layers use theta and scaling above

  bool operator==(const RopeSpec&) const = default;
};

struct NormSpec {
  NormType type = NormType::RMSNorm;
  double eps = 1e-5;
  bool bias = false;            // LayerNorm with a bias tensor
  double weight_offset = 0.0;   // y = x_hat * (offset + w); Gemma uses 1
  NormPlacement placement = NormPlacement::Pre;

  bool operator==(const NormSpec&) const = default;
};

struct AttentionSpec {
  int num_heads = 0;
  int num_kv_heads = 0;   // < num_heads: grouped-query; 1: multi-query
  int head_dim = 0;
  bool q_bias = false, k_bias = false, v_bias = false, o_bias = false;
  int sliding_window = 0;  // 0: full causal attention; W: each query sees the last W positions
  // Which layers slide (with sliding_window > 0; layer_attention() resolves them): layer_types, one
  // per layer, when given; else with full_attention_interval N > 0 layers N-1, 2N-1, ... attend
  // fully and the rest slide (Gemma 3: 6); else every layer slides.
  std::vector<LayerAttention> layer_types;
  int full_attention_interval = 0;
  double softmax_scale = 0.0;  // 0: 1/sqrt(head_dim)
  double logit_softcap = 0.0;  // > 0: scores become cap * tanh(score / cap) before the softmax (Gemma 2)
  // Per-head RMSNorm (norm.eps, norm.weight_offset) of every q and k head before RoPE, with the
  // weights q_norm and k_norm [head_dim] (Qwen 3, Gemma 3).
  bool qk_norm = false;
  QkvLayout qkv_layout = QkvLayout::Separate;
  // false: every token sees the whole sequence (encoders); the sequence must then run in one
  // forward (no chunked prefill, no decode). Decoder-only models are causal.
  bool causal = true;

  bool operator==(const AttentionSpec&) const = default;
};

struct MlpSpec {
  int intermediate_size = 0;
  Activation activation = Activation::SiLU;
  bool gated = true;            // act(gate(x)) * up(x), else act(up(x))
  bool gate_up_fused = false;   // one [2*intermediate, hidden] tensor: gate rows then up rows
  bool up_bias = false, down_bias = false;  // gate has a bias iff up does

  bool operator==(const MlpSpec&) const = default;
};

// Tensor names with "{layer}" standing for the layer index. Every entry names the weight tensor
// without its suffix; ".weight" / ".bias" are appended (weight_suffix / bias_suffix).
// An empty name means the module is absent. A name may list alternatives separated by '|'
// ("embed_out|lm_head"): the first one the checkpoint has is used.
struct TensorNames {
  std::string weight_suffix = ".weight";
  std::string bias_suffix = ".bias";
  // Tried in order in front of every name; the first that names a checkpoint tensor wins
  // (GPT-2 checkpoints exist with and without a "transformer." prefix).
  std::vector<std::string> name_prefixes = {""};
  bool linear_transposed = false;  // projections stored [in, out] (GPT-2 Conv1D) rather than [out, in]
  bool lm_head_optional = false;   // a missing lm_head tensor means lm_head = embed (GGUF drops it when tied)
  // Name prefixes (after a name_prefixes entry) of checkpoint tensors the model leaves unused on
  // purpose, so loading does not warn about them: task heads an encoder does not run ("pooler.").
  std::vector<std::string> unused_prefixes;
  std::string embed, pos_embed, final_norm, lm_head;
  std::string attn_norm, q, k, v, qkv, o;
  std::string ffn_norm, gate, up, gate_up, down;
  std::string q_norm, k_norm;                // attention.qk_norm
  std::string post_attn_norm, post_ffn_norm; // post_norms
  std::string embed_norm;                    // embedding_norm
  std::string token_type_embed;              // token_types > 0
  std::string relative_bias;                 // position relative: [num_buckets, num_heads], shared by the layers
  // A full tensor name (no suffix appended): (vocab) or (1, vocab) added to the logits (Marian's
  // final_logits_bias).
  std::string logits_bias;
  // encoder_decoder: each decoder layer's cross-attention over the encoder's states, between its
  // self-attention and its MLP: norm, query, key and value (of the encoder states) and output.
  std::string cross_attn_norm, cross_q, cross_k, cross_v, cross_o;

  bool operator==(const TensorNames&) const = default;
};

// What an encoder-only model returns for a sequence (its embedding), as sentence-transformers'
// modules.json / 1_Pooling/config.json / sentence_bert_config.json declare it.
struct EmbeddingSpec {
  Pooling pooling = Pooling::Cls;
  bool normalize = false;    // L2-normalize the pooled vector (a sentence_transformers Normalize module)
  int max_tokens = 0;        // inputs are truncated to this many tokens, specials included; 0: max_position
  // Matryoshka-trained: a request may ask for fewer dimensions (the first d, renormalized).
  bool matryoshka = false;

  bool operator==(const EmbeddingSpec&) const = default;
};

// T5's relative position buckets (transformers' _relative_position_bucket): distances below
// num_buckets / 2 (a quarter each way when bidirectional) get a bucket each, longer ones share
// logarithmically wider buckets up to max_distance. Bidirectional (keys after the query get their
// own half of the buckets) when attention is not causal.
struct RelativeAttentionSpec {
  int num_buckets = 32;
  int max_distance = 128;

  bool operator==(const RelativeAttentionSpec&) const = default;
};

struct ModelSpec {
  std::string name;                    // informational ("llama", "my-model")
  NetworkType network = NetworkType::DecoderOnly;
  int hidden_size = 0;
  int num_layers = 0;
  int vocab_size = 0;
  int max_position = 0;                // context length
  NormSpec norm;
  AttentionSpec attention;
  MlpSpec mlp;
  PositionType position = PositionType::Rope;
  SinusoidLayout sinusoid_layout = SinusoidLayout::Interleaved;  // position sinusoidal
  RopeSpec rope;
  bool parallel_residual = false;      // x + attn(norm1(x)) + mlp(norm2(x)) (GPT-NeoX, Falcon)
  bool shared_layer_norm = false;      // parallel residual with one norm feeding both (Falcon-7B)
  // Each sublayer's output is normed before its residual add: x + post_attn_norm(attn(attn_norm(x))),
  // then the same for the MLP with post_ffn_norm (Gemma 2/3 "sandwich" norms).
  bool post_norms = false;
  bool tie_embeddings = false;         // lm_head = embed
  double final_logit_softcap = 0.0;    // > 0: logits become cap * tanh(logit / cap) (Gemma 2)
  double embedding_multiplier = 1.0;   // Gemma: sqrt(hidden)
  bool embedding_norm = false;         // a norm (tensors.embed_norm) over the summed embeddings (BERT)
  // Rows of the token-type table (tensors.token_type_embed; BERT: 2). Every token has type 0, as
  // sentence-transformers gives a single text: row 0 is added to each position's embedding.
  int token_types = 0;
  // Position p reads row p + position_offset of pos_embed (RoBERTa: padding_idx + 1), so the
  // table has max_position + position_offset rows.
  int position_offset = 0;
  EmbeddingSpec embedding;             // encoder_only: pooling and normalization
  RelativeAttentionSpec relative_attention;  // position relative
  // encoder_decoder: logits are multiplied by it (T5 with a tied head: hidden_size^-0.5).
  double logits_multiplier = 1.0;
  // encoder_decoder: the decoder's first input token (T5: the pad token).
  int decoder_start_token_id = -1;
  // encoder_decoder: the encoder stack's own spec (one element; network encoder_only), resolved
  // from the "encoder" object as a merge patch over this spec. The fields above describe the
  // decoder stack, whose layers add cross-attention over the encoder's last states.
  std::vector<ModelSpec> encoder;
  TensorNames tensors;
  int bos_token_id = -1;
  std::vector<int> eos_token_ids;

  int rotary_dim() const;              // head_dim * partial_factor, even
  double attention_scale() const;      // softmax_scale or 1/sqrt(head_dim)
  // Whether `layer` attends through the sliding window (attention.layer_types, full_attention_interval).
  LayerAttention layer_attention(int layer) const;
  int layer_sliding_window(int layer) const;  // sliding_window, or 0 for a full-attention layer
  // The spec with rope.theta and rope.scaling those `layer` turns by (rope.sliding on a sliding layer).
  ModelSpec layer_rope_spec(int layer) const;
  // encoder_decoder: the encoder stack's spec (throws for other networks).
  const ModelSpec& encoder_spec() const;

  bool operator==(const ModelSpec&) const = default;
};

// A tensor name's '|'-separated alternatives, spaces around each trimmed.
std::vector<std::string> tensor_name_alternatives(const std::string& name);

// JSON <-> spec. Parsing validates every field: an unknown key, a wrong type or an impossible value
// (heads not dividing by kv_heads, ...) throws splitflow::Error naming the JSON path ("attention.num_kv_heads").
// docs/model-spec.md is the format reference. Absent (or null) fields take the defaults above, except
// attention.head_dim (hidden_size / num_heads), attention.num_kv_heads (num_heads) and
// rope.scaling.original_max_position for dynamic/yarn/longrope (max_position). rope.scaling also
// accepts HF's rope_scaling / rope_parameters object as it stands in config.json.
ModelSpec spec_from_json(const nlohmann::json& json);
nlohmann::json spec_to_json(const ModelSpec& spec);
void validate_spec(const ModelSpec& spec);

}  // namespace splitflow
