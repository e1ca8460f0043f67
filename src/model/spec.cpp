#include "model/spec.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string_view>
#include <utility>

namespace splitflow {
namespace {

using nlohmann::json;

// Enum <-> name tables: the first name of each entry is canonical (what spec_to_json writes); the
// others are aliases that HF configs or llama.cpp use for the same thing.
template <typename Enum>
struct EnumName {
  Enum value;
  std::vector<std::string_view> names;
};

const std::vector<EnumName<NetworkType>>& network_names() {
  static const std::vector<EnumName<NetworkType>> names = {
      {NetworkType::DecoderOnly, {"decoder_only"}},
      {NetworkType::EncoderOnly, {"encoder_only"}},
      {NetworkType::EncoderDecoder, {"encoder_decoder"}},
  };
  return names;
}
const std::vector<EnumName<NormType>>& norm_names() {
  static const std::vector<EnumName<NormType>> names = {
      {NormType::RMSNorm, {"rmsnorm"}},
      {NormType::LayerNorm, {"layernorm"}},
  };
  return names;
}
const std::vector<EnumName<Activation>>& activation_names() {
  // gelu_new / gelu_pytorch_tanh / gelu_fast are HF's names for the tanh approximation.
  static const std::vector<EnumName<Activation>> names = {
      {Activation::SiLU, {"silu", "swish"}},
      {Activation::GELU, {"gelu"}},
      {Activation::GELUTanh, {"gelu_tanh", "gelu_new", "gelu_pytorch_tanh", "gelu_fast"}},
      {Activation::ReLU, {"relu"}},
  };
  return names;
}
const std::vector<EnumName<PositionType>>& position_names() {
  static const std::vector<EnumName<PositionType>> names = {
      {PositionType::Rope, {"rope"}},
      {PositionType::Learned, {"learned"}},
      {PositionType::Sinusoidal, {"sinusoidal"}},
      {PositionType::ALiBi, {"alibi"}},
      {PositionType::None, {"none"}},
      {PositionType::Relative, {"relative"}},
  };
  return names;
}
const std::vector<EnumName<SinusoidLayout>>& sinusoid_layout_names() {
  static const std::vector<EnumName<SinusoidLayout>> names = {
      {SinusoidLayout::Interleaved, {"interleaved"}},
      {SinusoidLayout::Halves, {"halves"}},
  };
  return names;
}
const std::vector<EnumName<RopeStyle>>& rope_style_names() {
  static const std::vector<EnumName<RopeStyle>> names = {
      {RopeStyle::Half, {"half"}},
      {RopeStyle::Interleaved, {"interleaved"}},
  };
  return names;
}
const std::vector<EnumName<RopeScalingType>>& scaling_names() {
  // "default" is HF's rope_type for no scaling; "su" is Phi-3's early name for longrope.
  static const std::vector<EnumName<RopeScalingType>> names = {
      {RopeScalingType::None, {"none", "default"}},
      {RopeScalingType::Linear, {"linear"}},
      {RopeScalingType::DynamicNTK, {"dynamic"}},
      {RopeScalingType::YaRN, {"yarn"}},
      {RopeScalingType::Llama3, {"llama3"}},
      {RopeScalingType::LongRope, {"longrope", "su"}},
      {RopeScalingType::FreqFactors, {"freq_factors"}},
  };
  return names;
}
const std::vector<EnumName<QkvLayout>>& qkv_layout_names() {
  static const std::vector<EnumName<QkvLayout>> names = {
      {QkvLayout::Separate, {"separate"}},
      {QkvLayout::Concat, {"concat"}},
      {QkvLayout::PerHead, {"per_head"}},
  };
  return names;
}

const std::vector<EnumName<NormPlacement>>& norm_placement_names() {
  static const std::vector<EnumName<NormPlacement>> names = {
      {NormPlacement::Pre, {"pre"}},
      {NormPlacement::Post, {"post"}},
  };
  return names;
}

const std::vector<EnumName<Pooling>>& pooling_names() {
  static const std::vector<EnumName<Pooling>> names = {
      {Pooling::Cls, {"cls"}},
      {Pooling::Mean, {"mean"}},
      {Pooling::Last, {"last", "lasttoken"}},
  };
  return names;
}

const std::vector<EnumName<LayerAttention>>& layer_attention_names() {
  // HF's config.json layer_types use the long names.
  static const std::vector<EnumName<LayerAttention>> names = {
      {LayerAttention::Full, {"full", "full_attention"}},
      {LayerAttention::Sliding, {"sliding", "sliding_attention"}},
  };
  return names;
}

template <typename Enum>
std::string enum_name(const std::vector<EnumName<Enum>>& table, Enum value) {
  for (const auto& entry : table)
    if (entry.value == value) return std::string(entry.names.front());
  return "?";
}

std::string join_path(const std::string& path, const std::string& key) {
  return path.empty() ? key : path + "." + key;
}

// Reads one JSON object field by field, remembering which keys it consumed so that finish() can
// reject the rest. Null values count as absent, so templates can write "$key | null" for "default".
class ObjectReader {
 public:
  ObjectReader(const json& object, std::string path) : object_(object), path_(std::move(path)) {
    if (!object_.is_object())
      fail("{}: expected an object, got {}", path_.empty() ? "spec" : path_, object_.dump());
  }

  const json* find(const std::string& key) {
    known_.insert(key);
    auto it = object_.find(key);
    if (it == object_.end() || it->is_null()) return nullptr;
    return &*it;
  }
  std::string path(const std::string& key) const { return join_path(path_, key); }

  bool read_int(const std::string& key, int& out) {
    const json* value = find(key);
    if (!value) return false;
    out = to_int(*value, path(key));
    return true;
  }
  bool read_double(const std::string& key, double& out) {
    const json* value = find(key);
    if (!value) return false;
    SF_CHECK(value->is_number(), "{}: expected a number, got {}", path(key), value->dump());
    out = value->get<double>();
    SF_CHECK(std::isfinite(out), "{}: expected a finite number, got {}", path(key), value->dump());
    return true;
  }
  bool read_bool(const std::string& key, bool& out) {
    const json* value = find(key);
    if (!value) return false;
    SF_CHECK(value->is_boolean(), "{}: expected true or false, got {}", path(key), value->dump());
    out = value->get<bool>();
    return true;
  }
  bool read_string(const std::string& key, std::string& out) {
    const json* value = find(key);
    if (!value) return false;
    SF_CHECK(value->is_string(), "{}: expected a string, got {}", path(key), value->dump());
    out = value->get<std::string>();
    return true;
  }
  template <typename Enum>
  bool read_enum(const std::string& key, const std::vector<EnumName<Enum>>& table, Enum& out) {
    const json* value = find(key);
    if (!value) return false;
    out = to_enum(*value, path(key), table);
    return true;
  }
  bool read_double_list(const std::string& key, std::vector<double>& out) {
    const json* value = find(key);
    if (!value) return false;
    SF_CHECK(value->is_array(), "{}: expected an array of numbers, got {}", path(key), value->dump());
    out.clear();
    for (size_t i = 0; i < value->size(); ++i) {
      const json& item = (*value)[i];
      SF_CHECK(item.is_number(), "{}[{}]: expected a number, got {}", path(key), i, item.dump());
      out.push_back(item.get<double>());
    }
    return true;
  }
  void require(const std::string& key) {
    if (!find(key)) fail("{}: missing (required)", path(key));
  }

