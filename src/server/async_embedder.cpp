#include "server/async_embedder.h"

#include "core/error.h"
#include "server/metrics.h"

#include <fmt/format.h>

namespace splitflow {

int64_t EmbeddingJob::num_tokens() const {
  int64_t tokens = 0;
  for (const auto& ids : inputs_) tokens += static_cast<int64_t>(ids.size());
  return tokens;
}

AsyncEmbedder::AsyncEmbedder(EmbeddingEngine& engine, int32_t max_queued_inputs)
    : engine_(engine), max_queued_inputs_(max_queued_inputs) {}

AsyncEmbedder::~AsyncEmbedder() { stop(); }

std::shared_ptr<EmbeddingJob> AsyncEmbedder::submit(std::vector<std::vector<int32_t>> inputs, EmbeddingCallback done) {
  for (size_t i = 0; i < inputs.size(); ++i) {
    try {
      engine_.check_input(inputs[i]);
    } catch (const Error& e) {
      throw PromptRejected(i, inputs.size() > 1 ? fmt::format("input {}: {}", i, e.what()) : std::string(e.what()));
    }
  }
  auto job = std::make_shared<EmbeddingJob>();
  job->remaining_ = inputs.size();
  job->results_.resize(inputs.size());
  job->inputs_ = std::move(inputs);
  job->done_ = std::move(done);
  const int32_t count = static_cast<int32_t>(job->inputs_.size());
  {
    std::lock_guard lock(mutex_);
    if (draining_ || stopping_) throw SubmitRejected(SubmitRejected::Reason::ShuttingDown, "the server is shutting down");
    if (queued_inputs_ > 0 && queued_inputs_ + count > max_queued_inputs_)
      throw SubmitRejected(SubmitRejected::Reason::QueueFull,
                           fmt::format("the embedding queue is full ({} inputs wait); retry later", queued_inputs_));
    queued_inputs_ += count;
    ++in_flight_;
    pending_.push_back(job);
  }
  wake_.notify_one();
  return job;
}

void AsyncEmbedder::cancel(const std::shared_ptr<EmbeddingJob>& job) {
  job->cancelled_ = true;
  wake_.notify_one();
}

void AsyncEmbedder::finish(EmbeddingJob& job, std::string error) {
  if (job.ended_) return;
  job.ended_ = true;
  for (const int64_t id : job.engine_ids_) {
    if (active_.erase(id) > 0) engine_.abort(id);
  }
  int32_t dropped = static_cast<int32_t>(job.remaining_);
  const bool answered = !job.cancelled_ && job.done_ != nullptr;
  const int64_t tokens = job.num_tokens();
  {
    // Counted before the answer goes out: a client that reads it and then /metrics sees it counted.
    std::lock_guard lock(mutex_);
    if (answered && error.empty()) {
      ++requests_total_;
      inputs_total_ += static_cast<int64_t>(job.inputs_.size());
      tokens_total_ += tokens;
    } else if (answered) {
      ++failed_total_;
    }
  }
  if (answered) {
    if (error.empty()) job.done_(std::move(job.results_), "");
    else job.done_({}, std::move(error));
  }
  job.done_ = nullptr;
  {
    std::lock_guard lock(mutex_);
    queued_inputs_ -= dropped;
    --in_flight_;
  }
  idle_.notify_all();
}

bool AsyncEmbedder::run_once() {
  std::vector<std::shared_ptr<EmbeddingJob>> admitted;
  {
    std::lock_guard lock(mutex_);
    admitted.swap(pending_);
  }
  for (const auto& job : admitted) {
    for (size_t i = 0; i < job->inputs_.size(); ++i) {
      const int64_t id = engine_.add_request(job->inputs_[i]);
      job->engine_ids_.push_back(id);
      active_.emplace(id, std::make_pair(job, i));
    }
  }
  // Cancelled jobs leave before the step.
  std::vector<std::shared_ptr<EmbeddingJob>> cancelled;
  for (const auto& [id, entry] : active_)
    if (entry.first->cancelled_ && !entry.first->ended_) cancelled.push_back(entry.first);
  for (const auto& job : cancelled) finish(*job, "");
  if (!engine_.has_unfinished()) return !admitted.empty() || !cancelled.empty();

  std::vector<EmbeddingResult> results;
  try {
    results = engine_.step();
  } catch (const std::exception& e) {
    // The step's inputs are lost: fail every job that has any input in flight.
    std::vector<std::shared_ptr<EmbeddingJob>> failed;
    for (const auto& [id, entry] : active_) failed.push_back(entry.first);
    for (const auto& job : failed) finish(*job, e.what());
    return true;
  }
  int32_t embedded = 0;
  for (EmbeddingResult& result : results) {
    const auto it = active_.find(result.request_id);
    if (it == active_.end()) continue;
    auto [job, index] = it->second;
    active_.erase(it);
    job->results_[index] = std::move(result.embedding);
    ++embedded;
    if (--job->remaining_ == 0) finish(*job, "");
  }
  {
    std::lock_guard lock(mutex_);
    queued_inputs_ -= embedded;
  }
  return true;
}

void AsyncEmbedder::loop() {
  while (true) {
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !pending_.empty() || in_flight_ > 0; });
      if (stopping_) break;
    }
    if (!run_once()) {
      // Nothing to run (every job in flight is waiting on nothing): sleep until news.
      std::unique_lock lock(mutex_);
      wake_.wait_for(lock, std::chrono::milliseconds(5), [&] { return stopping_ || !pending_.empty(); });
    }
  }
  std::vector<std::shared_ptr<EmbeddingJob>> left;
  for (const auto& [id, entry] : active_) left.push_back(entry.first);
  for (const auto& job : left) finish(*job, "the server stopped before the embeddings were computed");
}

void AsyncEmbedder::start() {
  if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
}

void AsyncEmbedder::begin_drain() {
  std::lock_guard lock(mutex_);
  draining_ = true;
}

bool AsyncEmbedder::wait_until_idle(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  return idle_.wait_for(lock, timeout, [&] { return in_flight_ == 0; });
}

void AsyncEmbedder::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::string AsyncEmbedder::render_metrics() const {
  std::lock_guard lock(mutex_);
  std::string out;
  render_counter(out, "splitflow_embedding_requests_total", "/v1/embeddings requests answered", requests_total_);
  render_counter(out, "splitflow_embedding_inputs_total", "inputs embedded in answered requests", inputs_total_);
  render_counter(out, "splitflow_embedding_tokens_total", "tokens of those inputs", tokens_total_);
  render_counter(out, "splitflow_embedding_failed_requests_total", "requests the engine failed", failed_total_);
  render_gauge(out, "splitflow_embedding_queued_inputs", "inputs submitted and not yet embedded",
               static_cast<double>(queued_inputs_));
  return out;
}

int32_t AsyncEmbedder::num_in_flight() const {
  std::lock_guard lock(mutex_);
  return in_flight_;
}

}  // namespace splitflow
