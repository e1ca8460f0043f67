#include "server/async_engine.h"

#include "core/error.h"

#include <fmt/format.h>

#include <cstdio>
#include <utility>

namespace splitflow {

namespace {
using Clock = std::chrono::steady_clock;
double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
}  // namespace

uint64_t StreamGroup::version() const {
  std::lock_guard lock(mutex_);
  return version_;
}

bool StreamGroup::wait_for_news(uint64_t seen, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  return cv_.wait_for(lock, timeout, [&] { return version_ != seen; });
}

void StreamGroup::set_listener(std::function<void()> listener) {
  std::lock_guard lock(mutex_);
  listener_ = std::move(listener);
}

void StreamGroup::notify() {
  std::function<void()> listener;
  {
    std::lock_guard lock(mutex_);
    ++version_;
    listener = listener_;
  }
  cv_.notify_all();
  if (listener) listener();
}

RequestStream::RequestStream(int64_t id, int32_t num_choices, int32_t num_prompt_tokens,
                             std::shared_ptr<StreamGroup> group)
    : id_(id),
      num_choices_(num_choices),
      num_prompt_tokens_(num_prompt_tokens),
      group_(std::move(group)),
      last_token_(static_cast<size_t>(num_choices)),
      choice_finished_(static_cast<size_t>(num_choices), false) {
  pending_.choices.resize(static_cast<size_t>(num_choices));
}

bool RequestStream::next(RequestUpdate& update, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  if (!cv_.wait_for(lock, timeout, [&] { return news_ || ended_; })) return false;
  update = std::move(pending_);
  update.finished = ended_;
  pending_ = RequestUpdate{};
  pending_.choices.resize(static_cast<size_t>(num_choices_));
  pending_.num_cached_prompt_tokens = update.num_cached_prompt_tokens;
  news_ = false;
  return true;
}

void RequestStream::deliver(SequenceOutput&& output) {
  {
    std::lock_guard lock(mutex_);
    ChoiceDelta& delta = pending_.choices.at(static_cast<size_t>(output.index));
    delta.text += output.text;
    delta.tokens.push_back(std::move(output.token));
    if (output.finish_reason != FinishReason::None) delta.finish_reason = output.finish_reason;
    if (output.index == 0) pending_.num_cached_prompt_tokens = output.num_cached_prompt_tokens;
    news_ = true;
  }
  cv_.notify_all();
  group_->notify();
}

void RequestStream::end(FinishReason reason, std::string error) {
  {
    std::lock_guard lock(mutex_);
    if (ended_) return;
    for (size_t i = 0; i < choice_finished_.size(); ++i) {
      if (!choice_finished_[i] && pending_.choices[i].finish_reason == FinishReason::None) {
        pending_.choices[i].finish_reason = reason;
      }
    }
    pending_.error = std::move(error);
    ended_ = true;
  }
  cv_.notify_all();
  group_->notify();
}

AsyncEngine::AsyncEngine(Engine& engine, AsyncEngineConfig config) : engine_(engine), config_(config) {
  SF_CHECK(config_.max_queued_sequences >= 0, "max_queued_sequences must be >= 0, got {}",
           config_.max_queued_sequences);
  publish_gauges();
}

AsyncEngine::~AsyncEngine() { stop(); }

std::shared_ptr<RequestStream> AsyncEngine::submit(std::vector<int32_t> prompt_ids, const SamplingParams& params,
                                                   int32_t n) {
  std::vector<PromptSubmission> prompts;
  prompts.push_back({std::move(prompt_ids), params});
  return submit_group(std::move(prompts), n).front();
}

std::vector<std::shared_ptr<RequestStream>> AsyncEngine::submit_group(std::vector<PromptSubmission> prompts,
                                                                      int32_t n) {
  SF_CHECK(!prompts.empty(), "async engine: submit_group() needs at least one prompt");
  for (size_t i = 0; i < prompts.size(); ++i) {
    try {
      engine_.check_request(prompts[i].prompt_ids, prompts[i].params, n);
      if (engine_.encoder_decoder() && (prompts[i].start.import_kv || !prompts[i].start.prior_output_ids.empty())) {
        throw Error("an encoder-decoder model's requests cannot be resumed or import KV: send the request without "
                    "resume_token_ids and kv_source");
      }
      if (prompts[i].start.import_kv && !kv_importer_) {
        throw Error("this instance does not import KV (its role is prompt): send the request without kv_source");
      }
    } catch (const Error& e) {
      throw PromptRejected(i, prompts.size() == 1 ? std::string(e.what()) : fmt::format("prompt {}: {}", i, e.what()));
    }
  }
  const int32_t sequences = static_cast<int32_t>(prompts.size()) * n;
  auto group = std::make_shared<StreamGroup>();
  std::vector<std::shared_ptr<RequestStream>> streams;
  {
    std::lock_guard lock(mutex_);
    if (draining_ || stopping_) {
      metrics_.count_rejected("shutting_down");
      throw SubmitRejected(SubmitRejected::Reason::ShuttingDown, "the server is shutting down");
    }
    const int32_t queued = pending_sequences_ + waiting_sequences_;
    if (queued > 0 && queued + sequences > config_.max_queued_sequences) {
      metrics_.count_rejected("queue_full");
      throw SubmitRejected(SubmitRejected::Reason::QueueFull,
                           fmt::format("the server is overloaded: {} sequences wait, this request adds {} and the "
                                       "queue holds {}; retry later",
                                       queued, sequences, config_.max_queued_sequences));
    }
    const Clock::time_point arrival = Clock::now();
    for (PromptSubmission& prompt : prompts) {
      auto stream = std::make_shared<RequestStream>(next_stream_id_++, n,
                                                    static_cast<int32_t>(prompt.prompt_ids.size()), group);
      stream->arrival_ = arrival;
      pending_.push_back({stream, std::move(prompt.prompt_ids), std::move(prompt.params), std::move(prompt.start),
                          std::move(prompt.kv_source)});
      streams.push_back(std::move(stream));
    }
    pending_sequences_ += sequences;
    num_in_flight_ += static_cast<int32_t>(streams.size());
  }
  wake_.notify_one();
  return streams;
}

void AsyncEngine::cancel(const std::shared_ptr<RequestStream>& stream) {
  if (stream->cancelled_.exchange(true)) return;
  {
    std::lock_guard lock(mutex_);
    cancelled_.push_back(stream);
  }
  wake_.notify_one();
}

void AsyncEngine::post(std::function<void(Engine&)> task) {
  {
    std::lock_guard lock(mutex_);
    tasks_.push_back(std::move(task));
  }
  wake_.notify_one();
}

void AsyncEngine::finish_import(int64_t engine_id, std::function<void()> write) {
  post([this, engine_id, write = std::move(write)](Engine& engine) {
    import_cancels_.erase(engine_id);
    try {
      engine.admit_imported(engine_id, write);
    } catch (const std::exception& e) {
      end_request(engine_id, FinishReason::Abort, fmt::format("writing the imported KV failed: {}", e.what()));
    }
  });
}

void AsyncEngine::fail_import(int64_t engine_id, std::string error) {
  post([this, engine_id, error = std::move(error)](Engine& engine) {
    import_cancels_.erase(engine_id);
    if (!active_.count(engine_id)) return;
    engine.abort(engine_id);
    end_request(engine_id, FinishReason::Abort, error);
  });
}

void AsyncEngine::start_imports() {
  for (KvReservation& reservation : engine_.take_kv_reservations()) {
    const int64_t id = reservation.request_id;
    const auto source = import_sources_.find(id);
    if (source == import_sources_.end()) continue;
    const std::string address = std::move(source->second);
    import_sources_.erase(source);
    if (reservation.token_ids.empty()) {  // a one-token sequence: nothing to import
      engine_.admit_imported(id);
      continue;
    }
    try {
      import_cancels_[id] = kv_importer_(reservation, address);
    } catch (const std::exception& e) {
      engine_.abort(id);
      end_request(id, FinishReason::Abort, fmt::format("the KV import could not start: {}", e.what()));
    }
  }
}

void AsyncEngine::start() {
  SF_CHECK(!thread_.joinable(), "async engine: start() called twice");
  thread_ = std::thread([this] { loop(); });
}

void AsyncEngine::loop() {
  while (true) {
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] {
        return stopping_ || !pending_.empty() || !cancelled_.empty() || !tasks_.empty() || engine_busy_;
      });
      if (stopping_) return;
    }
    run_once();
  }
}

