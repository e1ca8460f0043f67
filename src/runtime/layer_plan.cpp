#include "runtime/layer_plan.h"

#include "core/error.h"

namespace splitflow {

std::string_view slot_name(Slot slot) {
  switch (slot) {
    case Slot::None: return "none";
    case Slot::Hidden: return "hidden";
    case Slot::AttnIn: return "attn_in";
    case Slot::MlpIn: return "mlp_in";
    case Slot::Qkv: return "qkv";
    case Slot::AttnOut: return "attn_out";
    case Slot::MlpUp: return "mlp_up";
    case Slot::MlpAct: return "mlp_act";
    case Slot::Proj: return "proj";
    case Slot::CrossQ: return "cross_q";
  }
  return "?";
}

std::string_view layer_weight_name(LayerWeight weight) {
  switch (weight) {
    case LayerWeight::None: return "none";
    case LayerWeight::AttnNorm: return "attn_norm";
    case LayerWeight::FfnNorm: return "ffn_norm";
    case LayerWeight::Qkv: return "qkv";
    case LayerWeight::Output: return "o";
    case LayerWeight::GateUp: return "gate_up";
    case LayerWeight::Down: return "down";
    case LayerWeight::QkNorm: return "qk_norm";
    case LayerWeight::PostAttnNorm: return "post_attn_norm";
    case LayerWeight::PostFfnNorm: return "post_ffn_norm";
    case LayerWeight::CrossAttnNorm: return "cross_attn_norm";
    case LayerWeight::CrossQ: return "cross_q";
    case LayerWeight::CrossOutput: return "cross_o";
    case LayerWeight::PositionBias: return "position_bias";
  }
  return "?";
}

namespace {

std::string_view step_name(StepKind kind) {
  switch (kind) {
    case StepKind::Norm: return "norm";
    case StepKind::Linear: return "linear";
    case StepKind::LinearRopeWriteKv: return "linear+rope_write_kv";
    case StepKind::WriteKv: return "write_kv";
    case StepKind::Attention: return "attention";
    case StepKind::CrossAttention: return "cross_attention";
    case StepKind::LinearActivation: return "linear+activation";
    case StepKind::QkNorm: return "qk_norm";
    case StepKind::RopeWriteKv: return "rope_write_kv";
    case StepKind::NormAdd: return "norm_add";
    case StepKind::Allreduce: return "allreduce";
  }
  return "?";
}

}  // namespace

std::string LayerPlan::describe() const {
  std::string out;
  for (const PlanStep& step : steps) {
    if (step.norm != LayerWeight::None) {
      out += "norm ";
      out += layer_weight_name(step.norm);
      if (step.norm_bias) out += "+bias";
      out += " + ";
    }
    out += step_name(step.kind);
    if (step.weight != LayerWeight::None) {
      out += ' ';
      out += layer_weight_name(step.weight);
      if (step.bias) out += "+bias";
    }
    out += ": ";
    out += slot_name(step.input);
    if (step.output != Slot::None && step.output != step.input) {
      out += step.accumulate || step.kind == StepKind::NormAdd || step.kind == StepKind::Allreduce ? " ->+ " : " -> ";
      out += slot_name(step.output);
    }
    if (step.normed != Slot::None) {
      out += " normed in ";
      out += slot_name(step.normed);
    }
    if (step.product != Slot::None) {
      out += " via ";
      out += slot_name(step.product);
    }
    out += '\n';
  }
  return out;
}

namespace {

// The attention step's extra weight: the relative position bias table when positions are relative.
LayerWeight attention_bias(const ModelSpec& spec) {
  return spec.position == PositionType::Relative ? LayerWeight::PositionBias : LayerWeight::None;
}

// Post-norm (BERT): hidden = norm(hidden + attention(hidden)); hidden = norm(hidden + mlp(hidden)).
// The residual adds are the output projections' epilogues; each norm runs in place on hidden.
LayerPlan build_post_norm_plan(const ModelSpec& spec) {
  SF_CHECK(!spec.parallel_residual && !spec.post_norms && !spec.attention.qk_norm,
           "norm.placement: post is not with parallel_residual, post_norms or attention.qk_norm");
  const AttentionSpec& attention = spec.attention;
  const bool norm_bias = spec.norm.bias;
  LayerPlan plan;
  std::vector<PlanStep>& steps = plan.steps;
  steps.reserve(12);
  steps.push_back({StepKind::Linear, Slot::Hidden, Slot::Qkv, LayerWeight::Qkv,
                   attention.q_bias || attention.k_bias || attention.v_bias});
  steps.push_back({spec.position == PositionType::Rope ? StepKind::RopeWriteKv : StepKind::WriteKv, Slot::Qkv});
  steps.push_back({StepKind::Attention, Slot::Qkv, Slot::AttnOut, attention_bias(spec)});
  steps.push_back({StepKind::Linear, Slot::AttnOut, Slot::Hidden, LayerWeight::Output, attention.o_bias, true});
  steps.push_back({StepKind::Norm, Slot::Hidden, Slot::Hidden, LayerWeight::AttnNorm, norm_bias});
  if (spec.network == NetworkType::EncoderDecoder) {  // BART: hidden = norm(hidden + cross_attention(hidden))
    steps.push_back({StepKind::Linear, Slot::Hidden, Slot::CrossQ, LayerWeight::CrossQ, attention.q_bias});
    steps.push_back({StepKind::CrossAttention, Slot::CrossQ, Slot::AttnOut});
    steps.push_back({StepKind::Linear, Slot::AttnOut, Slot::Hidden, LayerWeight::CrossOutput, attention.o_bias, true});
    steps.push_back({StepKind::Norm, Slot::Hidden, Slot::Hidden, LayerWeight::CrossAttnNorm, norm_bias});
  }
  PlanStep up{StepKind::LinearActivation, Slot::Hidden, Slot::MlpAct, LayerWeight::GateUp, spec.mlp.up_bias};
  up.product = Slot::MlpUp;
  steps.push_back(up);
  steps.push_back({StepKind::Linear, Slot::MlpAct, Slot::Hidden, LayerWeight::Down, spec.mlp.down_bias, true});
  steps.push_back({StepKind::Norm, Slot::Hidden, Slot::Hidden, LayerWeight::FfnNorm, norm_bias});
  return plan;
}

}  // namespace

LayerPlan build_layer_plan(const ModelSpec& spec) {
  SF_CHECK(!spec.shared_layer_norm || spec.parallel_residual,
           "shared_layer_norm: needs parallel_residual (a sequential layer normalises the MLP input separately)");
  const bool norm_bias = spec.norm.bias;
  const AttentionSpec& attention = spec.attention;
  const bool qkv_bias = attention.q_bias || attention.k_bias || attention.v_bias;

  LayerPlan plan;
  std::vector<PlanStep>& steps = plan.steps;
  steps.reserve(16);  // at most 16 steps; also keeps GCC 12 from a false -Wstringop-overflow on push_back
  if (spec.norm.placement == NormPlacement::Post) return build_post_norm_plan(spec);
  // A sequential layer's norms each feed one projection: the projection step takes the norm
  // (a backend may fuse the two). A parallel residual takes both norms before the attention's add.
  const bool sequential = !spec.parallel_residual;
  const bool rope = spec.position == PositionType::Rope;
  // QK-norm sits between the projection and RoPE: no fused projection + RoPE + KV write.
  const bool qk_norm = attention.qk_norm;
  SF_CHECK(!spec.post_norms || sequential, "post_norms: not with parallel_residual");
  if (!sequential || !rope || qk_norm) steps.push_back({StepKind::Norm, Slot::Hidden, Slot::AttnIn, LayerWeight::AttnNorm, norm_bias});
  if (spec.parallel_residual && !spec.shared_layer_norm)
    steps.push_back({StepKind::Norm, Slot::Hidden, Slot::MlpIn, LayerWeight::FfnNorm, norm_bias});

  if (qk_norm) {
    steps.push_back({StepKind::Linear, Slot::AttnIn, Slot::Qkv, LayerWeight::Qkv, qkv_bias});
    steps.push_back({StepKind::QkNorm, Slot::Qkv, Slot::Qkv, LayerWeight::QkNorm});
    steps.push_back({rope ? StepKind::RopeWriteKv : StepKind::WriteKv, Slot::Qkv});
  } else if (rope) {
    PlanStep qkv{StepKind::LinearRopeWriteKv, Slot::AttnIn, Slot::Qkv, LayerWeight::Qkv, qkv_bias};
    if (sequential) {
      qkv.input = Slot::Hidden;
      qkv.norm = LayerWeight::AttnNorm;
      qkv.norm_bias = norm_bias;
      qkv.normed = Slot::AttnIn;
    }
    steps.push_back(qkv);
  } else {
    steps.push_back({StepKind::Linear, Slot::AttnIn, Slot::Qkv, LayerWeight::Qkv, qkv_bias});
    steps.push_back({StepKind::WriteKv, Slot::Qkv});
  }
  steps.push_back({StepKind::Attention, Slot::Qkv, Slot::AttnOut, attention_bias(spec)});
  // With a parallel residual both norms were taken before this add, as the architecture wants.
  if (spec.post_norms) {
    steps.push_back({StepKind::Linear, Slot::AttnOut, Slot::Proj, LayerWeight::Output, attention.o_bias});
    steps.push_back({StepKind::NormAdd, Slot::Proj, Slot::Hidden, LayerWeight::PostAttnNorm});
  } else {
    steps.push_back({StepKind::Linear, Slot::AttnOut, Slot::Hidden, LayerWeight::Output, attention.o_bias, true});
  }
  if (spec.network == NetworkType::EncoderDecoder) {
    SF_CHECK(sequential && !spec.post_norms, "network: encoder_decoder decoder layers are sequential pre-norm layers");
    steps.push_back({StepKind::Norm, Slot::Hidden, Slot::AttnIn, LayerWeight::CrossAttnNorm, norm_bias});
    steps.push_back({StepKind::Linear, Slot::AttnIn, Slot::CrossQ, LayerWeight::CrossQ, attention.q_bias});
    steps.push_back({StepKind::CrossAttention, Slot::CrossQ, Slot::AttnOut});
    steps.push_back({StepKind::Linear, Slot::AttnOut, Slot::Hidden, LayerWeight::CrossOutput, attention.o_bias, true});
  }

  PlanStep up{StepKind::LinearActivation, Slot::MlpIn, Slot::MlpAct, LayerWeight::GateUp, spec.mlp.up_bias};
  up.product = Slot::MlpUp;
  if (sequential) {
    up.input = Slot::Hidden;
    up.norm = LayerWeight::FfnNorm;
    up.norm_bias = norm_bias;
    up.normed = Slot::MlpIn;
  } else if (spec.shared_layer_norm) {
    up.input = Slot::AttnIn;
  }
  steps.push_back(up);
  if (spec.post_norms) {
    steps.push_back({StepKind::Linear, Slot::MlpAct, Slot::Proj, LayerWeight::Down, spec.mlp.down_bias});
    steps.push_back({StepKind::NormAdd, Slot::Proj, Slot::Hidden, LayerWeight::PostFfnNorm});
  } else {
    steps.push_back({StepKind::Linear, Slot::MlpAct, Slot::Hidden, LayerWeight::Down, spec.mlp.down_bias, true});
  }
  return plan;
}

}  // namespace splitflow