  // Throws for the first key nobody asked for, listing the keys this object knows.
  void finish() const {
    for (auto it = object_.begin(); it != object_.end(); ++it) {
      if (known_.count(it.key())) continue;
      fail("{}: unknown field (known fields here: {})", path(it.key()), fmt::join(known_, ", "));
    }
  }

  static int to_int(const json& value, const std::string& path) {
    if (value.is_number_integer() || value.is_number_unsigned()) {
      const auto wide = value.get<int64_t>();
      SF_CHECK(wide >= INT32_MIN && wide <= INT32_MAX, "{}: {} is out of range", path, value.dump());
      return static_cast<int>(wide);
    }
    // Integral floats (128.0) are accepted: configs and template arithmetic sometimes produce them.
    if (value.is_number_float()) {
      const double real = value.get<double>();
      SF_CHECK(std::isfinite(real) && real == std::floor(real) && std::fabs(real) <= INT32_MAX,
               "{}: expected an integer, got {}", path, value.dump());
      return static_cast<int>(real);
    }
    fail("{}: expected an integer, got {}", path, value.dump());
  }

  template <typename Enum>
  static Enum to_enum(const json& value, const std::string& path, const std::vector<EnumName<Enum>>& table) {
    std::vector<std::string_view> accepted;
    for (const auto& entry : table) accepted.push_back(entry.names.front());
    SF_CHECK(value.is_string(), "{}: expected one of {}, got {}", path, fmt::join(accepted, ", "), value.dump());
    const std::string text = value.get<std::string>();
    for (const auto& entry : table)
      for (std::string_view name : entry.names)
        if (text == name) return entry.value;
    fail("{}: unknown value '{}' (expected one of {})", path, text, fmt::join(accepted, ", "));
  }