void AsyncEngine::admit(Submission& submission) {
  RequestStream& stream = *submission.stream;
  if (stream.cancelled_) {
    stream.end(FinishReason::Abort, "");
    for (int32_t i = 0; i < stream.num_choices(); ++i) metrics_.count_finished("abort");
    return;
  }
  try {
    const bool import_kv = submission.start.import_kv;
    stream.engine_id_ = engine_.add_request(std::move(submission.prompt_ids), submission.params, stream.num_choices(),
                                            std::move(submission.start));
    if (import_kv) import_sources_[stream.engine_id_] = std::move(submission.kv_source);
  } catch (const Error& e) {
    stream.end(FinishReason::Abort, e.what());
    return;
  }
  metrics_.add_prompt_tokens(stream.num_prompt_tokens());
  active_.emplace(stream.engine_id_, submission.stream);
}

void AsyncEngine::end_request(int64_t engine_id, FinishReason reason, const std::string& error) {
  const auto it = active_.find(engine_id);
  if (it == active_.end()) return;
  RequestStream& stream = *it->second;
  import_sources_.erase(engine_id);
  if (const auto cancel = import_cancels_.find(engine_id); cancel != import_cancels_.end()) {
    cancel->second();
    import_cancels_.erase(cancel);
  }
  for (size_t i = 0; i < stream.choice_finished_.size(); ++i) {
    if (!stream.choice_finished_[i]) metrics_.count_finished(error.empty() ? finish_reason_name(reason) : "error");
  }
  stream.end(reason, error);
  active_.erase(it);
}

