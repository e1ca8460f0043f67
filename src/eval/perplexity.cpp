#include "eval/perplexity.h"

#include "core/error.h"

#include <algorithm>
#include <cmath>

namespace splitflow {

PerplexityResult perplexity(std::span<const int32_t> tokens, const PerplexityOptions& options,
                            const ChunkLogits& chunk_logits, const std::function<void(const PerplexityChunk&)>& on_chunk) {
  const int64_t n_ctx = options.n_ctx;
  SF_CHECK(n_ctx >= 4, "perplexity: a context of {} tokens is too short (at least 4)", n_ctx);
  SF_CHECK(static_cast<int64_t>(tokens.size()) >= 2 * n_ctx,
           "perplexity: the text has {} tokens; scoring needs at least 2 x the context ({} tokens): use a longer "
           "file or a smaller --ctx", tokens.size(), 2 * n_ctx);
  int64_t chunks = static_cast<int64_t>(tokens.size()) / n_ctx;
  if (options.max_chunks >= 0) chunks = std::min<int64_t>(chunks, options.max_chunks);
  SF_CHECK(chunks > 0, "perplexity: --chunks {} leaves nothing to score", options.max_chunks);

  const int64_t first = n_ctx / 2;
  PerplexityResult result;
  double nll_sum = 0, nll2_sum = 0;
  std::vector<int32_t> chunk(static_cast<size_t>(n_ctx));
  for (int64_t c = 0; c < chunks; ++c) {
    std::copy_n(tokens.begin() + c * n_ctx, n_ctx, chunk.begin());
    if (options.bos_token_id >= 0) chunk[0] = options.bos_token_id;
    const Tensor logits = chunk_logits(chunk);
    SF_CHECK(logits.dtype == DType::F32 && logits.shape.size() == 2 && logits.dim(0) == n_ctx,
             "perplexity: chunk {} logits are {} {}, expected [{}, vocab] f32", c, dtype_name(logits.dtype),
             shape_str(logits.shape), n_ctx);
    const int64_t vocab = logits.dim(1);
    double chunk_nll = 0;
    for (int64_t j = first; j < n_ctx - 1; ++j) {
      const float* row = logits.as<float>() + j * vocab;
      // The token scored is the text's, not the BOS that may replace a chunk's first token.
      const int32_t next = tokens[static_cast<size_t>(c * n_ctx + j + 1)];
      SF_CHECK(next >= 0 && next < vocab, "perplexity: token {} is outside the {}-entry vocabulary", next, vocab);
      const float max = *std::max_element(row, row + vocab);
      double sum_exp = 0;
      for (int64_t v = 0; v < vocab; ++v) sum_exp += std::exp(static_cast<double>(row[v]) - max);
      const double nll = -(static_cast<double>(row[next]) - max - std::log(sum_exp));
      chunk_nll += nll;
      nll_sum += nll;
      nll2_sum += nll * nll;
    }
    result.scored_tokens += n_ctx - 1 - first;
    PerplexityChunk done{static_cast<int32_t>(c), std::exp(chunk_nll / double(n_ctx - 1 - first)),
                         std::exp(nll_sum / double(result.scored_tokens))};
    result.per_chunk.push_back(done);
    if (on_chunk) on_chunk(done);
  }
  result.chunks = static_cast<int32_t>(chunks);
  result.evaluated_tokens = chunks * n_ctx;
  const double count = static_cast<double>(result.scored_tokens);
  result.mean_nll = nll_sum / count;
  result.ppl = std::exp(result.mean_nll);
  const double variance = nll2_sum / count - result.mean_nll * result.mean_nll;
  result.ppl_stderr = variance > 0 && count > 1 ? result.ppl * std::sqrt(variance / (count - 1)) : 0.0;
  return result;
}

}  // namespace splitflow