 private:
  const json& object_;
  std::string path_;
  std::set<std::string> known_;
};

void parse_norm(const json& object, NormSpec& norm) {
  ObjectReader reader(object, "norm");
  reader.read_enum("type", norm_names(), norm.type);
  reader.read_double("eps", norm.eps);
  reader.read_bool("bias", norm.bias);
  reader.read_double("weight_offset", norm.weight_offset);
  reader.read_enum("placement", norm_placement_names(), norm.placement);
  reader.finish();
}

void parse_attention(const json& object, AttentionSpec& attention) {
  ObjectReader reader(object, "attention");
  reader.require("num_heads");
  reader.read_int("num_heads", attention.num_heads);
  reader.read_int("num_kv_heads", attention.num_kv_heads);
  reader.read_int("head_dim", attention.head_dim);
  reader.read_bool("q_bias", attention.q_bias);
  reader.read_bool("k_bias", attention.k_bias);
  reader.read_bool("v_bias", attention.v_bias);
  reader.read_bool("o_bias", attention.o_bias);
  reader.read_int("sliding_window", attention.sliding_window);
  if (const json* types = reader.find("layer_types")) {
    SF_CHECK(types->is_array(), "attention.layer_types: expected an array of full / sliding, got {}", types->dump());
    attention.layer_types.clear();
    for (size_t i = 0; i < types->size(); ++i)
      attention.layer_types.push_back(
          ObjectReader::to_enum((*types)[i], fmt::format("attention.layer_types[{}]", i), layer_attention_names()));
  }
  reader.read_int("full_attention_interval", attention.full_attention_interval);
  reader.read_double("softmax_scale", attention.softmax_scale);
  reader.read_double("logit_softcap", attention.logit_softcap);
  reader.read_bool("qk_norm", attention.qk_norm);
  reader.read_enum("qkv_layout", qkv_layout_names(), attention.qkv_layout);
  reader.read_bool("causal", attention.causal);
  reader.finish();
}

void parse_embedding(const json& object, EmbeddingSpec& embedding) {
  ObjectReader reader(object, "embedding");
  reader.read_enum("pooling", pooling_names(), embedding.pooling);
  reader.read_bool("normalize", embedding.normalize);
  reader.read_int("max_tokens", embedding.max_tokens);
  reader.read_bool("matryoshka", embedding.matryoshka);
  reader.finish();
}

void parse_relative_attention(const json& object, RelativeAttentionSpec& relative) {
  ObjectReader reader(object, "relative_attention");
  reader.read_int("num_buckets", relative.num_buckets);
  reader.read_int("max_distance", relative.max_distance);
  reader.finish();
}

// The encoder stack of an encoder_decoder spec: the decoder's fields without what only a decoder
// has (its head, cross-attention, start token), attention bidirectional, then the "encoder"
// object applied as a JSON merge patch.
json encoder_json(const json& object) {
  json base = object;
  base.erase("encoder");
  for (const char* key : {"logits_multiplier", "decoder_start_token_id", "tie_embeddings", "final_logit_softcap"})
    base.erase(key);
  base["network"] = "encoder_only";
  if (!base.contains("attention") || !base["attention"].is_object()) base["attention"] = json::object();
  base["attention"]["causal"] = false;
  if (base.contains("tensors") && base["tensors"].is_object())
    for (const char* key : {"lm_head", "lm_head_optional", "logits_bias", "cross_attn_norm", "cross_q", "cross_k",
                            "cross_v", "cross_o"})
      base["tensors"].erase(key);
  base.merge_patch(object.at("encoder"));
  return base;
}

void parse_mlp(const json& object, MlpSpec& mlp) {
  ObjectReader reader(object, "mlp");
  reader.require("intermediate_size");
  reader.read_int("intermediate_size", mlp.intermediate_size);
  reader.read_enum("activation", activation_names(), mlp.activation);
  reader.read_bool("gated", mlp.gated);
  reader.read_bool("gate_up_fused", mlp.gate_up_fused);
  reader.read_bool("up_bias", mlp.up_bias);
  reader.read_bool("down_bias", mlp.down_bias);
  reader.finish();
}

// rope.scaling: our field names, or HF's rope_scaling / rope_parameters object as config.json has
// it (rope_type or type, original_max_position_embeddings). HF's rope_parameters also carries
// rope_theta and partial_rotary_factor; those must agree with rope.theta / rope.partial_factor.
void parse_scaling(const json& object, RopeSpec& rope, const std::string& path = "rope.scaling") {
  RopeScaling& scaling = rope.scaling;
  ObjectReader reader(object, path);
  const json* type = reader.find("type");
  const json* rope_type = reader.find("rope_type");
  if (type && rope_type && *type != *rope_type)
    fail("{}: type {} and rope_type {} disagree", path, type->dump(), rope_type->dump());
  if (type || rope_type)
    scaling.type = ObjectReader::to_enum(type ? *type : *rope_type, reader.path(type ? "type" : "rope_type"),
                                         scaling_names());
  int original = 0, original_hf = 0;
  const bool has_original = reader.read_int("original_max_position", original);
  const bool has_original_hf = reader.read_int("original_max_position_embeddings", original_hf);
  if (has_original && has_original_hf && original != original_hf)
    fail("{}: original_max_position {} and original_max_position_embeddings {} disagree", path, original,
         original_hf);
  if (has_original || has_original_hf) scaling.original_max_position = has_original ? original : original_hf;
  reader.read_double("factor", scaling.factor);
  reader.read_double("low_freq_factor", scaling.low_freq_factor);
  reader.read_double("high_freq_factor", scaling.high_freq_factor);
  reader.read_double("beta_fast", scaling.beta_fast);
  reader.read_double("beta_slow", scaling.beta_slow);
  reader.read_double("mscale", scaling.mscale);
  reader.read_double("mscale_all_dim", scaling.mscale_all_dim);
  double attention_factor = 0.0;
  if (reader.read_double("attention_factor", attention_factor)) scaling.attention_factor = attention_factor;
  reader.read_double_list("long_factor", scaling.long_factor);
  reader.read_double_list("short_factor", scaling.short_factor);
  reader.read_double_list("freq_factors", scaling.freq_factors);
  double theta = 0.0, partial = 0.0;
  if (reader.read_double("rope_theta", theta) && theta != rope.theta)
    fail("{}.rope_theta: {} disagrees with {} {}", path, theta, path == "rope.scaling" ? "rope.theta" : "rope.sliding.theta", rope.theta);
  if (reader.read_double("partial_rotary_factor", partial) && partial != rope.partial_factor)
    fail("{}.partial_rotary_factor: {} disagrees with rope.partial_factor {}", path, partial, rope.partial_factor);
  reader.finish();
  // Without scaling the other fields mean nothing; drop them so equal models compare equal.
  if (scaling.type == RopeScalingType::None) scaling = RopeScaling{};
}

void parse_rope(const json& object, RopeSpec& rope) {
  ObjectReader reader(object, "rope");
  reader.read_double("theta", rope.theta);
  reader.read_double("partial_factor", rope.partial_factor);
  reader.read_enum("style", rope_style_names(), rope.style);
  // scaling last: its HF form is checked against theta and partial_factor.
  if (const json* scaling = reader.find("scaling")) parse_scaling(*scaling, rope);
  if (const json* sliding = reader.find("sliding")) {
    ObjectReader sliding_reader(*sliding, "rope.sliding");
    // The sliding layers' scaling is read (and its HF rope_theta checked) against their own base.
    RopeSpec own{.theta = rope.theta, .partial_factor = rope.partial_factor};
    sliding_reader.read_double("theta", own.theta);
    if (const json* scaling = sliding_reader.find("scaling")) parse_scaling(*scaling, own, "rope.sliding.scaling");
    sliding_reader.finish();
    rope.sliding = SlidingRope{own.theta, own.scaling};
  }
  reader.finish();
}

void parse_tensors(const json& object, TensorNames& tensors) {
  ObjectReader reader(object, "tensors");
  reader.read_string("weight_suffix", tensors.weight_suffix);
  reader.read_string("bias_suffix", tensors.bias_suffix);
  if (const json* prefixes = reader.find("name_prefixes")) {
    SF_CHECK(prefixes->is_array() && !prefixes->empty(), "tensors.name_prefixes: expected a non-empty array of strings, got {}",
             prefixes->dump());
    tensors.name_prefixes.clear();
    for (size_t i = 0; i < prefixes->size(); ++i) {
      SF_CHECK((*prefixes)[i].is_string(), "tensors.name_prefixes[{}]: expected a string, got {}", i, (*prefixes)[i].dump());
      tensors.name_prefixes.push_back((*prefixes)[i].get<std::string>());
    }
  }
  reader.read_bool("linear_transposed", tensors.linear_transposed);
  reader.read_bool("lm_head_optional", tensors.lm_head_optional);
  if (const json* unused = reader.find("unused_prefixes")) {
    SF_CHECK(unused->is_array(), "tensors.unused_prefixes: expected an array of strings, got {}", unused->dump());
    tensors.unused_prefixes.clear();
    for (size_t i = 0; i < unused->size(); ++i) {
      SF_CHECK((*unused)[i].is_string() && !(*unused)[i].get<std::string>().empty(),
               "tensors.unused_prefixes[{}]: expected a non-empty string, got {}", i, (*unused)[i].dump());
      tensors.unused_prefixes.push_back((*unused)[i].get<std::string>());
    }
  }
  const std::pair<const char*, std::string*> names[] = {
      {"embed", &tensors.embed},       {"pos_embed", &tensors.pos_embed}, {"final_norm", &tensors.final_norm},
      {"lm_head", &tensors.lm_head},   {"attn_norm", &tensors.attn_norm}, {"q", &tensors.q},
      {"k", &tensors.k},               {"v", &tensors.v},                 {"qkv", &tensors.qkv},
      {"o", &tensors.o},               {"ffn_norm", &tensors.ffn_norm},   {"gate", &tensors.gate},
      {"up", &tensors.up},             {"gate_up", &tensors.gate_up},     {"down", &tensors.down},
      {"q_norm", &tensors.q_norm},     {"k_norm", &tensors.k_norm},       {"post_attn_norm", &tensors.post_attn_norm},
      {"post_ffn_norm", &tensors.post_ffn_norm}, {"embed_norm", &tensors.embed_norm},
      {"token_type_embed", &tensors.token_type_embed}, {"relative_bias", &tensors.relative_bias},
      {"cross_attn_norm", &tensors.cross_attn_norm}, {"cross_q", &tensors.cross_q},
      {"cross_k", &tensors.cross_k}, {"cross_v", &tensors.cross_v}, {"cross_o", &tensors.cross_o},
      {"logits_bias", &tensors.logits_bias},
  };
  for (const auto& [key, target] : names) reader.read_string(key, *target);
  reader.finish();
}

void parse_eos(const json& value, std::vector<int>& eos) {
  eos.clear();
  if (value.is_array()) {
    for (size_t i = 0; i < value.size(); ++i) eos.push_back(ObjectReader::to_int(value[i], fmt::format("eos_token_ids[{}]", i)));
  } else {
    eos.push_back(ObjectReader::to_int(value, "eos_token_ids"));
  }
}

bool is_positive_finite(double value) { return std::isfinite(value) && value > 0.0; }

void validate_scaling(const ModelSpec& spec) {
  const RopeScaling& scaling = spec.rope.scaling;
  if (scaling.type == RopeScalingType::None) return;
  const std::string type = enum_name(scaling_names(), scaling.type);
  SF_CHECK(is_positive_finite(scaling.factor) && scaling.factor >= 1.0,
           "rope.scaling.factor: {} scaling needs a factor >= 1, got {}", type, scaling.factor);
  if (scaling.type != RopeScalingType::Linear && scaling.type != RopeScalingType::FreqFactors)
    SF_CHECK(scaling.original_max_position > 0, "rope.scaling.original_max_position: {} scaling needs it > 0, got {}",
             type, scaling.original_max_position);
  if (scaling.attention_factor)
    SF_CHECK(is_positive_finite(*scaling.attention_factor), "rope.scaling.attention_factor: must be > 0, got {}",
             *scaling.attention_factor);
  switch (scaling.type) {
    case RopeScalingType::Llama3:
      SF_CHECK(is_positive_finite(scaling.low_freq_factor), "rope.scaling.low_freq_factor: must be > 0, got {}",
               scaling.low_freq_factor);
      SF_CHECK(scaling.high_freq_factor > scaling.low_freq_factor,
               "rope.scaling.high_freq_factor: {} must exceed low_freq_factor {}", scaling.high_freq_factor,
               scaling.low_freq_factor);
      break;
    case RopeScalingType::YaRN:
      SF_CHECK(is_positive_finite(scaling.beta_fast) && is_positive_finite(scaling.beta_slow),
               "rope.scaling: yarn needs beta_fast and beta_slow > 0, got {} and {}", scaling.beta_fast, scaling.beta_slow);
      SF_CHECK(is_positive_finite(scaling.mscale), "rope.scaling.mscale: must be > 0, got {}", scaling.mscale);
      SF_CHECK(std::isfinite(scaling.mscale_all_dim) && scaling.mscale_all_dim >= 0,
               "rope.scaling.mscale_all_dim: must be >= 0, got {}", scaling.mscale_all_dim);
      break;
    case RopeScalingType::LongRope: {
      const size_t pairs = static_cast<size_t>(spec.rotary_dim() / 2);
      SF_CHECK(scaling.long_factor.size() == pairs, "rope.scaling.long_factor: {} entries, expected rotary_dim/2 = {}",
               scaling.long_factor.size(), pairs);
      SF_CHECK(scaling.short_factor.size() == pairs, "rope.scaling.short_factor: {} entries, expected rotary_dim/2 = {}",
               scaling.short_factor.size(), pairs);
      for (size_t i = 0; i < pairs; ++i) {
        SF_CHECK(is_positive_finite(scaling.long_factor[i]), "rope.scaling.long_factor[{}]: must be > 0, got {}", i,
                 scaling.long_factor[i]);
        SF_CHECK(is_positive_finite(scaling.short_factor[i]), "rope.scaling.short_factor[{}]: must be > 0, got {}", i,
                 scaling.short_factor[i]);
      }
      break;
    }
    case RopeScalingType::FreqFactors: {
      const size_t pairs = static_cast<size_t>(spec.rotary_dim() / 2);
      SF_CHECK(scaling.freq_factors.size() == pairs, "rope.scaling.freq_factors: {} entries, expected rotary_dim/2 = {}",
               scaling.freq_factors.size(), pairs);
      for (size_t i = 0; i < pairs; ++i)
        SF_CHECK(is_positive_finite(scaling.freq_factors[i]), "rope.scaling.freq_factors[{}]: must be > 0, got {}", i,
                 scaling.freq_factors[i]);
      break;
    }
    default: break;
  }
}

// Per-layer names must carry "{layer}" (in every alternative); model-level names must not.
void check_tensor_name(const std::string& field, const std::string& name, bool per_layer) {
  if (name.empty()) return;
  for (const std::string& alternative : tensor_name_alternatives(name)) {
    SF_CHECK(!alternative.empty(), "tensors.{}: '{}' has an empty alternative", field, name);
    const bool has_layer = alternative.find("{layer}") != std::string::npos;
    if (per_layer)
      SF_CHECK(has_layer, "tensors.{}: '{}' has no {{layer}} placeholder, so every layer would load the same tensor",
               field, alternative);
    else
      SF_CHECK(!has_layer, "tensors.{}: '{}' is a model-level tensor and cannot contain {{layer}}", field, alternative);
  }
}

void require_name(const std::string& field, const std::string& name, const std::string& why) {
  SF_CHECK(!name.empty(), "tensors.{}: missing, needed because {}", field, why);
}
void forbid_name(const std::string& field, const std::string& name, const std::string& why) {
  SF_CHECK(name.empty(), "tensors.{}: '{}' given, but {}", field, name, why);
}

}  // namespace

std::vector<std::string> tensor_name_alternatives(const std::string& name) {
  std::vector<std::string> alternatives;
  size_t start = 0;
  while (true) {
    const size_t bar = std::min(name.find('|', start), name.size());
    std::string piece = name.substr(start, bar - start);
    const size_t first = piece.find_first_not_of(' '), last = piece.find_last_not_of(' ');
    alternatives.push_back(first == std::string::npos ? std::string() : piece.substr(first, last - first + 1));
    if (bar == name.size()) return alternatives;
    start = bar + 1;
  }
}

int ModelSpec::rotary_dim() const {
  const int dim = static_cast<int>(std::floor(attention.head_dim * rope.partial_factor + 1e-9));
  return dim - dim % 2;
}

double ModelSpec::attention_scale() const {
  return attention.softmax_scale > 0.0 ? attention.softmax_scale : 1.0 / std::sqrt(static_cast<double>(attention.head_dim));
}

LayerAttention ModelSpec::layer_attention(int layer) const {
  if (attention.sliding_window <= 0) return LayerAttention::Full;
  if (!attention.layer_types.empty()) return attention.layer_types.at(static_cast<size_t>(layer));
  const int interval = attention.full_attention_interval;
  return interval > 0 && (layer + 1) % interval == 0 ? LayerAttention::Full : LayerAttention::Sliding;
}

int ModelSpec::layer_sliding_window(int layer) const {
  return layer_attention(layer) == LayerAttention::Sliding ? attention.sliding_window : 0;
}

ModelSpec ModelSpec::layer_rope_spec(int layer) const {
  ModelSpec own = *this;
  if (rope.sliding && layer_attention(layer) == LayerAttention::Sliding) {
    own.rope.theta = rope.sliding->theta;
    own.rope.scaling = rope.sliding->scaling;
  }
  own.rope.sliding.reset();
  return own;
}

ModelSpec spec_from_json(const json& object) {
  ModelSpec spec;
  ObjectReader reader(object, "");
  reader.read_string("name", spec.name);
  reader.read_enum("network", network_names(), spec.network);
  for (const char* key : {"hidden_size", "num_layers", "vocab_size", "max_position", "attention", "mlp", "tensors"})
    reader.require(key);
  reader.read_int("hidden_size", spec.hidden_size);
  reader.read_int("num_layers", spec.num_layers);
  reader.read_int("vocab_size", spec.vocab_size);
  reader.read_int("max_position", spec.max_position);
  if (const json* norm = reader.find("norm")) parse_norm(*norm, spec.norm);
  parse_attention(*reader.find("attention"), spec.attention);
  parse_mlp(*reader.find("mlp"), spec.mlp);
  reader.read_enum("position", position_names(), spec.position);
  reader.read_enum("sinusoid_layout", sinusoid_layout_names(), spec.sinusoid_layout);
  if (const json* rope = reader.find("rope")) parse_rope(*rope, spec.rope);
  reader.read_bool("parallel_residual", spec.parallel_residual);
  reader.read_bool("shared_layer_norm", spec.shared_layer_norm);
  reader.read_bool("post_norms", spec.post_norms);
  reader.read_bool("tie_embeddings", spec.tie_embeddings);
  reader.read_double("final_logit_softcap", spec.final_logit_softcap);
  reader.read_double("embedding_multiplier", spec.embedding_multiplier);
  reader.read_bool("embedding_norm", spec.embedding_norm);
  reader.read_int("token_types", spec.token_types);
  reader.read_int("position_offset", spec.position_offset);
  if (const json* embedding = reader.find("embedding")) parse_embedding(*embedding, spec.embedding);
  if (const json* relative = reader.find("relative_attention")) parse_relative_attention(*relative, spec.relative_attention);
  reader.read_double("logits_multiplier", spec.logits_multiplier);
  reader.read_int("decoder_start_token_id", spec.decoder_start_token_id);
  const json* encoder = reader.find("encoder");
  parse_tensors(*reader.find("tensors"), spec.tensors);
  reader.read_int("bos_token_id", spec.bos_token_id);
  if (const json* eos = reader.find("eos_token_ids")) parse_eos(*eos, spec.eos_token_ids);
  reader.finish();
  if (spec.network == NetworkType::EncoderDecoder) {
    SF_CHECK(encoder != nullptr && encoder->is_object(),
             "encoder: network encoder_decoder needs an \"encoder\" object (the encoder stack's fields, a merge patch "
             "over the decoder's)");
    try {
      spec.encoder.push_back(spec_from_json(encoder_json(object)));
    } catch (const Error& e) {
      fail("encoder: {}", e.what());
    }
  } else {
    SF_CHECK(encoder == nullptr, "encoder: only a network encoder_decoder has an encoder stack");
  }

  // Derived defaults (see spec.h).
  AttentionSpec& attention = spec.attention;
  if (attention.num_kv_heads == 0) attention.num_kv_heads = attention.num_heads;
  if (attention.head_dim == 0 && attention.num_heads > 0 && spec.hidden_size > 0) {
    SF_CHECK(spec.hidden_size % attention.num_heads == 0,
             "attention.head_dim: missing, and hidden_size {} is not a multiple of num_heads {}", spec.hidden_size,
             attention.num_heads);
    attention.head_dim = spec.hidden_size / attention.num_heads;
  }
  RopeScaling& scaling = spec.rope.scaling;
  const bool defaults_original = scaling.type == RopeScalingType::DynamicNTK || scaling.type == RopeScalingType::YaRN ||
                                 scaling.type == RopeScalingType::LongRope;
  if (defaults_original && scaling.original_max_position == 0) scaling.original_max_position = spec.max_position;
  if (spec.rope.sliding) {
    RopeScaling& own = spec.rope.sliding->scaling;
    const bool own_defaults_original = own.type == RopeScalingType::DynamicNTK || own.type == RopeScalingType::YaRN ||
                                       own.type == RopeScalingType::LongRope;
    if (own_defaults_original && own.original_max_position == 0) own.original_max_position = spec.max_position;
  }

  validate_spec(spec);
  return spec;
}

const ModelSpec& ModelSpec::encoder_spec() const {
  SF_CHECK(network == NetworkType::EncoderDecoder && encoder.size() == 1,
           "spec: only an encoder_decoder model has an encoder stack");
  return encoder.front();
}

namespace {

// What only encoder_decoder specs have: the encoder stack, cross-attention tensors, the decoder's
// start token and the logits multiplier.
void validate_encoder_decoder(const ModelSpec& spec) {
  const TensorNames& tensors = spec.tensors;
  const std::pair<const char*, const std::string*> cross[] = {
      {"cross_attn_norm", &tensors.cross_attn_norm}, {"cross_q", &tensors.cross_q}, {"cross_k", &tensors.cross_k},
      {"cross_v", &tensors.cross_v}, {"cross_o", &tensors.cross_o}};
  SF_CHECK(std::isfinite(spec.logits_multiplier) && spec.logits_multiplier > 0.0,
           "logits_multiplier: must be > 0, got {}", spec.logits_multiplier);
  if (spec.network != NetworkType::EncoderDecoder) {
    SF_CHECK(spec.encoder.empty(), "encoder: only a network encoder_decoder has an encoder stack");
    for (const auto& [field, name] : cross)
      forbid_name(field, *name, "only encoder_decoder decoders attend to an encoder");
    SF_CHECK(spec.decoder_start_token_id == -1, "decoder_start_token_id: only a network encoder_decoder has one");
    SF_CHECK(spec.logits_multiplier == 1.0 || spec.network == NetworkType::DecoderOnly,
             "logits_multiplier: an encoder_only model has no logits");
    return;
  }
  SF_CHECK(spec.encoder.size() == 1, "encoder: network encoder_decoder needs the encoder stack");
  const ModelSpec& encoder = spec.encoder.front();
  SF_CHECK(encoder.network == NetworkType::EncoderOnly, "encoder.network: must be encoder_only");
  SF_CHECK(encoder.hidden_size == spec.hidden_size, "encoder.hidden_size: {} differs from the decoder's {}",
           encoder.hidden_size, spec.hidden_size);
  SF_CHECK(spec.attention.causal, "attention.causal: an encoder_decoder's decoder is causal");
  for (const auto& [field, name] : cross) {
    require_name(field, *name, "the decoder layers of an encoder_decoder attend to the encoder");
    check_tensor_name(field, *name, true);
  }
  SF_CHECK(spec.decoder_start_token_id >= 0 && spec.decoder_start_token_id < spec.vocab_size,
           "decoder_start_token_id: an encoder_decoder needs the decoder's first token in [0, {}), got {}",
           spec.vocab_size, spec.decoder_start_token_id);
  SF_CHECK(!spec.parallel_residual && !spec.post_norms && !spec.attention.qk_norm && spec.attention.sliding_window == 0,
           "network: encoder_decoder decoders are sequential layers with full attention (no parallel_residual, "
           "post_norms, qk_norm or sliding window yet)");
  SF_CHECK(spec.logits_multiplier == 1.0 || !spec.tensors.final_norm.empty(),
           "logits_multiplier: {} needs a final_norm to scale (norm.placement post has none)", spec.logits_multiplier);
}

}  // namespace

void validate_spec(const ModelSpec& spec) {
  validate_encoder_decoder(spec);
  const bool encoder = spec.network == NetworkType::EncoderOnly;
  SF_CHECK(spec.hidden_size > 0, "hidden_size: must be > 0, got {}", spec.hidden_size);
  SF_CHECK(spec.num_layers > 0, "num_layers: must be > 0, got {}", spec.num_layers);
  SF_CHECK(spec.vocab_size > 0, "vocab_size: must be > 0, got {}", spec.vocab_size);
  SF_CHECK(spec.max_position > 0, "max_position: must be > 0, got {}", spec.max_position);

  const NormSpec& norm = spec.norm;
  SF_CHECK(is_positive_finite(norm.eps), "norm.eps: must be > 0, got {}", norm.eps);
  SF_CHECK(!norm.bias || norm.type == NormType::LayerNorm, "norm.bias: only layernorm has a bias, norm.type is rmsnorm");

  const AttentionSpec& attention = spec.attention;
  SF_CHECK(attention.num_heads > 0, "attention.num_heads: must be > 0, got {}", attention.num_heads);
  SF_CHECK(attention.num_kv_heads > 0 && attention.num_kv_heads <= attention.num_heads,
           "attention.num_kv_heads: must be in [1, num_heads {}], got {}", attention.num_heads, attention.num_kv_heads);
  SF_CHECK(attention.num_heads % attention.num_kv_heads == 0, "attention.num_kv_heads: {} does not divide num_heads {}",
           attention.num_kv_heads, attention.num_heads);
  SF_CHECK(attention.head_dim > 0, "attention.head_dim: must be > 0, got {}", attention.head_dim);
  SF_CHECK(attention.sliding_window >= 0, "attention.sliding_window: must be >= 0 (0 = full attention), got {}",
           attention.sliding_window);
  SF_CHECK(std::isfinite(attention.softmax_scale) && attention.softmax_scale >= 0.0,
           "attention.softmax_scale: must be >= 0 (0 = 1/sqrt(head_dim)), got {}", attention.softmax_scale);
  SF_CHECK(attention.logit_softcap >= 0.0, "attention.logit_softcap: must be >= 0 (0 = none), got {}",
           attention.logit_softcap);
  SF_CHECK(spec.final_logit_softcap >= 0.0, "final_logit_softcap: must be >= 0 (0 = none), got {}",
           spec.final_logit_softcap);
  SF_CHECK(attention.full_attention_interval >= 0, "attention.full_attention_interval: must be >= 0 (0 = none), got {}",
           attention.full_attention_interval);
  if (!attention.layer_types.empty()) {
    SF_CHECK(static_cast<int>(attention.layer_types.size()) == spec.num_layers,
             "attention.layer_types: {} entries, num_layers is {}", attention.layer_types.size(), spec.num_layers);
    for (size_t i = 0; i < attention.layer_types.size(); ++i)
      SF_CHECK(attention.layer_types[i] == LayerAttention::Full || attention.sliding_window > 0,
               "attention.layer_types[{}]: sliding, but attention.sliding_window is 0", i);
  }
  if (attention.qkv_layout == QkvLayout::PerHead)
    SF_CHECK(attention.num_kv_heads == attention.num_heads,
             "attention.qkv_layout: per_head needs num_kv_heads == num_heads, got {} and {}", attention.num_kv_heads,
             attention.num_heads);

  const MlpSpec& mlp = spec.mlp;
  SF_CHECK(mlp.intermediate_size > 0, "mlp.intermediate_size: must be > 0, got {}", mlp.intermediate_size);
  SF_CHECK(!mlp.gate_up_fused || mlp.gated, "mlp.gate_up_fused: needs mlp.gated");

  SF_CHECK(std::isfinite(spec.embedding_multiplier) && spec.embedding_multiplier > 0.0,
           "embedding_multiplier: must be > 0, got {}", spec.embedding_multiplier);
  SF_CHECK(!spec.shared_layer_norm || spec.parallel_residual, "shared_layer_norm: needs parallel_residual");
  if (spec.norm.placement == NormPlacement::Post) {
    SF_CHECK(!spec.parallel_residual, "norm.placement: post is not with parallel_residual");
    SF_CHECK(!spec.post_norms, "norm.placement: post is not with post_norms (those are extra norms of a pre-norm layer)");
    SF_CHECK(!attention.qk_norm, "norm.placement: post is not with attention.qk_norm");
  }
  SF_CHECK(encoder || attention.causal,
           "attention.causal: false needs network encoder_only (a decoder generates one token at a time)");
  SF_CHECK(spec.token_types >= 0, "token_types: must be >= 0 (0 = no token-type table), got {}", spec.token_types);
  SF_CHECK(spec.position_offset >= 0, "position_offset: must be >= 0, got {}", spec.position_offset);
  SF_CHECK(spec.position_offset == 0 || spec.position == PositionType::Learned,
           "position_offset: {} needs learned positions", spec.position_offset);
  const EmbeddingSpec& embedding = spec.embedding;
  SF_CHECK(embedding.max_tokens >= 0 && embedding.max_tokens <= spec.max_position,
           "embedding.max_tokens: must be in [0, max_position {}] (0 = max_position), got {}", spec.max_position,
           embedding.max_tokens);
  if (encoder) {
    SF_CHECK(!spec.tie_embeddings, "tie_embeddings: an encoder_only model has no lm_head to tie");
    SF_CHECK(spec.final_logit_softcap == 0.0, "final_logit_softcap: an encoder_only model has no logits");
  }

  SF_CHECK(spec.position != PositionType::ALiBi, "position: alibi is not supported yet (rope, learned, sinusoidal, "
           "relative or none)");
  SF_CHECK(spec.position != PositionType::Sinusoidal || spec.hidden_size % 2 == 0,
           "position: sinusoidal needs an even hidden_size (sine and cosine pairs), got {}", spec.hidden_size);
  if (spec.position == PositionType::Relative) {
    const RelativeAttentionSpec& relative = spec.relative_attention;
    const int exact = relative.num_buckets / (attention.causal ? 2 : 4);
    SF_CHECK(relative.num_buckets >= (attention.causal ? 2 : 4) && exact >= 1,
             "relative_attention.num_buckets: {} leaves no exact bucket{}", relative.num_buckets,
             attention.causal ? "" : " (bidirectional: a quarter of them are exact)");
    SF_CHECK(relative.max_distance > exact, "relative_attention.max_distance: {} must exceed the exact buckets' {}",
             relative.max_distance, exact);
    require_name("relative_bias", spec.tensors.relative_bias, "position is relative");
  } else {
    forbid_name("relative_bias", spec.tensors.relative_bias, "position is not relative");
  }
  check_tensor_name("relative_bias", spec.tensors.relative_bias, false);
  if (spec.position == PositionType::Rope) {
    const RopeSpec& rope = spec.rope;
    SF_CHECK(is_positive_finite(rope.theta), "rope.theta: must be > 0, got {}", rope.theta);
    SF_CHECK(rope.partial_factor > 0.0 && rope.partial_factor <= 1.0, "rope.partial_factor: must be in (0, 1], got {}",
             rope.partial_factor);
    SF_CHECK(spec.rotary_dim() >= 2, "rope.partial_factor: head_dim {} x {} leaves no rotary pair", attention.head_dim,
             rope.partial_factor);
    validate_scaling(spec);
    if (rope.sliding) {
      SF_CHECK(is_positive_finite(rope.sliding->theta), "rope.sliding.theta: must be > 0, got {}", rope.sliding->theta);
      try {
        ModelSpec own = spec;
        own.rope.theta = rope.sliding->theta;
        own.rope.scaling = rope.sliding->scaling;
        validate_scaling(own);
      } catch (const Error& e) {
        fail("rope.sliding: {}", e.what());
      }
    }
  } else {
    SF_CHECK(spec.rope.scaling.type == RopeScalingType::None, "rope.scaling: given, but position is {}",
             enum_name(position_names(), spec.position));
  }

  const TensorNames& tensors = spec.tensors;
  SF_CHECK(!tensors.name_prefixes.empty(), "tensors.name_prefixes: must list at least one prefix (\"\" for none)");
  check_tensor_name("embed", tensors.embed, false);
  check_tensor_name("pos_embed", tensors.pos_embed, false);
  check_tensor_name("final_norm", tensors.final_norm, false);
  check_tensor_name("lm_head", tensors.lm_head, false);
  const std::pair<const char*, const std::string*> per_layer[] = {
      {"attn_norm", &tensors.attn_norm}, {"q", &tensors.q},     {"k", &tensors.k},       {"v", &tensors.v},
      {"qkv", &tensors.qkv},             {"o", &tensors.o},     {"ffn_norm", &tensors.ffn_norm},
      {"gate", &tensors.gate},           {"up", &tensors.up},   {"gate_up", &tensors.gate_up},
      {"down", &tensors.down},           {"q_norm", &tensors.q_norm}, {"k_norm", &tensors.k_norm},
      {"post_attn_norm", &tensors.post_attn_norm}, {"post_ffn_norm", &tensors.post_ffn_norm},
  };
  for (const auto& [field, name] : per_layer) check_tensor_name(field, *name, true);
  for (const auto& [field, name] : {std::pair{"q_norm", &tensors.q_norm}, {"k_norm", &tensors.k_norm}}) {
    if (attention.qk_norm) require_name(field, *name, "attention.qk_norm is true");
    else forbid_name(field, *name, "attention.qk_norm is false");
  }
  for (const auto& [field, name] :
       {std::pair{"post_attn_norm", &tensors.post_attn_norm}, {"post_ffn_norm", &tensors.post_ffn_norm}}) {
    if (spec.post_norms) require_name(field, *name, "post_norms is true");
    else forbid_name(field, *name, "post_norms is false");
  }
  SF_CHECK(!spec.post_norms || !spec.parallel_residual, "post_norms: not with parallel_residual");

  require_name("embed", tensors.embed, "every model has a token embedding");
  if (!encoder && spec.norm.placement == NormPlacement::Pre)
    require_name("final_norm", tensors.final_norm, "pre-norm decoders end with a norm");
  if (spec.norm.placement == NormPlacement::Post)
    forbid_name("final_norm", tensors.final_norm, "norm.placement is post (each layer ends normed)");
  if (spec.embedding_norm) require_name("embed_norm", tensors.embed_norm, "embedding_norm is true");
  else forbid_name("embed_norm", tensors.embed_norm, "embedding_norm is false");
  if (spec.token_types > 0) require_name("token_type_embed", tensors.token_type_embed, "token_types > 0");
  else forbid_name("token_type_embed", tensors.token_type_embed, "token_types is 0");
  check_tensor_name("embed_norm", tensors.embed_norm, false);
  check_tensor_name("token_type_embed", tensors.token_type_embed, false);
  require_name("attn_norm", tensors.attn_norm, "every layer starts with a norm");
  require_name("o", tensors.o, "attention has an output projection");
  require_name("down", tensors.down, "the MLP has a down projection");
  if (encoder) forbid_name("lm_head", tensors.lm_head, "an encoder_only model returns its states, not logits");
  else if (!spec.tie_embeddings) require_name("lm_head", tensors.lm_head, "tie_embeddings is false");
  if (encoder) forbid_name("logits_bias", tensors.logits_bias, "an encoder_only model returns its states, not logits");
  check_tensor_name("logits_bias", tensors.logits_bias, false);
  if (spec.position == PositionType::Learned)
    require_name("pos_embed", tensors.pos_embed, "position is learned");
  else
    forbid_name("pos_embed", tensors.pos_embed, "position is not learned");
  if (spec.shared_layer_norm)
    forbid_name("ffn_norm", tensors.ffn_norm, "shared_layer_norm feeds attention and MLP from attn_norm");
  else
    require_name("ffn_norm", tensors.ffn_norm, "shared_layer_norm is false");

  if (attention.qkv_layout == QkvLayout::Separate) {
    for (const auto& [field, name] : {std::pair{"q", &tensors.q}, {"k", &tensors.k}, {"v", &tensors.v}})
      require_name(field, *name, "attention.qkv_layout is separate");
    forbid_name("qkv", tensors.qkv, "attention.qkv_layout is separate (use concat or per_head for a fused tensor)");
  } else {
    require_name("qkv", tensors.qkv, "attention.qkv_layout is " + enum_name(qkv_layout_names(), attention.qkv_layout));
    for (const auto& [field, name] : {std::pair{"q", &tensors.q}, {"k", &tensors.k}, {"v", &tensors.v}})
      forbid_name(field, *name, "attention.qkv_layout is fused (tensors.qkv)");
  }

  if (mlp.gated && mlp.gate_up_fused) {
    require_name("gate_up", tensors.gate_up, "mlp.gate_up_fused is true");
    forbid_name("gate", tensors.gate, "mlp.gate_up_fused is true (tensors.gate_up)");
    forbid_name("up", tensors.up, "mlp.gate_up_fused is true (tensors.gate_up)");
  } else {
    if (mlp.gated) require_name("gate", tensors.gate, "mlp.gated is true");
    else forbid_name("gate", tensors.gate, "mlp.gated is false");
    require_name("up", tensors.up, "the MLP has an up projection");
    forbid_name("gate_up", tensors.gate_up, "mlp.gate_up_fused is false");
  }

  SF_CHECK(spec.bos_token_id >= -1 && spec.bos_token_id < spec.vocab_size,
           "bos_token_id: {} is outside the vocabulary [0, {}) (-1 = none)", spec.bos_token_id, spec.vocab_size);
  for (size_t i = 0; i < spec.eos_token_ids.size(); ++i)
    SF_CHECK(spec.eos_token_ids[i] >= 0 && spec.eos_token_ids[i] < spec.vocab_size,
             "eos_token_ids[{}]: {} is outside the vocabulary [0, {})", i, spec.eos_token_ids[i], spec.vocab_size);
}

json spec_to_json(const ModelSpec& spec) {
  json out = json::object();
  out["name"] = spec.name;
  out["network"] = enum_name(network_names(), spec.network);
  out["hidden_size"] = spec.hidden_size;
  out["num_layers"] = spec.num_layers;
  out["vocab_size"] = spec.vocab_size;
  out["max_position"] = spec.max_position;
  out["norm"] = {{"type", enum_name(norm_names(), spec.norm.type)},
                 {"eps", spec.norm.eps},
                 {"bias", spec.norm.bias},
                 {"weight_offset", spec.norm.weight_offset},
                 {"placement", enum_name(norm_placement_names(), spec.norm.placement)}};
  const AttentionSpec& attention = spec.attention;
  out["attention"] = {{"num_heads", attention.num_heads},   {"num_kv_heads", attention.num_kv_heads},
                      {"head_dim", attention.head_dim},     {"q_bias", attention.q_bias},
                      {"k_bias", attention.k_bias},         {"v_bias", attention.v_bias},
                      {"o_bias", attention.o_bias},         {"sliding_window", attention.sliding_window},
                      {"softmax_scale", attention.softmax_scale},
                      {"logit_softcap", attention.logit_softcap},
                      {"qk_norm", attention.qk_norm},
                      {"full_attention_interval", attention.full_attention_interval},
                      {"qkv_layout", enum_name(qkv_layout_names(), attention.qkv_layout)},
                      {"causal", attention.causal}};
  if (!attention.layer_types.empty()) {
    json types = json::array();
    for (const LayerAttention type : attention.layer_types) types.push_back(enum_name(layer_attention_names(), type));
    out["attention"]["layer_types"] = types;
  }
  const MlpSpec& mlp = spec.mlp;
  out["mlp"] = {{"intermediate_size", mlp.intermediate_size},
                {"activation", enum_name(activation_names(), mlp.activation)},
                {"gated", mlp.gated},
                {"gate_up_fused", mlp.gate_up_fused},
                {"up_bias", mlp.up_bias},
                {"down_bias", mlp.down_bias}};
  out["position"] = enum_name(position_names(), spec.position);
  out["sinusoid_layout"] = enum_name(sinusoid_layout_names(), spec.sinusoid_layout);

  const auto scaling_to_json = [](const RopeScaling& scaling) {
  json scaling_json = nullptr;
  if (scaling.type != RopeScalingType::None) {
    // Fields at their defaults are left out: they read back to the same values.
    const RopeScaling defaults;
    scaling_json = {{"type", enum_name(scaling_names(), scaling.type)}, {"factor", scaling.factor}};
    if (scaling.original_max_position != defaults.original_max_position)
      scaling_json["original_max_position"] = scaling.original_max_position;
    const std::pair<const char*, double> doubles[] = {
        {"low_freq_factor", scaling.low_freq_factor}, {"high_freq_factor", scaling.high_freq_factor},
        {"beta_fast", scaling.beta_fast},             {"beta_slow", scaling.beta_slow},
        {"mscale", scaling.mscale},                   {"mscale_all_dim", scaling.mscale_all_dim},
    };
    const double default_values[] = {defaults.low_freq_factor, defaults.high_freq_factor, defaults.beta_fast,
                                     defaults.beta_slow,       defaults.mscale,           defaults.mscale_all_dim};
    for (size_t i = 0; i < std::size(doubles); ++i)
      if (doubles[i].second != default_values[i]) scaling_json[doubles[i].first] = doubles[i].second;
    if (scaling.attention_factor) scaling_json["attention_factor"] = *scaling.attention_factor;
    if (!scaling.long_factor.empty()) scaling_json["long_factor"] = scaling.long_factor;
    if (!scaling.short_factor.empty()) scaling_json["short_factor"] = scaling.short_factor;
    if (!scaling.freq_factors.empty()) scaling_json["freq_factors"] = scaling.freq_factors;
  }
  return scaling_json;
  };
  out["rope"] = {{"theta", spec.rope.theta},
                 {"partial_factor", spec.rope.partial_factor},
                 {"style", enum_name(rope_style_names(), spec.rope.style)},
                 {"scaling", scaling_to_json(spec.rope.scaling)}};
  if (spec.rope.sliding)
    out["rope"]["sliding"] = {{"theta", spec.rope.sliding->theta}, {"scaling", scaling_to_json(spec.rope.sliding->scaling)}};
  out["parallel_residual"] = spec.parallel_residual;
  out["shared_layer_norm"] = spec.shared_layer_norm;
  out["post_norms"] = spec.post_norms;
  out["tie_embeddings"] = spec.tie_embeddings;
  out["final_logit_softcap"] = spec.final_logit_softcap;
  out["embedding_multiplier"] = spec.embedding_multiplier;
  out["embedding_norm"] = spec.embedding_norm;
  out["token_types"] = spec.token_types;
  out["position_offset"] = spec.position_offset;
  out["relative_attention"] = {{"num_buckets", spec.relative_attention.num_buckets},
                                {"max_distance", spec.relative_attention.max_distance}};
  out["logits_multiplier"] = spec.logits_multiplier;
  out["decoder_start_token_id"] = spec.decoder_start_token_id;
  out["embedding"] = {{"pooling", enum_name(pooling_names(), spec.embedding.pooling)},
                      {"normalize", spec.embedding.normalize},
                      {"max_tokens", spec.embedding.max_tokens},
                      {"matryoshka", spec.embedding.matryoshka}};
  const TensorNames& tensors = spec.tensors;
  out["tensors"] = {{"weight_suffix", tensors.weight_suffix},
                    {"bias_suffix", tensors.bias_suffix},
                    {"name_prefixes", tensors.name_prefixes},
                    {"linear_transposed", tensors.linear_transposed},
                    {"lm_head_optional", tensors.lm_head_optional},
                    {"unused_prefixes", tensors.unused_prefixes},
                    {"embed", tensors.embed},
                    {"pos_embed", tensors.pos_embed},
                    {"final_norm", tensors.final_norm},
                    {"lm_head", tensors.lm_head},
                    {"attn_norm", tensors.attn_norm},
                    {"q", tensors.q},
                    {"k", tensors.k},
                    {"v", tensors.v},
                    {"qkv", tensors.qkv},
                    {"o", tensors.o},
                    {"ffn_norm", tensors.ffn_norm},
                    {"gate", tensors.gate},
                    {"up", tensors.up},
                    {"gate_up", tensors.gate_up},
                    {"down", tensors.down},
                    {"q_norm", tensors.q_norm},
                    {"k_norm", tensors.k_norm},
                    {"post_attn_norm", tensors.post_attn_norm},
                    {"post_ffn_norm", tensors.post_ffn_norm},
                    {"embed_norm", tensors.embed_norm},
                    {"token_type_embed", tensors.token_type_embed},
                    {"relative_bias", tensors.relative_bias},
                    {"cross_attn_norm", tensors.cross_attn_norm},
                    {"cross_q", tensors.cross_q},
                    {"cross_k", tensors.cross_k},
                    {"cross_v", tensors.cross_v},
                    {"cross_o", tensors.cross_o},
                    {"logits_bias", tensors.logits_bias}};
  out["bos_token_id"] = spec.bos_token_id;
  out["eos_token_ids"] = spec.eos_token_ids;
  if (!spec.encoder.empty()) out["encoder"] = spec_to_json(spec.encoder.front());
  return out;
}

}  // namespace splitflow