void AsyncEngine::deliver_step(EngineStep& step, Clock::time_point now) {
  for (SequenceOutput& output : step.outputs) {
    const auto it = active_.find(output.request_id);
    if (it == active_.end()) continue;
    RequestStream& stream = *it->second;
    const size_t index = static_cast<size_t>(output.index);
    if (!stream.first_token_seen_) {
      metrics_.observe_time_to_first_token(seconds(now - stream.arrival_));
      stream.first_token_seen_ = true;
    } else if (stream.last_token_[index] != Clock::time_point{}) {
      metrics_.observe_inter_token_latency(seconds(now - stream.last_token_[index]));
    }
    stream.last_token_[index] = now;
    if (output.finish_reason != FinishReason::None) {
      stream.choice_finished_[index] = true;
      metrics_.count_finished(finish_reason_name(output.finish_reason));
    }
    stream.deliver(std::move(output));
  }
  for (const int64_t id : step.finished_requests) {
    const auto it = active_.find(id);
    if (it == active_.end()) continue;
    metrics_.observe_e2e_latency(seconds(now - it->second->arrival_));
    it->second->end(FinishReason::None, "");
    active_.erase(it);
  }
}

bool AsyncEngine::run_once() {
  std::vector<Submission> submissions;
  std::vector<std::shared_ptr<RequestStream>> cancels;
  std::vector<std::function<void(Engine&)>> tasks;
  {
    std::lock_guard lock(mutex_);
    submissions.swap(pending_);
    pending_sequences_ = 0;
    cancels.swap(cancelled_);
    tasks.swap(tasks_);
  }
  for (auto& task : tasks) {
    try {
      task(engine_);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "splitflow serve: an engine task failed: %s\n", e.what());
    }
  }
  for (const auto& stream : cancels) {
    if (stream->engine_id_ < 0) continue;  // still among the submissions, or refused by the engine
    engine_.abort(stream->engine_id_);
    end_request(stream->engine_id_, FinishReason::Abort, "");
  }
  for (Submission& submission : submissions) admit(submission);
  start_imports();

  const bool had_work = !submissions.empty() || !cancels.empty() || !tasks.empty() || engine_.has_work();
  if (engine_.has_work()) {
    const Clock::time_point start = Clock::now();
    try {
      EngineStep step = engine_.step();
      const Clock::time_point end = Clock::now();
      const int32_t generated = static_cast<int32_t>(step.outputs.size());
      deliver_step(step, end);
      metrics_.record_step(seconds(end - start_time_), seconds(end - start), step.num_prefill_tokens,
                           step.num_decode_tokens, generated);
    } catch (const std::exception& e) {
      // A failed forward leaves the batch's state unknown: end every request rather than guess.
      std::fprintf(stderr, "splitflow serve: engine step failed: %s\n", e.what());
      std::vector<int64_t> ids;
      for (const auto& [id, stream] : active_) ids.push_back(id);
      for (const int64_t id : ids) {
        engine_.abort(id);
        end_request(id, FinishReason::Abort, fmt::format("the engine failed: {}", e.what()));
      }
    }
  }
  start_imports();  // the step may have freed the blocks a queued import waits for
  engine_busy_ = engine_.has_work();
  publish_gauges();
  return had_work;
}

