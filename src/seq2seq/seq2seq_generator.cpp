#include "seq2seq/seq2seq_generator.h"

#include "core/error.h"
#include "runtime/block_allocator.h"

#include <algorithm>
#include <chrono>
#include <optional>

namespace splitflow {
namespace {
double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}
}  // namespace

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
  Sampler sampler(params, spec.vocab_size);
  StopChecker stop(params, tokenizer ? tokenizer->eos_ids()
                                     : std::vector<int32_t>(spec.eos_token_ids.begin(), spec.eos_token_ids.end()));
  std::optional<StreamDecoder> stream;
  if (tokenizer) stream.emplace(*tokenizer, /*skip_special=*/true);

  GenerationResult result;
  result.prompt_tokens = prompt_len;
  size_t streamed_bytes = 0;
  const auto prefill_start = std::chrono::steady_clock::now();
  allocator.grow_table(block_table, prompt_len, block_size);
  ForwardBatch prompt;
  prompt.token_ids = prompt_ids;
  prompt.spans.push_back({static_cast<int32_t>(prompt_len), 0, block_table, false});
  runner.encode(prompt);

  // The decoder's inputs so far (the start token, then the sampled ones): penalties look at these.
  std::vector<int32_t> decoder_inputs = {spec.decoder_start_token_id};
  auto decode_start = std::chrono::steady_clock::now();
  int64_t position = 0;
  int32_t token = spec.decoder_start_token_id;
  while (true) {
    ForwardBatch step;
    step.token_ids = {token};
    allocator.grow_table(block_table, std::max<int64_t>(prompt_len, position + 1), block_size);
    SequenceSpan span{1, static_cast<int32_t>(position), block_table, true};
    span.encoder_tokens = static_cast<int32_t>(prompt_len);
    step.spans.push_back(std::move(span));
    const Tensor logits = decoder.forward(step);
    ++position;
    const auto row = std::span<const float>(logits.as<float>(), static_cast<size_t>(spec.vocab_size));
    if (on_logits) on_logits(row);
    token = sampler.sample(row, decoder_inputs, result.output_ids).token_id;
    result.output_ids.push_back(token);
    if (result.output_ids.size() == 1) {
      result.prefill_seconds = seconds_since(prefill_start);
      decode_start = std::chrono::steady_clock::now();
    }
    stop.append(token, stream ? stream->push(token) : std::string());
    if (stop.finished()) break;
    if (position >= context) {
      result.finish_reason = FinishReason::Length;  // no room to feed the token back
      break;
    }
    if (on_text && stop.safe_bytes() > streamed_bytes) {
      on_text(std::string_view(stop.text()).substr(streamed_bytes, stop.safe_bytes() - streamed_bytes));
      streamed_bytes = stop.safe_bytes();
    }
  }
  if (stop.finished()) {
    if (stream) stop.append_final_text(stream->finish());
    result.finish_reason = stop.finish_reason();
  }
  if (on_text && stop.text().size() > streamed_bytes) on_text(std::string_view(stop.text()).substr(streamed_bytes));
  result.text = stop.text();
  result.decode_seconds = result.output_ids.size() > 1 ? seconds_since(decode_start) : 0.0;
  return result;
}

}  // namespace splitflow
