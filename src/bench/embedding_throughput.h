// bench/embedding_throughput.h — `splitflow bench embed`: offline embedding throughput. N inputs of
// input_len token ids (the tokenizer's [CLS] ... [SEP] frame around seeded random ids, when it has
// one) go through an EmbeddingEngine (embedding/embedding_engine.h) on the model's runner, one pass
// to warm up, then `repetitions` timed passes. Reports tokens/s and inputs/s (the median pass) and
// the forward's FLOPs against the GEMM roofline measured in the same run: the layers' matrices
// (2 x parameters per token) plus bidirectional attention (QK^T and PV: 4 x input_len x q width
// per token and layer).
#pragma once

#include "backend/backend.h"
#include "engine/model_loader.h"

#include <nlohmann/json.hpp>

#include <cstdint>

namespace splitflow::bench {

struct EmbeddingBenchOptions {
  int32_t num_inputs = 4096;
  int32_t input_len = 32;           // tokens per input, the frame included
  int32_t max_batch_tokens = 16384;  // tokens of one forward
  int32_t max_seqs = 512;           // inputs of one forward
  int32_t repetitions = 3;
  int32_t block_size = 16;
  uint64_t seed = 0;
};

// FLOPs of embedding one input of `input_len` tokens with `spec` (see the header).
double embedding_flops_per_input(const ModelSpec& spec, int64_t input_len);

// Throws naming the option at fault: counts below 1, an input longer than the model takes or than
// one step holds, a model that is not encoder_only.
nlohmann::json run_embedding_throughput(LoadedModel model, Backend& backend, const EmbeddingBenchOptions& options,
                                        double gemm_tflops);

}  // namespace splitflow::bench