void AsyncEngine::publish_gauges() {
  const Scheduler& scheduler = engine_.scheduler();
  const BlockManager& blocks = scheduler.block_manager();
  EngineGauges gauges;
  gauges.requests_in_engine = engine_.num_unfinished_requests();
  gauges.sequences_waiting = engine_.num_waiting_sequences();
  gauges.sequences_running = engine_.num_running_sequences();
  gauges.sequences_swapped = engine_.num_swapped_sequences();
  gauges.kv_blocks_total = blocks.num_blocks();
  gauges.kv_blocks_free = blocks.num_free_blocks();
  gauges.kv_blocks_cached_free = blocks.num_cached_free_blocks();
  gauges.prefix_cache_queried_blocks = blocks.stats().queried_blocks;
  gauges.prefix_cache_hit_blocks = blocks.stats().hit_blocks;
  gauges.preemptions = scheduler.num_preemptions();
  gauges.swap_outs = scheduler.num_swap_outs();
  {
    std::lock_guard lock(mutex_);
    waiting_sequences_ = gauges.sequences_waiting;
    num_in_flight_ = static_cast<int32_t>(pending_.size() + active_.size());
    gauges.requests_pending = static_cast<int32_t>(pending_.size());
  }
  metrics_.set_gauges(gauges);
  idle_.notify_all();
}

void AsyncEngine::begin_drain() {
  std::lock_guard lock(mutex_);
  draining_ = true;
}

bool AsyncEngine::wait_until_idle(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  return idle_.wait_for(lock, timeout, [&] { return num_in_flight_ == 0; });
}

void AsyncEngine::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  // The loop is gone: end what is left on this thread.
  std::vector<Submission> submissions;
  {
    std::lock_guard lock(mutex_);
    submissions.swap(pending_);
    pending_sequences_ = 0;
    cancelled_.clear();
  }
  for (Submission& submission : submissions) {
    submission.stream->end(FinishReason::Abort, "");
    for (int32_t i = 0; i < submission.stream->num_choices(); ++i) metrics_.count_finished("abort");
  }
  std::vector<int64_t> ids;
  for (const auto& [id, stream] : active_) ids.push_back(id);
  for (const int64_t id : ids) {
    engine_.abort(id);
    end_request(id, FinishReason::Abort, "");
  }
  engine_busy_ = false;
  publish_gauges();
}

int32_t AsyncEngine::num_in_flight() const {
  std::lock_guard lock(mutex_);
  return num_in_flight_;
}

std::string AsyncEngine::render_metrics() const { return metrics_.render(seconds(Clock::now() - start_time_)); }

}  // namespace splitflow
