// tests/hf_fixture_runner.h — drives a ModelRunner through one HF transformers fixture
// (tests/fixtures/hf/<name>, format in python/README.md) the way transformers produced it: each
// prompt prefilled in LogitsMode::All, then the cached decode steps fed with the reference's greedy
// tokens (so one near-tie cannot derail the rest). The caller judges each block of logits.
#pragma once

#include "formats/weight_source.h"
#include "model/config.h"
#include "runtime/block_allocator.h"
#include "runtime/model_runner.h"
#include "test_paths.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

namespace splitflow::test {

inline std::vector<std::string> hf_fixture_names() {
  const nlohmann::json index = read_json_file(fixture_path("hf/index.json"));
  return index.at("fixtures").get<std::vector<std::string>>();
}

// actual and expected: [rows, vocab]; next_token: the reference's greedy choice after the block's
// last row (-1 after the final decode step); what: "llama prompt0. prefill" and the like.
using LogitsCheck = std::function<void(const float* actual, const float* expected, int64_t rows, int32_t next_token,
                                       const std::string& what)>;

inline void run_hf_fixture(ModelRunner& runner, const std::string& name, const LogitsCheck& check) {
  const std::string dir = fixture_path("hf/" + name);
  const std::unique_ptr<WeightSource> expected = open_safetensors(dir + "/expected.safetensors");
  const nlohmann::json meta = read_json_file(dir + "/meta.json");
  const KvCacheConfig& kv = runner.kv_config();
  const int64_t vocab = runner.spec().vocab_size;

  for (int p = 0; p < meta.at("num_prompts").get<int>(); ++p) {
    const std::string prefix = "prompt" + std::to_string(p) + ".";
    const Tensor& prompt = expected->find(prefix + "prompt_tokens")->tensor;
    const Tensor& prefill_logits = expected->find(prefix + "prefill_logits")->tensor;
    const Tensor& decode_tokens = expected->find(prefix + "decode_tokens")->tensor;
    const Tensor& decode_logits = expected->find(prefix + "decode_logits")->tensor;
    const int64_t prompt_len = prompt.numel(), steps = decode_tokens.numel();
    const int32_t* greedy = decode_tokens.as<int32_t>();

    // Blocks handed out in reverse so the block table is not the identity.
    BlockAllocator allocator(kv.num_blocks);
    std::vector<int32_t> table;
    allocator.grow_table(table, prompt_len + steps, kv.block_size);
    std::reverse(table.begin(), table.end());

    ForwardBatch prefill;
    prefill.token_ids.assign(prompt.as<int32_t>(), prompt.as<int32_t>() + prompt_len);
    prefill.spans.push_back({static_cast<int32_t>(prompt_len), 0, table, true});
    prefill.logits_mode = LogitsMode::All;
    const Tensor logits = runner.forward(prefill);
    check(logits.as<float>(), prefill_logits.as<float>(), prompt_len, greedy[0], name + " " + prefix + "prefill");

    for (int64_t step = 0; step < steps; ++step) {
      ForwardBatch decode;
      decode.token_ids = {greedy[step]};
      decode.spans.push_back({1, static_cast<int32_t>(prompt_len + step), table, true});
      const Tensor row = runner.forward(decode);
      check(row.as<float>(), decode_logits.as<float>() + step * vocab, 1, step + 1 < steps ? greedy[step + 1] : -1,
            name + " " + prefix + "decode step " + std::to_string(step));
    }
  }
}

}  // namespace splitflow::test
