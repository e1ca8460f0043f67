#include "engine/generator.h"

#include "core/error.h"
#include "runtime/block_allocator.h"

#include <algorithm>
#include <chrono>

namespace splitflow {

namespace {
double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}
}  // namespace

int32_t blocks_for_tokens(int64_t max_tokens, int32_t block_size) {
  return static_cast<int32_t>((max_tokens + block_size - 1) / block_size);
}

Generator::Generator(ModelRunner& runner, const Tokenizer* tokenizer) : runner_(runner), tokenizer_(tokenizer) {
  SF_CHECK(!runner.encoder_decoder(), "generator: an encoder_decoder model generates through seq2seq/ "
                                      "(generate_seq2seq), its prompt going to the encoder");
}

GenerationResult Generator::generate(const std::vector<int32_t>& prompt_ids, const SamplingParams& params,
                                     const std::function<void(std::string_view)>& on_text,
                                     const std::function<void(std::span<const float>)>& on_logits) {
  const ModelSpec& spec = runner_.spec();
  params.validate();
  params.validate_token_ids(spec.vocab_size);
  SF_CHECK(!prompt_ids.empty(), "the prompt is empty: give some text (or ids) to continue");
  for (size_t i = 0; i < prompt_ids.size(); ++i) {
    SF_CHECK(prompt_ids[i] >= 0 && prompt_ids[i] < spec.vocab_size,
             "prompt token {} at index {} is outside the vocabulary [0, {})", prompt_ids[i], i, spec.vocab_size);
  }
  const int64_t prompt_len = static_cast<int64_t>(prompt_ids.size());
  const int64_t context = std::min<int64_t>(
      runner_.context_limit(), static_cast<int64_t>(runner_.kv_config().num_blocks) * runner_.kv_config().block_size);
  SF_CHECK(prompt_len <= context, "the prompt has {} tokens but the model's context holds {}", prompt_len, context);

  const int32_t block_size = runner_.kv_config().block_size;
  BlockAllocator allocator(runner_.kv_config().num_blocks);
  std::vector<int32_t> block_table;

  // Prefill in chunks of the runner's token budget; only the last chunk asks for logits.
  const auto prefill_start = std::chrono::steady_clock::now();
  Tensor logits;
  const int64_t chunk = runner_.limits().max_batch_tokens;
  for (int64_t start = 0; start < prompt_len; start += chunk) {
    const int64_t count = std::min(chunk, prompt_len - start);
    ForwardBatch batch;
    batch.token_ids.assign(prompt_ids.begin() + start, prompt_ids.begin() + start + count);
    allocator.grow_table(block_table, start + count, block_size);
    batch.spans.push_back({static_cast<int32_t>(count), static_cast<int32_t>(start), block_table,
                           start + count == prompt_len});
    logits = runner_.forward(batch);
  }
  const auto feed = [&](int32_t token, int64_t position) {
    ForwardBatch batch;
    batch.token_ids = {token};
    allocator.grow_table(block_table, position + 1, block_size);
    batch.spans.push_back({1, static_cast<int32_t>(position), block_table, true});
    return runner_.forward(batch);
  };
  GenerationResult result = decode_sequence(spec, tokenizer_, params, prompt_ids, std::move(logits), prompt_len,
                                            context, feed, prefill_start, on_text, on_logits);
  result.prompt_tokens = prompt_len;
  return result;
}

GenerationResult decode_sequence(const ModelSpec& spec, const Tokenizer* tokenizer, const SamplingParams& params,
                                 std::span<const int32_t> penalty_prompt, Tensor logits, int64_t position,
                                 int64_t context, const std::function<Tensor(int32_t token, int64_t position)>& feed,
                                 std::chrono::steady_clock::time_point prefill_start,
                                 const std::function<void(std::string_view)>& on_text,
                                 const std::function<void(std::span<const float>)>& on_logits) {
  Sampler sampler(params, spec.vocab_size);
  StopChecker stop(params, tokenizer ? tokenizer->eos_ids() : std::vector<int32_t>(spec.eos_token_ids.begin(),
                                                                                      spec.eos_token_ids.end()));
  std::optional<StreamDecoder> decoder;
  if (tokenizer) decoder.emplace(*tokenizer, /*skip_special=*/true);

  GenerationResult result;
  size_t streamed_bytes = 0;
  auto decode_start = std::chrono::steady_clock::now();
  while (true) {
    const auto row = std::span<const float>(logits.as<float>(), static_cast<size_t>(spec.vocab_size));
    if (on_logits) on_logits(row);
    const int32_t token = sampler.sample(row, penalty_prompt, result.output_ids).token_id;
    result.output_ids.push_back(token);
    if (result.output_ids.size() == 1) {
      result.prefill_seconds = seconds_since(prefill_start);
      decode_start = std::chrono::steady_clock::now();
    }
    stop.append(token, decoder ? decoder->push(token) : std::string());
    if (stop.finished()) break;
    if (position >= context) {
      result.finish_reason = FinishReason::Length;  // no room to feed the token back
      break;
    }
    if (on_text && stop.safe_bytes() > streamed_bytes) {
      on_text(std::string_view(stop.text()).substr(streamed_bytes, stop.safe_bytes() - streamed_bytes));
      streamed_bytes = stop.safe_bytes();
    }
    logits = feed(token, position);
    ++position;
  }
  if (stop.finished()) {
    if (decoder) stop.append_final_text(decoder->finish());
    result.finish_reason = stop.finish_reason();
  }
  // Whatever was held back as a possible stop-string prefix is final now.
  if (on_text && stop.text().size() > streamed_bytes) on_text(std::string_view(stop.text()).substr(streamed_bytes));
  result.text = stop.text();
  result.decode_seconds = result.output_ids.size() > 1 ? seconds_since(decode_start) : 0.0;
  return result;
}

}  // namespace splitflow
