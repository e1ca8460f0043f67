#include "splitwise/kv_export.h"

#include "core/error.h"

#include <spdlog/spdlog.h>

namespace splitflow::splitwise {

KvExporter::KvExporter(AsyncEngine& engine, KvCache cache) : engine_(engine), cache_(std::move(cache)) {}

void KvExporter::start(TransferRequest request, std::shared_ptr<KvSendChannel> channel) {
  if (!(request.layout == cache_.layout)) {
    throw Error(fmt::format("the token instance's KV layout ({}) is not this prompt instance's ({}): both must serve "
                            "the same model with the same --kv-cache-dtype",
                            request.layout.describe(), cache_.layout.describe()));
  }
  const int64_t tokens = static_cast<int64_t>(request.token_ids.size());
  pending_tokens_ += tokens;
  engine_.post([this, request = std::move(request), channel = std::move(channel), tokens](Engine& engine) mutable {
    if (channel->closed()) {
      pending_tokens_ -= tokens;
      return;
    }
    SamplingParams params;  // the prompt's KV only: one greedy token, dropped
    params.max_tokens = 1;
    params.temperature = 0.0f;
    params.ignore_eos = true;
    try {
      const int64_t id = engine.add_request(std::move(request.token_ids), params, 1);
      Export state;
      state.channel = std::move(channel);
      state.mode = request.mode;
      state.num_tokens = static_cast<int32_t>(tokens);
      state.sent.assign(static_cast<size_t>(cache_.layout.num_layers), 0);
      exports_.emplace(id, std::move(state));
    } catch (const std::exception& e) {
      pending_tokens_ -= tokens;
      channel->fail(e.what());
    }
  });
}

void KvExporter::step_begin(std::span<const KvStepSpan> spans) {
  if (in_step_) {
    // The previous step never ended: its forward failed. Its exports cannot be trusted: fail them.
    for (const KvStepSpan& span : step_spans_) {
      const auto it = exports_.find(span.request_id);
      if (it == exports_.end()) continue;
      it->second.channel->fail("the prompt instance's engine step failed");
      pending_tokens_ -= it->second.num_tokens;
      exports_.erase(it);
      engine_.post([id = span.request_id](Engine& engine) { engine.abort(id); });
    }
  }
  step_spans_.clear();
  for (const KvStepSpan& span : spans) {
    const auto it = exports_.find(span.request_id);
    if (it == exports_.end()) continue;
    if (it->second.channel->closed()) continue;  // aborted after the step (step_end)
    step_spans_.push_back(span);
  }
  in_step_ = true;
}

void KvExporter::send_layer(Export& state, const KvStepSpan& span, int32_t layer, int32_t end) {
  int32_t& sent = state.sent[static_cast<size_t>(layer)];
  if (end <= sent) return;
  state.channel->send_rows(cache_, layer, sent, end - sent, span.block_table);
  sent = end;
}

void KvExporter::layer_done(int32_t layer) {
  if (!in_step_) return;  // a warm-up forward
  for (const KvStepSpan& span : step_spans_) {
    Export& state = exports_.at(span.request_id);
    if (state.mode == TransferMode::LayerWise) send_layer(state, span, layer, span.start_position + span.num_tokens);
  }
}

void KvExporter::step_end() {
  in_step_ = false;
  for (const KvStepSpan& span : step_spans_) {
    Export& state = exports_.at(span.request_id);
    if (span.start_position + span.num_tokens < state.num_tokens) continue;
    // The prompt is computed; its blocks are released once this step's postprocess runs.
    if (state.mode == TransferMode::Serialized) {
      for (int32_t layer = 0; layer < cache_.layout.num_layers; ++layer) send_layer(state, span, layer, state.num_tokens);
    }
    state.channel->finish(TransferStats{});
    pending_tokens_ -= state.num_tokens;
    exports_.erase(span.request_id);
  }
  step_spans_.clear();
  // Receivers that went away: their prefills stop (aborted before the next step).
  for (auto it = exports_.begin(); it != exports_.end();) {
    if (!it->second.channel->closed()) {
      ++it;
      continue;
    }
    const int64_t id = it->first;
    pending_tokens_ -= it->second.num_tokens;
    it = exports_.erase(it);
    engine_.post([id](Engine& engine) { engine.abort(id); });
    spdlog::info("kv export: request {} aborted, its token instance went away", id);
  }
}

}  // namespace splitflow::splitwise
