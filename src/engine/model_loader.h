// engine/model_loader.h — turns what a user names on the command line (a model path, or a config
// plus --dummy-weights, and optional spec / tokenizer overrides) into a ready model: the resolved
// spec, the weights in canonical layout and the tokenizer. Every failure is a splitflow::Error
// naming the file or option at fault.
#pragma once

#include "core/dtype.h"
#include "model/spec.h"
#include "model/weights.h"
#include "tokenizer/tokenizer.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace splitflow {

struct ModelLoadOptions {
  std::string model_path;      // HF directory, .gguf, .safetensors or llama2.c .bin
  std::string spec_path;       // user spec file overriding any field of the resolved spec
  std::string config_path;     // --dummy-weights: a HF config.json or a spec file
  std::string tokenizer_path;  // overrides the tokenizer found next to the model
  bool dummy_weights = false;  // seeded random weights of the spec's shapes, no checkpoint
  uint64_t seed = 0;           // for dummy weights
  // Matrices' dtype in memory; unset keeps the checkpoint's (bf16 for dummy weights).
  std::optional<DType> weight_dtype;
  // --quantization: float projection matrices (and an untied lm_head) quantized to this type
  // while loading (model/weights.h); checkpoint matrices already quantized stay as stored.
  std::optional<DType> quantization;
  // Who does that arithmetic (model/weights.h): empty, quant::quantize on the host; the CLI gives
  // a CudaMatrixQuantizer (backend/backend.h: device memory, its buffers kept for the whole load)
  // with --device cuda unless SPLITFLOW_QUANTIZE_ON_DEVICE=0.
  MatrixQuantizer quantizer;
};

struct LoadedModel {
  ModelSpec spec;
  ModelWeights weights;
  std::unique_ptr<Tokenizer> tokenizer;  // null for dummy weights or a directory without one (ids only)
  std::string description;              // "stories260K-hf (safetensors, f32)" for logs
};

LoadedModel load_model(const ModelLoadOptions& options);

// The most common matrix dtype among a source's 2-D float tensors (F32 when none).
DType dominant_matrix_dtype(const class WeightSource& source);

}  // namespace splitflow
