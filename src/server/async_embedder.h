// server/async_embedder.h — runs the EmbeddingEngine on its own thread for the HTTP workers, as
// AsyncEngine runs the generative Engine. A worker submits one request's inputs (every input
// checked first, the queue bounded); the loop admits them, runs engine steps (inputs of different
// requests batched together) and, once a request's every input is embedded, hands its embeddings
// to the request's callback on the loop thread (which must only post the work elsewhere).
// A cancelled request's queued inputs are dropped at the next iteration.
#pragma once

#include "embedding/embedding_engine.h"
#include "server/async_engine.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace splitflow {

// One request's embeddings (input order), or the engine's error (then embeddings is empty).
using EmbeddingCallback = std::function<void(std::vector<std::vector<float>> embeddings, std::string error)>;

class EmbeddingJob;

class AsyncEmbedder {
 public:
  AsyncEmbedder(EmbeddingEngine& engine, int32_t max_queued_inputs);
  ~AsyncEmbedder();  // stop()
  AsyncEmbedder(const AsyncEmbedder&) = delete;
  AsyncEmbedder& operator=(const AsyncEmbedder&) = delete;

  // Any thread. Checks every input (PromptRejected names the first bad one) and queues them;
  // SubmitRejected when the queue would pass max_queued_inputs (unless nothing waits) or the
  // embedder is draining. The returned job can be cancelled.
  std::shared_ptr<EmbeddingJob> submit(std::vector<std::vector<int32_t>> inputs, EmbeddingCallback done);
  // Any thread: the job's inputs not yet embedded are dropped; its callback never runs.
  void cancel(const std::shared_ptr<EmbeddingJob>& job);

  void start();
  // One loop iteration on the calling thread (tests): admits, cancels, runs one engine step.
  bool run_once();
  void begin_drain();
  bool wait_until_idle(std::chrono::milliseconds timeout);
  void stop();

  int32_t max_input_tokens() const { return engine_.max_input_tokens(); }
  const ModelSpec& spec() const { return engine_.spec(); }
  int32_t num_in_flight() const;
  // Prometheus text: splitflow_embedding_requests_total, _inputs_total, _tokens_total,
  // _failed_requests_total (counters) and splitflow_embedding_queued_inputs (gauge).
  std::string render_metrics() const;

 private:
  void loop();
  void finish(EmbeddingJob& job, std::string error);

  EmbeddingEngine& engine_;
  const int32_t max_queued_inputs_;

  mutable std::mutex mutex_;
  std::condition_variable wake_, idle_;
  std::vector<std::shared_ptr<EmbeddingJob>> pending_;
  int32_t queued_inputs_ = 0;  // submitted, not yet embedded or dropped
  int32_t in_flight_ = 0;      // jobs submitted and not ended
  bool draining_ = false, stopping_ = false;
  int64_t requests_total_ = 0, inputs_total_ = 0, tokens_total_ = 0, failed_total_ = 0;  // answered

  // The loop thread's own: engine request id -> (job, input index).
  std::unordered_map<int64_t, std::pair<std::shared_ptr<EmbeddingJob>, size_t>> active_;
  std::thread thread_;
};

class EmbeddingJob {
 public:
  size_t num_inputs() const { return inputs_.size(); }
  int64_t num_tokens() const;

 private:
  friend class AsyncEmbedder;
  std::vector<std::vector<int32_t>> inputs_;
  EmbeddingCallback done_;
  std::vector<std::vector<float>> results_;
  size_t remaining_ = 0;
  std::vector<int64_t> engine_ids_;
  std::atomic<bool> cancelled_{false};
  bool ended_ = false;  // the loop's: callback run or dropped
};

}  // namespace splitflow
