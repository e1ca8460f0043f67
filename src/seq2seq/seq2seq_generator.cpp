#include "seq2seq/seq2seq_generator.h"

#include "core/error.h"
#include "runtime/block_allocator.h"

#include <algorithm>
#include <chrono>

namespace splitflow {

GenerationResult generate_seq2seq(Seq2SeqRunner& runner, const Tokenizer* tokenizer,
                                  const std::vector<int32_t>& prompt_ids, const SamplingParams& params,
                                  const std::function<void(std::string_view)>& on_text,
                                  const std::function<void(std::span<const float>)>& on_logits) {
  ModelRunner& decoder = runner.decoder();
  const ModelSpec& spec = runner.spec();
  params.validate();
  params.validate_token_ids(spec.vocab_size);
  SF_CHECK(!prompt_ids.empty(), "the prompt is empty: give some text (or ids) for the encoder");
  for (size_t i = 0; i < prompt_ids.size(); ++i)
    SF_CHECK(prompt_ids[i] >= 0 && prompt_ids[i] < spec.vocab_size,
             "prompt token {} at index {} is outside the vocabulary [0, {})", prompt_ids[i], i, spec.vocab_size);
  const int64_t prompt_len = static_cast<int64_t>(prompt_ids.size());
  SF_CHECK(prompt_len <= runner.max_prompt_tokens(),
           "the prompt has {} tokens but the encoder takes at most {} in one forward", prompt_len,
           runner.max_prompt_tokens());
  const int32_t block_size = decoder.kv_config().block_size;
  const int64_t cache_tokens = int64_t{decoder.kv_config().num_blocks} * block_size;
  SF_CHECK(prompt_len < cache_tokens, "the prompt has {} tokens but the KV cache holds {}", prompt_len, cache_tokens);
  const int64_t context = std::min<int64_t>(decoder.context_limit(), cache_tokens);

  BlockAllocator allocator(decoder.kv_config().num_blocks);
  std::vector<int32_t> block_table;
  const auto prefill_start = std::chrono::steady_clock::now();
  allocator.grow_table(block_table, prompt_len, block_size);
  ForwardBatch prompt;
  prompt.token_ids = prompt_ids;
  prompt.spans.push_back({static_cast<int32_t>(prompt_len), 0, block_table, false});
  runner.encode(prompt);

  // The decoder's step at `position`; its blocks also hold the encoder's cross K/V.
  const auto feed = [&](int32_t token, int64_t position) {
    ForwardBatch step;
    step.token_ids = {token};
    allocator.grow_table(block_table, std::max<int64_t>(prompt_len, position + 1), block_size);
    SequenceSpan span{1, static_cast<int32_t>(position), block_table, true};
    span.encoder_tokens = static_cast<int32_t>(prompt_len);
    step.spans.push_back(std::move(span));
    return decoder.forward(step);
  };
  // Penalties see the decoder's start token as the prompt.
  const int32_t start_token = spec.decoder_start_token_id;
  GenerationResult result = decode_sequence(spec, tokenizer, params, std::span<const int32_t>(&start_token, 1),
                                            feed(start_token, 0), 1, context, feed, prefill_start, on_text, on_logits);
  result.prompt_tokens = prompt_len;
  return result;
}

}  // namespace splitflow
